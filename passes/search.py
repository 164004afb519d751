"""search: choose every layer's cut by minimising the objective (thesis §3.5).

Layers are searched one at a time in topological order, each with the cuts already
chosen for its producers: a node's cost for an interval is its operations over its
speed, the values it must receive to read its input regions (what its producers'
cuts left on other nodes), and the operations it computes only to crop them away
(eq. 3.7–3.11, weights from the config). The strategy (`exact`, `pruned-tree`,
`exhaustive`) finds the best partition inside the threshold band. The search is
greedy across layers, so its total could in principle exceed the naive plan's: the
pass compares both totals with the same objective and keeps the better plan.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, ClassVar

from bbgrap.config import Config
from bbgrap.cost import layer_ops
from bbgrap.ir import Graph, Interval, Layer, LayerPartition, ShapeMap
from bbgrap.movement import derive_gathers
from bbgrap.pass_manager import Pass, PassError, PassResult
from bbgrap.passes.naive_partition import partition_layer
from bbgrap.rules.registry import RuleRegistry, default_registry
from bbgrap.search.objective import NodeCost, Weights, objective
from bbgrap.search.strategies import search


@dataclass
class LayerCutCost:
    """Cost of each node computing an interval of one layer, given its producers' cuts."""

    graph: Graph
    layer: Layer
    axis: int
    speeds: tuple[float, ...]
    weights: Weights
    partitions: dict[str, LayerPartition]
    registry: RuleRegistry
    extent: int = 0
    held: dict[str, list[ShapeMap]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.full = ShapeMap.full(self.graph.tensors[self.layer.outputs[0]].shape)
        self.extent = self.full.shape[self.axis]
        self.rule = self.registry.get(self.layer)
        producers = self.graph.producers()
        for t in self.layer.inputs:
            if not self.graph.is_activation(t) or t in self.held:
                continue
            if t in self.graph.inputs:
                self.held[t] = [ShapeMap.full(self.graph.tensors[t].shape)] * self.graph.nodes
            else:
                self.held[t] = list(self.partitions[producers[t].name].out)

    def node_cost(self, node: int, start: int, stop: int) -> NodeCost:
        if start == stop:
            return NodeCost(0.0, 0.0, 0.0)
        out = self.full.with_axis(self.axis, Interval(start, stop))
        local = self.rule.local(self.layer, self.graph, out)
        data = 0.0
        for t, need in zip(self.layer.inputs, local.needs):
            if need is not None and t in self.held:
                have = self.held[t][node]
                data += need.volume - (need.intersect(have).volume if not have.empty else 0)
        ops = layer_ops(self.layer, self.graph, local.computes)
        over = ops - layer_ops(self.layer, self.graph, out)
        return NodeCost(ops / self.speeds[node], data, over)

    def cost_of(self, part: LayerPartition) -> float:
        costs = []
        for n, region in enumerate(part.out):
            iv = region.interval(self.axis) if not region.empty else Interval(0, 0)
            costs.append(self.node_cost(n, iv.start, iv.stop))
        return objective(costs, self.weights)


@dataclass(frozen=True)
class SearchPartitions(Pass):
    name: ClassVar[str] = "search"
    config: Config
    progress: Callable[[int, int], None] | None = field(default=None, compare=False)
    registry: RuleRegistry = field(default_factory=default_registry, compare=False)

    def requires(self, graph: Graph) -> None:
        if graph.movement != "optimized":
            raise PassError("run eliminate-transfers first")

    def _cost(self, graph: Graph, layer: Layer, axis: int, partitions: dict[str, LayerPartition]) -> LayerCutCost:
        return LayerCutCost(graph, layer, axis, self.config.node_speeds(), self.config.objective, partitions, self.registry)

    def _plan_objective(self, graph: Graph, partitions: dict[str, LayerPartition]) -> float:
        total = 0.0
        for layer in graph.layers:
            part = partitions[layer.name]
            if part.axis is not None:
                total += self._cost(graph, layer, part.axis, partitions).cost_of(part)
        return total

    def call(self, graph: Graph) -> PassResult:
        cfg = self.config
        custom = {c.layer for c in cfg.custom}
        searched = [la for la in graph.layers if graph.partitions[la.name].axis is not None and la.name not in custom]
        partitions = dict(graph.partitions)
        evaluated = cost_calls = 0
        log10_total = 0.0
        t0 = time.perf_counter()
        for k, layer in enumerate(searched):
            axis = partitions[layer.name].axis
            assert axis is not None
            cost = self._cost(graph, layer, axis, partitions)
            result = search(cost, cfg.node_speeds(), cfg.threshold, cfg.objective, strategy=cfg.search)
            sizes = [b - a for a, b in zip(result.cuts, result.cuts[1:])]
            partitions[layer.name] = partition_layer(graph, layer, axis, sizes, self.registry)
            evaluated += result.evaluated
            cost_calls += result.cost_calls
            log10_total += result.log10_total
            if self.progress is not None:
                self.progress(k + 1, len(searched))
        searched_total = self._plan_objective(graph, partitions)
        naive_total = self._plan_objective(graph, dict(graph.partitions))
        kept = "searched" if searched_total <= naive_total else "naive"
        if kept == "naive":
            partitions = dict(graph.partitions)
        stats = {
            "strategy": cfg.search,
            "threshold": cfg.threshold,
            "layers": len(searched),
            "evaluated": evaluated,
            "cost_calls": cost_calls,
            "log10_total": log10_total,
            "total": 10.0 ** log10_total if log10_total < 300 else math.inf,
            "seconds": time.perf_counter() - t0,
            "objective": min(searched_total, naive_total),
            "naive_objective": naive_total,
            "kept": kept,
        }
        new = graph.replace(partitions=partitions)
        return PassResult(new.replace(gathers=derive_gathers(new, "optimized"), search_stats=stats), kept == "searched")
