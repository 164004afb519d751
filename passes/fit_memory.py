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
from bbgrap.passes.naive_partition import partition_layer, split_sizes

from bbgrap.cost import CPU_MEMORY, MemoryCost
from bbgrap.ir import BBGrapError, Graph, Layer, LayerPartition, Movement
from bbgrap.movement import derive_gathers
from bbgrap.pass_manager import Pass, PassError, PassResult
from bbgrap.rules.registry import RuleRegistry, default_registry

CHANNELS = 1
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
        tried: set[str] = set()
        changed = False
        while True:
            usage = node_memory(graph, partitions)
            over = [n for n, (w, a) in enumerate(usage) if self.memory.of(w, a) > self.memory_mb[n] * MB]
            if not over:
                break
            layer = self._heaviest_shardable(graph, partitions, over, tried)
            if layer is None:
                raise BBGrapError(self._does_not_fit(graph, usage, over))
            tried.add(layer.name)
            shape = graph.tensors[layer.outputs[0]].shape
            sizes = split_sizes(shape[CHANNELS], self.speeds or (1.0,) * graph.nodes)
            partitions[layer.name] = partition_layer(graph, layer, CHANNELS, sizes, self.registry)
            changed = True
        if not changed:
            return PassResult(graph, False)
        new = graph.replace(partitions=partitions)
        return PassResult(new.replace(gathers=derive_gathers(new, graph.movement)), True)

    def _heaviest_shardable(self, graph: Graph, partitions: dict[str, LayerPartition], over: Sequence[int],
                            tried: set[str]) -> Layer | None:
        """The layer whose weights weigh most on the nodes that are over, among those a channel cut can shard."""
        best: tuple[int, Layer] | None = None
        for layer in graph.layers:
            part = partitions[layer.name]
            rule = self.registry.get(layer)
            shape = graph.tensors[layer.outputs[0]].shape
            if (layer.name in tried or part.axis == CHANNELS or rule is None or len(shape) < 2
                    or CHANNELS not in rule.axes(layer, graph) or shape[CHANNELS] < graph.nodes):
                continue
            held = sum(layer_weight_bytes(graph, layer, part, n) for n in over)
            if held > 0 and (best is None or held > best[0]):
                best = (held, layer)
        return best[1] if best is not None else None

    def _does_not_fit(self, graph: Graph, usage: Sequence[tuple[int, int]], over: Sequence[int]) -> str:
        n = max(over, key=lambda k: self.memory.of(*usage[k]) - self.memory_mb[k] * MB)
        weights, activations = usage[n]
        need = self.memory.of(weights, activations) / MB
        return (f"the plan does not fit: node {n} needs about {need:.0f} MB (for {weights / MB:.0f} MB of weights, "
                f"{activations / MB:.0f} MB of activations and the runtime) with every layer it can shard cut along channels, "
                f"{need - self.memory_mb[n]:.0f} MB more than cluster.memory_mb gives it ({self.memory_mb[n]:g} MB); "
                f"use more nodes or raise cluster.memory_mb")
