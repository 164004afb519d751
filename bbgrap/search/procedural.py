"""Procedural partitions of one layer (thesis §3.5, eq. 3.13–3.25, tables 3.6–3.8).

Instead of storing every partition, the thesis stores per node the candidate
intervals, indexed by start (`ds`) and by end (`de`), and a `link` dictionary from
the end of one node's interval to the starts of the next node's intervals.  A
partition is a path node 0 -> node N-1 through these dictionaries.

Validity.  Node j's interval size must lie in its band (`size_band`).
* Non-overlapped mode: the intervals are contiguous and disjoint,
  node 0 = [0, c1), node 1 = [c1, c2), ..., node N-1 = [c_{N-1}, extent).
* Overlapped mode (the thesis' "overlapped option", fig. 3.10, tables 3.6–3.8):
  node 0 starts at 0, node N-1 ends at extent, and every next start s' satisfies
  s < s' <= e for the previous interval (s, e): starts strictly increase and there
  is no gap; a middle node may not end at extent; and, as the thesis builds its
  dictionaries, a middle node n starts within [extent - sum of the max sizes of
  nodes n.., extent - sum of their min sizes] (eq. 3.22-3.24), a range derived for
  contiguous intervals that we keep so that table 4.1's totals are reproduced.

Band widening (a decision of ours, the thesis does not say): the thesis' rounding
can give a band with sum(max) < extent (e.g. extent 10, 3 nodes, 0 %: sizes 3, 3, 3)
or, for other inputs, sum(min) > extent; then no partition exists.  We widen to
the nearest feasible band: one unit at a time, the max of the node with the
smallest max/speed grows (or the min of the node with the largest min/speed
shrinks), lowest node first on ties, until sum(min) <= extent <= sum(max).  This
adds the fewest sizes possible and keeps the band proportional to the speeds.
"""

from __future__ import annotations

import bisect
import functools
import math
from fractions import Fraction
from typing import Collection, Iterator, Sequence

Interval = tuple[int, int]
Partition = tuple[Interval, ...]


def _exact(value: float | Fraction) -> Fraction:
    """Exact rational value of a number (floats are exact binary fractions)."""
    return Fraction(value)


def _check_speeds(speeds: Sequence[float]) -> list[Fraction]:
    if not speeds:
        raise ValueError("need at least one node speed")
    exact = [_exact(s) for s in speeds]
    if any(s <= 0 for s in exact):
        raise ValueError(f"speeds must be > 0, got {list(speeds)!r}")
    return exact


def interval_sizes(extent: int, speeds: Sequence[float]) -> list[int]:
    """Eq. 3.13: floor(extent / sum(speeds) * speed_j), computed exactly."""
    if extent < 0:
        raise ValueError(f"extent must be >= 0, got {extent}")
    exact = _check_speeds(speeds)
    total = sum(exact)
    return [math.floor(extent * s / total) for s in exact]


def size_band(extent: int, speeds: Sequence[float], threshold_pct: float | Fraction) -> list[tuple[int, int]]:
    """Eq. 3.14–3.16: per node (min_size, max_size), widened to be feasible.

    min = ceil(size * (100 - t) / 100), max = ceil(size * (100 + t) / 100), in exact
    rational arithmetic (pass a Fraction such as Fraction(100, 3) for thirds), clipped
    to [0, extent), then widened as described in the module docstring. Kept per arguments:
    the search pass asks it twice for every layer, and widening a band of many nodes one
    unit at a time in fractions took a second of maxvit_t's compile on 16 nodes.
    """
    return list(_size_band(extent, tuple(speeds), threshold_pct))


@functools.lru_cache(maxsize=4096)
def _size_band(extent: int, speeds: tuple[float, ...], threshold_pct: float | Fraction) -> tuple[tuple[int, int], ...]:
    t = _exact(threshold_pct)
    if not 0 <= t <= 100:
        raise ValueError(f"threshold must be within [0, 100] %, got {threshold_pct!r}")
    exact = _check_speeds(speeds)
    band = [
        [max(0, math.ceil(size * (100 - t) / 100)), min(extent, math.ceil(size * (100 + t) / 100))]
        for size in interval_sizes(extent, speeds)
    ]
    nodes = range(len(band))
    while sum(b[1] for b in band) < extent:
        grow = min(nodes, key=lambda j: (Fraction(band[j][1]) / exact[j], j))
        band[grow][1] += 1
    while sum(b[0] for b in band) > extent:
        shrink = min(nodes, key=lambda j: (-Fraction(band[j][0]) / exact[j], j))
        band[shrink][0] -= 1
    return tuple((lo, hi) for lo, hi in band)


class Partitions:
    """The valid partitions of one layer, stored procedurally (eq. 3.17–3.25).

    `ds[node][start]` lists the node's candidate intervals starting at `start`
    (sorted by end), `de[node][end]` those ending at `end` (sorted by start), and
    `link[node][end]` the starts of node+1's intervals that may follow an interval
    of `node` ending at `end` (in overlapped mode the walk also requires the next
    start to exceed the current start, as the thesis checks while linking).  As in
    the thesis the dictionaries may hold dead intervals that no path uses.
    Partitions are ordered lexicographically by their intervals; `total`,
    `__getitem__` and `__iter__` all follow that order.

    `positions` (non-overlapped mode only): where given, the only cut positions allowed
    strictly inside the extent, so that every interval starts at 0 or one of them and ends
    at one of them or the extent: the partitions are those of the band whose cuts are all
    candidates (the search pass's candidate boundaries of a layer with a wide band). The
    intervals are built from the positions, so the work does not grow with the extent.
    """

    def __init__(self, extent: int, speeds: Sequence[float], threshold_pct: float | Fraction, overlapped: bool = False,
                 positions: Collection[int] | None = None):
        if positions is not None and overlapped:
            raise ValueError("candidate positions are for contiguous (non-overlapped) partitions only")
        self.extent = extent
        self.speeds = tuple(speeds)
        self.threshold_pct = threshold_pct
        self.overlapped = overlapped
        self.positions = None if positions is None else tuple(sorted({p for p in positions if 0 < p < extent}))
        self.band = size_band(extent, speeds, threshold_pct)
        self.nodes = len(self.band)
        self.ds: dict[int, dict[int, list[Interval]]] = {}
        self.de: dict[int, dict[int, list[Interval]]] = {}
        self.link: dict[int, dict[int, list[int]]] = {}
        for node in range(self.nodes):
            self._add_node(node)
        for node in range(self.nodes - 1):
            starts = sorted(self.ds[node + 1])
            self.link[node] = {
                end: [s for s in starts if (s <= end if overlapped else s == end)] for end in sorted(self.de[node])
            }
        self._completions = self._count_completions()

    def sizes(self, node: int) -> range:
        """Eq. 3.16: the possible interval sizes of `node`."""
        lo, hi = self.band[node]
        return range(lo, hi + 1)

    def _add_node(self, node: int) -> None:
        """Candidate intervals of one node: eq. 3.17–3.18 (left), 3.19–3.21 (right), 3.22–3.25 (middle)."""
        extent, last = self.extent, self.nodes - 1
        # Only the last node may end at extent and only node 0 may start at 0 (thesis,
        # fig. 3.9), unless (non-overlapped mode) the nodes after / before may all be idle.
        may_end_at_extent = node == last or (not self.overlapped and all(lo == 0 for lo, _ in self.band[node + 1 :]))
        may_start_at_0 = node == 0 or (not self.overlapped and all(lo == 0 for lo, _ in self.band[:node]))
        if self.positions is not None:
            intervals = self._candidate_intervals(node)
        elif node == 0:
            intervals = [(0, size) for size in self.sizes(0)]  # eq. 3.17
        elif node == last:
            intervals = [(extent - size, extent) for size in self.sizes(node)]  # eq. 3.19-3.21
        else:
            rest = self.band[node:]
            min_idx = max(0, extent - sum(hi for _, hi in rest))  # eq. 3.22
            max_idx = extent - sum(lo for lo, _ in rest)  # eq. 3.23
            intervals = [
                (start, start + size)
                for start in range(min_idx, max_idx + 1)  # eq. 3.24
                for size in self.sizes(node)  # eq. 3.25
            ]
        intervals = [
            (start, stop)
            for start, stop in intervals
            if 0 <= start <= stop <= extent
            and (node > 0 or start == 0)
            and (node < last or stop == extent)
            and (start > 0 or may_start_at_0)
            and (stop < extent or may_end_at_extent)
        ]
        ds: dict[int, list[Interval]] = {}
        de: dict[int, list[Interval]] = {}
        for interval in sorted(intervals):
            ds.setdefault(interval[0], []).append(interval)
        for interval in sorted(intervals, key=lambda iv: (iv[1], iv[0])):
            de.setdefault(interval[1], []).append(interval)
        self.ds[node], self.de[node] = ds, de

    def _candidate_intervals(self, node: int) -> list[Interval]:
        """The node's band intervals between allowed cuts (0, the positions, the extent), a middle
        node's start within eq. 3.22-3.23's range; `_add_node` applies the other checks."""
        assert self.positions is not None
        extent, last = self.extent, self.nodes - 1
        cuts = (0,) + self.positions + (extent,)
        lo, hi = self.band[node]
        rest = self.band[node:]
        first, final = max(0, extent - sum(h for _, h in rest)), extent - sum(low for low, _ in rest)
        out = []
        for start in cuts:
            if (node == 0 and start != 0) or (0 < node < last and not first <= start <= final):
                continue
            out += [(start, stop) for stop in cuts[bisect.bisect_left(cuts, start + lo):bisect.bisect_right(cuts, start + hi)]]
        return out

    def children(self, node: int, interval: Interval) -> list[Interval]:
        """Intervals of node+1 that may follow `interval` of `node`, in order."""
        return [
            nxt
            for start in self.link[node].get(interval[1], ())
            if not self.overlapped or start > interval[0]
            for nxt in self.ds[node + 1][start]
        ]

    def roots(self) -> list[Interval]:
        """Intervals of node 0."""
        return list(self.ds[0].get(0, ()))

    def _count_completions(self) -> dict[tuple[int, Interval], int]:
        """Number of valid ways to finish a partition from each (node, interval): a backward DP."""
        counts: dict[tuple[int, Interval], int] = {}
        last = self.nodes - 1
        for interval in (iv for ivs in self.ds[last].values() for iv in ivs):
            counts[(last, interval)] = 1
        for node in range(last - 1, -1, -1):
            for interval in (iv for ivs in self.ds[node].values() for iv in ivs):
                counts[(node, interval)] = sum(counts[(node + 1, nxt)] for nxt in self.children(node, interval))
        return counts

    def completions(self, node: int, interval: Interval) -> int:
        """Number of valid partitions' suffixes starting with `interval` at `node`."""
        return self._completions.get((node, interval), 0)

    def total(self) -> int:
        """Exact number of valid partitions."""
        return sum(self.completions(0, iv) for iv in self.roots())

    def log10_total(self) -> float:
        total = self.total()
        return math.log10(total) if total else float("-inf")

    def __len__(self) -> int:
        return self.total()

    def __getitem__(self, k: int) -> Partition:
        """The k-th valid partition (lexicographic order), in O(N * M)."""
        total = self.total()
        if k < 0:
            k += total
        if not 0 <= k < total:
            raise IndexError(f"partition index {k} out of range for {total} partitions")
        chosen: list[Interval] = []
        candidates = self.roots()
        for node in range(self.nodes):
            for interval in candidates:
                count = self.completions(node, interval)
                if k < count:
                    chosen.append(interval)
                    break
                k -= count
            if node < self.nodes - 1:
                candidates = self.children(node, chosen[-1])
        return tuple(chosen)

    def __iter__(self) -> Iterator[Partition]:
        """All valid partitions in lexicographic order (only sensible for small cases)."""

        def walk(node: int, prefix: tuple[Interval, ...], candidates: list[Interval]) -> Iterator[Partition]:
            for interval in candidates:
                if self.completions(node, interval) == 0:
                    continue
                path = prefix + (interval,)
                if node == self.nodes - 1:
                    yield path
                else:
                    yield from walk(node + 1, path, self.children(node, interval))

        return walk(0, (), self.roots())

    def is_valid(self, partition: Sequence[Interval]) -> bool:
        """Whether `partition` is valid by the module's definition (independent of the dictionaries)."""
        if len(partition) != self.nodes or partition[0][0] != 0 or partition[-1][1] != self.extent:
            return False
        for node, (start, stop) in enumerate(partition):
            lo, hi = self.band[node]
            if not lo <= stop - start <= hi:
                return False
        for node, ((s, e), (s2, _)) in enumerate(zip(partition, partition[1:])):
            if self.overlapped:
                if not s < s2 <= e or e == self.extent:
                    return False
                rest = self.band[node + 1 :]
                if 0 < node + 1 < self.nodes - 1 and not (
                    self.extent - sum(hi for _, hi in rest) <= s2 <= self.extent - sum(lo for lo, _ in rest)
                ):
                    return False
            elif s2 != e:
                return False
        return True
