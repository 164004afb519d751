"""Exporter-shaped models split across nodes (issue 14): a Linear on an NHWC tensor as
ConvNeXt's exporters write it (Transpose, MatMul, Add with the bias first), a small attention
block (LayerNorm, Q·Kᵀ, Softmax over keys, P·V), whose token cut gathers K and V, and a
squeeze-excite block as the dynamo exporter writes it (ReduceMean for the global pool)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import assert_exact, compile_plan, save
from onnx import helper

from bbgrap.plan import read_manifest
from tests.rules.helpers import build_model


def weight(shape: list[int], seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * 0.3).astype(np.float32)


def exact_cuts(tmp_path, model: onnx.ModelProto, **options: object) -> dict[str, str]:
    """Compile `model` (compile_plan's options), check the plan runs exactly, and return each
    layer's cut from the plan's layer table ('whole' where it runs on one node)."""
    plan = str(tmp_path / "plan")
    compile_plan(save(model, str(tmp_path)), plan, **options)
    assert_exact(plan)
    return {r["name"]: r["cut"] for r in read_manifest(plan)["layer_table"]}


def convnext_linear() -> onnx.ModelProto:
    nodes = [helper.make_node("Conv", ["x", "cw"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Transpose", ["c"], ["t"], name="to_nhwc", perm=[0, 2, 3, 1]),
             helper.make_node("MatMul", ["t", "W"], ["mm"], name="pwconv1"),
             helper.make_node("Add", ["b", "mm"], ["lin"], name="pwconv1_bias"),  # the exporter's order: bias first
             helper.make_node("Transpose", ["lin"], ["y"], name="to_nchw", perm=[0, 3, 1, 2])]
    weights = {"cw": weight([8, 3, 3, 3], 0), "W": weight([8, 32], 1), "b": weight([32], 2)}
    return build_model(nodes, {"x": [1, 3, 16, 16]}, weights, ["y"], 17)


def attention(tokens: int = 16, dim: int = 8) -> onnx.ModelProto:
    nodes = [helper.make_node("LayerNormalization", ["x0", "ln_scale", "ln_bias"], ["x"], name="norm1", axis=-1, epsilon=1e-5)]
    nodes += [helper.make_node("MatMul", ["x", f"W{p}"], [p], name=f"proj_{p}") for p in "qkv"]
    nodes += [helper.make_node("Transpose", ["k"], ["kt"], name="k_t", perm=[0, 2, 1]),
              helper.make_node("MatMul", ["q", "kt"], ["scores"], name="q_kt"),
              helper.make_node("Softmax", ["scores"], ["p"], name="softmax", axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["y"], name="p_v")]
    weights = {f"W{p}": weight([dim, dim], 3 + i) for i, p in enumerate("qkv")}
    weights |= {"ln_scale": weight([dim], 7), "ln_bias": weight([dim], 8)}
    return build_model(nodes, {"x0": [1, tokens, dim]}, weights, ["y"], 17)


@pytest.mark.parametrize("search", [False, True])
@pytest.mark.parametrize(("nodes", "direction"), [(2, "h"), (2, "w"), (4, "h"), (4, "c")])
def test_convnext_linear_is_split_and_exact(tmp_path, nodes: int, direction: str, search: bool) -> None:
    cuts = exact_cuts(tmp_path, convnext_linear(), nodes=nodes, direction=direction, search=search)
    assert cuts["pwconv1"] != "whole", "the Linear ran on one node"


@pytest.mark.parametrize("search", [False, True])
@pytest.mark.parametrize(("nodes", "direction"), [(2, "h"), (4, "h"), (2, "c"), (3, "c")])
def test_attention_is_split_and_exact(tmp_path, nodes: int, direction: str, search: bool) -> None:
    # on [1, T, D] tensors direction c names axis 1, the tokens (each node its queries' rows, K and V
    # gathered: sequence parallelism), and h axis 2, the embedding (projections cut by output channel)
    cuts = exact_cuts(tmp_path, attention(), nodes=nodes, direction=direction, search=search)
    assert all(cuts[name] != "whole" for name in ("proj_q", "q_kt", "p_v")), cuts
    if direction == "c":  # the token cut: the normalisation is cut too (along tokens; it normalises embeddings)
        assert cuts["norm1"] != "whole"


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
    weights = {"cw": weight([channels, 3, 3, 3], 10), "w1": weight([4, channels, 1, 1], 11), "w2": weight([channels, 4, 1, 1], 12)}
    if opset >= 18:
        weights["axes"] = np.array([2, 3], np.int64)
    return build_model(nodes, {"x": [1, 3, 16, 16]}, weights, ["y"], opset)


@pytest.mark.parametrize("opset", [17, 18])
@pytest.mark.parametrize(("nodes", "direction"), [(2, "h"), (4, "h"), (4, "c")])
def test_squeeze_excite_pool_is_split_and_exact(tmp_path, nodes: int, direction: str, opset: int) -> None:
    cuts = exact_cuts(tmp_path, squeeze_excite(opset=opset), nodes=nodes, direction=direction, search=True)
    assert cuts["se_pool"] == "c", "the pool (ReduceMean) ran on one node"


def decomposed_layer_norm(tokens: int = 12, dim: int = 8) -> onnx.ModelProto:
    """LayerNorm as the classic exporter writes it below opset 17, then a GELU (Erf form) Linear."""
    scalars = {n: np.array(v, np.float32) for n, v in (("two", 2.0), ("eps", 1e-5), ("half", 0.5), ("one", 1.0), ("rsqrt2", 2 ** -0.5))}
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
    weights = scalars | {"g": weight([dim], 20), "b": weight([dim], 21), "W": weight([dim, 2 * dim], 22)}
    return build_model(nodes, {"x": [1, tokens, dim]}, weights, ["y"], 13)


@pytest.mark.parametrize("nodes", [2, 3])
def test_decomposed_layer_norm_and_gelu_are_cut_by_tokens(tmp_path, nodes: int) -> None:
    cuts = exact_cuts(tmp_path, decomposed_layer_norm(), nodes=nodes, direction="c", search=True)
    assert [name for name, cut in cuts.items() if cut == "whole"] == [], cuts


def split_pad_gather(channels: int = 8, opset: int = 13) -> onnx.ModelProto:
    """ShuffleNetV2's unit without its shuffle: Split the channels in two halves (sizes a constant
    input, as torch.chunk exports), a branch on the second (explicit Pad, then an unpadded conv),
    Concat; then a crop (Slice of rows 1 to -1 with a step-2 column subsample) and a Gather of one
    row (torch's `x[:, :, 0]`) and of a few columns."""
    half = channels // 2
    nodes = [helper.make_node("Conv", ["x", "cw"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Split", ["c", "sizes"], ["left", "right"], name="chunk", axis=1),
             helper.make_node("Pad", ["right", "pads"], ["padded"], name="pad", mode="constant"),
             helper.make_node("Conv", ["padded", "bw"], ["branch"], name="branch_conv"),
             helper.make_node("Concat", ["left", "branch"], ["cat"], name="cat", axis=1),
             helper.make_node("Slice", ["cat", "starts", "ends", "axes", "steps"], ["crop"], name="crop"),
             helper.make_node("Gather", ["crop", "row"], ["first_row"], name="first_row", axis=2),
             helper.make_node("Gather", ["crop", "cols"], ["cols_out"], name="some_cols", axis=3),
             helper.make_node("Relu", ["first_row"], ["y0"], name="relu0"),
             helper.make_node("Relu", ["cols_out"], ["y1"], name="relu1")]
    weights = {"cw": weight([channels, 3, 3, 3], 30), "bw": weight([half, half, 3, 3], 31),
               "sizes": np.array([half, half], np.int64), "pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64),
               "starts": np.array([1, 0], np.int64), "ends": np.array([-1, 2**30], np.int64),
               "axes": np.array([2, 3], np.int64), "steps": np.array([1, 2], np.int64),
               "row": np.array(0, np.int64), "cols": np.array([3, 0, -1], np.int64)}
    return build_model(nodes, {"x": [1, 3, 16, 16]}, weights, ["y0", "y1"], opset)


@pytest.mark.parametrize("search", [False, True])
@pytest.mark.parametrize(("nodes", "direction"), [(2, "h"), (3, "h"), (4, "c"), (2, "w")])
def test_split_pad_slice_gather_are_split_and_exact(tmp_path, nodes: int, direction: str, search: bool) -> None:
    cuts = exact_cuts(tmp_path, split_pad_gather(), nodes=nodes, direction=direction, search=search)
    assert all(cuts[name] != "whole" for name in ("chunk/0", "chunk/1", "pad", "crop", "first_row", "some_cols")), cuts
