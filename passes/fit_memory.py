"""fit-memory: every node's weights and activations under its memory (`cluster.memory_mb`).

A node holds the part of each weight its layers read: all of a convolution's or a Gemm's
weights where the layer is cut along height or width (or computed whole there), 1/N of them
where it is cut along output channels. Its memory is estimated as

    weights(n) = Σ over layers, over constant inputs: bytes of the region node n reads
    activations(n) = max over layers of (bytes of the inputs node n reads + bytes it computes)
    memory(n) = runtime + copies · weights(n) + activations(n)

with the runtime's fixed size and its copies of the weights from the cost model (`MemoryCost`;
the activation term is a lower bound of onnxruntime's arena: the values alive across a layer).
While some node's estimate exceeds its memory, the layer with the most weight bytes that is not
cut along channels and whose rule can cut them is cut along channels instead, in proportion to
the node speeds, which shards its weights over the nodes (vgg16's classifier holds 470 of its
528 MB). When no such layer is left the plan cannot fit, and the error says which node, by how
much, and what to change. Owned regions still tile every output, so results stay exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Sequence

import numpy as np
from bbgrap.passes.naive_partition import CHANNELS, channel_cut

from bbgrap.cost import CPU_MEMORY, MemoryCost
from bbgrap.ir import BBGrapError, Graph, Layer, LayerPartition, Movement
from bbgrap.movement import derive_gathers
from bbgrap.pass_manager import Pass, PassError, PassResult
from bbgrap.rules.registry import RuleRegistry, default_registry

MB = 1e6


def _itemsize(graph: Graph, tensor: str) -> int:
    return int(np.dtype(graph.tensors[tensor].dtype).itemsize)


def layer_weight_bytes(graph: Graph, layer: Layer, part: LayerPartition, node: int) -> int:
    """Bytes of the layer's constant inputs that `node` reads."""
    if node not in part.active_nodes():
        return 0
    return sum(need.volume * _itemsize(graph, t) for t, need in zip(layer.inputs, part.needs[node])
               if need is not None and t in graph.constants)


def node_memory(graph: Graph, partitions: dict[str, LayerPartition]) -> list[tuple[int, int]]:
    """(weight bytes, activation bytes) per node, as the module docstring estimates them."""
    weights = [0] * graph.nodes
    activations = [0] * graph.nodes
    for layer in graph.layers:
        part = partitions[layer.name]
        for n in part.active_nodes():
            weights[n] += layer_weight_bytes(graph, layer, part, n)
            live = sum(need.volume * _itemsize(graph, t) for t, need in zip(layer.inputs, part.needs[n])
                       if need is not None and graph.is_activation(t))
            live += part.computes[n].volume * _itemsize(graph, layer.outputs[0])
            activations[n] = max(activations[n], live)
    return list(zip(weights, activations))


@dataclass(frozen=True)
class FitMemory(Pass):
    name: ClassVar[str] = "fit-memory"
    memory_mb: tuple[float, ...]  # per node; empty: no limit
    speeds: tuple[float, ...] = ()
    memory: MemoryCost = CPU_MEMORY
    registry: RuleRegistry = field(default_factory=default_registry, compare=False)

    def requires(self, graph: Graph) -> None:
        if graph.movement is Movement.NONE:
            raise PassError("run insert-crop-concat first")
        if self.memory_mb and len(self.memory_mb) != graph.nodes:
            raise PassError(f"{len(self.memory_mb)} memory sizes for {graph.nodes} nodes")

    def call(self, graph: Graph) -> PassResult:
        if not self.memory_mb:
            return PassResult(graph, False)
        partitions = dict(graph.partitions)
        shards: dict[str, LayerPartition] | None = None  # each layer's channel cut, made once where needed
        while True:
            usage = node_memory(graph, partitions)
            over = [n for n, (w, a) in enumerate(usage) if self.memory.of(w, a) > self.memory_mb[n] * MB]
            if not over:
                break
            if shards is None:
                speeds = self.speeds or (1.0,) * graph.nodes
                cuts = {layer.name: channel_cut(graph, layer, speeds, self.registry) for layer in graph.layers
                        if partitions[layer.name].axis != CHANNELS}
                shards = {name: part for name, part in cuts.items() if part is not None}
            name = self._heaviest(graph, partitions, shards, over)
            if name is None:
                raise BBGrapError(self._does_not_fit(graph, usage, over))
            partitions[name] = shards.pop(name)
        if shards is None:
            return PassResult(graph, False)
        new = graph.replace(partitions=partitions)
        return PassResult(new.replace(gathers=derive_gathers(new, graph.movement)), True)

    def _heaviest(self, graph: Graph, partitions: dict[str, LayerPartition], shards: dict[str, LayerPartition],
                  over: Sequence[int]) -> str | None:
        """The layer, among those not yet sharded, whose weights weigh most on the nodes that are over."""
        best: tuple[int, str] | None = None
        for layer in graph.layers:
            if layer.name not in shards:
                continue
            held = sum(layer_weight_bytes(graph, layer, partitions[layer.name], n) for n in over)
            if held > 0 and (best is None or held > best[0]):
                best = (held, layer.name)
        return best[1] if best is not None else None

    def _does_not_fit(self, graph: Graph, usage: Sequence[tuple[int, int]], over: Sequence[int]) -> str:
        n = max(over, key=lambda k: self.memory.of(*usage[k]) - self.memory_mb[k] * MB)
        weights, activations = usage[n]
        need = self.memory.of(weights, activations) / MB
        return (f"the plan does not fit: node {n} needs about {need:.0f} MB (for {weights / MB:.0f} MB of weights, "
                f"{activations / MB:.0f} MB of activations and the runtime) with every layer it can shard cut along channels, "
                f"{need - self.memory_mb[n]:.0f} MB more than cluster.memory_mb gives it ({self.memory_mb[n]:g} MB); "
                f"use more nodes or raise cluster.memory_mb")
