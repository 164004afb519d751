"""Reductions and normalisations: the Reduce* ops over any axes (a global pool in disguise, as
the dynamo exporter writes average pooling) and LayerNormalization. The reduced (normalised)
axes are read whole; every other axis passes its region through, so a layer can be cut along
any axis it does not reduce."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from bbgrap.ir import Graph, Layer, ShapeMap
from bbgrap.rules.base import Local, RegionRule, RuleRegistry, full, shape

REDUCE_OPS = ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
              "ReduceLogSumExp", "ReduceSumSquare")


def _normalised(axes: Sequence[int], rank: int) -> frozenset[int]:
    return frozenset(a + rank if a < 0 else a for a in axes)


def reduced_axes(layer: Layer, graph: Graph) -> frozenset[int] | None:
    """The input axes a Reduce* layer reduces (its `axes` attribute, or its constant axes input);
    None where they are not known at compile time."""
    rank = len(shape(graph, layer.inputs[0]))
    if "axes" in layer.attrs:
        return _normalised([int(a) for a in layer.attrs["axes"]], rank)
    if len(layer.inputs) > 1 and layer.inputs[1]:
        given = graph.constants.get(layer.inputs[1])
        if given is None:
            return None  # axes computed from the data
        axes = [int(a) for a in np.asarray(given).reshape(-1)]
        if axes:
            return _normalised(axes, rank)
    return frozenset() if int(layer.attrs.get("noop_with_empty_axes", 0)) else frozenset(range(rank))


class ReduceRule(RegionRule):
    """Reduce* over `axes` (an attribute, or from opset 18 — 13 for ReduceSum — a constant input;
    none: every axis, or none at all with noop_with_empty_axes). With keepdims the output keeps
    the input's axes (the reduced ones of size 1), else it drops the reduced ones."""

    def ops_per_element(self, layer: Layer, graph: Graph) -> float:
        """One operation per input element reduced into the output element."""
        reduced = reduced_axes(layer, graph)
        dims = shape(graph, layer.inputs[0])
        return float(math.prod(dims[a] for a in (reduced if reduced is not None else range(len(dims)))))

    def _kept(self, layer: Layer, graph: Graph, reduced: frozenset[int]) -> list[int]:
        """For each output axis, the input axis it stands for."""
        rank = len(shape(graph, layer.inputs[0]))
        keep = int(layer.attrs.get("keepdims", 1))
        return list(range(rank)) if keep else [a for a in range(rank) if a not in reduced]

    def axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        reduced = reduced_axes(layer, graph)
        if reduced is None:
            return frozenset()
        return frozenset(k for k, a in enumerate(self._kept(layer, graph, reduced)) if a not in reduced)

    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        reduced = reduced_axes(layer, graph)
        need = full(graph, layer.inputs[0])
        if reduced is not None:
            for k, a in enumerate(self._kept(layer, graph, reduced)):
                if a not in reduced:
                    need = need.with_axis(a, out.interval(k))
        needs: list[ShapeMap | None] = [need]
        needs += [full(graph, t) if t else None for t in layer.inputs[1:]]  # the axes: read whole
        return Local(tuple(needs), out)


class LayerNormRule(RegionRule):
    """LayerNormalization normalises over the axes from `axis` on, with Scale and B shaped
    like them: those axes (and the parameters) are read whole, the leading ones pass through.
    Its optional Mean and InvStdDev outputs are computed whole."""

    def _axis(self, layer: Layer, graph: Graph) -> int:
        rank = len(shape(graph, layer.inputs[0]))
        axis = int(layer.attrs.get("axis", -1))
        return axis + rank if axis < 0 else axis

    def axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        if len([t for t in layer.outputs if t]) > 1:
            return frozenset()
        return frozenset(range(self._axis(layer, graph)))

    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        need = full(graph, layer.inputs[0])
        for a in range(min(self._axis(layer, graph), out.rank)):
            need = need.with_axis(a, out.interval(a))
        return Local((need, *(full(graph, t) if t else None for t in layer.inputs[1:])), out)


def register(registry: RuleRegistry) -> None:
    registry.register(REDUCE_OPS, ReduceRule())
    registry.register(["LayerNormalization"], LayerNormRule())
