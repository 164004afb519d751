"""Convolution (plain, group, depthwise, dilated, strided, asymmetric pads).

Spatial axes use the windowed rule (thesis eq. 3.2–3.6); the channel axis cuts the
weights, and a cut through the middle of a group computes the whole groups it
touches and crops (a group conv needs the groups' input channels whole).
"""

from __future__ import annotations

import math

from bbgrap.ir import Graph, Interval, Layer, ShapeMap
from bbgrap.rules.base import CONV_READ_OPS, NCHWC_BLOCK, Layout, Local, OpTraits, RegionRule, RuleRegistry, all_axes, shape
from bbgrap.rules.window import Window, kernel_of, window_attrs


class ConvRule(RegionRule):
    group = "convolutions"
    windowed = True

    def ops_per_element(self, layer: Layer, graph: Graph) -> float:
        """A multiply-add per weight of one output channel: 2·(C_in/group)·∏kernel."""
        w = shape(graph, layer.inputs[1])
        return 2.0 * w[1] * math.prod(w[2:])

    def axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        return all_axes(layer, graph)

    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        x_shape = shape(graph, layer.inputs[0])
        w_shape = shape(graph, layer.inputs[1])
        groups = int(layer.attrs.get("group", 1))
        c_out, c_in = w_shape[0], x_shape[1]
        per_out, per_in = c_out // groups, c_in // groups
        ch = out.interval(1)
        if groups == 1:
            computed_ch, in_ch, local_groups = ch, Interval(0, c_in), 1
        else:
            g0, g1 = ch.start // per_out, (ch.stop - 1) // per_out + 1
            computed_ch = Interval(g0 * per_out, g1 * per_out)
            in_ch = Interval(g0 * per_in, g1 * per_in)
            local_groups = g1 - g0
        window = Window.of(layer, x_shape, kernel_of(graph, layer))
        spatial, attrs = window_attrs(window, out)
        if local_groups != groups:
            attrs["group"] = local_groups
        x_need = ShapeMap(((out.interval(0),), (in_ch,)) + tuple((s,) for s in spatial))
        w_need = ShapeMap.full(w_shape).with_axis(0, computed_ch)
        needs: list[ShapeMap | None] = [x_need, w_need]
        if len(layer.inputs) > 2 and layer.inputs[2]:
            needs.append(ShapeMap.box([computed_ch.start], [computed_ch.stop]))
        return Local(tuple(needs), out.with_axis(1, computed_ch), attrs)


def register(registry: RuleRegistry) -> None:
    registry.register(["Conv"], ConvRule(), OpTraits(layout=Layout.BLOCKED, channel_block=NCHWC_BLOCK, read_ops=CONV_READ_OPS))
