"""Indexing ops: Slice (and Split, imported as one Slice per output), Gather, Pad (constant,
reflect, edge and wrap modes), and Resize by integer factors (nearest; linear and cubic, whose
pieces read a halo).

Each output element is one input element (or a pad value) at a position known at compile
time (for Gather: along its other axes), so every output axis can be cut: an output interval
maps to the hull of the input positions it reads, and the local op gets its starts, indices,
pads or sizes shifted to the origin of that hull (`Local.inputs`: from opset 10 on they are
inputs, not attributes). Where the local op cannot stop at the piece's edge (a reflect Pad
mirrors about the tensor's border row, so its piece starts there; nearest Resize makes whole
blocks of its factor) it computes more than the piece, and all it computes is exact: a node
holds it and reads from it (bbgrap/movement.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from bbgrap.ir import Graph, Interval, Layer, ShapeMap, Tensor
from bbgrap.rules.base import Layout, Local, OpTraits, RegionRule, RuleRegistry, all_axes, full, is_default_domain, shape, whole


def _constant(graph: Graph, layer: Layer, k: int) -> np.ndarray | None:
    """Constant input k of the layer (None: absent or computed from the data)."""
    if len(layer.inputs) <= k or not layer.inputs[k]:
        return None
    return graph.constants.get(layer.inputs[k])


def _normalised(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _resized_axes(layer: Layer, rank: int) -> list[int]:
    """The axes a Resize's roi, scales and sizes list, in their order: its `axes` attribute
    (opset 18), else all of them."""
    return [_normalised(int(a), rank) for a in layer.attrs.get("axes", range(rank))]


def _given_scales(layer: Layer, graph: Graph) -> dict[int, float] | None:
    """A Resize's scale input, per axis it lists (the scale onnxruntime maps coordinates with);
    None where it has none (sizes instead, or an empty one) or computes it from the data."""
    scales = _constant(graph, layer, 2 if graph.opsets.get("", 13) >= 11 else 1)
    if scales is None or not scales.size:
        return None
    rank = len(shape(graph, layer.inputs[0]))
    return {a: float(scales.reshape(-1)[j]) for j, a in enumerate(_resized_axes(layer, rank))}


@dataclass(frozen=True)
class SliceSpec:
    """A Slice's parameters: `axes[j]` is sliced from `starts[j]` to `ends[j]` by `steps[j]`
    (as given, before ONNX's clamping); `dtype` is that of the starts/ends inputs."""

    starts: tuple[int, ...]
    ends: tuple[int, ...]
    axes: tuple[int, ...]
    steps: tuple[int, ...]
    dtype: np.dtype

    def positions(self, dims: tuple[int, ...]) -> list[np.ndarray]:
        """For every data axis, the input position of each output index: ONNX's clamping,
        negative bounds count from the end, then starts clip to [0, d] ([0, d−1] stepping
        back), ends to [0, d] ([−1, d−1] stepping back)."""
        out = [np.arange(d) for d in dims]
        for a, start, end, step in zip(self.axes, self.starts, self.ends, self.steps):
            d = dims[a]
            start, end = start + d if start < 0 else start, end + d if end < 0 else end
            if step > 0:
                out[a] = np.arange(min(max(start, 0), d), min(max(end, 0), d), step)
            else:
                out[a] = np.arange(min(max(start, 0), d - 1), min(max(end, -1), d - 1), step)
        return out


def slice_spec(layer: Layer, graph: Graph) -> SliceSpec | None:
    """The Slice's parameters, None where they are not compile-time constants."""
    rank = len(shape(graph, layer.inputs[0]))
    if graph.opsets.get("", 13) < 10:
        starts, ends = layer.attrs["starts"], layer.attrs["ends"]
        axes = layer.attrs.get("axes", list(range(len(starts))))
        steps: list[int] = [1] * len(starts)
        dtype = np.dtype(np.int64)
    else:
        values = [_constant(graph, layer, k) for k in range(1, 5)]
        if values[0] is None or values[1] is None or any(v is None and len(layer.inputs) > k + 1 and layer.inputs[k + 1]
                                                          for k, v in enumerate(values)):
            return None
        starts, ends = values[0].reshape(-1).tolist(), values[1].reshape(-1).tolist()
        axes = values[2].reshape(-1).tolist() if values[2] is not None else list(range(len(starts)))
        steps = values[3].reshape(-1).tolist() if values[3] is not None else [1] * len(starts)
        dtype = values[0].dtype
    return SliceSpec(tuple(int(v) for v in starts), tuple(int(v) for v in ends),
                     tuple(_normalised(int(a), rank) for a in axes), tuple(int(v) for v in steps), np.dtype(dtype))


class SliceRule(RegionRule):
    """Y[.., i, ..] = X[.., start + step·i, ..] along each sliced axis (any step, negative too),
    Y = X along the others: output interval [o0, o1) reads the input hull of positions
    start + step·o0 … start + step·(o1−1), and the local Slice starts and ends relative to it."""

    def axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        spec = slice_spec(layer, graph)
        if spec is None:
            return frozenset()
        counts = tuple(len(p) for p in spec.positions(shape(graph, layer.inputs[0])))
        return all_axes(layer, graph) if counts == shape(graph, layer.outputs[0]) else frozenset()

    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        spec = slice_spec(layer, graph)
        if spec is None:  # starts or ends from the data: whole only
            return whole(layer, graph, out)
        positions = spec.positions(shape(graph, layer.inputs[0]))
        need = full(graph, layer.inputs[0])
        starts, ends = [], []
        for a, step in zip(spec.axes, spec.steps):
            iv = out.interval(a)
            first, last = int(positions[a][iv.start]), int(positions[a][iv.stop - 1])
            lo = min(first, last)
            need = need.with_axis(a, Interval(lo, max(first, last) + 1))
            end = last - lo + (1 if step > 0 else -1)
            starts.append(first - lo)
            ends.append(end if end >= 0 else int(np.iinfo(spec.dtype).min))  # before the first element
        for a in range(out.rank):
            if a not in spec.axes:
                need = need.with_axis(a, out.interval(a))
        if graph.opsets.get("", 13) < 10:
            return Local((need,), out, {"starts": starts, "ends": ends})
        needs: list[ShapeMap | None] = [need, None, None]
        needs += [full(graph, t) if t else None for t in layer.inputs[3:]]
        return Local(tuple(needs), out, inputs={1: np.array(starts, spec.dtype), 2: np.array(ends, spec.dtype)})


def split_as_slices(layer: Layer, tensors: Mapping[str, Tensor], opset: int) -> tuple[list[Layer], dict[str, np.ndarray]] | None:
    """A Split as the frontend imports it: one Slice layer per output (`{name}/{k}`, producing
    the same tensor), and the constants of their starts, ends and axes. The IR cuts one output
    per layer; as Slices, each output of a Split is cut on its own. The outputs' extents along
    the axis are the split sizes (from the static shapes in `tensors`, however the sizes were
    given). None for any other layer, and for a Split whose outputs' shapes are unknown."""
    if layer.op_type != "Split" or not is_default_domain(layer.domain):
        return None
    if not all(t in tensors for t in layer.outputs if t):
        return None
    rank = len(tensors[layer.inputs[0]].shape)
    axis = _normalised(int(layer.attrs.get("axis", 0)), rank)
    slices: list[Layer] = []
    constants: dict[str, np.ndarray] = {}
    start = 0
    for k, t in enumerate(layer.outputs):
        if not t:
            continue
        stop = start + tensors[t].shape[axis]
        name = f"{layer.name}/{k}"
        if opset < 10:
            slices.append(Layer(name, "Slice", "", {"starts": [start], "ends": [stop], "axes": [axis]}, layer.inputs[:1], (t,)))
        else:
            names = tuple(f"{name}/{what}" for what in ("starts", "ends", "axes"))
            constants.update(zip(names, (np.array([v], np.int64) for v in (start, stop, axis))))
            slices.append(Layer(name, "Slice", "", {}, layer.inputs[:1] + names, (t,)))
        start = stop
    return slices, constants


class GatherRule(RegionRule):
    """Gather along `axis`: Y[p, j, q] = X[p, I[j], q] (p the axes before `axis`, j the indices'
    axes, q the rest). Every output axis can be cut: p and q pass through to X, a cut of j keeps
    those indices. With constant indices the data's `axis` is read over the hull
    [min I[j], max I[j]] and the local indices are shifted to it (a rank-0 index, ViT's `x[:, 0]`
    or `qkv[0]`, reads one row); indices computed from the data (an embedding lookup) are read
    over the cut, and the data's `axis` whole."""

    def axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        return all_axes(layer, graph)

    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        dims = shape(graph, layer.inputs[0])
        axis = _normalised(int(layer.attrs.get("axis", 0)), len(dims))
        q = len(shape(graph, layer.inputs[1]))
        need = full(graph, layer.inputs[0])
        for a in range(len(dims)):
            if a != axis:
                need = need.with_axis(a, out.interval(a if a < axis else a + q - 1))
        indices = _constant(graph, layer, 1)
        if indices is None:
            return Local((need, ShapeMap(out.axes[axis:axis + q])), out)
        mine = indices[out.slices()[axis:axis + q]] if q else indices
        mine = np.where(mine < 0, mine + dims[axis], mine)
        lo, hi = int(mine.min()), int(mine.max()) + 1
        return Local((need.with_axis(axis, Interval(lo, hi)), None), out, inputs={1: np.asarray(mine - lo, dtype=indices.dtype)})


PAD_MODES = ("constant", "reflect", "edge", "wrap")


def pad_sources(mode: str, rows: np.ndarray, p0: int, size: int) -> np.ndarray:
    """The input row each output row of a reflect, edge or wrap Pad copies, along an axis of
    `size` rows with `p0` rows of padding before them: j = i − p0 inside the data; outside it
    reflect mirrors about the border row (−j before, 2(size − 1) − j after; one reflection, as
    pads of at most size − 1 make it), edge repeats the border row, wrap takes j mod size."""
    j = rows - p0
    if mode == "reflect":
        j = np.abs(j)
        return np.where(j > size - 1, 2 * (size - 1) - j, j)
    if mode == "edge":
        return np.clip(j, 0, size - 1)
    return np.mod(j, size)


def _pads_attribute(graph: Graph) -> bool:
    """Pad of opset 10 and before: pads and value as attributes, not inputs."""
    return graph.opsets.get("", 13) < 11


class PadRule(RegionRule):
    """Pad, along every axis: from opset 11 pads, the value and (from 18) axes are inputs; before,
    pads and the value are attributes.

    Constant mode: Y[i] = X[i − p0] inside the data, the value outside. Output interval
    [o0, o1) reads X[o0 − p0, o1 − p0) clipped to the data; the local pads are what of the
    interval lies outside it (padding only where the piece touches a border). A piece wholly in
    the padding reads the data's nearest element and removes it again with a negative pad, so no
    piece reads nothing.

    Reflect, edge and wrap modes (pads ≥ 0; reflect's at most size − 1, as onnxruntime requires;
    wrap is opset 19's): Y[i] = X[σ(i)] with σ of `pad_sources`, axis by axis (the padding of
    several axes is the product of theirs). A piece [a, b) of an axis of n rows padded (p0, p1)
    reads [lo, hi) with lo = min σ over the piece, or 0 where the piece has rows of the begin
    padding (a < p0); hi = max σ + 1, or n where it has rows of the end padding (b > p0 + n);
    wrap reads the whole axis where it has either. Its local op is the same Pad of X[lo, hi)
    with pads (q0, q1) = (max(p0 − a, 0), max(b − p0 − n, 0)), which computes output rows
    [c0, c1): c0 = a where a < p0, else p0 + lo; c1 = b where b > p0 + n, else p0 + hi
    (a superset of [a, b) by at most the rows a mirror needs beside it, all of them exact).

    Proof that every computed row is exact: local output row k is global row i = c0 + k, and in
    both cases of c0 its local source index is j' = k − q0 = i − p0 − lo = j − lo (j = i − p0, the
    global one). (1) Where 0 ≤ j < n, j lies in [lo, hi) (the rows of [c0, c1) inside the data
    run from p0 + lo, or from p0 with lo = 0, to p0 + hi, or to p0 + n with hi = n), and the local
    op copies X[lo + j'] = X[j]. (2) Where j < 0, a < p0 so lo = 0 and j' = j: the local op
    mirrors about its row 0, which is X's row 0: reflect gives X[−j], and −j ≤ p0 − a = σ(a) < hi,
    inside the piece; edge gives X[0]; wrap, with the whole axis, X[j mod n]. (3) Where j ≥ n,
    hi = n and the local piece ends at X's last row: reflect gives local row 2(m − 1) − j' with
    m = n − lo, i.e. X[2(n − 1) − j], and 2(n − 1) − j ≥ σ(b − 1) ≥ lo keeps it inside the piece
    (the rows of [c0, c1) past the data are those of [a, b)); edge gives X[n − 1]; wrap X[j mod n].
    The local pads are legal: reflect's q0 ≤ σ(a) ≤ m − 1 and q1 ≤ n − 1 − σ(b − 1) ≤ m − 1.
    An edge piece wholly inside one padding computes just itself: the border row, padded by
    b − a − 1 on the padding's side (every row of it is that row). A negative pad in these modes
    crops before the others pad (onnxruntime's order: reflect mirrors about the cropped border):
    such an axis is the same rule on X' = X[c0, n − c1), c0 = max(−p0, 0), c1 = max(−p1, 0),
    padded (max(p0, 0), max(p1, 0)), its rows read shifted by c0; reflect's pads at most
    n − c0 − c1 − 1.
    """

    @staticmethod
    def _cropped(pads: tuple[int, int], size: int) -> tuple[int, int, int]:
        """(rows a negative pad crops before the data, non-negative begin pad, rows left) of an
        axis of `size` rows padded `pads` in reflect, edge or wrap mode (class docstring)."""
        p0, p1 = pads
        crop = max(-p0, 0)
        return crop, max(p0, 0), size - crop - max(-p1, 0)

    def _pads(self, layer: Layer, graph: Graph) -> list[tuple[int, int]] | None:
        """(begin, end) pads of every data axis; None where the rule does not apply."""
        mode = layer.attrs.get("mode", "constant")
        if mode not in PAD_MODES:
            return None
        pads: np.ndarray | None
        if _pads_attribute(graph):
            pads, axes = np.array(layer.attrs.get("pads", []), dtype=np.int64), None
        else:
            pads, axes = _constant(graph, layer, 1), _constant(graph, layer, 3)
        if pads is None or (axes is None and len(layer.inputs) > 3 and layer.inputs[3]):
            return None
        dims = shape(graph, layer.inputs[0])
        rank = len(dims)
        listed = [_normalised(int(a), rank) for a in axes.reshape(-1)] if axes is not None else list(range(rank))
        flat = [int(v) for v in pads.reshape(-1)]
        out = [(0, 0)] * rank
        for j, a in enumerate(listed):
            out[a] = (flat[j], flat[j + len(listed)])
        if mode != "constant":
            for (p0, p1), size in zip(out, dims):
                kept = self._cropped((p0, p1), size)[2]
                padding = max(p0, 0) + max(p1, 0)
                if kept < 0 or (kept == 0 and padding > 0) or (mode == "reflect" and max(p0, p1) > kept - 1):
                    return None
        return out

    def axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        return all_axes(layer, graph) if self._pads(layer, graph) is not None else frozenset()

    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        pads = self._pads(layer, graph)
        if pads is None:  # pads from the data (or a mode the rule does not cut): whole only
            return whole(layer, graph, out)
        mode = layer.attrs.get("mode", "constant")
        dims = shape(graph, layer.inputs[0])
        need, computes = full(graph, layer.inputs[0]), out
        begins, ends = [], []
        for a, (axis_pads, size) in enumerate(zip(pads, dims)):
            iv = out.interval(a)
            p0 = axis_pads[0]
            if mode == "constant":
                want = Interval(iv.start - p0, iv.stop - p0)  # in data coordinates, may overhang
                lo = min(max(want.start, 0), size - 1)
                hi = max(min(want.stop, size), lo + 1)
                need = need.with_axis(a, Interval(lo, hi))
                begins.append(lo - want.start)
                ends.append(want.stop - hi)
                continue
            crop, p0, size = self._cropped(axis_pads, size)  # the rule on X[crop, crop + size)
            before, after = iv.start < p0, iv.stop > p0 + size
            if mode == "edge" and (iv.stop <= p0 or iv.start >= p0 + size):  # copies of one border row
                row = crop + (0 if iv.stop <= p0 else size - 1)
                need = need.with_axis(a, Interval(row, row + 1))
                begins.append(len(iv) - 1 if iv.stop <= p0 else 0)
                ends.append(0 if iv.stop <= p0 else len(iv) - 1)
                continue
            sources = pad_sources(mode, np.arange(iv.start, iv.stop), p0, size)
            lo, hi = int(sources.min()), int(sources.max()) + 1
            if mode == "wrap" and (before or after):
                lo, hi = 0, size
            lo, hi = (0 if before else lo), (size if after else hi)
            need = need.with_axis(a, Interval(crop + lo, crop + hi))
            computes = computes.with_axis(a, Interval(iv.start if before else p0 + lo, iv.stop if after else p0 + hi))
            begins.append(max(p0 - iv.start, 0))
            ends.append(max(iv.stop - p0 - size, 0))
        given = _constant(graph, layer, 3)
        listed = list(range(len(dims))) if given is None else [_normalised(int(a), len(dims)) for a in given.reshape(-1)]
        local_pads = [begins[a] for a in listed] + [ends[a] for a in listed]
        if _pads_attribute(graph):
            return Local((need,), computes, attrs={"pads": local_pads})
        pads_value = _constant(graph, layer, 1)
        assert pads_value is not None
        needs: list[ShapeMap | None] = [need, None]
        needs += [full(graph, t) if t else None for t in layer.inputs[2:]]
        return Local(tuple(needs), computes, inputs={1: np.array(local_pads, dtype=pads_value.dtype)})


NEAREST_MODES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "round_prefer_floor": lambda x: np.ceil(x - 0.5),
    "round_prefer_ceil": lambda x: np.floor(x + 0.5),
    "floor": np.floor,
    "ceil": np.ceil,
}


@dataclass(frozen=True)
class _Grid:
    """Where a Resize's output rows along one axis read its `rows` input rows: coordinate
    x(y) = origin + slope·y (ResizeRule's affine case)."""

    origin: float
    slope: float
    rows: int

    def at(self, y: int) -> float:
        return self.origin + self.slope * y


LAST_ROW_SHORT = 2.0 ** -22  # of a row: how far short of the crop's last row a coordinate on it is aimed


class ResizeRule(RegionRule):
    """Resize: nearest, linear and cubic upsampling by integer factors along every axis, any mode
    along the axes it leaves as they are.

    Nearest by an integer factor s per axis (upsampling, as FPN and U-Net heads export
    `interpolate(scale_factor=2)`), where the coordinate transform and rounding make
    Y[x] = X[x // s] (half_pixel, pytorch_half_pixel and asymmetric with the default rounding):
    output interval [o0, o1) reads X[o0 // s, ⌈o1 / s⌉) and computes whole blocks of s, which the
    local op (same scales; sizes, where given, those of its block) reproduces.

    Linear and cubic upsampling by an integer factor s per axis, in the half_pixel,
    pytorch_half_pixel and asymmetric transforms, is cut along every axis with a halo. Output row
    y blends the input rows around its coordinate x(y) = (y + 0.5)/s − 0.5 (y/s asymmetric):
    ⌊x⌋ and ⌊x⌋ + 1 (linear), ⌊x⌋ − 1 to ⌊x⌋ + 2 (cubic), clamped to the input. So output rows
    [o0, o1) read input rows [⌊x(o0)⌋ − b, ⌊x(o1 − 1)⌋ + a + 1) (b, a = 0, 1 linear; 1, 2 cubic),
    clipped to the input. The same Resize of those m rows gives s·m rows whose coordinates are
    the whole op's shifted by the crop's start (the offset is a multiple of s), so the piece's
    own rows blend the same taps with the same weights (to a rounding of the coordinate). Its
    first and last rows do not: the local op clamps at the crop's edges where the whole op reads
    on. It emits them (`Local.emits`) and lowering crops them away before the node holds the
    output, so nothing reads them.

    Linear and cubic Resize whose every output row maps inside the input, 0 ≤ x(y) ≤ n − 1 on each
    axis (align_corners by any factor; downsampling, and any factor whose first and last rows do,
    in half_pixel, pytorch_half_pixel and asymmetric), is cut along every axis through an affine
    grid (`_Grid`): x(y) = x0 + d·y, and no output row's coordinate is clamped. Output rows
    [o0, o1) read input rows [⌊x(o0)⌋ − b − 1, ⌊x(o1 − 1)⌋ + a + 2), clipped: the taps and one row
    more on each side, so that a local coordinate a rounding away from the whole op's never leaves
    the crop nor reads a clamped tap the whole op does not (at the input's own edges both clamp
    alike; cubic's exclude_outside too). The local op is the same Resize in tf_crop_and_resize,
    whose roi places any affine grid on its crop [i0, i1) of L rows: with M output rows,
    x' = roi0·(L − 1) + y'·(roi1 − roi0)(L − 1)/(M − 1), so roi0 = (x(o0) − i0)/(L − 1) and
    roi1 = roi0 + d(M − 1)/(L − 1) give x' = x(o0 + y') − i0: the whole op's taps and weights (to a
    rounding of the coordinate). onnxruntime copies its input where every axis keeps its length,
    roi or not, so a resized axis whose crop has as many rows as the piece reads one row more, or,
    at the input's extent, emits one output row more (`Local.emits`). A coordinate exactly on the
    input's last row is aimed 2⁻²² of a row short of it (a rounding above would extrapolate).

    Any other Resize (linear and cubic upsampling by a non-integer factor in the half-pixel
    transforms, whose first rows clamp; antialiased downsampling; nearest by factors its rounding
    does not map to whole blocks; half_pixel_symmetric and tf_crop_and_resize) is cut along its
    unit axes: those it keeps with a scale of exactly 1 (a scale input of 1.0, or sizes equal to
    the input's with the stretch policy): batch and channels of an NCHW upsampling, and H or W
    where only the other is scaled. Along such an axis every transform maps output row y to
    input coordinate x = y, exactly in floating point ((y + 0.5)/1 − 0.5, y·(n − 1)/(n − 1), y/1;
    0 for one row), so the element blends the taps of row y with weight 1 and the others with
    weight 0 (linear's clamped last row weighs its one tap 0.5 + 0.5; the cubic kernel is 1, 0,
    0, 0 at 0, ±1, 2): a piece reads its own rows, and its local op (same attributes; sizes,
    where given, those of the piece) computes exactly them. (No crop reproduces the grid of a
    resized axis in the whole op's own transform: align_corners ties the slope to the lengths,
    (n − 1)/(s·n − 1); a non-integer factor gives a crop a grid that the whole op's does not
    contain. Hence tf_crop_and_resize above.) tests/rules/test_indexing.py checks both facts of
    the halo rule: a crop's edge rows differ, and the piece's own rows are exact.
    """

    def _upsampling(self, layer: Layer, graph: Graph) -> tuple[tuple[int, ...], str] | None:
        """(the integer factor of every axis, the coordinate transform) of a Resize that upsamples
        each axis by a constant integer factor (1 included) in a transform that maps output row y
        to input coordinate (y + 0.5)/s − 0.5 or y/s; None for any other Resize."""
        attrs = layer.attrs
        if attrs.get("keep_aspect_ratio_policy", "stretch") != "stretch":
            return None
        in_dims, out_dims = shape(graph, layer.inputs[0]), shape(graph, layer.outputs[0])
        if any(o % i for i, o in zip(in_dims, out_dims)):
            return None
        factors = tuple(o // i for i, o in zip(in_dims, out_dims))
        given = _given_scales(layer, graph)
        if given is not None:
            if any(s != factors[a] for a, s in given.items()):
                return None  # e.g. a scale of 1.999 whose output size rounds to an integer factor
        elif _constant(graph, layer, 3) is None:
            return None  # scales or sizes computed from the data
        modern = graph.opsets.get("", 13) >= 11  # Resize-10 maps x to x / scale
        transform = attrs.get("coordinate_transformation_mode", "half_pixel" if modern else "asymmetric")
        if transform not in ("half_pixel", "pytorch_half_pixel", "asymmetric"):
            return None
        return factors, transform

    def _blend(self, layer: Layer, graph: Graph) -> tuple[tuple[int, ...], str] | None:
        """(factors, transform) of a linear or cubic upsampling that the halo rule cuts (class
        docstring), None where it does not apply."""
        if layer.attrs.get("mode", "nearest") not in ("linear", "cubic"):
            return None
        return self._upsampling(layer, graph)

    def _factors(self, layer: Layer, graph: Graph) -> tuple[int, ...] | None:
        """The integer factor of every axis of a nearest Resize, None where that rule does not apply."""
        attrs = layer.attrs
        found = self._upsampling(layer, graph) if attrs.get("mode", "nearest") == "nearest" else None
        if found is None:
            return None
        factors, transform = found
        out_dims = shape(graph, layer.outputs[0])
        modern = graph.opsets.get("", 13) >= 11  # Resize-10 floors x / scale when upsampling
        rounding = NEAREST_MODES.get(attrs.get("nearest_mode", "round_prefer_floor" if modern else "floor"))
        if rounding is None:
            return None
        for s, o in zip(factors, out_dims):
            x = np.arange(o, dtype=np.float64)
            origin = x / s if transform == "asymmetric" else (x + 0.5) / s - 0.5
            if transform == "pytorch_half_pixel" and o == 1:
                origin = np.zeros_like(x)
            if not np.array_equal(np.clip(rounding(origin), 0, o // s - 1), x // s):
                return None
        return factors

    def _grids(self, layer: Layer, graph: Graph) -> tuple[_Grid, ...] | None:
        """Each axis' grid of a linear or cubic Resize whose every output row maps inside the input
        (class docstring), an axis it keeps whole with a scale of 1 the identity, and only such an
        axis of unchanged length; None where that case does not apply."""
        attrs = layer.attrs
        if attrs.get("mode", "nearest") not in ("linear", "cubic") or graph.opsets.get("", 13) < 11:
            return None
        if int(attrs.get("antialias", 0)) or attrs.get("keep_aspect_ratio_policy", "stretch") != "stretch":
            return None
        transform = attrs.get("coordinate_transformation_mode", "half_pixel")
        if transform not in ("half_pixel", "pytorch_half_pixel", "asymmetric", "align_corners"):
            return None
        in_dims, out_dims = shape(graph, layer.inputs[0]), shape(graph, layer.outputs[0])
        given = _given_scales(layer, graph)
        if given is not None:
            factors = [given.get(a, 1.0) for a in range(len(in_dims))]
        elif _constant(graph, layer, 3) is not None:
            factors = [o / i if i else 1.0 for i, o in zip(in_dims, out_dims)]
        else:
            return None  # scales or sizes computed from the data
        grids = []
        for n, m, s in zip(in_dims, out_dims, factors):
            if n == m and s == 1.0:
                grids.append(_Grid(0.0, 1.0, n))
                continue
            if n == m or m == 0 or s <= 0:
                return None  # a resized axis of unchanged length: its crops could not differ from their pieces
            if transform == "align_corners":
                grid = _Grid(0.0, (n - 1) / (m - 1) if m > 1 else 0.0, n)
            elif transform == "asymmetric":
                grid = _Grid(0.0, 1.0 / s, n)
            elif transform == "pytorch_half_pixel" and m == 1:
                grid = _Grid(0.0, 0.0, n)
            else:
                grid = _Grid(0.5 / s - 0.5, 1.0 / s, n)
            if grid.at(0) < 0 or grid.at(m - 1) > n - 1:
                return None  # the whole op clamps those rows' coordinates, which no roi does
            grids.append(grid)
        return tuple(grids)

    def _grid_local(self, layer: Layer, graph: Graph, out: ShapeMap, grids: tuple[_Grid, ...]) -> Local:
        """A piece of an affine-grid Resize (class docstring): the input rows it reads, and a
        tf_crop_and_resize with the roi (per listed axis its start, then its end) and sizes of the
        output rows it emits."""
        before, after = (0, 1) if layer.attrs.get("mode") == "linear" else (1, 2)
        out_dims = shape(graph, layer.outputs[0])
        need, emits = full(graph, layer.inputs[0]), out
        roi: list[tuple[float, float]] = []
        for a, grid in enumerate(grids):
            kept = out.interval(a)
            n, m = grid.rows, out_dims[a]
            if n == m:  # kept whole at a scale of 1 (`_grids`), x(y) = y: the piece reads its own rows,
                need = need.with_axis(a, kept)  # and roi (0, 1) maps them onto themselves exactly
                roi.append((0.0, 1.0 if len(kept) > 1 else 0.0))
                continue
            rows = Interval(max(0, int(np.floor(grid.at(kept.start))) - before - 1),
                            min(n, int(np.floor(grid.at(kept.stop - 1))) + after + 2))
            emitted = kept
            if len(rows) == len(kept):  # onnxruntime would copy the crop: read or emit a row more
                if rows.start > 0 or rows.stop < n:
                    rows = rows.with_neighbour()
                else:  # all n rows, and n ≠ m: there is an output row beside the piece
                    emitted = kept.with_neighbour()
            need, emits = need.with_axis(a, rows), emits.with_axis(a, emitted)
            length, count = len(rows), len(emitted)
            first, last = grid.at(emitted.start) - rows.start, grid.at(emitted.stop - 1) - rows.start
            if length == 1:
                roi.append((0.0, 0.0))
                continue
            if last >= length - 1:  # exactly on the last row (class docstring)
                last = (length - 1) * (1.0 - LAST_ROW_SHORT)
                first = min(first, last)
            if count == 1:
                roi.append((first / (length - 1), first / (length - 1)))
            else:
                roi.append((first / (length - 1), last / (length - 1)))
        listed = _resized_axes(layer, out.rank)
        inputs: dict[int, np.ndarray] = {1: np.array([roi[a][0] for a in listed] + [roi[a][1] for a in listed], np.float32),
                                         2: np.zeros(0, np.float32), 3: np.array([emits.shape[a] for a in listed], np.int64)}
        return Local((need, *(None for _ in layer.inputs[1:])), out, {"coordinate_transformation_mode": "tf_crop_and_resize"},
                     inputs, None if emits == out else emits)

    def _unit_axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        """The axes this Resize keeps with a scale of exactly 1 (see the class docstring)."""
        attrs = layer.attrs
        modern = graph.opsets.get("", 13) >= 11
        if attrs.get("coordinate_transformation_mode", "half_pixel" if modern else "asymmetric") == "tf_crop_and_resize":
            return frozenset()
        in_dims, out_dims = shape(graph, layer.inputs[0]), shape(graph, layer.outputs[0])
        unit = {a for a, (i, o) in enumerate(zip(in_dims, out_dims)) if i == o}
        given = _given_scales(layer, graph)
        if given is not None:
            unit -= {a for a, s in given.items() if s != 1.0}
        elif not modern or _constant(graph, layer, 3) is None:
            return frozenset()  # scales or sizes computed from the data
        elif attrs.get("keep_aspect_ratio_policy", "stretch") != "stretch":
            return frozenset()  # one scale for all the axes sizes name, which may keep an extent by rounding
        return frozenset(unit)

    def axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        if self._factors(layer, graph) is not None or self._blend(layer, graph) is not None or self._grids(layer, graph) is not None:
            return all_axes(layer, graph)
        return self._unit_axes(layer, graph)

    def _blend_local(self, layer: Layer, graph: Graph, out: ShapeMap, blend: tuple[tuple[int, ...], str]) -> tuple[ShapeMap, ShapeMap]:
        """(input rows read, output rows emitted) of a piece of a linear or cubic upsampling
        (class docstring): along an axis of factor s, output rows [o0, o1) read input rows
        [⌊x(o0)⌋ − b, ⌊x(o1 − 1)⌋ + a + 1) (b, a = 0, 1 linear; 1, 2 cubic), clipped to the
        input, and the local op emits s times those rows."""
        before, after = (0, 1) if layer.attrs.get("mode") == "linear" else (1, 2)
        factors, transform = blend
        asymmetric = transform == "asymmetric"
        in_dims = shape(graph, layer.inputs[0])
        need, emits = full(graph, layer.inputs[0]), out
        for a, s in enumerate(factors):
            iv = out.interval(a)
            if s == 1:  # x(y) = y exactly: the piece reads its own rows (class docstring)
                need = need.with_axis(a, iv)
                continue

            def floor_x(y: int, s: int = s) -> int:  # ⌊x(y)⌋ in integers: y/s or (2y + 1 − s)/(2s)
                return y // s if asymmetric else (2 * y + 1 - s) // (2 * s)

            rows = Interval(max(0, floor_x(iv.start) - before), min(in_dims[a], floor_x(iv.stop - 1) + after + 1))
            need = need.with_axis(a, rows)
            emits = emits.with_axis(a, Interval(rows.start * s, rows.stop * s))
        return need, emits

    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        factors, blend = self._factors(layer, graph), self._blend(layer, graph)
        grids = None if factors is not None or blend is not None else self._grids(layer, graph)
        need, computes = full(graph, layer.inputs[0]), out
        emitted: ShapeMap | None = None
        if grids is not None:
            return self._grid_local(layer, graph, out, grids)
        if blend is not None:
            need, emitted = self._blend_local(layer, graph, out, blend)
        elif factors is not None:
            for a, s in enumerate(factors):
                iv = out.interval(a)
                block = Interval(iv.start // s, -(-iv.stop // s))
                need = need.with_axis(a, block)
                computes = computes.with_axis(a, Interval(block.start * s, block.stop * s))
        else:
            unit, out_dims = self._unit_axes(layer, graph), shape(graph, layer.outputs[0])
            for a in range(out.rank):
                if a in unit:
                    need = need.with_axis(a, out.interval(a))
                else:
                    assert out.interval(a) == Interval(0, out_dims[a]), f"Resize '{layer.name}' cut along its scaled axis {a}"
        emitted = computes if emitted is None else emitted
        needs: list[ShapeMap | None] = [need, *(full(graph, t) if t else None for t in layer.inputs[1:])]
        inputs: dict[int, np.ndarray] = {}
        for k in range(1, len(layer.inputs)):
            value = _constant(graph, layer, k)
            if value is not None and value.size == 0:  # opsets 11 and 12: an empty roi, or scales beside sizes
                needs[k], inputs[k] = None, value  # (a need cannot be empty)
        sizes = _constant(graph, layer, 3)
        if sizes is not None and sizes.size and graph.opsets.get("", 13) >= 11:
            axes = _resized_axes(layer, out.rank)
            needs[3], inputs[3] = None, np.array([emitted.shape[a] for a in axes], sizes.dtype)
        return Local(tuple(needs), computes, inputs=inputs, emits=None if emitted == computes else emitted)

    def ops_per_element(self, layer: Layer, graph: Graph) -> float:
        """Nearest copies one element (1). Linear and cubic blend 2 or 4 taps along each axis whose
        extent changes, a multiply-add per tap of their product: 2·2^k or 2·4^k for k such axes
        (bilinear 8, bicubic 32). Antialiased downsampling reads more taps than that."""
        mode = layer.attrs.get("mode", "nearest")
        if mode not in ("linear", "cubic"):
            return 1.0
        resized = sum(i != o for i, o in zip(shape(graph, layer.inputs[0]), shape(graph, layer.outputs[0])))
        return 2.0 * (2 if mode == "linear" else 4) ** resized


def register(registry: RuleRegistry) -> None:
    registry.register(["Slice"], SliceRule(), OpTraits(layout=Layout.BLIND, transposes_pass=True))
    registry.register(["Gather"], GatherRule())
    registry.register(["Pad"], PadRule())
    registry.register(["Resize"], ResizeRule())

