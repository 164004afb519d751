"""Elementwise region rules: activations, broadcasting arithmetic, Expand, BatchNormalization."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

from bbgrap.ir import ShapeMap
from tests.rules.helpers import build_model, check_partition, const, rng_of, rules_settings, single_op

SETTINGS = rules_settings(60)

# op → (first opset it exists in at this form, attribute strategy)
ACTIVATIONS = {
    "Relu": (13, st.just({})),
    "LeakyRelu": (13, st.fixed_dictionaries({"alpha": st.sampled_from([0.01, 0.2, 1.5])})),
    "Sigmoid": (13, st.just({})),
    "HardSwish": (14, st.just({})),
    "HardSigmoid": (13, st.fixed_dictionaries({"alpha": st.sampled_from([0.2, 0.5]), "beta": st.sampled_from([0.5, 0.1])})),
    "Tanh": (13, st.just({})),
    "Identity": (13, st.just({})),
    "Elu": (13, st.just({"alpha": 0.7})),
    "Softplus": (13, st.just({})),
    "Neg": (13, st.just({})),
    "Abs": (13, st.just({})),
}


def _shape(draw: st.DrawFn, rank: int = 4) -> list[int]:
    dims = [draw(st.integers(1, 2)), draw(st.integers(1, 12))] + [draw(st.integers(1, 20)) for _ in range(rank - 2)]
    return dims[:rank]


@SETTINGS
@given(st.data(), st.sampled_from(sorted(ACTIVATIONS)), st.sampled_from([2, 3, 4]))
def test_activation(data: st.DataObject, op: str, rank: int) -> None:
    first, attrs = ACTIVATIONS[op]
    shape = _shape(data.draw, rank)
    model = single_op(op, ["x"], {"x": shape}, {}, data.draw(st.integers(first, 17), label="opset"), **data.draw(attrs))
    check_partition(data, model, expect_axes=set(range(rank)))


@SETTINGS
@given(st.data(), st.sampled_from(["both", "min", "max", "none"]))
def test_clip(data: st.DataObject, bounds: str) -> None:
    """Clip with its bounds as scalar constant inputs, absent ones as empty names."""
    rng = rng_of(data)
    lo, hi = sorted(rng.uniform(-1.5, 1.5, 2).astype(np.float32))
    consts = {}
    inputs = ["x", "", ""]
    if bounds in ("both", "min"):
        consts["lo"], inputs[1] = np.array(lo, np.float32), "lo"
    if bounds in ("both", "max"):
        consts["hi"], inputs[2] = np.array(hi, np.float32), "hi"
    while inputs[-1] == "":
        inputs.pop()
    model = single_op("Clip", inputs, {"x": _shape(data.draw)}, consts, data.draw(st.integers(13, 17)))
    checked = check_partition(data, model, expect_axes={0, 1, 2, 3})
    for local in checked.locals:
        for t, need in zip(checked.layer.inputs[1:], local.needs[1:]):
            assert (need is None) == (t == ""), (t, need)
            if need is not None:
                assert need == ShapeMap(())  # a scalar is read whole


@SETTINGS
@given(st.data(), st.booleans(), st.booleans())
def test_dropout(data: st.DataObject, with_ratio: bool, with_mask: bool) -> None:
    """Inference Dropout is Identity; with its mask output read it is not cut."""
    inputs = ["x"] + (["ratio"] if with_ratio else [])
    consts = {"ratio": np.array(0.3, np.float32)} if with_ratio else {}
    outputs = ("y", "mask") if with_mask else ("y",)
    node = helper.make_node("Dropout", inputs, list(outputs), name="op")
    model = build_model([node], {"x": _shape(data.draw)}, consts, list(outputs), data.draw(st.integers(13, 17)))
    check_partition(data, model, expect_axes=set() if with_mask else {0, 1, 2, 3})


# broadcast operand shapes, for an activation of shape (N, C, H, W)
def _operand_shape(kind: str, n: int, c: int, h: int, w: int) -> list[int]:
    return {
        "C11": [c, 1, 1],
        "1C11": [1, c, 1, 1],
        "scalar": [],
        "W": [w],
        "1": [1],
        "HW": [h, w],
        "full": [n, c, h, w],
        "N1HW": [n, 1, h, w],
    }[kind]


@rules_settings(80)
@given(
    st.data(),
    st.sampled_from(["Add", "Sub", "Mul", "Div"]),
    st.sampled_from(["C11", "1C11", "scalar", "W", "1", "HW", "full"]),
    st.booleans(),
)
def test_binary_with_constant(data: st.DataObject, op: str, kind: str, const_first: bool) -> None:
    """x ∘ const and const ∘ x, the constant broadcast against the activation."""
    rng = rng_of(data)
    n, c, h, w = _shape(data.draw)
    b = (const(rng, _operand_shape(kind, n, c, h, w), 0.5, 2.0) * rng.choice([-1, 1])).astype(np.float32)
    inputs = ["k", "x"] if const_first else ["x", "k"]
    model = single_op(op, inputs, {"x": [n, c, h, w]}, {"k": b}, data.draw(st.integers(13, 17)))
    check_partition(data, model, expect_axes={0, 1, 2, 3})


@SETTINGS
@given(st.data(), st.sampled_from(["C11", "1", "HW", "full"]))
def test_prelu(data: st.DataObject, kind: str) -> None:
    """PRelu's slope broadcasts (unidirectionally) like an arithmetic operand."""
    n, c, h, w = _shape(data.draw)
    slope = const(rng_of(data), _operand_shape(kind, n, c, h, w), 0.1, 0.5)
    model = single_op("PRelu", ["x", "slope"], {"x": [n, c, h, w]}, {"slope": slope}, data.draw(st.integers(13, 17)))
    check_partition(data, model, expect_axes={0, 1, 2, 3})


@rules_settings(80)
@given(
    st.data(),
    st.sampled_from(["Add", "Sub", "Mul", "Div", "Max", "Min", "Pow"]),
    st.sampled_from(["full", "1C11", "N1HW", "W", "C11"]),
    st.booleans(),
)
def test_binary_two_activations(data: st.DataObject, op: str, kind: str, swap: bool) -> None:
    """activation ∘ activation, the second one broadcast (or of the same shape)."""
    n, c, h, w = _shape(data.draw)
    shapes = {"a": [n, c, h, w], "b": _operand_shape(kind, n, c, h, w)}
    inputs = ["b", "a"] if swap else ["a", "b"]
    if op == "Pow":  # a positive base keeps real results: Pow(|a| + 1, b) via Abs/Add
        nodes = [
            helper.make_node("Abs", [inputs[0]], ["abs"], name="abs"),
            helper.make_node("Add", ["abs", "one"], ["base"], name="base"),
            helper.make_node("Pow", ["base", inputs[1]], ["y"], name="op"),
        ]
        model = build_model(nodes, shapes, {"one": np.array(1.0, np.float32)}, ["y"], 13)
    else:
        model = single_op(op, inputs, shapes, {}, data.draw(st.integers(13, 17)))
    check_partition(data, model, layer="op", expect_axes={0, 1, 2, 3})


@SETTINGS
@given(st.data(), st.sampled_from(["Sum", "Max", "Mean"]), st.lists(st.sampled_from(["full", "1C11", "W", "C11"]), min_size=2, max_size=2))
def test_variadic(data: st.DataObject, op: str, kinds: list[str]) -> None:
    """Sum/Max/Mean of 3 activations (two of them broadcast) and a constant."""
    n, c, h, w = _shape(data.draw)
    shapes = {"a": [n, c, h, w], "b": _operand_shape(kinds[0], n, c, h, w), "d": _operand_shape(kinds[1], n, c, h, w)}
    with_const = data.draw(st.booleans(), label="constant operand")
    consts = {"k": const(rng_of(data), [c, 1, 1])} if with_const else {}
    order = data.draw(st.permutations(list(shapes) + list(consts)), label="operand order")
    model = single_op(op, order, shapes, consts, data.draw(st.integers(13, 17)))
    check_partition(data, model, expect_axes={0, 1, 2, 3})


@SETTINGS
@given(st.data(), st.sampled_from([[1], [2], [3], [0], [1, 2], [2, 3], [1, 3]]), st.sampled_from([2, 3, 4]))
def test_batch_norm(data: st.DataObject, axes: list[int], rank: int) -> None:
    rng = rng_of(data)
    shape = _shape(data.draw, rank)
    c = shape[1]
    consts = {
        "scale": const(rng, [c]),
        "bias": const(rng, [c]),
        "mean": const(rng, [c]),
        "var": const(rng, [c], 0.5, 2.0),
    }
    model = single_op("BatchNormalization", ["x", "scale", "bias", "mean", "var"], {"x": shape}, consts,
                      data.draw(st.integers(14, 17)), epsilon=data.draw(st.sampled_from([1e-5, 1e-3])))
    checked = check_partition(data, model, expect_axes=set(range(rank)), cut_axes=[a for a in axes if a < rank])
    for box, local in zip(checked.boxes, checked.locals):
        for need in local.needs[1:]:
            assert need == ShapeMap.box([box.interval(1).start], [box.interval(1).stop])


@rules_settings(60)
@given(st.data(), st.integers(1, 4), st.integers(0, 2))
def test_expand(data: st.DataObject, rank: int, extra: int) -> None:
    """Expand to a shape (numpy broadcasting both ways: a 1 in the shape keeps the input's size,
    leading axes added): every output axis is cut, an input axis of size 1 read whole, and the
    local op expands to the piece's shape."""
    out_shape = [data.draw(st.integers(1, 5), label=f"dim {a}") for a in range(rank + extra)]
    x_shape = [d if data.draw(st.booleans(), label=f"keep {a}") else 1 for a, d in enumerate(out_shape[extra:])]
    target = [1 if a >= extra and x_shape[a - extra] == d and data.draw(st.booleans(), label=f"one {a}") else d
              for a, d in enumerate(out_shape)]
    model = single_op("Expand", ["x", "shape"], {"x": x_shape}, {"shape": np.array(target, np.int64)}, 13)
    check_partition(data, model, expect_axes=set(range(len(out_shape))), max_cut_axes=3)


@SETTINGS
@given(st.data(), st.sampled_from(["tensor", "axis"]), st.sampled_from([np.uint8, np.int8]), st.sampled_from([13, 19, 21]))
def test_quantize_and_dequantize(data: st.DataObject, scale_kind: str, dtype: type, opset: int) -> None:
    """QuantizeLinear then DequantizeLinear (each cut on its own, as a quantized model's input
    and a value something besides a layer reads are): the scale and zero point per tensor, or
    1-D along `axis`, cut with the region there."""
    rng = rng_of(data)
    shape = _shape(data.draw)
    axis = data.draw(st.integers(-4, 3), label="axis")
    length = shape[axis] if scale_kind == "axis" else 1
    scale = rng.uniform(0.01, 0.2, length).astype(np.float32)
    zero = rng.integers(-20, 20, length).astype(dtype) if dtype is np.int8 else rng.integers(0, 40, length).astype(dtype)
    consts = {"s": scale if scale_kind == "axis" else scale.reshape(()), "z": zero if scale_kind == "axis" else zero.reshape(())}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="quantize", axis=axis),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dequantize", axis=axis)]
    model = build_model(nodes, {"x": shape}, consts, ["y"], opset)
    for layer in ("quantize", "dequantize"):
        checked = check_partition(data, model, layer=layer, expect_axes={0, 1, 2, 3})
        for local in checked.locals:
            if scale_kind == "axis":  # the scale and zero point of the region's channels along `axis`
                channels = local.computes.interval(axis % 4)
                assert local.needs[1] == local.needs[2] == ShapeMap.box([channels.start], [channels.stop])
            else:
                assert local.needs[1] == local.needs[2] == ShapeMap(())
