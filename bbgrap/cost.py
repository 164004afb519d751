"""The cost model: operations of a layer's local op, and the plan's traffic.

Operations count multiply-adds as two. An op's operations per output element are its
rule's (`RegionRule.ops_per_element`, in the op's family module: 2·(C_in/group)·∏kernel
for a convolution, 2·K for Gemm/MatMul, ∏kernel for a window pool, the reduced elements of
a reduction, none for a Reshape, which hands its input's buffer on); an op without a rule counts
one per output element. The search's objective
(thesis eq. 3.7–3.12) and `bbgrap inspect` both use these numbers; `recompute-halos` weighs
them against what a receive costs (`ReceiveCost`, per execution provider).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from bbgrap.cluster import OP_KINDS, ClusterProfile, NodeProfile
from bbgrap.ir import Graph, Interval, Layer, ShapeMap
from bbgrap.rules.conv import GEMM_PATH_COST, direct_integer, direct_outputs, integer_conv
from bbgrap.rules.registry import RuleRegistry, default_registry


def ops_per_element(layer: Layer, graph: Graph, registry: RuleRegistry | None = None) -> float:
    rule = (registry or default_registry()).get(layer)
    return rule.ops_per_element(layer, graph) if rule is not None else 1.0


def layer_ops(layer: Layer, graph: Graph, region: ShapeMap, registry: RuleRegistry | None = None) -> float:
    """Operations to compute `region` of the layer's output."""
    return ops_per_element(layer, graph, registry) * region.volume


def padded(channels: int, block: int) -> int:
    """`channels` rounded up to whole blocks of `block` (0 or 1: as they are)."""
    return -(-channels // block) * block if block > 1 else channels


def run_ops(layer: Layer, graph: Graph, region: ShapeMap, registry: RuleRegistry | None = None, by_kind: bool = False) -> float:
    """Operations to compute `region` of the layer's output, as the CPU runs them: `layer_ops`;
    for an op whose kernel works its output channels in blocks (`OpTraits.channel_block`, the
    blocked layout's convolution) a piece of some of its channels priced by those channels
    rounded up to whole blocks, over the whole layer's own rounding (`in_blocks`; the throughputs
    a node is measured at already hold that); and for an op whose pieces pay for what they read
    (`OpTraits.read_ops`), that many operations per byte of `extra_reads`. What the planners and
    the simulator price; what a node computes (`inspect`'s FLOPs) is `layer_ops`. `by_kind`: the
    caller prices the piece's kernel by its kind's speed (the simulator, `simulate.piece_kind`), so
    the GEMM path's GEMM_PATH_COST is left out (`in_blocks`)."""
    return ops_and_reads(layer, graph, region, registry, by_kind).ops


@dataclass(frozen=True)
class PricedOps:
    """A piece's `run_ops` (`ops`), the bytes of `priced_reads` among them (`reads`) and the
    operations those bytes are counted as (`read_ops`: `OpTraits.read_ops` a byte)."""

    ops: float
    reads: float
    read_ops: float


def ops_and_reads(layer: Layer, graph: Graph, region: ShapeMap, registry: RuleRegistry | None = None,
                  by_kind: bool = False) -> PricedOps:
    """`run_ops` with the reads among them apart (`PricedOps`): for a caller that prices those bytes
    apart (`simulate.layer_work`)."""
    registry = registry or default_registry()
    ops = in_blocks(layer, graph, region, layer_ops(layer, graph, region, registry), registry, by_kind)
    reads = priced_reads(layer, graph, region, registry)
    read_ops = registry.traits(layer.op_type, layer.domain).read_ops * reads
    return PricedOps(ops + read_ops, reads, read_ops)


def priced_reads(layer: Layer, graph: Graph, region: ShapeMap, registry: RuleRegistry | None = None) -> float:
    """The bytes a piece computing `region` pays for reading (`extra_reads`) where its op does
    (`OpTraits.read_ops`) and its output is an NCHW box; else 0."""
    registry = registry or default_registry()
    if not registry.traits(layer.op_type, layer.domain).read_ops or not nchw_box(layer, graph, region):
        return 0.0
    return extra_reads(layer, graph, region, registry)


def nchw_box(layer: Layer, graph: Graph, region: ShapeMap) -> bool:
    """Whether `region` is a non-empty box of the layer's 4-D (NCHW) output: where a piece's blocks
    and reads are priced (`in_blocks`, `extra_reads`)."""
    return len(graph.tensors[layer.outputs[0]].shape) == 4 and not region.empty and region.is_box


def in_blocks(layer: Layer, graph: Graph, region: ShapeMap, ops: float, registry: RuleRegistry, by_kind: bool = False) -> float:
    """`ops`, the layer's operations for `region` (`layer_ops`), as its kernel runs them where it works
    its output channels in blocks (`OpTraits.channel_block`): a piece of some of an NCHW output's
    channels by those channels rounded up to whole blocks, over the whole layer's own rounding. A
    convolution onnxruntime runs in an integer kernel is not blocked: a piece of one on MLAS's direct
    kernel (`rules.conv.direct_integer`) costs GEMM_PATH_COST times its operations where that kernel
    does not take its channels (but `by_kind`: `run_ops`), and any other piece its operations;
    `run_ops` without what the piece reads (what the per-layer search prices)."""
    if not nchw_box(layer, graph, region):
        return ops
    whole, part = graph.tensors[layer.outputs[0]].shape[1], len(region.interval(1))
    if part == whole:
        return ops
    if integer_conv(layer, graph):  # in no blocked layout
        return ops * GEMM_PATH_COST if not by_kind and not direct_outputs(part) and direct_integer(layer, graph) else ops
    block = registry.traits(layer.op_type, layer.domain).channel_block
    return ops * (padded(part, block) / part) / (padded(whole, block) / whole) if block > 1 else ops


def bytes_read(layer: Layer, graph: Graph, region: ShapeMap, registry: RuleRegistry | None = None,
               skip: Collection[str] = ()) -> tuple[int, int]:
    """Bytes of its weights (constant inputs) and of its activations the layer's local op reads to
    compute `region` of its output, by its rule's regions ((0, 0) for a layer without a rule); the
    inputs in `skip` left out."""
    rule = (registry or default_registry()).get(layer)
    if rule is None or region.empty:
        return 0, 0
    weights = activations = 0
    for t, need in zip(layer.inputs, rule.local(layer, graph, region).needs):
        if t and need is not None and t not in skip:
            nbytes = need.volume * graph.itemsize(t)
            if t in graph.constants:
                weights += nbytes
            else:
                activations += nbytes
    return weights, activations


def extra_reads(layer: Layer, graph: Graph, region: ShapeMap, registry: RuleRegistry | None = None) -> float:
    """Bytes a piece computing `region` (of an NCHW output) reads beyond what its kind's throughput
    holds: its weights (a node's throughput is measured on convolutions whose few filters stay in
    the core's cache; a model's do not, and every piece of rows reads all of them again), and the
    activations a piece of some output channels reads beyond its share of those of all of them
    (a convolution's piece of channels reads every input channel; a depthwise one only its own,
    as the whole layer does, and a piece of rows only its rows with their window's: what the
    throughput holds)."""
    weights, activations = bytes_read(layer, graph, region, registry)
    channels = graph.tensors[layer.outputs[0]].shape[1]
    part = len(region.interval(1))
    if part == channels:
        return float(weights)
    every = bytes_read(layer, graph, region.with_axis(1, Interval(0, channels)), registry)[1]
    return weights + max(0.0, activations - part / channels * every)


def weight_share(layer: Layer, graph: Graph, needs: Sequence[ShapeMap | None]) -> float:
    """The share of the layer's constant inputs (its weights, a bias) a node reading `needs` (one
    region per input, None: not read) reads; 1 for a layer without constant inputs. A cut along
    rows reads every weight, a cut along output channels its channels' filters only."""
    whole = read = 0
    for tensor, need in zip(layer.inputs, needs):
        if tensor in graph.constants:
            whole += math.prod(graph.tensors[tensor].shape)
            read += need.volume if need is not None else 0
    return read / whole if whole else 1.0


def weight_bytes(layer: Layer, graph: Graph) -> int:
    """Bytes of the layer's constant inputs (its weights, a bias): what a node computing all of its
    output channels streams from memory once per inference (`NodeProfile.layer_time`)."""
    return sum(math.prod(graph.tensors[t].shape) * graph.itemsize(t) for t in layer.inputs if t in graph.constants)


def plan_flops(graph: Graph, owned: bool = False, registry: RuleRegistry | None = None) -> list[float]:
    """Operations each node performs per inference (with `owned`: only for the outputs it owns,
    leaving out what it computes beyond them, such as recomputed halos)."""
    flops = [0.0] * graph.nodes
    for layer in graph.layers:
        part = graph.partitions[layer.name]
        for n in part.active_nodes():
            flops[n] += layer_ops(layer, graph, part.out[n] if owned else part.emitted(n), registry)
    return flops


@dataclass(frozen=True)
class ReceiveCost:
    """What receiving a halo costs the receiving node, in operations of its own compute: `sync_ops`
    per receive point (its segment ends, it waits, the next segment starts) plus `byte_ops` per
    byte of the gathered region and of the activations alive across that point (a segment boundary
    hands them from one onnxruntime session to the next, converting their layout twice)."""

    sync_ops: float
    byte_ops: float

    def of(self, region_bytes: float, live_bytes: float) -> float:
        return self.sync_ops + self.byte_ops * (region_bytes + max(0.0, live_bytes))


# onnxruntime's CPU provider does about 1e5 operations per microsecond per core; one receive
# point costs roughly 50 us there, a byte it moves about 0.1 ns (docs/benchmarks.md).
CPU_RECEIVE = ReceiveCost(sync_ops=5e6, byte_ops=10.0)


def pricing_node(profile: ClusterProfile) -> NodeProfile:
    """The node whose convolution's operation is recompute-halos' unit of cost: the slowest one."""
    return min(profile.nodes, key=lambda p: p.conv_ops_per_s)


def receive_cost(profile: ClusterProfile, itemsize: int = 4, boundary: bool = True) -> ReceiveCost:
    """A receive's cost from a measured cluster profile, in operations of the slowest node's
    convolution (what recomputing a halo mostly is): per receive point one message's latency, a
    segment's fixed cost and (`boundary`) the sender's cost of posting the message, the
    receiver's of taking it, and the boundary's two pieces (`NodeProfile.boundary_s`: the rows
    the segment before it gives, the halo the one after it takes, and the concat; the simulator
    prices each, bbgrap/simulate.py); per byte the sender's, the link's time for it or the
    receiver's take where that is longer (`NodeProfile.taken`), and the concat's (an operation per
    element at a Concat's speed, `NodeProfile.op_rate`) and the session hand-over's (an "other"
    operation per element). Not `NodeProfile.wait_share`: a wait's
    jitter is that share of the segment before it, and a receive more splits a segment rather than
    adding one (the next wait's jitter loses what the new one's gains; only a node's last wait
    adds its segment's), so it prices candidates alike; the simulator, which judges the
    planners' plans, prices it."""
    slowest = pricing_node(profile)
    ops_per_s = slowest.conv_ops_per_s
    per_byte = (slowest.send_byte_s + max(1.0 / profile.link.bandwidth_Bps, slowest.recv_byte_s)
                + (1.0 / slowest.other_ops_per_s + 1.0 / slowest.op_rate("other", "Concat")) / itemsize)
    sync_s = profile.link.latency_s + (slowest.send_s + slowest.recv_s + slowest.boundary_s(2) if boundary else slowest.segment_s)
    return ReceiveCost(sync_ops=sync_s * ops_per_s, byte_ops=per_byte * ops_per_s)


def kind_weights(profile: ClusterProfile) -> tuple[tuple[str, float], ...]:
    """Per op kind (cluster.OP_KINDS), what one of its operations costs in operations of a
    convolution, on the node `receive_cost` prices with (`pricing_node`): a depthwise
    convolution's operation costs the ratio of the two throughputs. recompute-halos weighs the
    extra operations of a recomputed halo by it."""
    slowest = pricing_node(profile)
    return tuple((kind, slowest.conv_ops_per_s / slowest.ops_per_s(kind)) for kind in OP_KINDS)


# Ops whose weights onnxruntime's CPU provider holds twice with its optimisations on: a
# convolution's NCHWc-reordered copy sits beside the weights mapped from the plan's file (a
# Gemm's or MatMul's prepacked copy replaces them instead).
DOUBLED_OPS = frozenset({"Conv"})


@dataclass(frozen=True)
class NodeMemory:
    """What a node's part of a plan holds, in bytes: the weights it reads, the part of them that
    onnxruntime copies (`DOUBLED_OPS`), and its live activations (the largest sum over one layer
    of the inputs it reads and the output it computes)."""

    weights: int
    doubled: int
    activations: int


@dataclass(frozen=True)
class MemoryCost:
    """What a plan needs of a node's memory (`cluster.memory_mb`): its weights, once (onnxruntime
    maps them from the plan's weights file) and, where `prepack`, the doubled ones again; its live
    activations; and `overhead_bytes` (onnxruntime's arena beyond the live values, its sessions,
    the values held between segments, the halo buffers). With prepacking off (session option
    disable_prepacking, graph optimisations without the NCHWc reordering) the kernels read the
    mapped weights as they are. bbgrap-run's own process (the interpreter and the onnxruntime,
    numpy and MPI libraries, the same for every plan) is not part of it: bbgrap-run reports it
    apart, as each rank's baseline."""

    prepack: bool
    overhead_bytes: float

    def of(self, m: NodeMemory) -> float:
        return m.weights + (m.doubled if self.prepack else 0) + m.activations + self.overhead_bytes


# onnxruntime's CPU provider with NCHW between segments, with and without its prepacked copies;
# the overheads measured on vgg16 and resnet50 on 4 ranks (docs/benchmarks.md, "memory per node")
CPU_MEMORY = MemoryCost(prepack=True, overhead_bytes=50e6)
CPU_MEMORY_UNPACKED = MemoryCost(prepack=False, overhead_bytes=20e6)
