"""How a layer's time scales with its piece (backends/scaling.py): the slopes from the halves'
ratios, the one-op pieces onnxruntime runs (rows halved, output channels halved with their
groups), the wiring into calibrate's timer, and a layer's weight share of a cut."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from bbgrap.backends.scaling import conv_pieces, matmul_pieces, measure_scaling, piece_model, slopes
from bbgrap.frontends.onnx import import_proto
from bbgrap.passes.naive_partition import partition_layer, split_sizes
from onnx import TensorProto, helper, numpy_helper

from bbgrap.cluster import Scaling
from bbgrap.cost import weight_share
from bbgrap.ir import Graph, ShapeMap
from bbgrap.rules.registry import default_registry

RNG = np.random.default_rng(0)


def one_op(op: str, x: tuple[int, ...], consts: dict[str, np.ndarray], **attrs: object) -> Graph:
    node = helper.make_node(op, ["x", *consts], ["y"], name="layer", **attrs)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          initializer=[numpy_helper.from_array(v, k) for k, v in consts.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    return import_proto(model, "m", None).graph


def output_shape(model: onnx.ModelProto) -> tuple[int, ...]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {i.name: RNG.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32) for i in model.graph.input}
    return tuple(sess.run(None, feeds)[0].shape)


@pytest.mark.parametrize(("rows", "channels", "want"), [
    ((0.5, 0.5), (0.5, 0.5), Scaling(1.0, 1.0)),  # halves cost half: everything scales
    ((0.75, 0.5), (0.5, 0.5), Scaling(0.5, 1.0)),  # half the rows cost 3/4: half of the time does not shrink along rows
    ((1.2, 0.5), (0.4, 0.5), Scaling(0.0, 1.0)),  # slower than whole, faster than half: clipped
    (None, (0.75, 0.5), Scaling(0.5, 0.5)),  # one half only: the other slope is taken equal
])
def test_slopes_from_the_halves(rows: tuple[float, float] | None, channels: tuple[float, float] | None, want: Scaling) -> None:
    got = slopes(1.0, rows, channels)
    assert got is not None and math.isclose(got.rows, want.rows) and math.isclose(got.channels, want.channels)
    assert slopes(1.0, None, None) is None


@pytest.mark.parametrize(("channels", "group", "halved_group"), [(8, 1, 1), (8, 8, 4), (8, 2, 1), (9, 3, None)])
def test_conv_pieces_run_in_onnxruntime_on_half_the_rows_and_channels(channels: int, group: int, halved_group: int | None) -> None:
    w = RNG.standard_normal((channels, channels // group, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(channels).astype(np.float32)
    graph = one_op("Conv", (1, channels, 9, 7), {"w": w, "b": b}, pads=[1, 1, 1, 1], group=group)
    layer = graph.layers[0]
    pieces = conv_pieces(layer, graph, dict(graph.constants))
    assert pieces is not None
    whole, rows, half = pieces
    assert output_shape(piece_model(layer, whole)) == (1, channels, 9, 7)
    assert rows is not None and output_shape(piece_model(layer, rows)) == (1, channels, 5, 7)
    if halved_group is None:
        assert half is None  # an odd number of groups does not halve
        return
    assert half is not None and half.attrs["group"] == halved_group and half.weight_share == 0.5
    assert output_shape(piece_model(layer, half)) == (1, channels // 2, 9, 7)


def test_matmul_and_gemm_pieces_halve_rows_and_columns() -> None:
    graph = one_op("MatMul", (1, 6, 16), {"w": RNG.standard_normal((16, 10)).astype(np.float32)})
    whole, rows, half = matmul_pieces(graph.layers[0], graph, dict(graph.constants)) or (None, None, None)
    assert whole is not None and rows is not None and half is not None
    assert output_shape(piece_model(graph.layers[0], rows)) == (1, 3, 10)
    assert output_shape(piece_model(graph.layers[0], half)) == (1, 6, 5)
    gemm = one_op("Gemm", (1, 16), {"w": RNG.standard_normal((10, 16)).astype(np.float32), "c": RNG.standard_normal(10).astype(np.float32)},
                  transB=1)
    whole, rows, half = matmul_pieces(gemm.layers[0], gemm, dict(gemm.constants)) or (None, None, None)
    assert whole is not None and rows is None and half is not None  # one row: no rows half
    assert output_shape(piece_model(gemm.layers[0], half)) == (1, 5)


@pytest.mark.parametrize(("timer", "want"), [("elements", 1.0), ("constant", 0.0)])
def test_measure_scaling_asks_the_timer_for_every_piece(timer: str, want: float) -> None:
    """A timer in proportion to the output's elements gives slopes 1; one that never changes, 0."""
    graph = one_op("Conv", (1, 8, 12, 12), {"w": RNG.standard_normal((8, 8, 3, 3)).astype(np.float32)}, pads=[1, 1, 1, 1])
    asked: list[tuple[int, ...]] = []

    def time_it(model: onnx.ModelProto) -> tuple[float, tuple[int, ...]]:
        shape = output_shape(model)
        asked.append(shape)
        return (float(math.prod(shape)) if timer == "elements" else 1.0), shape

    got = measure_scaling(graph, time_it, {"layer": 1e-3})
    assert sorted(asked) == [(1, 4, 12, 12), (1, 8, 6, 12), (1, 8, 12, 12)]
    assert got == {"layer": Scaling(want, want)}
    assert measure_scaling(graph, time_it, {"layer": 0.0}) == {}  # folded away: nothing to scale


def test_a_cut_along_rows_reads_every_weight_one_along_channels_its_share() -> None:
    graph = one_op("Conv", (1, 8, 12, 12), {"w": RNG.standard_normal((8, 8, 3, 3)).astype(np.float32)}, pads=[1, 1, 1, 1])
    graph = replace(graph, nodes=2)
    layer, registry = graph.layers[0], default_registry()
    rows = partition_layer(graph, layer, 2, split_sizes(12, (1.0, 1.0)), registry)
    channels = partition_layer(graph, layer, 1, split_sizes(8, (1.0, 1.0)), registry)
    assert [weight_share(layer, graph, rows.needs[n]) for n in (0, 1)] == [1.0, 1.0]
    assert [weight_share(layer, graph, channels.needs[n]) for n in (0, 1)] == [0.5, 0.5]
    assert weight_share(layer, graph, (ShapeMap.full((1, 8, 12, 12)),)) == 1.0  # no constant among those read
