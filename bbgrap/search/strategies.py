"""Searches for the best partition of one layer (thesis §3.5, algorithms 1–5).

Three strategies share one interface (`Strategy`), one memoised cost table
(`CostCache`) and one tie rule: among partitions with equal objective the
lexicographically smallest tuple of intervals wins (for non-overlapped partitions
that is the lexicographically smallest cuts), so all strategies agree on the answer
whenever they find the optimum.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Iterable, Optional, Sequence

from bbgrap.search.objective import LayerCost, NodeCost, PartialCost, Weights, lower_bound, objective
from bbgrap.search.procedural import Interval, Partition, Partitions

Progress = Callable[[int, int], None]
INF = math.inf
EXHAUSTIVE_LIMIT = 2_000_000


@dataclass(frozen=True)
class SearchResult:
    """Best partition found and what it cost to find it.

    `cuts` are the N+1 boundaries c0=0 <= c1 <= ... <= cN=extent; node j computes
    [c_j, c_{j+1}).  In overlapped mode node j computes `intervals[j]` and `cuts`
    holds the starts plus the extent.  `evaluated` counts complete partitions whose
    objective was computed (the thesis' metric), `cost_calls` distinct node_cost calls.
    """

    cuts: tuple[int, ...]
    objective: float
    evaluated: int
    cost_calls: int
    log10_total: float
    seconds: float
    strategy: str
    intervals: Partition = ()


class CostCache:
    """node_cost memoised per (node, start, stop), with counts of calls and of evaluated partitions."""

    def __init__(self, cost: LayerCost, weights: Weights):
        self._cost = cost
        self.weights = weights
        self._table: dict[tuple[int, int, int], NodeCost] = {}
        self.evaluated = 0

    @property
    def calls(self) -> int:
        return len(self._table)

    def node(self, node: int, interval: Interval) -> NodeCost:
        key = (node, interval[0], interval[1])
        cost = self._table.get(key)
        if cost is None:
            cost = self._cost.node_cost(node, interval[0], interval[1])
            if not (cost.work >= 0 and cost.data >= 0 and cost.over >= 0):
                raise ValueError(f"node_cost{key} returned a negative or NaN cost: {cost}")
            self._table[key] = cost
        return cost

    def evaluate(self, partition: Partition) -> float:
        """Objective of one complete partition (counted in `evaluated`)."""
        self.evaluated += 1
        return objective([self.node(j, iv) for j, iv in enumerate(partition)], self.weights)


def better(value: float, partition: Partition, best_value: float, best: Optional[Partition]) -> bool:
    """The shared order: smaller objective, then lexicographically smaller intervals."""
    return value < best_value or (value == best_value and best is not None and partition < best)


class Strategy:
    """A search over `partitions`; `run` returns the best partition and its objective."""

    name = ""

    def __init__(self, partitions: Partitions, cache: CostCache, progress: Optional[Progress] = None):
        self.partitions = partitions
        self.cache = cache
        self.progress = progress

    def run(self) -> tuple[Partition, float]:
        raise NotImplementedError

    def _report(self, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(done, total)


class Exhaustive(Strategy):
    """Every valid partition, in lexicographic order.  Progress unit: partitions."""

    name = "exhaustive"

    def run(self) -> tuple[Partition, float]:
        total = self.partitions.total()
        if total > EXHAUSTIVE_LIMIT:
            raise ValueError(
                f"exhaustive search refused: {total} candidate partitions (limit {EXHAUSTIVE_LIMIT}); "
                "use strategy 'exact'"
            )
        best: Optional[Partition] = None
        best_value = INF
        step = max(1, total // 100)
        for done, partition in enumerate(self.partitions, 1):
            value = self.cache.evaluate(partition)
            if best is None or better(value, partition, best_value, best):
                best, best_value = partition, value
            if done % step == 0 or done == total:
                self._report(done, total)
        assert best is not None, "search() checks that a partition exists"
        return best, best_value


class PrunedTree(Strategy):
    """The thesis' pruned recursive search (algorithms 1–5), as we read them.

    Recursion over nodes; the intervals of a node are grouped in trees by start index
    (ds[node][start]).  Per tree it keeps the best partitions (alg. 2) and stops the
    tree at the first interval that does worse than the tree's best so far (alg. 5,
    line 33); over the trees of a node it stops at the first tree whose best is worse
    than the node's best (line 42).  Skip lists (alg. 3–4): after each interval of a
    tree, the next node's intervals linked from it that are not in the tree's best
    partitions are marked bad for that tree and skipped when a later interval of the
    same tree links to them again ('base' list); and once a tree has been searched,
    only its best intervals are tried when it is reached again from another prefix.
    The listing in the thesis is garbled in places; this reading reproduces its
    table 4.1 counts for 2 nodes exactly (26/48/70/92 evaluated, in the thesis'
    setup), not for more nodes.

    Both early breaks and the skip lists assume that the objective is convex along
    each tree and that a tree's best does not depend on the intervals before it; for
    max- and harmonic-type objectives neither holds in general, so this strategy can
    miss the optimum (see `miss_rate`).  Progress unit: intervals of node 0 done.
    """

    name = "pruned-tree"

    def run(self) -> tuple[Partition, float]:
        self._best_of_tree: dict[tuple[int, int], frozenset[Interval]] = {}
        self._bad: dict[tuple[int, int], frozenset[Interval]] = {}
        value, found = self._search(0, ())
        roots = len(self.partitions.roots())
        self._report(roots, roots)  # the early breaks may skip the last roots
        if not found:
            raise ValueError("no valid partition")
        return min(found), value

    def _trees(self, node: int, prefix: Partition) -> list[int]:
        if node == 0:
            return [0]
        start, end = prefix[-1]
        links = self.partitions.link[node - 1].get(end, [])
        return [s for s in links if not self.partitions.overlapped or s > start]

    def _skip(self, node: int, interval: Interval, prefix: Partition) -> bool:
        """Alg. 4: whether `interval` of `node` is on a skip list for this prefix."""
        if self.partitions.completions(node, interval) == 0:
            return True
        kept = self._best_of_tree.get((node, interval[0]))
        if kept is not None and interval not in kept:
            return True
        return node > 0 and interval in self._bad.get((node - 1, prefix[-1][0]), frozenset())

    def _search(self, node: int, prefix: Partition) -> tuple[float, list[Partition]]:
        parts, last = self.partitions, self.partitions.nodes - 1
        best, best_list = INF, []
        for start in self._trees(node, prefix):
            tree_best, tree_list = INF, []
            intervals = parts.ds[node].get(start, [])
            for i, interval in enumerate(intervals):
                if self._skip(node, interval, prefix):
                    continue
                path = prefix + (interval,)
                if node == last:
                    value, found = self.cache.evaluate(path), [path]
                else:
                    value, found = self._search(node + 1, path)
                if node == 0:
                    self._report(i + 1, len(intervals))
                if value < tree_best:
                    tree_best, tree_list = value, found
                elif value == tree_best:
                    tree_list = tree_list + found
                else:
                    break
                if node < last and tree_list:  # alg. 3, 'base' list of this tree
                    winners = {p[node + 1] for p in tree_list}
                    self._bad[(node, start)] = frozenset(parts.children(node, interval)) - winners
            if not tree_list:
                continue
            self._best_of_tree.setdefault((node, start), frozenset(p[node] for p in tree_list))
            if tree_best < best:
                best, best_list = tree_best, tree_list
            elif tree_best == best:
                best_list = best_list + tree_list
            else:
                break
        return best, best_list


def nominal_partition(partitions: Partitions) -> Partition:
    """The valid partition closest (sum of |boundary - ideal|) to the speed-proportional split.

    A cheap first incumbent for the exact search: a DP over the partition graph that
    needs no cost calls.
    """
    speeds = [Fraction(s) for s in partitions.speeds]
    total = sum(speeds)
    ideal = [partitions.extent * sum(speeds[:j]) / total for j in range(partitions.nodes + 1)]
    last = partitions.nodes - 1
    best: dict[tuple[int, Interval], tuple[Fraction, Partition]] = {}
    for node in range(last, -1, -1):
        for interval in (iv for ivs in partitions.ds[node].values() for iv in ivs):
            if partitions.completions(node, interval) == 0:
                continue
            here = abs(interval[0] - ideal[node]) + abs(interval[1] - ideal[node + 1])
            if node == last:
                best[(node, interval)] = (here, (interval,))
                continue
            tail = min(best[(node + 1, nxt)] for nxt in partitions.children(node, interval) if (node + 1, nxt) in best)
            best[(node, interval)] = (here + tail[0], (interval,) + tail[1])
    return min(best[(0, iv)] for iv in partitions.roots() if (0, iv) in best)[1]


@dataclass(frozen=True)
class _Label:
    """Lower bounds over a set of partial partitions: max work, sum of 1/work, weighted data+over."""

    top: float
    inv: float
    flat: float

    def meet(self, other: _Label) -> _Label:
        return _Label(min(self.top, other.top), min(self.inv, other.inv), min(self.flat, other.flat))


_NO_NODES = _Label(0.0, 0.0, 0.0)


class Exact(Strategy):
    """Exact branch and bound: returns the optimum of `exhaustive` for any cost table.

    1. Incumbent: `nominal_partition` (no search, one evaluation).
    2. Forward pass, node by node over the partition graph (intervals of node k linked
       to intervals of node k+1): each interval reached gets a label of lower bounds
       (max work, sum 1/work, flat sum) over all prefixes ending with it that go only
       through live intervals; it is live if `lower_bound` of that label, with the
       other nodes unknown, does not exceed the incumbent.  Only children of live
       intervals are ever passed to node_cost.
    3. Backward pass over live intervals: the same three lower bounds over all
       completions after each interval (a min-max / min-sum DP).
    4. Depth-first search over nodes, children best-bound-first, pruning a prefix when
       `lower_bound(prefix, suffix label)` exceeds the incumbent, or equals it and the
       prefix is lexicographically after the incumbent.

    Exactness: a dead interval's label bounds every prefix through live intervals
    ending with it, and `lower_bound` is the minimum of the objective over all
    completions of a prefix, hence never decreases along a prefix, so by induction
    every prefix through a dead interval has a bound above the incumbent; the suffix
    labels are minima over all completions that avoid dead intervals, so the DFS bound
    never exceeds the objective of a partition it cuts off; and a partition is only
    cut off when its objective is larger than the incumbent's, or equal and
    lexicographically after it.  Floating point: pruning on value needs the bound to
    exceed the incumbent by a relative 1e-9, far above the rounding error of either
    side (see `_dead` for the tie rule).  Cost calls: the forward pass asks node_cost
    for every child of every live interval, i.e. at most all intervals that occur in
    some valid partition, usually far fewer; evaluations are the incumbent plus the
    leaves the bounds cannot cut off.  Progress unit: node-0 intervals done in step 4.
    """

    name = "exact"
    RELATIVE_TOLERANCE = 1e-9

    def run(self) -> tuple[Partition, float]:
        parts, cache, w = self.partitions, self.cache, self.cache.weights
        self._best = self._nominal = nominal_partition(parts)
        self._best_value = cache.evaluate(self._best)
        live = self._forward()
        self._suffix = self._backward(live)
        self._visit(0, (), PartialCost(parts.nodes), parts.roots())
        roots = max(1, sum((0, iv) in self._suffix for iv in parts.roots()))
        self._report(roots, roots)
        return self._best, self._best_value

    def _slack(self) -> float:
        scale = 1.0 + abs(self._best_value)
        return self.RELATIVE_TOLERANCE * scale

    def _dead(self, bound: float, path: Partition) -> bool:
        """Whether no partition extending `path` can beat the incumbent.

        Above the incumbent by the slack: every completion is worse.  Reaching it with
        a lexicographically later prefix: every completion is worse or ties and loses
        the tie-break (exact in real arithmetic; in floats a completion better by less
        than the bound's rounding, ~1e-15 relative, could be cut off here).
        """
        if bound - self._slack() > self._best_value:
            return True
        return bound >= self._best_value and path > self._best[: len(path)]

    def _label_bound(self, node: int, label: _Label) -> float:
        return lower_bound(PartialCost(self.partitions.nodes, node + 1, label.top, label.inv, label.flat), self.cache.weights)

    def _leaf_label(self, node: int, interval: Interval) -> _Label:
        cost = self.cache.node(node, interval)
        w = self.cache.weights
        inv = math.inf if cost.work == 0 else 1.0 / cost.work
        return _Label(cost.work, inv, w.data_w * cost.data + w.over_w * cost.over)

    def _forward(self) -> set[tuple[int, Interval]]:
        """Step 2: the live intervals (costs are fetched only for children of live ones)."""
        parts = self.partitions
        live: set[tuple[int, Interval]] = set()
        labels: dict[Interval, _Label] = {iv: self._leaf_label(0, iv) for iv in parts.roots() if parts.completions(0, iv)}
        for node in range(parts.nodes):
            following: dict[Interval, _Label] = {}
            for interval, label in labels.items():
                if self._label_bound(node, label) - self._slack() > self._best_value:
                    continue
                live.add((node, interval))
                if node == parts.nodes - 1:
                    continue
                for child in parts.children(node, interval):
                    if parts.completions(node + 1, child) == 0:
                        continue
                    own = self._leaf_label(node + 1, child)
                    through = _Label(max(label.top, own.top), label.inv + own.inv, label.flat + own.flat)
                    known = following.get(child)
                    following[child] = through if known is None else known.meet(through)
            labels = following
        return live

    def _backward(self, live: set[tuple[int, Interval]]) -> dict[tuple[int, Interval], _Label]:
        """Step 3: per live interval, lower bounds over the nodes after it in any live completion."""
        parts = self.partitions
        suffix: dict[tuple[int, Interval], _Label] = {}
        for node in range(parts.nodes - 1, -1, -1):
            for interval in (iv for n, iv in live if n == node):
                if node == parts.nodes - 1:
                    suffix[(node, interval)] = _NO_NODES
                    continue
                label: Optional[_Label] = None
                for child in parts.children(node, interval):
                    after = suffix.get((node + 1, child))
                    if after is None:
                        continue
                    own = self._leaf_label(node + 1, child)
                    through = _Label(max(own.top, after.top), own.inv + after.inv, own.flat + after.flat)
                    label = through if label is None else label.meet(through)
                if label is not None:
                    suffix[(node, interval)] = label
        return suffix

    def _bound(self, node: int, known: PartialCost, interval: Interval) -> tuple[float, PartialCost]:
        """Bound of the prefix extended by `interval` at `node`, and that extended prefix."""
        extended = known.add(self.cache.node(node, interval), self.cache.weights)
        after = self._suffix[(node, interval)]
        return lower_bound(extended, self.cache.weights, after.top, after.inv, after.flat), extended

    def _single(self, node: int, prefix: Partition, interval: Interval) -> None:
        """Evaluate the one partition that extends `prefix` by `interval` (it has one completion)."""
        path = prefix + (interval,)
        for k in range(node, self.partitions.nodes - 1):
            path += tuple(c for c in self.partitions.children(k, path[-1]) if self.partitions.completions(k + 1, c))
        if path == self._nominal:  # already evaluated as the first incumbent
            return
        value = self.cache.evaluate(path)
        if better(value, path, self._best_value, self._best):
            self._best, self._best_value = path, value

    def _visit(self, node: int, prefix: Partition, known: PartialCost, candidates: Sequence[Interval]) -> None:
        """Search the live `candidates` for `node` after `prefix`, best bound first.

        A candidate with a single completion is evaluated outright: its bound would be
        its objective, so computing it counts as an evaluation either way.
        """
        scored = []
        for interval in candidates:
            if (node, interval) not in self._suffix:
                continue
            if self.partitions.completions(node, interval) == 1:
                self._single(node, prefix, interval)
            else:
                bound, extended = self._bound(node, known, interval)
                scored.append((bound, interval, extended))
        scored.sort(key=lambda item: (item[0], item[1]))
        for done, (bound, interval, extended) in enumerate(scored, 1):
            path = prefix + (interval,)
            if not self._dead(bound, path):
                self._visit(node + 1, path, extended, self.partitions.children(node, interval))
            if node == 0:
                self._report(done, len(scored))


STRATEGIES: dict[str, type[Strategy]] = {s.name: s for s in (Exhaustive, PrunedTree, Exact)}


def search(
    cost: LayerCost,
    speeds: Sequence[float],
    threshold_pct: float | Fraction,
    weights: Weights,
    strategy: str = "exact",
    overlapped: bool = False,
    progress: Optional[Progress] = None,
) -> SearchResult:
    """Best partition of one layer within the threshold band (see the module docstring)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown search strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    weights.check()
    t0 = time.perf_counter()
    partitions = Partitions(cost.extent, speeds, threshold_pct, overlapped)
    if partitions.total() == 0:
        raise ValueError(f"no valid partition of extent {cost.extent} over {len(speeds)} nodes (overlapped={overlapped})")
    cache = CostCache(cost, weights)
    best, value = STRATEGIES[strategy](partitions, cache, progress).run()
    if overlapped:
        cuts = tuple(iv[0] for iv in best) + (cost.extent,)
    else:
        cuts = (0,) + tuple(iv[1] for iv in best)
    return SearchResult(
        cuts=cuts,
        objective=value,
        evaluated=cache.evaluated,
        cost_calls=cache.calls,
        log10_total=partitions.log10_total(),
        seconds=time.perf_counter() - t0,
        strategy=strategy,
        intervals=best,
    )


@dataclass(frozen=True)
class MissRate:
    """How often a strategy missed the optimum of `exhaustive`."""

    instances: int
    misses: int  # instances where its objective exceeded the optimum
    worst_gap: float  # largest objective - optimum

    @property
    def rate(self) -> float:
        return self.misses / self.instances if self.instances else 0.0


def miss_rate(
    cases: Iterable[tuple[LayerCost, Sequence[float], float | Fraction, Weights]],
    strategy: str = "pruned-tree",
    overlapped: bool = False,
) -> MissRate:
    """Run `strategy` and `exhaustive` on each (cost, speeds, threshold, weights) and count misses.

    The pruned tree's assumptions (convexity along a tree, prefix-independent tree
    optima) do not hold for general costs; this measures the price, not hides it.
    """
    instances = misses = 0
    worst = 0.0
    for cost, speeds, threshold, weights in cases:
        optimum = search(cost, speeds, threshold, weights, "exhaustive", overlapped).objective
        found = search(cost, speeds, threshold, weights, strategy, overlapped).objective
        instances += 1
        if found > optimum:
            misses += 1
            worst = max(worst, found - optimum)
    return MissRate(instances, misses, worst)
