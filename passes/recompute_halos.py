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
grown their regions before it decides. The nodes that read a halo of a layer
recompute it together or not at all (one that recomputes while its neighbour still
receives keeps its segment boundary: it sends there), when, summed over them,

    extra operations + change in their inputs' receive costs  <  receive costs of the halos

with operations weighted by the node's slowness and by their kind's cost (a depthwise
convolution's operation costs more than a dense one's: `kind_weights`, from a measured profile;
an op fused into the convolution before it costs nothing, as the simulator prices it; without a
profile all kinds weigh alike), and where a receive costs what the cost model's `ReceiveCost`
says: a fixed cost per receive point (a segment boundary, waiting) plus a cost per byte of
the gathered region (the concat copies all of it) and of the other activations alive across
that point. A layer looks `depth` layers up for the cheapest place to receive. Owned regions
stay disjoint and tile every tensor; only what nodes compute grows, so every result is still
exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, ClassVar

import numpy as np

from bbgrap.cost import CPU_RECEIVE, ReceiveCost, layer_ops
from bbgrap.ir import Graph, Layer, LayerPartition, Movement, ShapeMap
from bbgrap.movement import OUTPUT_NODE, derive_gathers, hull_of, pieces
from bbgrap.pass_manager import Pass, PassError, PassResult
from bbgrap.rules.base import Local
from bbgrap.rules.registry import RuleRegistry, default_registry
from bbgrap.simulate import CONVOLUTIONS, fusion_anchor, op_kind


@dataclass(frozen=True)
class RecomputeHalos(Pass):
    name: ClassVar[str] = "recompute-halos"
    receive: ReceiveCost = CPU_RECEIVE
    depth: int = 12  # layers looked up from a halo for a cheaper place to receive it
    speeds: tuple[float, ...] = ()  # relative node speeds: a slow node's extra operations cost it more time
    kind_weights: tuple[tuple[str, float], ...] = ()  # (op kind, cost of its operation in dense convolution ones); absent: 1
    progress: Callable[[str, int, int], None] | None = field(default=None, compare=False)  # (pass, done, total)
    registry: RuleRegistry = field(default_factory=default_registry, compare=False)

    def requires(self, graph: Graph) -> None:
        if graph.movement is not Movement.OPTIMIZED:
            raise PassError("run eliminate-transfers first")

    def call(self, graph: Graph) -> PassResult:
        walk = _Walk(self, graph)
        changed = False
        for k, layer in enumerate(reversed(graph.layers)):
            if self.progress is not None:
                self.progress(self.name, k + 1, len(graph.layers))
            if not walk.growable(layer):
                continue
            part = walk.partitions[layer.name]
            # All nodes that read a halo of this layer recompute it, or none does: a node that
            # recomputes while its neighbour still receives keeps its segment boundary (it
            # sends there), so it would pay the extra operations for nothing.
            proposals: list[tuple[int, float, Local]] = []
            for n in part.active_nodes():
                reads = walk.reads(layer.outputs[0], n)
                if not reads or part.computes[n].contains(need := hull_of(reads)):
                    continue
                grown = walk.grow(layer, n, need, self.depth)
                if grown is None:  # one node cannot recompute: none does
                    proposals = []
                    break
                proposals.append((n, *grown))
            if proposals and sum(cost for _, cost, _ in proposals) < 0:
                for n, _, local in proposals:
                    part = _with_node(part, n, local)
                walk.update(layer, part)
                changed = True
        if not changed:
            return PassResult(graph, False)
        graph = graph.replace(partitions=walk.partitions)
        return PassResult(graph.replace(gathers=derive_gathers(graph, Movement.OPTIMIZED)), True)


class _Walk:
    """The pass's working state: partitions as decided so far, and the static facts it prices with."""

    def __init__(self, options: RecomputeHalos, graph: Graph) -> None:
        self.options = options
        self.graph = graph
        self.kind_weight = dict(options.kind_weights)
        self._fused: dict[str, bool] = {}
        self.layers = {layer.name: layer for layer in graph.layers}
        self.partitions = dict(graph.partitions)
        self.consumers = graph.consumers()
        position = {layer.name: i for i, layer in enumerate(graph.layers)}
        self.first_use = {t: min(position[c.name] for c in cs) for t, cs in self.consumers.items()}
        self.live = self._live_bytes(position)
        # provide() answers, valid until the next update(): dense graphs reach a tensor by many paths
        self.memo: dict[tuple[str, int, ShapeMap, int], float] = {}
        # per tensor, facts of the graph the walk started from (which update() does not change),
        # derived on first use: what each node holds, and receive_cost's bytes per element and
        # bytes of the other activations alive where the tensor is first read
        self._held: dict[str, dict[int, ShapeMap]] = {}
        self._receive_terms: dict[str, tuple[int, float]] = {}

    def fused(self, layer: Layer) -> bool:
        """onnxruntime folds the layer into a convolution that produces one of its inputs, directly
        or through other such layers (`fusion_anchor`: BatchNormalization, an activation, a residual
        Add): it costs no time of its own, as the simulator prices it."""
        if layer.name not in self._fused:
            anchor = fusion_anchor(layer, self.graph, self.options.registry)
            self._fused[layer.name] = anchor != layer.name and op_kind(self.layers[anchor], self.graph) in CONVOLUTIONS
        return self._fused[layer.name]

    def op_weight(self, layer: Layer) -> float:
        """What one of the layer's operations costs in dense convolution ones: its kind's weight
        (none given: 1), 0 where it is fused into a convolution."""
        if not self.kind_weight:
            return 1.0
        return 0.0 if self.fused(layer) else self.kind_weight.get(op_kind(layer, self.graph), 1.0)

    def update(self, layer: Layer, part: LayerPartition) -> None:
        self.partitions[layer.name] = part
        self.memo.clear()

    def _live_bytes(self, position: dict[str, int]) -> list[float]:
        """Bytes of activations a node holds across each layer position (produced before, read at or after it)."""
        live = [0.0] * (len(self.graph.layers) + 1)
        for i, layer in enumerate(self.graph.layers):
            for t in layer.outputs:
                if t and t in self.consumers:
                    last = max(position[c.name] for c in self.consumers[t])
                    for p in range(i + 1, last + 1):
                        live[p] += self.graph.tensors[t].nbytes / self.graph.nodes
        return live

    def growable(self, layer: Layer) -> bool:
        """Cut along a spatial axis by a rule, with one live output that is not a model output."""
        part = self.partitions[layer.name]
        return (
            part.axis is not None
            and part.axis >= 2
            and self.options.registry.get(layer) is not None
            and len([t for t in layer.outputs if t]) == 1
            and layer.outputs[0] not in self.graph.outputs
        )

    def reads(self, tensor: str, node: int) -> list[ShapeMap]:
        """The regions of `tensor` that its consumers (and the model's output) read on `node`."""
        regions = [self.partitions[c.name].needs[node][i] for c in self.consumers.get(tensor, [])
                   for i, t in enumerate(c.inputs) if t == tensor]
        if tensor in self.graph.outputs and node == OUTPUT_NODE:
            regions.append(ShapeMap.full(self.graph.tensors[tensor].shape))
        return [r for r in regions if r is not None and not r.empty]

    def receive_cost(self, tensor: str, held: ShapeMap, region: ShapeMap | None) -> float:
        """What gathering `region` of `tensor` costs a node holding `held`: nothing if it holds it all."""
        if region is None or held.contains(region):
            return 0.0
        terms = self._receive_terms.get(tensor)
        if terms is None:
            spec = self.graph.tensors[tensor]
            terms = self._receive_terms[tensor] = (np.dtype(spec.dtype).itemsize,
                                                   self.live[self.first_use[tensor]] - spec.nbytes / self.graph.nodes)
        itemsize, others = terms
        return self.options.receive.of(region.volume * itemsize, others)

    def slowness(self, node: int) -> float:
        """Time per operation on `node`, relative to the average node."""
        speeds = self.options.speeds
        return sum(speeds) / len(speeds) / speeds[node] if speeds else 1.0

    def grow(self, layer: Layer, node: int, need: ShapeMap, depth: int) -> tuple[float, Local] | None:
        """(cost change, local op) of `node` computing `need` of the layer itself instead of receiving
        what it lacks; None where it cannot (it would grow along another axis than the cut's)."""
        part = self.partitions[layer.name]
        held = part.computes[node]
        grown = held.hull(need)
        if any(grown.interval(a) != held.interval(a) for a in range(held.rank) if a != part.axis):
            return None
        local = self.options.registry.get(layer).local(layer, self.graph, grown)  # type: ignore[union-attr]
        registry = self.options.registry
        extra = layer_ops(layer, self.graph, local.emitted, registry) - layer_ops(layer, self.graph, part.emitted(node), registry)
        extra *= self.op_weight(layer)
        cost = extra * self.slowness(node) - self.receive_cost(layer.outputs[0], held, need)
        for t, after in zip(layer.inputs, local.needs):
            if t and after is not None and self.graph.is_activation(t):
                cost += self.provide(t, node, after, depth - 1)
        return cost, local

    def provide(self, tensor: str, node: int, region: ShapeMap, depth: int) -> float:
        """The least extra cost of `node` also reading `region` of `tensor`: receiving more of it, or
        (looking `depth` layers up) having its producer compute it there."""
        if tensor in self.graph.inputs:
            return 0.0
        key = (tensor, node, region, depth)
        if key not in self.memo:
            self.memo[key] = self._provide(tensor, node, region, depth)
        return self.memo[key]

    def _provide(self, tensor: str, node: int, region: ShapeMap, depth: int) -> float:
        producer = self.graph.producers()[tensor]
        # upstream of every layer decided so far: what the producer holds is still the graph's
        if tensor not in self._held:
            self._held[tensor] = dict(pieces(self.graph, tensor) or [])
        held = self._held[tensor].get(node)
        if held is None:
            held = ShapeMap.empty_like(region.rank)
        reads = self.reads(tensor, node)
        old = hull_of(reads) if reads else None
        new = old.hull(region) if old is not None else region
        receive = self.receive_cost(tensor, held, new) - self.receive_cost(tensor, held, old)
        if receive == 0 or depth <= 0 or held.empty or not self.growable(producer):
            return receive
        grown = self.grow(producer, node, new, depth)
        return receive if grown is None else receive + min(0.0, grown[0])


def _with_node(part: LayerPartition, node: int, local: Local) -> LayerPartition:
    """The partition with node `node`'s local op replaced (its owned region unchanged)."""

    def put(values: tuple, value: object) -> tuple:
        return values[:node] + (value,) + values[node + 1:]

    inputs = part.inputs or ({},) * len(part.out)
    emits = put(part.emits or (None,) * len(part.out), local.emits)
    return LayerPartition(part.axis, part.out, put(part.needs, local.needs), put(part.computes, local.computes),
                          put(part.attrs, dict(local.attrs)), put(inputs, dict(local.inputs)), LayerPartition.compact_emits(emits))
