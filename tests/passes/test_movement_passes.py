"""insert-crop-concat and eliminate-transfers on hand-built graphs: the four cases of
thesis fig. 3.6, exact halo sizes, the invariants, and exactness of the plans."""

from __future__ import annotations

import numpy as np
import pytest
from bbgrap.backends.lower import lower
from bbgrap.frontends.onnx import import_proto
from bbgrap.passes.eliminate_transfers import EliminateTransfers
from bbgrap.passes.insert_crop_concat import InsertCropConcat
from bbgrap.passes.naive_partition import NaivePartition
from graphs import conv_chain
from helpers import assert_exact, compile_plan, save

from bbgrap.config import CustomPartition, Direction
from bbgrap.invariants import check_invariants
from bbgrap.ir import Part, ShapeMap
from bbgrap.pass_manager import PassManager


def partitioned(model, nodes: int, optimize: bool = True, custom=()):  # -> Graph
    passes = [NaivePartition(nodes, Direction.H, custom=tuple(custom)), InsertCropConcat()]
    if optimize:
        passes.append(EliminateTransfers())
    return PassManager(passes).run(import_proto(model).graph)


def rows(lo: int, hi: int, channels: int = 2, width: int = 5) -> ShapeMap:
    return ShapeMap.box([0, 0, lo, 0], [1, channels, hi, width])


def test_four_cases_of_fig_3_6() -> None:
    # producer conv0 (1x1) cut [0,2) [2,6) [6,8); consumer conv1 (1x1) and the relu after it cut [0,1) [1,4) [4,8)
    custom = [CustomPartition("conv0", Direction.H, (2, 4, 2)), CustomPartition("conv1", Direction.H, (1, 3, 4)),
              CustomPartition("relu", Direction.H, (1, 3, 4))]
    g = partitioned(conv_chain([1, 1], relu_after=True), 3, custom=custom)
    gathers = g.gathers
    # (d) holds more than needed: crop only, no transfer
    assert gathers[("c0", 0)].region == rows(0, 1) and gathers[("c0", 0)].parts == (Part(rows(0, 1), 0),)
    # (e) holds part of it and more: crop own rows and receive the missing row
    assert gathers[("c0", 1)].parts == (Part(rows(1, 2), 0), Part(rows(2, 4), 1))
    # (b) holds less: receive only the missing rows, then concat
    assert gathers[("c0", 2)].parts == (Part(rows(4, 6), 1), Part(rows(6, 8), 2))
    # (c) holds exactly what is needed: nothing at all (fusion)
    for n, (lo, hi) in enumerate([(0, 1), (1, 4), (4, 8)]):
        assert gathers[("c1", n)].parts == (Part(rows(lo, hi), n),)
    transfers = {(t.src, t.dst): t.region for t in g.transfers() if t.tensor == "c0"}
    assert transfers == {(0, 1): rows(1, 2), (1, 2): rows(4, 6)}
    assert check_invariants(g) == []


def test_fused_layer_emits_no_crop_or_concat() -> None:
    g = partitioned(conv_chain([1, 1], relu_after=True), 2)
    programs, messages = lower(g)
    for prog in programs:
        ops = [n.op_type for s in prog.steps if s.op == "run" for n in s.segment.nodes]
        node_ops = [op for op in ops if op in ("Conv", "Relu")]
        assert node_ops == ["Conv", "Conv", "Relu"]
    # only the output travels (to node 0), in one message
    assert [(m.src, m.dst, m.tensor) for m in messages] == [(1, 0, "y")]


@pytest.mark.parametrize("nodes", [2, 3, 4])
def test_one_halo_row_per_neighbour_per_conv(nodes: int) -> None:
    channels, height, width, convs = 3, 12, 7, 4
    g = partitioned(conv_chain([3] * convs, channels, height, width), nodes)
    _, messages = lower(g)
    halos = [m for m in messages if m.tensor != "y"]
    row_bytes = channels * width * 4
    # convs 1.. read a produced tensor: every node gets one row from each neighbour
    assert all(m.region.shape[2] == 1 and abs(m.src - m.dst) == 1 for m in halos)
    assert sum(m.nbytes for m in halos) == (convs - 1) * 2 * (nodes - 1) * row_bytes
    for n in range(nodes):
        per_conv = sum(1 for m in halos if m.dst == n) / (convs - 1)
        assert per_conv == (1 if n in (0, nodes - 1) else 2)


def test_naive_moves_everything_and_optimized_much_less() -> None:
    model = conv_chain([3, 3, 3], 4, 16, 9)
    naive = partitioned(model, 4, optimize=False)
    opt = partitioned(model, 4)
    naive_bytes = sum(m.nbytes for m in lower(naive)[1])
    opt_bytes = sum(m.nbytes for m in lower(opt)[1])
    # naive: conv1 and conv2 outputs are gathered whole by all 4 nodes (3/4 of each arrives
    # from others), the output by node 0
    per_tensor = 4 * 16 * 9 * 4
    assert naive_bytes == 2 * 4 * (per_tensor * 3 // 4) + per_tensor * 3 // 4
    # optimized: one halo row per neighbour for conv1 and conv2, and the output to node 0
    row_bytes = 4 * 9 * 4
    assert opt_bytes == 2 * (2 * 3) * row_bytes + per_tensor * 3 // 4
    assert check_invariants(naive) == [] and check_invariants(opt) == []


def test_tensor_with_two_consumers_is_gathered_once(tmp_path) -> None:
    # c0 feeds a 3x3 conv and a 5x5 conv (via the residual in resnet-like graphs: two kernels)
    from onnx import helper
    from onnx_builder import graph_of, model_of, value_info

    rng = np.random.default_rng(1)

    def w(k: int) -> np.ndarray:
        return rng.standard_normal((2, 2, k, k)).astype(np.float32)

    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], name="c0", pads=[0, 0, 0, 0]),
        helper.make_node("Conv", ["c0", "w1"], ["c1"], name="c1", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["c0", "w2"], ["c2"], name="c2", pads=[2, 2, 2, 2]),
        helper.make_node("Add", ["c1", "c2"], ["y"], name="add"),
    ]
    weights = {"w0": w(1), "w1": w(3), "w2": w(5)}
    model = model_of(graph_of(nodes, [value_info("x", [1, 2, 12, 6])], [value_info("y", [1, 2, 12, 6])], weights, "two"))
    g = partitioned(model, 3)
    c0 = [t for t in g.transfers() if t.tensor == "c0"]
    # the middle node needs 2 rows each side (the 5x5 conv), sent once, not 1 + 2
    assert sorted((t.src, t.dst, t.region.shape[2]) for t in c0) == [(0, 1, 2), (1, 0, 2), (1, 2, 2), (2, 1, 2)]
    compile_plan(save(model, str(tmp_path)), str(tmp_path / "plan"), nodes=3)
    assert_exact(str(tmp_path / "plan"))


def test_weight_bytes_count_the_models_weights_only(tmp_path) -> None:
    # a height cut keeps every weight on every node, and nothing else counts (not the crops' indices)
    model = conv_chain([3, 3, 1], channels=3, height=12)
    total = sum(np.prod(w.dims) * 4 for w in model.graph.initializer)
    manifest = compile_plan(save(model, str(tmp_path)), str(tmp_path / "plan"), nodes=3)
    assert [n.weight_bytes for n in manifest.stats.per_node] == [total] * 3


def test_a_region_a_node_holds_is_gathered_as_it_is() -> None:
    # the common case of an optimized plan (derive_gathers asks it for every tensor and node
    # after every pass): no intersection or difference built, the region itself is the one part
    from bbgrap.ir import ShapeMap
    from bbgrap.movement import assemble

    held = {0: ShapeMap.box([0, 0, 0, 0], [1, 4, 6, 8]), 1: ShapeMap.box([0, 0, 4, 0], [1, 4, 12, 8])}
    owned = [(0, ShapeMap.box([0, 0, 0, 0], [1, 4, 6, 8])), (1, ShapeMap.box([0, 0, 6, 0], [1, 4, 12, 8]))]
    region = ShapeMap.box([0, 0, 4, 0], [1, 4, 9, 8])
    (part,) = assemble(region, 1, held, owned, 2)
    assert part.src == 1 and part.region is region
    parts = assemble(region, 0, held, owned, 2)  # node 0 holds rows 4-6 and receives 6-9 from node 1
    assert [(p.src, p.region.interval(2).start, p.region.interval(2).stop) for p in parts] == [(0, 4, 6), (1, 6, 9)]
