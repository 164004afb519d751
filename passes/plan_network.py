"""plan-network: choose every layer's cut jointly over the whole network (bbgrap/search/network.py).

It starts from the plan the per-layer search (or naive-partition) made, offers each layer
its candidates (that cut, the speed-proportional cut along every axis its rule allows, the
layer whole on the fastest node, and for heft, ga and map-elites the layer whole on each other node), and takes
the choice of the named planner: `dp` minimises

    S(x) = Σ_L max_n (compute(L, x_L, n) + receive(L, x_L, x_producers, n)) + output gather

exactly by dynamic programming over the layers (a beam where the frontier of live layers
is too wide), `heft` list-schedules the layers on the per-node timeline, `ga` evolves whole
choices on that timeline seeded with the start, dp's and heft's, and `map-elites` keeps the
fastest choice of each kind (share of work on one node, number of boundaries) while it does. Costs come from the cluster
profile. The plan it started from is one of the choices every planner weighs (dp: its S is
never above the start's), and the compiler keeps whichever of this plan and the per-layer
search's the simulator of the lowered plan predicts faster (by a margin: bbgrap/compiler.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from bbgrap.cluster import ClusterProfile
from bbgrap.ir import Graph, Movement, PlannerStats
from bbgrap.movement import derive_gathers
from bbgrap.pass_manager import Pass, PassError, PassResult
from bbgrap.rules.registry import RuleRegistry, default_registry
from bbgrap.search.network import NetworkCost, layer_candidates, plan_network


@dataclass(frozen=True)
class PlanNetwork(Pass):
    name: ClassVar[str] = "plan-network"
    planner: str
    profile: ClusterProfile
    speeds: tuple[float, ...]
    fixed: frozenset[str] = frozenset()  # layers with a custom partition
    seed: int = 0
    registry: RuleRegistry = field(default_factory=default_registry, compare=False)

    def requires(self, graph: Graph) -> None:
        if graph.movement is not Movement.OPTIMIZED:
            raise PassError("run eliminate-transfers first")
        if len(self.speeds) != graph.nodes:
            raise PassError(f"{len(self.speeds)} node speeds for a plan of {graph.nodes} nodes")

    def call(self, graph: Graph) -> PassResult:
        offered = [layer_candidates(graph, layer, graph.partitions[layer.name], self.speeds, self.registry, layer.name in self.fixed,
                                    placements=self.planner != "dp")  # the DP never places a layer away from the fastest node
                   for layer in graph.layers]
        candidates = [c for c, _ in offered]
        cost = NetworkCost(graph, candidates, [k for _, k in offered], self.profile, self.registry)
        start = tuple(0 for _ in candidates)
        result = plan_network(cost, self.planner, self.seed)
        partitions = {layer.name: candidates[i][c] for i, (layer, c) in enumerate(zip(graph.layers, result.choice))}
        stats = PlannerStats(
            planner=result.planner,
            layers=sum(1 for c in candidates if len(c) > 1),
            candidates=sum(len(c) for c in candidates),
            evaluated=result.evaluated,
            exact=result.exact,
            synchronous_ms=round(result.synchronous * 1e3, 4),
            timeline_ms=round(result.timeline * 1e3, 4),
            start_synchronous_ms=round(cost.synchronous(start) * 1e3, 4),
            start_timeline_ms=round(cost.timeline(start) * 1e3, 4),
            seconds=round(result.seconds, 3),
        )
        new = graph.replace(partitions=partitions, planner_stats=stats)
        changed = result.choice != start
        return PassResult(new.replace(gathers=derive_gathers(new, Movement.OPTIMIZED)) if changed else new, changed)
