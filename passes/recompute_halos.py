"""recompute-halos: compute a neighbour's halo rows locally where that is cheaper than receiving them.

After the cuts are fixed, every halo a node reads is a receive point: its segment
ends, the rank waits for the neighbour, and the next segment starts by
concatenating the halo to its own rows (copies and layout changes of the whole
tensor). Instead, the producer of the tensor can compute the extra rows itself
(its `computes` region grows past the region it owns), which moves the need for a
halo to the producer's inputs — usually thinner tensors (the input of a MobileNet
block rather than its 6x expansion) or tensors that are received anyway, so that
several layers share one receive point, as in fused-layer tiling (DeepThings).

Layers are visited in reverse topological order, so a layer's consumers have
grown their regions before it decides. A node recomputes a halo when

    extra operations + change in its inputs' receive costs  <  receive cost of the halo

with operations weighted by the node's slowness, and where a receive costs `sync_ops` (one receive point: a segment boundary, waiting,
layout changes) plus `byte_ops` per byte of the gathered region (the concat copies
all of it). Owned regions stay disjoint and tile every tensor; only what nodes
compute grows, so every result is still exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from bbgrap.cost import layer_ops
from bbgrap.ir import Graph, Layer, LayerPartition, ShapeMap
from bbgrap.movement import OUTPUT_NODE, derive_gathers, hull_of
from bbgrap.pass_manager import Pass, PassError, PassResult
from bbgrap.rules.registry import Local, RuleRegistry, default_registry


@dataclass(frozen=True)
class RecomputeHalos(Pass):
    name: ClassVar[str] = "recompute-halos"
    # Calibrated on onnxruntime's CPU provider (about 1e5 operations per microsecond
    # per core): one receive point costs roughly 50 us, a gathered byte about 0.1 ns.
    sync_ops: float = 5e6
    byte_ops: float = 10.0
    depth: int = 12  # layers looked up from a halo for a cheaper place to receive it
    speeds: tuple[float, ...] = ()  # relative node speeds: a slow node's extra operations cost it more time
    registry: RuleRegistry = field(default_factory=default_registry, compare=False)

    def requires(self, graph: Graph) -> None:
        if graph.movement != "optimized":
            raise PassError("run eliminate-transfers first")

    def call(self, graph: Graph) -> PassResult:
        partitions = dict(graph.partitions)
        consumers = graph.consumers()
        changed = False
        for layer in reversed(graph.layers):
            if not self._growable(graph, layer, partitions[layer.name]):
                continue
            for n in partitions[layer.name].active_nodes():
                part = partitions[layer.name]
                reads = _reads(partitions, consumers, layer.outputs[0], n)
                if not reads or part.computes[n].contains(need := hull_of(reads)):
                    continue
                grown = self._grow(graph, layer, part, n, need, partitions, consumers, self.depth)
                if grown is not None and grown[0] < 0:
                    local = grown[1]
                    partitions[layer.name] = _with_node(part, n, local.needs, local.computes, local.attrs)
                    changed = True
        if not changed:
            return PassResult(graph, False)
        graph = graph.replace(partitions=partitions)
        return PassResult(graph.replace(gathers=derive_gathers(graph, "optimized")), True)

    def _growable(self, graph: Graph, layer: Layer, part: LayerPartition) -> bool:
        """Cut along a spatial axis by a rule, with one live output that is not a model output."""
        return (
            part.axis is not None
            and part.axis >= 2
            and self.registry.get(layer) is not None
            and len([t for t in layer.outputs if t]) == 1
            and layer.outputs[0] not in graph.outputs
        )

    def _slowness(self, node: int) -> float:
        """Time per operation on `node`, relative to the average node."""
        if not self.speeds:
            return 1.0
        return sum(self.speeds) / len(self.speeds) / self.speeds[node]

    def _receive_cost(self, graph: Graph, tensor: str, held: ShapeMap, region: ShapeMap) -> float:
        """What gathering `region` costs a node holding `held`: nothing if it holds it all."""
        if held.contains(region):
            return 0.0
        itemsize = graph.tensors[tensor].nbytes // max(1, math.prod(graph.tensors[tensor].shape))
        return self.sync_ops + self.byte_ops * region.volume * itemsize

    def _grow(self, graph: Graph, layer: Layer, part: LayerPartition, node: int, need: ShapeMap,
              partitions: dict[str, LayerPartition], consumers: dict[str, list[Layer]], depth: int) -> tuple[float, Local] | None:
        """(cost change, local op) of `node` computing `need` of the layer itself instead of receiving
        what it lacks; None where it cannot (cut differently, or along another axis)."""
        held = part.computes[node]
        grown = held.hull(need)
        if any(grown.interval(a) != held.interval(a) for a in range(held.rank) if a != part.axis):
            return None
        local = self.registry.get(layer).local(layer, graph, grown)  # type: ignore[union-attr]
        extra = layer_ops(layer, graph, local.computes) - layer_ops(layer, graph, held)
        cost = extra * self._slowness(node) - self._receive_cost(graph, layer.outputs[0], held, need)
        for t, after in zip(layer.inputs, local.needs):
            if t and after is not None and graph.is_activation(t):
                cost += self._provide(graph, t, node, after, partitions, consumers, depth - 1)
        return cost, local

    def _provide(self, graph: Graph, tensor: str, node: int, region: ShapeMap,
                 partitions: dict[str, LayerPartition], consumers: dict[str, list[Layer]], depth: int) -> float:
        """The least extra cost of `node` also reading `region` of `tensor`: receiving more of it, or
        (looking `depth` layers up) having its producer compute it there."""
        if tensor in graph.inputs:
            return 0.0
        producer = graph.producers()[tensor]
        part = partitions[producer.name]
        reads = _reads(partitions, consumers, tensor, node)
        if tensor in graph.outputs and node == OUTPUT_NODE:
            reads.append(ShapeMap.full(graph.tensors[tensor].shape))
        if tensor == producer.outputs[0]:
            held = part.computes[node]
        else:  # extra outputs exist only for layers computed whole
            held = ShapeMap.full(graph.tensors[tensor].shape) if not part.out[node].empty else ShapeMap.empty_like(region.rank)
        old = hull_of(reads) if reads else None
        new = old.hull(region) if old is not None else region
        old_cost = self._receive_cost(graph, tensor, held, old) if old is not None else 0.0
        receive = self._receive_cost(graph, tensor, held, new) - old_cost
        if receive == 0 or depth <= 0 or held.empty or not self._growable(graph, producer, part):
            return receive
        grown = self._grow(graph, producer, part, node, new, partitions, consumers, depth)
        return receive if grown is None else receive + min(0.0, grown[0])


def _reads(partitions: dict[str, LayerPartition], consumers: dict[str, list[Layer]], tensor: str, node: int) -> list[ShapeMap]:
    """The regions of `tensor` that its consumers on `node` read."""
    reads = [partitions[c.name].needs[node][i] for c in consumers.get(tensor, []) for i, t in enumerate(c.inputs) if t == tensor]
    return [r for r in reads if r is not None and not r.empty]


def _with_node(part: LayerPartition, node: int, needs: tuple[ShapeMap | None, ...], computes: ShapeMap,
               attrs: object) -> LayerPartition:
    """The partition with node `node`'s local op replaced (its owned region unchanged)."""

    def put(values: tuple, value: object) -> tuple:
        return values[:node] + (value,) + values[node + 1:]

    return LayerPartition(part.axis, part.out, put(part.needs, needs), put(part.computes, computes), put(part.attrs, dict(attrs)))  # type: ignore[arg-type]
