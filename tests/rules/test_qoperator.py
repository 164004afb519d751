"""QOperator region rules (onnxruntime's quantize_static with QuantFormat.QOperator: QLinearConv,
QLinearMatMul, com.microsoft's QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu,
QLinearGlobalAveragePool, QLinearAveragePool, QLinearConcat, QGemm): every box computed by the local
op equals the whole op's, to the bit.

Each case is a float op drawn as the float rule's tests draw it, made into its QOperator op as
quantize_static writes it (`qoperator`): a float graph input goes through a QuantizeLinear, a
constant is quantized beforehand (per tensor, or per channel where the op takes that), the
output's scale is fitted to the float op's values on standard normal inputs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper, numpy_helper
from onnx_builder import graph_of, model_of, value_info

from bbgrap.rules.base import MS_DOMAIN
from tests.rules.helpers import check_partition, const, rng_of, rules_settings, run_model, single_op
from tests.rules.test_conv import conv_models
from tests.rules.test_elementwise import ACTIVATIONS, _operand_shape, _shape
from tests.rules.test_pool import AXIS, _window_pool
from tests.rules.test_structural import matmul_model

SETTINGS = rules_settings(40)

# float op → its QOperator op and domain
QOPS = {
    "Conv": ("QLinearConv", ""),
    "MatMul": ("QLinearMatMul", ""),
    "Add": ("QLinearAdd", MS_DOMAIN),
    "Mul": ("QLinearMul", MS_DOMAIN),
    "Sigmoid": ("QLinearSigmoid", MS_DOMAIN),
    "LeakyRelu": ("QLinearLeakyRelu", MS_DOMAIN),
    "GlobalAveragePool": ("QLinearGlobalAveragePool", MS_DOMAIN),
    "AveragePool": ("QLinearAveragePool", MS_DOMAIN),
    "Concat": ("QLinearConcat", MS_DOMAIN),
}
# the axis of a weight a per-channel scale runs along (QLinearConv's output channels, QLinearMatMul's columns)
PER_CHANNEL = {"Conv": 0, "MatMul": -1}


@dataclass(frozen=True)
class Quantization:
    """How a case quantizes: the activations' type, per-channel weights, nonzero zero points."""

    activations: type
    per_channel: bool
    zero_points: bool


def quantizations(per_channel: bool = True) -> st.SearchStrategy[Quantization]:
    return st.builds(Quantization, st.sampled_from([np.uint8, np.int8]), st.booleans() if per_channel else st.just(False),
                     st.booleans())


def _zero_point(dtype: type, rng: np.random.Generator, q: Quantization) -> np.ndarray:
    info = np.iinfo(dtype)
    middle = (int(info.min) + int(info.max) + 1) // 2
    return np.array(middle + (int(rng.integers(-20, 21)) if q.zero_points else 0), dtype)


def qoperator(model: onnx.ModelProto, q: Quantization, rng: np.random.Generator, **extra: Any) -> onnx.ModelProto:
    """The one-node float model `model` with its node as its QOperator op (module docstring), with
    the attributes `extra` besides the float op's."""
    node = model.graph.node[0]
    op, domain = QOPS[node.op_type]
    consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    feeds = {name: rng.standard_normal(s).astype(np.float32) for name, s in shapes.items()}
    y = run_model(model, feeds)[node.output[0]]
    inits: dict[str, np.ndarray] = {}
    nodes: list[onnx.NodeProto] = []
    triples: list[list[str]] = []
    for k, t in enumerate(node.input):
        if not t:
            triples.append([""])
            continue
        scale, zero = f"{t}_scale", f"{t}_zp"
        if t in consts and node.op_type == "Conv" and k == 2:  # the bias: int32 at x's scale times w's
            triples.append([f"{t}_q"])
            inits[f"{t}_q"] = np.round(consts[t] / (inits[triples[0][1]] * inits[triples[1][1]])).astype(np.int32)
            continue
        if t in consts and node.op_type in PER_CHANNEL:  # a weight: int8, symmetric
            value = consts[t]
            axis = PER_CHANNEL[node.op_type] % value.ndim
            others = tuple(a for a in range(value.ndim) if a != axis)
            # onnxruntime takes a per-column scale of a MatMul's B only as 1-D where B is 2-D
            per_channel = q.per_channel and (node.op_type != "MatMul" or value.ndim == 2)
            peak = np.abs(value).max(axis=others) if per_channel else np.array(np.abs(value).max())
            inits[scale] = (np.maximum(peak, 1e-3) / 127).astype(np.float32)
            inits[zero] = np.zeros(inits[scale].shape, np.int8)
            shaped = inits[scale].reshape([-1 if a == axis else 1 for a in range(value.ndim)]) if per_channel else inits[scale]
            inits[f"{t}_q"] = np.clip(np.round(value / shaped), -127, 127).astype(np.int8)
        else:  # an activation (or a constant operand of an elementwise op): per tensor
            value = consts.get(t, feeds.get(t))
            inits[scale] = np.float32(max(float(np.abs(value).max()), 1e-3) / 100)
            inits[zero] = _zero_point(q.activations, rng, q)
            if t in consts:
                inits[f"{t}_q"] = np.clip(np.round(value / inits[scale]) + inits[zero], *_range(q.activations)).astype(q.activations)
            else:
                nodes.append(helper.make_node("QuantizeLinear", [t, scale, zero], [f"{t}_q"], name=f"quantize_{t}"))
        triples.append([f"{t}_q", scale, zero])
    inits["y_scale"] = np.float32(max(float(np.abs(y).max()), 1e-3) / 100)
    inits["y_zp"] = _zero_point(q.activations, rng, q)
    if node.op_type == "Concat":
        inputs = ["y_scale", "y_zp"] + [n for triple in triples for n in triple]
    else:
        inputs = [n for triple in triples[:2] for n in triple] + ["y_scale", "y_zp"] + [n for triple in triples[2:] for n in triple]
    attrs: dict[str, Any] = {a.name: helper.get_attribute_value(a) for a in node.attribute} | extra
    nodes.append(helper.make_node(op, inputs, ["y"], name="op", domain=domain or None, **attrs))
    inits.update({k: v for k, v in consts.items() if k not in node.input})
    out_type = helper.np_dtype_to_tensor_dtype(np.dtype(q.activations))
    graph = graph_of(nodes, [value_info(n, s) for n, s in shapes.items()], [value_info("y", None, out_type)], inits)
    return model_of(graph, {"": max(13, model.opset_import[0].version), MS_DOMAIN: 1}, check=False)


def _range(dtype: type) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


@SETTINGS
@given(conv_models(), quantizations())
def test_qlinear_conv(case: tuple, q: Quantization) -> None:
    """QLinearConv on every geometry the Conv tests draw (groups, depthwise, dilations, strides,
    pads, auto_pad, 1-D to 2-D), per-tensor or per-channel weights: cut along any axis, its
    weights, bias and per-channel scales with the output channels."""
    data, model, _ = case
    qmodel = qoperator(model, q, rng_of(data))
    rank = len(model.graph.input[0].type.tensor_type.shape.dim)
    checked = check_partition(data, qmodel, expect_axes=set(range(rank)), tolerance=0.0)
    layer = checked.layer
    assert layer.op_type == "QLinearConv"
    for local in checked.locals:
        channels = local.computes.interval(1)
        assert local.needs[3].interval(0) == channels
        for k in (4, 5):
            assert local.needs[k].shape == ((len(channels),) if q.per_channel else ()), (k, local.needs[k])
        for k in (1, 2, 6, 7):
            assert local.needs[k].shape == ()


@SETTINGS
@given(st.data(), st.sampled_from(["weight", "activation"]), st.integers(2, 4), st.integers(2, 4), quantizations())
def test_qlinear_matmul(data: st.DataObject, b_kind: str, rank_a: int, rank_b: int, q: Quantization) -> None:
    """QLinearMatMul on the MatMul tests' operands (a weight B per tensor or per column, or an
    activation B; batch axes broadcast): cut along any axis, B's per-column scale with its columns."""
    model, out_rank = matmul_model(data, b_kind, rank_a, rank_b)
    checked = check_partition(data, qoperator(model, q, rng_of(data)), expect_axes=set(range(out_rank)), tolerance=0.0)
    per_column = checked.front.graph.tensors["b_scale"].shape not in ((), (1,))
    for box, local in zip(checked.boxes, checked.locals):
        for k in (4, 5):
            assert local.needs[k].shape == ((len(box.interval(out_rank - 1)),) if per_column else local.needs[k].shape)


@SETTINGS
@given(st.data(), st.sampled_from(["Add", "Mul"]), st.sampled_from(["full", "1C11", "N1HW", "W", "C11", "scalar"]),
       st.sampled_from(["activation", "constant"]), st.booleans(), quantizations(per_channel=False))
def test_qlinear_binary(data: st.DataObject, op: str, kind: str, operand: str, swap: bool, q: Quantization) -> None:
    """com.microsoft's QLinearAdd and QLinearMul, the second operand an activation or a constant,
    broadcast (or of the same shape), on either side."""
    n, c, h, w = _shape(data.draw)
    other = _operand_shape(kind, n, c, h, w)
    activations, consts = {"x": [n, c, h, w]}, {}
    if operand == "activation":
        activations["k"] = other
    else:
        consts["k"] = const(rng_of(data), other)
    model = single_op(op, ["k", "x"] if swap else ["x", "k"], activations, consts, 13)
    check_partition(data, qoperator(model, q, rng_of(data)), expect_axes={0, 1, 2, 3}, tolerance=0.0)


@SETTINGS
@given(st.data(), st.sampled_from(["Sigmoid", "LeakyRelu"]), st.sampled_from([2, 3, 4]), quantizations(per_channel=False))
def test_qlinear_unary(data: st.DataObject, op: str, rank: int, q: Quantization) -> None:
    """com.microsoft's QLinearSigmoid and QLinearLeakyRelu (onnxruntime's lookup tables)."""
    model = single_op(op, ["x"], {"x": _shape(data.draw, rank)}, {}, 13, **data.draw(ACTIVATIONS[op][1]))
    check_partition(data, qoperator(model, q, rng_of(data)), expect_axes=set(range(rank)), tolerance=0.0)


@SETTINGS
@given(st.data(), st.booleans(), quantizations(per_channel=False))
def test_qlinear_global_average_pool(data: st.DataObject, channels_last: bool, q: Quantization) -> None:
    """com.microsoft's QLinearGlobalAveragePool: batch and channels cut, channels the last axis
    where `channels_last` is set (NHWC)."""
    shape = [data.draw(st.integers(1, 2)), data.draw(st.integers(1, 12)), data.draw(st.integers(1, 12)), data.draw(st.integers(1, 12))]
    model = single_op("GlobalAveragePool", ["x"], {"x": shape}, {}, 13)
    qmodel = qoperator(model, q, rng_of(data), channels_last=int(channels_last))
    check_partition(data, qmodel, expect_axes={0, 3} if channels_last else {0, 1}, tolerance=0.0)


@SETTINGS
@given(st.data(), st.sampled_from(["n", "c", "h", "w", "hw", "nc", "cw"]), quantizations(per_channel=False))
def test_qlinear_average_pool(data: st.DataObject, axes: str, q: Quantization) -> None:
    """com.microsoft's QLinearAveragePool on the AveragePool tests' windows (pads, strides,
    ceil_mode, count_include_pad)."""
    model = _window_pool(data.draw, "AveragePool", 2)
    check_partition(data, qoperator(model, q, rng_of(data)), expect_axes={0, 1, 2, 3}, cut_axes=[AXIS[a] for a in axes], tolerance=0.0)


@rules_settings(10)
@given(st.data(), quantizations(per_channel=False))
def test_qlinear_average_pool_channels_last_is_whole(data: st.DataObject, q: Quantization) -> None:
    """A channels-last (NHWC) QLinearAveragePool is not cut: its window is not on the axes the
    windowed rule takes for spatial."""
    model = single_op("AveragePool", ["x"], {"x": [1, 6, 7, 3]}, {}, 13, kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    check_partition(data, qoperator(model, q, rng_of(data), channels_last=1), expect_axes=set(), tolerance=0.0)


@SETTINGS
@given(st.data(), st.integers(1, 4), st.sampled_from([1, 2, 3, -1]), quantizations(per_channel=False))
def test_qlinear_concat(data: st.DataObject, count: int, axis: int, q: Quantization) -> None:
    """com.microsoft's QLinearConcat of activations and constants, each at its own scale: a piece
    keeps the (X, scale, zero point) triples its region touches."""
    base = [data.draw(st.integers(1, 2)), data.draw(st.integers(1, 6)), data.draw(st.integers(1, 8)), data.draw(st.integers(1, 8))]
    activations, consts = {}, {}
    for k in range(count):
        shape = base[:axis % 4] + [data.draw(st.integers(1, 5), label=f"size {k}")] + base[axis % 4 + 1:]
        if k > 0 and data.draw(st.booleans(), label=f"constant {k}"):
            consts[f"x{k}"] = const(rng_of(data), shape)
        else:
            activations[f"x{k}"] = shape
    model = single_op("Concat", [f"x{k}" for k in range(count)], activations, consts, 13, axis=axis)
    checked = check_partition(data, qoperator(model, q, rng_of(data)), expect_axes={0, 1, 2, 3}, tolerance=0.0)
    for local in checked.locals:
        for k in range(count):
            kept = [local.needs[2 + 3 * k + d] is not None for d in range(3)]
            assert kept in ([True] * 3, [False] * 3), (k, local.needs)


@SETTINGS
@given(st.data(), st.integers(0, 1), st.integers(0, 1), st.booleans(), st.booleans(), quantizations())
def test_qgemm(data: st.DataObject, trans_a: int, trans_b: int, bias: bool, float_output: bool, q: Quantization) -> None:
    """com.microsoft's QGemm (quantize_static's Gemm: a quantized classifier), with alpha: rows and
    columns cut; B per tensor or per column (its axis 0 under transB), its scale and zero point
    and the int32 bias C cut with the columns; the output quantized or, without y_scale, float."""
    rng = rng_of(data)
    m, k, n = (data.draw(st.integers(1, 12), label=d) for d in "MKN")
    alpha = data.draw(st.sampled_from([1.0, 0.5]), label="alpha")
    a = rng.standard_normal([k, m] if trans_a else [m, k]).astype(np.float32)
    b = rng.standard_normal([n, k] if trans_b else [k, n]).astype(np.float32)
    columns = 0 if trans_b else 1
    a_scale = np.float32(np.abs(a).max() / 100)
    b_peak = np.abs(b).max(axis=1 - columns) if q.per_channel else np.array(np.abs(b).max())
    b_scale = (np.maximum(b_peak, 1e-3) / 127).astype(np.float32)
    inits: dict[str, np.ndarray] = {
        "a_scale": a_scale, "a_zp": _zero_point(q.activations, rng, q), "b_scale": b_scale,
        "b_zp": np.zeros(b_scale.shape, np.int8),
        "b_q": np.clip(np.round(b / (b_scale.reshape([-1, 1] if columns == 0 else [1, -1]) if q.per_channel else b_scale)),
                       -127, 127).astype(np.int8)}
    inputs = ["a_q", "a_scale", "a_zp", "b_q", "b_scale", "b_zp"]
    y = alpha * ((a.T if trans_a else a) @ (b.T if trans_b else b))
    if bias:
        inits["c"] = rng.integers(-2000, 2000, [n]).astype(np.int32)
        inputs.append("c")
    out_type = onnx.TensorProto.FLOAT
    if not float_output:
        inits["y_scale"], inits["y_zp"] = np.float32(max(float(np.abs(y).max()), 1e-3) / 100), _zero_point(q.activations, rng, q)
        inputs += ([] if bias else [""]) + ["y_scale", "y_zp"]
        out_type = helper.np_dtype_to_tensor_dtype(np.dtype(q.activations))
    nodes = [helper.make_node("QuantizeLinear", ["a", "a_scale", "a_zp"], ["a_q"], name="quantize_a"),
             helper.make_node("QGemm", inputs, ["y"], name="op", domain=MS_DOMAIN, alpha=alpha, transA=trans_a, transB=trans_b)]
    graph = graph_of(nodes, [value_info("a", list(a.shape))], [value_info("y", None, out_type)], inits)
    checked = check_partition(data, model_of(graph, {"": 13, MS_DOMAIN: 1}, check=False), expect_axes={0, 1}, tolerance=0.0)
    assert checked.layer.op_type == "QGemm"
    for box, local in zip(checked.boxes, checked.locals):
        cols = box.interval(1)
        assert local.needs[3].interval(columns) == cols
        for j in (4, 5):
            assert local.needs[j].shape == ((len(cols),) if q.per_channel else ()), (j, local.needs[j])
        if bias:
            assert local.needs[6].interval(0) == cols
