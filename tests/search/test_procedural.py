"""Procedural partitions (thesis eq. 3.13–3.25): sizes, band, dictionaries, counting, random access."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest

from bbgrap.search.procedural import Partitions, interval_sizes, size_band


def test_interval_sizes_eq_3_13() -> None:
    assert interval_sizes(8, [1, 3, 1]) == [1, 4, 1]  # fig. 3.10
    assert interval_sizes(9, [1, 1, 1]) == [3, 3, 3]


def test_fig_3_10_reduction_176_to_5() -> None:
    # output 8, speeds 1:3:1, threshold 20 %: 176 partitions without the band (thesis), 5 with it
    # The text says the slow nodes' band is [0, 2]; eq. 3.14 gives ceil(1 * 0.8) = 1. We follow
    # the equation, which reproduces the thesis' count of 5.
    parts = Partitions(8, [1, 3, 1], 20, overlapped=True)
    assert parts.band == [(1, 2), (4, 5), (1, 2)]
    assert parts.total() == 5
    assert all(parts.is_valid(p) for p in parts)


def test_tables_3_6_to_3_8() -> None:
    # Tables 3.6–3.8: output 9, three equal nodes, overlapped intervals of sizes 2..4 — the band
    # of eq. 3.14–3.15 at exactly a third (ceil(3·2/3) = 2, ceil(3·4/3) = 4).
    parts = Partitions(9, [1, 1, 1], Fraction(100, 3), overlapped=True)
    assert parts.band == [(2, 4)] * 3
    assert parts.ds[0] == {0: [(0, 2), (0, 3), (0, 4)]}  # table 3.6, node 0
    assert parts.ds[1][1] == [(1, 3), (1, 4), (1, 5)] and parts.ds[1][4] == [(4, 6), (4, 7), (4, 8)]
    assert parts.ds[1][5] == [(5, 7), (5, 8)]
    assert parts.ds[2] == {5: [(5, 9)], 6: [(6, 9)], 7: [(7, 9)]}
    assert parts.de[0] == {2: [(0, 2)], 3: [(0, 3)], 4: [(0, 4)]}  # table 3.7, node 0
    assert parts.de[2] == {9: [(5, 9), (6, 9), (7, 9)]}
    assert parts.link[0] == {2: [1, 2], 3: [1, 2, 3], 4: [1, 2, 3, 4]}  # table 3.8, node 0
    assert parts.link[1][6] == [5, 6] and parts.link[1][7] == [5, 6, 7]


@pytest.mark.parametrize("seed", range(60))
def test_total_matches_enumeration_and_random_access(seed: int) -> None:
    r = random.Random(seed)
    parts = Partitions(r.randint(3, 24), [r.randint(1, 4) for _ in range(r.randint(2, 4))], r.choice([5, 10, 20, 40]),
                       overlapped=bool(seed % 3 == 0))
    every = list(parts)
    assert parts.total() == len(every) == len(set(every))
    assert [parts[k] for k in range(len(every))] == every
    assert all(parts.is_valid(p) for p in every)


def test_band_is_widened_to_be_feasible() -> None:
    band = size_band(10, [1, 1, 1], 0)  # sizes 3, 3, 3 cannot cover 10
    assert sum(hi for _, hi in band) >= 10
    assert Partitions(10, [1, 1, 1], 0).total() >= 1


@pytest.mark.parametrize("seed", range(40))
def test_candidate_positions_keep_exactly_the_partitions_cut_among_them(seed: int) -> None:
    # the search pass's candidate cuts of a wide band: the partitions are those of the band whose
    # cuts (other than 0 and the extent, where a node may be idle) are all candidates
    r = random.Random(seed)
    extent = r.randint(3, 40)
    speeds, threshold = [r.randint(1, 3) for _ in range(r.randint(2, 5))], r.choice([0, 10, 20, 40])
    positions = set(r.sample(range(1, extent), r.randint(1, extent - 1))) | {-3, extent + 2}  # outside: ignored
    among = Partitions(extent, speeds, threshold, positions=positions)
    every = [p for p in Partitions(extent, speeds, threshold) if all(s in positions or s in (0, extent) for _, s in p)]
    assert list(among) == every and among.total() == len(every)
    assert all(among.is_valid(p) for p in every)
    with pytest.raises(ValueError, match="non-overlapped"):
        Partitions(extent, speeds, threshold, overlapped=True, positions=positions)


def test_size_band_is_made_once_per_arguments() -> None:
    # the search pass asks it twice for every layer: widening a band of 16 nodes one unit at a
    # time in fractions cost a second of maxvit_t's compile; each caller still gets its own list
    from bbgrap.search import procedural

    first = size_band(7, (1.0,) * 16, 20)
    hits = procedural._size_band.cache_info().hits
    again = size_band(7, [1.0] * 16, 20)
    assert procedural._size_band.cache_info().hits == hits + 1
    assert again == first and again is not first and sum(hi for _, hi in again) >= 7
