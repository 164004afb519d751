"""Predicted time of a plan: each rank's program played against a cluster profile.

A rank walks its program (backends/lower.py: run a segment, send a message, wait for one)
on its own clock:

* **run**: the segment's operations per kind of op divided by the node's throughput for
  that kind (an "other" op of a type the node timed apart at that type's speed; a depthwise
  convolution's values, the more of those it reads and writes, at its `depthwise_elements_per_s` too; a convolution's or matmul's weights streamed at the node's `weight_Bps` where that
  takes longer; of a copy larger than the node's cache the values beyond it at its `stream_ops_per_s`), plus a fixed
  cost per ONNX op of that kind, `segment_s` for the segment (an onnxruntime run through the
  executor) and `value_s` for each value it takes or gives (a feed or a fetch); and where the
  node runs other segments too, `cold_segment_s` and `cold_s` for each of its ops and values
  (its session's state no longer in the core's cache when its turn comes);
* **send**: costs the sender `send_s` + bytes x `send_byte_s` (bbgrap-run posts sends without
  blocking; posting one, and MPI's progress on it, takes that much of the sender's time, counted
  in its compute); the message leaves then and arrives `latency_s + bytes / bandwidth_Bps` after
  the link from sender to receiver is free (messages on one link go one after another);
* **wait**: the rank takes the message (`NodeProfile.taken`): `recv_s` + bytes x `recv_byte_s`
  from the wait's start (the MPI test that completes it; on one host the copy MPI makes only
  when the receiver asks), and no sooner than `recv_s` after its arrival; then `wait_share` of the
  segment the rank ran before the wait more (the ranks' jitter: the later of two varying ends comes
  after both means); bbgrap-run counts it all as waiting, and so does the prediction.

The operations of a layer's op are bbgrap/cost.py's `run_ops` for the region the node computes
(a recomputed halo included; a convolution's piece of channels rounded up to whole blocks); a
crop, a concat or another op lowering added costs one "other" operation per element it writes;
an "other" op writing more values than the core's cache holds writes those beyond it at `stream_ops_per_s`
(`NodeProfile.element_time`); an op onnxruntime fuses into the convolution before it costs one
"other" operation per value it writes on the convolution's account (a BatchNormalization, folded
into the weights, nothing; a matmul takes only a constant bias or an activation, as its Gemm);
the elementwise ops of an activation written as several (x·sigmoid(x), erf's GELU) cost their
operations, and only the last of them an op's fixed cost and a pass over the values
(`chained_layers`); each reorder between onnxruntime's blocked layout and NCHW inside a segment
(around an op it does not run blocked, `layout_reorders`), and each transpose of a quantized model's values
to or from its channels-last integer convolutions (`quantized_layouts`), costs a copy of its values; every value a segment
takes or gives costs one "other" operation per element (handed from one onnxruntime session to
the next: copied, reordered in the blocked layout). The plan's predicted latency is the latest
rank's end. Every rank starts at 0 (bbgrap-run starts an inference on all ranks after a barrier).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from bbgrap.cluster import EIGHT_BIT_NCHW, IN_NCHW, OP_KINDS, ClusterProfile, NodeProfile
from bbgrap.cost import bytes_read, ops_and_reads, run_ops, weight_bytes, weight_share
from bbgrap.ir import BBGrapError, Graph, Layer, LayerPartition, ShapeMap
from bbgrap.rules.base import MS_DOMAIN, NCHWC_BLOCK, Layout, OpTraits, integer_kernel, is_default_domain
from bbgrap.rules.conv import direct_integer, direct_outputs, integer_conv
from bbgrap.rules.registry import RuleRegistry, default_registry
from bbgrap.rules.window import WEIGHTS

if TYPE_CHECKING:  # the simulator itself needs neither onnx nor the backend
    import onnx

    from bbgrap.backends.lower import NodeProgram, Segment


@dataclass(frozen=True)
class LayerWork:
    """One layer's share of a segment: its kind (OP_KINDS), its operations here and for its whole
    output, the share of its weights it reads here and their bytes (all of them), the values it
    moves here (`values_moved`: its output's; for an "other" op the mean of those it reads and
    writes), and those the ops fused into it write (`NodeProfile.layer_time`); for a Concat the values
    its piece joins (`joined`: each costs `NodeProfile.concat_input_s`)."""

    name: str
    kind: str
    ops: float
    whole_ops: float
    weight_share: float = 1.0
    weight_bytes: float = 0.0
    elements: float = 0.0
    fused_values: float = 0.0  # values of the ops onnxruntime fuses into it that take a pass over its output (`OpTraits.fuses_into_conv`, `in_kernel`)
    chained: bool = False  # computed in the kernel of the op after it (`chained_layers`): no fixed cost, its values not written out
    op_type: str = ""  # its ONNX op: an "other" op a node timed apart runs at that speed (`NodeProfile.op_rate`)
    reorders: tuple[float, ...] = ()  # values of each layout reorder onnxruntime adds for it (`layout_reorders`)
    reads: float = 0.0  # bytes it reads beyond its kind's throughput (`cost.priced_reads`) ...
    read_ops: float = 0.0  # ... and the operations of `ops` they are priced as (`NodeProfile.layer_time`)
    joined: int = 0  # values a Concat's piece joins (`concat_joins`)
    units: int = 0  # work units its kernel deals among the node's threads (`conv_work_units`; 0: not known) ...
    whole_units: int = 0  # ... and the whole layer's


@dataclass(frozen=True)
class Copy:
    """An op of a segment that is no layer's (`SegmentWork.copies`): the values it writes, and its
    ONNX op type where the node may have timed it apart (a quantized model's DequantizeLinear or
    QuantizeLinear around a layer run in float: `NodeProfile.copy_s`); "" for a layout reorder; and
    the values it joins where it is a Concat (`NodeProfile.concat_input_s` each)."""

    values: float
    op_type: str = ""
    joined: int = 0


@dataclass(frozen=True)
class SegmentWork:
    """What one segment computes: its layers, each priced on its own by `NodeProfile.layer_time`
    (measured, or by its roofline; `ops` and `count` sum them per kind of op); the values each copy
    it makes writes (`copies`: an op of lowering's, a crop or a concat, or a layout reorder no layer
    causes; each priced as `NodeProfile.copy_s`); the size of each value it takes or gives
    (`handed`: copied from one onnxruntime session to the next); whether other segments run on its
    node between two of its runs (`after_others`: priced by `NodeProfile.cold_segment_s` and `cold_s`);
    and the bytes its node touches in one inference (`working_set`: the share of them the node's cache
    keeps, `NodeProfile.kept`, its convolutions read their filters from there, at no cost beyond their operations)."""

    layers: tuple[LayerWork, ...] = ()
    copies: tuple[Copy, ...] = ()
    handed: tuple[float, ...] = ()
    after_others: bool = False
    working_set: float = 0.0

    @property
    def ops(self) -> dict[str, float]:
        """Its layers' operations per kind of op (OP_KINDS)."""
        got = dict.fromkeys(OP_KINDS, 0.0)
        for w in self.layers:
            got[w.kind] += w.ops
        return got

    @property
    def count(self) -> dict[str, int]:
        """How many of its layers' ONNX ops are of each kind (OP_KINDS): those fused into another's kernel are not layers here."""
        got = dict.fromkeys(OP_KINDS, 0)
        for w in self.layers:
            got[w.kind] += 1
        return got

    @property
    def values(self) -> int:
        """How many values the segment takes and gives."""
        return len(self.handed)

    @property
    def op_count(self) -> int:
        """How many ONNX ops the segment runs: its layers and its copies."""
        return len(self.layers) + len(self.copies)


@dataclass(frozen=True)
class RankTime:
    """One rank's predicted time per inference (s): in its segments, waiting for messages, and its end;
    and each of its segments' (in program order). Under a CPU quota a segment's time is its threads'
    over the quota's share, and the end comes before their sum where waits took the place of stops
    (`simulate`)."""

    compute: float
    wait: float
    total: float
    segments: tuple[float, ...] = ()


@dataclass(frozen=True)
class Prediction:
    nodes: int
    ranks: tuple[RankTime, ...]

    @property
    def latency(self) -> float:
        """The plan's predicted latency: the last rank's end."""
        return max(r.total for r in self.ranks)

    def as_ms(self) -> dict[str, object]:
        """JSON-ready: the latency and every rank's compute / wait / total, in ms."""
        return {"nodes": self.nodes, "latency_ms": round(self.latency * 1e3, 4),
                "ranks": [{k: round(getattr(r, k) * 1e3, 4) for k in ("compute", "wait", "total")} for r in self.ranks]}


CONVOLUTIONS = ("conv", "depthwise", "grouped", "pointwise_nchw")  # the kinds onnxruntime fuses a following activation or Add into
FUSING = (*CONVOLUTIONS, "matmul")  # ... and those it fuses one into at all: a Gemm only a bias or an activation
# the kinds onnxruntime's CPU provider runs in its blocked kernels, which apply a fused ReLU or Add
# as they write each output value (`OpTraits.in_kernel`): at no cost beside the convolution's
BLOCKED_KERNELS = ("conv", "depthwise", "pointwise_nchw")
FEW_PER_GROUP = 8  # input channels per group up to which a grouped convolution is priced as "grouped", not a dense one
FILTER_SET = 4 * NCHWC_BLOCK  # output channels MLAS's blocked convolution kernel computes in one pass over an output row


def blocked_units(batch: int, groups: int, per_group: int, rows: int) -> int:
    """The work units onnxruntime's MLAS deals a blocked convolution out in among a node's threads
    (MlasNchwcConv: batch x groups x filter sets of FILTER_SET output channels x output rows, split
    as evenly as whole units go, `cluster.thread_stretch`), for `per_group` output channels a group."""
    return batch * groups * math.ceil(per_group / FILTER_SET) * rows


def conv_work_units(layer: Layer, graph: Graph, kind: str, region: ShapeMap) -> int:
    """`blocked_units` of the piece `region` of a float 2-D convolution (of kind "conv" or
    "pointwise_nchw", the NCHW-input kernel's, which deals its rows alike) that onnxruntime runs in
    its blocked layout: output channels, and for a grouped one input channels too, whole NCHWc blocks
    a group. 0 (not known) for any other piece: a depthwise convolution's and a pool's units (channel
    blocks x rows) are not what their times on two threads show (docs/benchmarks.md, session 48), and
    a GEMM's threads follow its size."""
    if kind not in ("conv", "pointwise_nchw") or layer.op_type != "Conv" or region.rank != 4 or region.empty:
        return 0
    groups = int(layer.attrs.get("group", 1))
    shape = graph.tensors[layer.inputs[1]].shape
    per_group = shape[0] // groups
    if per_group % NCHWC_BLOCK or (groups > 1 and shape[1] % NCHWC_BLOCK):
        return 0
    batch, channels, rows, _ = region.bounding_box().shape
    return blocked_units(batch, max(1, channels // per_group), min(channels, per_group), rows)


# the QOperator ops onnxruntime runs in an integer kernel of a dense convolution or matmul, each
# with the float op it stands for (a convolution's weights: rules.window.WEIGHTS)
INTEGER_OPS: dict[tuple[str, str], str] = {
    ("QLinearConv", ""): "Conv", ("ConvInteger", ""): "Conv",
    ("QLinearMatMul", ""): "MatMul", ("MatMulInteger", ""): "MatMul", ("QGemm", MS_DOMAIN): "Gemm"}


def op_kind(layer: Layer, graph: Graph) -> str:
    """Which of OP_KINDS the layer's op is, for its throughput. A convolution of one input channel
    per group is "depthwise"; one of a few more (at most FEW_PER_GROUP, regnet_y's 8) is "grouped":
    onnxruntime runs it on neither the depthwise kernel nor the dense one, several times slower per
    operation than both (docs/benchmarks.md, sessions 13 and 26). A dense convolution, a depthwise
    one or a matmul onnxruntime runs in an 8-bit integer kernel (`integer_kernel`, a QLinearConv) is
    "qconv", "qdepthwise" or "qmatmul"; a dense or grouped one its direct kernel does not take
    (`rules.conv.direct_integer`: a stem's three input channels; any ConvInteger) runs as im2col
    and an integer GEMM, "qconv_gemm", several times slower per operation (docs/benchmarks.md, session 40).
    A dense float 1x1 convolution of fewer input channels than an NCHWc block (NCHWC_BLOCK) is
    "pointwise_nchw": onnxruntime runs it on its kernel that takes the input in NCHW, at a third or
    less of the blocked kernel's operations per second (docs/benchmarks.md, session 46); one of a
    larger kernel on that kernel (a stem's) runs near the blocked one's speed and stays "conv"."""
    domain = "" if is_default_domain(layer.domain) else layer.domain
    integer = INTEGER_OPS.get((layer.op_type, domain))
    float_op = integer if integer is not None else layer.op_type if not domain else ""
    if float_op in ("Conv", "ConvTranspose"):
        group = int(layer.attrs.get("group", 1))
        shape = graph.tensors[layer.inputs[WEIGHTS.get(layer.op_type, 1)]].shape
        per_group = shape[1] if layer.op_type != "ConvTranspose" else shape[0] // max(group, 1)
        if group > 1 and per_group == 1:
            # (a ConvInteger's groups run through im2col as the float ones do)
            return "qdepthwise" if integer_conv(layer, graph) else "depthwise"
        if group > 1 and per_group <= FEW_PER_GROUP:
            return "grouped"
        if integer is None and not integer_kernel(layer, graph):
            pointwise = layer.op_type == "Conv" and all(k == 1 for k in shape[2:])
            return "pointwise_nchw" if pointwise and group == 1 and per_group < NCHWC_BLOCK else "conv"
        return "qconv" if direct_integer(layer, graph) else "qconv_gemm"
    if float_op in ("Gemm", "MatMul"):
        return "qmatmul" if integer is not None or integer_kernel(layer, graph) else "matmul"
    return "other"


def fusion_anchor(layer: Layer, graph: Graph, registry: RuleRegistry, depth: int = 4) -> str:
    """The layer whose kernel a layer's work runs in: for an op onnxruntime folds into the
    convolution or Gemm before it (`OpTraits.fuses_into_conv`: a BatchNormalization, an activation,
    a residual Add), that convolution, found within `depth` such ops back (the input whose chain
    reaches one soonest); else the layer itself. onnxruntime names a fused kernel after the last
    op it holds, and the simulator prices the group at its convolution (`segment_work`): calibrate
    times a layer by it, recompute-halos prices a fused layer's operations as free. Returns the name."""
    producers = graph.producers()

    def steps(at: Layer, left: int) -> tuple[int, str] | None:
        if op_kind(at, graph) in FUSING:
            return 0, at.name
        if left == 0 or not registry.traits(at.op_type, at.domain).fuses_into_conv:
            return None
        found = [s for t in at.inputs if t in producers and (s := steps(producers[t], left - 1)) is not None]
        return (min(found)[0] + 1, min(found)[1]) if found else None

    got = steps(layer, depth)
    return got[1] if got is not None else layer.name


def fused_pass(traits: OpTraits, anchor_kind: str) -> bool:
    """Whether an op onnxruntime fuses into a convolution or Gemm of `anchor_kind` takes a pass over
    its output there, one "other" operation a value on its account: not where it folds into the
    weights (a BatchNormalization), nor where a blocked kernel applies it as it writes each value
    (`OpTraits.in_kernel`: a ReLU, a residual Add; `BLOCKED_KERNELS`)."""
    return not traits.folds_into_weights and not (traits.in_kernel and anchor_kind in BLOCKED_KERNELS)


def fused_into(layer: Layer, graph: Graph, registry: RuleRegistry) -> str | None:
    """The kind of the convolution or Gemm onnxruntime fuses `layer` into where the two run in one
    segment (`fusion_anchor`; a Gemm takes a bias, a constant operand or an activation, not a
    residual Add of two activations, as `segment_work` has it), or None: a kernel of its own."""
    anchor = fusion_anchor(layer, graph, registry)
    if anchor == layer.name:
        return None
    kind = op_kind(graph.layer(anchor), graph)
    if kind == "matmul" and sum(graph.is_activation(t) for t in layer.inputs if t) > 1:
        return None
    return kind


def chained_layers(graph: Graph, registry: RuleRegistry | None = None) -> frozenset[str]:
    """The layers onnxruntime computes inside the kernel of an op after them: elementwise ops
    (`OpTraits.fuses_in_chain`) that, with the ops they feed, compute a function of one value and
    constants, every use of their output inside that chain. The exporters write an activation so:
    SiLU as x·sigmoid(x) (onnxruntime's QuickGelu kernel), GELU as x·(1 + erf(x/√2))/2 (its
    Gelu kernel), and such a chain runs as one op, one pass over its values. A layer's chain is
    the value it traces back to through such ops (`root`); an op of two values (a residual Add,
    a squeeze-excite Mul) starts a chain of its own, and the op whose output leaves the chain is
    not in the set. A chain onnxruntime does not fuse is priced so too: one pass, not several."""
    registry = registry or default_registry()
    producers, consumers = graph.producers(), graph.consumers()

    def chains(layer: Layer) -> bool:
        return registry.traits(layer.op_type, layer.domain).fuses_in_chain and len([t for t in layer.outputs if t]) == 1

    root: dict[str, str | None] = {}  # a chaining layer -> the value its chain computes a function of (None: of several)
    for layer in graph.layers:
        if not chains(layer):
            continue
        sources = set()
        for t in layer.inputs:
            if not t or t in graph.constants:
                continue
            producer = producers.get(t)
            traced = root.get(producer.name) if producer is not None else None
            sources.add(traced if traced is not None and all(chains(c) for c in consumers.get(t, [])) else t)
        root[layer.name] = sources.pop() if len(sources) == 1 else None
    inner = set()
    for layer in graph.layers:
        value, users = layer.outputs[0], consumers.get(layer.outputs[0], [])
        if root.get(layer.name) is not None and users and value not in graph.outputs and all(root.get(u.name) == root[layer.name] for u in users):
            inner.add(layer.name)
    return frozenset(inner)


def values_moved(layer: Layer, graph: Graph, region: ShapeMap, registry: RuleRegistry, chained: frozenset[str] = frozenset(),
                 in_chain: bool = False) -> float:
    """The values a piece of the layer computing `region` is priced as moving (`LayerWork.elements`):
    its output values; for a depthwise convolution (float or integer) the more of the values it reads (by its rule's
    regions) and writes: it streams each input value through a few taps, so one of stride 2 takes
    about four times its output's values' time (calibrate's probes, of stride 1, read and write
    alike, and a depthwise layer of stride 2 measured as many input values at that speed); for an
    "other" op the mean of the values it reads (activations; not those a layer in `chained`
    makes, which stay in the fused kernel) and writes, as a copy reads and writes one each (a 3x3
    pool of stride 2 reads four per output value: 2.5 times its output's, which beyond the core's
    cache move at `stream_ops_per_s`, `NodeProfile.element_time`); none for a view
    (`OpTraits.view`) or an op computed in the kernel of the op after it (`in_chain`: one of
    `chained_layers` whose output stays in its segment)."""
    if in_chain or registry.traits(layer.op_type, layer.domain).view:
        return 0.0
    kind = op_kind(layer, graph)
    if kind not in ("other", "depthwise", "qdepthwise"):
        return float(region.volume)
    producers = graph.producers()
    fused = [t for t in layer.inputs if t in producers and producers[t].name in chained] if kind == "other" else []
    read = bytes_read(layer, graph, region, registry, fused)[1] / np.dtype(graph.tensors[layer.outputs[0]].dtype).itemsize
    if kind != "other":
        return max(read, float(region.volume))
    return (read + region.volume) / 2 if read else float(region.volume)


def value_shape(graph: Graph, value: str) -> tuple[int, ...] | None:
    """The shape of a local value named `tensor@region` (lower.value_name), or of a whole tensor
    bound under its own name; None for a name that is neither, or an empty region."""
    tensor, _, key = value.rpartition("@")
    if not tensor:
        t = graph.tensors.get(value)
        return tuple(t.shape) if t is not None else None
    if key == "empty":
        return None
    try:
        return tuple(sum(int(b) - int(a) for a, b in (i.split(":") for i in axis.split("+"))) for axis in key.split(","))
    except ValueError:
        return None


def value_elements(graph: Graph, value: str) -> int:
    """Elements of a local value (`value_shape`); 0 for a name that is none, or an empty region."""
    got = value_shape(graph, value)
    return math.prod(got) if got is not None else 0


def _int_attribute(node: onnx.NodeProto, name: str, default: int) -> int:
    """An ONNX node's integer attribute, or `default` where it has none."""
    return next((int(a.i) for a in node.attribute if a.name == name), default)


@dataclass(frozen=True)
class Layouts:
    """The layouts onnxruntime's CPU provider runs one segment's ops in (`layout_reorders`): the
    reorders it adds, each as (the name of the ONNX node of the segment that causes it, the values
    it moves), in the segment's order; and the nodes of ops that can run in the blocked layout (any
    `Layout` but PLAIN) that ran on NCHW values here, with their own kernel (`cluster.IN_NCHW`: a
    BatchNormalization's uses one thread)."""

    reorders: list[tuple[str, float]]
    in_nchw: frozenset[str]


def layout_reorders(graph: Graph, seg: Segment, registry: RuleRegistry, chained: frozenset[str] = frozenset(),
                    block: int = NCHWC_BLOCK) -> Layouts:
    """The layout reorders onnxruntime's CPU provider adds inside one segment, and the ops it runs
    on NCHW values that could run blocked (`Layouts`).

    onnxruntime runs convolutions and pools in its blocked layout (NCHWc, `Layout`) and reorders
    a 4-D value to NCHW before an op that does not run blocked, and back before a convolution or
    pool that takes it from such an op: a squeeze-excite block's broadcasting Mul, a
    LayerNormalization, a Reshape, an Erf, a Concat of channels that are not whole blocks
    (ShuffleNet's) each cost a pass over the value, as a copy does. Walking the nodes in order, a value is
    blocked where its node runs blocked (onnxruntime 1.31, probed one op at a time):

    * a convolution, dense or depthwise (not grouped otherwise), and a pool (`Layout.BLOCKED`,
      not elementwise): always; a plain value in is reordered, unless a convolution takes it whole
      for having fewer channels than a block (an image's three);
    * an elementwise op (`Layout.BLOCKED` and `OpTraits.fuses_in_chain`: Add, Sum, Mul): where
      every value it takes that is not a constant is blocked and of its output's shape;
    * a Concat or Slice (`Layout.BLIND`): where every value it takes and gives is 4-D of whole
      channel blocks and every value it takes is blocked, and it concatenates channels (as
      onnxruntime does) or the segment has blocked edges (bbgrap-run's layout folding,
      backends/nchwc.py, runs in such a segment only);
    * an activation that keeps the layout (`Layout.KEEPS`), a layer computed in the kernel of an
      op after it (`chained`: the exporters' SiLU and GELU run as onnxruntime's QuickGelu and
      Gelu, which keep it) and the op that ends such a chain: where its value in is blocked.

    A segment's inputs of whole channel blocks count as blocked (bbgrap-run keeps such a value
    blocked between segments where that saves a reorder). A blocked value used by a plain op is
    reordered once, on the first such op's account (which causes it); a plain value made here
    and used by a blocked op is reordered once, on its producer's. What crosses the segment's
    edge is priced with the values it takes or gives (`segment_work`)."""
    producer: dict[str, str] = {}
    blocked: set[str] = set()
    unblocked: set[str] = set()  # blocked values already reordered to NCHW for a plain op
    reblocked: set[str] = set()  # plain values already reordered into the blocked layout
    out: list[tuple[str, float]] = []
    in_nchw: set[str] = set()

    def whole_blocks(shape: tuple[int, ...] | None) -> bool:
        return shape is not None and len(shape) == 4 and shape[1] % block == 0

    for v in seg.inputs:
        if whole_blocks(value_shape(graph, v)):
            blocked.add(v)
    folding = bool(blocked)  # bbgrap-run folds the reorders of a segment with blocked edges only
    for node in seg.nodes:
        traits = registry.traits(node.op_type, node.domain)
        values = [i for i in node.input if i and i not in seg.initializers and i not in graph.constants]
        outputs = [o for o in node.output if o]
        shapes = [value_shape(graph, v) for v in values]
        out_shapes = [value_shape(graph, o) for o in outputs]
        four_d = bool(out_shapes) and all(s is not None and len(s) == 4 for s in out_shapes)
        runs = False
        takes_plain = False  # reorders a plain value in (a convolution or a pool)
        if four_d and traits.layout is Layout.BLOCKED and not traits.fuses_in_chain and len(values) == 1 \
                and shapes[0] is not None and len(shapes[0]) == 4:
            group = _int_attribute(node, "group", 1) if node.op_type == "Conv" else 1
            runs = group in (1, shapes[0][1])
            takes_plain = runs and not (node.op_type == "Conv" and shapes[0][1] < block)
        elif four_d and traits.layout is Layout.BLOCKED:
            runs = len(outputs) == 1 and all(v in blocked and s == out_shapes[0] for v, s in zip(values, shapes))
        elif four_d and traits.layout is Layout.BLIND:
            along_channels = node.op_type == "Concat" and _int_attribute(node, "axis", 0) in (1, -3)
            runs = (folding or along_channels) and bool(values) and all(v in blocked for v in values) \
                and all(whole_blocks(s) for s in (*shapes, *out_shapes))
        elif four_d and (traits.layout is Layout.KEEPS or node.name in chained
                         or any(producer.get(v) in chained for v in values)):
            runs = bool(values) and all(v in blocked for v in values)
        for v, s in zip(values, shapes):
            size = float(math.prod(s)) if s is not None else 0.0
            if runs and v not in blocked and takes_plain and v in producer and v not in reblocked:
                reblocked.add(v)
                out.append((producer[v], size))
            elif not runs and v in blocked and v in producer and v not in unblocked:
                unblocked.add(v)
                out.append((node.name, size))
        if not runs and traits.layout is not Layout.PLAIN and (four_d or not any(v in blocked for v in values)):
            in_nchw.add(node.name)  # (a value lowering names has no known shape: NCHW where none in is blocked)
        for o in outputs:
            producer[o] = node.name
            if runs:
                blocked.add(o)
    return Layouts(out, frozenset(in_nchw))


def layer_work(layer: Layer, graph: Graph, part: LayerPartition, node: int, kind: str, whole: float, registry: RuleRegistry,
               chained: frozenset[str] = frozenset(), in_chain: bool = False) -> LayerWork:
    """Node `node`'s share of the layer under partition `part` (of OP_KINDS `kind`, `whole` operations
    for its whole output): what the simulator (`segment_work`) and the network planner price
    (`work_seconds`). `chained`: `chained_layers`; `in_chain`: this layer is one of them and its
    output stays in its segment (`values_moved`)."""
    region = part.emitted(node)
    priced = ops_and_reads(layer, graph, region, registry, by_kind=True)
    joined = concat_joins(layer.op_type, layer.domain, [need for need in part.needs[node] if need is not None])
    units = conv_work_units(layer, graph, kind, region)
    whole_units = conv_work_units(layer, graph, kind, ShapeMap.full(graph.tensors[layer.outputs[0]].shape)) if units else 0
    return LayerWork(layer.name, piece_kind(kind, region), priced.ops, whole,
                     weight_share(layer, graph, part.needs[node]), weight_bytes(layer, graph), values_moved(layer, graph, region, registry, chained, in_chain), chained=in_chain,
                     op_type=layer.op_type, reads=priced.reads, read_ops=priced.read_ops, joined=joined,
                     units=units, whole_units=whole_units)


def concat_joins(op_type: str, domain: str, inputs: Sequence[object]) -> int:
    """How many values an op of `op_type` joins, each at `NodeProfile.concat_input_s`: a Concat
    (the model's, of the `inputs` its piece keeps, or one of lowering's) all of them; any other op none."""
    return len(inputs) if op_type == "Concat" and is_default_domain(domain) else 0


def piece_kind(kind: str, region: ShapeMap) -> str:
    """The kind a piece (`region` of the output) of a layer of `kind` runs as: a piece of a "qconv"
    (MLAS's direct integer kernel) of output channels that kernel does not take (`direct_outputs`)
    as "qconv_gemm", as MLAS chooses by the piece's own shape; else the layer's."""
    if kind != "qconv" or region.rank != 4 or region.empty:
        return kind
    return kind if direct_outputs(len(region.interval(1))) else "qconv_gemm"


def segment_work(graph: Graph, node: int, seg: Segment, whole: Mapping[str, float], registry: RuleRegistry | None = None,
                 chained: frozenset[str] = frozenset()) -> SegmentWork:
    """The work of one segment of `node`'s program, as lowered (module docstring): its layers' operations,
    the values each crop, concat or other op of lowering's writes (`SegmentWork.copies`), for an op onnxruntime fuses into
    the convolution before it (`OpTraits.fuses_into_conv`; into a matmul only a bias, a constant
    operand, or an activation: its Gemm) none of its own but the values it writes on that
    convolution's account (`LayerWork.fused_values`; none where it folds into the weights, nor where
    a blocked kernel applies it as it writes each value, `OpTraits.in_kernel`), for a
    layer in `chained` (`chained_layers`) whose output stays in the segment its operations only
    (`LayerWork.chained`), each layout reorder onnxruntime adds inside it (`layout_reorders`) on
    the account of the layer that causes it (`LayerWork.reorders`), or where an op of lowering's
    does, as one copy more, and the size of every value the segment takes or gives
    (`SegmentWork.handed`: each crosses from one onnxruntime session to another, copied, and in the
    blocked layout reordered). An "other" layer onnxruntime runs on NCHW values where it could run
    blocked (`Layouts.in_nchw`) is priced as its op type `IN_NCHW`, and one of lowering's ops as its
    op type (`Copy`: a DequantizeLinear or QuantizeLinear the node timed apart). `whole`: each
    layer's `whole_ops` by name (counted once for all the plan's segments: `program_steps`)."""
    registry = registry or default_registry()
    layers = {layer.name: layer for layer in graph.layers}
    given = set(seg.outputs)
    works: list[LayerWork] = []
    copies: list[Copy] = []
    convolved: dict[str, int] = {}  # values a convolution or matmul of this segment (with what is fused into it) makes: its index in works
    inside = in_integer_kernels(graph, seg, layers, registry)
    for onnx_node in seg.nodes:
        outputs = [o for o in onnx_node.output if o]
        if id(onnx_node) in inside:
            continue
        traits = registry.traits(onnx_node.op_type, onnx_node.domain)
        anchor = next((convolved[i] for i in onnx_node.input if i in convolved), None) if traits.fuses_into_conv else None
        if anchor is not None and works[anchor].kind == "matmul" and any(
                i not in convolved and i not in seg.initializers for i in onnx_node.input if i):
            anchor = None  # a residual Add: onnxruntime's Gemm takes only a constant bias
        if anchor is not None:
            fused = works[anchor]
            if fused_pass(traits, fused.kind):
                works[anchor] = replace(fused, fused_values=fused.fused_values + sum(value_elements(graph, o) for o in outputs))
            convolved.update(dict.fromkeys(outputs, anchor))
            continue
        layer = layers.get(onnx_node.name)
        if layer is not None and layer.op_type == onnx_node.op_type:
            kind = op_kind(layer, graph)
            in_chain = layer.name in chained and not given.intersection(outputs)
            works.append(layer_work(layer, graph, graph.partitions[layer.name], node, kind, whole[layer.name], registry, chained, in_chain))
            if kind in FUSING:
                convolved.update(dict.fromkeys(outputs, len(works) - 1))
        else:  # a crop, concat, select convolution or binding lowering added: it writes its output
            copies.append(Copy(float(sum(value_elements(graph, o) for o in outputs)), onnx_node.op_type,
                               concat_joins(onnx_node.op_type, onnx_node.domain, [i for i in onnx_node.input if i])))
    quantized = quantized_layouts(graph, seg, layers, inside, registry)
    layouts = layout_reorders(graph, seg, registry, chained)
    works = [replace(w, op_type=w.op_type + EIGHT_BIT_NCHW) if w.name in quantized.eight_bit_nchw
             else replace(w, op_type=w.op_type + IN_NCHW) if w.name in layouts.in_nchw and w.kind == "other" else w for w in works]
    at = {w.name: k for k, w in enumerate(works)}
    for name, size in (*layouts.reorders, *quantized.transposes):
        if name in at:
            works[at[name]] = replace(works[at[name]], reorders=(*works[at[name]].reorders, size))
        else:  # caused by an op of lowering's (a crop between two convolutions) or one fused into another's kernel
            copies.append(Copy(size))
    handed = tuple(float(value_elements(graph, v)) for v in (*seg.inputs, *seg.outputs))
    return SegmentWork(tuple(works), tuple(copies), handed)


def eight_bit_op(layer: Layer, graph: Graph, registry: RuleRegistry | None = None) -> bool:
    """Whether onnxruntime runs the layer, an op of `OpTraits.eight_bit`, on the 8-bit values of its
    QDQ pattern (`Layer.fused`): every value it takes dequantized from, and its result quantized
    to, integers of one 8-bit type (uint8 where `EightBit.unsigned_only`). It prices as its float
    op; its DequantizeLinear and QuantizeLinear nodes cost nothing of their own (`in_integer_kernels`)."""
    eight_bit = (registry or default_registry()).traits(layer.op_type, layer.domain).eight_bit
    if eight_bit is None or not is_default_domain(layer.domain) or not layer.rounds_output:
        return False
    values = [k for k, t in enumerate(layer.inputs) if t and t not in graph.constants]
    if not values or not all(layer.dequantizes(k) for k in values):
        return False
    types = {graph.tensors[t].dtype for t in (*(layer.inputs[k] for k in values), layer.outputs[0])}
    return types == {"uint8"} or (types == {"int8"} and not eight_bit.unsigned_only)


def in_integer_kernels(graph: Graph, seg: Segment, layers: Mapping[str, Layer], registry: RuleRegistry | None = None) -> set[int]:
    """The nodes of `seg` (by id) that lowering attaches to a layer onnxruntime runs on 8-bit
    integers, in an integer kernel (`integer_kernel`: a convolution of any group, a matmul) or as
    an `eight_bit_op`: the DequantizeLinear of each of its inputs and weights, and the Relu/Clip
    and QuantizeLinear after it (`Layer.fused`). onnxruntime fuses them into the kernel (or drops
    them), so they cost nothing of their own; the same nodes around a layer it runs in float are
    ops it runs (a weight's DequantizeLinear too: it does not fold them)."""
    producers, readers = seg.producers(), seg.readers()
    inside: set[int] = set()
    for n in seg.nodes:
        layer = layers.get(n.name)
        if layer is None or layer.fused is None or layer.op_type != n.op_type or not (
                integer_kernel(layer, graph) or eight_bit_op(layer, graph, registry)):
            continue
        for i in n.input:
            if (before := producers.get(i)) is not None and before.op_type == "DequantizeLinear":
                inside.add(id(before))
        after = readers.get(n.output[0], []) if n.output else []
        for op in layer.fused.outputs:  # lowering emits them in order, each reading the one before
            if len(after) != 1 or after[0].op_type != op.op_type:
                break
            inside.add(id(after[0]))
            after = readers.get(after[0].output[0], [])
    return inside


@dataclass(frozen=True)
class QuantizedLayouts:
    """Where onnxruntime runs one segment of a quantized model channels-last (`quantized_layouts`):
    the transposes it adds, each as (the layer whose run holds it, or "" for one at the segment's
    edge, the values it moves), and the `eight_bit_op`s it runs in NCHW on its generic kernel for
    8-bit values (`EightBit.generic_kernel`: a MaxPool's, many times slower than its float or
    channels-last one; `cluster.EIGHT_BIT_NCHW`)."""

    transposes: list[tuple[str, float]]
    eight_bit_nchw: frozenset[str]


def quantized_layouts(graph: Graph, seg: Segment, layers: Mapping[str, Layer], inside: set[int],
                      registry: RuleRegistry) -> QuantizedLayouts:
    """The layouts onnxruntime's CPU provider runs one segment of a quantized model in (`QuantizedLayouts`).

    onnxruntime runs an 8-bit convolution (`integer_kernel`, any group) channels-last (NHWC); an
    `eight_bit_op` of any layout (`EightBit.any_layout`), and an elementwise op
    (`OpTraits.fuses_in_chain`), a DequantizeLinear or QuantizeLinear, or a crop or concat lowering
    adds (`OpTraits.transposes_pass`) that gives
    no result of the segment, in the layout of the values it takes where all of them are
    channels-last (it moves its transposes past them), else in NCHW; every other op (a
    BatchNormalization, a float convolution, a Flatten), and the values segments hand each other,
    in NCHW. A value crossing between the two layouts is transposed once per direction: an
    NCHW value into an 8-bit convolution (on that convolution's account), a channels-last value
    read by an NCHW op (on that op's). A segment's input into a convolution and its channels-last
    results are transposed at the segment's edge (""; the whole model a layer was measured in
    has no such transposes). The DequantizeLinear and QuantizeLinear nodes in an 8-bit kernel
    (`inside`) pass the layout on."""
    source: dict[str, str] = {}  # a value in an 8-bit kernel's pattern -> the 8-bit value it stands for
    last: set[str] = set()  # channels-last values
    nchw: set[str] = set()  # 8-bit ops on their generic kernel run in NCHW
    done: set[tuple[str, bool]] = set()  # (value, to channels-last) already transposed
    edge, given = set(seg.inputs), set(seg.outputs)
    out: list[tuple[str, float]] = []

    def transpose(value: str, to_last: bool, account: str) -> None:
        if (value, to_last) not in done:
            done.add((value, to_last))
            out.append(("" if value in edge else account, float(value_elements(graph, value))))

    for node in seg.nodes:
        values = [source.get(i, i) for i in node.input if i and i not in seg.initializers and i not in graph.constants]
        if id(node) in inside:  # a DequantizeLinear stands for the integers it reads, a weight's for none
            for o in (o for o in node.output if o):
                if node.op_type == "DequantizeLinear":
                    source[o] = values[0] if values else ""
                elif values and values[0] in last:
                    last.add(o)
            continue
        values = [v for v in values if v]
        layer = layers.get(node.name)
        mine = layer if layer is not None and layer.op_type == node.op_type else None  # the node is this layer's op
        if mine is not None and mine.op_type == "Conv" and integer_kernel(mine, graph):
            for v in values:
                if v not in last:
                    transpose(v, True, node.name)
            last.update(o for o in node.output if o)
            continue
        traits = registry.traits(node.op_type, node.domain)
        eight_bit = traits.eight_bit if mine is not None and eight_bit_op(mine, graph, registry) else None
        any_layout = eight_bit is not None and eight_bit.any_layout
        if values and all(v in last for v in values) and (any_layout or (
                (traits.transposes_pass or traits.fuses_in_chain) and not given.intersection(node.output))):
            last.update(o for o in node.output if o)
            continue
        for v in values:
            if v in last:
                transpose(v, False, node.name if mine is not None else "")
        if any_layout and eight_bit is not None and eight_bit.generic_kernel:  # (only a layer's own op has one)
            nchw.add(node.name)
    for v in seg.outputs:
        if v in last:
            transpose(v, False, "")
    return QuantizedLayouts(out, frozenset(nchw))


@dataclass(frozen=True)
class SimStep:
    """One step of a rank's program for the simulator: run (with its work), send or wait (a message)."""

    op: str
    work: SegmentWork | None = None
    message: int = -1
    src: int = -1
    dst: int = -1
    nbytes: int = 0


def program_steps(graph: Graph, programs: Sequence[NodeProgram], registry: RuleRegistry | None = None) -> list[list[SimStep]]:
    """Lowered programs as the simulator's steps (a node's segments `after_others` where it has more than one)."""
    out: list[list[SimStep]] = []
    whole = {layer.name: whole_ops(layer, graph, registry) for layer in graph.layers}
    chained = chained_layers(graph, registry)
    for program in programs:
        steps: list[SimStep] = []
        works = {id(step): segment_work(graph, program.node, step.seg, whole, registry, chained) for step in program.steps if step.op == "run"}
        pieces = [w for work in works.values() for w in work.layers]
        written = [*(w.elements for w in pieces), *(c.values for work in works.values() for c in work.copies),
                   *(v for work in works.values() for v in work.handed)]
        node_set = working_set((w.weight_share * w.weight_bytes for w in pieces), written)
        for step in program.steps:
            if step.op == "run":
                steps.append(SimStep("run", work=replace(works[id(step)], after_others=len(works) > 1, working_set=node_set)))
            else:
                m = step.msg
                steps.append(SimStep(step.op, message=m.id, src=m.src, dst=m.dst, nbytes=m.nbytes))
        out.append(steps)
    return out


VALUE_BYTES = 4  # bytes of a float32 value (`working_set`)


def working_set(weights: Iterable[float], written: Iterable[float]) -> float:
    """Bytes a node touches in one inference: the `weights` (bytes) of its pieces, and the values it
    writes (`written`: each piece's, copy's and handed value's count; VALUE_BYTES each), which pass
    through its cache between one use of a filter and the next: a cache that holds them all keeps the
    filters from one inference to the next, one that does not a share of them (`NodeProfile.kept`); a
    model's activations evict them as its weights do (DenseNet's concatenations, a large map)."""
    return math.fsum(weights) + VALUE_BYTES * math.fsum(written)


def whole_ops(layer: Layer, graph: Graph, registry: RuleRegistry | None = None) -> float:
    """The operations of the layer's whole output, as the CPU runs them (`run_ops`: a piece's
    share of the layer is its run_ops over these)."""
    return run_ops(layer, graph, ShapeMap.full(graph.tensors[layer.outputs[0]].shape), registry)


# nodes within this much of the fastest on a model are taken as equal: calibrate's noise between like nodes
# (two ranks of one host have measured one op kind's throughput 17 % apart, docs/benchmarks.md session 17)
EQUAL_SPEEDS = 0.2


def profile_speeds(work: Sequence[SegmentWork], profile: ClusterProfile, nodes: int) -> tuple[float, ...]:
    """Each of the first `nodes` nodes' speed on a model, as the cut proportions take them
    (`Config.speeds`): the slowest node's time for the model's one-node plan (`work`: its
    segments, `program_steps`), priced on each node as the simulator prices it (`segment_seconds`:
    measured layers, fused and chained ops, layout reorders), over this node's, to two decimals.
    All 1.0 where every node is within EQUAL_SPEEDS of the fastest: like nodes calibrated a few
    percent apart keep what equal speeds allow (even cuts, band pools)."""
    times = [math.fsum(segment_seconds(w, n, profile) for w in work) for n in range(nodes)]
    if max(times) <= (1 + EQUAL_SPEEDS) * min(times):
        return (1.0,) * nodes
    return tuple(round(max(times) / t, 2) for t in times)


def work_seconds(p: NodeProfile, w: LayerWork, kept: float = 0.0) -> float:
    """Seconds of one layer's share of a segment on node `p` (`NodeProfile.layer_time`; `kept`: the
    share of its weights the node's cache keeps between inferences, `NodeProfile.kept`)."""
    return p.layer_time(w.name, w.kind, w.ops, w.whole_ops, w.weight_share, w.weight_bytes, w.elements, w.fused_values, w.chained, w.op_type,
                        w.reorders, w.reads, w.read_ops, kept, w.joined, w.units, w.whole_units)


def segment_seconds(work: SegmentWork, node: int, profile: ClusterProfile) -> float:
    """The segment's time on `node`: its fixed costs (the segment's, its values'), each layer's own
    time (`NodeProfile.layer_time`: its measured share where the node measured it, else its kind's
    throughput and fixed cost per op, or its weights streamed where that takes longer), each copy as
    `NodeProfile.copy_s` prices it, and each value taken or given as `moved_s` (its fixed cost is
    `value_s`); a segment run after others pays `cold_segment_s`, and `cold_s` for each op and value;
    its convolutions read from its cache the share of their filters it keeps (`NodeProfile.kept` of
    the node's `working_set`)."""
    p = profile.node(node)
    cold = p.cold_segment_s + (work.op_count + work.values) * p.cold_s if work.after_others else 0.0
    kept = p.kept(work.working_set)
    return p.segment_s + work.values * p.value_s + cold + math.fsum([*(work_seconds(p, w, kept) for w in work.layers),
                                                                    *(p.copy_s(c.values, c.op_type, c.joined) for c in work.copies),
                                                                    *(p.moved_s(h) for h in work.handed)])


def simulate(steps: Sequence[Sequence[SimStep]], profile: ClusterProfile,
             seconds: Callable[[SegmentWork, int, ClusterProfile], float] = segment_seconds) -> Prediction:
    """Every rank's program played on its own clock (module docstring); raises BBGrapError where
    ranks wait for messages nobody sends. A node under a CPU quota (`NodeProfile.cpu_share`, whose
    times are its threads' divided by it) carries the time it waits into its next segments, which
    run that much faster, down to its threads' full speed, as far as the quota's period allows
    (`NodeProfile.quota_absorbs`): a rank that waits spends none of its quota."""
    n = len(steps)
    clock = [0.0] * n
    banked = [0.0] * n  # waiting a quota node carries into its next segments
    compute = [0.0] * n
    wait = [0.0] * n
    segments: list[list[float]] = [[] for _ in range(n)]
    at = [0] * n
    arrival: dict[int, float] = {}
    link_free: dict[tuple[int, int], float] = {}
    while True:
        moved = False
        for r in range(n):
            while at[r] < len(steps[r]):
                step = steps[r][at[r]]
                if step.op == "run":
                    assert step.work is not None
                    dt = seconds(step.work, r, profile)
                    absorbed = 0.0
                    if banked[r]:  # the stopped share of the segment, as far as the rank waited before it
                        absorbed = min(banked[r], dt * (1.0 - profile.node(r).cpu_share))
                        banked[r] -= absorbed
                    clock[r] += dt - absorbed
                    compute[r] += dt
                    segments[r].append(dt)
                elif step.op == "send":
                    dt = profile.node(r).send_time(step.nbytes)
                    clock[r] += dt
                    compute[r] += dt
                    start = max(clock[r], link_free.get((step.src, step.dst), 0.0))
                    arrival[step.message] = link_free[(step.src, step.dst)] = start + profile.link.message_s(step.nbytes)
                elif step.message in arrival:
                    node = profile.node(r)
                    latest = segments[r][-1] if segments[r] else 0.0  # a wait's jitter is a share of the rank's latest segment
                    ready = node.taken(clock[r], arrival[step.message], step.nbytes) + node.wait_share * latest
                    banked[r] = min(banked[r] + ready - clock[r], node.quota_absorbs())
                    wait[r] += ready - clock[r]
                    clock[r] = ready
                else:
                    break  # blocked on a message not sent yet
                at[r] += 1
                moved = True
        if all(at[r] == len(steps[r]) for r in range(n)):
            break
        if not moved:
            stuck = [r for r in range(n) if at[r] < len(steps[r])]
            raise BBGrapError(f"simulated plan deadlocked: ranks {stuck} wait for messages nobody sends")
    return Prediction(n, tuple(RankTime(compute[r], wait[r], clock[r], tuple(segments[r])) for r in range(n)))


def predict(graph: Graph, programs: Sequence[NodeProgram], profile: ClusterProfile, registry: RuleRegistry | None = None) -> Prediction:
    """The lowered plan of `graph` (lower(graph)'s programs) played against `profile`."""
    return simulate(program_steps(graph, programs, registry), profile)
