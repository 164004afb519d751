"""Pools: windowed (MaxPool, AveragePool, LpPool), global pools, and LRN.

Windowed pools cut any axis (channels and batch pass through, spatial axes use the
windowed rule); global pools cannot cut a spatial axis; LRN sums over a window of channels, so a
piece of a channel cut reads a channel halo (`LRNRule`).
"""

from __future__ import annotations

import math

from bbgrap.ir import Graph, Interval, Layer, ShapeMap
from bbgrap.rules.base import Layout, Local, OpTraits, RegionRule, RuleRegistry, all_axes, full, shape
from bbgrap.rules.window import Window, kernel_of, window_attrs


class WindowPoolRule(RegionRule):
    group = "pools"
    windowed = True

    def ops_per_element(self, layer: Layer, graph: Graph) -> float:
        """One operation per window element: ∏kernel."""
        return float(math.prod(layer.attrs.get("kernel_shape", [1])))

    def axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        if len([t for t in layer.outputs if t]) > 1:  # MaxPool's Indices: opaque
            return frozenset()
        return all_axes(layer, graph)

    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        x_shape = shape(graph, layer.inputs[0])
        window = Window.of(layer, x_shape, kernel_of(graph, layer))
        spatial, attrs = window_attrs(window, out)
        need = ShapeMap(((out.interval(0),), (out.interval(1),)) + tuple((s,) for s in spatial))
        return Local((need,), out, attrs)


class GlobalPoolRule(RegionRule):
    group = "pools"

    def ops_per_element(self, layer: Layer, graph: Graph) -> float:
        """One operation per input element of the channel: ∏spatial."""
        return float(math.prod(shape(graph, layer.inputs[0])[2:]))

    def axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        return frozenset({0, 1})

    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        need = full(graph, layer.inputs[0]).with_axis(0, out.interval(0)).with_axis(1, out.interval(1))
        return Local((need,), out)


class LRNRule(RegionRule):
    """LRN: Y[c] = X[c] / (bias + alpha/size · Σ X[i]², i ∈ [c − ⌊(size − 1)/2⌋, c + ⌈(size − 1)/2⌉]
    clipped to the channels). Along every other axis a piece reads exactly its own box. Along
    channels, output channels [c0, c1) read input channels [c0 − ⌊(size − 1)/2⌋, c1 + ⌈(size − 1)/2⌉)
    clipped; the local op on them clips its windows at that crop's edges, so its edge channels
    differ from the whole op's where the crop is not the tensor's edge: it emits all the crop's
    channels and lowering keeps [c0, c1) (`Local.emits`)."""

    group = "pools"

    def ops_per_element(self, layer: Layer, graph: Graph) -> float:
        """One operation per channel of the window: `size`."""
        return float(layer.attrs.get("size", 1))

    def axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        return all_axes(layer, graph)

    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        size = int(layer.attrs.get("size", 1))
        channels, iv = shape(graph, layer.inputs[0])[1], out.interval(1)
        rows = Interval(max(0, iv.start - (size - 1) // 2), min(channels, iv.stop + size // 2))
        need = out.with_axis(1, rows)
        return Local((need,), out, emits=None if need == out else need)


def register(registry: RuleRegistry) -> None:
    registry.register(["MaxPool", "AveragePool"], WindowPoolRule(), OpTraits(layout=Layout.BLOCKED))
    registry.register(["LpPool"], WindowPoolRule())
    registry.register(["GlobalAveragePool", "GlobalMaxPool"], GlobalPoolRule(), OpTraits(layout=Layout.BLOCKED))
    registry.register(["GlobalLpPool"], GlobalPoolRule())
    registry.register(["LRN"], LRNRule())
