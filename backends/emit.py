"""Lowered programs → the plan's manifest (a typed Plan) and files, with the per-node accounting.

The segments' large weights go to one shared file (`weights.bin`, ONNX external data), one
copy of each whatever the number of nodes and segments that use it: an h/w plan on N nodes,
where every node holds every weight, takes about the model's size on disk instead of N times
it, and ranks on one host share the file's pages.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx
from bbgrap.backends.lower import Message, NodeProgram, Step, segment_model, value_name
from onnx import numpy_helper

from bbgrap.cost import plan_flops
from bbgrap.ir import Graph, ShapeMap
from bbgrap.plan_schema import (
    CompileRecord,
    InputSpec,
    MessageSpec,
    NodeStats,
    OpaqueLayer,
    Plan,
    Program,
    RunStep,
    SegmentSpec,
    SendStep,
    Stats,
    TensorSpec,
    WaitStep,
)
from bbgrap.rules.registry import RuleRegistry

WEIGHTS_FILE = "weights.bin"
EXTERNAL_MIN_BYTES = 1024  # smaller initializers (shapes, crop bounds, small biases) stay in their segment
PAGE = 4096  # a large weight starts on a page, so that onnxruntime can map it from the file instead of copying it


class SharedWeights:
    """The plan's weights file being built: every large initializer of every segment, once."""

    def __init__(self) -> None:
        self.data = bytearray()
        self._offsets: dict[str, list[int]] = {}  # initializer name -> where values of that name are
        # initializer name -> the arrays made into external initializers of that name, and what they were made into
        self._made: dict[str, list[tuple[np.ndarray, onnx.TensorProto]]] = {}

    def initializer(self, name: str, value: np.ndarray) -> onnx.TensorProto:
        """`value` as the initializer `name`, its data in the file where it is large. An array made
        before under that name (the very object: every node's segments share the model's whole
        weights) gives what it gave then, without converting, copying and comparing its bytes again;
        the arrays are the compile's constants, which nothing changes while the plan is emitted."""
        for array, made in self._made.get(name, []):
            if array is value:
                return made
        tensor = numpy_helper.from_array(value, name)
        if self._externalize(tensor):
            self._made.setdefault(name, []).append((value, tensor))
        return tensor

    def _externalize(self, init: onnx.TensorProto) -> bool:
        """Move the initializer's data (in place) into the file where it is large, pointing it there;
        whether it did."""
        raw = init.raw_data  # a copy out of the proto each time it is read: read once
        if len(raw) < EXTERNAL_MIN_BYTES:
            return False
        offset = self._place(init.name, raw)
        init.ClearField("raw_data")
        init.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", WEIGHTS_FILE), ("offset", str(offset)), ("length", str(len(raw)))):
            entry = init.external_data.add()
            entry.key, entry.value = key, value
        return True

    def _place(self, name: str, raw: bytes) -> int:
        """Where `raw` is in the file: a value's name carries its tensor and region, so the same
        name on another node is almost always the same bytes (compared, not assumed)."""
        for offset in self._offsets.get(name, []):
            # startswith compares with memcmp; comparing memoryviews goes byte by byte (~50x slower),
            # and an h/w plan on N nodes compares about N times the model's weights here
            if self.data.startswith(raw, offset):
                return offset
        self.data.extend(bytes(-len(self.data) % PAGE))
        offset = len(self.data)
        self.data.extend(raw)
        self._offsets.setdefault(name, []).append(offset)
        return offset


def plan_stats(graph: Graph, programs: list[NodeProgram], messages: list[Message], registry: RuleRegistry | None = None) -> Stats:
    sent = [0] * graph.nodes
    received = [0] * graph.nodes
    for m in messages:
        sent[m.src] += m.nbytes
        received[m.dst] += m.nbytes
    flops = plan_flops(graph, registry=registry)
    owned = plan_flops(graph, owned=True, registry=registry)
    producers = graph.producers()
    # a synchronisation point: a layer whose output crosses from one node to another
    sync_points = len({producers[m.tensor].name for m in messages})
    return Stats(
        bytes_transferred=sum(sent),
        messages=len(messages),
        sync_points=sync_points,
        segments=sum(1 for p in programs for s in p.steps if s.op == "run"),
        per_node=tuple(
            NodeStats(flops=flops[n], redundant_flops=flops[n] - owned[n], bytes_sent=sent[n], bytes_received=received[n],
                      weight_bytes=programs[n].weight_bytes)
            for n in range(graph.nodes)
        ),
    )


def message_spec(m: Message) -> MessageSpec:
    """A lowered message as the manifest's (its region as [start, stop) per axis)."""
    return MessageSpec(m.id, m.src, m.dst, m.tensor, tuple(zip(m.region.starts, m.region.stops)), tuple(m.region.shape), m.dtype, m.value)


def emit(graph: Graph, programs: list[NodeProgram], messages: list[Message], compiled: CompileRecord,
         registry: RuleRegistry | None = None) -> tuple[Plan, dict[str, bytes]]:
    """The plan (its identity left to bbgrap.plan.write_plan) and the segment files, keyed by path in the plan."""
    files: dict[str, bytes] = {}
    weights = SharedWeights()
    typed = []
    for prog in programs:
        segments: list[SegmentSpec] = []
        steps: list[RunStep | SendStep | WaitStep] = []
        for step in prog.steps:
            steps.append(_step(graph, step, prog.node, segments, files, weights))
        typed.append(Program(prog.node, tuple(segments), tuple(steps), dict(prog.outputs)))
    if weights.data:
        files[WEIGHTS_FILE] = bytes(weights.data)
    tensor = graph.tensors
    plan = Plan(
        model=graph.name,
        nodes=graph.nodes,
        movement=graph.movement,
        layers=len(graph.layers),
        opaque=tuple(OpaqueLayer(la.name, la.op_type) for la in graph.layers if la.group == "opaque"),
        inputs=tuple(InputSpec(t, tuple(tensor[t].shape), tensor[t].dtype, value_name(t, ShapeMap.full(tensor[t].shape)))
                     for t in graph.inputs),
        outputs=tuple(TensorSpec(t, tuple(tensor[t].shape), tensor[t].dtype) for t in graph.outputs),
        messages=tuple(message_spec(m) for m in messages),
        programs=tuple(typed),
        stats=plan_stats(graph, programs, messages, registry),
        compiled=compiled,
        weights=WEIGHTS_FILE if weights.data else None,
    )
    return plan, files


QUANTIZING = ("QuantizeLinear", "DynamicQuantizeLinear", "ConvInteger", "MatMulInteger", "MatMulIntegerToFloat",
              "DynamicQuantizeMatMul", "QGemm")  # with every QLinear* op: integer results, rounded as the kernels do


def quantizing(op_type: str) -> bool:
    """Whether an op's result is rounded to integers (a quantized model's), where onnxruntime's
    CPU kernels and its CUDA provider round differently."""
    return op_type in QUANTIZING or op_type.startswith("QLinear")


def cpu_only(nodes: Iterable[onnx.NodeProto]) -> str:
    """Why only onnxruntime's CPU provider computes a segment of these ops exactly, or "".
    * A Resize in tf_crop_and_resize mode (how rules/indexing.py's ResizeRule lowers a piece of a
      Resize whose output rows do not map to whole input blocks; or the model's own) is computed
      exactly by the CPU provider and wrongly by onnxruntime-gpu's CUDA Resize (docs/benchmarks.md,
      session 23; benchmarks/provider_check.py compares a plan's segments on both).
    * An op that quantizes (`quantizing`): the plan's reference is the CPU's, whose integer kernels
      (QLinearConv, or a Conv between DequantizeLinear and QuantizeLinear fused into one) a plan on
      the CPU matches to the bit; the CUDA provider computes such a Conv in float and rounds it on
      its own, a quantization step off the reference here and there (0.6 % of the output's range
      on an H200, docs/benchmarks.md, session 49)."""
    for op in nodes:
        if op.op_type == "Resize" and any(a.name == "coordinate_transformation_mode" and a.s == b"tf_crop_and_resize"
                                          for a in op.attribute):
            return f"computes {op.name or 'a Resize'} as a tf_crop_and_resize, which onnxruntime's CUDA provider computes wrong"
        if quantizing(op.op_type):
            return (f"quantizes ({op.op_type} {op.name or ''}), which onnxruntime's CUDA provider rounds otherwise than the CPU's "
                    "integer kernels that computed the reference").replace(" )", ")")
    return ""


def _step(graph: Graph, step: Step, node: int, segments: list[SegmentSpec], files: dict[str, bytes],
          weights: SharedWeights) -> RunStep | SendStep | WaitStep:
    """One lowered step as the manifest's; a run step's segment is built as an ONNX model, its large
    weights put in `weights` as each initializer is made, serialised into `files` and listed in
    `segments`."""
    if step.op == "run":
        path = f"node{node}/seg{len(segments):03d}.onnx"
        seg = step.seg
        model = segment_model(graph, seg, seg.types, seg.name, weights.initializer)
        files[path] = model.SerializeToString()
        segments.append(SegmentSpec(path, tuple(step.seg.inputs), tuple(step.seg.outputs), cpu_only(model.graph.node)))
        return RunStep(len(segments) - 1)
    if step.op == "send":
        return SendStep(step.msg.id, step.value)
    return WaitStep(step.msg.id)
