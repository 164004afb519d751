"""The windowed rule's arithmetic (shared by Conv and the pools), checked on many
more geometries than the onnxruntime tests can afford: needs lie inside the tensor,
padding goes only to pieces at a border, and each local op yields exactly its piece."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bbgrap.ir import ShapeMap
from bbgrap.rules.window import Window, window_attrs
from tests.rules.helpers import rules_settings


@st.composite
def geometries(draw: st.DrawFn) -> tuple[Window, int, int]:
    k = draw(st.integers(1, 5))
    s = draw(st.integers(1, 3))
    d = draw(st.integers(1, 3))
    p0, p1 = draw(st.integers(0, k - 1)), draw(st.integers(0, k - 1))
    eff = (k - 1) * d + 1
    size = draw(st.integers(max(1, eff - p0 - p1), 24))
    w = Window((size,), (k,), (s,), (d,), (p0, p1), draw(st.integers(0, 1)))
    out = w.out_size(0)
    o0 = draw(st.integers(0, out - 1))
    o1 = draw(st.integers(o0 + 1, out))
    return w, o0, o1


@rules_settings(600)
@given(geometries())
def test_window_needs_and_pads(case: tuple[Window, int, int]) -> None:
    w, o0, o1 = case
    size, (k,), (s,), (d,), (p0, p1) = w.in_sizes[0], w.kernel, w.strides, w.dilations, w.pads
    out = w.out_size(0)
    (iv,), attrs = window_attrs(w, ShapeMap.box([0, 0, o0], [1, 1, o1]))
    b, e = attrs["pads"]
    # needs are clipped to the tensor and never empty
    assert 0 <= iv.start < iv.stop <= size
    # local padding is part of the original, at a border only
    assert 0 <= b <= p0 and 0 <= e <= p1
    if b > 0:
        assert iv.start == 0
    if e > 0:
        # the piece ending at the output's end keeps the original end padding even when
        # its last window stops short of the border (harmless: no window reads it)
        assert iv.stop == size or (o1 == out and e == p1)
    if o1 < out:
        eff = (k - 1) * d + 1
        assert e == max(0, (o1 - 1) * s - p0 + eff - size)
    # local windows sit where the whole op's windows do, and there are exactly o1 - o0
    assert iv.start - b == o0 * s - p0
    local = Window((len(iv),), (k,), (s,), (d,), (b, e), w.ceil_mode)
    assert local.out_size(0) == o1 - o0
    # the last local window reads only the needed input plus local padding
    last_stop = (o1 - o0 - 1) * s + (k - 1) * d + 1
    assert last_stop <= b + len(iv) + e or (w.ceil_mode and o1 == out)


@rules_settings(300)
@given(st.integers(1, 24), st.integers(1, 5), st.integers(1, 3), st.integers(1, 3), st.data())
def test_pieces_cover_output_once(size: int, k: int, s: int, d: int, data: st.DataObject) -> None:
    """Consecutive pieces read overlapping (halo) inputs, but together cover every
    input element that the whole op reads."""
    p0, p1 = data.draw(st.integers(0, k - 1)), data.draw(st.integers(0, k - 1))
    eff = (k - 1) * d + 1
    if size + p0 + p1 < eff:
        return
    w = Window((size,), (k,), (s,), (d,), (p0, p1), data.draw(st.integers(0, 1)))
    out = w.out_size(0)
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, out - 1)), max_size=3))) if out > 1 else []
    bounds = [0] + [c for c in cuts if 0 < c < out] + [out]
    whole, _ = window_attrs(w, ShapeMap.box([0, 0, 0], [1, 1, out]))
    needs = [window_attrs(w, ShapeMap.box([0, 0, a], [1, 1, b]))[0][0] for a, b in zip(bounds, bounds[1:])]
    assert needs[0].start == whole[0].start and needs[-1].stop == whole[0].stop
    for left, right in zip(needs, needs[1:]):
        assert left.start <= right.start and left.stop <= right.stop
