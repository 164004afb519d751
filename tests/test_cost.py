"""bbgrap/cost.py: operations as counted (`layer_ops`) and as the CPU runs them (`run_ops`)."""

from __future__ import annotations

import pytest
from bbgrap.frontends.onnx import import_proto
from graphs import conv_chain
from helpers import assert_exact, compile_plan, save

from bbgrap.cost import bytes_read, layer_ops, padded, run_ops
from bbgrap.ir import Graph, Interval, ShapeMap
from bbgrap.plan import read_manifest
from bbgrap.rules.base import CONV_READ_OPS, NCHWC_BLOCK


def test_padded_rounds_up_to_whole_blocks() -> None:
    assert [padded(c, 16) for c in (1, 16, 17, 66, 190, 256)] == [16, 16, 32, 80, 192, 256]
    assert padded(66, 1) == padded(66, 0) == 66


def reads(graph: Graph, channels: int, rows: int) -> float:
    """What a piece of a 3 x 3 'same' convolution of conv_chain (no bias) pays for what it reads, in
    operations: the filters of `channels` output channels and every input channel of `rows` rows."""
    _, c, _, w = graph.tensors["x"].shape
    return CONV_READ_OPS * 4 * (channels * c * 9 + c * rows * w)


def test_a_piece_of_a_convolutions_channels_is_priced_by_whole_blocks() -> None:
    """A blocked convolution runs 66 of 256 channels as long as 80: its piece costs 80/66 of its
    operations; a piece of whole blocks, a cut of rows and the whole layer what they count; each
    piece pays for what it reads besides."""
    graph = import_proto(conv_chain([3, 3], channels=256, height=8, relu_after=True)).graph
    conv = next(layer for layer in graph.layers if layer.name == "conv0")
    full = ShapeMap.full(graph.tensors[conv.outputs[0]].shape)
    assert NCHWC_BLOCK == 16
    for channels, factor in ((66, 80 / 66), (64, 1.0), (190, 192 / 190), (1, 16.0)):
        piece = full.with_axis(1, Interval(0, channels))
        assert run_ops(conv, graph, piece) == pytest.approx(layer_ops(conv, graph, piece) * factor + reads(graph, channels, 8))
    rows = full.with_axis(2, Interval(0, 3))  # reads input rows 0-3 (the 'same' padding above row 0)
    assert run_ops(conv, graph, rows) == pytest.approx(layer_ops(conv, graph, rows) + reads(graph, 256, 4))
    assert run_ops(conv, graph, full) == pytest.approx(layer_ops(conv, graph, full) + reads(graph, 256, 8))
    assert run_ops(conv, graph, rows, reads=False) == layer_ops(conv, graph, rows)
    relu = next(layer for layer in graph.layers if layer.op_type == "Relu")
    piece = ShapeMap.full(graph.tensors[relu.outputs[0]].shape).with_axis(1, Interval(0, 66))
    assert run_ops(relu, graph, piece) == layer_ops(relu, graph, piece)  # runs its elements as they are, pays nothing for reads


def test_the_whole_layers_own_rounding_is_already_in_its_throughput() -> None:
    graph = import_proto(conv_chain([3], channels=24, height=8)).graph  # 24 channels run as 32
    conv = graph.layers[0]
    full = ShapeMap.full(graph.tensors[conv.outputs[0]].shape)
    half = full.with_axis(1, Interval(0, 12))  # 12 run as 16: half of the whole's 32
    assert run_ops(conv, graph, half) == pytest.approx(layer_ops(conv, graph, full) / 2 + reads(graph, 12, 8))


def test_every_piece_reads_its_filters_and_its_input_rows_so_small_pieces_cost_more_per_row_and_channel() -> None:
    """Two pieces of rows read the filters twice (and the two rows between them twice); two pieces
    of channels read the input twice. The simulator and the planners see a small piece of a heavy
    layer cost more per row, or per channel, than a large one."""
    graph = import_proto(conv_chain([3], channels=256, height=14, width=14)).graph
    conv = graph.layers[0]
    full = ShapeMap.full(graph.tensors[conv.outputs[0]].shape)
    top, rest = full.with_axis(2, Interval(0, 3)), full.with_axis(2, Interval(3, 14))
    left, right = full.with_axis(1, Interval(0, 64)), full.with_axis(1, Interval(64, 256))
    whole = run_ops(conv, graph, full)
    assert run_ops(conv, graph, top) + run_ops(conv, graph, rest) == pytest.approx(whole + reads(graph, 256, 2))
    assert run_ops(conv, graph, left) + run_ops(conv, graph, right) == pytest.approx(whole + reads(graph, 0, 14))
    assert run_ops(conv, graph, top) / 3 > 1.05 * run_ops(conv, graph, rest) / 11
    assert run_ops(conv, graph, left) / 64 > 1.01 * run_ops(conv, graph, right) / 192
    assert bytes_read(conv, graph, top) == 4 * (256 * 256 * 9 + 256 * 4 * 14)


def test_nodes_of_different_speeds_cut_a_convolutions_channels_in_whole_blocks_and_run_exactly(tmp_path) -> None:
    """The per-layer search, priced by whole blocks, cuts 128 channels at 1 : 2.9 as 32 : 96 (not 33 :
    95, whose 33 channels run as 48), and the plan is exact."""
    path = save(conv_chain([3, 3, 1], channels=128, height=10, width=10, relu_after=True), str(tmp_path), "chain")
    plan = str(tmp_path / "plan")
    compile_plan(path, plan, nodes=2, direction="c", speeds=(1.0, 2.9), search=True)
    layers = {row.name: row for row in read_manifest(plan).compiled.layer_table}
    for name in ("conv0", "conv1", "conv2"):
        row = layers[name]
        assert row.cut == "c" and [n.range for n in row.per_node] == [(0, 32), (32, 128)], row
    assert_exact(plan)


def test_the_per_layer_search_leaves_the_reads_out_and_the_simulator_prices_them() -> None:
    """The per-layer search prices a piece by its operations alone (the filters every piece of rows
    reads again would favour a channel cut, whose gathers downstream are beyond its one layer); the
    simulator prices what each piece reads."""
    from bbgrap.passes.naive_partition import NaivePartition
    from bbgrap.passes.search import LayerCutCost

    from bbgrap.config import Config
    from bbgrap.rules.registry import default_registry
    from bbgrap.simulate import whole_ops

    graph = NaivePartition(2).call(import_proto(conv_chain([3], channels=256, height=14, width=14)).graph).graph
    conv = graph.layers[0]
    full = ShapeMap.full(graph.tensors[conv.outputs[0]].shape)
    cost = LayerCutCost(graph, conv, 2, (1.0, 1.0), Config().objective, dict(graph.partitions), default_registry())
    assert cost.node_cost(0, 0, 3).work == pytest.approx(layer_ops(conv, graph, full.with_axis(2, Interval(0, 3))))
    assert whole_ops(conv, graph) == pytest.approx(layer_ops(conv, graph, full) + reads(graph, 256, 14))
