"""Exporter-shaped MatMul models split across nodes (issue 14): a Linear on an NHWC tensor as
ConvNeXt's exporters write it (Transpose, MatMul, Add with the bias first), and a small
attention block (Q·Kᵀ, Softmax over keys, P·V), whose token cut gathers K and V."""

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
    nodes = [helper.make_node("MatMul", ["x", f"W{p}"], [p], name=f"proj_{p}") for p in "qkv"]
    nodes += [helper.make_node("Transpose", ["k"], ["kt"], name="k_t", perm=[0, 2, 1]),
              helper.make_node("MatMul", ["q", "kt"], ["scores"], name="q_kt"),
              helper.make_node("Softmax", ["scores"], ["p"], name="softmax", axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["y"], name="p_v")]
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, tokens, dim])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, tokens, dim])],
                              [weight(f"W{p}", [dim, dim], 3 + i) for i, p in enumerate("qkv")])
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
