"""Elementwise ops: activations, broadcasting arithmetic, Expand, BatchNormalization,
QuantizeLinear and DequantizeLinear; the QOperator format's com.microsoft QLinearAdd,
QLinearMul, QLinearSigmoid and QLinearLeakyRelu, cut as their float ops (`base.QuantizedRule`).

Every output element depends only on the input elements at the same (broadcast)
position, so regions pass through; constant operands are sliced along with them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Sequence

import numpy as np

from bbgrap.ir import Graph, Layer, ShapeMap
from bbgrap.rules.base import (
    MS_DOMAIN,
    EightBit,
    Layout,
    Local,
    OpTraits,
    RegionRule,
    RuleRegistry,
    all_axes,
    broadcast_need,
    quantized,
    shape,
)

ACTIVATIONS = (
    "PRelu",
    "Elu", "Selu", "Celu", "Softplus", "Softsign", "ThresholdedRelu", "Mish", "Erf",
    "Exp", "Log", "Sqrt", "Reciprocal", "Neg", "Abs", "Floor", "Ceil", "Round", "Sign",
    "Sin", "Cos", "Not", "Cast", "Shrink",
)
# onnxruntime's NCHWc layout passes through these too (as through a ReLU and a Clip, which it fuses
# into a Conv: `register`), on their own (after a pool or an Add; onnxruntime 1.31); the exporters'
# SiLU, x·sigmoid(x), uses the convolution's output twice, so its Sigmoid is not fused into it
KEEPS_UNFUSED = ("Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Gelu")
ARITHMETIC = ("Sub", "Div", "Pow", "Max", "Min", "Mean", "Where", "Equal", "Greater", "Less", "And", "Or")
# a quantized model's Add and Mul run on uint8 values, in either layout (QLinearAdd, QLinearMul)
EIGHT_BIT_ARITHMETIC = EightBit(unsigned_only=True, any_layout=True)


class BroadcastRule(RegionRule):
    """Ops whose inputs broadcast (numpy rules) to the output."""

    passes_through = True

    def __init__(self, group: str) -> None:
        self.group = group

    def axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        if len([t for t in layer.outputs if t]) > 1:  # e.g. Dropout's mask is read
            return frozenset()
        return all_axes(layer, graph)

    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        needs = tuple(broadcast_need(out, shape(graph, t)) if t else None for t in layer.inputs)
        return Local(needs, out)


class ExpandRule(RegionRule):
    """Expand broadcasts its input to a shape (numpy rules): Y[i] = X[i] on the input's axes of the
    output's size, X[0] on those of size 1, so an output region reads the input as a broadcasting
    operand does, and the local op expands to the region's shape (its `shape` input)."""

    def axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        return all_axes(layer, graph)

    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        need = broadcast_need(out, shape(graph, layer.inputs[0]))
        return Local((need, None), out, inputs={1: np.array(out.shape, np.int64)})


class BatchNormRule(RegionRule):
    """BatchNormalization (inference): per-channel parameters follow the channel axis. onnxruntime
    runs one whose input is blocked as a 1x1 convolution of the blocked layout, its last bit not
    that of its own kernel. The frontend gives one whose result is rounded later parameters both
    ways compute alike (frontends/norms.py, `same_in_every_layout`), exact cut anyhow; one it leaves
    (a QDQ pattern of its own, parameters computed at run time) has its channels cut in whole blocks
    where rounded (`RegionRule.grain`), exact where its segment computes its blocked input too."""

    group = "others"
    passes_through = True
    blocked_sums = frozenset({"BatchNormalization"})

    def axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        if len([t for t in layer.outputs if t]) > 1 or int(layer.attrs.get("spatial", 1)) != 1:
            return frozenset()
        return self.grained(layer, graph, all_axes(layer, graph))

    def grain(self, layer: Layer, graph: Graph, axis: int) -> int:
        return 1 if same_in_every_layout(layer, graph) else super().grain(layer, graph, axis)

    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        ch = out.interval(1)
        params = tuple(ShapeMap.box([ch.start], [ch.stop]) for _ in layer.inputs[1:])
        return Local((out,) + params, out)


def same_in_every_layout(layer: Layer, graph: Graph) -> bool:
    """Whether onnxruntime computes this BatchNormalization to the same bits with its own kernel and
    as a blocked convolution: ε = 0, μ = 0 and σ² = 1, so that both compute the scale γ and the shift
    β exactly (frontends/norms.py writes a rounded one so)."""
    mean, variance = (graph.constants.get(t) for t in layer.inputs[3:5]) if len(layer.inputs) == 5 else (None, None)
    return (float(layer.attrs.get("epsilon", 1e-5)) == 0.0 and mean is not None and variance is not None
            and not mean.any() and bool((variance == 1).all()))


def quantize_axis(attrs: Mapping[str, Any], scale: Sequence[int], rank: int) -> int | None:
    """The axis of a QuantizeLinear's or DequantizeLinear's value that its scale (and zero point) of
    shape `scale` runs along: `axis` for a 1-D scale of more than one element (per channel); None
    for a scalar, or one element (which onnxruntime takes as per tensor)."""
    return int(attrs.get("axis", 1)) % max(rank, 1) if len(scale) == 1 and scale[0] > 1 else None


class QuantizeRule(RegionRule):
    """QuantizeLinear and DequantizeLinear on their own (a quantized model's input, or a value
    something besides a layer reads, frontends/quantized.py): elementwise, with a scale and zero
    point per tensor, or 1-D along `axis` (per channel), cut with the region there. A blocked
    scale (opset 21's `block_size`) is not cut."""

    group = "others"
    passes_through = True

    def axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        return frozenset() if layer.attrs.get("block_size", 0) else all_axes(layer, graph)

    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        scale = shape(graph, layer.inputs[1])
        axis = quantize_axis(layer.attrs, scale, out.rank)
        if axis is not None:
            channels = out.interval(axis)
            params = ShapeMap.box([channels.start], [channels.stop])
        else:
            params = ShapeMap.full(scale)
        return Local((out,) + tuple(params if t else None for t in layer.inputs[1:]), out)


def register(registry: RuleRegistry) -> None:
    activation, arithmetic = BroadcastRule("others"), BroadcastRule("arithmetic")
    registry.register(ACTIVATIONS, activation, OpTraits(fuses_in_chain=True))
    # the output is the input (Dropout at inference): lowering binds it instead of emitting a node
    registry.register(["Identity"], activation, OpTraits(alias=True, moves_data=True))
    registry.register(["Dropout"], activation, OpTraits(alias=True))
    # a blocked convolution's kernel applies a ReLU as it writes each value, a Clip in a pass after
    keeps = OpTraits(layout=Layout.KEEPS, fuses_into_conv=True, fuses_in_chain=True)
    registry.register(["Relu"], activation, replace(keeps, in_kernel=True))
    registry.register(["Clip"], activation, keeps)
    registry.register(["LeakyRelu"], activation, OpTraits(fuses_into_conv=True, fuses_in_chain=True))
    registry.register(ARITHMETIC, arithmetic, OpTraits(fuses_in_chain=True))
    # onnxruntime's NCHWc layout runs Add and Sum blocked, and fuses them into a Conv, whose kernel
    # accumulates its output onto the other input
    blocked = OpTraits(layout=Layout.BLOCKED, fuses_into_conv=True, in_kernel=True, fuses_in_chain=True)
    registry.register(["Add"], arithmetic, replace(blocked, eight_bit=EIGHT_BIT_ARITHMETIC))
    registry.register(["Sum"], arithmetic, blocked)
    registry.register(KEEPS_UNFUSED, activation, OpTraits(layout=Layout.KEEPS, fuses_in_chain=True))
    # onnxruntime runs a Mul of two blocked values of one shape blocked, but fuses none into a Conv
    registry.register(["Mul"], arithmetic, OpTraits(layout=Layout.BLOCKED, fuses_in_chain=True, eight_bit=EIGHT_BIT_ARITHMETIC))
    registry.register(["BatchNormalization"], BatchNormRule(), OpTraits(layout=Layout.KEEPS, fuses_into_conv=True, folds_into_weights=True))
    registry.register(["Expand"], ExpandRule())
    quantize = QuantizeRule()
    registry.register(["QuantizeLinear", "DequantizeLinear"], quantize, OpTraits(transposes_pass=True))
    registry.register(["QuantizeLinear", "DequantizeLinear"], quantize, OpTraits(transposes_pass=True), domain=MS_DOMAIN)  # onnxruntime's, with 16-bit types
    # com.microsoft's QLinearAdd/QLinearMul(A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point)
    # and QLinearSigmoid/QLinearLeakyRelu(X, X_scale, X_zero_point, Y_scale, Y_zero_point), scales per tensor
    for op in ("Add", "Mul"):
        registry.register([f"QLinear{op}"], quantized(arithmetic, op, (0, 3)), domain=MS_DOMAIN)
    for op in ("Sigmoid", "LeakyRelu"):
        registry.register([f"QLinear{op}"], quantized(activation, op, (0,)), domain=MS_DOMAIN)
