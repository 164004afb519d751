"""Small hand-made ONNX models that imitate what real exporters produce.

The frontend must accept every quirk found in the wild: old IR versions that list the
initialisers among the graph inputs, unnamed nodes with numeric tensor names, every opset
from 9 to 21, weights computed by constant sub-graphs, ops a partitioner does not know,
a symbolic batch dimension with the Shape->Gather->Concat->Reshape chain that torch emits
for ``x.view(x.size(0), -1)``, and ``auto_pad`` / asymmetric padding.

Each function returns a fresh model with deterministic random weights; input ``input``
is (1, 3, 16, 16) float32 (batch ``"N"`` in ``symbolic_batch``) and output ``output`` is
(1, 10). All of them pass ``onnx.checker`` and run in onnxruntime.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx_builder import graph_of, model_of, value_info

INPUT_SHAPE = (1, 3, 16, 16)
CLASSES = 10
FIRST_OPSET = 9
LAST_OPSET = 21


class _Weights:
    """Deterministic float32 initialisers with He-like scale, collected in creation order."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.arrays: dict[str, np.ndarray] = {}

    def add(self, name: str, array: np.ndarray) -> str:
        self.arrays[name] = np.asarray(array)
        return name

    def normal(self, shape: tuple[int, ...], fan_in: int | None = None) -> np.ndarray:
        scale = np.sqrt(2.0 / fan_in) if fan_in else 0.1
        return (self.rng.standard_normal(shape) * scale).astype(np.float32)

    def conv(self, name: str, cout: int, cin: int, kernel: int, groups: int = 1) -> list[str]:
        """Weight and bias names of a conv layer ``name``."""
        fan_in = cin // groups * kernel * kernel
        weight = self.add(f"{name}.weight", self.normal((cout, cin // groups, kernel, kernel), fan_in))
        return [weight, self.add(f"{name}.bias", self.normal((cout,)))]

    def gemm(self, name: str, cout: int, cin: int) -> list[str]:
        """Weight (out, in) for transB=1 and bias names of a fully connected layer."""
        weight = self.add(f"{name}.weight", self.normal((cout, cin), cin))
        return [weight, self.add(f"{name}.bias", self.normal((cout,)))]

    def batch_norm(self, name: str, channels: int) -> list[str]:
        """Scale, bias, running mean and running variance names."""
        return [
            self.add(f"{name}.weight", self.rng.uniform(0.8, 1.2, channels).astype(np.float32)),
            self.add(f"{name}.bias", self.normal((channels,))),
            self.add(f"{name}.running_mean", self.normal((channels,))),
            self.add(f"{name}.running_var", self.rng.uniform(0.8, 1.2, channels).astype(np.float32)),
        ]


def _model(
    name: str,
    nodes: list[onnx.NodeProto],
    weights: _Weights,
    opset: int = 17,
    ir_version: int | None = None,
    batch: int | str = 1,
    initializers_as_inputs: bool = False,
) -> onnx.ModelProto:
    """Wraps nodes into a model with input ``input`` and output ``output`` (IR version
    `ir_version`, else the lowest the opset allows)."""
    graph = graph_of(nodes, [value_info("input", [batch, *INPUT_SHAPE[1:]])], [value_info("output", [batch, CLASSES])],
                     weights.arrays, name, constants_as_inputs=initializers_as_inputs)
    return model_of(graph, {"": opset}, ir_version, producer_name="bbgrap-tests")


def _const(name: str, array: np.ndarray) -> onnx.NodeProto:
    """A Constant node whose output is named ``name``."""
    return helper.make_node("Constant", [], [name], name=name, value=numpy_helper.from_array(np.asarray(array), name))


def _legacy(opset: int) -> onnx.ModelProto:
    """Conv-BN-Relu-MaxPool twice, Flatten, Gemm, as a 2018 PyTorch export (IR 3, unnamed nodes)."""
    w = _Weights(seed=1)
    bn_attrs = {"epsilon": 1e-5, "momentum": 0.9}
    if opset < 9:
        bn_attrs["spatial"] = 1  # removed in BatchNormalization-9
    nodes = [
        helper.make_node("Conv", ["input", *w.conv("0", 8, 3, 3)], ["1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["1", *w.batch_norm("2", 8)], ["3"], **bn_attrs),
        helper.make_node("Relu", ["3"], ["4"]),
        helper.make_node("MaxPool", ["4"], ["5"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["5", *w.conv("6", 16, 8, 3)], ["7"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["7"], ["8"]),
        helper.make_node("MaxPool", ["8"], ["9"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["9"], ["10"], axis=1),
        helper.make_node("Gemm", ["10", *w.gemm("11", CLASSES, 16 * 4 * 4)], ["output"], transB=1),
    ]
    return _model(f"legacy_opset{opset}", nodes, w, opset=opset, ir_version=3, initializers_as_inputs=True)


def legacy_opset9() -> onnx.ModelProto:
    """Opset 9, IR version 3: initialisers also listed in graph.input, nodes without names.

    BatchNormalization-9 no longer has the ``spatial`` attribute (the checker rejects it),
    so the BN here has epsilon and momentum only; see ``legacy_opset8`` for ``spatial``.
    """
    return _legacy(9)


def legacy_opset8() -> onnx.ModelProto:
    """The ``legacy_opset9`` net at opset 8, where BatchNormalization carries ``spatial=1``."""
    return _legacy(8)


def opset(n: int) -> onnx.ModelProto:
    """The same small conv net at opset ``n`` (9..21), using each op's form valid at ``n``.

    Conv-BN-Clip(0, 6), a depthwise Conv-Relu with a residual Add, MaxPool,
    GlobalAveragePool, Flatten, Dropout, Gemm and Softmax(axis=1) on the 2-D logits.
    Clip takes min/max as attributes below opset 11 and as inputs from 11; Dropout's
    ratio is an attribute below 12 and an input from 12.
    """
    if not FIRST_OPSET <= n <= LAST_OPSET:
        raise ValueError(f"opset must be in {FIRST_OPSET}..{LAST_OPSET}, got {n}")
    w = _Weights(seed=0)  # same weights at every opset, so outputs agree
    if n < 11:
        clip = helper.make_node("Clip", ["bn1"], ["clip1"], name="clip1", min=0.0, max=6.0)
    else:
        bounds = [w.add("clip.min", np.array(0.0, np.float32)), w.add("clip.max", np.array(6.0, np.float32))]
        clip = helper.make_node("Clip", ["bn1", *bounds], ["clip1"], name="clip1")
    if n < 12:
        dropout = helper.make_node("Dropout", ["flatten"], ["dropout"], name="dropout", ratio=0.2)
    else:
        ratio = w.add("dropout.ratio", np.array(0.2, np.float32))
        dropout = helper.make_node("Dropout", ["flatten", ratio], ["dropout"], name="dropout")
    nodes = [
        helper.make_node("Conv", ["input", *w.conv("conv1", 8, 3, 3)], ["conv1"], name="conv1",
                         kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["conv1", *w.batch_norm("bn1", 8)], ["bn1"], name="bn1", epsilon=1e-5),
        clip,
        helper.make_node("Conv", ["clip1", *w.conv("conv2", 8, 8, 3, groups=8)], ["conv2"], name="conv2",
                         kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=8),
        helper.make_node("Relu", ["conv2"], ["relu2"], name="relu2"),
        helper.make_node("Add", ["relu2", "clip1"], ["add"], name="add"),
        helper.make_node("MaxPool", ["add"], ["pool"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["pool"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flatten"], name="flatten", axis=1),
        dropout,
        helper.make_node("Gemm", ["dropout", *w.gemm("fc", CLASSES, 8)], ["fc"], name="fc", transB=1),
        helper.make_node("Softmax", ["fc"], ["output"], name="softmax", axis=1),
    ]
    return _model(f"opset{n}", nodes, w, opset=n)


def constant_weight_chain() -> onnx.ModelProto:
    """Conv weights and biases produced by constant sub-graphs instead of initialisers.

    conv1: weight = ConstantOfShape(Constant shape) * initialiser, bias = Constant.
    conv2: weight = Reshape(Constant (8, 8, 9), Constant shape (8, 8, 3, 3)), bias = Constant.
    conv3: weight = Unsqueeze(Constant (8, 8), axes initialiser [2, 3]) (a 1x1 conv).
    """
    w = _Weights(seed=2)
    scale = w.add("conv1.scale", w.normal((8, 3, 3, 3), 27))
    axes = w.add("conv3.axes", np.array([2, 3], np.int64))
    conv = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    nodes = [
        _const("conv1.shape", np.array([8, 3, 3, 3], np.int64)),
        helper.make_node("ConstantOfShape", ["conv1.shape"], ["conv1.ones"], name="conv1.ones",
                         value=numpy_helper.from_array(np.ones(1, np.float32))),
        helper.make_node("Mul", ["conv1.ones", scale], ["conv1.weight"], name="conv1.weight"),
        _const("conv1.bias", w.normal((8,))),
        helper.make_node("Conv", ["input", "conv1.weight", "conv1.bias"], ["conv1"], name="conv1", **conv),
        helper.make_node("Relu", ["conv1"], ["relu1"], name="relu1"),
        _const("conv2.flat", w.normal((8, 8, 9), 72)),
        _const("conv2.shape", np.array([8, 8, 3, 3], np.int64)),
        helper.make_node("Reshape", ["conv2.flat", "conv2.shape"], ["conv2.weight"], name="conv2.weight"),
        _const("conv2.bias", w.normal((8,))),
        helper.make_node("Conv", ["relu1", "conv2.weight", "conv2.bias"], ["conv2"], name="conv2", **conv),
        helper.make_node("Relu", ["conv2"], ["relu2"], name="relu2"),
        _const("conv3.matrix", w.normal((8, 8), 8)),
        helper.make_node("Unsqueeze", ["conv3.matrix", axes], ["conv3.weight"], name="conv3.weight"),
        helper.make_node("Conv", ["relu2", "conv3.weight"], ["conv3"], name="conv3", kernel_shape=[1, 1]),
        *_head(w, "conv3", 8),
    ]
    return _model("constant_weight_chain", nodes, w)


def _head(w: _Weights, x: str, channels: int) -> list[onnx.NodeProto]:
    """GlobalAveragePool -> Flatten -> Gemm into ``output``."""
    return [
        helper.make_node("GlobalAveragePool", [x], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flatten"], name="flatten", axis=1),
        helper.make_node("Gemm", ["flatten", *w.gemm("fc", CLASSES, channels)], ["output"], name="fc", transB=1),
    ]


def _conv(w: _Weights, name: str, x: str, cin: int, cout: int, kernel: int = 3, **attrs: object) -> onnx.NodeProto:
    """A biased Conv named ``name`` whose output tensor is also ``name``."""
    attrs.setdefault("pads", [kernel // 2] * 4)
    return helper.make_node("Conv", [x, *w.conv(name, cout, cin, kernel)], [name], name=name,
                            kernel_shape=[kernel, kernel], **attrs)


def unknown_ops() -> onnx.ModelProto:
    """Regular convs with ops a partitioner may not know in between (opset 17).

    conv1 -> Resize(nearest, x2) -> conv2(s2) -> DepthToSpace(2) -> conv3(s2) ->
    InstanceNormalization -> Split(4, 4) -> Mul(a, Sigmoid(b)) -> Mul by ReduceMean(keepdims=1)
    -> conv4 -> GlobalAveragePool -> Flatten -> Gemm.
    """
    w = _Weights(seed=3)
    scales = w.add("resize.scales", np.array([1, 1, 2, 2], np.float32))
    split = w.add("split.sizes", np.array([4, 4], np.int64))
    norm = [w.add("norm.scale", w.rng.uniform(0.8, 1.2, 8).astype(np.float32)), w.add("norm.bias", w.normal((8,)))]
    nodes = [
        _conv(w, "conv1", "input", 3, 8),
        helper.make_node("Relu", ["conv1"], ["relu1"], name="relu1"),
        helper.make_node("Resize", ["relu1", "", scales], ["resize"], name="resize", mode="nearest"),
        _conv(w, "conv2", "resize", 8, 8, strides=[2, 2]),
        helper.make_node("DepthToSpace", ["conv2"], ["d2s"], name="d2s", blocksize=2, mode="DCR"),
        _conv(w, "conv3", "d2s", 2, 8, strides=[2, 2]),
        helper.make_node("InstanceNormalization", ["conv3", *norm], ["norm"], name="norm", epsilon=1e-5),
        helper.make_node("Split", ["norm", split], ["split.a", "split.b"], name="split", axis=1),
        helper.make_node("Sigmoid", ["split.b"], ["gate"], name="gate"),
        helper.make_node("Mul", ["split.a", "gate"], ["gated"], name="gated"),
        helper.make_node("ReduceMean", ["gated"], ["mean"], name="mean", axes=[2, 3], keepdims=1),
        helper.make_node("Mul", ["gated", "mean"], ["excited"], name="excited"),
        _conv(w, "conv4", "excited", 4, 8),
        *_head(w, "conv4", 8),
    ]
    return _model("unknown_ops", nodes, w)


def symbolic_batch() -> onnx.ModelProto:
    """Input and output batch is the symbolic dimension ``"N"``; flattening as torch exports
    ``x.view(x.size(0), -1)``: Shape -> Gather(0) -> Unsqueeze -> Concat(-1) -> Reshape."""
    w = _Weights(seed=4)
    minus_one = w.add("view.rest", np.array([-1], np.int64))
    zero = w.add("view.index", np.array(0, np.int64))
    axes = w.add("view.axes", np.array([0], np.int64))
    nodes = [
        _conv(w, "conv1", "input", 3, 8),
        helper.make_node("Relu", ["conv1"], ["relu1"], name="relu1"),
        helper.make_node("MaxPool", ["relu1"], ["pool1"], name="pool1", kernel_shape=[4, 4], strides=[4, 4]),
        helper.make_node("Shape", ["pool1"], ["view.shape"], name="view.shape"),
        helper.make_node("Gather", ["view.shape", zero], ["view.batch"], name="view.batch", axis=0),
        helper.make_node("Unsqueeze", ["view.batch", axes], ["view.batch1"], name="view.batch1"),
        helper.make_node("Concat", ["view.batch1", minus_one], ["view.target"], name="view.target", axis=0),
        helper.make_node("Reshape", ["pool1", "view.target"], ["view"], name="view"),
        helper.make_node("Gemm", ["view", *w.gemm("fc", CLASSES, 8 * 4 * 4)], ["output"], name="fc", transB=1),
    ]
    return _model("symbolic_batch", nodes, w, batch="N")


def auto_pad_same() -> onnx.ModelProto:
    """Convs and pools padded by ``auto_pad`` and by asymmetric explicit pads (opset 17).

    Spatial sizes and the padding (begin/end per axis) each layer implies:
    conv1 4x4 SAME_UPPER 16 -> 16 (1/2), conv2 3x3 s2 SAME_LOWER 16 -> 8 (1/0),
    pool1 MaxPool 3x3 s2 SAME_UPPER 8 -> 4 (0/1), conv3 3x3 VALID 4 -> 2,
    conv4 3x3 pads [0, 1, 2, 1] 2 -> 2, pool2 AveragePool 2x2 pads [1, 0, 0, 1]
    (count_include_pad=0) 2 -> 2, then GlobalAveragePool, Flatten, Gemm.
    """
    w = _Weights(seed=5)
    nodes = [
        _conv(w, "conv1", "input", 3, 8, 4, auto_pad="SAME_UPPER", pads=None),
        helper.make_node("Relu", ["conv1"], ["relu1"], name="relu1"),
        _conv(w, "conv2", "relu1", 8, 8, 3, auto_pad="SAME_LOWER", strides=[2, 2], pads=None),
        helper.make_node("Relu", ["conv2"], ["relu2"], name="relu2"),
        helper.make_node("MaxPool", ["relu2"], ["pool1"], name="pool1", kernel_shape=[3, 3], strides=[2, 2],
                         auto_pad="SAME_UPPER"),
        _conv(w, "conv3", "pool1", 8, 8, auto_pad="VALID", pads=None),
        helper.make_node("Relu", ["conv3"], ["relu3"], name="relu3"),
        _conv(w, "conv4", "relu3", 8, 8, pads=[0, 1, 2, 1]),
        helper.make_node("AveragePool", ["conv4"], ["pool2"], name="pool2", kernel_shape=[2, 2],
                         pads=[1, 0, 0, 1], count_include_pad=0),
        *_head(w, "pool2", 8),
    ]
    return _model("auto_pad_same", nodes, w)


ALL: Mapping[str, Callable[[], onnx.ModelProto]] = MappingProxyType({
    "legacy_opset8": legacy_opset8,
    "legacy_opset9": legacy_opset9,
    "constant_weight_chain": constant_weight_chain,
    "unknown_ops": unknown_ops,
    "symbolic_batch": symbolic_batch,
    "auto_pad_same": auto_pad_same,
})
"""Every fixed model by name (``opset(n)`` is parametrised separately)."""
