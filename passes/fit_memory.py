"""fit-memory: every node's weights and activations under its memory (`cluster.memory_mb`).

A node holds the part of each weight its layers read: all of a convolution's or a Gemm's
weights where the layer is cut along height or width (or computed whole there), 1/N of them
where it is cut along output channels. The plan's memory on a node is estimated as

    weights(n) = Σ over layers, over constant inputs: bytes of the region node n reads
    doubled(n) = the same over the layers whose weights onnxruntime copies (cost.DOUBLED_OPS)
    activations(n) = max over layers of (bytes of the inputs node n reads + bytes it computes)
    memory(n) = weights(n) + [prepack] doubled(n) + activations(n) + overhead

with the overhead from the cost model (`MemoryCost`, measured with and without onnxruntime's
prepacked copies; the activation term is a lower bound of onnxruntime's arena: the values alive
across a layer). bbgrap-run's own process (interpreter, libraries) is not counted: it does not
depend on the plan, and bbgrap-run reports it apart.

While some node's estimate exceeds its memory, the layer with the most weight bytes that is not
cut along channels and whose rule can cut them is cut along channels instead, in proportion to
the node speeds, which shards its weights over the nodes (vgg16's classifier holds 470 of its
528 MB). Where that cannot fit with prepacked weights, it starts again from the plan it was given
without them (`Graph.prepack` False: bbgrap-run then turns onnxruntime's prepacking and NCHWc
reordering off, which costs some speed but drops the convolutions' second copy and lowers the
overhead). When no layer is left to shard even so, the
plan cannot fit, and the error says which node, by how much, and what to change. Owned regions
still tile every output, so results stay exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Sequence

from bbgrap.passes.naive_partition import CHANNELS, channel_cut

from bbgrap.cost import CPU_MEMORY, CPU_MEMORY_UNPACKED, DOUBLED_OPS, MemoryCost, NodeMemory
from bbgrap.ir import BBGrapError, Graph, Layer, LayerPartition, Movement
from bbgrap.movement import derive_gathers
from bbgrap.pass_manager import Pass, PassError, PassResult
from bbgrap.rules.registry import RuleRegistry, default_registry

MB = 1e6


def layer_weight_bytes(graph: Graph, layer: Layer, part: LayerPartition, node: int) -> int:
    """Bytes of the layer's constant inputs that `node` reads."""
    if node not in part.active_nodes():
        return 0
    return sum(need.volume * graph.itemsize(t) for t, need in zip(layer.inputs, part.needs[node])
               if need is not None and t in graph.constants)


def node_memory(graph: Graph, partitions: dict[str, LayerPartition]) -> list[NodeMemory]:
    """What each node holds, as the module docstring estimates it."""
    weights = [0] * graph.nodes
    doubled = [0] * graph.nodes
    activations = [0] * graph.nodes
    for layer in graph.layers:
        part = partitions[layer.name]
        for n in part.active_nodes():
            held = layer_weight_bytes(graph, layer, part, n)
            weights[n] += held
            doubled[n] += held if layer.op_type in DOUBLED_OPS else 0
            live = sum(need.volume * graph.itemsize(t) for t, need in zip(layer.inputs, part.needs[n])
                       if need is not None and graph.is_activation(t))
            live += part.emitted(n).volume * graph.itemsize(layer.outputs[0])
            activations[n] = max(activations[n], live)
    return [NodeMemory(w, d, a) for w, d, a in zip(weights, doubled, activations)]


@dataclass(frozen=True)
class FitMemory(Pass):
    name: ClassVar[str] = "fit-memory"
    memory_mb: tuple[float, ...]  # per node; empty: no limit
    speeds: tuple[float, ...] = ()
    costs: tuple[MemoryCost, ...] = (CPU_MEMORY, CPU_MEMORY_UNPACKED)  # tried in turn: the first that fits is kept
    registry: RuleRegistry = field(default_factory=default_registry, compare=False)

    def requires(self, graph: Graph) -> None:
        if graph.movement is Movement.NONE:
            raise PassError("run insert-crop-concat first")
        if self.memory_mb and len(self.memory_mb) != graph.nodes:
            raise PassError(f"{len(self.memory_mb)} memory sizes for {graph.nodes} nodes")
        if not self.costs:
            raise PassError("no memory cost model to fit with")

    def call(self, graph: Graph) -> PassResult:
        if not self.memory_mb:
            return PassResult(graph, False)
        shards: dict[str, LayerPartition] = {}  # each layer's channel cut, made once where needed
        problem = ""
        for cost in self.costs:
            fitted = self._fit(graph, cost, shards)
            if isinstance(fitted, str):
                problem = fitted
                continue
            if fitted == dict(graph.partitions) and cost.prepack == graph.prepack:
                return PassResult(graph, False)
            new = graph.replace(partitions=fitted, prepack=cost.prepack)
            return PassResult(new.replace(gathers=derive_gathers(new, graph.movement)), True)
        raise BBGrapError(problem)

    def _fit(self, graph: Graph, cost: MemoryCost, shards: dict[str, LayerPartition]) -> dict[str, LayerPartition] | str:
        """The partitions with the fewest heaviest layers sharded that fit under `cost`, or why none do."""
        partitions = dict(graph.partitions)
        left: set[str] | None = None  # the layers not yet sharded that could be
        while True:
            usage = node_memory(graph, partitions)
            over = [n for n, m in enumerate(usage) if cost.of(m) > self.memory_mb[n] * MB]
            if not over:
                return partitions
            if left is None:
                if not shards:
                    shards.update(self._channel_cuts(graph))
                left = {name for name in shards if partitions[name].axis != CHANNELS}
            name = self._heaviest(graph, partitions, left, over)
            if name is None:
                return self._does_not_fit(usage, over, cost)
            partitions[name] = shards[name]
            left.discard(name)

    def _channel_cuts(self, graph: Graph) -> dict[str, LayerPartition]:
        speeds = self.speeds or (1.0,) * graph.nodes
        cuts = {layer.name: channel_cut(graph, layer, speeds, self.registry) for layer in graph.layers
                if graph.partitions[layer.name].axis != CHANNELS}
        return {name: part for name, part in cuts.items() if part is not None}

    def _heaviest(self, graph: Graph, partitions: dict[str, LayerPartition], left: set[str],
                  over: Sequence[int]) -> str | None:
        """The layer, among those not yet sharded, whose weights weigh most on the nodes that are over."""
        best: tuple[int, str] | None = None
        for layer in graph.layers:
            if layer.name not in left:
                continue
            held = sum(layer_weight_bytes(graph, layer, partitions[layer.name], n) for n in over)
            if held > 0 and (best is None or held > best[0]):
                best = (held, layer.name)
        return best[1] if best is not None else None

    def _does_not_fit(self, usage: Sequence[NodeMemory], over: Sequence[int], cost: MemoryCost) -> str:
        n = max(over, key=lambda k: cost.of(usage[k]) - self.memory_mb[k] * MB)
        need = cost.of(usage[n]) / MB
        copies = "with onnxruntime's prepacked copies" if cost.prepack else "without prepacked copies"
        return (f"the plan does not fit: node {n} needs about {need:.0f} MB ({usage[n].weights / MB:.0f} MB of weights {copies}, "
                f"{usage[n].activations / MB:.0f} MB of activations) with every layer it can shard cut along channels, "
                f"{need - self.memory_mb[n]:.0f} MB more than its memory limit gives it ({self.memory_mb[n]:g} MB); "
                f"use more nodes or raise the limit (--memory-mb, or cluster.memory_mb in the config)")
