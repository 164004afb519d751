"""Convolution (plain, group, depthwise, dilated, strided, asymmetric pads).

Spatial axes use the windowed rule (thesis eq. 3.2–3.6); the channel axis cuts the
weights, and a cut through the middle of a group computes the whole groups it
touches and crops (a group conv needs the groups' input channels whole). QLinearConv,
the QOperator format's integer convolution, is cut as Conv (`base.QuantizedRule`).
"""

from __future__ import annotations

import math

from bbgrap.ir import Graph, Interval, Layer, ShapeMap
from bbgrap.rules.base import (
    CONV_READ_OPS,
    NCHWC_BLOCK,
    Layout,
    Local,
    OpTraits,
    RegionRule,
    RuleRegistry,
    all_axes,
    integer_kernel,
    multiplies_unpacked,
    paired,
    quantized,
    shape,
)
from bbgrap.rules.window import WEIGHTS, Window, kernel_of, window_attrs

# what onnxruntime's direct kernel of an 8-bit dense convolution takes (MLAS's symmetric convolution on
# AVX-512: input channels a multiple of 4, at least 16 output channels, a multiple of 4); otherwise im2col and a GEMM
DIRECT_INPUT_ALIGN, DIRECT_MIN_OUTPUTS, DIRECT_OUTPUT_ALIGN = 4, 16, 4
# a piece of such a convolution whose output channels the direct kernel does not take runs on im2col and a
# GEMM, this many times the direct kernel's time per operation (`cost.in_blocks`; docs/benchmarks.md, session 41)
GEMM_PATH_COST = 1.4


def direct_outputs(channels: int) -> bool:
    """Whether MLAS's direct integer kernel takes a convolution of this many output channels."""
    return channels >= DIRECT_MIN_OUTPUTS and channels % DIRECT_OUTPUT_ALIGN == 0


def integer_conv(layer: Layer, graph: Graph) -> bool:
    """Whether onnxruntime runs the layer as an 8-bit integer convolution: a QLinearConv, or a Conv
    whose QDQ pattern it fuses into one (`integer_kernel`)."""
    return layer.op_type == "QLinearConv" or (layer.op_type == "Conv" and integer_kernel(layer, graph))


def direct_integer(layer: Layer, graph: Graph) -> bool:
    """Whether onnxruntime runs the layer on MLAS's direct integer convolution kernel: an
    `integer_conv`, dense (one group), of input channels in DIRECT_INPUT_ALIGN and output channels
    the kernel takes (`direct_outputs`). MLAS decides by the shape of each call, so a piece of such
    a layer takes it by its own channels."""
    if not integer_conv(layer, graph) or int(layer.attrs.get("group", 1)) != 1:
        return False
    weights = shape(graph, layer.inputs[WEIGHTS.get(layer.op_type, 1)])
    return weights[1] % DIRECT_INPUT_ALIGN == 0 and direct_outputs(weights[0])


def _group_channels(out_channels: Interval, groups: int, per_out: int, per_in: int) -> tuple[Interval, Interval, int]:
    """For a cut of output channels through grouped channels: the output channels the local op
    computes (whole groups), the input channels those groups read, and the local group count."""
    if groups == 1:
        return out_channels, Interval(0, per_in), 1
    g0, g1 = out_channels.start // per_out, (out_channels.stop - 1) // per_out + 1
    return Interval(g0 * per_out, g1 * per_out), Interval(g0 * per_in, g1 * per_in), g1 - g0


class ConvRule(RegionRule):
    group = "convolutions"
    windowed = True
    blocked_sums = frozenset({"Conv"})

    def ops_per_element(self, layer: Layer, graph: Graph) -> float:
        """A multiply-add per weight of one output channel: 2·(C_in/group)·∏kernel."""
        w = shape(graph, layer.inputs[1])
        return 2.0 * w[1] * math.prod(w[2:])

    def _unpacked(self, layer: Layer, graph: Graph) -> bool:
        """A dense convolution by weights onnxruntime does not pack (`multiplies_unpacked`): MLAS
        multiplies the filters (M: output channels) by the input's columns (N: output pixels)."""
        return int(layer.attrs.get("group", 1)) == 1 and multiplies_unpacked(layer, graph, 1)

    def axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        """Every axis; not the channels of a product of one pixel by unpacked weights (`_unpacked`)."""
        axes = self.grained(layer, graph, all_axes(layer, graph))
        if math.prod(shape(graph, layer.outputs[0])[2:]) == 1 and self._unpacked(layer, graph):
            return axes - {1}
        return axes

    def grain(self, layer: Layer, graph: Graph, axis: int) -> int:
        """A grouped (depthwise) convolution's channels in whole blocks where it is rounded
        (`RegionRule.grain`): a piece of its channels reads a piece of the input's. A dense
        one reads every input channel, and a piece of its outputs sums as the whole op does (by
        unpacked weights, with a row or column more: `local`)."""
        return super().grain(layer, graph, axis) if int(layer.attrs.get("group", 1)) > 1 else 1

    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        """The output channels' filters (whole groups where the cut goes through one) over the
        window of the rows. A piece of one output channel, or of one output pixel, of a convolution
        by unpacked weights (`_unpacked`) computes one beside it too (`paired`), which lowering
        crops away (`Local.emits`)."""
        x_shape = shape(graph, layer.inputs[0])
        w_shape = shape(graph, layer.inputs[1])
        groups = int(layer.attrs.get("group", 1))
        computed_ch, in_ch, local_groups = _group_channels(out.interval(1), groups, w_shape[0] // groups, x_shape[1] // groups)
        computes = out.with_axis(1, computed_ch)
        emitted = computes
        if self._unpacked(layer, graph):
            dims = shape(graph, layer.outputs[0])
            emitted = paired(paired(computes, [1], dims), range(2, len(dims)), dims)
        window = Window.of(layer, x_shape, kernel_of(graph, layer))
        spatial, attrs = window_attrs(window, emitted)
        if local_groups != groups:
            attrs["group"] = local_groups
        channels = emitted.interval(1)
        x_need = ShapeMap(((emitted.interval(0),), (in_ch,)) + tuple((s,) for s in spatial))
        w_need = ShapeMap.full(w_shape).with_axis(0, channels)
        needs: list[ShapeMap | None] = [x_need, w_need]
        if len(layer.inputs) > 2 and layer.inputs[2]:
            needs.append(ShapeMap.box([channels.start], [channels.stop]))
        return Local(tuple(needs), computes, attrs, emits=None if emitted == computes else emitted)


class ConvTransposeRule(RegionRule):
    """Transposed convolution (a U-Net's or decoder's upsampling), on any spatial rank.

    Along a spatial axis of n input rows, stride s, kernel k, dilation d and pads (p0, p1),
    input row i adds into output rows i·s − p0 + j·d, j < k. Output rows [o0, o1) therefore
    read input rows [i0, i1) with i0 = max(0, ⌊(o0 + p0 − (k − 1)·d) / s⌋) and
    i1 = min(n, ⌊(o1 − 1 + p0) / s⌋ + 1); the same op on those rows alone makes the rows
    from i0·s − p0 on, so its local pads are q0 = o0 − (i0·s − p0) (≥ 0: ⌊⌋ keeps i0·s − p0 ≤ o0)
    at the start and whatever is left over at the end, or where its rows stop short of o1 (rows
    only the bias reaches: after the last input, or in the gaps of a stride longer than the
    kernel) that many rows of output_padding instead. Channels cut the weights' second axis
    (whole groups where a cut goes through one, as for Conv); a layer with auto_pad SAME_* or
    output_shape is cut along batch and channels only (VALID is pads of 0)."""

    group = "convolutions"

    def ops_per_element(self, layer: Layer, graph: Graph) -> float:
        """2·(C_in/group)·∏kernel multiply-adds per input position, spread over the output's
        positions: ∏(input's spatial size) / ∏(output's) of them per output element."""
        x, w, y = shape(graph, layer.inputs[0]), shape(graph, layer.inputs[1]), shape(graph, layer.outputs[0])
        groups = int(layer.attrs.get("group", 1))
        return 2.0 * (w[0] / groups) * math.prod(w[2:]) * math.prod(x[2:]) / max(1, math.prod(y[2:]))

    def _explicit(self, layer: Layer) -> bool:
        """Pads given (or VALID's zeros), not left to auto_pad or output_shape to work out."""
        return layer.attrs.get("auto_pad", "NOTSET") in ("NOTSET", "", "VALID") and "output_shape" not in layer.attrs

    def axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        return all_axes(layer, graph) if self._explicit(layer) else frozenset({0, 1})

    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        x_shape, w_shape = shape(graph, layer.inputs[0]), shape(graph, layer.inputs[1])
        groups = int(layer.attrs.get("group", 1))
        per_in, per_out = w_shape[0] // groups, w_shape[1]
        computed_ch, in_ch, local_groups = _group_channels(out.interval(1), groups, per_out, per_in)
        attrs: dict[str, object] = {} if local_groups == groups else {"group": local_groups}
        spatial_needs = [Interval(0, n) for n in x_shape[2:]]
        if self._explicit(layer) and any(out.interval(2 + a) != Interval(0, n) for a, n in enumerate(shape(graph, layer.outputs[0])[2:])):
            rank = len(x_shape) - 2
            kernel = list(w_shape[2:])
            strides = list(layer.attrs.get("strides", [1] * rank))
            dilations = list(layer.attrs.get("dilations", [1] * rank))
            pads = list(layer.attrs.get("pads", [0] * (2 * rank)))
            begins, ends, extra = [], [], []
            for a in range(rank):
                o = out.interval(2 + a)
                k, s, d, p0, n = kernel[a], strides[a], dilations[a], pads[a], x_shape[2 + a]
                i0 = max(0, (o.start + p0 - (k - 1) * d) // s)
                i1 = min(n, (o.stop - 1 + p0) // s + 1)
                i1 = max(i1, i0 + 1)  # a piece of rows only the bias reaches still reads a row
                made = (i1 - i0 - 1) * s + (k - 1) * d + 1  # rows the op makes of input rows [i0, i1), from i0·s − p0
                q0 = o.start - (i0 * s - p0)
                q1 = made - q0 - len(o)
                begins.append(q0)
                ends.append(max(q1, 0))
                extra.append(max(-q1, 0))
                spatial_needs[a] = Interval(i0, i1)
            attrs |= {"pads": begins + ends, "output_padding": extra, "auto_pad": "NOTSET"}
        x_need = ShapeMap(((out.interval(0),), (in_ch,)) + tuple((iv,) for iv in spatial_needs))
        # the weights: (C_in, C_out/group, kernel); one group's output channels are cut along the second axis
        w_need = ShapeMap.full(w_shape).with_axis(0, in_ch)
        if groups == 1:
            w_need = w_need.with_axis(1, computed_ch)
        needs: list[ShapeMap | None] = [x_need, w_need]
        if len(layer.inputs) > 2 and layer.inputs[2]:
            needs.append(ShapeMap.box([computed_ch.start], [computed_ch.stop]))
        return Local(tuple(needs), out.with_axis(1, computed_ch), attrs)


def register(registry: RuleRegistry) -> None:
    conv = ConvRule()
    registry.register(["Conv"], conv, OpTraits(layout=Layout.BLOCKED, channel_block=NCHWC_BLOCK, read_ops=CONV_READ_OPS))
    # QLinearConv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, [B]): Conv's x, w and B, w's
    # scale and zero point per output channel (w's axis 0); onnxruntime runs it on plain NCHW (or its own NHWC), never
    # in the float NCHWc layout; its filters are read again per piece as Conv's
    registry.register(["QLinearConv"], quantized(conv, "Conv", (0, 3, 8), {4: (1, 0), 5: (1, 0)}), OpTraits(read_ops=CONV_READ_OPS))
    registry.register(["ConvTranspose"], ConvTransposeRule(), OpTraits())
