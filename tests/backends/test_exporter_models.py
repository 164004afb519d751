"""Exporter-shaped models split across nodes (issue 14): a Linear on an NHWC tensor as
ConvNeXt's exporters write it (Transpose, MatMul, Add with the bias first), a small attention
block (LayerNorm, Q·Kᵀ, Softmax over keys, P·V), whose token cut gathers K and V, and a
squeeze-excite block as the dynamo exporter writes it (ReduceMean for the global pool)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import assert_exact, compile_plan, save
from onnx import TensorProto, helper, numpy_helper

from bbgrap.plan import read_manifest


def weight(name: str, shape: list[int], seed: int) -> onnx.TensorProto:
    return numpy_helper.from_array((np.random.default_rng(seed).standard_normal(shape) * 0.3).astype(np.float32), name)


def convnext_linear() -> onnx.ModelProto:
    nodes = [helper.make_node("Conv", ["x", "cw"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Transpose", ["c"], ["t"], name="to_nhwc", perm=[0, 2, 3, 1]),
             helper.make_node("MatMul", ["t", "W"], ["mm"], name="pwconv1"),
             helper.make_node("Add", ["b", "mm"], ["lin"], name="pwconv1_bias"),  # the exporter's order: bias first
             helper.make_node("Transpose", ["lin"], ["y"], name="to_nchw", perm=[0, 3, 1, 2])]
    graph = helper.make_graph(nodes, "convnext_linear", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 16, 16])],
                              [weight("cw", [8, 3, 3, 3], 0), weight("W", [8, 32], 1), weight("b", [32], 2)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def attention(tokens: int = 16, dim: int = 8) -> onnx.ModelProto:
    nodes = [helper.make_node("LayerNormalization", ["x0", "ln_scale", "ln_bias"], ["x"], name="norm1", axis=-1, epsilon=1e-5)]
    nodes += [helper.make_node("MatMul", ["x", f"W{p}"], [p], name=f"proj_{p}") for p in "qkv"]
    nodes += [helper.make_node("Transpose", ["k"], ["kt"], name="k_t", perm=[0, 2, 1]),
              helper.make_node("MatMul", ["q", "kt"], ["scores"], name="q_kt"),
              helper.make_node("Softmax", ["scores"], ["p"], name="softmax", axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["y"], name="p_v")]
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("x0", TensorProto.FLOAT, [1, tokens, dim])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, tokens, dim])],
                              [weight(f"W{p}", [dim, dim], 3 + i) for i, p in enumerate("qkv")]
                              + [weight("ln_scale", [dim], 7), weight("ln_bias", [dim], 8)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("search", [False, True])
@pytest.mark.parametrize(("nodes", "direction"), [(2, "h"), (2, "w"), (4, "h"), (4, "c")])
def test_convnext_linear_is_split_and_exact(tmp_path, nodes: int, direction: str, search: bool) -> None:
    plan = str(tmp_path / "plan")
    compile_plan(save(convnext_linear(), str(tmp_path)), plan, nodes=nodes, direction=direction, search=search)
    assert_exact(plan)
    rows = {r["name"]: r for r in read_manifest(plan)["layer_table"]}
    assert rows["pwconv1"]["cut"] != "whole", "the Linear ran on one node"


@pytest.mark.parametrize("search", [False, True])
@pytest.mark.parametrize(("nodes", "direction"), [(2, "h"), (4, "h"), (2, "c"), (3, "c")])
def test_attention_is_split_and_exact(tmp_path, nodes: int, direction: str, search: bool) -> None:
    # on [1, T, D] tensors direction c names axis 1, the tokens (each node its queries' rows, K and V
    # gathered: sequence parallelism), and h axis 2, the embedding (projections cut by output channel)
    plan = str(tmp_path / "plan")
    compile_plan(save(attention(), str(tmp_path)), plan, nodes=nodes, direction=direction, search=search)
    assert_exact(plan)
    rows = {r["name"]: r for r in read_manifest(plan)["layer_table"]}
    assert all(rows[name]["cut"] != "whole" for name in ("proj_q", "q_kt", "p_v")), {k: r["cut"] for k, r in rows.items()}
    if direction == "c":  # the token cut: the normalisation is cut too (along tokens; it normalises embeddings)
        assert rows["norm1"]["cut"] != "whole"


def squeeze_excite(channels: int = 16, opset: int = 18) -> onnx.ModelProto:
    """conv → ReduceMean over H, W (keepdims) → 1x1 conv → Relu → 1x1 conv → Sigmoid → Mul, the
    dynamo exporter's adaptive_avg_pool2d((1, 1)) with axes as an input from opset 18."""
    mean = (helper.make_node("ReduceMean", ["c", "axes"], ["pooled"], name="se_pool", keepdims=1) if opset >= 18
            else helper.make_node("ReduceMean", ["c"], ["pooled"], name="se_pool", axes=[2, 3], keepdims=1))
    nodes = [helper.make_node("Conv", ["x", "cw"], ["c"], name="conv", pads=[1, 1, 1, 1]), mean,
             helper.make_node("Conv", ["pooled", "w1"], ["s1"], name="se_fc1"),
             helper.make_node("Relu", ["s1"], ["r1"], name="se_relu"),
             helper.make_node("Conv", ["r1", "w2"], ["s2"], name="se_fc2"),
             helper.make_node("Sigmoid", ["s2"], ["gate"], name="se_gate"),
             helper.make_node("Mul", ["c", "gate"], ["y"], name="se_scale")]
    inits = [weight("cw", [channels, 3, 3, 3], 10), weight("w1", [4, channels, 1, 1], 11), weight("w2", [channels, 4, 1, 1], 12)]
    if opset >= 18:
        inits.append(numpy_helper.from_array(np.array([2, 3], np.int64), "axes"))
    graph = helper.make_graph(nodes, "se", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, 16, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8 if opset < 18 else 9
    return model


@pytest.mark.parametrize("opset", [17, 18])
@pytest.mark.parametrize(("nodes", "direction"), [(2, "h"), (4, "h"), (4, "c")])
def test_squeeze_excite_pool_is_split_and_exact(tmp_path, nodes: int, direction: str, opset: int) -> None:
    plan = str(tmp_path / "plan")
    compile_plan(save(squeeze_excite(opset=opset), str(tmp_path)), plan, nodes=nodes, direction=direction, search=True)
    assert_exact(plan)
    rows = {r["name"]: r for r in read_manifest(plan)["layer_table"]}
    assert rows["se_pool"]["cut"] == "c", "the pool (ReduceMean) ran on one node"


def decomposed_layer_norm(tokens: int = 12, dim: int = 8) -> onnx.ModelProto:
    """LayerNorm as the classic exporter writes it below opset 17, then a GELU (Erf form) Linear."""
    scalars = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("two", 2.0), ("eps", 1e-5), ("half", 0.5),
                                                                              ("one", 1.0), ("rsqrt2", 2 ** -0.5))]
    nodes = [helper.make_node("ReduceMean", ["x"], ["mu"], name="ln_mean", axes=[-1], keepdims=1),
             helper.make_node("Sub", ["x", "mu"], ["xc"], name="ln_sub"),
             helper.make_node("Pow", ["xc", "two"], ["sq"], name="ln_pow"),
             helper.make_node("ReduceMean", ["sq"], ["var"], name="ln_var", axes=[-1], keepdims=1),
             helper.make_node("Add", ["var", "eps"], ["ve"], name="ln_add_eps"),
             helper.make_node("Sqrt", ["ve"], ["sd"], name="ln_sqrt"),
             helper.make_node("Div", ["xc", "sd"], ["xn"], name="ln_div"),
             helper.make_node("Mul", ["xn", "g"], ["xs"], name="ln_scale"),
             helper.make_node("Add", ["xs", "b"], ["ln"], name="ln_shift"),
             helper.make_node("MatMul", ["ln", "W"], ["h"], name="fc1"),
             helper.make_node("Mul", ["h", "rsqrt2"], ["hs"], name="gelu_scale"),
             helper.make_node("Erf", ["hs"], ["e"], name="gelu_erf"),
             helper.make_node("Add", ["e", "one"], ["e1"], name="gelu_add"),
             helper.make_node("Mul", ["h", "e1"], ["he"], name="gelu_mul"),
             helper.make_node("Mul", ["he", "half"], ["y"], name="gelu_half")]
    graph = helper.make_graph(nodes, "ln_gelu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, tokens, dim])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, tokens, 2 * dim])],
                              scalars + [weight("g", [dim], 20), weight("b", [dim], 21), weight("W", [dim, 2 * dim], 22)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("nodes", [2, 3])
def test_decomposed_layer_norm_and_gelu_are_cut_by_tokens(tmp_path, nodes: int) -> None:
    plan = str(tmp_path / "plan")
    compile_plan(save(decomposed_layer_norm(), str(tmp_path)), plan, nodes=nodes, direction="c", search=True)
    assert_exact(plan)
    whole = [r["name"] for r in read_manifest(plan)["layer_table"] if r["cut"] == "whole"]
    assert whole == [], f"computed whole on one node: {whole}"
