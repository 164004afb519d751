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
from typing import Callable, Optional, Sequence

import numpy as np

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
        assert best is not None, "a widened band always has a partition"
        return best, best_value


class PrunedTree(Strategy):
    """The thesis' pruned recursive search (algorithms 1–5), as we read them.

    Recursion over nodes; the intervals of a node are grouped in trees by start index
    (ds[node][start]).  Per tree it keeps the best partitions (alg. 2) and stops the
    tree at the first interval that does worse than the tree's best so far (alg. 5,
    line 33); over the trees of a node it stops at the first tree whose best is worse
    than the node's best (line 42).  Skip lists (alg. 3–4): once a tree has been
    searched, the intervals of it that were not in its best partitions are skipped
    when the same tree is reached again from another prefix.

    Both early breaks and the skip lists assume that the objective is convex along
    each tree and that a tree's best does not depend on the intervals before it; for
    max- and harmonic-type objectives neither holds in general, so this strategy can
    miss the optimum (see `miss_rate`).  Progress unit: intervals of node 0 done.
    """

    name = "pruned-tree"

    def run(self) -> tuple[Partition, float]:
        self._best_of_tree: dict[tuple[int, int], frozenset[Interval]] = {}
        value, found = self._search(0, ())
        if not found:
            raise ValueError("no valid partition")
        return min(found), value

    def _trees(self, node: int, prefix: Partition) -> list[int]:
        if node == 0:
            return [0]
        start, end = prefix[-1]
        links = self.partitions.link[node - 1].get(end, [])
        return [s for s in links if not self.partitions.overlapped or s > start]

    def _search(self, node: int, prefix: Partition) -> tuple[float, list[Partition]]:
        parts, last = self.partitions, self.partitions.nodes - 1
        best, best_list = INF, []
        for start in self._trees(node, prefix):
            kept = self._best_of_tree.get((node, start))  # skip list of this tree, if seen before
            tree_best, tree_list = INF, []
            intervals = parts.ds[node].get(start, [])
            for i, interval in enumerate(intervals):
                if (kept is not None and interval not in kept) or parts.completions(node, interval) == 0:
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


class Exact(Strategy):
    """Branch and bound that provably returns the optimum of `exhaustive`.

    Bound. Let T range over the distinct work values of all candidate intervals. A
    backward dynamic programme gives, for every (node, interval) and every T, the exact
    minimum weighted data+over sum over the valid suffixes after it whose works are
    all <= T (inf if none). Any completion of a prefix has some suffix max work T*, so
    its objective is at least ow*M + hw*gap(M) + flat_known + minflat_T*, with
    M = max(known max, T*) and gap(M) the harmonic-gap bound of
    `objective.lower_bound` (increasing in M); the minimum of that over all T is a
    sound lower bound that couples the max-work and the data terms.

    Search. A greedy descent by bound gives the first incumbent; then prefixes are
    visited in lexicographic order. A prefix is discarded when its bound exceeds the
    incumbent's objective, or when it is lexicographically after the incumbent and its
    bound reaches the incumbent's objective (every completion then costs more, or ties
    and loses the tie-break). So among equal objectives the lexicographically smallest
    partition wins, as in `exhaustive`. Bounds are compared with a relative slack of
    1e-12: the result is the optimum up to float rounding of the objective's sums.
    Progress unit: intervals of node 0 done.
    """

    name = "exact"

    def run(self) -> tuple[Partition, float]:
        parts, w = self.partitions, self.cache.weights
        last = parts.nodes - 1
        self._kids: dict[tuple[int, Interval], list[Interval]] = {}
        live = {node: [iv for ivs in parts.ds[node].values() for iv in ivs if parts.completions(node, iv)] for node in range(parts.nodes)}
        works = sorted({self.cache.node(n, iv).work for n in live for iv in live[n]})
        self._thresholds = np.asarray(works, dtype=np.float64)
        position = {t: k for k, t in enumerate(works)}
        self._minflat: dict[tuple[int, Interval], np.ndarray] = {}
        zeros = np.zeros(len(works))
        for node in range(last, -1, -1):
            for interval in live[node]:
                if node == last:
                    self._minflat[(node, interval)] = zeros
                    continue
                best = np.full(len(works), INF)
                for child in self._children(node, interval):
                    c = self.cache.node(node + 1, child)
                    flat = w.data_w * c.data + w.over_w * c.over + self._minflat[(node + 1, child)]
                    # the child's work must itself be <= T
                    flat = flat.copy()
                    flat[: position[c.work]] = INF
                    np.minimum(best, flat, out=best)
                self._minflat[(node, interval)] = best
        roots = live[0]
        start = PartialCost(parts.nodes)
        self.best, self.best_value = self._greedy(roots, start)
        for done, root in enumerate(roots, 1):
            self._descend(0, (root,), start.add(self.cache.node(0, root), w))
            self._report(done, len(roots))
        return self.best, self.best_value

    def _children(self, node: int, interval: Interval) -> list[Interval]:
        kids = self._kids.get((node, interval))
        if kids is None:
            parts = self.partitions
            kids = [c for c in parts.children(node, interval) if parts.completions(node + 1, c)]
            self._kids[(node, interval)] = kids
        return kids

    def _bound(self, node: int, interval: Interval, p: PartialCost) -> float:
        w = self.cache.weights
        minflat = self._minflat[(node, interval)]
        m = np.maximum(self._thresholds, p.top)
        r = p.nodes - p.known
        with np.errstate(divide="ignore", invalid="ignore"):
            denominator = p.inv_sum + r / m
            gap = np.where((m > 0) & (denominator > 0), np.maximum(0.0, m - p.nodes / denominator), 0.0)
        return float(np.min(w.operations_w * m + w.harmonic_w * gap + minflat)) + p.flat

    def _greedy(self, roots: list[Interval], start: PartialCost) -> tuple[Partition, float]:
        w = self.cache.weights
        path: Partition = ()
        candidates, p = roots, start
        for node in range(self.partitions.nodes):
            scored = [(self._bound(node, iv, p.add(self.cache.node(node, iv), w)), iv) for iv in candidates]
            _, choice = min(scored)
            path, p = path + (choice,), p.add(self.cache.node(node, choice), w)
            if node < self.partitions.nodes - 1:
                candidates = self._children(node, choice)
        return path, self.cache.evaluate(path)

    def _descend(self, node: int, path: Partition, p: PartialCost) -> None:
        interval = path[-1]
        bound = self._bound(node, interval, p)
        slack = 1e-12 * abs(self.best_value)
        if bound > self.best_value + slack or (bound >= self.best_value - slack and path > self.best[: len(path)]):
            return
        if node == self.partitions.nodes - 1:
            value = self.cache.evaluate(path)
            if better(value, path, self.best_value, self.best):
                self.best, self.best_value = path, value
            return
        w = self.cache.weights
        for child in self._children(node, interval):
            self._descend(node + 1, path + (child,), p.add(self.cache.node(node + 1, child), w))


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
