"""The frontend keeps a quantized (QDQ) model's patterns whole (frontends/quantized.py): each
layer takes the DequantizeLinear nodes before it and the Relu/Clip and QuantizeLinear after it,
and a weight's DequantizeLinear is recorded for lowering instead of disappearing into a float
constant."""

from __future__ import annotations

import numpy as np
import onnx
from bbgrap.backends.lower import lower
from bbgrap.frontends.onnx import import_proto
from onnx import TensorProto, helper, numpy_helper

from bbgrap.compiler import pipeline
from bbgrap.config import Config, Direction
from bbgrap.cost import weight_bytes
from bbgrap.ir import Attached
from bbgrap.pass_manager import PassManager

RNG = np.random.default_rng(5)
ACT = {"s": np.float32(0.05), "z": np.uint8(10)}  # the activations' scale and zero point


def model(nodes: list[onnx.NodeProto], outputs: list[str], extra: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
    consts = {**ACT, "wq": RNG.integers(-90, 90, (4, 3, 3, 3)).astype(np.int8), "ws": np.linspace(0.01, 0.02, 4, dtype=np.float32),
              "wz": np.zeros(4, np.int8), **(extra or {})}
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def node(op: str, inputs: list[str], output: str, **attrs: object) -> onnx.NodeProto:
    return helper.make_node(op, inputs, [output], name=output, **attrs)


INPUT = [node("QuantizeLinear", ["x", "s", "z"], "xq"), node("DequantizeLinear", ["xq", "s", "z"], "xd"),
         node("DequantizeLinear", ["wq", "ws", "wz"], "wd", axis=0)]


def test_a_convolution_takes_its_pattern_and_its_weight_stays_integer() -> None:
    nodes = [*INPUT, node("Conv", ["xd", "wd"], "a", pads=[1] * 4), node("Relu", ["a"], "r"), node("QuantizeLinear", ["r", "s", "z"], "rq"),
             node("DequantizeLinear", ["rq", "s", "z"], "y")]
    graph = import_proto(model(nodes, ["y"])).graph
    assert [la.op_type for la in graph.layers] == ["QuantizeLinear", "Conv", "DequantizeLinear"]
    conv = graph.layer("a")
    assert conv.inputs == ("xq", "wd") and conv.outputs == ("rq",)
    assert conv.fused is not None
    assert conv.fused.inputs == ((0, Attached("DequantizeLinear", {}, ("s", "z"))),)
    assert [op.op_type for op in conv.fused.outputs] == ["Relu", "QuantizeLinear"]
    assert graph.tensors["xq"].dtype == "uint8" and graph.tensors["rq"].dtype == "uint8"
    weight = graph.dequantized["wd"]
    assert weight.source == "wq" and weight.node.axis == 0 and weight.node.operands == ("ws", "wz")
    assert graph.constants["wq"].dtype == np.int8
    assert graph.itemsize("wd") == 1 and weight_bytes(conv, graph) == 4 * 3 * 3 * 3  # the plan holds the int8 weight


def test_a_dequantized_value_read_by_two_layers_goes_into_each() -> None:
    """As onnxruntime's EnsureUniqueDQForNodeUnit copies it; it stays a layer of its own only
    where something else reads it too (here, the graph's output)."""
    nodes = [*INPUT, node("Conv", ["xd", "wd"], "a", pads=[1] * 4), node("Sigmoid", ["xd"], "g"),
             node("QuantizeLinear", ["a", "s", "z"], "aq"), node("QuantizeLinear", ["g", "s", "z"], "gq")]
    graph = import_proto(model(nodes, ["aq", "gq"])).graph
    assert [la.op_type for la in graph.layers] == ["QuantizeLinear", "Conv", "Sigmoid"]
    assert graph.layer("a").inputs[0] == graph.layer("g").inputs[0] == "xq"
    kept = import_proto(model(nodes, ["aq", "gq", "xd"])).graph
    assert [la.op_type for la in kept.layers] == ["QuantizeLinear", "DequantizeLinear", "Conv", "Sigmoid"]


def test_an_activation_goes_in_only_on_the_way_to_a_quantize() -> None:
    """A Relu after the convolution that no QuantizeLinear follows stays a layer; so does a
    Relu whose value something else reads."""
    alone = [*INPUT, node("Conv", ["xd", "wd"], "a", pads=[1] * 4), node("Relu", ["a"], "y")]
    graph = import_proto(model(alone, ["y"])).graph
    assert [la.op_type for la in graph.layers] == ["QuantizeLinear", "Conv", "Relu"]
    assert graph.layer("a").fused is not None and graph.layer("a").fused.outputs == ()
    shared = [*INPUT, node("Conv", ["xd", "wd"], "a", pads=[1] * 4), node("Relu", ["a"], "r"), node("QuantizeLinear", ["r", "s", "z"], "rq")]
    graph = import_proto(model(shared, ["rq", "r"])).graph
    assert [la.op_type for la in graph.layers] == ["QuantizeLinear", "Conv", "Relu", "QuantizeLinear"]


def test_lowering_writes_the_pattern_into_one_segment() -> None:
    """Each node's segment holds DequantizeLinear → Conv → QuantizeLinear with the weight as int8
    (cut to the node's channels, its per-channel scale with it), and sends integer halos."""
    nodes = [*INPUT, node("Conv", ["xd", "wd"], "a", pads=[1] * 4), node("QuantizeLinear", ["a", "s", "z"], "aq"),
             node("DequantizeLinear", ["aq", "s", "z"], "ad"), node("Conv", ["ad", "wd2"], "b", pads=[1] * 4),
             node("QuantizeLinear", ["b", "s", "z"], "y")]
    graph = import_proto(model(nodes, ["y"], {"wd2": RNG.standard_normal((4, 4, 3, 3)).astype(np.float32)})).graph
    for direction in (Direction.H, Direction.C):
        parted = PassManager(pipeline(Config(nodes=2, direction=direction, planner="greedy"), search=False)).run(graph)
        programs, messages = lower(parted)
        assert messages and all(m.dtype == "uint8" for m in messages), [m.dtype for m in messages]
        for program in programs:
            ops = [n.op_type for step in program.steps if step.op == "run" for n in step.seg.nodes]
            conv = ops.index("Conv")
            assert ops[conv - 1] == "DequantizeLinear" and ops[conv + 1] == "QuantizeLinear", ops
            weights = {k: v for step in program.steps if step.op == "run" for k, v in step.seg.initializers.items()}
            assert any(k.startswith("wq") and v.dtype == np.int8 for k, v in weights.items()), sorted(weights)
