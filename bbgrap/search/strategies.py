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
from typing import Callable, Collection, Iterable, Optional, Sequence

from bbgrap.ir import BBGrapError
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
            raise BBGrapError(
                f"--search exhaustive: a layer has {total} candidate partitions, more than it tries ({EXHAUSTIVE_LIMIT}); "
                "use --search exact (the same optimum, found without trying them all) or a smaller --threshold"
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
    ideal = [partitions.extent * sum(speeds[:j], Fraction(0)) / total for j in range(partitions.nodes + 1)]
    # Distances in units of 1/scale, where every ideal boundary is a whole number of units: exact
    # integers, ordered (and tied) as the rational distances are, without Fraction arithmetic
    # for every candidate interval.
    scale = math.lcm(*(q.denominator for q in ideal))
    scaled = [int(q * scale) for q in ideal]
    last = partitions.nodes - 1
    best: dict[tuple[int, Interval], tuple[int, Partition]] = {}
    for node in range(last, -1, -1):
        for interval in (iv for ivs in partitions.ds[node].values() for iv in ivs):
            if partitions.completions(node, interval) == 0:
                continue
            here = abs(interval[0] * scale - scaled[node]) + abs(interval[1] * scale - scaled[node + 1])
            if node == last:
                best[(node, interval)] = (here, (interval,))
                continue
            tail = min(best[(node + 1, nxt)] for nxt in partitions.children(node, interval) if (node + 1, nxt) in best)
            best[(node, interval)] = (here + tail[0], (interval,) + tail[1])
    return min(best[(0, iv)] for iv in partitions.roots() if (0, iv) in best)[1]


@dataclass(frozen=True)
class _Label:
    """Lower bounds over a set of partial partitions, each covering some of the nodes.

    `top`, `inv`, `flat`: minima over the set of the known max work, sum of 1/work and
    weighted data+over sum; `known`: the most known nodes of any member.  Since every
    unknown work is <= the max work M, a member's total sum of 1/work is >=
    inv + (nodes - known) / M, so `lower_bound` of the label bounds every member.
    """

    top: float = 0.0
    inv: float = 0.0
    flat: float = 0.0
    known: int = 0

    def meet(self, other: _Label) -> _Label:
        """Bounds over the union of two sets."""
        return _Label(min(self.top, other.top), min(self.inv, other.inv), min(self.flat, other.flat), max(self.known, other.known))

    def join(self, other: _Label) -> _Label:
        """Bounds over the concatenations (disjoint nodes) of two sets' members."""
        return _Label(max(self.top, other.top), self.inv + other.inv, self.flat + other.flat, self.known + other.known)


_EMPTY = _Label()
Key = tuple[int, Interval]  # (node, interval)


class Exact(Strategy):
    """Exact branch and bound: returns the optimum of `exhaustive` for any cost table.

    1. Incumbent: `nominal_partition` (no search, one evaluation).
    2. Outside-in pruning with lazy cost calls.  The intervals that occur in some
       valid partition form a layered graph (node k's interval -> the node k+1
       intervals that may follow it).  Nodes are taken in pairs from the outside in:
       (0, N-1), (1, N-2), ...  The intervals of a pair are visited largest first
       (size / speed: a guess of which intervals are costly, used for the order only;
       see `_settle`).
       Each gets a label of lower bounds over every partition through it that uses
       only live intervals, from the known costs (the nodes outside the pair, the
       other node of the pair where known, nothing for the nodes in between); if
       `lower_bound` of it exceeds the incumbent the interval dies without a cost
       call, else node_cost is called and it dies if the bound with its own cost
       does.  An interval whose partners in the pair are all dead dies too.
    3. Backward pass over the live intervals: label of every completion after each.
    4. Depth-first search over nodes, children best-bound-first, cutting a prefix off
       when `lower_bound(prefix, suffix label)` exceeds the incumbent (see `_dead`).

    Exactness: a label bounds every partition through live intervals that passes
    through its interval (meets over alternatives, joins over disjoint nodes,
    `lower_bound` monotone in each field and the minimum over all completions), so
    an interval dies only when every such partition costs more than the incumbent;
    by induction over the order of deaths, every partition through a dead interval
    costs more than the incumbent (which only improves).  Step 4 then only cuts off
    partitions whose objective exceeds the incumbent's, or equals it and loses the
    lexicographic tie-break.  Floating point: cutting on value needs the bound to
    exceed the incumbent by a relative 1e-9, far above the rounding error of either
    side.  Cost calls: only for intervals that survive their label with unknown
    costs, at most all intervals of valid partitions.  Evaluations: the incumbent
    plus the leaves the bounds cannot cut off.  Progress unit: node-0 intervals done
    in step 4.
    """

    name = "exact"
    RELATIVE_TOLERANCE = 1e-9

    def run(self) -> tuple[Partition, float]:
        parts, cache = self.partitions, self.cache
        self._best = self._nominal = nominal_partition(parts)
        self._best_value = cache.evaluate(self._best)
        live = self._prune()
        self._suffix = self._backward(live)
        self._visit(0, (), PartialCost(parts.nodes), parts.roots())
        roots = max(1, sum((0, iv) in self._suffix for iv in parts.roots()))
        self._report(roots, roots)
        return self._best, self._best_value

    def _slack(self) -> float:
        return self.RELATIVE_TOLERANCE * (1.0 + abs(self._best_value))

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

    def _too_costly(self, label: _Label) -> bool:
        p = PartialCost(self.partitions.nodes, label.known, label.top, label.inv, label.flat)
        return lower_bound(p, self.cache.weights) - self._slack() > self._best_value

    def _own(self, node: int, interval: Interval) -> _Label:
        """Label of one interval's own cost (calls node_cost)."""
        cost = self.cache.node(node, interval)
        w = self.cache.weights
        inv = math.inf if cost.work == 0 else 1.0 / cost.work
        return _Label(cost.work, inv, w.data_w * cost.data + w.over_w * cost.over, 1)

    def _prune(self) -> set[Key]:
        """Step 2: the live intervals, all with known costs."""
        parts, last = self.partitions, self.partitions.nodes - 1
        # the intervals of valid partitions: reachable from node 0 and completable
        self._levels = [[iv for iv in parts.roots() if parts.completions(0, iv)]]
        self._kids: dict[Key, list[Interval]] = {}
        self._parents: dict[Key, list[Interval]] = {}
        for k in range(last):
            for interval in self._levels[k]:
                kids = [c for c in parts.children(k, interval) if parts.completions(k + 1, c)]
                self._kids[(k, interval)] = kids
                for child in kids:
                    self._parents.setdefault((k + 1, child), []).append(interval)
            self._levels.append(sorted(iv for (n, iv) in self._parents if n == k + 1))
        live = {(k, iv) for k in range(last + 1) for iv in self._levels[k]}
        self._known: set[Key] = set()
        before = {iv: _EMPTY for iv in self._levels[0]}  # labels of everything left of level lo
        after = {iv: _EMPTY for iv in self._levels[last]}  # ... right of level hi
        lo, hi = 0, last
        while lo <= hi:
            self._settle(lo, hi, before, after, live)
            if lo + 1 <= hi - 1:
                before = self._step(lo, lo + 1, before, live, self._kids)
                after = self._step(hi, hi - 1, after, live, self._parents)
            lo, hi = lo + 1, hi - 1
        return live

    def _step(self, level: int, target: int, labels: dict[Interval, _Label], live: set[Key], links: dict[Key, list[Interval]]) -> dict[Interval, _Label]:
        """Labels of the live intervals of `target` from those of the adjacent, settled `level`."""
        result: dict[Interval, _Label] = {}
        for interval, label in labels.items():
            if (level, interval) not in live:
                continue
            through = label.join(self._own(level, interval))
            for nxt in links.get((level, interval), ()):
                if (target, nxt) in live:
                    known = result.get(nxt)
                    result[nxt] = through if known is None else known.meet(through)
        for interval in self._levels[target]:
            if interval not in result:
                live.discard((target, interval))
        return result

    def _settle(self, lo: int, hi: int, before: dict[Interval, _Label], after: dict[Interval, _Label], live: set[Key]) -> None:
        """Decide every interval of levels lo and hi: dead, or live with a known cost.

        Order (it only affects the number of cost calls): heaviest (size / speed)
        first; a heavy interval (above the balanced size / speed) whose live partners
        are all heavy and unknown waits for a second round: a partition with two heavy
        intervals needs only one of them called to be ruled out, and the partners are
        often called (and die) anyway for partitions where they are the only heavy one.
        """
        speeds = self.partitions.speeds
        balanced = self.partitions.extent / sum(speeds)
        side = {lo: before, hi: after}

        def weight(key: Key) -> float:
            return (key[1][1] - key[1][0]) / speeds[key[0]]

        order = sorted(
            ((k, iv) for k in {lo, hi} for iv in self._levels[k] if (k, iv) in live),
            key=lambda key: (-weight(key), key[0], key[1]),
        )
        deferred: list[Key] = []
        for second_round in (False, True):
            for key in deferred if second_round else order:
                k, interval = key
                if key not in live:
                    continue
                if not second_round and lo != hi and weight(key) > balanced:
                    other, candidates = self._partners(k, interval, lo, hi)
                    partners = [(other, c) for c in candidates if (other, c) in live]
                    if partners and all(weight(p) > balanced and p not in self._known for p in partners):
                        deferred.append(key)
                        continue
                outer = side[k].get(interval)
                partners_label = _EMPTY if lo == hi else self._partners_label(k, interval, lo, hi, after if k == lo else before, live)
                if outer is None or partners_label is None:
                    live.discard(key)
                    continue
                label = outer.join(partners_label)
                if self._too_costly(label) or self._too_costly(label.join(self._own(k, interval))):
                    live.discard(key)
                else:
                    self._known.add(key)

    def _partners(self, k: int, interval: Interval, lo: int, hi: int) -> tuple[int, Sequence[Interval]]:
        """The pair's other level and its intervals that may share a partition with `interval` (a superset)."""
        other = hi if k == lo else lo
        if hi == lo + 1:
            return other, self._kids.get((k, interval), []) if k == lo else self._parents.get((k, interval), [])
        if self.partitions.overlapped:
            return other, self._levels[other]  # any: a sound relaxation
        band = self.partitions.band[lo + 1 : hi]
        gap_min, gap_max = sum(b[0] for b in band), sum(b[1] for b in band)
        if k == lo:
            return other, [iv for iv in self._levels[other] if gap_min <= iv[0] - interval[1] <= gap_max]
        return other, [iv for iv in self._levels[other] if gap_min <= interval[0] - iv[1] <= gap_max]

    def _partners_label(self, k: int, interval: Interval, lo: int, hi: int, outer: dict[Interval, _Label], live: set[Key]) -> Optional[_Label]:
        """Meet over the live partners of `interval` in the pair (None: it has none)."""
        other, candidates = self._partners(k, interval, lo, hi)
        label: Optional[_Label] = None
        for candidate in candidates:
            if (other, candidate) not in live or candidate not in outer:
                continue
            through = outer[candidate]
            if (other, candidate) in self._known:
                through = through.join(self._own(other, candidate))
            label = through if label is None else label.meet(through)
        return label

    def _backward(self, live: set[Key]) -> dict[Key, _Label]:
        """Step 3: per live interval, the label of all live completions after it."""
        last = self.partitions.nodes - 1
        suffix: dict[Key, _Label] = {(last, iv): _EMPTY for iv in self._levels[last] if (last, iv) in live}
        for node in range(last - 1, -1, -1):
            for interval in self._levels[node]:
                if (node, interval) not in live:
                    continue
                label: Optional[_Label] = None
                for child in self._kids.get((node, interval), ()):
                    rest = suffix.get((node + 1, child))
                    if rest is not None:
                        through = self._own(node + 1, child).join(rest)
                        label = through if label is None else label.meet(through)
                if label is not None:
                    suffix[(node, interval)] = label
        return suffix

    def _bound(self, node: int, known: PartialCost, interval: Interval) -> tuple[float, PartialCost]:
        """Bound of the prefix extended by `interval` at `node`, and that extended prefix."""
        extended = known.add(self.cache.node(node, interval), self.cache.weights)
        rest = self._suffix[(node, interval)]
        return lower_bound(extended, self.cache.weights, rest.top, rest.inv, rest.flat), extended

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
    positions: Optional[Collection[int]] = None,
) -> SearchResult:
    """Best partition of one layer within the threshold band (see the module docstring); with
    `positions`, the best of those whose cuts are all among them (`Partitions`)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown search strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    weights.check()
    t0 = time.perf_counter()
    partitions = Partitions(cost.extent, speeds, threshold_pct, overlapped, positions)
    if partitions.total() == 0:
        among = "" if positions is None else f" with cuts among {sorted(positions)}"
        raise ValueError(f"no valid partition of extent {cost.extent} over {len(speeds)} nodes (overlapped={overlapped}){among}")
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
