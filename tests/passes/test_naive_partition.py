"""naive-partition: sizes (eq. 3.1 and speed-proportional), custom partitions, narrow layers."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from bbgrap.frontends.onnx import import_proto
from bbgrap.passes.naive_partition import NaivePartition, channel_grain, on_grain, replicated, spare_order, split_sizes
from graphs import conv_chain
from helpers import assert_exact, compile_plan, save
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper
from onnx_builder import graph_of, model_of, value_info

from bbgrap.config import CustomPartition, Direction
from bbgrap.invariants import check_invariants
from bbgrap.ir import BBGrapError, ShapeMap
from bbgrap.rules.registry import default_registry


def test_even_split_deals_the_remainder_to_the_end_nodes_first() -> None:
    assert split_sizes(7, [1, 1]) == [4, 3]
    assert split_sizes(8, [1, 1, 1]) == [3, 2, 3]  # thesis §3.3's example, whose round-robin gives 3, 3, 2
    assert split_sizes(7, [1, 1, 1, 1]) == [2, 2, 1, 2]
    assert split_sizes(14, [1, 1, 1, 1]) == [4, 3, 3, 4]
    assert split_sizes(14, [1] * 16) == [1] * 14 + [0, 0]  # too few rows: the first nodes, one run
    assert split_sizes(2, [1, 1, 1, 1]) == [1, 1, 0, 0]
    assert spare_order(5) == [0, 4, 1, 2, 3]


def test_speed_proportional_split() -> None:
    assert split_sizes(10, [1, 3, 1]) == [2, 6, 2]
    assert split_sizes(112, [1, 3, 1]) == [23, 67, 22]  # 22.4, 67.2, 22.4: largest remainders first, ties to the lower node


def test_uneven_speeds_cut_channels_in_whole_blocks_of_the_blocked_layout() -> None:
    """66 of 256 channels run as long as 80 (onnxruntime's blocked convolution pads the last block
    of 16): a speed-proportional cut of channels takes whole blocks where every node still gets one;
    equal speeds, rows, and an extent not made of blocks are cut as before."""
    assert split_sizes(256, [1, 2.9]) == [66, 190]
    assert split_sizes(256, [1, 2.9], 16) == [64, 192]
    assert split_sizes(512, [1, 3.14, 1.01], 16) == [96, 320, 96]
    assert split_sizes(48, [1, 2.9], 16) == [16, 32]
    assert split_sizes(16, [1, 3], 16) == [4, 12]  # one block: node 0 would get none
    assert split_sizes(200, [1, 3], 16) == [50, 150]  # not whole blocks
    assert split_sizes(256, [1, 1, 1], 16) == split_sizes(256, [1, 1, 1]) == [86, 85, 85]
    assert channel_grain((1, 256, 14, 14), 1) == 16 and channel_grain((1, 256, 14, 14), 2) == 1
    assert channel_grain((1, 196, 768), 1) == 1  # tokens, not channels


def test_a_channel_cut_for_uneven_speeds_is_in_whole_blocks() -> None:
    graph = import_proto(conv_chain([3, 1], channels=64, height=6)).graph
    g = NaivePartition(2, Direction.C, speeds=(1.0, 2.9)).call(graph).graph
    assert [[r.shape[1] for r in g.partitions[c].out] for c in ("conv0", "conv1")] == [[16, 48], [16, 48]]  # not 16.4, 47.6 -> 17, 47
    assert check_invariants(g) == []


@given(st.integers(0, 500), st.lists(st.floats(0.1, 10), min_size=1, max_size=8), st.sampled_from([1, 8, 16]))
def test_split_sizes_sum_and_fairness(extent: int, speeds: list[float], grain: int) -> None:
    sizes = split_sizes(extent, speeds, grain)
    assert sum(sizes) == extent and min(sizes) >= 0
    for s, v in zip(sizes, speeds):
        assert abs(s - extent * v / sum(speeds)) < grain + 1e-9
    if sizes != split_sizes(extent, speeds):  # in whole grains, every node one at least
        assert all(s % grain == 0 and s > 0 for s in sizes)


def test_narrow_layer_is_split_over_fewer_nodes() -> None:
    graph = import_proto(conv_chain([3, 3], height=3)).graph
    g = NaivePartition(5).call(graph).graph
    part = g.partitions["conv0"]
    assert [r.shape[2] if not r.empty else 0 for r in part.out] == [1, 1, 1, 0, 0]
    assert part.active_nodes() == [0, 1, 2]


def test_replicated_layer_is_whole_on_every_node_while_its_owned_regions_tile() -> None:
    graph = NaivePartition(3).call(import_proto(conv_chain([3, 3], channels=6, height=8)).graph).graph
    layer = next(layer for layer in graph.layers if layer.name == "conv1")
    part = replicated(graph, layer, (1.0, 2.0, 1.0), default_registry())
    assert part is not None and part.axis == 1  # the first axis its rule cuts for every node: channels
    assert [r.shape[1] for r in part.out] == split_sizes(6, (1.0, 2.0, 1.0))
    full_out, full_in = ShapeMap.full(graph.tensors[layer.outputs[0]].shape), ShapeMap.full(graph.tensors[layer.inputs[0]].shape)
    assert all(c == full_out for c in part.computes) and all(n[0] == full_in for n in part.needs)
    assert check_invariants(graph.replace(partitions={**graph.partitions, layer.name: part})) == []


def test_a_layer_too_short_for_every_node_is_not_replicated() -> None:
    graph = import_proto(conv_chain([3], channels=2, height=2, width=2)).graph
    graph = NaivePartition(3).call(graph).graph
    assert replicated(graph, graph.layers[0], (1.0, 1.0, 1.0), default_registry()) is None


def test_custom_partition_overrides() -> None:
    graph = import_proto(conv_chain([3, 3], height=8)).graph
    g = NaivePartition(2, custom=(CustomPartition("conv1", Direction.W, (1, 4)),)).call(graph).graph
    assert g.partitions["conv1"].axis == 3
    assert [r.shape[3] for r in g.partitions["conv1"].out] == [1, 4]
    assert g.partitions["conv0"].axis == 2


@pytest.mark.parametrize("custom", [CustomPartition("conv1", Direction.H, (1, 2)), CustomPartition("nope", Direction.H, None)])
def test_bad_custom_partition_is_a_user_error(custom: CustomPartition) -> None:
    graph = import_proto(conv_chain([3, 3], height=8)).graph
    with pytest.raises(BBGrapError):
        NaivePartition(2, custom=(custom,))(graph)


def test_channel_direction_slices_weights() -> None:
    graph = import_proto(conv_chain([3], channels=6, height=8)).graph
    g = NaivePartition(4, Direction.C).call(graph).graph
    part = g.partitions["conv0"]
    assert [r.shape[1] for r in part.out] == [2, 1, 1, 2]
    assert [n[1].shape[0] for n in part.needs] == [2, 1, 1, 2]  # weight rows per node


@pytest.mark.parametrize("pads", [[0, 0, 40, 0], [40, 0, 0, 0]], ids=["end", "begin"])
def test_rows_wholly_inside_padding_are_computed_whole(tmp_path, pads: list[int]) -> None:
    """With 40 rows of padding on an 8-row input, one node's output rows read no input row
    at all; a local op cannot read an empty region (lowering failed: 'region [empty] is not
    a box', found by the fuzz test), so such a layer is computed whole, and runs exactly."""
    import numpy as np
    from helpers import assert_exact, compile_plan, save
    from onnx import helper
    from onnx_builder import graph_of, model_of, value_info

    weights = {"w": np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "b": np.arange(4, dtype=np.float32)}
    graph = graph_of([helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=pads)], [value_info("x", [1, 3, 8, 8])],
                     [value_info("y", [1, 4, 46, 6])], weights)
    model = model_of(graph)
    path = save(model, str(tmp_path))
    for nodes in (2, 3):
        compile_plan(path, str(tmp_path / f"plan{nodes}"), nodes=nodes)
        assert_exact(str(tmp_path / f"plan{nodes}"))


def test_a_layer_emitting_more_than_it_computes_narrower_than_the_node_count_is_exact(tmp_path) -> None:
    """A bilinear Resize (its pieces emit edge rows lowering crops, `Local.emits`) of 4 output rows
    on 6 nodes: nodes 4 and 5 get none of its rows. Each node's emitted region stays at its own
    index (the partition once listed the emits of the active nodes only, and compile failed with an
    IndexError on node 4)."""
    import numpy as np
    from helpers import assert_exact, compile_plan, save
    from onnx import helper
    from rules.helpers import build_model

    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1] * 4),
             helper.make_node("MaxPool", ["c"], ["p"], name="pool", kernel_shape=[4, 4], strides=[4, 4]),
             helper.make_node("Resize", ["p", "", "scales"], ["y"], name="up", mode="linear")]
    consts = {"w": np.random.default_rng(0).standard_normal((2, 2, 3, 3)).astype(np.float32),
              "scales": np.array([1, 1, 2, 2], np.float32)}
    path = save(build_model(nodes, {"x": [1, 2, 8, 8]}, consts, ["y"], 13), str(tmp_path))
    plan = compile_plan(path, str(tmp_path / "plan"), nodes=6)
    up = next(r for r in plan.compiled.layer_table if r.name == "up")
    assert [p.range is not None for p in up.per_node] == [True] * 4 + [False] * 2
    assert_exact(str(tmp_path / "plan"))


def _opaque_between_convs(last: bool) -> onnx.ModelProto:
    """x → Conv → LpNormalization (no region rule) → [Conv →] y."""
    w = np.random.default_rng(3).standard_normal((4, 4, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="head"),
             helper.make_node("LpNormalization", ["c"], ["y" if last else "z"], axis=2, p=2, name="mix")]
    if not last:
        nodes.append(helper.make_node("Conv", ["z", "w"], ["y"], pads=[1, 1, 1, 1], name="tail"))
    return model_of(graph_of(nodes, [value_info("x", (1, 4, 6, 8))], [value_info("y", (1, 4, 6, 8))], {"w": w}), full_check=True)


@pytest.mark.parametrize("last", [False, True])
def test_a_layer_computed_whole_runs_on_the_fastest_node(tmp_path, last: bool) -> None:
    """Every node waits for a layer computed whole: on 1:3 nodes it runs on node 1, the first of
    the fastest (node 0 where the speeds are equal), exactly also where it gives the model's
    output, which node 0 gathers."""
    model = _opaque_between_convs(last)
    graph = import_proto(model).graph
    for speeds, node in [((1.0, 3.0), 1), ((1.0, 1.0), 0), ((2.0, 1.0, 2.0), 0), ((1.0, 2.0, 2.0), 1)]:
        g = NaivePartition(len(speeds), Direction.H, speeds=speeds).call(graph).graph
        part = g.partitions["mix"]
        assert part.axis is None and part.active_nodes() == [node], speeds
        check_invariants(g)
    path = save(model, str(tmp_path))
    plan = compile_plan(path, str(tmp_path / "plan"), nodes=2, speeds=(1.0, 3.0), search=True)
    mix = next(row for row in plan.compiled.layer_table if row.name == "mix")
    assert mix.whole is not None and mix.whole.node == 1 and mix.per_node[0].flops == 0
    assert_exact(str(tmp_path / "plan"))


@given(st.lists(st.integers(0, 40), min_size=1, max_size=6), st.sampled_from([1, 2, 16]))
def test_on_grain_moves_each_cut_to_the_nearest_multiple(sizes: list[int], grain: int) -> None:
    """Each cut between two sizes lands on the multiple of the grain nearest to it; the sum is kept."""
    moved = on_grain(sizes, grain)
    assert len(moved) == len(sizes) and sum(moved) == sum(sizes) and min(moved) >= 0
    cuts, was = np.cumsum(moved)[:-1], np.cumsum(sizes)[:-1]
    assert all(c % grain == 0 or c == sum(sizes) for c in cuts)
    assert all(abs(c - w) <= grain / 2 for c, w in zip(cuts, was))
    assert on_grain([11, 10, 11], 16) == [16, 0, 16] and on_grain([11, 10, 11], 1) == [11, 10, 11]
