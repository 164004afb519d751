"""Well-known CNN architectures built directly as ONNX graphs, with random weights.

The models follow torchvision's layer structure (GoogLeNet with its original LRN
layers, DenseNet-121) so that tests and benchmarks can partition realistic graphs
without downloading anything. Weights are drawn from a seeded numpy generator with
He-scaled initialisation, so the activations stay in a sane range through the whole
depth and a partitioned plan can be compared numerically against onnxruntime.

``width`` scales every channel count (tests use tiny variants such as width=0.125 at
resolution 32-64); ``width=1.0`` at resolution 224 is the real architecture. Every model
has one input ``input`` (batch, 3, R, R) and one output ``output`` (batch, 1000): logits,
except ``inception``, which ends with a Softmax (class probabilities) like the original
GoogLeNet deployment model.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType
from typing import Any, Protocol

import numpy as np
import onnx
from onnx import TensorProto, helper

NAMES: tuple[str, ...] = ("vgg16", "resnet18", "resnet50", "mobilenet_v2", "inception", "densenet")

MIN_RESOLUTION = 32
"""Every model downsamples by 32, so smaller inputs leave no feature map to classify."""

OPSET = 17
IR_VERSION = 8  # opset 17 needs IR >= 8; onnxruntime 1.17 reads up to IR 9
NUM_CLASSES = 1000
_RELU_GAIN = math.sqrt(2.0)
_RESIDUAL_GAIN = 0.3
"""Scale of the last BN of each residual branch, so sums of branches do not blow up."""


class ZooError(ValueError):
    """A model cannot be built from the given arguments."""


@dataclass
class _Builder:
    """Writes nodes and initialisers straight into one model (no copies of the weights).

    Every node has a single output tensor named after the node.
    """

    rng: np.random.Generator
    width: float
    proto: onnx.ModelProto = field(default_factory=onnx.ModelProto)
    _constants: set[str] = field(default_factory=set)

    def ch(self, channels: int) -> int:
        """A channel count scaled by the width multiplier (at least 1)."""
        return max(1, int(channels * self.width + 0.5))

    def weight(self, name: str, array: np.ndarray) -> str:
        tensor = self.proto.graph.initializer.add()
        tensor.name = name
        tensor.data_type = TensorProto.FLOAT
        tensor.dims.extend(array.shape)
        tensor.raw_data = np.asarray(array, dtype="<f4").tobytes()
        return name

    def normal(self, name: str, shape: tuple[int, ...], std: float) -> str:
        values = self.rng.standard_normal(shape, dtype=np.float32)
        values *= np.float32(std)
        return self.weight(name, values)

    def constant(self, name: str, value: float) -> str:
        """A scalar initialiser shared by every node that uses it (e.g. Clip bounds)."""
        if name not in self._constants:
            self._constants.add(self.weight(name, np.array(value, dtype=np.float32)))
        return name

    def node(self, op: str, name: str, inputs: list[str], **attrs: Any) -> str:
        self.proto.graph.node.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    # -- layers -----------------------------------------------------------------------

    def conv(
        self,
        name: str,
        x: str,
        cin: int,
        cout: int,
        kernel: int,
        stride: int = 1,
        pad: int = 0,
        groups: int = 1,
        bias: bool = False,
        gain: float = _RELU_GAIN,
    ) -> str:
        fan_in = cin // groups * kernel * kernel
        inputs = [x, self.normal(f"{name}.weight", (cout, cin // groups, kernel, kernel), gain / math.sqrt(fan_in))]
        if bias:
            inputs.append(self.normal(f"{name}.bias", (cout,), 0.01))
        return self.node(
            "Conv",
            name,
            inputs,
            kernel_shape=[kernel, kernel],
            strides=[stride, stride],
            pads=[pad] * 4,
            dilations=[1, 1],
            group=groups,
        )

    def bn(self, name: str, x: str, channels: int, gamma: float = 1.0) -> str:
        """Inference BatchNormalization with gamma near ``gamma``, running var near 1."""
        rng = self.rng
        scale = rng.uniform(0.8, 1.2, channels).astype(np.float32) * np.float32(gamma)
        inputs = [
            x,
            self.weight(f"{name}.weight", scale),
            self.normal(f"{name}.bias", (channels,), 0.05),
            self.normal(f"{name}.running_mean", (channels,), 0.05),
            self.weight(f"{name}.running_var", rng.uniform(0.8, 1.2, channels).astype(np.float32)),
        ]
        return self.node("BatchNormalization", name, inputs, epsilon=1e-5, momentum=0.9)

    def relu(self, name: str, x: str) -> str:
        return self.node("Relu", name, [x])

    def relu6(self, name: str, x: str) -> str:
        """ReLU6 as torch exports it: Clip with min/max inputs (opset >= 11)."""
        return self.node("Clip", name, [x, self.constant("relu6.min", 0.0), self.constant("relu6.max", 6.0)])

    def max_pool(self, name: str, x: str, kernel: int, stride: int, pad: int = 0, ceil: bool = False) -> str:
        return self.node(
            "MaxPool",
            name,
            [x],
            kernel_shape=[kernel, kernel],
            strides=[stride, stride],
            pads=[pad] * 4,
            ceil_mode=int(ceil),
        )

    def avg_pool(self, name: str, x: str, kernel: int, stride: int) -> str:
        return self.node("AveragePool", name, [x], kernel_shape=[kernel, kernel], strides=[stride, stride])

    def gemm(self, name: str, x: str, cin: int, cout: int, gain: float = 1.0) -> str:
        """Fully connected layer as torch exports it: Gemm with weight (out, in) and transB=1."""
        weight = self.normal(f"{name}.weight", (cout, cin), gain / math.sqrt(cin))
        bias = self.normal(f"{name}.bias", (cout,), 0.01)
        return self.node("Gemm", name, [x, weight, bias], alpha=1.0, beta=1.0, transB=1)

    def classifier(self, x: str, channels: int) -> str:
        """GlobalAveragePool -> Flatten -> Gemm, the head of ResNet/MobileNet/DenseNet."""
        x = self.node("GlobalAveragePool", "avgpool", [x])
        x = self.node("Flatten", "flatten", [x], axis=1)
        return self.gemm("fc", x, channels, NUM_CLASSES)

    def model(self, graph_name: str, output: str, resolution: int, batch: int) -> onnx.ModelProto:
        """Renames the final tensor to ``output``, adds the graph's signature and returns the model."""
        last = self.proto.graph.node[-1]
        if list(last.output) != [output]:
            raise AssertionError("the model's output must be produced by its last node")
        last.output[0] = "output"
        model = self.proto
        model.ir_version = IR_VERSION
        model.producer_name = "bbgrap.zoo"
        model.opset_import.append(helper.make_opsetid("", OPSET))
        model.graph.name = graph_name
        model.graph.input.append(
            helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 3, resolution, resolution])
        )
        model.graph.output.append(helper.make_tensor_value_info("output", TensorProto.FLOAT, [batch, NUM_CLASSES]))
        return model


def _conv_bn(b: _Builder, name: str, x: str, cin: int, cout: int, kernel: int, stride: int = 1, pad: int = 0,
             gamma: float = 1.0, bn_name: str | None = None) -> str:
    """Conv without bias followed by BatchNormalization (torchvision's conv + bn pair)."""
    x = b.conv(name, x, cin, cout, kernel, stride, pad)
    return b.bn(bn_name or f"{name}.bn", x, cout, gamma)


def _pool_size(size: int, kernel: int, stride: int, pad: int = 0, ceil: bool = False) -> int:
    """Output length of a conv/pool window along one axis (ONNX's formula)."""
    span = size + 2 * pad - kernel
    return (-(-span // stride) if ceil else span // stride) + 1


# -- VGG-16 ---------------------------------------------------------------------------

_VGG16: tuple[int | str, ...] = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


def _vgg16(b: _Builder, resolution: int) -> str:
    """torchvision vgg16: 13 conv3x3+ReLU, 5 maxpools, 3 FC layers (no batch norm)."""
    x, cin = "input", 3
    for index, item in enumerate(_VGG16):
        name = f"features.{index}"
        if item == "M":
            x = b.max_pool(name, x, 2, 2)
            continue
        cout = b.ch(int(item))
        x = b.relu(f"{name}.relu", b.conv(name, x, cin, cout, 3, pad=1, bias=True))
        cin = cout
    side = resolution // 32
    if side > 7:
        # AdaptiveAvgPool2d(7) as a fixed window: stride floor(F/7), kernel chosen so the
        # output is exactly 7x7 (kernel == stride when F is a multiple of 7).
        stride = side // 7
        x = b.avg_pool("avgpool", x, side - 6 * stride, stride)
        side = 7
    x = b.node("Flatten", "flatten", [x], axis=1)
    hidden = b.ch(4096)
    x = b.relu("classifier.1", b.gemm("classifier.0", x, cin * side * side, hidden, _RELU_GAIN))
    x = b.relu("classifier.4", b.gemm("classifier.3", x, hidden, hidden, _RELU_GAIN))
    return b.gemm("classifier.6", x, hidden, NUM_CLASSES)


# -- ResNet-18 / ResNet-50 --------------------------------------------------------------


class _Block(Protocol):
    """A residual block: (builder, name, input, in channels, planes, stride) -> (output, out channels)."""

    def __call__(self, b: _Builder, name: str, x: str, cin: int, planes: int, stride: int) -> tuple[str, int]: ...


def _resnet_unit(b: _Builder, block: str, index: int, x: str, cin: int, cout: int, kernel: int,
                 stride: int = 1, last: bool = False) -> str:
    """``block.conv{index}`` -> ``block.bn{index}`` -> ``block.relu{index}``.

    The ``last`` unit of a residual branch has no ReLU (that follows the Add) and a small
    BN scale, so that summing branches keeps activations in range.
    """
    gamma = _RESIDUAL_GAIN if last else 1.0
    x = _conv_bn(b, f"{block}.conv{index}", x, cin, cout, kernel, stride, kernel // 2, gamma, f"{block}.bn{index}")
    return x if last else b.relu(f"{block}.relu{index}", x)


def _basic_block(b: _Builder, name: str, x: str, cin: int, planes: int, stride: int) -> tuple[str, int]:
    out = _resnet_unit(b, name, 1, x, cin, planes, 3, stride)
    out = _resnet_unit(b, name, 2, out, planes, planes, 3, last=True)
    return _residual(b, name, x, out, cin, planes, stride), planes


def _bottleneck(b: _Builder, name: str, x: str, cin: int, planes: int, stride: int) -> tuple[str, int]:
    cout = planes * 4
    out = _resnet_unit(b, name, 1, x, cin, planes, 1)
    out = _resnet_unit(b, name, 2, out, planes, planes, 3, stride)
    out = _resnet_unit(b, name, 3, out, planes, cout, 1, last=True)
    return _residual(b, name, x, out, cin, cout, stride), cout


def _residual(b: _Builder, name: str, x: str, branch: str, cin: int, cout: int, stride: int) -> str:
    """Adds the shortcut (a 1x1 conv + BN when the shape changes) to the branch, then ReLU."""
    if stride != 1 or cin != cout:
        x = _conv_bn(b, f"{name}.downsample.0", x, cin, cout, 1, stride, bn_name=f"{name}.downsample.1")
    return b.relu(f"{name}.relu", b.node("Add", f"{name}.add", [branch, x]))


def _resnet(b: _Builder, resolution: int, blocks: tuple[int, ...], block: _Block) -> str:
    """torchvision ResNet: 7x7/2 stem, 3x3/2 maxpool, four stages, global pool and FC."""
    del resolution  # every stage is strided convolution; the head is a global pool
    channels = b.ch(64)
    x = b.relu("relu", _conv_bn(b, "conv1", "input", 3, channels, 7, 2, 3, bn_name="bn1"))
    x = b.max_pool("maxpool", x, 3, 2, 1)
    for stage, count in enumerate(blocks):
        planes = b.ch(64 << stage)
        for index in range(count):
            stride = 2 if stage > 0 and index == 0 else 1
            x, channels = block(b, f"layer{stage + 1}.{index}", x, channels, planes, stride)
    return b.classifier(x, channels)


# -- MobileNetV2 ------------------------------------------------------------------------

_MOBILENET_V2 = (
    (1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)
)
"""torchvision's inverted residual settings: expansion t, channels c, repeats n, stride s."""


def _conv_bn_relu6(b: _Builder, name: str, x: str, cin: int, cout: int, kernel: int, stride: int = 1,
                   groups: int = 1) -> str:
    """torchvision's Conv2dNormActivation with ReLU6: ``name.0`` conv, ``name.1`` BN, ``name.2`` Clip."""
    x = b.conv(f"{name}.0", x, cin, cout, kernel, stride, (kernel - 1) // 2, groups)
    return b.relu6(f"{name}.2", b.bn(f"{name}.1", x, cout))


def _inverted_residual(b: _Builder, name: str, x: str, cin: int, cout: int, stride: int, expand: int) -> str:
    """Expand 1x1 -> depthwise 3x3 -> linear 1x1 projection, with a skip when shapes match."""
    hidden = max(1, round(cin * expand))
    out, index = x, 0
    if expand != 1:
        out, index = _conv_bn_relu6(b, f"{name}.conv.0", out, cin, hidden, 1), 1
    out = _conv_bn_relu6(b, f"{name}.conv.{index}", out, hidden, hidden, 3, stride, groups=hidden)
    residual = stride == 1 and cin == cout
    out = b.conv(f"{name}.conv.{index + 1}", out, hidden, cout, 1, gain=1.0)
    out = b.bn(f"{name}.conv.{index + 2}", out, cout, _RESIDUAL_GAIN if residual else 1.0)
    return b.node("Add", f"{name}.add", [x, out]) if residual else out


def _mobilenet_v2(b: _Builder, resolution: int) -> str:
    """torchvision mobilenet_v2: 17 inverted residual blocks with ReLU6 and depthwise convs."""
    del resolution
    channels = b.ch(32)
    x = _conv_bn_relu6(b, "features.0", "input", 3, channels, 3, 2)
    index = 1
    for expand, base, repeats, first_stride in _MOBILENET_V2:
        cout = b.ch(base)
        for repeat in range(repeats):
            stride = first_stride if repeat == 0 else 1
            x = _inverted_residual(b, f"features.{index}", x, channels, cout, stride, expand)
            channels, index = cout, index + 1
    last = b.ch(1280)
    x = _conv_bn_relu6(b, f"features.{index}", x, channels, last, 1)
    return b.classifier(x, last)


# -- GoogLeNet (inception v1) -----------------------------------------------------------

_INCEPTION_STAGES = (
    (("3a", (64, 96, 128, 16, 32, 32)), ("3b", (128, 128, 192, 32, 96, 64))),
    (
        ("4a", (192, 96, 208, 16, 48, 64)),
        ("4b", (160, 112, 224, 24, 64, 64)),
        ("4c", (128, 128, 256, 24, 64, 64)),
        ("4d", (112, 144, 288, 32, 64, 64)),
        ("4e", (256, 160, 320, 32, 128, 128)),
    ),
    (("5a", (256, 160, 320, 32, 128, 128)), ("5b", (384, 192, 384, 48, 128, 128))),
)
"""Inception modules per stage: 1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool projection."""


def _conv_bn_relu(b: _Builder, name: str, x: str, cin: int, cout: int, kernel: int, stride: int = 1,
                  pad: int = 0) -> str:
    """torchvision's BasicConv2d: ``name.conv`` (no bias), ``name.bn``, ``name.relu``."""
    x = _conv_bn(b, f"{name}.conv", x, cin, cout, kernel, stride, pad, bn_name=f"{name}.bn")
    return b.relu(f"{name}.relu", x)


def _inception_module(b: _Builder, name: str, x: str, cin: int, widths: tuple[int, ...]) -> tuple[str, int]:
    """Four branches (1x1, 1x1->3x3, 1x1->5x5, maxpool->1x1) concatenated on channels."""
    c1, c3_reduce, c3, c5_reduce, c5, pool_proj = (b.ch(c) for c in widths)
    branch1 = _conv_bn_relu(b, f"{name}.branch1", x, cin, c1, 1)
    branch2 = _conv_bn_relu(b, f"{name}.branch2.0", x, cin, c3_reduce, 1)
    branch2 = _conv_bn_relu(b, f"{name}.branch2.1", branch2, c3_reduce, c3, 3, pad=1)
    branch3 = _conv_bn_relu(b, f"{name}.branch3.0", x, cin, c5_reduce, 1)
    branch3 = _conv_bn_relu(b, f"{name}.branch3.1", branch3, c5_reduce, c5, 5, pad=2)
    branch4 = b.max_pool(f"{name}.branch4.0", x, 3, 1, 1)
    branch4 = _conv_bn_relu(b, f"{name}.branch4.1", branch4, cin, pool_proj, 1)
    out = b.node("Concat", f"{name}.concat", [branch1, branch2, branch3, branch4], axis=1)
    return out, c1 + c3 + c5 + pool_proj


def _lrn(b: _Builder, name: str, x: str) -> str:
    """Local response normalisation as in the original GoogLeNet (Caffe parameters)."""
    return b.node("LRN", name, [x], size=5, alpha=1e-4, beta=0.75, bias=1.0)


def _inception(b: _Builder, resolution: int) -> str:
    """GoogLeNet: stem with LRN, nine inception modules, ceil-mode maxpools, AveragePool, FC, Softmax."""
    c64, c192 = b.ch(64), b.ch(192)
    x = _conv_bn_relu(b, "conv1", "input", 3, c64, 7, 2, 3)
    x = _lrn(b, "lrn1", b.max_pool("maxpool1", x, 3, 2, ceil=True))
    x = _conv_bn_relu(b, "conv2", x, c64, c64, 1)
    x = _conv_bn_relu(b, "conv3", x, c64, c192, 3, pad=1)
    x = b.max_pool("maxpool2", _lrn(b, "lrn2", x), 3, 2, ceil=True)
    side = _pool_size(_pool_size(_pool_size(resolution, 7, 2, 3), 3, 2, ceil=True), 3, 2, ceil=True)
    channels = c192
    pools = ((3, 2), (2, 2))  # maxpool3 and maxpool4 between the stages
    for stage, modules in enumerate(_INCEPTION_STAGES):
        if stage > 0:
            kernel, stride = pools[stage - 1]
            x = b.max_pool(f"maxpool{stage + 2}", x, kernel, stride, ceil=True)
            side = _pool_size(side, kernel, stride, ceil=True)
        for label, widths in modules:
            x, channels = _inception_module(b, f"inception{label}", x, channels, widths)
    x = b.avg_pool("avgpool", x, side, 1)
    x = b.node("Flatten", "flatten", [x], axis=1)
    return b.node("Softmax", "softmax", [b.gemm("fc", x, channels, NUM_CLASSES)], axis=1)


# -- DenseNet-121 ------------------------------------------------------------------------

_DENSENET_BLOCKS = (6, 12, 24, 16)
_DENSENET_GROWTH = 32
_DENSENET_BN_SIZE = 4


def _bn_relu_conv(b: _Builder, prefix: str, suffix: str, x: str, cin: int, cout: int, kernel: int,
                  pad: int = 0) -> str:
    """DenseNet's pre-activation unit: ``normS`` -> ``reluS`` -> ``convS`` under ``prefix``."""
    x = b.relu(f"{prefix}.relu{suffix}", b.bn(f"{prefix}.norm{suffix}", x, cin))
    return b.conv(f"{prefix}.conv{suffix}", x, cin, cout, kernel, pad=pad)


def _dense_block(b: _Builder, name: str, x: str, cin: int, layers: int) -> tuple[str, int]:
    """Each layer reads the Concat of all earlier features and adds ``growth`` channels."""
    growth, bottleneck = b.ch(_DENSENET_GROWTH), b.ch(_DENSENET_BN_SIZE * _DENSENET_GROWTH)
    features, channels = [x], cin
    for index in range(1, layers + 1):
        layer = f"{name}.denselayer{index}"
        joined = features[0] if len(features) == 1 else b.node("Concat", f"{layer}.concat", features, axis=1)
        out = _bn_relu_conv(b, layer, "1", joined, channels, bottleneck, 1)
        features.append(_bn_relu_conv(b, layer, "2", out, bottleneck, growth, 3, pad=1))
        channels += growth
    return b.node("Concat", f"{name}.concat", features, axis=1), channels


def _densenet(b: _Builder, resolution: int) -> str:
    """torchvision densenet121: dense blocks (6, 12, 24, 16) joined by BN-ReLU-Conv-AvgPool transitions."""
    del resolution
    channels = b.ch(64)
    x = b.conv("features.conv0", "input", 3, channels, 7, 2, 3)
    x = b.relu("features.relu0", b.bn("features.norm0", x, channels))
    x = b.max_pool("features.pool0", x, 3, 2, 1)
    for index, layers in enumerate(_DENSENET_BLOCKS, start=1):
        x, channels = _dense_block(b, f"features.denseblock{index}", x, channels, layers)
        if index < len(_DENSENET_BLOCKS):
            name, half = f"features.transition{index}", max(1, channels // 2)
            x = b.avg_pool(f"{name}.pool", _bn_relu_conv(b, name, "", x, channels, half, 1), 2, 2)
            channels = half
    x = b.relu("features.relu5", b.bn("features.norm5", x, channels))
    return b.classifier(x, channels)


# -- public API --------------------------------------------------------------------------

_ARCHITECTURES: Mapping[str, Callable[[_Builder, int], str]] = MappingProxyType({
    "vgg16": _vgg16,
    "resnet18": partial(_resnet, blocks=(2, 2, 2, 2), block=_basic_block),
    "resnet50": partial(_resnet, blocks=(3, 4, 6, 3), block=_bottleneck),
    "mobilenet_v2": _mobilenet_v2,
    "inception": _inception,
    "densenet": _densenet,
})


def build(name: str, resolution: int = 224, batch: int = 1, width: float = 1.0, seed: int = 0) -> onnx.ModelProto:
    """Builds model ``name`` for input (batch, 3, resolution, resolution) with seeded random weights.

    Raises ZooError for an unknown name, a resolution below MIN_RESOLUTION, width <= 0 or
    batch < 1.
    """
    resolution, batch = _integer("resolution", resolution), _integer("batch", batch)
    if name not in _ARCHITECTURES:
        raise ZooError(f"unknown model {name!r}; known models: {', '.join(NAMES)}")
    if resolution < MIN_RESOLUTION:
        raise ZooError(f"resolution {resolution} is too small for {name}: the minimum is {MIN_RESOLUTION}")
    if not width > 0:
        raise ZooError(f"width must be > 0, got {width}")
    if batch < 1:
        raise ZooError(f"batch must be >= 1, got {batch}")
    builder = _Builder(np.random.default_rng(seed), float(width))
    output = _ARCHITECTURES[name](builder, resolution)
    return builder.model(name, output, resolution, batch)


def _integer(key: str, value: object) -> int:
    """``value`` as an int (numpy integers included), or a ZooError naming ``key``."""
    if isinstance(value, bool):
        raise ZooError(f"{key} must be an integer, got {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ZooError(f"{key} must be an integer, got {value!r}") from None
