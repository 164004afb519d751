"""A BatchNormalization whose result is rounded later gets parameters onnxruntime computes alike
in either layout (frontends/norms.py): the scale and shift of each of onnxruntime's two ways are
its bits, and the frontend picks the way the whole model takes."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from bbgrap.frontends import norms
from bbgrap.frontends.onnx import import_proto
from onnx import TensorProto, helper, numpy_helper

from bbgrap.rules.base import NCHWC_DOMAIN
from bbgrap.rules.elementwise import same_in_every_layout
from bbgrap.rules.registry import default_registry

EPSILON = 1e-5


def parameters(channels: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"g": rng.normal(1, 0.3, channels), "b": rng.normal(0, 0.3, channels), "m": rng.normal(0, 0.3, channels),
            "v": rng.uniform(0.2, 2, channels)}


def pooled_norm(channels: int, seed: int, rounded: bool = True) -> onnx.ModelProto:
    """x[1,C,12,12] → MaxPool 3×3 → BatchNormalization "norm" → [DynamicQuantizeLinear: y, its
    scale and zero point] (rounded) or → y."""
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], name="pool", kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("BatchNormalization", ["p", "g", "b", "m", "v"], ["n"], name="norm", epsilon=EPSILON)]
    outputs = {"n": TensorProto.FLOAT}
    if rounded:
        nodes.append(helper.make_node("DynamicQuantizeLinear", ["n"], ["y", "ys", "yz"], name="round"))
        outputs = {"y": TensorProto.UINT8, "ys": TensorProto.FLOAT, "yz": TensorProto.UINT8}
    graph = helper.make_graph(nodes, "norm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, 12, 12])],
                              [helper.make_tensor_value_info(o, t, None) for o, t in outputs.items()],
                              [numpy_helper.from_array(v.astype(np.float32), k) for k, v in parameters(channels, seed).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def run(model: onnx.ModelProto, x: np.ndarray, names: list[str] | None = None) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(names, {"x": x})


def with_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.output[:]
    out.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_each_way_s_scale_and_shift_are_onnxruntime_s_bits(seed: int) -> None:
    """Over 48 channels of random parameters, `affine`'s x·scale + shift (each rounded) equals
    onnxruntime's BatchNormalization to the bit: run as its own kernel (input straight from the
    graph input, NCHW) with `Way.KERNEL`, and after a MaxPool it runs blocked with `Way.BLOCKED`.
    The two ways' scales differ in some channel, so taking the wrong one would show."""
    model = pooled_norm(48, seed, rounded=False)
    graph = import_proto(model).graph
    layer = graph.layer("norm")
    x = np.random.default_rng(seed).standard_normal((1, 48, 12, 12)).astype(np.float32)
    pooled, blocked = run(with_outputs(model, ["p", "n"]), x)
    alone = onnx.ModelProto()
    alone.CopyFrom(model)
    del alone.graph.node[0]  # the norm reads the graph input: onnxruntime runs its own kernel
    alone.graph.node[0].input[0] = "x"
    [kernel] = run(alone, pooled)
    ways = {way: norms.affine(layer, graph, way) for way in norms.Way}
    for way, want in ((norms.Way.BLOCKED, blocked), (norms.Way.KERNEL, kernel)):
        got = pooled * ways[way].scale[None, :, None, None] + ways[way].shift[None, :, None, None]
        assert got.dtype == np.float32 and np.array_equal(got, want), way
    assert not np.array_equal(ways[norms.Way.BLOCKED].scale, ways[norms.Way.KERNEL].scale)
    assert not np.array_equal(blocked, kernel), "onnxruntime's two ways differ on this input"


@pytest.mark.parametrize(("channels", "way"), [(32, norms.Way.BLOCKED), (24, norms.Way.KERNEL)])
def test_a_rounded_norm_gets_the_parameters_of_the_way_onnxruntime_runs_it(channels: int, way: norms.Way) -> None:
    """After a MaxPool of whole 16-channel blocks onnxruntime runs the norm blocked; after one of
    24 channels, which it leaves in NCHW, with its own kernel. The frontend keeps the norm, its name
    and output, and gives it γ = that way's scale, β = its shift, μ = 0, σ² = 1, ε = 0, which the
    rule knows to compute alike in every layout (no grain)."""
    graph = import_proto(pooled_norm(channels, 3)).graph
    layer = graph.layer("norm")
    assert [la.op_type for la in graph.layers] == ["MaxPool", "BatchNormalization", "DynamicQuantizeLinear"]
    assert layer.inputs[0] == "p" and layer.outputs == ("n",) and layer.attrs["epsilon"] == 0.0
    reference = import_proto(pooled_norm(channels, 3, rounded=False)).graph
    want = norms.affine(reference.layer("norm"), reference, way)
    gamma, beta, mean, variance = (graph.constants[t] for t in layer.inputs[1:])
    assert np.array_equal(gamma, want.scale) and np.array_equal(beta, want.shift)
    assert not mean.any() and (variance == 1).all()
    assert not {"g", "b", "m", "v"} & set(graph.constants), "the norm's own parameters are left behind"
    assert graph.rounded_later(layer) and same_in_every_layout(layer, graph)
    assert default_registry().get(layer).grain(layer, graph, 1) == 1
    assert default_registry().get(reference.layer("norm")).grain(reference.layer("norm"), reference, 1) == 1, "not rounded"


@pytest.mark.parametrize("seed", range(3))
def test_the_new_parameters_give_the_whole_norm_s_bits_in_either_layout(seed: int) -> None:
    """The norm with the frontend's parameters computes the original norm's bits both where
    onnxruntime runs it blocked (after the MaxPool, 32 channels) and where it runs its kernel (on
    the pool's result given as an input): the property every piece relies on."""
    model = pooled_norm(32, seed, rounded=False)
    x = np.random.default_rng(seed).standard_normal((1, 32, 12, 12)).astype(np.float32)
    pooled, want = run(with_outputs(model, ["p", "n"]), x)
    graph = import_proto(pooled_norm(32, seed)).graph
    layer = graph.layer("norm")
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    norm = rewritten.graph.node[1]
    del rewritten.graph.initializer[:]
    rewritten.graph.initializer.extend(numpy_helper.from_array(graph.constants[t], k) for k, t in zip("gbmv", layer.inputs[1:]))
    norm.ClearField("attribute")
    norm.attribute.append(helper.make_attribute("epsilon", 0.0))
    [blocked] = run(rewritten, x)
    del rewritten.graph.node[0]
    rewritten.graph.node[0].input[0] = "x"
    [kernel] = run(rewritten, pooled)
    assert np.array_equal(blocked, want) and np.array_equal(kernel, want)


def test_a_norm_nothing_rounds_stays_as_written() -> None:
    """A float model's BatchNormalization (its last bit within any tolerance) is left as written."""
    graph = import_proto(pooled_norm(32, 3, rounded=False)).graph
    layer = graph.layer("norm")
    assert layer.inputs[1:] == ("g", "b", "m", "v") and layer.attrs["epsilon"] == pytest.approx(EPSILON)
    assert not same_in_every_layout(layer, graph)


def test_ways_reads_onnxruntime_s_optimised_graph() -> None:
    """`ways` finds a norm still a BatchNormalization writing its output (its kernel), a blocked
    convolution named after its output (blocked), and leaves out one found neither way (folded)."""
    layers = [la for la in import_proto(pooled_norm(32, 3, rounded=False)).graph.layers if la.op_type == "BatchNormalization"]
    kernel = [helper.make_node("BatchNormalization", ["p", "g", "b", "m", "v"], ["n"])]
    blocked = [helper.make_node("Conv", ["p", "s", "t"], ["r"], name="n_bn_nchwc_token_3", domain=NCHWC_DOMAIN)]
    folded = [helper.make_node("Conv", ["x", "w"], ["n"], name="conv")]
    assert norms.ways(layers, kernel) == {"norm": norms.Way.KERNEL}
    assert norms.ways(layers, blocked) == {"norm": norms.Way.BLOCKED}
    assert norms.ways(layers, folded) == {}
