"""Structural region rules: Concat, Transpose, Flatten, Gemm, Softmax, Reshape, whole-only ops."""

from __future__ import annotations

import numpy as np
import onnx
from bbgrap.frontends.onnx import import_proto
from hypothesis import given
from hypothesis import strategies as st

from bbgrap.ir import Interval, ShapeMap
from bbgrap.report import whole_reason
from bbgrap.rules.registry import default_registry
from tests.rules.helpers import check_partition, const, rng_of, rounded_single_op, rules_settings, single_op

SETTINGS = rules_settings(60)


@rules_settings(80)
@given(st.data(), st.integers(2, 4), st.sampled_from([1, 2, 3, -1, -3]))
def test_concat(data: st.DataObject, count: int, axis: int) -> None:
    """Pieces along the concat axis straddle input boundaries; untouched inputs are dropped."""
    base = [data.draw(st.integers(1, 2)), data.draw(st.integers(1, 6)), data.draw(st.integers(1, 8)), data.draw(st.integers(1, 8))]
    ax = axis % 4
    activations = {}
    consts = {}
    for k in range(count):
        shape = list(base)
        shape[ax] = data.draw(st.integers(1, 6), label=f"size {k}")
        if k > 0 and data.draw(st.integers(0, 3), label=f"constant {k}") == 0:
            consts[f"k{k}"] = const(rng_of(data), shape)
        else:
            activations[f"x{k}"] = shape
    names = [f"x{k}" if f"x{k}" in activations else f"k{k}" for k in range(count)]
    model = single_op("Concat", names, activations, consts, data.draw(st.integers(13, 17)), axis=axis)
    axes_choice = data.draw(st.sampled_from([[ax], [ax, 0], [ax, 2 if ax != 2 else 3], None]), label="cut axes")
    checked = check_partition(data, model, expect_axes={0, 1, 2, 3}, cut_axes=axes_choice)
    sizes = [checked.front.graph.tensors[t].shape[ax] for t in names]
    offsets = np.cumsum([0] + sizes)
    for box, local in zip(checked.boxes, checked.locals):
        want = box.interval(ax)
        for k, need in enumerate(local.needs):
            touched = not want.intersect(Interval(int(offsets[k]), int(offsets[k + 1]))).empty
            assert (need is not None) == touched, (box, k, need)


@SETTINGS
@given(st.data(), st.integers(1, 4))
def test_transpose(data: st.DataObject, rank: int) -> None:
    shape = [data.draw(st.integers(1, 8)) for _ in range(rank)]
    perm = data.draw(st.one_of(st.none(), st.permutations(range(rank))), label="perm")
    attrs = {} if perm is None else {"perm": list(perm)}
    model = single_op("Transpose", ["x"], {"x": shape}, {}, data.draw(st.integers(13, 17)), **attrs)
    check_partition(data, model, expect_axes=set(range(rank)))


@SETTINGS
@given(st.data(), st.integers(2, 4), st.booleans())
def test_flatten_axis_1(data: st.DataObject, rank: int, negative: bool) -> None:
    """Flatten at axis 1 (or its negative spelling): the batch axis, and the flattened axis
    anywhere (a cut inside a channel computes that channel whole and keeps its part)."""
    shape = [data.draw(st.integers(1, 3))] + [data.draw(st.integers(1, 6)) for _ in range(rank - 1)]
    model = single_op("Flatten", ["x"], {"x": shape}, {}, data.draw(st.integers(13, 17)), axis=1 - rank if negative else 1)
    out = [shape[0], int(np.prod(shape[1:]))]
    check_partition(data, model, expect_axes={a for a in (0, 1) if out[a] > 1})


# Regression (fixed in e124b0d): FlattenRule.local compared output axis 0
# (prod(shape[:axis])) with input axis 0 (the batch) and, when they differed, put the
# output interval on the input's axis 0, so for axis != 1 the whole-output box needed
# x[0:N*C] (outside the tensor) or x[0:1] (too little). Flatten is a Reshape now (ReshapeRule).


@rules_settings(60)
@given(st.data(), st.integers(2, 4))
def test_flatten_other_axes(data: st.DataObject, rank: int) -> None:
    """Flatten at an axis other than 1 is a reshape to (∏ leading, ∏ trailing): both output axes
    are cut (where above 1), each the outermost of its group. Drawn so that output axis 0 differs
    from the batch size (where the old bug showed)."""
    axis = data.draw(st.sampled_from([a for a in range(rank + 1) if a != 1]), label="axis")
    shape = [data.draw(st.integers(2 if axis == 0 else 1, 3))] + [data.draw(st.integers(1, 6)) for _ in range(rank - 1)]
    if axis >= 2:
        shape[1] = data.draw(st.integers(2, 6), label="C")
    model = single_op("Flatten", ["x"], {"x": shape}, {}, data.draw(st.integers(13, 17)), axis=axis)
    out = [int(np.prod(shape[:axis])), int(np.prod(shape[axis:]))]
    check_partition(data, model, expect_axes={a for a in (0, 1) if out[a] > 1})


def test_flatten_axis_2_whole_box_reproducer() -> None:
    """Minimal reproducer: Flatten(axis=2) of x (1, 3, 4, 4) → y (3, 16); whole box [0:3, 0:16]."""
    model = single_op("Flatten", ["x"], {"x": [1, 3, 4, 4]}, {}, 13, axis=2)
    graph = import_proto(model).graph
    layer = graph.layers[0]
    local = default_registry().get(layer).local(layer, graph, ShapeMap.full((3, 16)))
    assert local.needs[0] == ShapeMap.full((1, 3, 4, 4)), f"got {local.needs[0]}"  # was [0:3,0:3,0:4,0:4]


@rules_settings(80)
@given(st.data(), st.integers(0, 1), st.integers(0, 1), st.sampled_from(["N", "1N", "MN", "M1", "11", "scalar", None]))
def test_gemm(data: st.DataObject, trans_a: int, trans_b: int, c_kind: str | None) -> None:
    rng = rng_of(data)
    m, k, n = (data.draw(st.integers(1, 12), label=d) for d in "MKN")
    a_shape = [k, m] if trans_a else [m, k]
    consts = {"b": const(rng, [n, k] if trans_b else [k, n])}
    inputs = ["a", "b"]
    if c_kind is not None:
        consts["c"] = const(rng, {"N": [n], "1N": [1, n], "MN": [m, n], "M1": [m, 1], "11": [1, 1], "scalar": []}[c_kind])
        inputs.append("c")
    attrs = {"transA": trans_a, "transB": trans_b}
    if data.draw(st.booleans(), label="alpha/beta"):
        attrs["alpha"], attrs["beta"] = 0.5, 2.0
    model = single_op("Gemm", inputs, {"a": a_shape}, consts, data.draw(st.integers(13, 17)), **attrs)
    check_partition(data, model, expect_axes={0, 1})


@rules_settings(40)
@given(st.data(), st.sampled_from(["Gemm", "Gemm transB", "MatMul", "batched MatMul"]))
def test_a_product_by_an_unpacked_operand_rounded_later_is_cut_to_the_bit(data: st.DataObject, kind: str) -> None:
    """onnxruntime multiplies by a B it does not pack (an activation here; a weight a 16-bit model
    dequantizes at run time) along other paths for a single row, a single column, a single row's
    columns outside groups of 4 under transB, and any rows of a single column, each a last bit off
    the whole product. Where the result is rounded later, a piece computes the rows and columns
    that take the whole product's path, and a product of one column is not cut
    (`multiplies_unpacked`): every piece, down to one row or column, is the whole op's to the bit.
    A batched MatMul's A has batch axes, which onnxruntime folds into its rows where B has none."""
    m, k, n = data.draw(st.integers(1, 5), label="M"), data.draw(st.integers(1, 48), label="K"), data.draw(st.integers(1, 14), label="N")
    trans_b = int(kind == "Gemm transB")
    a_shape, b_shape = [m, k], [n, k] if trans_b else [k, n]
    if kind == "batched MatMul":
        batch = data.draw(st.integers(1, 3), label="batch")
        a_shape = [batch, m, k]
        b_shape = [batch, k, n] if data.draw(st.booleans(), label="B batched") else b_shape
    attrs = {"transB": trans_b} if kind.startswith("Gemm") else {}
    model = rounded_single_op("MatMul" if kind.endswith("MatMul") else "Gemm", ["a", "b"], {"a": a_shape, "b": b_shape}, {}, **attrs)
    if n == 1:  # one column: no piece of its rows sums as the whole product does
        graph = import_proto(model).graph
        assert graph.rounded_later(graph.layer("op")) and not default_registry().get(graph.layer("op")).axes(graph.layer("op"), graph)
        assert "one column" in whole_reason(graph, graph.layer("op"), default_registry())
        return
    checked = check_partition(data, model, layer="op", finest=data.draw(st.booleans(), label="finest"), tolerance=0.0)
    assert checked.front.graph.rounded_later(checked.layer)


def matmul_model(data: st.DataObject, b_kind: str, rank_a: int, rank_b: int) -> tuple[onnx.ModelProto, int]:
    """A MatMul of A (rank `rank_a`) and B, a weight (`b_kind` "weight": rank `rank_b` or 2) or an
    activation, their batch axes broadcast (size 1, or missing) on either side; and its output's rank."""
    rng = rng_of(data)
    m, k, n = (data.draw(st.integers(1, 7), label=d) for d in "MKN")
    rank_b = 2 if b_kind == "weight" and data.draw(st.booleans(), label="2-D weight") else rank_b
    batch = [data.draw(st.integers(1, 3), label=f"batch {i}") for i in range(max(rank_a, rank_b) - 2)]

    def dims(rank: int, tail: list[int], name: str) -> list[int]:
        lead = batch[len(batch) - (rank - 2):] if rank > 2 else []
        return [1 if d > 1 and data.draw(st.integers(0, 4), label=f"{name} broadcast") == 0 else d for d in lead] + tail

    a_shape, b_shape = dims(rank_a, [m, k], "a"), dims(rank_b, [k, n], "b")
    if b_kind == "weight":
        model = single_op("MatMul", ["a", "b"], {"a": a_shape}, {"b": const(rng, b_shape)}, data.draw(st.integers(13, 17)))
    else:
        model = single_op("MatMul", ["a", "b"], {"a": a_shape, "b": b_shape}, {}, data.draw(st.integers(13, 17)))
    return model, max(rank_a, rank_b)


@rules_settings(80)
@given(st.data(), st.sampled_from(["weight", "activation"]), st.integers(2, 4), st.integers(2, 4))
def test_matmul(data: st.DataObject, b_kind: str, rank_a: int, rank_b: int) -> None:
    """A Linear on tokens/pixels (B a weight) or an activation product (attention), with batch
    axes broadcast (size 1, or missing) on either side; every output axis can be cut."""
    model, out_rank = matmul_model(data, b_kind, rank_a, rank_b)
    check_partition(data, model, expect_axes=set(range(out_rank)))


@rules_settings(80)
@given(st.data(), st.sampled_from(["Softmax", "LogSoftmax"]), st.integers(2, 4), st.integers(-4, 3), st.sampled_from([11, 12, 13, 17]))
def test_softmax(data: st.DataObject, op: str, rank: int, axis: int, opset: int) -> None:
    """Opset ≥ 13 reduces one axis; before 13 `axis` coerces to 2-D, reducing axes axis.. ."""
    axis = max(-rank, min(rank - 1, axis))
    shape = [data.draw(st.integers(1, 6)) for _ in range(rank)]
    model = single_op(op, ["x"], {"x": shape}, {}, opset, axis=axis)
    a = axis % rank
    expect = set(range(rank)) - {a} if opset >= 13 else set(range(a))
    check_partition(data, model, expect_axes=expect)


# Regression (fixed in e124b0d, in the frontend): SoftmaxRule._reduced reads
# graph.opsets.get('', 13); a model importing the default domain under its alias
# 'ai.onnx' (valid ONNX, run by onnxruntime with the legacy semantics) got opsets
# {'ai.onnx': 11}, so the rule applied opset-13 semantics and offered cuts along
# axes that legacy Softmax reduces (axes {0, 2, 3} instead of {0}).


@rules_settings(30)
@given(st.data(), st.sampled_from(["Softmax", "LogSoftmax"]), st.sampled_from([11, 12]))
def test_softmax_legacy_under_ai_onnx_domain(data: st.DataObject, op: str, opset: int) -> None:
    """Legacy Softmax (axis 1 of 4-D: axes 1..3 reduced) with the default domain spelled 'ai.onnx'."""
    shape = [data.draw(st.integers(1, 3))] + [data.draw(st.integers(2, 5)) for _ in range(3)]
    model = single_op(op, ["x"], {"x": shape}, {}, opset, opset_domain="ai.onnx", axis=1)
    check_partition(data, model, expect_axes={0})


def test_softmax_ai_onnx_domain_reproducer() -> None:
    """Minimal reproducer: Softmax(axis=1), x (1, 2, 3, 4), opset_import [('ai.onnx', 11)]."""
    model = single_op("Softmax", ["x"], {"x": [1, 2, 3, 4]}, {}, 11, opset_domain="ai.onnx", axis=1)
    graph = import_proto(model).graph
    layer = graph.layers[0]
    axes = default_registry().get(layer).axes(layer, graph)
    assert axes == frozenset({0}), f"got {sorted(axes)}"  # was [0, 2, 3]


@rules_settings(30)
@given(st.data(), st.sampled_from([11, 13]))
def test_softmax_ai_onnx_domain_whole_and_batch(data: st.DataObject, opset: int) -> None:
    """With the 'ai.onnx' spelling, the whole box and batch cuts are exact either way."""
    shape = [data.draw(st.integers(1, 3))] + [data.draw(st.integers(1, 5)) for _ in range(3)]
    model = single_op("Softmax", ["x"], {"x": shape}, {}, opset, opset_domain="ai.onnx", axis=1)
    check_partition(data, model, cut_axes=data.draw(st.sampled_from([[], [0]])))


@SETTINGS
@given(st.data(), st.sampled_from([11, 13]))
def test_softmax_default_axis(data: st.DataObject, opset: int) -> None:
    """Default axis: 1 before opset 13 (axes 1.. reduced), -1 from 13."""
    shape = [data.draw(st.integers(1, 6)) for _ in range(4)]
    model = single_op("Softmax", ["x"], {"x": shape}, {}, opset)
    check_partition(data, model, expect_axes={0} if opset < 13 else {0, 1, 2})


@SETTINGS
@given(st.data())
def test_whole_only(data: st.DataObject) -> None:
    """A vector product (a 1-D MatMul operand) is not cut: the single whole box reads every input whole."""
    rng = rng_of(data)
    k, n = (data.draw(st.integers(1, 8)) for _ in range(2))
    model = single_op("MatMul", ["a", "b"], {"a": [k]}, {"b": const(rng, [k, n])}, 13)
    checked = check_partition(data, model, expect_axes=set())
    assert len(checked.boxes) == 1


def _chunks(data: st.DataObject, atoms: list[int], label: str) -> list[int]:
    """`atoms` cut into consecutive chunks, each chunk's product one axis, with axes of size 1 put in."""
    dims: list[int] = []
    for k, atom in enumerate(atoms):
        if dims and data.draw(st.booleans(), label=f"{label} merge {k}"):
            dims[-1] *= atom
        else:
            dims.append(atom)
        if data.draw(st.integers(0, 4), label=f"{label} unit {k}") == 0:
            dims.append(1)
    return dims


@rules_settings(100)
@given(st.data(), st.sampled_from(["Reshape", "Reshape", "Squeeze", "Unsqueeze"]), st.sampled_from([13, 14]))
def test_reshape(data: st.DataObject, op: str, opset: int) -> None:
    """Reshapes that merge and split axes (and Squeeze, Unsqueeze): the outermost output axis of
    every group of axes that hold the same elements can be cut, cuts off the group's boundaries
    computing a little more (whole rows of a merged axis)."""
    atoms = data.draw(st.lists(st.integers(2, 4), min_size=1, max_size=5), label="atoms")
    in_shape = _chunks(data, atoms, "in")
    if op == "Reshape":
        out_shape = _chunks(data, atoms, "out")
        model = single_op("Reshape", ["x", "s"], {"x": in_shape}, {"s": np.array(out_shape, np.int64)}, opset)
    elif op == "Squeeze":
        units = [a for a, d in enumerate(in_shape) if d == 1]
        out_shape = [d for d in in_shape if d != 1]
        model = single_op("Squeeze", ["x", "axes"], {"x": in_shape}, {"axes": np.array(units, np.int64)}, opset) if units else \
            single_op("Squeeze", ["x"], {"x": in_shape}, {}, opset)
    else:
        where = data.draw(st.integers(0, len(in_shape)), label="where")
        out_shape = in_shape[:where] + [1] + in_shape[where:]
        model = single_op("Unsqueeze", ["x", "axes"], {"x": in_shape}, {"axes": np.array([where], np.int64)}, opset)
    checked = check_partition(data, model, max_cut_axes=3)
    assert {out_shape[a] for a in checked.axes} <= set(range(2, 10**6)), "only axes above 1 are cut"
    if op != "Reshape":  # only axes of size 1 come and go: every other axis is its own group
        named = op == "Unsqueeze" or len(model.graph.node[0].input) > 1  # a Squeeze naming no axes is whole
        assert checked.axes == ({a for a, d in enumerate(out_shape) if d > 1} if named else set())


@SETTINGS
@given(st.data(), st.sampled_from(["merge", "shuffle"]))
def test_reshape_exporter_shapes(data: st.DataObject, case: str) -> None:
    """ViT's patch tokens, NCHW → (N, C, H·W): the merged axis is cut (on row boundaries it reads
    just those rows); ShuffleNet's channel shuffle, (N, C, H, W) → (N, g, C/g, H, W): a cut of g
    reads a channel range."""
    c, h, w = 2 * data.draw(st.integers(1, 4)), data.draw(st.integers(2, 6)), data.draw(st.integers(2, 6))
    if case == "merge":
        out_shape, expect = [2, c, h * w], {0, 1, 2}
    else:
        out_shape, expect = [2, 2, c // 2, h, w], {0, 1, 3, 4}
    model = single_op("Reshape", ["x", "s"], {"x": [2, c, h, w]}, {"s": np.array(out_shape, np.int64)}, 13)
    checked = check_partition(data, model, expect_axes=expect, max_cut_axes=2)
    for box, local in zip(checked.boxes, checked.locals):
        need = local.needs[0]
        assert need is not None
        if case == "merge":
            rows = box.interval(2)
            aligned = rows.start % w == 0 and rows.stop % w == 0
            assert local.computes == box if aligned else local.computes.contains(box)
            assert need.interval(2) == Interval(local.computes.interval(2).start // w, local.computes.interval(2).stop // w)
        else:
            assert local.computes == box
            assert need.interval(1) == Interval(box.interval(1).start * (c // 2), box.interval(1).stop * (c // 2))


@rules_settings(80)
@given(st.data(), st.sampled_from(["bhqd,bhkd->bhqk", "bhqk,bhkd->bhqd", "...ij,jk->...ik", "ij,jk", "bij,bjk->bik",
                                   "...d,hd->...h", "ii->i", "bij->bj", "nchw,oc->nohw", "i,i->"]))
def test_einsum(data: st.DataObject, equation: str) -> None:
    """Einsum as a MatMul (attention's products, a Linear, a 1x1 conv), a sum, a diagonal: every
    output axis is cut, the summed letters read whole; operands of size 1 along an ellipsis axis
    broadcast; the rule's operations per element are the multiply-adds over the summed letters."""
    rng = rng_of(data)
    lhs = equation.split("->")[0]
    sizes = {c: data.draw(st.integers(1, 5), label=c) for c in sorted(set(lhs.replace(",", "").replace(".", "")))}
    batch = [data.draw(st.integers(1, 3), label="ellipsis")] * data.draw(st.integers(0, 2), label="ellipsis rank")
    shapes = []
    for k, term in enumerate(lhs.split(",")):
        dims = [sizes[c] for c in term.replace("...", "")]
        if "..." in term:
            broadcast = [d if data.draw(st.booleans(), label=f"full {k}") else 1 for d in batch]
            dims = broadcast + dims
        shapes.append(dims)
    activations = {"a": shapes[0]}
    consts = {f"w{k}": const(rng, s) for k, s in enumerate(shapes[1:], start=1)}
    model = single_op("Einsum", ["a", *consts], activations, consts, 12, equation=equation)
    checked = check_partition(data, model, max_cut_axes=3)
    assert checked.axes == set(range(len(checked.front.graph.tensors["y"].shape)))
    summed = {"ij,jk": "j", "bhqd,bhkd->bhqk": "d", "i,i->": "i", "bij->bj": "i"}.get(equation)
    if summed is not None:
        multiply_adds = 2 if "," in equation else 1
        assert checked.rule.ops_per_element(checked.layer, checked.front.graph) == multiply_adds * sizes[summed]
