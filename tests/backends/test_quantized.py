"""Quantized models, as onnxruntime's `quantize_static` writes them, compiled and run bit-exactly.
QDQ format: every segment shows onnxruntime the DequantizeLinear–op–QuantizeLinear patterns it
fuses into integer kernels in the whole model (frontends/quantized.py). QOperator format: the
integer ops themselves (QLinearConv, com.microsoft's QLinearAdd, ...) are cut as their float
ops (rules/base.py QuantizedRule)."""

from __future__ import annotations

import glob
import os
import tempfile
from dataclasses import replace

import numpy as np
import onnx
import onnx.external_data_helper
import onnxruntime as ort
import pytest
from bbgrap.backends.lower import Segment, lower, segment_model
from bbgrap.frontends.onnx import import_model, import_proto
from bbgrap.passes.naive_partition import partition_layer
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static
from onnxruntime.quantization.shape_inference import quant_pre_process

from bbgrap import zoo
from bbgrap.cluster import IN_NCHW
from bbgrap.compiler import pipeline
from bbgrap.config import Config, CustomPartition, Direction
from bbgrap.cost import in_blocks, layer_ops, run_ops
from bbgrap.ir import Graph, Interval, ShapeMap
from bbgrap.pass_manager import PassManager
from bbgrap.plan import Plan
from bbgrap.rules.base import NCHWC_BLOCK, OpTraits
from bbgrap.rules.conv import GEMM_PATH_COST, direct_integer, direct_outputs
from bbgrap.rules.elementwise import same_in_every_layout
from bbgrap.rules.registry import FAMILIES, RuleRegistry, default_registry
from bbgrap.simulate import eight_bit_op, in_integer_kernels, layer_work, op_kind, piece_kind, program_steps, quantized_layouts
from tests.helpers import bbgrap, bbgrap_run, compile_plan, mpirun, run_plan, save


class _Samples(CalibrationDataReader):
    def __init__(self, name: str, shape: list[int]) -> None:
        rng = np.random.default_rng(0)
        self.samples = iter([{name: rng.standard_normal(shape).astype(np.float32)} for _ in range(3)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.samples, None)


def quantized(tmp_path: str, name: str, per_channel: bool, activations: QuantType, quant_format: QuantFormat = QuantFormat.QDQ,
              preprocess: bool = False) -> str:
    """A small zoo model quantized by onnxruntime (QDQ format unless `quant_format` says otherwise,
    int8 weights); with `preprocess`, onnxruntime's quant_pre_process first folds its
    BatchNormalization into the convolutions (so QOperator's QLinearConv takes in their Relu)."""
    model = zoo.build(name, resolution=40, width=0.25)
    src = save(model, tmp_path, f"{name}-float")
    if preprocess:
        quant_pre_process(src, src, skip_symbolic_shape=True)
    return quantize(src, os.path.join(tmp_path, f"{name}-{quant_format.name}.onnx"), per_channel, activations, quant_format)


def quantize(src: str, dst: str, per_channel: bool, activations: QuantType, quant_format: QuantFormat = QuantFormat.QDQ,
             extra: dict[str, object] | None = None) -> str:
    """`src` quantized by onnxruntime's quantize_static into `dst` (int8 weights; `extra`: its extra_options)."""
    model = onnx.load(src)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    quantize_static(src, dst, _Samples(model.graph.input[0].name, shape), quant_format=quant_format,
                    activation_type=activations, weight_type=QuantType.QInt8, per_channel=per_channel, extra_options=extra or {})
    return dst


def cut_everywhere(plan: Plan) -> None:
    """Every node computes a share of the model: the fused layers were cut, not placed whole."""
    assert all(n.flops > 0 for n in plan.stats.per_node), plan.stats.per_node


@pytest.mark.parametrize(("name", "per_channel", "activations", "nodes", "direction"), [
    ("resnet18", False, QuantType.QUInt8, 2, "h"),
    ("resnet18", True, QuantType.QInt8, 3, "w"),
    ("resnet18", True, QuantType.QUInt8, 2, "c"),
    ("mobilenet_v2", True, QuantType.QUInt8, 3, "h"),
    ("mobilenet_v2", False, QuantType.QInt8, 2, "c"),
])
def test_quantized_zoo_models_run_bit_exactly(tmp_path, name: str, per_channel: bool, activations: QuantType, nodes: int,
                                             direction: str) -> None:
    """Each layer cut evenly (and by the dp planner): the plan's result is onnxruntime's to the bit,
    its segments run the integer kernels the whole model runs (and in float what it runs in float:
    with int8 activations, a convolution that reads a value something else reads too), and the
    halos between fused layers move as 8-bit integers."""
    path = quantized(str(tmp_path), name, per_channel, activations)
    whole_model_floats = float_kernels(onnx.load(path))
    for search in (False, True):
        plan_dir = str(tmp_path / f"plan-{search}")
        plan = compile_plan(path, plan_dir, nodes=nodes, direction=direction, search=search,
                            **({"planner": "dp"} if search else {}))
        if not search:
            cut_everywhere(plan)
            assert {m.dtype for m in plan.messages} & {"uint8", "int8"}, [m.dtype for m in plan.messages]
        outputs, rel = run_plan(plan_dir)
        assert rel == 0.0 and all(np.isfinite(o).all() for o in outputs.values()), (search, rel)
        same_kernels(plan_dir, whole_model_floats)


@pytest.mark.parametrize(("name", "per_channel", "activations", "preprocess", "nodes", "direction"), [
    ("resnet18", False, QuantType.QUInt8, False, 2, "h"),
    ("resnet18", True, QuantType.QInt8, True, 3, "w"),
    ("resnet18", True, QuantType.QUInt8, True, 2, "c"),
    ("mobilenet_v2", True, QuantType.QUInt8, True, 3, "h"),
])
def test_qoperator_zoo_models_run_bit_exactly(tmp_path, name: str, per_channel: bool, activations: QuantType, preprocess: bool,
                                              nodes: int, direction: str) -> None:
    """A QOperator model (QLinearConv, com.microsoft's QLinearAdd, QLinearGlobalAveragePool and
    QGemm), each layer cut evenly and by the dp planner: nothing is opaque, every quantized layer
    is cut, its halos move as 8-bit integers, and the plan's result is onnxruntime's to the bit."""
    path = quantized(str(tmp_path), name, per_channel, activations, QuantFormat.QOperator, preprocess)
    ops = {node.op_type for node in onnx.load(path).graph.node}
    assert {"QLinearConv", "QLinearAdd", "QGemm"} <= ops and "Conv" not in ops, ops
    for search in (False, True):
        plan_dir = str(tmp_path / f"plan-{search}")
        plan = compile_plan(path, plan_dir, nodes=nodes, direction=direction, search=search,
                            **({"planner": "dp"} if search else {}))
        assert not plan.opaque, plan.opaque
        if not search:
            cut_everywhere(plan)
            qlinear = [row for row in plan.compiled.layer_table if row.op_type.startswith(("QLinear", "QGemm"))]
            assert qlinear and all(row.cut != "whole" for row in qlinear), [(r.name, r.cut) for r in qlinear if r.cut == "whole"]
            assert {m.dtype for m in plan.messages} & {"uint8", "int8"}, [m.dtype for m in plan.messages]
        outputs, rel = run_plan(plan_dir)
        assert rel == 0.0 and all(np.isfinite(o).all() for o in outputs.values()), (search, rel)


@pytest.mark.parametrize("name", ["mobilenet_v2", "inception"])
def test_16_bit_zoo_models_run_bit_exactly_along_channels(tmp_path, name: str) -> None:
    """16-bit activations: onnxruntime runs every convolution, matmul and LRN in float on weights it
    dequantizes at run time, and rounds each result. Cut along channels for 3 nodes (evenly, with
    pieces of one channel, and planned by dp), on several inputs the plan's result is the whole
    model's to the bit: the one-channel pieces compute two, the classifier's columns are whole
    groups of 4, the LRNs are whole (`multiplies_unpacked`, `LRNRule.uncut`); mobilenet_v2 and
    inception quantized so were a step off. The model runs with one thread, as each node does:
    onnxruntime's own result differs by a step between one thread and two."""
    path = quantized(str(tmp_path), name, False, QuantType.QUInt16)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # as run_plan's nodes: onnxruntime's float kernels split their sums by threads
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    [given] = session.get_inputs()
    inputs = [np.random.default_rng(k).standard_normal(given.shape).astype(np.float32) for k in range(4)]
    for search in (False, True):
        plan_dir = str(tmp_path / f"plan-{search}")
        compile_plan(path, plan_dir, nodes=3, direction="c", search=search, **({"planner": "dp"} if search else {}))
        for x in inputs:
            outputs, _ = run_plan(plan_dir, {given.name: x})
            [want] = session.run(None, {given.name: x})
            [got] = outputs.values()
            assert np.array_equal(got, want), (search, float(np.abs(got - want).max()))


def qdq_conv() -> onnx.ModelProto:
    """A convolution quantized as onnxruntime's quantize_static writes it, with a float bias and a
    Relu before the QuantizeLinear (both fused by onnxruntime: ReluQuantFusion, QLinearConv)."""
    rng = np.random.default_rng(3)
    consts = {"xs": np.float32(0.02), "xz": np.uint8(0), "wq": rng.integers(-100, 100, (8, 3, 3, 3)).astype(np.int8),
              "ws": np.full(8, 0.01, np.float32), "wz": np.zeros(8, np.int8), "b": (rng.standard_normal(8) * 0.3).astype(np.float32),
              "rs": np.float32(0.05), "rz": np.uint8(0)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]), helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd", "b"], ["a"], pads=[1] * 4), helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "rs", "rz"], ["rq"]), helper.make_node("DequantizeLinear", ["rq", "rs", "rz"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 9, 10])],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def dense_int8_conv(cin: int, cout: int, size: int) -> onnx.ModelProto:
    """x[1,cin,size,size] → a QDQ convolution 3×3 to `cout` channels (uint8 activations, int8
    weights per channel) → y: onnxruntime runs it on MLAS's direct integer kernel where it takes
    the channels (`rules.conv.direct_integer`)."""
    rng = np.random.default_rng(4)
    consts = {"xs": np.float32(0.02), "xz": np.uint8(128), "wq": rng.integers(-100, 100, (cout, cin, 3, 3)).astype(np.int8),
              "ws": np.full(cout, 0.002, np.float32), "wz": np.zeros(cout, np.int8), "rs": np.float32(0.05), "rz": np.uint8(128)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]), helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["a"], name="conv", pads=[1] * 4),
             helper.make_node("QuantizeLinear", ["a", "rs", "rz"], ["aq"]), helper.make_node("DequantizeLinear", ["aq", "rs", "rz"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, size, size])],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_a_piece_of_an_integer_convolution_off_the_direct_kernel_is_priced_on_the_gemm_path() -> None:
    """MLAS runs a piece of a direct-kernel integer convolution by the piece's own output channels:
    at least 16 in fours on its direct kernel, else on im2col and a GEMM. The cost model prices the
    piece so (`cost.in_blocks`: GEMM_PATH_COST per operation, no blocked layout's rounding up) and
    the simulator as "qconv_gemm" (`simulate.piece_kind`). A piece of one on the GEMM path anyway (a
    stem's three input channels) is priced by its operations, as no blocked layout's pieces are."""
    graph = import_proto(dense_int8_conv(16, 64, 12)).graph
    layer, registry = graph.layer("conv"), default_registry()
    assert op_kind(layer, graph) == "qconv" and direct_integer(layer, graph)
    full = ShapeMap.full(graph.tensors[layer.outputs[0]].shape)
    for channels, kernel in ((24, "qconv"), (20, "qconv"), (16, "qconv"), (22, "qconv_gemm"), (12, "qconv_gemm")):
        piece = full.with_axis(1, Interval(0, channels))
        factor = 1.0 if kernel == "qconv" else GEMM_PATH_COST
        assert in_blocks(layer, graph, piece, layer_ops(layer, graph, piece), registry) == layer_ops(layer, graph, piece) * factor, channels
        assert piece_kind("qconv", piece) == kernel, channels
    assert piece_kind("conv", full.with_axis(1, Interval(0, 22))) == "conv"
    three = graph.replace(nodes=3)
    part = partition_layer(three, layer, 1, [22, 21, 21], registry)
    for n in range(3):
        region = part.emitted(n)
        work = layer_work(layer, three, part, n, "qconv", layer_ops(layer, three, full), registry)
        assert work.kind == "qconv_gemm", region
        assert work.ops == run_ops(layer, three, region, registry, by_kind=True), "the GEMM path priced once, by its kind"
        reads = run_ops(layer, three, region, registry, by_kind=True) - layer_ops(layer, three, region)
        assert reads > 0, "a piece's reads beyond its share: priced apart from its kernel"
        assert run_ops(layer, three, region, registry) == pytest.approx(layer_ops(layer, three, region) * GEMM_PATH_COST + reads)
    stem = import_proto(dense_int8_conv(3, 32, 12)).graph  # three input channels: im2col and a GEMM, whole or cut
    layer = stem.layer("conv")
    piece = ShapeMap.full(stem.tensors[layer.outputs[0]].shape).with_axis(1, Interval(0, 11))
    assert op_kind(layer, stem) == "qconv_gemm" and not direct_integer(layer, stem)
    assert in_blocks(layer, stem, piece, layer_ops(layer, stem, piece), registry) == layer_ops(layer, stem, piece), "no blocks of 16"


def test_integer_convolutions_are_cut_on_channels_their_direct_kernel_takes(tmp_path) -> None:
    """64 output channels on 3 nodes: the even cut (22, 21, 21) would run every piece on the GEMM
    path, about 1.4 times slower per operation; the per-layer search cuts on channels the direct
    kernel takes, and the plan equals onnxruntime on the model to the bit."""
    path = save(dense_int8_conv(16, 64, 24), str(tmp_path))
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    plan_dir = str(tmp_path / "plan")
    plan = compile_plan(path, plan_dir, nodes=3, direction="c", planner="greedy", search=True)
    [row] = [r for r in plan.compiled.layer_table if r.name == "conv"]
    sizes = [b - a for a, b in (n.range for n in row.per_node if n.range is not None)]
    assert row.cut == "c" and len(sizes) == 3 and all(direct_outputs(c) for c in sizes), (row.cut, sizes)
    x = np.random.default_rng(1).standard_normal((1, 16, 24, 24)).astype(np.float32)
    outputs, _ = run_plan(plan_dir, {"x": x})
    assert np.array_equal(outputs["y"], session.run(None, {"x": x})[0])


def test_a_quantized_model_checks_exactly_under_mpirun(tmp_path) -> None:
    """bbgrap-run --check under mpirun compares with onnxruntime on the model itself: no difference."""
    path = save(qdq_conv(), str(tmp_path))
    plan = str(tmp_path / "plan")
    compiled = bbgrap("compile", path, "--nodes", "2", "--direction", "h", "-o", plan)
    assert compiled.returncode == 0, compiled.stderr
    proc = mpirun(2, plan, "--check", "--repeat", "1", timeout=120)
    assert proc.returncode == 0 and "max abs error 0, rel 0 against the model (ok)" in proc.stdout + proc.stderr, proc.stderr
    in_process = bbgrap_run(plan, "--repeat", "1")
    assert in_process.returncode == 0 and "max abs error 0," in in_process.stdout + in_process.stderr, in_process.stderr


def small_float_model(middle: str) -> onnx.ModelProto:
    """x[1,16,24,24] → Conv 3×3 → `middle` → Conv 3×3 → y: "relu" a Relu, "split" a Slice of the
    first 8 channels (ShuffleNet's channel split), "pool" a 2×2 AveragePool, "branch" a Relu whose
    value the last convolution's output is added to."""
    rng = np.random.default_rng(11)
    cin = 8 if middle == "split" else 16
    consts = {"w1": rng.standard_normal((16, 16, 3, 3)) * 0.2, "b1": rng.standard_normal(16) * 0.2,
              "w2": rng.standard_normal((16, cin, 3, 3)) * 0.2, "b2": rng.standard_normal(16) * 0.2}
    inits = [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in consts.items()]
    if middle == "split":
        inits += [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in {"st": [0], "en": [8], "ax": [1]}.items()]
        between = helper.make_node("Slice", ["c1", "st", "en", "ax"], ["m"])
    elif middle == "pool":
        between = helper.make_node("AveragePool", ["c1"], ["m"], kernel_shape=[2, 2], strides=[2, 2])
    else:
        between = helper.make_node("Relu", ["c1"], ["m"])
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1] * 4), between,
             helper.make_node("Conv", ["m", "w2", "b2"], ["y" if middle != "branch" else "c2"], name="conv2", pads=[1] * 4)]
    if middle == "branch":  # the Relu's value read twice: by the convolution and by a residual Add
        nodes.append(helper.make_node("Add", ["c2", "m"], ["y"], name="add"))
    graph = helper.make_graph(nodes, middle, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 24, 24])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize(("middle", "activations", "extra"), [
    # int8 activations: onnxruntime makes each QuantizeLinear → DequantizeLinear pair uint8 before it fuses (on CPUs that
    # prefer it), which it can only where it sees both: the frontend does it for every segment (quantized.unsigned_pairs)
    ("relu", QuantType.QInt8, {}),
    ("pool", QuantType.QInt8, {}),
    # onnxruntime's own QuantizeLinear/DequantizeLinear (com.microsoft), which it fuses as the standard ones
    ("relu", QuantType.QUInt8, {"UseQDQContribOps": True}),
    # a model's Slice reading a DequantizeLinear (lowering crashed on the crop of a value inside the layer)
    ("split", QuantType.QUInt8, {}),
    # a QuantizeLinear → DequantizeLinear pair per reader: onnxruntime merges the twins before it fuses
    ("branch", QuantType.QUInt8, {"DedicatedQDQPair": True}),
    ("branch", QuantType.QInt8, {"DedicatedQDQPair": True}),
    ("branch", QuantType.QInt8, {}),
])
def test_small_quantized_models_run_bit_exactly_cut_every_way(tmp_path, middle: str, activations: QuantType,
                                                              extra: dict[str, object]) -> None:
    """Bit-exact, and for the reason that makes it so: onnxruntime runs no float convolution or
    pool in any segment, as it runs none in the whole model (a result can match by chance where
    a segment computes in float: the final quantization absorbs most differences)."""
    src = save(small_float_model(middle), str(tmp_path), "float")
    path = quantize(src, str(tmp_path / "quantized.onnx"), True, activations, extra=extra)
    whole = float_kernels(onnx.load(path))
    # (with int8 activations onnxruntime keeps some convolutions of a branching model in float: the plan must too)
    assert not whole or (middle == "branch" and activations == QuantType.QInt8), whole
    for nodes, direction in ((2, "c"), (2, "h"), (3, "w")):
        plan_dir = str(tmp_path / f"plan-{nodes}{direction}")
        plan = compile_plan(path, plan_dir, nodes=nodes, direction=direction)
        cut_everywhere(plan)
        outputs, rel = run_plan(plan_dir)
        assert rel == 0.0 and all(np.isfinite(o).all() for o in outputs.values()), (nodes, direction, rel)
        same_kernels(plan_dir, whole)


def read_twice_model(middle: str) -> onnx.ModelProto:
    """x[1,16,24,24] → Conv 3×3 to 32 channels → `middle` → Conv 3×3, plus `middle`'s value again
    (a residual Add) → y: "pool" a 2×2 AveragePool, "depthwise" a depthwise Conv 3×3."""
    rng = np.random.default_rng(5)
    consts = {"w1": rng.standard_normal((32, 16, 3, 3)) * 0.2, "b1": rng.standard_normal(32) * 0.2,
              "w2": rng.standard_normal((32, 32, 3, 3)) * 0.2, "b2": rng.standard_normal(32) * 0.2}
    if middle == "pool":
        between = helper.make_node("AveragePool", ["c1"], ["m"], name="pool", kernel_shape=[2, 2], strides=[2, 2])
    else:
        consts |= {"wd": rng.standard_normal((32, 1, 3, 3)) * 0.5, "bd": rng.standard_normal(32) * 0.2}
        between = helper.make_node("Conv", ["c1", "wd", "bd"], ["m"], name="depthwise", group=32, pads=[1] * 4)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1] * 4), between,
             helper.make_node("Conv", ["m", "w2", "b2"], ["c2"], name="conv2", pads=[1] * 4),
             helper.make_node("Add", ["c2", "m"], ["y"], name="add")]
    graph = helper.make_graph(nodes, middle, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 24, 24])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("middle", ["pool", "depthwise"])
def test_float_layers_of_an_int8_model_are_cut_on_whole_channel_blocks(tmp_path, middle: str) -> None:
    """With int8 activations onnxruntime runs an average pool or a depthwise convolution whose value
    has two readers in float, blocked (NCHWc) over its 32 channels. A piece of 11 of them would run
    unblocked and sum in another order, a last bit off, which the QuantizeLinear after it makes a
    whole step: cut along channels for 3 nodes, evenly, searched (greedy) or planned (dp), that
    layer's pieces are whole blocks of 16 channels (`RegionRule.grain`), and the plan is bit-exact."""
    src = save(read_twice_model(middle), str(tmp_path), "float")
    path = quantize(src, str(tmp_path / "quantized.onnx"), True, QuantType.QInt8)
    whole = float_kernels(onnx.load(path))
    assert whole - {"conv2"}, whole  # what makes the case: onnxruntime runs it in float (named after its node or its output)
    cuts = []
    for search, planner in ((False, "greedy"), (True, "greedy"), (True, "dp")):
        plan_dir = str(tmp_path / f"plan-{search}-{planner}")
        plan = compile_plan(path, plan_dir, nodes=3, direction="c", search=search, planner=planner)
        [row] = [r for r in plan.compiled.layer_table if r.name == middle]
        cuts.append(row.cut)
        outputs, rel = run_plan(plan_dir)
        assert rel == 0.0 and all(np.isfinite(o).all() for o in outputs.values()), (search, planner, row, rel)
        if row.cut == "c":
            ranges = [n.range for n in row.per_node if n.range is not None]
            assert all(a % NCHWC_BLOCK == 0 and b % NCHWC_BLOCK == 0 for a, b in ranges), (search, planner, ranges)
    assert "c" in cuts, cuts


def pooled_model() -> onnx.ModelProto:
    """x[1,16,16,16] → Conv 3×3 to 32 channels → AveragePool 2×2 → BatchNormalization → Relu →
    Conv 3×3 → y: quantized dynamically, every float op's result reaches the DynamicQuantizeLinear
    before the second convolution."""
    rng = np.random.default_rng(7)
    consts = {"w1": rng.standard_normal((32, 16, 3, 3)) * 0.2, "w2": rng.standard_normal((32, 32, 3, 3)) * 0.2,
              "g": rng.standard_normal(32) * 2, "b": rng.standard_normal(32), "m": rng.standard_normal(32) * 0.3,
              "v": rng.random(32) * 3 + 0.01}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1] * 4),
             helper.make_node("AveragePool", ["c1"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("BatchNormalization", ["p", "g", "b", "m", "v"], ["n"], name="norm"),
             helper.make_node("Relu", ["n"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2"], ["y"], name="conv2", pads=[1] * 4)]
    graph = helper.make_graph(nodes, "pooled", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def dynamic_pooled(tmp_path) -> str:
    """`pooled_model` quantized by onnxruntime's quantize_dynamic (int8 weights), as a file in `tmp_path`."""
    path = str(tmp_path / "dynamic.onnx")
    quantize_dynamic(save(pooled_model(), str(tmp_path), "float"), path, weight_type=QuantType.QInt8)
    return path


def test_float_layers_of_a_dynamically_quantized_model_are_cut_on_whole_channel_blocks(tmp_path) -> None:
    """A dynamically quantized model rounds at each DynamicQuantizeLinear, after the float ops
    before it (`Graph.rounded_later`): onnxruntime runs its AveragePool blocked over 32 channels, so
    a piece of 11 channels would run unblocked and can sum a last bit off, a whole step once
    rounded (densenet quantized so was a step off at 3 nodes). The BatchNormalization after it has
    parameters onnxruntime computes alike in either layout (frontends/norms.py), exact cut anyhow.
    Cut along channels for 3 nodes, the pool's pieces are whole blocks, and on several inputs the
    plan's result is the whole model's to the bit."""
    path = dynamic_pooled(tmp_path)
    assert any(n.op_type == "DynamicQuantizeLinear" for n in onnx.load(path).graph.node)
    graph = import_model(path).graph
    assert graph.rounded_later(graph.layer("pool")) and graph.rounded_later(graph.layer("norm"))
    assert same_in_every_layout(graph.layer("norm"), graph)
    assert not graph.rounded_later(graph.layers[-1]), "the model's last op is rounded by nothing after it"
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    inputs = [np.random.default_rng(k).standard_normal((1, 16, 16, 16)).astype(np.float32) * 3 for k in range(4)]
    cut = set()
    for search, planner in ((False, "greedy"), (True, "greedy"), (True, "dp")):
        plan_dir = str(tmp_path / f"plan-{search}-{planner}")
        plan = compile_plan(path, plan_dir, nodes=3, direction="c", search=search, planner=planner)
        for name in ("pool", "norm"):
            [row] = [r for r in plan.compiled.layer_table if r.name == name]
            if row.cut == "c":
                cut.add(name)
                ranges = [n.range for n in row.per_node if n.range is not None]
                assert name != "pool" or all(a % NCHWC_BLOCK == 0 and b % NCHWC_BLOCK == 0 for a, b in ranges), (search, planner, ranges)
        for x in inputs:
            outputs, _ = run_plan(plan_dir, {"x": x})
            [want] = session.run(None, {"x": x})
            assert np.array_equal(outputs["y"], want), (search, planner, float(np.abs(outputs["y"] - want).max()))
    assert cut == {"pool", "norm"}, cut


@pytest.mark.parametrize(("pool", "norm"), [("h", "c"), ("w", "c"), ("c", "h")])
def test_a_dynamically_quantized_norm_reading_its_input_from_another_segment_is_exact(tmp_path, pool: str, norm: str) -> None:
    """The model above with its pool and its BatchNormalization cut different ways (a user's
    [[custom]] cuts, 2 nodes), so that each node's norm reads its input from another segment, in
    NCHW, where onnxruntime runs the whole model's norm blocked. With parameters onnxruntime computes
    alike in either layout (frontends/norms.py), it equals the whole model bit for bit on several inputs (as a
    BatchNormalization it was a step off on 7 inputs of 8), and an uneven channel cut (7 and 25)
    of it does too."""
    path = dynamic_pooled(tmp_path)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    inputs = [np.random.default_rng(k).standard_normal((1, 16, 16, 16)).astype(np.float32) * 3 for k in range(4)]
    sizes = {"h": None, "w": None, "c": (7, 25)}
    for uneven in (False, True):
        custom = (CustomPartition("pool", Direction(pool)),
                  CustomPartition("norm", Direction(norm), sizes[norm] if uneven else None))
        plan_dir = str(tmp_path / f"plan-{uneven}")
        plan = compile_plan(path, plan_dir, nodes=2, direction="c", custom=custom)
        cuts = {r.name: r.cut for r in plan.compiled.layer_table}
        assert (cuts["pool"], cuts["norm"]) == (pool, norm), cuts
        if uneven and norm == "c":
            [row] = [r for r in plan.compiled.layer_table if r.name == "norm"]
            assert [n.range for n in row.per_node] == [(0, 7), (7, 32)], "cut off the 16-channel blocks"
        for x in inputs:
            outputs, _ = run_plan(plan_dir, {"x": x})
            [want] = session.run(None, {"x": x})
            assert np.array_equal(outputs["y"], want), (uneven, float(np.abs(outputs["y"] - want).max()))


def test_a_dynamically_quantized_norm_cut_unlike_its_input_checks_exactly_under_mpirun(tmp_path) -> None:
    """As above through the commands: a config's [[custom]] tables cut the pool by rows and the
    norm by channels, and `mpirun -n 2 bbgrap-run --check` finds no difference from onnxruntime on
    the model."""
    path = dynamic_pooled(tmp_path)
    config = tmp_path / "cuts.toml"
    config.write_text("[[custom]]\nlayer = 'pool'\ndirection = 'h'\n[[custom]]\nlayer = 'norm'\ndirection = 'c'\n")
    plan = str(tmp_path / "plan")
    compiled = bbgrap("compile", path, "--nodes", "2", "--config", str(config), "-o", plan)
    assert compiled.returncode == 0, compiled.stderr
    proc = mpirun(2, plan, "--check", "--repeat", "1", timeout=120)
    assert proc.returncode == 0 and "max abs error 0, rel 0 against the model (ok)" in proc.stdout + proc.stderr, proc.stderr


def narrow_products_model() -> onnx.ModelProto:
    """x[1,16,32,32] → Conv 3×3 to 3 channels → y, and x → MaxPool 8×8 → Flatten → Gemm (transB,
    256 features to 1000 classes) → z: quantized with 16-bit activations, onnxruntime runs both products
    in float on weights a DequantizeLinear makes at run time."""
    rng = np.random.default_rng(3)
    consts = {"w": rng.standard_normal((3, 16, 3, 3)) * 0.3, "fw": rng.standard_normal((1000, 256)) * 0.3,
              "fb": rng.standard_normal(1000) * 0.1}
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1] * 4),
             helper.make_node("MaxPool", ["x"], ["p"], name="pool", kernel_shape=[8, 8], strides=[8, 8]),
             helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "fw", "fb"], ["z"], name="fc", transB=1)]
    graph = helper.make_graph(nodes, "narrow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 32, 32])],
                              [helper.make_tensor_value_info(t, TensorProto.FLOAT, None) for t in ("y", "z")],
                              [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_products_by_weights_dequantized_at_run_time_compute_what_takes_the_whole_products_path(tmp_path) -> None:
    """onnxruntime multiplies by a weight it does not pack (a 16-bit model's DequantizeLinear makes
    it at run time) along another path for one output channel (a vector product), and for a single
    row's columns under transB in groups of 4: such a piece sums a last bit off, which the 16-bit
    QuantizeLinear after it can make a step (mobilenet_v2 and inception quantized so were a step
    off at 3 nodes along channels). Cut in 3 along channels, the convolution's pieces of one channel
    each compute two and the classifier's columns whole groups of 4 (`multiplies_unpacked`), and on
    several inputs the plan's results are the whole model's to the bit."""
    src = save(narrow_products_model(), str(tmp_path), "float")
    path = quantize(src, str(tmp_path / "quantized.onnx"), False, QuantType.QUInt16)
    floats = {n.name for n in optimized_nodes(onnx.load(path)) if n.op_type in ("Conv", "Gemm")}
    assert floats == {"conv", "fc"}, floats  # what makes the case: onnxruntime runs both in float
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # as run_plan's nodes
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    inputs = [np.random.default_rng(k).standard_normal((1, 16, 32, 32)).astype(np.float32) for k in range(4)]
    for search, planner in ((False, "greedy"), (True, "greedy"), (True, "dp")):
        plan_dir = str(tmp_path / f"plan-{search}-{planner}")
        plan = compile_plan(path, plan_dir, nodes=3, direction="c", search=search, planner=planner)
        rows = {r.name: r for r in plan.compiled.layer_table}
        if not search:  # the even cut makes the cases: a channel per node, and columns off the groups of 4
            assert [n.range for n in rows["conv"].per_node] == [(0, 1), (1, 2), (2, 3)], rows["conv"].per_node
            assert any(n.range is not None and n.range[0] % 4 for n in rows["fc"].per_node), rows["fc"].per_node
        for x in inputs:
            outputs, _ = run_plan(plan_dir, {"x": x})
            for name, want in zip(("y", "z"), session.run(None, {"x": x})):
                assert np.array_equal(outputs[name], want), (search, planner, name, float(np.abs(outputs[name] - want).max()))


def test_custom_sizes_inside_a_channel_block_are_refused_in_one_line(tmp_path) -> None:
    """A [[custom]] table that cuts such a layer inside a block of 16 channels asks for a plan that
    is not exact: compile says so in one line with the sizes on whole blocks, exits 2 and writes
    nothing; on whole blocks it compiles."""
    src = save(read_twice_model("pool"), str(tmp_path), "float")
    path = quantize(src, str(tmp_path / "quantized.onnx"), True, QuantType.QInt8)
    for sizes, ok in (("[11, 10, 11]", False), ("[16, 0, 16]", True)):
        config = tmp_path / "cluster.toml"
        config.write_text(f'[[custom]]\nlayer = "pool"\ndirection = "c"\nsizes = {sizes}\n')
        plan_dir = tmp_path / f"plan{ok}"
        res = bbgrap("compile", path, "--nodes", "3", "--direction", "c", "--config", str(config), "-o", str(plan_dir))
        if ok:
            assert res.returncode == 0, res.stderr
            continue
        errors = [line for line in res.stderr.splitlines() if "error" in line]
        assert res.returncode == 2 and len(errors) == 1 and errors[0] == res.stderr.strip().splitlines()[-1], res.stderr
        assert "sizes [11, 10, 11] cut it at 11, 21 along 'c', inside the blocks of 16" in errors[0], errors
        assert "use sizes [16, 0, 16]" in errors[0], errors
        assert not plan_dir.exists()


@pytest.mark.parametrize(("name", "activations"), [
    ("resnet18", QuantType.QUInt8), ("resnet18", QuantType.QInt8), ("resnet18", QuantType.QUInt16),
    ("mobilenet_v2", QuantType.QInt8), ("densenet", QuantType.QInt8),
])
def test_a_layer_is_priced_as_the_kernel_onnxruntime_runs_it_in(tmp_path, name: str, activations: QuantType) -> None:
    """The simulator prices a convolution or matmul onnxruntime fuses into an integer kernel as
    "qconv" (a stem of three input channels "qconv_gemm"), "qdepthwise" or "qmatmul", and one it
    runs in float as "conv", "depthwise", "pointwise_nchw" (a 1x1 one of fewer input channels than a
    block) or "matmul": every convolution of a quantized zoo model is
    of a float kind exactly where the optimised whole model has a float Conv of its name (16-bit
    activations: all of them; int8: those whose input or output has more than one reader, a residual
    block's first, densenet's second of each layer, which the concatenations read)."""
    path = quantized(str(tmp_path), name, True, activations)
    in_float = float_kernels(onnx.load(path))
    graph = import_model(path).graph
    convs = [layer for layer in graph.layers if layer.op_type == "Conv"]
    assert convs and all((op_kind(layer, graph) in ("conv", "depthwise", "pointwise_nchw")) == (layer.name in in_float) for layer in convs), \
        [(layer.name, op_kind(layer, graph), layer.name in in_float) for layer in convs]
    dense = [layer for layer in convs if op_kind(layer, graph) in ("conv", "qconv", "qconv_gemm")]
    # an integer convolution of the image's three channels (the stem) runs as im2col and a GEMM, the rest on the direct kernel
    stem = next(layer for layer in convs if graph.tensors[layer.inputs[1]].shape[1] == 3)
    assert op_kind(stem, graph) == ("conv" if stem.name in in_float else "qconv_gemm")
    assert "qconv" in {op_kind(layer, graph) for layer in dense} or activations == QuantType.QUInt16
    assert {op_kind(layer, graph) for layer in graph.layers if layer.op_type == "Gemm"} == \
        {"matmul" if activations == QuantType.QUInt16 else "qmatmul"}
    if activations == QuantType.QInt8:
        assert {"conv", "qconv"} <= {op_kind(layer, graph) for layer in dense}  # both, or the test shows nothing
    if name == "mobilenet_v2":
        assert "qdepthwise" in {op_kind(layer, graph) for layer in convs}
    if name == "resnet18" and activations == QuantType.QUInt8:  # the QOperator format's ops
        graph = import_model(quantized(str(tmp_path), name, True, activations, QuantFormat.QOperator)).graph
        kinds = {(layer.op_type, op_kind(layer, graph)) for layer in graph.layers if layer.op_type in ("QLinearConv", "QGemm")}
        assert kinds == {("QLinearConv", "qconv"), ("QLinearConv", "qconv_gemm"), ("QGemm", "qmatmul")}, kinds


@pytest.mark.parametrize("activations", [QuantType.QUInt8, QuantType.QUInt16])
def test_the_nodes_of_an_integer_kernels_pattern_are_priced_in_it(tmp_path, activations: QuantType) -> None:
    """A segment's DequantizeLinear nodes before a layer onnxruntime runs in an integer kernel (of
    its input and of its weights) or on 8-bit values (a residual Add, the pools, the Flatten) and
    the QuantizeLinear after it are in that kernel: the simulator prices no copy for them
    (`in_integer_kernels`); around a layer it runs in float (16-bit) they are ops of their own."""
    graph, (seg,) = planned_segments(import_model(quantized(str(tmp_path), "resnet18", True, activations)).graph, 1, Direction.H)
    inside = in_integer_kernels(graph, seg, {layer.name: layer for layer in graph.layers})
    kernels = [n for n in seg.nodes if n.op_type in ("Conv", "Gemm", "Add", "MaxPool", "GlobalAveragePool", "Flatten")]
    assert {n.op_type for n in kernels} == {"Conv", "Gemm", "Add", "MaxPool", "GlobalAveragePool", "Flatten"}
    producers = {o: n for n in seg.nodes for o in n.output}
    expected = {id(producers[i]) for n in kernels for i in n.input if i in producers and producers[i].op_type == "DequantizeLinear"}
    expected |= {id(r) for n in kernels for r in seg.nodes if n.output[0] in r.input and r.op_type == "QuantizeLinear"}
    assert len(expected) >= 2 * len(kernels) > 0  # the inputs' (and the weights') and the result's
    assert inside == (expected if activations == QuantType.QUInt8 else set())


def same_kernels(plan_dir: str, whole: set[str]) -> None:
    """onnxruntime runs in float in the plan's segments the convolutions and pools it runs in float
    in the whole model (`whole`: float_kernels of the model), and fuses every other one into an
    integer kernel."""
    ran: set[str] = set()
    for segment in sorted(glob.glob(os.path.join(plan_dir, "node*", "*.onnx"))):
        model = onnx.load(segment, load_external_data=False)
        onnx.external_data_helper.load_external_data_for_model(model, plan_dir)
        ran |= float_kernels(model)
    assert ran == whole, (sorted(ran - whole), sorted(whole - ran))


def float_kernels(model: onnx.ModelProto) -> set[str]:
    """The float convolutions and pools onnxruntime runs for `model` after its optimisations (which
    fuse a quantized model's patterns into QLinearConv, QLinearAveragePool, ...), by name."""
    return {n.name for n in optimized_nodes(model) if n.op_type in ("Conv", "AveragePool", "GlobalAveragePool")}


def optimized_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The nodes onnxruntime's CPU provider runs for `model` after its optimisations."""
    with tempfile.TemporaryDirectory() as tmp:
        opts = ort.SessionOptions()
        opts.optimized_model_filepath = os.path.join(tmp, "optimized.onnx")
        opts.log_severity_level = 3
        ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        return list(onnx.load(opts.optimized_model_filepath, load_external_data=False).graph.node)


def planned_segments(graph: Graph, nodes: int, direction: Direction) -> tuple[Graph, list[Segment]]:
    """The graph planned for `nodes` nodes cut along `direction` (the per-layer search), and every
    segment of every node's program as lowering makes it (no plan written)."""
    plan = PassManager(pipeline(Config(nodes=nodes, planner="greedy", direction=direction))).run(graph)
    return plan, [step.seg for program in lower(plan)[0] for step in program.steps if step.op == "run"]


@pytest.mark.parametrize("name,preprocess,activations", [
    ("resnet18", False, QuantType.QUInt8), ("resnet18", True, QuantType.QUInt8), ("mobilenet_v2", True, QuantType.QUInt8),
    ("resnet18", False, QuantType.QInt8), ("densenet", False, QuantType.QInt8)])
def test_the_transposes_and_qdq_nodes_of_a_segment_are_those_onnxruntime_runs(tmp_path, name: str, preprocess: bool,
                                                                               activations: QuantType) -> None:
    """In every segment of quantized models' plans at 1 and 2 nodes (h and c), the simulator prices
    as many transposes between NCHW and onnxruntime's channels-last integer kernels
    (`quantized_layouts`) and as many DequantizeLinear and QuantizeLinear nodes of their own
    (those not in an integer kernel or an 8-bit op: `in_integer_kernels`) as onnxruntime runs in the
    optimised segment, and the same 8-bit pools in NCHW (a MaxPool after a
    float BatchNormalization, which onnxruntime runs in a generic kernel); but for the first segment
    of a preprocessed resnet18's height cut, where onnxruntime crops the residual of the first block
    in NCHW and transposes once more. The segment's work (`segment_work`) prices each of those
    DequantizeLinear and QuantizeLinear nodes as its op type (calibrate times them apart) and each
    BatchNormalization onnxruntime runs with its own kernel as one `IN_NCHW`."""
    graph = import_model(quantized(str(tmp_path), name, True, activations, preprocess=preprocess)).graph
    layers = {layer.name: layer for layer in graph.layers}
    seen = []
    for nodes, direction in ((1, Direction.H), (2, Direction.H), (2, Direction.C)):
        plan, segments = planned_segments(graph, nodes, direction)
        works = [step.work for rank in program_steps(plan, lower(plan)[0]) for step in rank if step.op == "run"]
        assert len(works) == len(segments)
        for seg, work in zip(segments, works):
            inside = in_integer_kernels(plan, seg, layers)
            layouts = quantized_layouts(plan, seg, layers, inside, default_registry())
            qdq = sum(n.op_type in ("DequantizeLinear", "QuantizeLinear") and id(n) not in inside for n in seg.nodes)
            priced = sum(w.op_type in ("DequantizeLinear", "QuantizeLinear") for w in (*work.copies, *work.layers))
            assert priced == qdq
            ours = (len(layouts.transposes), qdq, sorted(layers[n].op_type for n in layouts.eight_bit_nchw),
                    sum(w.op_type == "BatchNormalization" + IN_NCHW for w in work.layers))
            optimized = optimized_nodes(segment_model(plan, seg, seg.types, seg.name))
            ops = [n.op_type for n in optimized]
            # the pools onnxruntime runs on 8-bit values in NCHW: of the default domain (channels-last ones are com.microsoft's)
            pools = sorted(n.op_type for n in optimized if n.op_type in ("MaxPool", "AveragePool") and not n.domain)
            theirs = (ops.count("Transpose"), ops.count("DequantizeLinear") + ops.count("QuantizeLinear"), pools,
                      sum(n.op_type == "BatchNormalization" and not n.domain for n in optimized))
            if preprocess and name == "resnet18" and nodes == 2 and direction is Direction.H and seg.name.endswith("_seg0"):
                theirs = (theirs[0] - 1, *theirs[1:])  # onnxruntime crops a residual in NCHW there: one transpose more
            assert ours == theirs, (nodes, direction, seg.name, ours, sorted(ops))
            seen.append(ours)
    assert any(transposes for transposes, *_ in seen)  # the models have channels-last kernels
    if name == "resnet18" and not preprocess and activations == QuantType.QUInt8:  # its MaxPool after a float BatchNormalization
        assert any(pools == ["MaxPool"] for _, _, pools, _ in seen)
    if not preprocess:  # its BatchNormalizations are not folded into the convolutions: onnxruntime runs them in NCHW
        assert any(norms for *_, norms in seen)


class _FloatPools(RuleRegistry):
    """The default families, but a MaxPool has no `OpTraits.eight_bit`: as if onnxruntime ran it in float."""

    def traits(self, op_type: str, domain: str = "") -> OpTraits:
        traits = super().traits(op_type, domain)
        return replace(traits, eight_bit=None) if op_type == "MaxPool" else traits


def test_which_ops_run_on_8_bit_values_is_read_from_the_registrys_op_traits(tmp_path) -> None:
    """The simulator takes what onnxruntime runs on a quantized model's 8-bit values from the
    registry's `OpTraits.eight_bit`, not a table of its own: with the default registry, resnet18's
    MaxPool (after a float BatchNormalization) runs on the integers in NCHW, its DequantizeLinear
    and QuantizeLinear dropped; with a registry that gives it no such trait, it is a float op
    between the two, which are priced as ops of their own."""
    graph = import_model(quantized(str(tmp_path), "resnet18", True, QuantType.QUInt8)).graph
    layers = {layer.name: layer for layer in graph.layers}
    plan, (seg,) = planned_segments(graph, 1, Direction.H)
    pool = next(layer for layer in graph.layers if layer.op_type == "MaxPool")
    floats = _FloatPools()
    for family in FAMILIES:
        family.register(floats)
    found = {}
    for registry in (default_registry(), floats):
        inside = in_integer_kernels(plan, seg, layers, registry)
        found[registry is floats] = (eight_bit_op(pool, graph, registry), quantized_layouts(plan, seg, layers, inside, registry).eight_bit_nchw,
                                     len(inside))
    assert found[False][:2] == (True, frozenset({pool.name}))
    assert found[True][:2] == (False, frozenset())
    assert found[True][2] < found[False][2]  # the pool's DequantizeLinear and QuantizeLinear are ops again
