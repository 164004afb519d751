"""Interval and ShapeMap algebra, checked against explicit sets of points."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from bbgrap.ir import Interval, ShapeMap


def points(region: ShapeMap) -> set[tuple[int, ...]]:
    axes = [[x for iv in a for x in range(iv.start, iv.stop)] for a in region.axes]
    return set(itertools.product(*axes))


@st.composite
def boxes(draw, rank: int = 2, size: int = 7) -> ShapeMap:
    starts = [draw(st.integers(0, size - 1)) for _ in range(rank)]
    stops = [draw(st.integers(s, size)) for s in starts]
    return ShapeMap.box(starts, stops)


@st.composite
def regions(draw, rank: int = 2, size: int = 7) -> ShapeMap:
    """Unions of up to three intervals per axis, unsorted, touching or empty ones included."""
    axes = []
    for _ in range(rank):
        ivs = []
        for _ in range(draw(st.integers(0, 3))):
            lo = draw(st.integers(0, size))
            ivs.append(Interval(lo, draw(st.integers(lo, size))))
        axes.append(tuple(ivs))
    return ShapeMap(tuple(axes))


@settings(max_examples=300, deadline=None)
@given(regions(), st.one_of(regions(), boxes()))
def test_general_regions_match_point_sets(a: ShapeMap, b: ShapeMap) -> None:
    # the general path, and boxes meeting non-boxes (boxes alone take a faster path)
    assert points(a.intersect(b)) == points(a) & points(b) == points(b.intersect(a))
    assert a.overlaps(b) == bool(points(a) & points(b)) == b.overlaps(a)
    assert a.volume == len(points(a)) and a.empty == (not points(a))
    assert a.contains(b) == (points(b) <= points(a))
    assert all(len(ax) == 1 for ax in a.axes) == a.is_box
    same = ShapeMap(tuple(tuple(iv for iv in ax) for ax in a.axes))
    assert same == a and hash(same) == hash(a)


@settings(max_examples=200, deadline=None)
@given(boxes(), boxes())
def test_set_operations_match_point_sets(a: ShapeMap, b: ShapeMap) -> None:
    assert points(a.intersect(b)) == points(a) & points(b)
    assert a.overlaps(b) == bool(points(a) & points(b))
    assert a.volume == len(points(a))
    assert a.contains(b) == (points(b) <= points(a))
    diff = a.difference(b)
    got = [points(d) for d in diff]
    assert set().union(*got) == points(a) - points(b)
    assert sum(len(g) for g in got) == len(points(a) - points(b)), "difference pieces overlap"
    hull = a.hull(b)
    assert hull.contains(a) and hull.contains(b)


@settings(max_examples=100, deadline=None)
@given(boxes(), st.integers(0, 1), st.integers(0, 7), st.integers(0, 7))
def test_union_along_one_axis_is_exact(a: ShapeMap, axis: int, lo: int, hi: int) -> None:
    lo, hi = min(lo, hi), max(lo, hi)
    b = a.with_axis(axis, Interval(lo, hi))
    if a.empty or b.empty:
        return
    u = a.union(b)
    assert points(u) == points(a) | points(b)


def test_multi_range_axis() -> None:
    r = ShapeMap(((Interval(0, 2), Interval(4, 6)), (Interval(0, 3),)))
    assert r.volume == 12 and not r.is_box
    assert r.bounding_box() == ShapeMap.box([0, 0], [6, 3])
    assert ShapeMap(((Interval(0, 2), Interval(2, 4)),)) == ShapeMap.box([0], [4])


def test_relative_and_slices() -> None:
    outer = ShapeMap.box([0, 2, 4], [1, 6, 9])
    inner = ShapeMap.box([0, 3, 5], [1, 5, 9])
    assert inner.relative_to(outer) == ShapeMap.box([0, 1, 1], [1, 3, 5])
    assert inner.slices() == (slice(0, 1), slice(3, 5), slice(5, 9))


def test_a_region_makes_its_key_once() -> None:
    # lowering and emit name every local value by its region's key, half a million times for
    # maxvit_t on 16 nodes: the text is made once per region and kept on it
    from bbgrap.ir import Interval, ShapeMap

    box = ShapeMap.box([0, 0, 3, 0], [1, 64, 10, 56])
    assert box.key() == "0:1,0:64,3:10,0:56" and box.key() is box.key()
    union = ShapeMap(((Interval(0, 1), Interval(3, 4)), (Interval(0, 2),)))
    assert union.key() == "0:1+3:4,0:2" and union.key() is union.key()
    assert ShapeMap.empty_like(2).key() == "empty"
    assert box == ShapeMap.box([0, 0, 3, 0], [1, 64, 10, 56]) and hash(box) == hash(ShapeMap.box([0, 0, 3, 0], [1, 64, 10, 56]))
