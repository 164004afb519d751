"""How a layer's time scales with the piece of it a node computes (`bbgrap calibrate --model`).

`calibrate --model` measures each layer in the model run whole; a plan runs pieces of it. A
convolution on a small map does not take half its time for half its rows: every row band
reads the whole filter again, and a kernel has a start-up cost; a convolution with few
channels does not take half its time for half its output channels either (onnxruntime's
blocked layout works eight or sixteen channels at a time). So for each convolution and each
MatMul or Gemm with a constant 2-D weight, this module times the layer alone three times, as
a one-op model with weights of its shapes:

* whole;
* on the first half of its rows (a convolution's input height halved, a MatMul's or Gemm's
  rows halved): every weight, about half the operations;
* on the first half of its output channels (a convolution's filters halved, with its groups
  and input channels where it is grouped; a MatMul's or Gemm's columns): half the weights,
  half the operations.

A piece's time is then the layer's whole time times bbgrap/cluster.py's `Scaling`,
`(1 - rows + rows * r) * (1 - channels + channels * c)` for a piece with a share `r` of the
rows and `c` of the output channels, and each half's ratio to the whole gives its slope:
with `t` the half's time over the whole's and `s` its share of the rows (or channels),

    slope = (1 - t) / (1 - s),

clipped to [0, 1] (a half a little faster than half, as noise or a better cache fit make it,
is a slope of 1). Where only one half can be made (one row, one output channel, an odd group
count) the other slope is taken equal to it. The one-op models run unfused and in their own
layout, which is why they give only the *ratios*: the layer's time is still the whole
model's measurement.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from bbgrap.backends.probe_models import float_model
from onnx import helper

from bbgrap.cluster import Scaling
from bbgrap.ir import Graph, Layer
from bbgrap.rules.base import is_default_domain
from bbgrap.simulate import op_kind


@dataclass(frozen=True)
class Piece:
    """One one-op model of a layer: its input shapes, its constant inputs, its attributes, and the
    share of the whole layer's weights it reads (its share of the output channels)."""

    shapes: tuple[tuple[int, ...], ...]  # the activation inputs'
    constants: dict[str, np.ndarray]
    attrs: dict[str, object]
    weight_share: float


def _halved_rows(shape: tuple[int, ...], axis: int) -> tuple[int, ...] | None:
    if shape[axis] < 2:
        return None
    return (*shape[:axis], (shape[axis] + 1) // 2, *shape[axis + 1:])


def conv_pieces(layer: Layer, graph: Graph, constants: dict[str, np.ndarray]) -> tuple[Piece, Piece | None, Piece | None] | None:
    """The whole, first-rows and first-output-channels pieces of a 2-D convolution (None: not one)."""
    x = graph.tensors[layer.inputs[0]].shape
    w_name = layer.inputs[1]
    if len(x) != 4 or w_name not in constants or constants[w_name].ndim != 4:
        return None
    w = constants[w_name]
    group = int(layer.attrs.get("group", 1))
    attrs = dict(layer.attrs)
    whole = Piece((x,), constants, attrs, 1.0)
    rows_shape = _halved_rows(x, 2)
    rows = Piece((rows_shape,), constants, attrs, 1.0) if rows_shape is not None else None
    cout = w.shape[0]
    channels = None
    if cout >= 2 and (group == 1 or group % 2 == 0):
        half = cout // 2
        halved = {k: (v[:half] if v.ndim >= 1 and v.shape[0] == cout else v) for k, v in constants.items()}
        shape, new_attrs = x, attrs
        if group > 1:
            shape = (x[0], x[1] // 2, x[2], x[3])
            new_attrs = {**attrs, "group": group // 2}
        channels = Piece((shape,), halved, new_attrs, half / cout)
    return whole, rows, channels


def matmul_pieces(layer: Layer, graph: Graph, constants: dict[str, np.ndarray]) -> tuple[Piece, Piece | None, Piece | None] | None:
    """The whole, first-rows and first-columns pieces of a MatMul or Gemm of an activation by a
    constant 2-D weight (None: not one)."""
    a = graph.tensors[layer.inputs[0]].shape
    w_name = layer.inputs[1]
    if layer.inputs[0] in constants or w_name not in constants or constants[w_name].ndim != 2 or len(a) < 2:
        return None
    attrs = dict(layer.attrs)
    if layer.op_type == "Gemm" and int(attrs.get("transA", 0)):
        return None
    w = constants[w_name]
    trans_b = layer.op_type == "Gemm" and int(attrs.get("transB", 0))
    cols = w.shape[0] if trans_b else w.shape[1]
    bias = constants.get(layer.inputs[2]) if len(layer.inputs) > 2 and layer.inputs[2] else None
    if bias is not None and bias.size != 1 and bias.shape[-1] != cols or bias is not None and bias.ndim == 2 and bias.shape[0] != 1:
        return None
    whole = Piece((a,), constants, attrs, 1.0)
    rows_shape = _halved_rows(a, len(a) - 2)
    rows = Piece((rows_shape,), constants, attrs, 1.0) if rows_shape is not None else None
    channels = None
    if cols >= 2:
        half = cols // 2
        halved = dict(constants)
        halved[w_name] = w[:half] if trans_b else w[:, :half]
        if bias is not None and bias.size != 1:
            halved[layer.inputs[2]] = bias[..., :half]
        channels = Piece((a,), halved, attrs, half / cols)
    return whole, rows, channels


PIECES: dict[str, Callable[[Layer, Graph, dict[str, np.ndarray]], tuple[Piece, Piece | None, Piece | None] | None]] = {
    "Conv": conv_pieces, "MatMul": matmul_pieces, "Gemm": matmul_pieces}


def piece_model(layer: Layer, piece: Piece) -> onnx.ModelProto:
    """The layer alone as a model: its activation input at the piece's shape, its constants as
    initializers, its one output of whatever shape it makes."""
    node = helper.make_node(layer.op_type, list(layer.inputs), ["y"])
    node.attribute.extend(helper.make_attribute(k, v) for k, v in piece.attrs.items())
    activations = [t for t in layer.inputs if t and t not in piece.constants]
    constants = {t: piece.constants[t] for t in layer.inputs if t in piece.constants}
    return float_model([node], dict(zip(activations, piece.shapes)), {"y": None}, constants, "scaling")


def slopes(whole: float, rows: tuple[float, float] | None, channels: tuple[float, float] | None) -> Scaling | None:
    """The layer's `Scaling` from its whole time and each half's (time, share of the rows or
    channels) (module docstring); None where neither half was timed."""

    def slope(half: tuple[float, float] | None) -> float | None:
        if half is None or half[1] >= 1.0 or whole <= 0:
            return None
        return min(max((1.0 - half[0] / whole) / (1.0 - half[1]), 0.0), 1.0)

    r, c = slope(rows), slope(channels)
    if r is None and c is None:
        return None
    return Scaling(r if r is not None else c, c if c is not None else r)  # type: ignore[arg-type]  # one is there


def measure_scaling(graph: Graph, time_model: Callable[[onnx.ModelProto], tuple[float, tuple[int, ...]]],
                    names: Mapping[str, float]) -> dict[str, Scaling]:
    """The `Scaling` of every convolution and constant-weight MatMul or Gemm among `names` (the
    layers measured), each piece timed by `time_model` (seconds, and the output's shape). A layer
    onnxruntime cannot run alone keeps none (it is then priced in proportion to its operations)."""
    out: dict[str, Scaling] = {}
    for layer in graph.layers:
        build = PIECES.get(layer.op_type)
        if build is None or not is_default_domain(layer.domain) or op_kind(layer, graph) == "other" or names.get(layer.name, 0.0) <= 0:
            continue
        constants = {t: np.asarray(graph.constants[t]) for t in layer.inputs if t in graph.constants}
        if any(v.dtype != np.float32 for v in constants.values()):
            continue
        got = build(layer, graph, constants)
        if got is None:
            continue
        whole, rows, channels = got
        try:
            t_whole, out_whole = time_model(piece_model(layer, whole))
            halves: list[tuple[float, float] | None] = []
            for piece in (rows, channels):
                if piece is None:
                    halves.append(None)
                    continue
                t, shape = time_model(piece_model(layer, piece))
                # the rows' share: of the output (every weight read); the channels': of the weights
                halves.append((t, math.prod(shape) / math.prod(out_whole) if piece is rows else piece.weight_share))
        except Exception:  # noqa: BLE001  # onnxruntime refuses the op alone: priced by its operations
            continue
        scaling = slopes(t_whole, halves[0], halves[1])
        if scaling is not None:
            out[layer.name] = scaling
    return out
