"""A BatchNormalization whose result is rounded later, written so that every piece computes its bits.

onnxruntime's CPU provider computes an inference BatchNormalization `y = x·s + t` in one of two
ways, each a product and then a sum, each rounded (no fused multiply-add):

* with its own kernel (`Way.KERNEL`): `s = γ · (1 / √(σ² + ε))`, `t = β − μ·s`;
* where its input is in the blocked layout (NCHWc), as a blocked 1x1 depthwise convolution
  (`Way.BLOCKED`): `s = γ / √(σ² + ε)`, `t = β − μ·s`.

The two `s` differ in the last bit for some channels, and which way the whole model takes depends
on the layout of the BatchNormalization's input there, which a piece of the layer need not share:
a piece whose segment receives its input from another one sees it in NCHW and runs the kernel.
Where the result is rounded later (`Graph.rounded_later`: a dynamically quantized model's
DynamicQuantizeLinear), that last bit can become a quantization step.

So each such layer gets the parameters γ' = s, β' = t, μ' = 0, σ²' = 1, ε' = 0, with the `s` and
`t` of the way onnxruntime runs it in the whole model, read from its optimised graph (`ways`).
Both ways then compute `s` and `t` exactly (s·(1/√1) = s/√1 = s, t − 0·s = t), so each piece, cut
in any way, in any segment, in either layout, computes the whole op's bits, and stays one
BatchNormalization as fast as before (`rules.elementwise.same_in_every_layout`). A layer
onnxruntime folded into the convolution before it, or ran some third way, is left as it is.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np
import onnx

from bbgrap.ir import Graph, Layer, Tensor
from bbgrap.rules.base import NCHWC_DOMAIN, is_default_domain

NCHWC_NORM_SUFFIX = "_bn_nchwc"  # the name onnxruntime's NCHWc transformer gives the convolution a norm becomes
PARAMETERS = 4  # scale γ, bias β, mean μ, variance σ²


class Way(enum.Enum):
    """How onnxruntime computes one BatchNormalization of the whole model."""

    KERNEL = "its BatchNormalization kernel"
    BLOCKED = "a blocked 1x1 depthwise convolution"


@dataclass(frozen=True)
class Affine:
    """A BatchNormalization as the `scale` and `shift` onnxruntime multiplies and adds, per channel."""

    scale: np.ndarray
    shift: np.ndarray


def rounded_norms(graph: Graph) -> list[Layer]:
    """The inference BatchNormalizations on float32 values, with constant parameters and no QDQ
    pattern of their own, whose result is rounded later (`Graph.rounded_later`)."""
    return [layer for layer in graph.layers if _rewritable(layer, graph) and graph.rounded_later(layer)]


def _rewritable(layer: Layer, graph: Graph) -> bool:
    if layer.op_type != "BatchNormalization" or not is_default_domain(layer.domain) or layer.fused is not None:
        return False
    if len([t for t in layer.outputs if t]) != 1 or int(layer.attrs.get("training_mode", 0)) or int(layer.attrs.get("spatial", 1)) != 1:
        return False
    x, *params = layer.inputs
    channels = graph.tensors[x].shape[1] if len(graph.tensors[x].shape) >= 2 else -1
    return (graph.tensors[x].dtype == "float32" and len(params) == PARAMETERS
            and all(p in graph.constants and graph.constants[p].dtype == np.float32 and graph.constants[p].shape == (channels,)
                    for p in params))


def ways(norms: Sequence[Layer], optimised: Sequence[onnx.NodeProto]) -> dict[str, Way]:
    """How onnxruntime's optimised graph of the whole model (`optimised`) computes each of `norms`,
    by layer name: still a BatchNormalization writing the layer's output (`Way.KERNEL`), or the
    NCHWc convolution its transformer names after that output (`Way.BLOCKED`). A layer found
    neither way (folded into a convolution before it) is not in the result."""
    kernels = {n.output[0] for n in optimised if n.op_type == "BatchNormalization" and is_default_domain(n.domain) and n.output}
    blocked = [n.name for n in optimised if n.op_type == "Conv" and n.domain == NCHWC_DOMAIN]
    found: dict[str, Way] = {}
    for layer in norms:
        out = layer.outputs[0]
        if out in kernels:
            found[layer.name] = Way.KERNEL
        elif any(name.startswith(out + NCHWC_NORM_SUFFIX) for name in blocked):
            found[layer.name] = Way.BLOCKED
    return found


def affine(layer: Layer, graph: Graph, way: Way) -> Affine:
    """The per-channel scale and shift onnxruntime computes `layer` with when it runs it `way`,
    in float32, step by step as onnxruntime does."""
    gamma, beta, mean, variance = (graph.constants[p] for p in layer.inputs[1:])
    root = np.sqrt(variance + np.float32(layer.attrs.get("epsilon", 1e-5)))
    scale = gamma / root if way is Way.BLOCKED else gamma * (np.float32(1) / root)
    return Affine(scale.astype(np.float32), (beta - mean * scale).astype(np.float32))


def as_computed(graph: Graph, found: dict[str, Way]) -> Graph:
    """`graph` with each BatchNormalization of `found` given the parameters that make both of
    onnxruntime's ways compute its `affine` of that way: γ = scale, β = shift, μ = 0, σ² = 1, ε = 0
    (new constants `<layer>/scale`, `/shift`, `/mean`, `/variance`; its own are dropped where
    nothing else reads them)."""
    layers: list[Layer] = []
    tensors = dict(graph.tensors)
    constants = dict(graph.constants)
    for layer in graph.layers:
        way = found.get(layer.name)
        if way is None:
            layers.append(layer)
            continue
        params = affine(layer, graph, way)
        channels = params.scale.shape
        names = []
        for what, value in (("scale", params.scale), ("shift", params.shift), ("mean", np.zeros(channels, np.float32)),
                            ("variance", np.ones(channels, np.float32))):
            name = _fresh(f"{layer.name}/{what}", tensors)
            constants[name] = value
            tensors[name] = Tensor(name, channels, "float32")
            names.append(name)
        layers.append(replace(layer, inputs=(layer.inputs[0], *names), attrs={**layer.attrs, "epsilon": 0.0}))
    kept = {t for layer in layers for t in layer.inputs if t}
    for layer in graph.layers:
        if layer.name in found:
            for name in layer.inputs[1:]:
                if name not in kept:
                    constants.pop(name, None)
                    tensors.pop(name, None)
    return graph.replace(layers=tuple(layers), tensors=tensors, constants=constants)


def _fresh(base: str, taken: dict[str, Tensor]) -> str:
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}.{k}"
    return name
