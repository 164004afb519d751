"""Pools: windowed (MaxPool, AveragePool, LpPool), global pools, and LRN.

Windowed pools cut any axis (channels and batch pass through, spatial axes use the
windowed rule); global pools cannot cut a spatial axis; LRN sums over a window of channels, so it is
cut along every axis but channels: a piece of a channel cut would compute its channel
halo wrong (the neighbours' neighbours are missing), and a node holds and reuses all
its local op computes (bbgrap/movement.py).
"""

from __future__ import annotations

import math

from bbgrap.ir import Graph, Layer, ShapeMap
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
    group = "pools"

    def ops_per_element(self, layer: Layer, graph: Graph) -> float:
        """One operation per channel of the window: `size`."""
        return float(layer.attrs.get("size", 1))

    def axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        """Every axis but channels (module docstring): then a piece reads exactly its own box."""
        return all_axes(layer, graph) - {1}

    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        return Local((out,), out)


def register(registry: RuleRegistry) -> None:
    registry.register(["MaxPool", "AveragePool"], WindowPoolRule(), OpTraits(layout=Layout.BLOCKED))
    registry.register(["LpPool"], WindowPoolRule())
    registry.register(["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"], GlobalPoolRule())
    registry.register(["LRN"], LRNRule())
