"""search: choose every layer's cut by minimising the objective (thesis §3.5).

Layers are searched one at a time in topological order, each with the cuts already
chosen for its producers. A layer that passes regions straight through (activations,
BatchNormalization, elementwise arithmetic: output = input region) is not searched:
it takes its producer's cut, which moves nothing, where any other cut would only
create halos that the next layer pays for. Layers that cannot be cut in the requested
direction and fall back to a channel cut (global pools, the classifier's Gemm) keep
their speed-proportional split: every channel cut of them moves the same data, so
the objective is flat there and the split already balances the work. For the
searched layers, a node's cost for an interval is its operations over its
speed, the values it must receive to read its input regions (what its producers'
cuts left on other nodes), and the operations it computes only to crop them away
(eq. 3.7–3.11, weights from the config). The strategy (`exact`, `pruned-tree`,
`exhaustive`) finds the best partition inside the threshold band. Beside it, each
searched layer also prices the speed-proportional channel cut and takes that where it
scores better: where the map is too short to split evenly (7 rows on 2 nodes) and the
input it must gather is worth less than the imbalance. The search is
greedy across layers, so its total could in principle exceed the naive plan's: the
pass compares both totals with the same objective and keeps the better plan.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable, ClassVar

from bbgrap.passes.naive_partition import CHANNELS, channel_cut, partition_layer

from bbgrap.config import Config
from bbgrap.cost import in_blocks, layer_ops
from bbgrap.ir import Graph, Interval, Layer, LayerPartition, Movement, SearchStats, ShapeMap
from bbgrap.movement import derive_gathers
from bbgrap.pass_manager import Pass, PassError, PassResult
from bbgrap.rules.registry import RuleRegistry, default_registry
from bbgrap.search.objective import LayerCost, NodeCost, Weights, objective
from bbgrap.search.procedural import size_band
from bbgrap.search.strategies import SearchResult, search


def max_band(nodes: int) -> int:
    """The widest band of candidate sizes per node searched position by position. The search's
    work grows with a power of the band's width that rises with the node count (a 4096-row layer
    on 4 nodes took six minutes, 1024 rows on 16 nodes two); these widths keep a layer near or
    under a tenth of a second (docs/benchmarks.md). A wider band is searched on the layer's
    candidate cuts (`LayerCutCost.candidate_cuts`), else on a grid. (Narrower bands are not:
    the candidates miss the cut that balances the work between two cuts placed by the data,
    which the position-by-position search finds: 16 on 4 nodes made densenet's plan cut
    along channels 0.1 % worse by the objective.)"""
    if nodes <= 2:
        return 4096
    if nodes <= 4:
        return 32
    if nodes <= 8:
        return 10
    return 5 if nodes <= 16 else 3


@dataclass
class GridCost:
    """A layer's cut cost with cuts only every `step` positions (the last at the extent): the
    search then works on ceil(extent / step) positions, whatever the tensor's extent. Every
    partition it scores is a real partition of the layer, scored exactly."""

    cost: LayerCost
    step: int
    extent: int = field(init=False)

    def __post_init__(self) -> None:
        self.extent = -(-self.cost.extent // self.step)

    def node_cost(self, node: int, start: int, stop: int) -> NodeCost:
        end = self.cost.extent
        return self.cost.node_cost(node, min(start * self.step, end), min(stop * self.step, end))

    def cuts(self, grid_cuts: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(min(c * self.step, self.cost.extent) for c in grid_cuts)


def _first(lo: int, hi: int, holds: Callable[[int], bool]) -> int | None:
    """The first position in [lo, hi] where `holds` (false, then true along it) holds; None: nowhere."""
    if not holds(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if holds(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


@dataclass
class LayerCutCost:
    """Cost of each node computing an interval of one layer, given its producers' cuts (taken
    when it is made). Each (node, start, stop) is priced once: the strategy's table, the cuts
    compared with its result and the plan's objective ask for the same intervals."""

    graph: Graph
    layer: Layer
    axis: int
    speeds: tuple[float, ...]
    weights: Weights
    partitions: dict[str, LayerPartition]
    registry: RuleRegistry
    extent: int = 0
    held: dict[str, list[ShapeMap]] = field(default_factory=dict)
    _priced: dict[tuple[int, int, int], NodeCost] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.full = ShapeMap.full(self.graph.tensors[self.layer.outputs[0]].shape)
        self.extent = self.full.shape[self.axis]
        rule = self.registry.get(self.layer)
        assert rule is not None, f"layer {self.layer.name} is searched but has no region rule"
        self.rule = rule
        producers = self.graph.producers()
        for t in self.layer.inputs:
            if not self.graph.is_activation(t) or t in self.held:
                continue
            if t in self.graph.inputs:
                self.held[t] = [ShapeMap.full(self.graph.tensors[t].shape)] * self.graph.nodes
            else:
                self.held[t] = list(self.partitions[producers[t].name].out)

    def node_cost(self, node: int, start: int, stop: int) -> NodeCost:
        key = (node, start, stop)
        cost = self._priced.get(key)
        if cost is None:
            cost = self._priced[key] = self._node_cost(node, start, stop)
        return cost

    def _node_cost(self, node: int, start: int, stop: int) -> NodeCost:
        if start == stop:
            return NodeCost(0.0, 0.0, 0.0)
        out = self.full.with_axis(self.axis, Interval(start, stop))
        local = self.rule.local(self.layer, self.graph, out)
        data = 0.0
        for t, need in zip(self.layer.inputs, local.needs):
            if need is not None and t in self.held:
                have = self.held[t][node]
                data += need.volume - (need.intersect(have).volume if not have.empty else 0)
        ops = layer_ops(self.layer, self.graph, local.emitted, self.registry)
        over = ops - layer_ops(self.layer, self.graph, out, self.registry)
        # not what each piece reads (`run_ops`' reads): the filters every piece of rows reads again
        # favour a channel cut, whose gathers and boundaries downstream this layer's objective does
        # not see (the planners and the simulator price both)
        return NodeCost(in_blocks(self.layer, self.graph, local.emitted, ops, self.registry) / self.speeds[node], data, over)

    def candidate_cuts(self, threshold: float) -> set[int]:
        """The cut positions that matter, for a layer whose band is too wide to search position by
        position: per boundary between nodes j-1 and j, inside the positions the band allows it,
        the speed-proportional cut rounded down and up (and to whole blocks, for the channels of an
        op that runs them in blocks: `OpTraits.channel_block`), and where the layer's reads cross an edge
        of what its producers' cuts left on those two nodes or begin or end reading an input
        (a Concat's inputs): the first position from which node j's reads start at or after
        the edge, the last up to which node j-1's reads end at or before it. A node's received
        data changes slope only there and its work grows evenly with its rows, so the search
        need not look between them; aligned cuts, the naive cut and the channel cut are still
        compared after the search."""
        extent, speeds = self.extent, self.speeds
        band = size_band(extent, speeds, threshold)
        block = self.registry.traits(self.layer.op_type, self.layer.domain).channel_block if self.axis == CHANNELS else 0
        total = sum(Fraction(s) for s in speeds)
        reads: dict[tuple[int, int], list[ShapeMap | None]] = {}  # output rows [a, b) -> what they read, per input

        def read(a: int, b: int, k: int, axis: int) -> Interval | None:
            """The interval along `axis` of input k that output rows [a, b) read (None: nothing)."""
            if (a, b) not in reads:
                out = self.full.with_axis(self.axis, Interval(a, b))
                reads[(a, b)] = list(self.rule.local(self.layer, self.graph, out).needs)
            need = reads[(a, b)][k]
            return None if need is None or need.empty or not need.is_box else need.interval(axis)

        out: set[int] = set()
        for j in range(1, len(speeds)):
            lo = max(sum(b[0] for b in band[:j]), extent - sum(b[1] for b in band[j:]))
            hi = min(sum(b[1] for b in band[:j]), extent - sum(b[0] for b in band[j:]))
            if lo > hi:
                continue
            ideal = extent * sum(Fraction(s) for s in speeds[:j]) / total
            out.update(min(hi, max(lo, p)) for p in (math.floor(ideal), math.ceil(ideal)))
            if block > 1:  # and the whole blocks of channels around it
                out.update(min(hi, max(lo, p)) for p in (math.floor(ideal / block) * block, math.ceil(ideal / block) * block))
            if hi == lo:
                continue
            for k, t in enumerate(self.layer.inputs):
                if t not in self.held:
                    continue
                shape = self.graph.tensors[t].shape
                held = [r for r in (self.held[t][j - 1], self.held[t][j]) if not r.empty and r.is_box]
                for axis_k in range(len(shape)):
                    edges = {e for r in held for e in (r.interval(axis_k).start, r.interval(axis_k).stop)} - {0, shape[axis_k]}
                    # where node j's reads from position p on begin at or after an edge (or stop)
                    firsts = [_first(lo, min(hi, extent - 1), lambda p: read(p, extent, k, axis_k) is None)]
                    firsts += [_first(lo, min(hi, extent - 1), lambda p: (iv := read(p, extent, k, axis_k)) is None or iv.start >= e)
                               for e in edges]
                    out.update(p for p in firsts if p is not None and p > lo)
                    # where node j-1's reads up to position p end beyond an edge (or begin)
                    lasts = [_first(max(lo, 1), hi, lambda p: read(0, p, k, axis_k) is not None)]
                    lasts += [_first(max(lo, 1), hi, lambda p: (iv := read(0, p, k, axis_k)) is not None and iv.stop > e)
                              for e in edges]
                    out.update(p - 1 for p in lasts if p is not None and p - 1 >= lo)
        return out

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
    progress: Callable[[str, int, int], None] | None = field(default=None, compare=False)  # (pass, done, total)
    registry: RuleRegistry = field(default_factory=default_registry, compare=False)

    def requires(self, graph: Graph) -> None:
        if graph.movement is not Movement.OPTIMIZED:
            raise PassError("run eliminate-transfers first")

    def _cost(self, graph: Graph, layer: Layer, axis: int, partitions: dict[str, LayerPartition]) -> LayerCutCost:
        return LayerCutCost(graph, layer, axis, self.config.node_speeds(), self.config.objective, partitions, self.registry)

    def _plan_objective(self, graph: Graph, partitions: dict[str, LayerPartition],
                        priced: dict[tuple[str, int], LayerCutCost] | None = None) -> float:
        """The plan's objective; `priced`: the cost tables of layers cut along an axis made with
        these partitions of their producers (the search's), reused instead of pricing again."""
        total = 0.0
        for layer in graph.layers:
            part = partitions[layer.name]
            if part.axis is not None:
                cost = (priced or {}).get((layer.name, part.axis)) or self._cost(graph, layer, part.axis, partitions)
                total += cost.cost_of(part)
        return total

    def _follow(self, graph: Graph, layer: Layer, partitions: dict[str, LayerPartition]) -> LayerPartition | None:
        """The producer's cut for a pass-through layer of the same output shape, else None."""
        rule = self.registry.get(layer)
        if rule is None or not rule.passes_through:
            return None
        producers = graph.producers()
        shape = graph.tensors[layer.outputs[0]].shape
        for t in layer.inputs:
            if t in producers and graph.tensors[t].shape == shape:
                source = partitions[producers[t].name]
                if source.axis is not None and source.axis in (partitions[layer.name].axis, CHANNELS) \
                        and source.axis in rule.axes(layer, graph):
                    return self._cut_like(graph, layer, source, source.axis)
        return None

    def _cut_like(self, graph: Graph, layer: Layer, source: LayerPartition, axis: int) -> LayerPartition:
        """The layer cut along `axis` into the same sizes as `source`."""
        sizes = [r.shape[axis] if not r.empty else 0 for r in source.out]
        return partition_layer(graph, layer, axis, sizes, self.registry)

    def _aligned(self, graph: Graph, layer: Layer, axis: int, partitions: dict[str, LayerPartition]) -> list[LayerPartition]:
        """The layer cut like each producer whose output has the same extent along `axis`."""
        producers = graph.producers()
        extent = graph.tensors[layer.outputs[0]].shape[axis]
        out = []
        for t in dict.fromkeys(layer.inputs):
            source = partitions.get(producers[t].name) if t in producers else None
            if source is not None and source.axis == axis and graph.tensors[t].shape[axis] == extent:
                out.append(self._cut_like(graph, layer, source, axis))
        return out

    def _channel_cut(self, graph: Graph, layer: Layer, partitions: dict[str, LayerPartition],
                     priced: dict[tuple[str, int], LayerCutCost]) -> tuple[LayerPartition, float] | None:
        """The speed-proportional channel cut of the layer and its objective, where channels can be cut
        (its cost table kept in `priced`).

        It wins where the cut direction is too short to split evenly (a 7x7 map on 2 nodes
        leaves one node 4 rows and the other 3) and what it must receive is worth less."""
        if len(graph.tensors[layer.outputs[0]].shape) < 3:  # no spatial axis to compare with
            return None
        part = channel_cut(graph, layer, self.config.node_speeds(), self.registry)
        if part is None:
            return None
        cost = priced[(layer.name, CHANNELS)] = self._cost(graph, layer, CHANNELS, partitions)
        return part, cost.cost_of(part)

    def _search_layer(self, graph: Graph, layer: Layer, partitions: dict[str, LayerPartition],
                      priced: dict[tuple[str, int], LayerCutCost]) -> tuple[LayerPartition, SearchResult]:
        """The layer's best cut given its producers' cuts, and the strategy's result; the cost
        tables it made are kept in `priced`, by (layer, axis)."""
        cfg = self.config
        axis = partitions[layer.name].axis
        assert axis is not None
        cost = priced[(layer.name, axis)] = self._cost(graph, layer, axis, partitions)
        step = self._grid_step(graph, layer, axis)
        grain = self.registry.grain(layer, graph, axis)
        if grain > 1:  # cuts on the rule's grain only: a grid of it
            step = grain * -(-step // grain)
        result = None
        if step > 1 and grain == 1:  # a wide band: the candidate cuts that matter (else, where none is valid, a grid)
            try:
                result = search(cost, cfg.node_speeds(), cfg.threshold, cfg.objective, strategy=cfg.search,
                                positions=cost.candidate_cuts(cfg.threshold))
                cuts = result.cuts
            except ValueError:
                result = None
        if result is None:
            grid = GridCost(cost, step)
            result = search(grid if step > 1 else cost, cfg.node_speeds(), cfg.threshold, cfg.objective, strategy=cfg.search)
            cuts = grid.cuts(result.cuts)
        sizes = [b - a for a, b in zip(cuts, cuts[1:])]
        chosen = partition_layer(graph, layer, axis, sizes, self.registry)
        # Among optimal cuts, prefer one aligned with the producer, then the naive one:
        # equal for this layer, and consumers downstream then need no transfer.
        for alt in self._aligned(graph, layer, axis, partitions) + [graph.partitions[layer.name]]:
            if alt.axis == axis and alt.out != chosen.out and cost.cost_of(alt) <= result.objective:
                chosen = alt
                break
        channels = self._channel_cut(graph, layer, partitions, priced)
        if channels is not None and channels[1] < cost.cost_of(chosen):
            chosen = channels[0]
        return chosen, result

    def _searchable(self, graph: Graph, layer: Layer) -> bool:
        axis = graph.partitions[layer.name].axis
        rank = len(graph.tensors[layer.outputs[0]].shape)
        return axis is not None and axis == self.config.direction.axis(rank)

    def _grid_step(self, graph: Graph, layer: Layer, axis: int) -> int:
        """Every how many positions the layer's cuts are searched: 1 where its band of candidate
        sizes is at most `max_band` wide, else the step that narrows it to that."""
        speeds = self.config.node_speeds()
        band = size_band(graph.tensors[layer.outputs[0]].shape[axis], speeds, self.config.threshold)
        width = max(hi - lo + 1 for lo, hi in band)
        return max(1, -(-width // max_band(len(speeds))))

    def call(self, graph: Graph) -> PassResult:
        cfg = self.config
        custom = {c.layer for c in cfg.custom}
        searched = [la for la in graph.layers if self._searchable(graph, la) and la.name not in custom]
        partitions = dict(graph.partitions)
        # the cost tables the search made: each layer's producers are cut before it and keep their
        # cuts, so its tables also price the searched plan's objective
        priced: dict[tuple[str, int], LayerCutCost] = {}
        evaluated = cost_calls = searched_layers = 0
        log10_total = 0.0
        t0 = time.perf_counter()
        for k, layer in enumerate(searched):
            followed = self._follow(graph, layer, partitions)
            if followed is not None:
                partitions[layer.name] = followed
            else:
                partitions[layer.name], result = self._search_layer(graph, layer, partitions, priced)
                evaluated += result.evaluated
                cost_calls += result.cost_calls
                log10_total += result.log10_total
                searched_layers += 1
            if self.progress is not None:
                self.progress(self.name, k + 1, len(searched))
        searched_total = self._plan_objective(graph, partitions, priced)
        naive_total = self._plan_objective(graph, dict(graph.partitions))
        kept = "searched" if searched_total <= naive_total else "naive"
        if kept == "naive":
            partitions = dict(graph.partitions)
        stats = SearchStats(
            strategy=cfg.search,
            threshold=cfg.threshold,
            layers=searched_layers,
            evaluated=evaluated,
            cost_calls=cost_calls,
            log10_total=log10_total,
            total=10.0 ** log10_total if log10_total < 300 else math.inf,
            seconds=time.perf_counter() - t0,
            objective=min(searched_total, naive_total),
            naive_objective=naive_total,
            kept=kept,
        )
        new = graph.replace(partitions=partitions)
        return PassResult(new.replace(gathers=derive_gathers(new, Movement.OPTIMIZED), search_stats=stats), kept == "searched")
