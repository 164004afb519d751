"""Procedural partitions (thesis eq. 3.13–3.25, tables 3.6–3.8, fig. 3.10, table 4.1 totals)."""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction

import pytest

from bbgrap.search.procedural import Partitions, interval_sizes, size_band

# Tables 3.6–3.8: output 9, three homogeneous nodes, overlapped option on (the link
# table lets node 1 start at 1 or 2 after (0, 2), which only the overlapped mode
# allows).  The thesis does not give the threshold; every node's sizes are {2, 3, 4}
# around interval size 3, which eq. 3.14–3.15 (ceil) give for exactly 100/3 % only:
# 33.33 % already gives {3, 4} and 34 % gives {2, ..., 5}.
TABLE_3_6_DS = {
    0: {0: [(0, 2), (0, 3), (0, 4)]},
    1: {
        1: [(1, 3), (1, 4), (1, 5)],
        2: [(2, 4), (2, 5), (2, 6)],
        3: [(3, 5), (3, 6), (3, 7)],
        4: [(4, 6), (4, 7), (4, 8)],
        5: [(5, 7), (5, 8)],
    },
    2: {7: [(7, 9)], 6: [(6, 9)], 5: [(5, 9)]},
}
TABLE_3_7_DE = {
    0: {2: [(0, 2)], 3: [(0, 3)], 4: [(0, 4)]},
    1: {
        3: [(1, 3)],
        4: [(1, 4), (2, 4)],
        5: [(1, 5), (2, 5), (3, 5)],
        6: [(2, 6), (3, 6), (4, 6)],
        7: [(3, 7), (4, 7), (5, 7)],
        8: [(4, 8), (5, 8)],
    },
    2: {9: [(5, 9), (6, 9), (7, 9)]},  # eq. 3.21 lists them by size; the table by start
}
TABLE_3_8_LINK = {
    0: {2: [1, 2], 3: [1, 2, 3], 4: [1, 2, 3, 4]},
    1: {3: [], 4: [], 5: [5], 6: [5, 6], 7: [5, 6, 7], 8: [5, 6, 7]},
}


def test_tables_3_6_to_3_8() -> None:
    parts = Partitions(9, [1, 1, 1], Fraction(100, 3), overlapped=True)
    assert parts.band == [(2, 4)] * 3
    assert parts.ds == TABLE_3_6_DS
    assert parts.de == TABLE_3_7_DE
    assert parts.link == TABLE_3_8_LINK


def test_table_threshold_needs_exactly_a_third() -> None:
    assert size_band(9, [1, 1, 1], 33.33) == [(3, 4)] * 3
    assert size_band(9, [1, 1, 1], 34) == [(2, 5)] * 3


def test_tables_in_non_overlapped_mode_link_only_equal_starts() -> None:
    parts = Partitions(9, [1, 1, 1], Fraction(100, 3))
    assert parts.ds == TABLE_3_6_DS and parts.de == TABLE_3_7_DE
    assert parts.link == {0: {2: [2], 3: [3], 4: [4]}, 1: {3: [], 4: [], 5: [5], 6: [6], 7: [7], 8: []}}
    assert sorted(tuple(b - a for a, b in p) for p in parts) == sorted(
        s for s in itertools.product([2, 3, 4], repeat=3) if sum(s) == 9
    )


def test_eq_3_13_interval_sizes_speeds_1_3_1() -> None:
    assert interval_sizes(8, [1, 3, 1]) == [1, 4, 1]
    assert interval_sizes(448, [1, 1, 1, 1]) == [112] * 4


def test_figure_3_10() -> None:
    """Output 8, speeds 1:3:1, 20 %: the thesis reports 176 partitions reduced to 5.

    Inconsistencies in the thesis: the prose gives the band [0, 2] for nodes 1 and 3,
    but eq. 3.14 gives ceil(1 * 0.8) = 1, and its own fig. 3.8 arithmetic
    max_idx = 8 - (4 + 1) = 3 uses 1 as well; we follow the equations.  With them,
    the 5 are the overlapped-mode partitions (fig. 3.10 shows overlaps in red); the
    non-overlapped mode has 3.  We could not reproduce the 176 "without threshold"
    under any convention we tried (all sizes 0..8 or 1..8, overlapped or not, with
    or without increasing ends): 21, 45, 196, 322, 546, ... - never 176.
    """
    overlapped = Partitions(8, [1, 3, 1], 20, overlapped=True)
    assert overlapped.band == [(1, 2), (4, 5), (1, 2)]
    assert sorted(overlapped.ds[1]) == [1, 2, 3]  # fig. 3.8: min_idx 1, max_idx 3
    assert (3, 8) not in overlapped.ds[1][3]  # fig. 3.9: a middle node may not end at 8
    assert overlapped.total() == 5
    assert list(overlapped) == [
        ((0, 1), (1, 6), (6, 8)),
        ((0, 2), (1, 6), (6, 8)),
        ((0, 2), (2, 6), (6, 8)),
        ((0, 2), (2, 7), (6, 8)),
        ((0, 2), (2, 7), (7, 8)),
    ]
    assert Partitions(8, [1, 3, 1], 20).total() == 3


# Table 4.1 "Total (log10)": reproduced exactly when the 1x3x448x488 output is cut
# along its 448 axis (H in NCHW) in overlapped mode; cut along 488 the totals are
# smaller (see benchmarks/search_table.py).
TABLE_4_1_TOTALS = {2: [2.5, 3.1, 3.4, 3.6], 4: [5.7, 7.4, 8.2, 9.0], 8: [9.8, 13.3, 15.5, 17.2], 16: [17.1, 21.1, 26.6, 28.7]}


@pytest.mark.parametrize("nodes,column", [(n, c) for n in (2, 4, 8, 16) for c in range(4)])
def test_table_4_1_totals(nodes: int, column: int) -> None:
    threshold = (5, 10, 15, 20)[column]
    parts = Partitions(448, [1] * nodes, threshold, overlapped=True)
    assert round(parts.log10_total(), 1) == TABLE_4_1_TOTALS[nodes][column]


def test_total_is_exact_for_astronomic_counts() -> None:
    parts = Partitions(488, [1] * 16, 20)
    total = parts.total()
    assert isinstance(total, int) and total > 10**16
    assert parts.log10_total() == pytest.approx(math.log10(total))
    for k in (0, total // 3, total - 1):
        assert parts.is_valid(parts[k])
    assert parts[0] < parts[total // 3] < parts[total - 1]


def _random_cases(count: int, seed: int) -> list[tuple[int, list[int], int, bool]]:
    rng = random.Random(seed)
    return [
        (rng.randint(1, 14), [rng.randint(1, 4) for _ in range(rng.randint(1, 4))], rng.choice([0, 5, 20, 50, 100]), rng.random() < 0.5)
        for _ in range(count)
    ]


def _brute_force(parts: Partitions) -> set[tuple[tuple[int, int], ...]]:
    intervals = [(a, b) for a in range(parts.extent + 1) for b in range(a, parts.extent + 1)]
    return {p for p in itertools.product(intervals, repeat=parts.nodes) if parts.is_valid(p)}


@pytest.mark.parametrize("extent,speeds,threshold,overlapped", _random_cases(60, 7))
def test_dictionaries_generate_exactly_the_valid_partitions(extent: int, speeds: list[int], threshold: int, overlapped: bool) -> None:
    parts = Partitions(extent, speeds, threshold, overlapped)
    listed = list(parts)
    assert len(listed) == parts.total() == len(set(listed))
    assert listed == sorted(listed)  # lexicographic order
    if parts.nodes <= 3 and extent <= 10:
        assert set(listed) == _brute_force(parts)
    else:
        assert all(parts.is_valid(p) for p in listed)
    assert [parts[k] for k in range(len(listed))] == listed  # random access is a bijection onto iter
    if listed:
        assert parts[-1] == listed[-1]
    with pytest.raises(IndexError):
        parts[len(listed)]


@pytest.mark.parametrize("extent,speeds,threshold,overlapped", _random_cases(200, 11))
def test_band_is_widened_to_the_nearest_feasible(extent: int, speeds: list[int], threshold: int, overlapped: bool) -> None:
    band = size_band(extent, speeds, threshold)
    assert sum(lo for lo, _ in band) <= extent <= sum(hi for _, hi in band)
    raw = [
        (math.ceil(Fraction(s) * (100 - threshold) / 100), min(extent, math.ceil(Fraction(s) * (100 + threshold) / 100)))
        for s in interval_sizes(extent, speeds)
    ]
    assert all(lo <= rlo and rhi <= hi for (lo, hi), (rlo, rhi) in zip(band, raw))
    # only as many sizes are added as the shortfall needs
    assert sum(hi - rhi for (_, hi), (_, rhi) in zip(band, raw)) == max(0, extent - sum(rhi for _, rhi in raw))
    if not overlapped:
        assert Partitions(extent, speeds, threshold).total() >= 1


def test_widening_example() -> None:
    # 10 over 3 equal nodes at 0 %: sizes 3, 3, 3 cannot cover 10; node 0 may grow to 4
    assert size_band(10, [1, 1, 1], 0) == [(3, 4), (3, 3), (3, 3)]
    assert [tuple(b - a for a, b in p) for p in Partitions(10, [1, 1, 1], 0)] == [(4, 3, 3)]


def test_invalid_inputs() -> None:
    with pytest.raises(ValueError):
        size_band(10, [1, 0], 10)
    with pytest.raises(ValueError):
        size_band(10, [1, 1], -5)
    with pytest.raises(ValueError):
        interval_sizes(10, [])
