"""bbgrap/cost.py: operations as counted (`layer_ops`) and as the CPU runs them (`run_ops`)."""

from __future__ import annotations

import pytest
from bbgrap.frontends.onnx import import_proto
from graphs import conv_chain
from helpers import assert_exact, compile_plan, save

from bbgrap.cost import layer_ops, padded, run_ops
from bbgrap.ir import Interval, ShapeMap
from bbgrap.plan import read_manifest
from bbgrap.rules.base import NCHWC_BLOCK


def test_padded_rounds_up_to_whole_blocks() -> None:
    assert [padded(c, 16) for c in (1, 16, 17, 66, 190, 256)] == [16, 16, 32, 80, 192, 256]
    assert padded(66, 1) == padded(66, 0) == 66


def test_a_piece_of_a_convolutions_channels_is_priced_by_whole_blocks() -> None:
    """A blocked convolution runs 66 of 256 channels as long as 80: its piece costs 80/66 of its
    operations; a piece of whole blocks, a cut of rows and the whole layer what they count."""
    graph = import_proto(conv_chain([3, 3], channels=256, height=8, relu_after=True)).graph
    conv = next(layer for layer in graph.layers if layer.name == "conv0")
    full = ShapeMap.full(graph.tensors[conv.outputs[0]].shape)
    assert NCHWC_BLOCK == 16
    for channels, factor in ((66, 80 / 66), (64, 1.0), (190, 192 / 190), (1, 16.0)):
        piece = full.with_axis(1, Interval(0, channels))
        assert run_ops(conv, graph, piece) == pytest.approx(layer_ops(conv, graph, piece) * factor)
    rows = full.with_axis(2, Interval(0, 3))
    assert run_ops(conv, graph, rows) == layer_ops(conv, graph, rows)
    assert run_ops(conv, graph, full) == layer_ops(conv, graph, full)
    relu = next(layer for layer in graph.layers if layer.op_type == "Relu")
    piece = ShapeMap.full(graph.tensors[relu.outputs[0]].shape).with_axis(1, Interval(0, 66))
    assert run_ops(relu, graph, piece) == layer_ops(relu, graph, piece)  # runs its elements as they are


def test_the_whole_layers_own_rounding_is_already_in_its_throughput() -> None:
    graph = import_proto(conv_chain([3], channels=24, height=8)).graph  # 24 channels run as 32
    conv = graph.layers[0]
    full = ShapeMap.full(graph.tensors[conv.outputs[0]].shape)
    half = full.with_axis(1, Interval(0, 12))  # 12 run as 16: half of the whole's 32
    assert run_ops(conv, graph, half) == pytest.approx(layer_ops(conv, graph, full) / 2)


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
