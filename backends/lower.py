"""Partitioned IR → one program per node: ONNX segments, sends and waits.

Every local value is named by the tensor and the region it holds
(`conv1@0:1,0:64,0:56,0:112`), so equal regions are the same value: a crop of
the whole region, a concat of one piece or an Identity emits nothing. A node's
program walks the layers in one global topological order; a segment ends where
the node must wait for a message, and right after a layer whose output it sends
(so the send starts as early as the data exists). Every node follows the same
order and sends without blocking, so a node waiting for data only waits for a
layer earlier in that order: the plan cannot deadlock.

Crops are where onnxruntime's CPU provider leaves its blocked NCHWc layout, so lowering
avoids them where it can: a windowed op reads trailing rows it does not need when they
change nothing (`_window_slack`), and a small crop between two NCHWc ops inside a segment
becomes a one-tap depthwise convolution (`_crops_as_convolutions`).

A control-flow node (If, Loop, Scan) is computed whole; the outer tensors its bodies read
by name (`Layer.captured`) are bound in its segment under their original names (an
Identity of the local value, or the weight itself), so the bodies are emitted unchanged:
renaming inside them would have to follow every nested scope's shadowing, binding does not.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from bbgrap.ir import Attached, Gather, Graph, Interval, Layer, ShapeMap
from bbgrap.movement import OUTPUT_NODE, pieces
from bbgrap.rules.base import is_default_domain
from bbgrap.rules.registry import RuleRegistry, default_registry
from bbgrap.rules.window import Window, kernel_of

CROP_OP = "Slice"  # how lowering crops a value; like the ops with `moves_data`, it computes nothing


def value_name(tensor: str, region: ShapeMap) -> str:
    return f"{tensor}@{region.key()}"


def output_required(layer: Layer, k: int, opsets: Mapping[str, int]) -> bool:
    """Whether output k of the layer's op must be there even where nothing reads it: an output
    its schema does not call optional (TopK's indices; every output of If and Loop, which must
    match their bodies'). An op ONNX does not know keeps every output."""
    domain = "" if is_default_domain(layer.domain) else layer.domain
    try:
        schema = onnx.defs.get_schema(layer.op_type, opsets.get(domain, 1), domain)
    except onnx.defs.SchemaError:
        return True
    if not schema.outputs:
        return True
    formal = schema.outputs[min(k, len(schema.outputs) - 1)]  # a variadic last output covers the rest
    return formal.option != onnx.defs.OpSchema.FormalParameterOption.Optional


@dataclass(frozen=True)
class Message:
    id: int
    src: int
    dst: int
    tensor: str
    region: ShapeMap
    dtype: str

    @property
    def value(self) -> str:
        return value_name(self.tensor, self.region)

    @property
    def nbytes(self) -> int:
        return self.region.volume * np.dtype(self.dtype).itemsize


@dataclass
class Segment:
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    initializers: dict[str, np.ndarray] = field(default_factory=dict)  # the model's weights and crops' indices
    weights: set[str] = field(default_factory=set)  # which initializers are the model's weights
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    name: str = ""  # its ONNX graph's name
    types: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)  # dtype and shape of each input and output

    def producers(self) -> dict[str, onnx.NodeProto]:
        """Value name → the node of this segment that computes it."""
        return {o: node for node in self.nodes for o in node.output if o}

    def readers(self) -> dict[str, list[onnx.NodeProto]]:
        """Value name → the nodes of this segment that read it, in order (a node once per input it reads it as)."""
        out: dict[str, list[onnx.NodeProto]] = {}
        for node in self.nodes:
            for i in node.input:
                out.setdefault(i, []).append(node)
        return out


@dataclass
class Step:
    op: str  # "run", "send" or "wait"
    segment: Segment | None = None
    message: Message | None = None
    value: str = ""  # for a send: the local value holding the message's data (aliases resolved)

    @property
    def seg(self) -> Segment:
        """The segment of a run step (every run step has one)."""
        assert self.segment is not None, f"a {self.op} step has no segment"
        return self.segment

    @property
    def msg(self) -> Message:
        """The message of a send or wait step (every one has one)."""
        assert self.message is not None, f"a {self.op} step has no message"
        return self.message


@dataclass
class NodeProgram:
    node: int
    steps: list[Step]
    outputs: dict[str, str]  # model output name → local value (on OUTPUT_NODE only)
    weight_bytes: int = 0


def messages_of(graph: Graph) -> list[Message]:
    """Every transfer of the plan as one message, in a deterministic order."""
    order = {layer.name: k for k, layer in enumerate(graph.layers)}
    producers = graph.producers()
    transfers = sorted(
        graph.transfers(), key=lambda t: (order[producers[t.tensor].name], t.tensor, t.dst, t.src, t.region.starts)
    )
    return [Message(k, t.src, t.dst, t.tensor, t.region, graph.tensors[t.tensor].dtype) for k, t in enumerate(transfers)]


class _Builder:
    """Builds one node's program (see module docstring)."""

    def __init__(self, graph: Graph, node: int, messages: list[Message], registry: RuleRegistry) -> None:
        self.graph, self.node, self.registry = graph, node, registry
        self.meta: dict[str, tuple[str, tuple[int, ...]]] = {}
        self.available: set[str] = set()
        self.alias: dict[str, str] = {}
        self.steps: list[Step] = []
        self.current = Segment()
        self.waited: set[int] = set()
        self.incoming = {(m.tensor, m.region, m.src): m for m in messages if m.dst == node}
        self.outgoing: dict[str, list[Message]] = {}
        for m in messages:
            if m.src == node:
                self.outgoing.setdefault(m.tensor, []).append(m)
        self.opset = graph.opsets.get("", 13)
        self.counter = 0
        for t in graph.inputs:
            name = value_name(t, ShapeMap.full(graph.tensors[t].shape))
            self._declare(name, t, ShapeMap.full(graph.tensors[t].shape))
            self.available.add(name)

    # naming ----------------------------------------------------------------------
    def _declare(self, name: str, tensor: str, region: ShapeMap) -> str:
        self.meta[name] = (self.graph.tensors[tensor].dtype, region.shape)
        return name

    def resolve(self, name: str) -> str:
        while name in self.alias:
            name = self.alias[name]
        return name

    def _fresh(self, base: str) -> str:
        self.counter += 1
        return f"{base}__{self.counter}"

    # emission --------------------------------------------------------------------
    def close(self) -> None:
        if self.current.nodes:
            self.steps.append(Step("run", segment=self.current))
        self.current = Segment()

    def crop(self, tensor: str, src: ShapeMap, dst: ShapeMap) -> str:
        """Value of `dst` cut from the available value of `src` (⊇ dst)."""
        name = self._declare(value_name(tensor, dst), tensor, dst)
        if name in self.available or self.resolve(name) in self.available:
            return self.resolve(name)
        rel = dst.relative_to(src)
        axes = [a for a, (lo, hi, size) in enumerate(zip(rel.starts, rel.stops, src.shape)) if lo != 0 or hi != size]
        source = self.resolve(value_name(tensor, src))
        starts = [rel.starts[a] for a in axes]
        ends = [rel.stops[a] for a in axes]
        if self.opset >= 10:
            init = self.current.initializers
            names = [self._fresh(f"{name}/{k}") for k in ("starts", "ends", "axes")]
            for n, v in zip(names, (starts, ends, axes)):
                init[n] = np.asarray(v, dtype=np.int64)
            node = helper.make_node(CROP_OP, [source, *names], [name], name=self._fresh("crop"))
        else:
            node = helper.make_node(CROP_OP, [source], [name], name=self._fresh("crop"), starts=starts, ends=ends, axes=axes)
        self.current.nodes.append(node)
        self.available.add(name)
        return name

    def gather(self, gather: Gather) -> str:
        """Assemble the gather's region on this node: local crops and received parts."""
        t = gather.tensor
        name = self._declare(value_name(t, gather.region), t, gather.region)
        if self.resolve(name) in self.available:
            return self.resolve(name)
        part_names = []
        for part in gather.parts:
            if part.src == self.node:
                part_names.append(self.crop(t, self._held_region(t), part.region))
            else:
                msg = self.incoming[(t, part.region, part.src)]
                if msg.id not in self.waited:
                    self.close()
                    self.steps.append(Step("wait", message=msg))
                    self.waited.add(msg.id)
                    self._declare(msg.value, t, part.region)
                    self.available.add(msg.value)
                part_names.append(msg.value)
        if len(part_names) == 1:
            if part_names[0] != name:
                self.alias[name] = part_names[0]
            return part_names[0]
        self.current.nodes.append(helper.make_node("Concat", part_names, [name], name=self._fresh("concat"), axis=gather.axis))
        self.available.add(name)
        return name

    def _held_region(self, tensor: str) -> ShapeMap:
        """What this node holds of `tensor` (movement.pieces), which it crops its own parts and sends from."""
        held = pieces(self.graph, tensor)
        return ShapeMap.full(self.graph.tensors[tensor].shape) if held is None else dict(held)[self.node]

    def constant(self, tensor: str, need: ShapeMap) -> str:
        value = self.graph.constants[tensor]
        if (weight := self.graph.dequantized.get(tensor)) is not None:  # a quantized model's integer weight and its node
            name = tensor if need == ShapeMap.full(value.shape) else value_name(tensor, need)
            return self.attach(weight.node, self.constant(weight.source, need), need, name)
        if need == ShapeMap.full(value.shape):
            self.current.initializers[tensor] = value
            self.current.weights.add(tensor)
            return tensor
        name = value_name(tensor, need)
        self.current.initializers[name] = np.asarray(value[need.slices()], order="C")  # keeps a rank-0 value rank 0
        self.current.weights.add(name)
        return name

    def attach(self, op: Attached, value: str, region: ShapeMap, out: str = "") -> str:
        """Emit `op` on `value`, the `region` of its tensor, into `out` (default: a fresh name);
        a per-channel operand is cut to the region's channels."""
        operands = []
        for t in op.operands:
            whole = ShapeMap.full(self.graph.constants[t].shape) if t else None
            if whole is None or op.axis is None or whole.rank != 1:
                operands.append(self.constant(t, whole) if whole is not None else "")
            else:
                iv = region.interval(op.axis)
                operands.append(self.constant(t, ShapeMap.box([iv.start], [iv.stop])))
        out = out or self._fresh(f"{value}/{op.op_type}")
        self.current.nodes.append(helper.make_node(op.op_type, [value, *operands], [out], name=self._fresh(op.op_type),
                                                   domain=op.domain or None, **op.attrs))
        return out

    def _local_constant(self, layer: Layer, k: int, value: np.ndarray) -> str:
        """An initializer holding this node's own value of the layer's input k (`Local.inputs`)."""
        name = self._fresh(f"{layer.name}/input{k}")
        self.current.initializers[name] = np.asarray(value)
        return name

    def bind_captured(self, tensor: str, need: ShapeMap | None) -> None:
        """Make `tensor`, which a subgraph of the next node reads from the outer scope, a
        value of the current segment under its original name (an initializer, or an
        Identity of its local value): the subgraph's references stay as they are."""
        if tensor in self.graph.constants:
            self.current.initializers[tensor] = self.graph.constants[tensor]
            self.current.weights.add(tensor)
            return
        region = ShapeMap.full(self.graph.tensors[tensor].shape)
        gather = self.graph.gathers[(tensor, self.node)]
        self.gather(gather)
        local = self.crop(tensor, gather.region, need or region)
        if any(tensor in node.output for node in self.current.nodes):
            return  # an earlier node of this segment already bound it
        self._declare(tensor, tensor, region)
        self.current.nodes.append(helper.make_node("Identity", [local], [tensor], name=self._fresh(f"capture/{tensor}")))

    def layer(self, layer: Layer, live: set[str]) -> None:
        graph, n = self.graph, self.node
        part = graph.partitions[layer.name]
        if not part.out[n].empty:
            # gather (and so wait for) every activation first: a wait closes the segment, which
            # must not separate the op from the weights bound to it before the wait
            for t, need in zip(layer.inputs, part.needs[n]):
                if t and need is not None and t not in graph.constants:
                    self.gather(graph.gathers[(t, n)])
            inputs: list[str] = []
            n_explicit = len(layer.explicit_inputs)
            rule = self.registry.get(layer)
            windowed = rule is not None and rule.windowed
            replaced = part.local_inputs(n)
            dequantize = dict(layer.fused.inputs) if layer.fused is not None else {}
            for k, (t, need) in enumerate(zip(layer.inputs, part.needs[n])):
                if k >= n_explicit:
                    self.bind_captured(t, need)
                elif k in replaced:  # a constant input with the node's own value (Slice's starts)
                    inputs.append(self._local_constant(layer, k, replaced[k]))
                elif not t:
                    inputs.append("")
                elif need is None:
                    continue  # dropped from the local op (e.g. Concat inputs outside the region)
                elif t in graph.constants:
                    inputs.append(self.constant(t, need))
                else:
                    g = graph.gathers[(t, n)]
                    self.gather(g)
                    if windowed and t == layer.inputs[0]:
                        need = _window_slack(graph, layer, part.attrs[n], g.region, need)
                    inputs.append(self.crop(t, g.region, need))
                if k in dequantize and need is not None and inputs[-1]:  # the quantized model's DequantizeLinear
                    inputs[-1] = self.attach(dequantize[k], inputs[-1], need)
            for k in sorted(i for i in replaced if i >= len(layer.inputs)):  # optional inputs the layer omits
                inputs.extend([""] * (k - len(inputs)))
                inputs.append(self._local_constant(layer, k, replaced[k]))
            computes, emitted = part.computes[n], part.emitted(n)
            outputs = []
            for k, t in enumerate(layer.outputs):
                region = emitted if k == 0 else ShapeMap.full(graph.tensors[t].shape) if t else None
                if region is None or t not in live or (k > 0 and part.axis is not None):
                    outputs.append("")
                else:
                    outputs.append(self._declare(value_name(t, region), t, region))
            for k, t in enumerate(layer.outputs):  # an unread output the op must still have: named, read by nothing
                if t and not outputs[k] and output_required(layer, k, self.graph.opsets):
                    outputs[k] = f"{t}/unread{len(self.current.nodes)}"
            while outputs and not outputs[-1]:
                outputs.pop()
            if not outputs:
                pass  # nothing reads what this layer computes here
            elif layer.fused is None and self.registry.traits(layer.op_type, layer.domain).alias and len(outputs) == 1:
                if outputs[0] != inputs[0]:
                    self.alias[outputs[0]] = inputs[0]
            else:
                attrs = dict(layer.attrs)
                attrs.update(part.attrs[n])
                after = layer.fused.outputs if layer.fused is not None and outputs[0] else ()
                result = outputs[0]
                if after:  # the op writes a float value its Relu/Clip and QuantizeLinear end in the layer's output
                    outputs[0] = self._fresh(f"{layer.name}/float")
                node = helper.make_node(layer.op_type, inputs, outputs, name=layer.name, domain=layer.domain or None, **attrs)
                self.current.nodes.append(node)
                value = outputs[0]
                for j, op in enumerate(after):
                    value = self.attach(op, value, emitted, result if j == len(after) - 1 else "")
                outputs[0] = result
                self.available.update(o for o in outputs if o)
                if outputs[0] and emitted != computes:  # drop the rows the local op clamped (rules/base.py Local.emits)
                    self.crop(layer.outputs[0], emitted, computes)
        sends = [m for t in layer.outputs if t for m in self.outgoing.get(t, [])]
        if sends:
            for m in sends:
                self.crop(m.tensor, self._held_region(m.tensor), m.region)
            self.close()
            self.steps.extend(Step("send", message=m) for m in sends)

    def finish(self) -> dict[str, str]:
        outputs = {}
        if self.node == OUTPUT_NODE:
            for t in self.graph.outputs:
                outputs[t] = self.gather(self.graph.gathers[(t, self.node)])
        self.close()
        return outputs


def _window_slack(graph: Graph, layer: Layer, local_attrs: Mapping[str, Any], have: ShapeMap, need: ShapeMap) -> ShapeMap:
    """What a windowed op can read of `have` (⊇ `need`) and still compute exactly what it
    computes from `need`: `need` grown to the end of `have` along a spatial axis where the
    extra rows start no further window (fewer than the stride) and replace no padding (the
    local op pads nothing at that end). A stride-2 layer's input then needs no crop of the
    row that only its neighbour's windows read (resnet50's downsampling convolutions). The
    layer's rule must be `windowed`."""
    if not (have.is_box and need.is_box):
        return need
    kernel = kernel_of(graph, layer)
    window = Window.of(layer, need.shape, kernel)
    window = replace(window, pads=tuple(int(v) for v in local_attrs.get("pads", window.pads)))
    k = len(kernel)
    for a in range(k):
        axis = 2 + a
        grown = replace(window, in_sizes=window.in_sizes[:a] + (have.interval(axis).stop - need.interval(axis).start,) + window.in_sizes[a + 1:])
        if window.pads[k + a] == 0 and grown.out_size(a) == window.out_size(a):
            need = need.with_axis(axis, Interval(need.interval(axis).start, have.interval(axis).stop))
            window = grown
    return need


def _liveness(steps: list[Step], final: set[str], resolve: Any, captured: Mapping[str, tuple[str, ...]]) -> list[Step]:
    """Give each segment its inputs/outputs and drop nodes (and segments) nobody reads.
    `captured`: node name → the outer names its subgraphs read (Layer.captured)."""
    needed = set(final)
    kept: list[Step] = []
    for step in reversed(steps):
        if step.op == "send":
            step.value = resolve(step.msg.value)
            needed.add(step.value)
        elif step.op == "wait":
            needed.discard(step.msg.value)
        else:
            seg = step.seg
            want: set[str] = set()  # what the segment's later nodes read, beside `needed`
            nodes = []
            for node in reversed(seg.nodes):
                node.input[:] = [resolve(i) if i else i for i in node.input]
                if any(o in needed or o in want for o in node.output if o):
                    nodes.append(node)
                    want.update(i for i in node.input if i)
                    want.update(captured.get(node.name, ()))
            nodes.reverse()
            if not nodes:
                continue
            produced = {o for node in nodes for o in node.output if o}
            consumed = [i for node in nodes for i in [*node.input, *captured.get(node.name, ())] if i]
            read = set(consumed)
            seg.nodes = nodes
            seg.initializers = {k: v for k, v in seg.initializers.items() if k in read}
            seg.inputs = list(dict.fromkeys(i for i in consumed if i not in produced and i not in seg.initializers))
            seg.outputs = sorted(produced & needed)
            needed -= produced
            needed.update(seg.inputs)
        kept.append(step)
    kept.reverse()
    return kept


def _merge_copy_segments(steps: list[Step], registry: RuleRegistry) -> list[Step]:
    """Fold a segment that only moves data (crops, concats, reshapes) into the segment before it
    when only sends stand between them: one onnxruntime run less, and the sends wait only for
    copies. (Folding it into the next segment instead would delay that segment's sends.)"""
    merged: list[Step] = []
    last_run: Step | None = None
    for step in steps:
        if step.op == "wait":
            last_run = None
        elif step.op == "run":
            seg = step.seg
            if last_run is not None and all(_moves_data(node, registry) for node in seg.nodes):
                into = last_run.seg
                into.nodes += seg.nodes
                into.initializers.update(seg.initializers)
                into.weights |= seg.weights
                continue
            last_run = step
        merged.append(step)
    return merged


def _moves_data(node: onnx.NodeProto, registry: RuleRegistry) -> bool:
    return node.op_type == CROP_OP or registry.traits(node.op_type, node.domain).moves_data


SELECT_MAX_TAPS = 4


def _crops_as_convolutions(seg: Segment, meta: dict[str, tuple[str, tuple[int, ...]]], registry: RuleRegistry) -> None:
    """Rewrite a crop of rows/columns between two convolution-like ops of one segment as a
    depthwise convolution with one tap set to 1 (a "select" kernel).

    onnxruntime runs convolutions in a blocked channel layout (NCHWc) and converts to plain
    NCHW around any op it cannot run that way: a Slice between two convolutions costs two
    layout conversions, and an Add after it no longer fuses into the convolution before it.
    Halo recomputation makes such crops common (a residual of 30 rows added to a branch of
    29). The select kernel stays in NCHWc: resnet50 on 2 ranks, side by side, 43.1 -> 42.6 ms.
    Every output is 1·x plus zeros, so finite values come through unchanged (a NaN or an
    infinity in a dropped row would spread NaN instead of being dropped). Only small crops
    (at most SELECT_MAX_TAPS taps) of 4-D float32 values are rewritten, where the producer and
    every consumer inside the segment are NCHWc ops and the crop does not leave the segment."""
    producers, consumers = seg.producers(), seg.readers()
    for k, node in enumerate(seg.nodes):
        if node.op_type != CROP_OP or len(node.input) != 4 or node.output[0] in seg.outputs:  # no `steps`
            continue
        source, out = node.input[0], node.output[0]
        producer = producers.get(source)
        if source not in meta:  # a value inside a layer's own nodes (a quantized model's DequantizeLinear before a Slice)
            continue
        dtype, shape = meta[source]
        if producer is None or not registry.traits(producer.op_type, producer.domain).layout.produces_blocked \
                or dtype != "float32" or len(shape) != 4:
            continue
        if not all(registry.traits(c.op_type, c.domain).layout.reads_blocked for c in consumers.get(out, [])):
            continue
        starts, ends, axes = (seg.initializers.get(i) for i in node.input[1:4])
        if starts is None or ends is None or axes is None or not set(axes.tolist()) <= {2, 3} or (starts < 0).any():
            continue  # (a model's own Slice, computed whole, may count its starts from the end)
        kernel, tap = [1, 1], [0, 0]
        for a, lo in zip(axes.tolist(), starts.tolist()):
            kernel[a - 2] = shape[a] - meta[out][1][a] + 1
            tap[a - 2] = lo
        if kernel[0] * kernel[1] > SELECT_MAX_TAPS:
            continue
        weight = np.zeros((shape[1], 1, *kernel), dtype=np.float32)
        weight[:, :, tap[0], tap[1]] = 1.0
        seg.initializers[f"{out}/select"] = weight
        for i in node.input[1:4]:
            del seg.initializers[i]
        seg.nodes[k] = helper.make_node("Conv", [source, f"{out}/select"], [out], name=node.name, kernel_shape=kernel, group=shape[1])


def segment_model(graph: Graph, seg: Segment, meta: Mapping[str, tuple[str, tuple[int, ...]]], name: str,
                  initializer: Callable[[str, np.ndarray], onnx.TensorProto] | None = None) -> onnx.ModelProto:
    """The segment as an ONNX model (`meta`: dtype and shape of its inputs and outputs).
    `initializer` makes each initializer from its name and value (default: numpy_helper.from_array).
    Emit's moves the large weights into the plan's weights file as it makes them, so that the
    model never holds their bytes: the graph takes a deep copy of every initializer, and an h/w
    plan on N nodes has N segments with every weight."""
    def vi(v: str) -> onnx.ValueInfoProto:
        dtype, shape = meta[v]
        return helper.make_tensor_value_info(v, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), list(shape))

    make = initializer or (lambda k, v: numpy_helper.from_array(v, k))
    initializers = [make(k, np.asarray(v)) for k, v in seg.initializers.items()]
    g = helper.make_graph(seg.nodes, name, [vi(i) for i in seg.inputs], [vi(o) for o in seg.outputs], initializer=initializers)
    opsets = [helper.make_opsetid(d, v) for d, v in graph.opsets.items()]
    model = helper.make_model(g, opset_imports=opsets, producer_name="bbgrap")
    model.ir_version = min(onnx.IR_VERSION, max(7, helper.find_min_ir_version_for(opsets, ignore_unknown=True)))
    return model


def lower(graph: Graph, registry: RuleRegistry | None = None) -> tuple[list[NodeProgram], list[Message]]:
    """One program per node, and the messages between them. A segment's ONNX model is built only
    when the plan is emitted (`segment_model`, from its name and types set here): compile --profile
    lowers plans for several node counts and emits one."""
    registry = registry or default_registry()
    messages = messages_of(graph)
    live = set(graph.outputs) | {t for layer in graph.layers for t in layer.inputs if t}
    programs = []
    for n in range(graph.nodes):
        b = _Builder(graph, n, messages, registry)
        for layer in graph.layers:
            b.layer(layer, live)
        outputs = {t: b.resolve(v) for t, v in b.finish().items()}
        captured = {layer.name: layer.captured for layer in graph.layers if layer.captured}
        steps = _liveness(b.steps, set(outputs.values()), b.resolve, captured)
        steps = _liveness(_merge_copy_segments(steps, registry), set(outputs.values()), b.resolve, captured)
        weight_bytes = 0
        k = 0
        for step in steps:
            if step.op == "run":
                seg = step.seg
                _crops_as_convolutions(seg, b.meta, registry)
                seg.name = f"{graph.name}_node{n}_seg{k}"
                seg.types = {v: b.meta[v] for v in seg.inputs + seg.outputs}
                weight_bytes += sum(np.asarray(v).nbytes for name, v in seg.initializers.items() if name in seg.weights)
                k += 1
        programs.append(NodeProgram(n, steps, outputs, weight_bytes))
    return programs, messages
