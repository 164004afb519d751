"""Pools: windowed (MaxPool, AveragePool, LpPool), global pools, and LRN.

Windowed pools cut any axis (channels and batch pass through, spatial axes use the
windowed rule); global pools cannot cut a spatial axis; LRN sums over a window of channels, so a
piece of a channel cut reads a channel halo (`LRNRule`). The QOperator format's com.microsoft
QLinearAveragePool and QLinearGlobalAveragePool are cut as their float ops (`base.QuantizedRule`);
their `channels_last` layout (NHWC) as well for the global pool, not at all for the windowed one.
"""

from __future__ import annotations

import math

from bbgrap.ir import Graph, Interval, Layer, ShapeMap
from bbgrap.rules.base import MS_DOMAIN, EightBit, Layout, Local, OpTraits, RegionRule, RuleRegistry, all_axes, full, quantized, shape
from bbgrap.rules.window import Window, kernel_of, window_attrs


class WindowPoolRule(RegionRule):
    group = "pools"
    windowed = True
    blocked_sums = frozenset({"AveragePool"})  # a maximum is the same in any order

    def ops_per_element(self, layer: Layer, graph: Graph) -> float:
        """One operation per window element: ∏kernel."""
        return float(math.prod(layer.attrs.get("kernel_shape", [1])))

    def axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        # MaxPool's Indices: opaque; a channels-last (NHWC) QLinearAveragePool has its window on other axes
        if len([t for t in layer.outputs if t]) > 1 or layer.attrs.get("channels_last", 0):
            return frozenset()
        return self.grained(layer, graph, all_axes(layer, graph))

    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        x_shape = shape(graph, layer.inputs[0])
        window = Window.of(layer, x_shape, kernel_of(graph, layer))
        spatial, attrs = window_attrs(window, out)
        need = ShapeMap(((out.interval(0),), (out.interval(1),)) + tuple((s,) for s in spatial))
        return Local((need,), out, attrs)


class GlobalPoolRule(RegionRule):
    """A pool over every spatial axis: batch and channels pass through, the spatial axes are read
    whole. Channels are axis 1, or the last axis where `channels_last` is set (NHWC: a
    QLinearGlobalAveragePool)."""

    group = "pools"
    blocked_sums = frozenset({"GlobalAveragePool"})

    def _axes(self, layer: Layer, graph: Graph) -> tuple[int, int]:
        """The batch and channel axes."""
        return 0, len(shape(graph, layer.inputs[0])) - 1 if layer.attrs.get("channels_last", 0) else 1

    def ops_per_element(self, layer: Layer, graph: Graph) -> float:
        """One operation per input element of the channel: ∏spatial."""
        dims = shape(graph, layer.inputs[0])
        return float(math.prod(dims)) / max(1, math.prod(dims[a] for a in self._axes(layer, graph)))

    def axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        return self.grained(layer, graph, frozenset(self._axes(layer, graph)))

    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        need = full(graph, layer.inputs[0])
        for a in self._axes(layer, graph):
            need = need.with_axis(a, out.interval(a))
        return Local((need,), out)


class LRNRule(RegionRule):
    """LRN: Y[c] = X[c] / (bias + alpha/size · Σ X[i]², i ∈ [c − ⌊(size − 1)/2⌋, c + ⌈(size − 1)/2⌉]
    clipped to the channels). Along every other axis a piece reads exactly its own box. Along
    channels, output channels [c0, c1) read input channels [c0 − ⌊(size − 1)/2⌋, c1 + ⌈(size − 1)/2⌉)
    clipped; the local op on them clips its windows at that crop's edges, so its edge channels
    differ from the whole op's where the crop is not the tensor's edge: it emits all the crop's
    channels and lowering keeps [c0, c1) (`Local.emits`). Where a rounding after it makes a last
    bit a step (`Graph.rounded_later`), it is not cut (`uncut`)."""

    ROUNDED = ("onnxruntime sums its squares over the channels from the first and raises them to the power in vectors whose "
               "ends depend on the tensor's size, so a piece is a last bit off the whole op, which the rounding after it would make a step")

    group = "pools"

    def ops_per_element(self, layer: Layer, graph: Graph) -> float:
        """One operation per channel of the window: `size`."""
        return float(layer.attrs.get("size", 1))

    def axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        return frozenset() if graph.rounded_later(layer) else all_axes(layer, graph)

    def uncut(self, layer: Layer, graph: Graph) -> str | None:
        return self.ROUNDED if graph.rounded_later(layer) else None

    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        size = int(layer.attrs.get("size", 1))
        channels, iv = shape(graph, layer.inputs[0])[1], out.interval(1)
        rows = Interval(max(0, iv.start - (size - 1) // 2), min(channels, iv.stop + size // 2))
        need = out.with_axis(1, rows)
        return Local((need,), out, emits=None if need == out else need)


def register(registry: RuleRegistry) -> None:
    window, global_pool = WindowPoolRule(), GlobalPoolRule()
    # on a quantized model's 8-bit values: a MaxPool on the integers, an AveragePool as QLinearAveragePool
    registry.register(["MaxPool"], window, OpTraits(layout=Layout.BLOCKED, eight_bit=EightBit(any_layout=True, generic_kernel=True)))
    registry.register(["AveragePool"], window, OpTraits(layout=Layout.BLOCKED, eight_bit=EightBit(any_layout=True)))
    registry.register(["LpPool"], WindowPoolRule())
    registry.register(["GlobalAveragePool"], global_pool, OpTraits(layout=Layout.BLOCKED, eight_bit=EightBit(any_layout=True)))
    registry.register(["GlobalMaxPool"], global_pool, OpTraits(layout=Layout.BLOCKED))
    registry.register(["GlobalLpPool"], GlobalPoolRule())
    registry.register(["LRN"], LRNRule())
    # com.microsoft's QLinearAveragePool and QLinearGlobalAveragePool(X, x_scale, x_zero_point, y_scale, y_zero_point)
    registry.register(["QLinearAveragePool"], quantized(window, "AveragePool", (0,)), domain=MS_DOMAIN)
    registry.register(["QLinearGlobalAveragePool"], quantized(global_pool, "GlobalAveragePool", (0,)), domain=MS_DOMAIN)
