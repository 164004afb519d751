"""Indexing rules: Slice, Split (imported as Slices), Gather with constant indices, Pad (constant, reflect,
edge, wrap), Resize (nearest, linear and cubic by integer factors; linear and cubic on any grid that
maps inside the input, through tf_crop_and_resize; any mode along the axes it keeps):
every piece of every partition, run in onnxruntime on its cropped inputs with the rule's local
starts, indices or pads, equals the same part of the whole op's output (tests/rules/helpers.py)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pytest
from bbgrap.frontends.onnx import import_proto
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper

from bbgrap.ir import Interval, ShapeMap
from bbgrap.rules.registry import default_registry
from tests.rules.helpers import build_model, check_partition, rng_of, rules_settings, run_model, single_op


def _count(d: int, start: int, end: int, step: int) -> int:
    """Elements a Slice takes of an axis of size d (the spec's clamping), to keep outputs non-empty."""
    start, end = start + d if start < 0 else start, end + d if end < 0 else end
    if step > 0:
        return len(range(min(max(start, 0), d), min(max(end, 0), d), step))
    return len(range(min(max(start, 0), d - 1), min(max(end, -1), d - 1), step))


@rules_settings(100)
@given(st.data(), st.integers(1, 4), st.sampled_from([10, 13, 18]), st.booleans())
def test_slice(data: st.DataObject, rank: int, opset: int, int32: bool) -> None:
    """Any subset of axes (negative too, or none given: the leading ones), starts and ends
    anywhere (negative, past the end), any step (negative too): every output axis is cut."""
    dims = [data.draw(st.integers(1, 7), label=f"dim {i}") for i in range(rank)]
    axes = data.draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True), label="axes")
    starts, ends, steps = [], [], []
    for a in axes:
        d = dims[a]
        step = data.draw(st.sampled_from([1, 1, 2, 3, -1, -2]), label=f"step {a}")
        start = data.draw(st.integers(-d - 2, d + 2), label=f"start {a}")
        end = data.draw(st.integers(-d - 2, d + 2) | st.just(2**30 if step > 0 else -(2**30)), label=f"end {a}")
        if _count(d, start, end, step) == 0:  # an empty output: slice the whole axis instead
            start, end = (0, 2**30) if step > 0 else (-1, -(2**30))
        starts.append(start)
        ends.append(end)
        steps.append(step)
    dtype = np.int32 if int32 else np.int64
    consts = {"starts": np.array(starts, dtype), "ends": np.array(ends, dtype)}
    names = ["x", "starts", "ends"]
    leading = axes == list(range(len(axes))) and all(s == 1 for s in steps) and data.draw(st.booleans(), label="no axes")
    if not leading:
        consts["axes"] = np.array([a - rank if data.draw(st.booleans(), label=f"neg {a}") else a for a in axes], dtype)
        consts["steps"] = np.array(steps, dtype)
        names += ["axes", "steps"]
    model = single_op("Slice", names, {"x": dims}, consts, opset)
    check_partition(data, model, expect_axes=set(range(rank)), max_cut_axes=rank)


@rules_settings(20)
@given(st.data())
def test_slice_legacy(data: st.DataObject) -> None:
    """Opset 9: starts, ends and axes are attributes, which the local op overrides."""
    dims = [data.draw(st.integers(3, 6), label=f"dim {i}") for i in range(3)]
    model = single_op("Slice", ["x"], {"x": dims}, {}, 9, starts=[0, 1], ends=[100, -1], axes=[0, 2])
    check_partition(data, model, expect_axes={0, 1, 2}, max_cut_axes=3)


@rules_settings(60)
@given(st.data(), st.sampled_from([11, 13, 18]), st.integers(-3, 2), st.integers(1, 4))
def test_split(data: st.DataObject, opset: int, axis: int, parts: int) -> None:
    """A Split is imported as one Slice per output, each cut on its own along any axis; sizes as
    an attribute (opset 11), a constant input (13), equal parts (`num_outputs`, 18) or none given."""
    dims = [data.draw(st.integers(1, 2)), data.draw(st.integers(1, 8)), data.draw(st.integers(1, 6))]
    dims[axis % 3] = max(dims[axis % 3], parts)
    size = dims[axis % 3]
    equal = data.draw(st.booleans(), label="equal parts") and size % parts == 0
    sizes = [size // parts] * parts if equal else [1] * (parts - 1) + [size - parts + 1]
    outputs = [f"y{k}" for k in range(parts)]
    consts: dict[str, np.ndarray] = {}
    attrs: dict[str, object] = {"axis": axis}
    inputs = ["x"]
    if equal and opset >= 18:
        attrs["num_outputs"] = parts
    elif equal:
        pass  # no sizes: equal parts
    elif opset >= 13:
        consts["split"] = np.array(sizes, np.int64)
        inputs.append("split")
    else:
        attrs["split"] = sizes
    node = helper.make_node("Split", inputs, outputs, name="op", **attrs)
    relus = [helper.make_node("Relu", [o], [f"r{k}"], name=f"relu{k}") for k, o in enumerate(outputs)]
    model = build_model([node, *relus], {"x": dims}, consts, [f"r{k}" for k in range(parts)], opset)
    k = data.draw(st.integers(0, parts - 1), label="output")
    checked = check_partition(data, model, layer=f"op/{k}", expect_axes={0, 1, 2}, max_cut_axes=3)
    assert checked.layer.op_type == "Slice" and checked.layer.outputs == (f"y{k}",)
    assert [la.name for la in checked.front.graph.layers[:parts]] == [f"op/{j}" for j in range(parts)]


@rules_settings(80)
@given(st.data(), st.integers(1, 4), st.integers(0, 2))
def test_gather(data: st.DataObject, rank: int, index_rank: int) -> None:
    """Constant indices of rank 0 (ViT's `x[:, 0]`, `qkv[0]`) to 2, negative and repeated: every
    output axis is cut, the indices' axes too; the data's axis is read over the indices' hull."""
    rng = rng_of(data)
    dims = [data.draw(st.integers(1, 6), label=f"dim {i}") for i in range(rank)]
    axis = data.draw(st.integers(-rank, rank - 1), label="axis")
    d = dims[axis % rank]
    index_shape = [data.draw(st.integers(1, 4), label=f"index dim {j}") for j in range(index_rank)]
    indices = rng.integers(-d, d, size=index_shape).astype(data.draw(st.sampled_from([np.int64, np.int32]), label="dtype"))
    model = single_op("Gather", ["x", "i"], {"x": dims}, {"i": np.asarray(indices)}, 13, axis=axis)
    out_rank = rank - 1 + index_rank
    checked = check_partition(data, model, expect_axes=set(range(out_rank)), max_cut_axes=max(1, out_rank))
    if index_rank == 0:
        a = axis % rank
        for local in checked.locals:
            assert local.needs[0] is not None and len(local.needs[0].interval(a)) == 1  # one row read


@rules_settings(40)
@given(st.data(), st.integers(0, 2), st.booleans())
def test_gather_computed_indices(data: st.DataObject, index_rank: int, activation: bool) -> None:
    """Indices computed from the data (an embedding lookup: a table, constant or not, read by
    token ids): every output axis is cut, the indices over the cut, the table's axis whole."""
    rng = rng_of(data)
    vocab, dim = data.draw(st.integers(2, 6), label="vocab"), data.draw(st.integers(1, 5), label="dim")
    ids = [data.draw(st.integers(1, 4), label=f"id dim {j}") for j in range(index_rank)]
    nodes = [helper.make_node("Sigmoid", ["f"], ["s"], name="sigmoid"),
             helper.make_node("Mul", ["s", "top"], ["scaled"], name="scale"),
             helper.make_node("Cast", ["scaled"], ["ids"], name="ids", to=7),  # int64 in [0, vocab - 1)
             helper.make_node("Gather", ["table", "ids"], ["y"], name="lookup", axis=0)]
    inputs = {"f": ids} | ({"table": [vocab, dim]} if activation else {})
    consts = {"top": np.array(vocab - 1, np.float32)} | ({} if activation else {"table": rng.standard_normal((vocab, dim)).astype(np.float32)})
    model = build_model(nodes, inputs, consts, ["y"], 13)
    checked = check_partition(data, model, layer="lookup", expect_axes=set(range(index_rank + 1)), max_cut_axes=2)
    for local in checked.locals:
        assert local.needs[0] is not None and local.needs[0].interval(0) == Interval(0, vocab)


@rules_settings(80)
@given(st.data(), st.integers(1, 4), st.sampled_from([11, 13, 18]), st.booleans())
def test_pad(data: st.DataObject, rank: int, opset: int, value: bool) -> None:
    """Constant mode, pads as an input (negative ones crop), an optional pad value, axes (opset 18):
    every axis is cut, pieces wholly inside the padding included."""
    dims = [data.draw(st.integers(1, 6), label=f"dim {i}") for i in range(rank)]
    axes = list(range(rank))
    if opset >= 18 and data.draw(st.booleans(), label="axes given"):
        axes = data.draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True), label="axes")
    begins = [data.draw(st.integers(-dims[a] + 1, 4), label=f"begin {a}") for a in axes]
    ends = [data.draw(st.integers(max(-dims[a] + 1 - b, -3), 4), label=f"end {a}") for a, b in zip(axes, begins)]
    consts: dict[str, np.ndarray] = {"pads": np.array(begins + ends, np.int64)}
    inputs = ["x", "pads"]
    if value:
        consts["v"] = np.array(2.5, np.float32)
        inputs.append("v")
    if axes != list(range(rank)):
        if not value:
            inputs.append("")
        consts["axes"] = np.array(axes, np.int64)
        inputs.append("axes")
    model = single_op("Pad", inputs, {"x": dims}, consts, opset, mode="constant")
    check_partition(data, model, expect_axes=set(range(rank)), max_cut_axes=rank)


def _pad_model(data: st.DataObject, rank: int, mode: str, opset: int, max_dim: int = 7):
    """A Pad of `mode` with pads that mode allows (reflect: at most the size left after the
    negative pads' crop − 1; edge and wrap: beyond the axis too; a negative pad on either side,
    leaving a row at least), on all axes or, from opset 18, on some; and the pads per data axis."""
    dims = [data.draw(st.integers(1, max_dim), label=f"dim {i}") for i in range(rank)]
    axes = list(range(rank))
    if opset >= 18 and data.draw(st.booleans(), label="axes given"):
        axes = data.draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True), label="axes")
    begins, ends = [], []
    for a in axes:
        crop0 = data.draw(st.integers(0, dims[a] - 1), label=f"crop begin {a}") if data.draw(st.booleans(), label=f"neg begin {a}") else 0
        crop1 = data.draw(st.integers(0, dims[a] - 1 - crop0), label=f"crop end {a}") if data.draw(st.booleans(), label=f"neg end {a}") else 0
        kept = dims[a] - crop0 - crop1
        top = kept - 1 if mode == "reflect" else kept + 2
        begins.append(-crop0 if crop0 else data.draw(st.integers(0, top), label=f"begin {a}"))
        ends.append(-crop1 if crop1 else data.draw(st.integers(0, top), label=f"end {a}"))
    consts: dict[str, np.ndarray] = {"pads": np.array(begins + ends, np.int64)}
    inputs = ["x", "pads"]
    if axes != list(range(rank)):
        consts["axes"] = np.array([a - rank if data.draw(st.booleans(), label=f"neg {a}") else a for a in axes], np.int64)
        inputs += ["", "axes"]
    pads = [(0, 0)] * rank
    for a, b, e in zip(axes, begins, ends):
        pads[a] = (b, e)
    return single_op("Pad", inputs, {"x": dims}, consts, opset, mode=mode), dims, pads


@rules_settings(100)
@given(st.data(), st.integers(1, 4), st.sampled_from(["reflect", "edge", "wrap"]), st.sampled_from([11, 13, 18, 19]))
def test_pad_reflect_edge_wrap(data: st.DataObject, rank: int, mode: str, opset: int) -> None:
    """Reflect and edge (and opset 19's wrap): every axis is cut, anywhere (inside the padding
    too); each piece is the same Pad of the input rows its rows copy, padded only where it
    touches a border of the output, and all it computes is exact; an axis with a negative pad too
    (cropped before the other side is padded)."""
    opset = 19 if mode == "wrap" else opset
    model, dims, pads = _pad_model(data, rank, mode, opset)
    checked = check_partition(data, model, expect_axes=set(range(rank)), max_cut_axes=rank)
    _check_pad_pieces(checked, mode, dims, pads)


@rules_settings(60)
@given(st.data(), st.integers(1, 3), st.sampled_from(["reflect", "edge", "wrap"]))
def test_pad_reflect_edge_wrap_every_row(data: st.DataObject, rank: int, mode: str) -> None:
    """Every output row of one axis its own piece: each row of the padding, mirrored or repeated,
    alone, and the rows next to the borders."""
    model, dims, pads = _pad_model(data, rank, mode, 19, max_dim=9)
    axis = data.draw(st.integers(0, rank - 1), label="axis")
    checked = check_partition(data, model, expect_axes=set(range(rank)), cut_axes=[axis], finest=True)
    _check_pad_pieces(checked, mode, dims, pads)


def _check_pad_pieces(checked, mode: str, dims: list[int], pads: list[tuple[int, int]]) -> None:
    """A piece inside the data along an axis reads its rows there and computes just them; edge
    computes just the piece; reflect at most the mirror's rows beside it (2p + 1, p the pad), wrap
    at most the pads and the axis beside it."""
    for box, local in zip(checked.boxes, checked.locals):
        for a, ((begin, end), whole) in enumerate(zip(pads, dims)):
            p0, p1, size = max(begin, 0), max(end, 0), whole - max(-begin, 0) - max(-end, 0)  # after a negative pad's crop
            iv, need, computes = box.interval(a), local.needs[0].interval(a), local.computes.interval(a)
            if p0 <= iv.start and iv.stop <= p0 + size:
                assert need == Interval(iv.start - begin, iv.stop - begin) and computes == iv, (a, box, local)
            extra = {"edge": 0, "reflect": 2 * max(p0, p1) + 1, "wrap": p0 + p1 + size}[mode]
            assert iv.start - extra <= computes.start and computes.stop <= iv.stop + extra, (a, box, local.computes)


@rules_settings(80)
@given(st.data(), st.integers(1, 4), st.sampled_from(["constant", "reflect", "edge"]), st.sampled_from([2, 10]))
def test_pad_attributes_of_opset_10(data: st.DataObject, rank: int, mode: str, opset: int) -> None:
    """Opset 10 and before (pads and the value attributes, as old ZeroPad2d and ReflectionPad2d
    exports write them): cut along every axis as from opset 11, the local op's pads attribute
    replaced; the dp planner priced such a layer through this rule and crashed when it had none."""
    _, dims, pads = _pad_model(data, rank, mode, 11)
    value = {"value": 2.5} if mode == "constant" and data.draw(st.booleans(), label="value") else {}
    model = single_op("Pad", ["x"], {"x": dims}, {}, opset, mode=mode, pads=[b for b, _ in pads] + [e for _, e in pads], **value)
    checked = check_partition(data, model, expect_axes=set(range(rank)), max_cut_axes=rank)
    if mode != "constant":
        _check_pad_pieces(checked, mode, dims, pads)


def test_pad_with_pads_from_the_data_is_whole_and_priced_whole() -> None:
    """Pads computed from the data: the layer has no rule (its shape depends on the input's values);
    the Pad rule itself has no axis to cut it along, and its local op for the whole output is the
    layer as it is (the planners price a layer whole on one node through its rule)."""
    graph_proto = helper.make_graph([helper.make_node("Pad", ["x", "p"], ["y"], mode="constant")], "g",
                                    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 3]),
                                     helper.make_tensor_value_info("p", TensorProto.INT64, [6])],
                                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    graph = import_proto(helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)).graph
    layer = graph.layers[0]
    assert layer.shape_from_values and default_registry().get(layer) is None  # its output's shape is the pads' values'
    rule = default_registry().rule_of("Pad")
    assert rule is not None and rule.axes(layer, graph) == frozenset()
    out = ShapeMap.full(graph.tensors[layer.outputs[0]].shape)
    local = rule.local(layer, graph, out)
    assert local.computes == out and local.needs == tuple(ShapeMap.full(graph.tensors[t].shape) for t in layer.inputs)
    assert not local.attrs and not local.inputs


@rules_settings(80)
@given(st.data(), st.sampled_from([10, 11, 13, 18]), st.sampled_from(["half_pixel", "pytorch_half_pixel", "asymmetric", "align_corners"]),
       st.sampled_from(["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]), st.booleans())
def test_nearest_resize(data: st.DataObject, opset: int, transform: str, rounding: str, by_sizes: bool) -> None:
    """Nearest Resize by integer factors (scales or, from opset 11, sizes): cut along every axis
    where the transform and rounding make Y[x] = X[x // s] (pieces off the factor's blocks compute
    whole blocks); any other combination, or a non-integer factor, along the axes it keeps. Opset
    11's empty roi (and scales beside sizes) go to the local op as they are."""
    dims = [data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3)), data.draw(st.integers(1, 5)), data.draw(st.integers(1, 5))]
    factors = [1, 1, data.draw(st.integers(1, 3), label="fh"), data.draw(st.integers(1, 3), label="fw")]
    odd = data.draw(st.integers(0, 5), label="odd") == 0  # a factor of 1.5: never cut
    scales = np.array([float(f) for f in factors[:3]] + [1.5 if odd else float(factors[3])], np.float32)
    attrs: dict[str, object] = {"mode": "nearest"}
    if opset >= 11:
        attrs |= {"coordinate_transformation_mode": transform, "nearest_mode": rounding}
    if opset < 11:
        model = single_op("Resize", ["x", "scales"], {"x": dims}, {"scales": scales}, opset, **attrs)
    elif by_sizes:
        sizes = np.array([int(d * s) for d, s in zip(dims, scales)], np.int64)
        empty = {"roi": np.zeros(0, np.float32), "scales": np.zeros(0, np.float32)} if opset < 13 else {}  # required there
        model = single_op("Resize", ["x", *(empty or ["", ""]), "sizes"], {"x": dims}, {**empty, "sizes": sizes}, opset, **attrs)
    else:
        roi = {"roi": np.zeros(0, np.float32)} if opset < 13 else {}
        model = single_op("Resize", ["x", *(roi or [""]), "scales"], {"x": dims}, {**roi, "scales": scales}, opset, **attrs)
    graph = import_proto(model).graph
    layer = graph.layers[0]
    axes = default_registry().get(layer).axes(layer, graph)  # type: ignore[union-attr]
    cut = axes == frozenset({0, 1, 2, 3})
    simple = opset < 11 or (transform in ("half_pixel", "pytorch_half_pixel") and rounding.startswith("round")) \
        or (transform == "asymmetric" and rounding == "floor")  # Y[x] = X[x // s] for any integer s
    if not odd and simple:
        assert cut
    if odd and (opset < 11 or not by_sizes):  # (sizes of a width-1 axis times 1.5 make a factor of 1)
        assert not cut
    if cut:
        check_partition(data, model, expect_axes={0, 1, 2, 3}, max_cut_axes=3)
    else:  # cut along the axes it keeps, as linear Resize is (test_linear_cubic_resize)
        unit = {a for a in range(4) if (sizes[a] == dims[a] if opset >= 11 and by_sizes else scales[a] == 1)}
        check_partition(data, model, expect_axes=unit, max_cut_axes=len(unit))


TRANSFORMS = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric"]


@rules_settings(80)
@given(st.data(), st.sampled_from([10, 11, 13, 18, 19]), st.sampled_from(["linear", "cubic"]), st.sampled_from(TRANSFORMS),
       st.booleans())
def test_linear_cubic_resize(data: st.DataObject, opset: int, mode: str, transform: str, by_sizes: bool) -> None:
    """Linear (bilinear) and cubic Resize, upsampling H and W by 1 to 4 (or 1.5), by scales or
    sizes, on all axes or (opset 18) on H and W: by integer factors in the half_pixel,
    pytorch_half_pixel and asymmetric transforms, cut along every axis (the local op reads a halo
    of input rows and emits more rows than it keeps); otherwise along exactly the axes it keeps
    with a scale of 1 (batch, channels, and H or W where the factor is 1). Every piece and all its
    local op computes are within 1e-5 of the whole op (a factor of 3 puts the local coordinates a
    rounding away from the whole op's)."""
    if opset < 11:
        mode, transform, by_sizes = "linear", "asymmetric", False  # Resize-10: linear, asymmetric, scales
    if transform == "half_pixel_symmetric":
        opset = 19
    dims = [data.draw(st.integers(1, 2)), data.draw(st.integers(1, 4)), data.draw(st.integers(1, 6)), data.draw(st.integers(1, 6))]
    factors = [1.0, 1.0] + [data.draw(st.sampled_from([1.0, 1.0, 2.0, 3.0, 4.0, 1.5]), label=f"factor {a}") for a in (2, 3)]
    attrs: dict[str, object] = {"mode": mode}
    if opset >= 11:
        attrs["coordinate_transformation_mode"] = transform
    if mode == "cubic":
        attrs |= {"cubic_coeff_a": data.draw(st.sampled_from([-0.75, -0.5])), "exclude_outside": data.draw(st.integers(0, 1))}
    spatial = opset >= 18 and data.draw(st.booleans(), label="axes 2, 3")
    listed = [2, 3] if spatial else [0, 1, 2, 3]
    if spatial:
        attrs["axes"] = listed
    sizes = [int(d * f) for d, f in zip(dims, factors)]
    empty = np.zeros(0, np.float32)  # opsets 11 and 12 require roi, and scales beside sizes
    if opset < 11:
        model = single_op("Resize", ["x", "scales"], {"x": dims}, {"scales": np.array(factors, np.float32)}, opset, **attrs)
    elif by_sizes:
        model = single_op("Resize", ["x", "roi", "scales", "sizes"], {"x": dims},
                          {"roi": empty, "scales": empty, "sizes": np.array([sizes[a] for a in listed], np.int64)}, opset, **attrs)
    else:
        model = single_op("Resize", ["x", "roi", "scales"], {"x": dims},
                          {"roi": empty, "scales": np.array([factors[a] for a in listed], np.float32)}, opset, **attrs)
    unit = {a for a in range(4) if (sizes[a] == dims[a] if by_sizes else factors[a] == 1.0)}
    integral = all(sizes[a] % dims[a] == 0 and (by_sizes or factors[a] == sizes[a] // dims[a]) for a in range(4))
    if integral and (opset < 11 or transform in ("half_pixel", "pytorch_half_pixel", "asymmetric")):
        unit = {0, 1, 2, 3}
    if opset >= 11 and _affine(dims, sizes, [sizes[a] / dims[a] if by_sizes else factors[a] for a in range(4)], transform):
        unit = {0, 1, 2, 3}
    checked = check_partition(data, model, expect_axes=unit, max_cut_axes=min(3, len(unit)), tolerance=1e-5)
    for local in checked.locals:
        assert local.emits is None or local.emits.contains(local.computes) and local.emits != local.computes
    axis = data.draw(st.sampled_from(sorted(unit)), label="every row of")
    check_partition(data, model, expect_axes=unit, cut_axes=[axis], finest=True, tolerance=1e-5)


def _affine(dims: Sequence[int], sizes: Sequence[int], scales: Sequence[float], transform: str) -> bool:
    """Whether every output row of a linear or cubic Resize maps inside its input by ONNX's
    coordinate transforms, an axis kept whole at a scale of 1 aside (so ResizeRule cuts it along
    every axis through tf_crop_and_resize)."""
    if transform not in ("half_pixel", "pytorch_half_pixel", "asymmetric", "align_corners"):
        return False
    for n, m, s in zip(dims, sizes, scales):
        if n == m and s == 1.0:
            continue
        if n == m or m == 0:
            return False
        y = np.arange(m, dtype=np.float64)
        if transform == "align_corners":
            x = y * (n - 1) / (m - 1) if m > 1 else 0 * y
        elif transform == "asymmetric":
            x = y / s
        elif transform == "pytorch_half_pixel" and m == 1:
            x = 0 * y
        else:
            x = (y + 0.5) / s - 0.5
        if x.min() < 0 or x.max() > n - 1:
            return False
    return True


@rules_settings(80)
@given(st.data(), st.sampled_from([11, 13, 18]), st.sampled_from(["linear", "cubic"]),
       st.sampled_from(["align_corners", "half_pixel", "pytorch_half_pixel", "asymmetric"]), st.booleans())
def test_resize_on_an_affine_grid(data: st.DataObject, opset: int, mode: str, transform: str, by_sizes: bool) -> None:
    """Linear and cubic Resize by any factor (align_corners, non-integer, downsampling) whose every
    output row maps inside the input is cut along every axis, each piece a tf_crop_and_resize of a
    crop of the input rows, within 1e-5 of the whole op; where some row maps outside (the first rows
    of a half-pixel upsampling by a non-integer factor, which the whole op clamps), along the axes it
    keeps with a scale of 1. One cut gives every output row its own piece: pieces as long as their
    crop, which onnxruntime would copy, read or emit a row more."""
    dims = [data.draw(st.integers(1, 2)), data.draw(st.integers(1, 3)), data.draw(st.integers(1, 9)), data.draw(st.integers(1, 9))]
    factors = [1.0, 1.0]
    for a in (2, 3):
        f = data.draw(st.sampled_from([1.0, 0.5, 0.6, 1.5, 2.0, 2.5, 3.0, 4.0]), label=f"factor {a}")
        factors.append(f if int(dims[a] * f) > 0 else 1.0)
    sizes = [int(d * f) for d, f in zip(dims, factors)]
    attrs: dict[str, object] = {"mode": mode, "coordinate_transformation_mode": transform}
    if mode == "cubic":
        attrs |= {"cubic_coeff_a": data.draw(st.sampled_from([-0.75, -0.5])), "exclude_outside": data.draw(st.integers(0, 1))}
    listed = [2, 3] if opset >= 18 and data.draw(st.booleans(), label="axes 2, 3") else [0, 1, 2, 3]
    if listed == [2, 3]:
        attrs["axes"] = listed
    empty = np.zeros(0, np.float32)
    if by_sizes:
        model = single_op("Resize", ["x", "roi", "scales", "sizes"], {"x": dims},
                          {"roi": empty, "scales": empty, "sizes": np.array([sizes[a] for a in listed], np.int64)}, opset, **attrs)
        scales = [m / n for n, m in zip(dims, sizes)]
    else:
        roi = {"roi": empty} if opset < 13 else {}  # required there
        model = single_op("Resize", ["x", *(roi or [""]), "scales"], {"x": dims},
                          {**roi, "scales": np.array([factors[a] for a in listed], np.float32)}, opset, **attrs)
        scales = [float(np.float32(f)) for f in factors]
    expected = {0, 1, 2, 3} if _affine(dims, sizes, scales, transform) else \
        {a for a in range(4) if sizes[a] == dims[a] and scales[a] == 1.0}
    integral = all(m % n == 0 and s == m // n for n, m, s in zip(dims, sizes, scales))
    if integral and transform != "align_corners":
        expected = {0, 1, 2, 3}  # the halo rule (test_linear_cubic_resize)
    check_partition(data, model, expect_axes=expected, max_cut_axes=min(3, len(expected)), tolerance=1e-5)
    if expected:
        axis = data.draw(st.sampled_from(sorted(expected)), label="every row of")
        check_partition(data, model, expect_axes=expected, cut_axes=[axis], finest=True, tolerance=1e-5)


def test_resize_on_an_affine_grid_reads_a_row_more_than_a_copy() -> None:
    """align_corners 4 → 7 rows: the piece of output rows [1, 5) maps to x in [0.5, 2.5], reads
    input rows [0, 4) (taps and a row more each side, clipped) and so as many rows as it keeps:
    onnxruntime would copy such a crop, so the piece emits output row 0 too and crops it away; the
    last row, at x = 3 exactly, is aimed a little short of the crop's last row."""
    model = single_op("Resize", ["x", "", "", "sizes"], {"x": [1, 1, 4, 2]}, {"sizes": np.array([1, 1, 7, 2], np.int64)}, 13,
                      mode="linear", coordinate_transformation_mode="align_corners")
    front = import_proto(model)
    layer = front.graph.layers[0]
    rule = default_registry().get(layer)
    assert rule is not None and rule.axes(layer, front.graph) == frozenset({0, 1, 2, 3})
    out = ShapeMap.full((1, 1, 7, 2)).with_axis(2, Interval(1, 5))
    local = rule.local(layer, front.graph, out)
    assert local.needs[0] == ShapeMap.full((1, 1, 4, 2)) and local.computes == out
    assert local.emitted == out.with_axis(2, Interval(0, 5))
    assert local.attrs["coordinate_transformation_mode"] == "tf_crop_and_resize"
    last = ShapeMap.full((1, 1, 7, 2)).with_axis(2, Interval(5, 7))
    roi = rule.local(layer, front.graph, last).inputs[1]
    assert 0 < roi[6] < 1 and roi[6] > 1 - 1e-6  # H's end: short of the crop's last row, by a rounding


def _upsample(x: np.ndarray, factor: int, transform: str) -> np.ndarray:
    scales = np.array([1, 1, factor, factor], np.float32)
    model = single_op("Resize", ["x", "", "scales"], {"x": list(x.shape)}, {"scales": scales}, 13, mode="linear",
                      coordinate_transformation_mode=transform)
    return run_model(model, {"x": np.ascontiguousarray(x)})["y"]


@pytest.mark.parametrize("transform", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"])
@pytest.mark.parametrize("factor", [2, 3, 4])
def test_linear_resize_emits_rows_it_does_not_keep(transform: str, factor: int) -> None:
    """Why a piece of a bilinear upsampling along H emits rows that lowering crops away (ResizeRule's
    docstring): the same Resize on any crop of the input rows other than all of them (asymmetric:
    other than one ending at the last row, which only a piece that ends there could use) computes
    some row unlike the whole op's; yet (but for align_corners, whose pieces are a tf_crop_and_resize
    instead: test_resize_on_an_affine_grid) the rows of a piece [o0, o1) it computes from the input
    rows [⌊x(o0)⌋, ⌊x(o1 − 1)⌋ + 2) (clipped to the input) are the whole op's, and those are the
    rows the rule reads, emits and keeps."""
    h = 5
    model = single_op("Resize", ["x", "", "scales"], {"x": [1, 2, h, 3]}, {"scales": np.array([1, 1, factor, factor], np.float32)},
                      13, mode="linear", coordinate_transformation_mode=transform)
    front = import_proto(model)
    layer = front.graph.layers[0]
    rule = default_registry().get(layer)
    assert rule is not None
    axes = rule.axes(layer, front.graph)
    assert axes == frozenset({0, 1, 2, 3})
    x = front.sample_inputs["x"]
    whole = _upsample(x, factor, transform)
    for lo in range(h):
        for hi in range(lo + 1, h + 1):
            if (lo, hi) == (0, h) or (transform == "asymmetric" and hi == h):
                continue
            y = _upsample(x[:, :, lo:hi], factor, transform)
            assert not np.allclose(y, whole[:, :, factor * lo:factor * hi], rtol=1e-3, atol=1e-3), (lo, hi)
    if transform == "align_corners":
        return

    def coordinate(y: int) -> float:  # where the whole op clamps (x < 0, x > h − 1) it reads the edge row
        return y / factor if transform == "asymmetric" else (y + 0.5) / factor - 0.5

    scale = float(np.abs(whole).max())
    for o0 in range(factor * h):
        for o1 in range(o0 + 1, min(o0 + 2 * factor, factor * h) + 1):
            lo, hi = max(0, int(np.floor(coordinate(o0)))), min(int(np.floor(coordinate(o1 - 1))) + 2, h)
            y = _upsample(x[:, :, lo:hi], factor, transform)
            np.testing.assert_allclose(y[:, :, o0 - factor * lo:o1 - factor * lo], whole[:, :, o0:o1], rtol=1e-5, atol=1e-5 * scale)
            out = ShapeMap.full(whole.shape).with_axis(2, Interval(o0, o1))
            local = rule.local(layer, front.graph, out)
            assert local.needs[0] == ShapeMap.full(x.shape).with_axis(2, Interval(lo, hi)), (o0, o1, local.needs[0], lo, hi)
            assert local.computes == out and local.emitted == out.with_axis(2, Interval(factor * lo, factor * hi))
