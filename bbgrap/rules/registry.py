"""The region-rule registry: op type → rule "output region → needed input regions".

One module per op family registers its rules; registering an op twice is an error
(as onnxslim's shape handlers do), so two families cannot silently disagree.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np

from bbgrap.ir import Graph, Interval, Layer, ShapeMap


@dataclass(frozen=True)
class Local:
    """What a node's local op needs to produce one output region.

    `needs[i]` is the region of input i it reads (None: input absent, or dropped
    from the local op, as Concat drops inputs outside the region); `computes` is
    what the local op produces (a superset of the requested region when the op
    cannot produce exactly that, e.g. LRN's channel halo); `attrs` overrides the
    layer's attributes for the local op; `inputs[i]` replaces the value of constant
    input i in the local op (for what newer opsets pass as inputs rather than
    attributes: Slice's starts and ends, Pad's pads, Gather's indices shifted to the
    local input's origin, Reshape's shape). Where `inputs` gives input i, `needs[i]` is None.
    """

    needs: tuple[ShapeMap | None, ...]
    computes: ShapeMap
    attrs: Mapping[str, Any] = field(default_factory=dict)
    inputs: Mapping[int, np.ndarray] = field(default_factory=dict)


class RegionRule(ABC):
    """How one op family maps an output region to the input regions it reads."""

    group: str = "others"

    @abstractmethod
    def axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        """Output axes along which this layer can be cut (empty: whole only)."""

    @abstractmethod
    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        """Input regions and local attributes to compute the box `out`."""

    def ops_per_element(self, layer: Layer, graph: Graph) -> float:
        """Operations per output element of the layer (the cost model's unit: one)."""
        return 1.0


class RuleRegistry:
    """Op type → rule, with duplicate registration an error."""

    def __init__(self) -> None:
        self._rules: dict[str, RegionRule] = {}

    def register(self, op_types: Iterable[str], rule: RegionRule) -> None:
        for op in op_types:
            if op in self._rules:
                raise ValueError(f"region rule for {op} registered twice")
            self._rules[op] = rule

    def get(self, layer: Layer) -> RegionRule | None:
        if layer.domain not in ("", "ai.onnx"):
            return None
        return self._rules.get(layer.op_type)

    def __contains__(self, op_type: str) -> bool:
        return op_type in self._rules

    def op_types(self) -> list[str]:
        return sorted(self._rules)


@functools.cache
def default_registry() -> RuleRegistry:
    """The registry of every rule family shipped with BBGraP (built once, never mutated after)."""
    from bbgrap.rules import conv, elementwise, indexing, pool, reduce, structural

    registry = RuleRegistry()
    for family in (conv, pool, elementwise, structural, reduce, indexing):
        family.register(registry)
    return registry


# helpers shared by the rule families -----------------------------------------------


def shape(graph: Graph, tensor: str) -> tuple[int, ...]:
    return graph.tensors[tensor].shape


def full(graph: Graph, tensor: str) -> ShapeMap:
    return ShapeMap.full(shape(graph, tensor))


def broadcast_need(out: ShapeMap, in_shape: tuple[int, ...]) -> ShapeMap:
    """Region of a (numpy-)broadcast input that an output region reads."""
    offset = out.rank - len(in_shape)
    axes = []
    for k, dim in enumerate(in_shape):
        iv = out.interval(k + offset)
        axes.append(Interval(0, 1) if dim == 1 else iv)
    return ShapeMap(tuple((a,) for a in axes))


def all_axes(layer: Layer, graph: Graph) -> frozenset[int]:
    return frozenset(range(len(shape(graph, layer.outputs[0]))))
