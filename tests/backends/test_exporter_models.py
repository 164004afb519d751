"""Exporter-shaped models split across nodes (issue 14): a Linear on an NHWC tensor as
ConvNeXt's exporters write it (Transpose, MatMul, Add with the bias first), a small attention
block (LayerNorm, Q·Kᵀ, Softmax over keys, P·V), whose token cut gathers K and V, a
squeeze-excite block as the dynamo exporter writes it (ReduceMean for the global pool), and
the indexing and reshaping ops around them: Split, Pad (constant; reflect, edge and wrap before
an unpadded conv), Slice and Gather, a ViT block, a
ShuffleNet channel shuffle, a Swin stage's shift, windows and patch merging, nearest upsampling
and attention written with Einsum, and a segmentation head's bilinear upsampling."""

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
    return {r.name: r.cut for r in read_manifest(plan).compiled.layer_table}


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
    # band-pools made the ReduceMean a pool of one row band per node (16 rows split evenly) and a
    # global pool of the bands: cut along rows where the map is, else along channels
    assert cuts["se_pool"] == ("h" if direction == "h" else "c"), "the pool ran on one node, or was not cut along the map's rows"
    assert "se_pool/bands" in cuts


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


def padded_convs(mode: str, opset: int = 13) -> onnx.ModelProto:
    """`nn.Conv2d(padding_mode="reflect")` (or "replicate", "circular") as torch exports it: an
    explicit Pad before an unpadded conv; the pads wider than a third of the rows, so an even
    cut of 2 or 3 nodes falls inside the padding, or a node's rows are all padding."""
    nodes = [helper.make_node("Conv", ["x", "cw"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Pad", ["c", "pads"], ["padded"], name="pad", mode=mode),
             helper.make_node("Conv", ["padded", "cw2"], ["c2"], name="conv2"),
             helper.make_node("Relu", ["c2"], ["y"], name="relu")]
    weights = {"cw": weight([8, 3, 3, 3], 40), "cw2": weight([8, 8, 3, 3], 41),
               "pads": np.array([0, 0, 5, 2, 0, 0, 4, 3], np.int64)}
    return build_model(nodes, {"x": [1, 3, 6, 10]}, weights, ["y"], opset)


@pytest.mark.parametrize("search", [False, True])
@pytest.mark.parametrize(("mode", "opset"), [("reflect", 13), ("edge", 13), ("wrap", 19)])
@pytest.mark.parametrize("nodes", [2, 3])
def test_reflect_edge_wrap_pad_is_split_and_exact(tmp_path, mode: str, opset: int, nodes: int, search: bool) -> None:
    cuts = exact_cuts(tmp_path, padded_convs(mode, opset), nodes=nodes, direction="h", search=search)
    assert cuts["pad"] == "h", cuts


def vit_block(dim: int = 8, heads: int = 2) -> onnx.ModelProto:
    """A ViT block as torch exports it: patch embedding (a stride-4 conv, flatten(2).transpose(1, 2)
    as Reshape and Transpose), a class token Concat, position embedding, LayerNorm, attention with
    qkv split by Reshape, Transpose and rank-0 Gathers (`qkv[0]`), heads merged back by Transpose
    and Reshape, a residual, and the head reading the class token (`x[:, 0]`, a rank-0 Gather)."""
    tokens, hd = 17, dim // heads
    nodes = [helper.make_node("Conv", ["x", "pw"], ["patches"], name="patch_embed", kernel_shape=[4, 4], strides=[4, 4]),
             helper.make_node("Reshape", ["patches", "flat_shape"], ["flat"], name="flatten"),
             helper.make_node("Transpose", ["flat"], ["seq"], name="to_tokens", perm=[0, 2, 1]),
             helper.make_node("Concat", ["cls", "seq"], ["with_cls"], name="cat_cls", axis=1),
             helper.make_node("Add", ["with_cls", "pos"], ["x0"], name="pos_embed"),
             helper.make_node("LayerNormalization", ["x0", "ln_scale", "ln_bias"], ["xn"], name="norm1", axis=-1, epsilon=1e-5),
             helper.make_node("MatMul", ["xn", "Wqkv"], ["qkv0"], name="qkv"),
             helper.make_node("Reshape", ["qkv0", "qkv_shape"], ["qkv1"], name="qkv_heads"),
             helper.make_node("Transpose", ["qkv1"], ["qkv2"], name="qkv_perm", perm=[2, 0, 3, 1, 4])]
    nodes += [helper.make_node("Gather", ["qkv2", f"i{k}"], [p], name=f"take_{p}", axis=0) for k, p in enumerate("qkv")]
    nodes += [helper.make_node("Transpose", ["k"], ["kt"], name="k_t", perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["q", "kt"], ["s0"], name="q_kt"),
              helper.make_node("Mul", ["s0", "scale"], ["s"], name="scale"),
              helper.make_node("Softmax", ["s"], ["p"], name="softmax", axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["o0"], name="p_v"),
              helper.make_node("Transpose", ["o0"], ["o1"], name="merge_perm", perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["o1", "merged_shape"], ["o2"], name="merge_heads"),
              helper.make_node("MatMul", ["o2", "Wproj"], ["o3"], name="proj"),
              helper.make_node("Add", ["x0", "o3"], ["x1"], name="residual"),
              helper.make_node("Gather", ["x1", "i0"], ["cls_out"], name="take_cls", axis=1),
              helper.make_node("Gemm", ["cls_out", "Whead"], ["y"], name="head")]
    weights = {"pw": weight([dim, 3, 4, 4], 40), "cls": weight([1, 1, dim], 41), "pos": weight([1, tokens, dim], 42),
               "ln_scale": weight([dim], 43), "ln_bias": weight([dim], 44), "Wqkv": weight([dim, 3 * dim], 45),
               "Wproj": weight([dim, dim], 46), "Whead": weight([dim, 5], 47), "scale": np.array(hd ** -0.5, np.float32),
               "flat_shape": np.array([1, dim, -1], np.int64), "qkv_shape": np.array([1, tokens, 3, heads, hd], np.int64),
               "merged_shape": np.array([1, tokens, dim], np.int64)}
    weights |= {f"i{k}": np.array(k, np.int64) for k in range(3)}
    return build_model(nodes, {"x": [1, 3, 16, 16]}, weights, ["y"], 17)


@pytest.mark.parametrize("search", [False, True])
@pytest.mark.parametrize(("nodes", "direction"), [(2, "c"), (3, "c"), (2, "h"), (3, "n")])
def test_vit_block_is_split_and_exact(tmp_path, nodes: int, direction: str, search: bool) -> None:
    # "c" names the tokens on [1, T, D] tensors, "h" the embedding; qkv_perm's axis 1 is the batch of 1
    # (naive partitioning cuts a layer only along the direction or channels: qkv_perm's are of size 1 under "c")
    cuts = exact_cuts(tmp_path, vit_block(), nodes=nodes, direction=direction, search=search)
    assert [name for name, cut in cuts.items() if cut == "whole" and not (name == "qkv_perm" and direction == "c")] == [], cuts
    if direction == "h" and search:  # the H-cut patches, flattened (H·W cut) and transposed, stay cut as tokens
        assert (cuts["patch_embed"], cuts["flatten"], cuts["to_tokens"]) == ("h", "axis 2", "axis 1"), cuts


def channel_shuffle(channels: int = 8, groups: int = 2) -> onnx.ModelProto:
    """ShuffleNetV2's channel shuffle between two units: Reshape (N, g, C/g, H, W), Transpose the
    two channel axes, Reshape back, then Split in halves (torch.chunk) and a branch conv."""
    half = channels // 2
    nodes = [helper.make_node("Conv", ["x", "cw"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["c", "grouped_shape"], ["g0"], name="shuffle_split"),
             helper.make_node("Transpose", ["g0"], ["g1"], name="shuffle_swap", perm=[0, 2, 1, 3, 4]),
             helper.make_node("Reshape", ["g1", "merged_shape"], ["shuffled"], name="shuffle_merge"),
             helper.make_node("Split", ["shuffled", "sizes"], ["left", "right"], name="chunk", axis=1),
             helper.make_node("Conv", ["right", "bw"], ["branch"], name="branch_conv", pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["left", "branch"], ["y"], name="cat", axis=1)]
    weights = {"cw": weight([channels, 3, 3, 3], 50), "bw": weight([half, half, 3, 3], 51),
               "grouped_shape": np.array([1, groups, channels // groups, 12, 12], np.int64),
               "merged_shape": np.array([1, channels, 12, 12], np.int64), "sizes": np.array([half, half], np.int64)}
    return build_model(nodes, {"x": [1, 3, 12, 12]}, weights, ["y"], 13)


@pytest.mark.parametrize("search", [False, True])
@pytest.mark.parametrize(("nodes", "direction"), [(2, "h"), (3, "h"), (2, "c"), (4, "c")])
def test_channel_shuffle_is_split_and_exact(tmp_path, nodes: int, direction: str, search: bool) -> None:
    cuts = exact_cuts(tmp_path, channel_shuffle(), nodes=nodes, direction=direction, search=search)
    assert [name for name, cut in cuts.items() if cut == "whole"] == [], cuts


def upsample_einsum_attention(dim: int = 8) -> onnx.ModelProto:
    """An FPN-style nearest ×2 upsample (`interpolate(scale_factor=2)`) between convolutions, then
    the feature map as tokens (Reshape, Transpose) into attention written with Einsum."""
    nodes = [helper.make_node("Conv", ["x", "cw"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Resize", ["c", "", "scales"], ["up"], name="upsample", mode="nearest"),
             helper.make_node("Conv", ["up", "cw2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["c2", "flat_shape"], ["flat"], name="flatten"),
             helper.make_node("Transpose", ["flat"], ["t"], name="to_tokens", perm=[0, 2, 1]),
             helper.make_node("Einsum", ["t", "Wq"], ["q"], name="proj_q", equation="bnd,de->bne"),
             helper.make_node("Einsum", ["q", "t"], ["s"], name="q_kt", equation="bqd,bkd->bqk"),
             helper.make_node("Softmax", ["s"], ["p"], name="softmax", axis=-1),
             helper.make_node("Einsum", ["p", "t"], ["y"], name="p_v", equation="bqk,bkd->bqd")]
    weights = {"cw": weight([dim, 3, 3, 3], 60), "cw2": weight([dim, dim, 3, 3], 61), "Wq": weight([dim, dim], 62),
               "scales": np.array([1, 1, 2, 2], np.float32), "flat_shape": np.array([1, dim, -1], np.int64)}
    return build_model(nodes, {"x": [1, 3, 6, 6]}, weights, ["y"], 13)


@pytest.mark.parametrize("search", [False, True])
@pytest.mark.parametrize(("nodes", "direction"), [(2, "h"), (3, "h"), (2, "c")])
def test_upsample_and_einsum_attention_are_split_and_exact(tmp_path, nodes: int, direction: str, search: bool) -> None:
    cuts = exact_cuts(tmp_path, upsample_einsum_attention(), nodes=nodes, direction=direction, search=search)
    assert [name for name, cut in cuts.items() if cut == "whole"] == [], cuts


def bilinear_head(transform: str, scales: list[float], mode: str = "linear", opset: int = 13) -> onnx.ModelProto:
    """A segmentation head's upsampling, `F.interpolate(mode="bilinear")` as torch exports it
    (pytorch_half_pixel, or align_corners=True), between convolutions; at opsets 11 and 12 with
    the empty roi those opsets require."""
    roi = "roi" if opset < 13 else ""
    nodes = [helper.make_node("Conv", ["x", "cw"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Resize", ["c", roi, "scales"], ["up"], name="upsample", mode=mode,
                              coordinate_transformation_mode=transform),
             helper.make_node("Conv", ["up", "cw2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["y"], name="relu")]
    weights = {"cw": weight([8, 3, 3, 3], 70), "cw2": weight([4, 8, 3, 3], 71), "scales": np.array(scales, np.float32)}
    if roi:
        weights["roi"] = np.zeros(0, np.float32)
    return build_model(nodes, {"x": [1, 3, 7, 6]}, weights, ["y"], opset)


@pytest.mark.parametrize("search", [False, True])
@pytest.mark.parametrize("transform", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"])
@pytest.mark.parametrize("nodes", [2, 3])
def test_bilinear_upsample_is_split_and_exact(tmp_path, transform: str, nodes: int, search: bool) -> None:
    """Bilinear ×2 (and ×3 on W): along h the Resize is cut along h, its pieces reading a halo of
    input rows and emitting rows that lowering crops away (ResizeRule); align_corners' pieces are
    a tf_crop_and_resize of theirs. Bicubic with H kept: along h. Bicubic ×3 on H along w: along w
    without the search (which may price the channels cheaper: cubic reads three rows of halo, and
    then the piece is cut by channels)."""
    cuts = exact_cuts(tmp_path, bilinear_head(transform, [1, 1, 2, 3]), nodes=nodes, direction="h", search=search)
    assert cuts["upsample"] == "h", cuts
    cuts = exact_cuts(tmp_path, bilinear_head(transform, [1, 1, 1, 2], "cubic"), nodes=nodes, direction="h", search=search)
    assert cuts["upsample"] == "h", cuts
    cuts = exact_cuts(tmp_path, bilinear_head(transform, [1, 1, 3, 2], "cubic"), nodes=nodes, direction="w", search=search)
    assert cuts["upsample"] in ({"w", "c"} if search else {"w"}), cuts


@pytest.mark.parametrize(("transform", "scales", "mode"), [
    ("align_corners", [1, 1, 1.5, 2.5], "linear"), ("half_pixel", [1, 1, 0.5, 0.5], "linear"),
    ("pytorch_half_pixel", [1, 1, 0.6, 1], "cubic"), ("asymmetric", [1, 1, 1.5, 1], "linear")])
@pytest.mark.parametrize("nodes", [2, 3])
def test_resize_by_any_factor_mapping_inside_is_split_and_exact(tmp_path, transform: str, scales: list[float], mode: str,
                                                                nodes: int) -> None:
    """align_corners by a non-integer factor, downsampling, and asymmetric ×1.5 of 7 rows (whose last
    row maps onto the input's last): every output row maps inside the input, so along h the Resize
    is cut along h, each piece a tf_crop_and_resize of its input rows (ResizeRule), and the plan is
    exact."""
    cuts = exact_cuts(tmp_path, bilinear_head(transform, scales, mode), nodes=nodes, direction="h")
    assert cuts["upsample"] == "h", cuts


@pytest.mark.parametrize(("mode", "transform", "cut"), [("nearest", "asymmetric", "h"), ("linear", "pytorch_half_pixel", "h"),
                                                       ("linear", "align_corners", "h")])
@pytest.mark.parametrize("nodes", [2, 3])
def test_opset11_resize_with_an_empty_roi_is_split_and_exact(tmp_path, mode: str, transform: str, cut: str, nodes: int) -> None:
    """Opsets 11 and 12 require a roi input, which exporters give empty: the local op gets it as
    it is (a piece cannot read an empty region; it made the layer whole)."""
    cuts = exact_cuts(tmp_path, bilinear_head(transform, [1, 1, 2, 2], mode, opset=11), nodes=nodes, direction="h")
    assert cuts["upsample"] == cut, cuts


def swin_stage(size: int = 8, dim: int = 4, window: int = 4) -> onnx.ModelProto:
    """A Swin stage's data movement as torch exports it, on NHWC tokens: the cyclic shift
    (torch.roll: Slice and Concat per axis), window partition (Reshape splitting H and W into
    windows, Transpose, Reshape merging the windows into the batch), a per-window Linear and
    attention scores, window reverse, and patch merging (`x[:, 0::2, 0::2]` and its three
    siblings: Slices with step 2, Concat, LayerNorm, Linear)."""
    shift, n = window // 2, size // window
    nodes = []
    for axis, src in ((1, "x"), (2, "rolled_h")):
        out = "rolled_h" if axis == 1 else "rolled"
        nodes += [helper.make_node("Slice", [src, "shift_start", "end", f"ax{axis}"], [f"{out}_tail"], name=f"roll{axis}_tail"),
                  helper.make_node("Slice", [src, "zero", "shift_start", f"ax{axis}"], [f"{out}_head"], name=f"roll{axis}_head"),
                  helper.make_node("Concat", [f"{out}_tail", f"{out}_head"], [out], name=f"roll{axis}", axis=axis)]
    nodes += [helper.make_node("Reshape", ["rolled", "split_shape"], ["w0"], name="window_split"),
              helper.make_node("Transpose", ["w0"], ["w1"], name="window_perm", perm=[0, 1, 3, 2, 4, 5]),
              helper.make_node("Reshape", ["w1", "windows_shape"], ["windows"], name="window_merge"),
              helper.make_node("MatMul", ["windows", "Wq"], ["q"], name="proj_q"),
              helper.make_node("Transpose", ["windows"], ["kt"], name="k_t", perm=[0, 2, 1]),
              helper.make_node("MatMul", ["q", "kt"], ["scores"], name="q_kt"),
              helper.make_node("Softmax", ["scores"], ["p"], name="softmax", axis=-1),
              helper.make_node("MatMul", ["p", "windows"], ["attn"], name="p_v"),
              helper.make_node("Reshape", ["attn", "grid_shape"], ["r0"], name="reverse_split"),
              helper.make_node("Transpose", ["r0"], ["r1"], name="reverse_perm", perm=[0, 1, 3, 2, 4, 5]),
              helper.make_node("Reshape", ["r1", "image_shape"], ["image"], name="reverse_merge")]
    quarters = []
    for k, (dh, dw) in enumerate(((0, 0), (1, 0), (0, 1), (1, 1))):
        nodes.append(helper.make_node("Slice", ["image", f"s{k}", "ends", "hw", "twos"], [f"x{k}"], name=f"merge_take{k}"))
        quarters.append(f"x{k}")
    nodes += [helper.make_node("Concat", quarters, ["merged"], name="merge_cat", axis=-1),
              helper.make_node("LayerNormalization", ["merged", "ln_scale", "ln_bias"], ["mn"], name="merge_norm", axis=-1),
              helper.make_node("MatMul", ["mn", "Wr"], ["y"], name="reduction")]
    ints = {"shift_start": [shift], "end": [2**30], "zero": [0], "ax1": [1], "ax2": [2],
            "split_shape": [1, n, window, n, window, dim], "windows_shape": [n * n, window * window, dim],
            "grid_shape": [1, n, n, window, window, dim], "image_shape": [1, size, size, dim],
            "ends": [2**30, 2**30], "hw": [1, 2], "twos": [2, 2]}
    weights = {k: np.array(v, np.int64) for k, v in ints.items()}
    weights |= {f"s{k}": np.array(v, np.int64) for k, v in enumerate(((0, 0), (1, 0), (0, 1), (1, 1)))}
    weights |= {"Wq": weight([dim, dim], 70), "ln_scale": weight([4 * dim], 71), "ln_bias": weight([4 * dim], 72),
                "Wr": weight([4 * dim, 2 * dim], 73)}
    return build_model(nodes, {"x": [1, size, size, dim]}, weights, ["y"], 17)


@pytest.mark.parametrize("search", [False, True])
@pytest.mark.parametrize(("nodes", "direction"), [(2, "c"), (2, "h"), (4, "c")])
def test_swin_stage_is_split_and_exact(tmp_path, nodes: int, direction: str, search: bool) -> None:
    # on NHWC tokens "c" names H (axis 1), "h" W (axis 2); every reshape, roll and strided take is cut
    cuts = exact_cuts(tmp_path, swin_stage(), nodes=nodes, direction=direction, search=search)
    assert [name for name, cut in cuts.items() if cut == "whole"] == [], cuts


@pytest.mark.parametrize("search", [False, True])
@pytest.mark.parametrize("nodes", [2, 3])
def test_lrn_between_channel_cut_convolutions_is_exact(tmp_path, nodes: int, search: bool) -> None:
    """AlexNet/GoogLeNet's LRN between convolutions cut by channels. Before LRN had a channel
    halo, a channel cut computed its edge channels wrong (the plan was off by about 3e-3) and the
    LRN was cut along another axis. Now it may take the channel cut too: its local op reads the
    channel halo and emits those channels, and lowering crops them away (bbgrap/rules/pool.py);
    without the search every layer takes the channel cut."""
    nodes_ = [helper.make_node("Conv", ["x", "w1"], ["a"], name="conv1", pads=[1, 1, 1, 1]),
              helper.make_node("LRN", ["a"], ["n"], name="lrn", size=5, alpha=1e-2, beta=0.75, bias=1.0),
              helper.make_node("Conv", ["n", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1])]
    model = build_model(nodes_, {"x": [1, 3, 12, 12]}, {"w1": weight([12, 3, 3, 3], 0), "w2": weight([6, 12, 3, 3], 1)}, ["y"], 13)
    cuts = exact_cuts(tmp_path, model, nodes=nodes, direction="c", search=search)
    assert cuts["conv1"] == "c" and (search or cuts["lrn"] == "c"), cuts


@pytest.mark.parametrize("search", [False, True])
@pytest.mark.parametrize("nodes", [3, 4])
def test_channel_shuffle_on_more_nodes_than_groups_follows_the_rows(tmp_path, nodes: int, search: bool) -> None:
    """shufflenet_v2_x0_5 on 4 nodes did 2.3 times the work on nodes 0 and 1 as on 2 and 3: the
    shuffle's Transpose to (N, C/g, g, H, W) was cut along its axis 2 (h's axis in a tensor of
    any rank from 3), the g = 2 groups, so two nodes got none and recomputed nothing but every
    node gathered the whole map around it. Where the requested axis is too short for every node,
    a layer takes the axis along which it reads only what each node computed: the rows, as the
    Reshape before it; nothing moves for the shuffle and every node computes a share."""
    plan_dir = str(tmp_path / "plan")
    plan = compile_plan(save(channel_shuffle(), str(tmp_path)), plan_dir, nodes=nodes, direction="h", search=search)
    assert_exact(plan_dir)
    rows = {r.name: r for r in plan.compiled.layer_table}
    assert rows["shuffle_swap"].cut == "axis 3", rows["shuffle_swap"]
    assert all(n.range is not None for n in rows["shuffle_swap"].per_node), rows["shuffle_swap"]
    assert rows["shuffle_split"].bytes_sent == rows["shuffle_swap"].bytes_sent == 0
