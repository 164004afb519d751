"""Quantized (QDQ) models: keep onnxruntime's integer kernels in every segment.

A model quantized the QDQ way (onnxruntime's `quantize_static`, PyTorch's PT2E export) is a
float model with QuantizeLinear/DequantizeLinear pairs on its activations and integer weights
behind a DequantizeLinear. onnxruntime does not run it as written: it fuses each
`DequantizeLinear(s) → op → [Relu|Clip] → QuantizeLinear` into one integer kernel
(QLinearConv, QLinearAdd, QLinearMatMul, ...), whose result differs from the float ops' by up
to one quantization step. A plan is exact only if each of its segments shows onnxruntime the
same patterns, so:

* a weight's DequantizeLinear is not folded away: the graph keeps its float value for the rules
  and the cost model, and `Graph.dequantized` says how lowering writes it (integer tensor and
  node, cut like the weight);
* each layer takes the DequantizeLinear nodes in front of it and the Relu/Clip and
  QuantizeLinear behind it as `Layer.fused`: it reads and writes the integer tensors, so its
  halos move as integers (a quarter of the bytes) and lowering emits the pattern whole.

The attached nodes are elementwise (per tensor, or per channel along an axis lowering cuts
their scale to), so they change no region; a layer is cut by its own op's rule as before.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

from bbgrap.ir import Attached, Dequantized, Fused, Layer, Tensor, consumers_of
from bbgrap.rules.base import MS_DOMAIN, is_default_domain
from bbgrap.rules.elementwise import quantize_axis

QUANTIZE, DEQUANTIZE = "QuantizeLinear", "DequantizeLinear"
QDQ_OPS = (QUANTIZE, DEQUANTIZE)
# what onnxruntime folds between an op and its QuantizeLinear (ReluQuantFusion, ClipQuantFusion)
ACTIVATIONS = ("Relu", "Clip")


def _attached(op_type: str, domain: str, attrs: Mapping[str, object], inputs: Sequence[str], rank: int,
              constants: Mapping[str, np.ndarray]) -> Attached | None:
    """The node as an `Attached` to its first input, or None where it cannot be one: another
    input is computed, its scale is blocked (opset 21 `block_size`) or has more than one axis."""
    operands = tuple(inputs[1:])
    if not (is_default_domain(domain) or (domain == MS_DOMAIN and op_type in QDQ_OPS)) \
            or any(t and t not in constants for t in operands) or attrs.get("block_size", 0):
        return None
    axis = None
    if op_type in QDQ_OPS:
        scale = constants[operands[0]]
        if scale.ndim > 1:
            return None
        axis = quantize_axis(attrs, scale.shape, rank)
    while operands and not operands[-1]:
        operands = operands[:-1]
    return Attached(op_type, dict(attrs), operands, axis, "" if is_default_domain(domain) else domain)


def operands(fused: Fused) -> list[str]:
    """The constants the nodes attached to a layer read."""
    return [t for op in [*(op for _, op in fused.inputs), *fused.outputs] for t in op.operands]


def dequantized_weight(node: onnx.NodeProto, constants: Mapping[str, np.ndarray]) -> Dequantized | None:
    """A folded DequantizeLinear of a constant, as lowering is to write it (None: any other node)."""
    if node.op_type != DEQUANTIZE or not node.input or node.input[0] not in constants:
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    op = _attached(DEQUANTIZE, node.domain, attrs, node.input, constants[node.input[0]].ndim, constants)
    return None if op is None else Dequantized(node.input[0], op)


def merge_twins(layers: Sequence[Layer], outputs: Sequence[str]) -> list[Layer]:
    """The layers with each QuantizeLinear that repeats another (the same value, scale, zero point
    and attributes: one per reader, as `quantize_static`'s DedicatedQDQPair writes them) merged into
    the first, as onnxruntime's common subexpression elimination merges them before it fuses: the
    op before them then ends in one QuantizeLinear, and fuses with it."""
    first: dict[tuple[object, ...], str] = {}
    renamed: dict[str, str] = {}
    kept: list[Layer] = []
    for layer in layers:
        if layer.op_type == QUANTIZE and len(layer.outputs) == 1 and layer.outputs[0] not in outputs and not layer.captured:
            key = (layer.domain, tuple(renamed.get(t, t) for t in layer.inputs), tuple(sorted(layer.attrs.items())))
            if key in first:
                renamed[layer.outputs[0]] = first[key]
                continue
            first[key] = layer.outputs[0]
        kept.append(layer)
    return [replace(la, inputs=tuple(renamed.get(t, t) for t in la.inputs)) if any(t in renamed for t in la.inputs) else la
            for la in kept]


def unsigned_pairs(layers: Sequence[Layer], tensors: dict[str, Tensor], constants: dict[str, np.ndarray],
                   outputs: Sequence[str]) -> list[Layer]:
    """The layers with each int8 QuantizeLinear → DequantizeLinear pair made uint8, as onnxruntime's
    QDQS8ToU8Transformer makes it (on CPUs whose integer kernels prefer unsigned activations)
    before it fuses the patterns: a QuantizeLinear whose one reader is a DequantizeLinear that
    feeds one input (onnxruntime has copied a DequantizeLinear for each input it feeds by then,
    so the QuantizeLinear of a shared one has several readers), both with one int8 zero point, of
    equal value; the pair's zero point becomes that value + 128 as uint8 (a constant added to
    `constants`), and the value between them uint8 (`tensors`). The two are the same numbers,
    shifted by 128. onnxruntime can rewrite a pair only where it sees both nodes, which a segment
    boundary or a halo between them would hide: the plan would lose the integer kernels the whole
    model has. Done here, every segment gets the pair as rewritten."""
    readers = consumers_of(layers)

    def int8_zero_point(layer: Layer) -> int | None:
        if layer.captured or len(layer.inputs) != 3 or _attached(layer.op_type, layer.domain, layer.attrs, layer.inputs, 0, constants) is None:
            return None
        zero = constants.get(layer.inputs[2])
        return int(zero.reshape(-1)[0]) if zero is not None and zero.dtype == np.int8 and zero.size == 1 else None

    changed: dict[str, Layer] = {}
    for layer in layers:
        value = layer.outputs[0] if layer.op_type == QUANTIZE and len(layer.outputs) == 1 else ""
        pair = readers.get(value, [])
        if not value or value in outputs or len(pair) != 1 or pair[0].op_type != DEQUANTIZE or pair[0].inputs[0] != value:
            continue
        zero, dequantize = int8_zero_point(layer), pair[0]
        read = dequantize.outputs[0]  # onnxruntime first copies it for each input it feeds (EnsureUniqueDQForNodeUnit)
        if zero is None or zero != int8_zero_point(dequantize) or read in outputs \
                or sum(r.inputs.count(read) for r in readers.get(read, [])) != 1:
            continue
        name = f"{layer.inputs[2]}/uint8"
        constants[name] = np.asarray(zero + 128, np.uint8).reshape(constants[layer.inputs[2]].shape)
        tensors[name] = Tensor(name, constants[name].shape, "uint8")
        tensors[value] = replace(tensors[value], dtype="uint8")
        changed[layer.name] = replace(layer, inputs=(*layer.inputs[:2], name))
        changed[dequantize.name] = replace(dequantize, inputs=(*dequantize.inputs[:2], name))
    return [changed.get(layer.name, layer) for layer in layers]


def fuse(layers: Sequence[Layer], tensors: Mapping[str, Tensor], constants: Mapping[str, np.ndarray],
         outputs: Sequence[str]) -> list[Layer]:
    """The layers with every QDQ pattern attached to its op (module docstring). A
    DequantizeLinear read by several layers goes into each (as onnxruntime's
    EnsureUniqueDQForNodeUnit copies it); it stays a layer of its own only where something
    else reads it too. The Relu/Clip behind a layer go into it only on the way to a
    QuantizeLinear, and only where each is the one reader of the value before it."""
    producers = {t: layer for layer in layers for t in layer.outputs if t}
    readers = consumers_of(layers)

    def attached(layer: Layer) -> Attached | None:
        if layer.captured or layer.shape_from_values or not layer.inputs or not layer.inputs[0]:
            return None
        return _attached(layer.op_type, layer.domain, layer.attrs, layer.inputs, len(tensors[layer.inputs[0]].shape), constants)

    fused: dict[str, Layer] = {}
    absorbed: set[str] = set()  # the Relu/Clip/QuantizeLinear layers taken into the layer before them
    taken: set[tuple[str, str]] = set()  # (layer, the DequantizeLinear's value it took in)
    for layer in layers:
        if layer.name in absorbed or layer.op_type in QDQ_OPS or layer.captured or layer.shape_from_values \
                or not is_default_domain(layer.domain):
            continue
        inputs = list(layer.inputs)
        before: list[tuple[int, Attached]] = []
        for k, t in enumerate(layer.explicit_inputs):
            producer = producers.get(t)
            if producer is not None and producer.op_type == DEQUANTIZE and (op := attached(producer)) is not None:
                inputs[k] = producer.inputs[0]
                before.append((k, op))
                taken.add((layer.name, t))
        chain: list[Layer] = []
        after: list[Attached] = []
        value = layer.outputs[0] if len(layer.outputs) == 1 else ""
        while value and value not in outputs and len(readers.get(value, [])) == 1:
            reader = readers[value][0]
            if reader.op_type not in (QUANTIZE, *ACTIVATIONS) or value in reader.inputs[1:] or (op := attached(reader)) is None:
                break
            chain.append(reader)
            after.append(op)
            value = reader.outputs[0]
            if reader.op_type == QUANTIZE:
                break
        if not after or after[-1].op_type != QUANTIZE:
            chain, after = [], []
        if before or after:
            absorbed.update(c.name for c in chain)
            out = (chain[-1].outputs[0],) if chain else layer.outputs
            fused[layer.name] = replace(layer, inputs=tuple(inputs), outputs=out, fused=Fused(tuple(before), tuple(after)))

    def still_read(layer: Layer) -> bool:
        value = layer.outputs[0]
        return value in outputs or any((r.name, value) not in taken for r in readers.get(value, []))

    return [fused.get(layer.name, layer) for layer in layers
            if layer.name not in absorbed and (layer.op_type != DEQUANTIZE or still_read(layer))]

