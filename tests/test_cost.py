"""bbgrap/cost.py: operations as counted (`layer_ops`) and as the CPU runs them (`run_ops`)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from bbgrap.frontends.onnx import import_proto
from graphs import conv_chain
from helpers import assert_exact, compile_plan, save
from onnx import helper

from bbgrap.cost import bytes_read, in_blocks, layer_ops, padded, run_ops
from bbgrap.ir import Graph, Interval, ShapeMap
from bbgrap.plan import read_manifest
from bbgrap.rules.base import CONV_READ_OPS, NCHWC_BLOCK
from bbgrap.rules.registry import default_registry
from tests.rules.helpers import build_model


def test_padded_rounds_up_to_whole_blocks() -> None:
    assert [padded(c, 16) for c in (1, 16, 17, 66, 190, 256)] == [16, 16, 32, 80, 192, 256]
    assert padded(66, 1) == padded(66, 0) == 66


def filters(graph: Graph, channels: int) -> float:
    """What reading the filters of `channels` output channels of conv_chain's 3 x 3 convolutions (no
    bias) costs a piece, in operations."""
    return CONV_READ_OPS * 4 * channels * graph.tensors["x"].shape[1] * 9


def inputs(graph: Graph, rows: float) -> float:
    """What reading `rows` rows of every input channel costs a piece, in operations."""
    _, c, _, w = graph.tensors["x"].shape
    return CONV_READ_OPS * 4 * c * rows * w


def test_a_piece_of_a_convolutions_channels_is_priced_by_whole_blocks() -> None:
    """A blocked convolution runs 66 of 256 channels as long as 80: its piece costs 80/66 of its
    operations; a piece of whole blocks, a cut of rows and the whole layer what they count; each
    piece pays for reading its filters, and for the input it reads beyond its share besides."""
    graph = import_proto(conv_chain([3, 3], channels=256, height=8, relu_after=True)).graph
    conv = next(layer for layer in graph.layers if layer.name == "conv0")
    full = ShapeMap.full(graph.tensors[conv.outputs[0]].shape)
    assert NCHWC_BLOCK == 16
    for channels, factor in ((66, 80 / 66), (64, 1.0), (190, 192 / 190), (1, 16.0)):
        piece = full.with_axis(1, Interval(0, channels))
        assert run_ops(conv, graph, piece) == pytest.approx(
            layer_ops(conv, graph, piece) * factor + filters(graph, channels) + inputs(graph, 8 * (1 - channels / 256)))
    rows = full.with_axis(2, Interval(0, 3))  # reads input rows 0-3 (its window's), which the throughput holds
    assert run_ops(conv, graph, rows) == pytest.approx(layer_ops(conv, graph, rows) + filters(graph, 256))
    assert run_ops(conv, graph, full) == pytest.approx(layer_ops(conv, graph, full) + filters(graph, 256))
    assert in_blocks(conv, graph, rows, layer_ops(conv, graph, rows), default_registry()) == layer_ops(conv, graph, rows)
    assert bytes_read(conv, graph, rows) == (4 * 256 * 256 * 9, 4 * 256 * 4 * 5)
    relu = next(layer for layer in graph.layers if layer.op_type == "Relu")
    piece = ShapeMap.full(graph.tensors[relu.outputs[0]].shape).with_axis(1, Interval(0, 66))
    assert run_ops(relu, graph, piece) == layer_ops(relu, graph, piece)  # runs its elements as they are, pays nothing for reads


def test_the_whole_layers_own_rounding_is_already_in_its_throughput() -> None:
    graph = import_proto(conv_chain([3], channels=24, height=8)).graph  # 24 channels run as 32
    conv = graph.layers[0]
    full = ShapeMap.full(graph.tensors[conv.outputs[0]].shape)
    half = full.with_axis(1, Interval(0, 12))  # 12 run as 16: half of the whole's 32
    assert run_ops(conv, graph, half) == pytest.approx(layer_ops(conv, graph, full) / 2 + filters(graph, 12) + inputs(graph, 4))


def test_small_pieces_of_rows_or_channels_cost_more_per_row_or_channel_and_a_depthwise_ones_do_not() -> None:
    """Two pieces of rows read the filters twice; two pieces of channels read the input twice. The simulator and the planners see a small piece of a heavy
    layer cost more per row, or per channel, than a large one. A depthwise convolution's piece of
    channels reads only its channels' input: its share, held in its throughput."""
    graph = import_proto(conv_chain([3], channels=256, height=14, width=14)).graph
    conv = graph.layers[0]
    full = ShapeMap.full(graph.tensors[conv.outputs[0]].shape)
    top, rest = full.with_axis(2, Interval(0, 3)), full.with_axis(2, Interval(3, 14))
    left, right = full.with_axis(1, Interval(0, 64)), full.with_axis(1, Interval(64, 256))
    whole = run_ops(conv, graph, full)
    assert run_ops(conv, graph, top) + run_ops(conv, graph, rest) == pytest.approx(whole + filters(graph, 256))
    assert run_ops(conv, graph, left) + run_ops(conv, graph, right) == pytest.approx(whole + inputs(graph, 14))
    assert run_ops(conv, graph, top) / 3 > 1.05 * run_ops(conv, graph, rest) / 11
    assert run_ops(conv, graph, left) / 64 > 1.02 * run_ops(conv, graph, right) / 192
    depthwise = import_proto(build_model([helper.make_node("Conv", ["x", "w"], ["y"], group=64, pads=[1, 1, 1, 1])], {"x": [1, 64, 14, 14]},
                                         {"w": np.ones((64, 1, 3, 3), np.float32)}, ["y"], 17)).graph
    dw = depthwise.layers[0]
    piece = ShapeMap.full(depthwise.tensors["y"].shape).with_axis(1, Interval(0, 16))
    assert run_ops(dw, depthwise, piece) == pytest.approx(layer_ops(dw, depthwise, piece) + CONV_READ_OPS * 4 * 16 * 9)


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
    assert whole_ops(conv, graph) == pytest.approx(layer_ops(conv, graph, full) + filters(graph, 256))


def test_a_piece_reads_at_the_nodes_measured_speed_where_calibrate_measured_it() -> None:
    """A convolution's piece pays for the filters it reads (`priced_reads`): in operations at its
    kind's throughput (`OpTraits.read_ops` a byte) by default, and where the node measured
    `conv_read_Bps` at that speed instead; its operations proper are priced alike either way."""
    from dataclasses import replace

    from bbgrap.passes.naive_partition import NaivePartition

    from bbgrap.cluster import NodeProfile
    from bbgrap.simulate import layer_work, op_kind, whole_ops

    graph = NaivePartition(2).call(import_proto(conv_chain([3], channels=256, height=14, width=14)).graph).graph  # rows
    conv = graph.layers[0]
    work = layer_work(conv, graph, graph.partitions[conv.name], 0, op_kind(conv, graph), whole_ops(conv, graph), default_registry())
    assert work.reads == filters(graph, 256) / CONV_READ_OPS  # every piece of rows reads all the filters
    assert work.read_ops == pytest.approx(CONV_READ_OPS * work.reads)
    assert work.ops == pytest.approx(layer_ops(conv, graph, graph.partitions[conv.name].emitted(0)) + work.read_ops)
    node = NodeProfile(conv_ops_per_s=1e11, conv_op_s=0.0, weight_Bps=1e15)

    def seconds(p: NodeProfile) -> float:
        return p.layer_time(work.name, work.kind, work.ops, work.whole_ops, reads=work.reads, read_ops=work.read_ops)

    assert seconds(node) == pytest.approx(work.ops / 1e11)
    measured = replace(node, conv_read_Bps=2e10)
    assert seconds(measured) == pytest.approx((work.ops - work.read_ops) / 1e11 + work.reads / 2e10)
    # the share of the filters the node's cache keeps between inferences costs no read beyond the operations
    for profile in (node, measured):
        def kept(share: float, p: NodeProfile = profile) -> float:
            return p.layer_time(work.name, work.kind, work.ops, work.whole_ops, reads=work.reads, read_ops=work.read_ops, kept=share)

        assert kept(1.0) == pytest.approx((work.ops - work.read_ops) / 1e11)
        assert kept(0.25) - kept(1.0) == pytest.approx(0.75 * (seconds(profile) - kept(1.0)))
        assert kept(0.0) == pytest.approx(seconds(profile))


def test_a_node_keeps_a_working_set_up_to_its_measured_cache_a_falling_share_beyond_and_none_where_it_measured_none() -> None:
    from bbgrap.cluster import NodeProfile, cache_hits

    node = NodeProfile(cache_bytes=16e6)
    assert node.kept(16e6) == 1.0 and node.kept(1.0) == 1.0
    assert node.kept(0.0) == 0.0  # nothing touched, nothing read
    assert NodeProfile().kept(1.0) == 0.0  # calibrate saw no slower regime: nothing is known to stay in the cache
    assert 0.99 < node.kept(16e6 + 1e3) < 1.0  # no step at the cache's size: a set just beyond it keeps nearly all
    assert node.kept(32e6) == pytest.approx(cache_hits(2.0)) and node.kept(32e6) == pytest.approx(0.2032, abs=1e-4)
    ratios = [1.0 + 0.05 * k for k in range(1, 200)]
    hits = [cache_hits(r) for r in ratios]
    assert all(a > b for a, b in zip(hits, hits[1:])) and 0.0 <= hits[-1] < 1e-3
    for r, h in zip(ratios, hits):  # the share a cache evicting at random keeps: h = exp(-(1 - h) x ratio), its root below 1
        assert h == pytest.approx(math.exp(-(1.0 - h) * r), abs=1e-12) and h < 1.0 - 1e-6
