"""A cluster profile: how fast each node computes and how fast the links between nodes are.

The simulator (`bbgrap/simulate.py`) turns a plan into predicted time with it, and
`bbgrap calibrate` measures one (`backends/calibrate.py`). A profile is a TOML file:

    [link]
    latency_s = 5e-05          # one message's fixed cost (s)
    bandwidth_Bps = 1e9        # bytes per second once it flows

    [[node]]                   # one table per node (MPI rank), in rank order
    host = "node-a"            # the host calibrate measured it on ("" or absent: not recorded)
    conv_ops_per_s = 2.5e10    # operations per second (bbgrap/cost.py's count) of a dense convolution
    depthwise_ops_per_s = 5e9  # ... of a depthwise convolution (one input channel per group)
    depthwise_elements_per_s = 0.0  # ... and output values per second it writes beyond them; 0: not measured
    grouped_ops_per_s = 5e9    # ... of a grouped convolution of a few input channels per group (simulate.FEW_PER_GROUP)
    pointwise_nchw_ops_per_s = 8e9  # ... of a 1x1 one of fewer input channels than a block (onnxruntime's NCHW-input kernel)
    matmul_ops_per_s = 2.5e10  # ... of Gemm / MatMul
    qconv_ops_per_s = 7.5e10   # ... of a dense convolution in an 8-bit integer kernel (a quantized model's QLinearConv)
    qconv_elements_per_s = 0.0 # ... and output values per second it writes beyond them; 0: not measured
    qconv_gemm_ops_per_s = 3e10  # ... of one onnxruntime runs as im2col and an integer GEMM (simulate.op_kind)
    qconv_gemm_elements_per_s = 0.0  # ... and output values per second it writes beyond them; 0: not measured
    qdepthwise_ops_per_s = 5e9 # ... of a depthwise convolution in one
    qdepthwise_elements_per_s = 0.0  # ... and output values per second it writes beyond them; 0: not measured
    qmatmul_ops_per_s = 7.5e10 # ... of a MatMul or Gemm in one (QLinearMatMul, QGemm)
    other_ops_per_s = 2.5e9    # ... of everything else (elementwise, pooling, crops and concats)
    weight_Bps = 4e9           # bytes per second a convolution or matmul streams its weights at
    cached_weight_Bps = 0.0    # ... the share of them the node's cache keeps (`kept`); 0: not measured, at weight_Bps
    conv_read_Bps = 0.0        # ... a convolution's piece reads its filters at beyond its operations; 0: not measured
    conv_op_s = 1e-05          # fixed cost of one ONNX op of each kind (s)
    depthwise_op_s = 1e-05
    grouped_op_s = 1e-05
    pointwise_nchw_op_s = 1e-05
    matmul_op_s = 1e-05
    qconv_op_s = 1e-05
    qconv_gemm_op_s = 1e-05
    qdepthwise_op_s = 1e-05
    qmatmul_op_s = 1e-05
    other_op_s = 5e-06
    concat_input_s = 0.0       # what a Concat costs for each value it joins, beside its op's and its values' (s); 0: not measured
    stream_ops_per_s = 0.0     # "other" operations per second of an op that reads and writes more than
    cache_bytes = 0.0          # ... this many bytes (beyond the core's cache); 0: no such regime measured
    segment_s = 5e-05          # fixed cost of one segment: an onnxruntime run through the executor (s)
    value_s = 1e-06            # fixed cost of each value a segment takes or gives (s)
    cold_segment_s = 0.0       # what a segment costs more where other segments ran since its last run (s)
    cold_s = 0.0               # ... and each of its ops and values (s)
    send_s = 5e-06             # what posting one message costs its sender (s)
    send_byte_s = 0.0          # ... and each of its bytes (s); 0: not measured
    recv_s = 0.0               # what taking one message that has been sent costs its receiver (s); 0: not measured
    recv_byte_s = 0.0          # ... and each of its bytes (s: on one host, the copy MPI makes when it is taken); 0: not measured
    wait_share = 0.0           # what each wait costs more, as a share of the segment the node ran before it (ranks' jitter); 0: not measured
    cpu_share = 1.0            # the share of its threads' time a CPU quota leaves the node; the figures above are slowed by it already
    quota_period_ms = 0.0      # ... and the quota's period, within which a rank that waited runs on (`quota_absorbs`); 0: Linux's 100 ms
    threads = 1                # the threads of the node's onnxruntime sessions, among which a blocked convolution's rows are dealt (`thread_stretch`)

With `bbgrap calibrate --model FILE`, the profile also holds what each node measured of that
model's own layers, and which file it was (a profile of another model's layers is not used for
this one: compile says so and falls back to the kinds' throughputs):

    [model]
    sha256 = "9f86d0..."       # the model file measured
    path = "resnet50.onnx"

    [[node]]
    ...
    [node.layers]              # seconds of each layer in the model run whole (its kernels, by onnxruntime's profiler)
    "layer1.0.conv1" = 0.00021
    [node.scaling]             # how a convolution's or matmul's time scales: [rows, channels] slopes
    "layer1.0.conv1" = [0.85, 0.7]

`bbgrap calibrate` also times a few "other" ops of their own (pooling, normalisation, activations,
a Mul, a Concat, a quantized model's DequantizeLinear and QuantizeLinear) and writes their throughputs apart,
each at the node's threads (some of onnxruntime's kernels use one thread however many the rank has);
an "other" op not listed runs at `other_ops_per_s`:

    [[node]]
    ...
    [node.other_ops]           # "other" operations per second of these op types (bbgrap/cost.py's count)
    MaxPool = 4.1e10
    LayerNormalization = 3.0e9
    "MaxPool on 8-bit NCHW" = 1.2e9  # a MaxPool on a quantized model's 8-bit values in NCHW (EIGHT_BIT_NCHW)
    "BatchNormalization in NCHW" = 9e9  # one onnxruntime runs on NCHW values, not blocked (IN_NCHW)
    DequantizeLinear = 9e9     # ... one of lowering's (around a layer run in float), per value it writes
    Concat = 1e10              # per value a Concat writes (onnxruntime copies on one thread)

A plan for more nodes than the profile lists uses the profile's last node for the rest
(a profile calibrated on one node describes a cluster of nodes like it).

Standard library only (the CLI reads a profile before importing anything heavy). Python
3.10 has no tomllib: tomli, as bbgrap/config.py uses. The writer is this module's own:
the format above is all it writes.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from bbgrap.ir import BBGrapError
from bbgrap.paths import written_whole

OP_KINDS = ("conv", "depthwise", "grouped", "pointwise_nchw", "matmul", "qconv", "qconv_gemm", "qdepthwise", "qmatmul", "other")
# the kinds of op an integer kernel of a quantized model runs (`simulate.op_kind`), and the float kind
# a profile written before they were measured prices them as (`_node`)
INTEGER_KINDS = {"qconv": "conv", "qconv_gemm": "conv", "qdepthwise": "depthwise", "qmatmul": "matmul"}
# the kinds whose output values cost time beyond their operations (`NodeProfile.element_time`): a
# kernel that writes each value after a few operations (a depthwise one's taps), or requantizes each
# (an integer convolution's)
ELEMENT_KINDS = ("depthwise", "qconv", "qconv_gemm", "qdepthwise")
# may be 0 (stream_ops_per_s and cache_bytes: 0 where calibrate saw no slower regime; the kinds'
# elements_per_s and conv_read_Bps: not measured); every other throughput must be positive
MAY_BE_ZERO = (*(f"{k}_op_s" for k in OP_KINDS), *(f"{k}_elements_per_s" for k in ELEMENT_KINDS), "segment_s", "value_s", "cold_segment_s", "cold_s", "send_s", "send_byte_s", "recv_s", "recv_byte_s", "wait_share", "latency_s", "stream_ops_per_s", "cache_bytes", "conv_read_Bps", "cached_weight_Bps", "concat_input_s", "quota_period_ms")
BYTES_MOVED = 8  # bytes an op that copies float32 values reads and writes per value (4 in, 4 out)
LAYERS = "layers"  # a node's table of measured layer times (NodeProfile.layer_s)
SCALING = "scaling"  # a node's table of how those times scale with a piece (NodeProfile.layer_scaling)
HOST = "host"  # a node's host name (NodeProfile.host)
OTHER_OPS = "other_ops"  # a node's table of "other" op types timed apart (NodeProfile.other_speeds)
THREADS = "threads"  # a node's threads (NodeProfile.threads): an integer, not a figure
DEFAULT_QUOTA_PERIOD_MS = 100.0  # Linux's CFS period, where a profile did not record its quota's


def thread_stretch(units: int, threads: int) -> float:
    """How much longer than its operations at the node's full speed a kernel takes whose work
    onnxruntime's MLAS deals out as `units` equal units, as evenly as whole units go, to `threads`
    threads (`simulate.conv_work_units`; MlasPartitionWork): the busiest thread's units over the
    average, threads x ceil(units / threads) / units; 1 where the units are not known (0) or one
    thread runs them all. On two threads a 3x3 convolution of one filter set over 7 output rows
    takes as long as over 8; on 16, over 7 rows it runs at 7/16 of the threads' speed."""
    if units <= 0 or threads <= 1:
        return 1.0
    return threads * math.ceil(units / threads) / units
# an op type's suffix in that table for the op on a quantized model's 8-bit values in NCHW, where
# onnxruntime runs a generic kernel (a MaxPool after a float op: many times its float speed); a
# table without it prices such an op as the op type
EIGHT_BIT_NCHW = " on 8-bit NCHW"
# ... for an op that runs in onnxruntime's blocked layout where its input is blocked (`Layout.KEEPS`:
# a BatchNormalization, as a blocked 1x1 convolution) and ran on NCHW values (`simulate.layout_reorders`),
# with its own kernel: a BatchNormalization's takes one thread however many the rank has; a table
# without it prices such an op as the op type
IN_NCHW = " in NCHW"


def base_op_type(op_type: str) -> str:
    """The ONNX op type of an entry of a node's table of "other" op types (`EIGHT_BIT_NCHW`, `IN_NCHW`)."""
    return op_type.removesuffix(EIGHT_BIT_NCHW).removesuffix(IN_NCHW)


def cache_hits(ratio: float) -> float:
    """The share of its reads a loop that touches `ratio` times as many bytes as its cache holds finds
    there, one pass after the other: all of them up to 1; beyond, a cache that evicts a line at random
    keeps a line through the misses of one pass (a share m of the loop: m x ratio cache sizes of lines)
    with the probability exp(-m x ratio), so the share h = 1 - m solves h = exp(-(1 - h) x ratio), the
    root below 1 (bisection: h - exp(-(1 - h) x ratio) is below 0 at 0 and rises through that root).
    Unlike an LRU cache's all or nothing, it falls continuously past the cache's size: 0.63 at 1.25
    times it, 0.20 at 2, 0.02 at 4."""
    if ratio <= 1.0:
        return 1.0
    low, high = 0.0, 1.0 - math.log(ratio) / ratio  # where h - exp(-(1 - h) x ratio) peaks, above 0
    for _ in range(60):
        mid = (low + high) / 2
        if mid < math.exp(-(1.0 - mid) * ratio):
            low = mid
        else:
            high = mid
    return low


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares intercept and slope of y over x: how calibrate fits a profile's figures from its
    measurements, and `calibrate --refine` a node's correction from a run's segments."""
    slope, intercept = np.polyfit(np.asarray(xs, dtype=float), np.asarray(ys, dtype=float), 1)
    return float(intercept), float(slope)


@dataclass(frozen=True)
class Scaling:
    """How a measured layer's time scales with the piece a node computes, along its rows (or
    positions, tokens) and along its output channels, each a line through the whole layer:
    a piece with a share `r` of the rows and `c` of the channels takes

        (1 - rows + rows * r) * (1 - channels + channels * c)

    of the whole layer's time. A slope under 1 is a part the cut does not shrink: along rows,
    the filter every row band streams again and the kernel's start; along channels, the lanes a
    blocked layout leaves empty when few channels are left (backends/scaling.py measures both)."""

    rows: float
    channels: float

    def share(self, weight_share: float, ops_share: float) -> float:
        """The part of the layer's whole time a piece reading `weight_share` of its weights (its
        channels' filters) and doing `ops_share` of its operations takes."""
        c = weight_share if weight_share > 0 else 1.0
        r = ops_share / c
        return (1.0 - self.rows + self.rows * r) * (1.0 - self.channels + self.channels * c)


@dataclass(frozen=True)
class NodeProfile:
    """One node's speed: operations per second and fixed cost per op for each kind of op; the fixed
    costs of a segment boundary (per segment, per value it takes or gives, per message and byte sent
    and taken)."""

    conv_ops_per_s: float = 2.5e10
    depthwise_ops_per_s: float = 5e9
    # a depthwise convolution writes each output value after a few operations (its kernel's taps), so
    # beside its operations each output value costs 1 / depthwise_elements_per_s: a 7 x 7 kernel does
    # 5.4 times a 3 x 3 one's operations in about twice the time; 0: not measured, operations only
    depthwise_elements_per_s: float = 0.0
    # a grouped convolution of a few input channels per group runs on another kernel than a
    # depthwise or a dense one, several times slower per operation than either (a profile written
    # before it was measured on its own gives it its depthwise figures: `_node`)
    grouped_ops_per_s: float = 5e9
    # a dense 1x1 convolution of fewer input channels than an NCHWc block (rules.base.NCHWC_BLOCK:
    # a narrow model's first expansions) runs on onnxruntime's kernel that takes its input in NCHW,
    # which does a third or less of the blocked kernel's operations per second and gains little from
    # more threads (`simulate.op_kind`; a profile written before it was measured on its own gives it
    # its conv figures: `_node`)
    pointwise_nchw_ops_per_s: float = 8e9
    matmul_ops_per_s: float = 2.5e10
    # a dense convolution or a MatMul in an 8-bit integer kernel (a quantized model's QLinearConv,
    # QLinearMatMul, QGemm): on a CPU with VNNI about three times the float kernel's operations per
    # second; each output value requantized beside its operations (1 / qconv_elements_per_s: a 1x1
    # convolution of few input channels takes more than its operations; 0: not measured); a
    # depthwise one on a kernel of its own, channels-last (a grouped one as in float: its kind prices
    # it); a dense one that kernel does not take (`simulate.op_kind`: a stem's three input channels)
    # as im2col and an integer GEMM, several times slower per operation, and more per output value
    qconv_ops_per_s: float = 7.5e10
    qconv_elements_per_s: float = 0.0
    qconv_gemm_ops_per_s: float = 3e10
    qconv_gemm_elements_per_s: float = 0.0
    qdepthwise_ops_per_s: float = 5e9
    qdepthwise_elements_per_s: float = 0.0
    qmatmul_ops_per_s: float = 7.5e10
    other_ops_per_s: float = 2.5e9
    # bytes of weights per second a convolution or matmul reads (from beyond the host's cache: the
    # weights of a model larger than it do not stay there from one inference to the next); the
    # default keeps the default node's 6 operations per byte, about what a CPU core's matmul
    # throughput and its share of memory bandwidth give (docs/design.md, "Roofline")
    weight_Bps: float = 4e9
    # ... and of the share of them the node's cache keeps (`kept`: a small model's whole classifier),
    # which a matmul of one row still reads at the cache's speed, not its operations'; 0: not
    # measured (a profile written before), every byte at weight_Bps
    cached_weight_Bps: float = 0.0
    # bytes per second a piece of a convolution reads beyond what its kind's throughput holds (its
    # filters from beyond the core's cache, `cost.extra_reads`), measured on a chain of convolutions
    # whose filters do not fit in the cache; 0: not measured, the default, and a byte costs
    # `OpTraits.read_ops` operations at the kind's throughput (`layer_time`)
    conv_read_Bps: float = 0.0
    conv_op_s: float = 1e-5
    depthwise_op_s: float = 1e-5
    grouped_op_s: float = 1e-5
    pointwise_nchw_op_s: float = 1e-5
    matmul_op_s: float = 1e-5
    qconv_op_s: float = 1e-5
    qconv_gemm_op_s: float = 1e-5
    qdepthwise_op_s: float = 1e-5
    qmatmul_op_s: float = 1e-5
    other_op_s: float = 5e-6
    # a Concat pays for each value it joins beside its fixed cost and the values it writes: onnxruntime
    # copies its inputs one after another, each with a cost of its own (a DenseNet block's Concat joins
    # up to 25); 0: not measured, the default
    concat_input_s: float = 0.0
    # an "other" op that reads and writes more than `cache_bytes` (BYTES_MOVED per value it writes)
    # moves the values beyond them at `stream_ops_per_s`, the core's cache no longer holding its
    # input and output (`streamed_s`); 0: every one at other_ops_per_s (calibrate saw no slower
    # regime; the default). A node reads from its cache the share of its filters that stays there from
    # one inference to the next (`kept`: all where its weights and the values it writes fit in it)
    stream_ops_per_s: float = 0.0
    cache_bytes: float = 0.0
    segment_s: float = 5e-5
    value_s: float = 1e-6
    # a segment that runs after other segments (a node's program of more than one) finds its
    # session's kernels, buffers and values gone from the core's cache: each op and each value it
    # takes or gives costs `cold_s` more than run alone, and the segment `cold_segment_s` more
    # (backends/boundary.py measures them; 0: not measured, the default)
    cold_segment_s: float = 0.0
    cold_s: float = 0.0
    # a message costs its sender send_s + bytes x send_byte_s (posting it, MPI's progress on it
    # before the next segment) and its receiver, once the message has been sent, recv_s + bytes x
    # recv_byte_s to take it (the MPI test that completes it; on one host, the copy MPI makes only
    # when the receiver asks: backends/boundary.py measures both); the per-byte parts 0: not
    # measured, the default, as is recv_s
    send_s: float = 5e-6
    send_byte_s: float = 0.0
    recv_s: float = 0.0
    recv_byte_s: float = 0.0
    # what a wait costs beyond the message's arrival and take, as a share of the segment the node ran
    # just before it: two ranks' segments vary from run to run, and the later of the two ends, which
    # the waiting rank waits for, comes on average after both means (backends/boundary.py measures it:
    # ranks in lockstep; 0: not measured, the default). A share, not a time: `faster` keeps it
    wait_share: float = 0.0
    # the share of its threads' time a CPU quota (a container's CPU limit) leaves the node, which
    # every time here is already divided by (`slowed`; 1: no quota)
    cpu_share: float = 1.0
    # ... and the quota's period (ms; 0: not recorded, Linux's default 100 ms): a rank that waits for
    # a message spends none of its quota, and may then run at its threads' full speed until the
    # period's share is spent, so a wait takes the place of some of the stops (`quota_absorbs`)
    quota_period_ms: float = 0.0
    # the threads of the node's onnxruntime sessions as calibrated (a CPU's; 1 on a GPU, or not
    # recorded): MLAS deals a blocked convolution's output rows to them in whole units, so a piece of
    # few rows keeps some of them idle (`thread_stretch`; the throughputs above are those of work
    # that keeps all of them busy)
    threads: int = 1
    # the host name the node was calibrated on (compile names the hosts a plan for fewer nodes runs on); "": not recorded
    host: str = ""
    # seconds of each layer of the calibrated model, whole (`bbgrap calibrate --model`); empty without
    layer_s: dict[str, float] = field(default_factory=dict, hash=False)
    # how some of them scale along rows and channels (`Scaling`); a measured layer without: in proportion to its operations
    layer_scaling: dict[str, Scaling] = field(default_factory=dict, hash=False)
    # "other" operations per second of the op types calibrate times apart (an LN or a pooling window
    # runs at several times or a fraction of an Add's speed per operation); the rest at other_ops_per_s
    other_speeds: dict[str, float] = field(default_factory=dict, hash=False)

    def ops_per_s(self, kind: str) -> float:
        """Throughput for one of OP_KINDS."""
        return float(getattr(self, f"{kind}_ops_per_s"))

    def op_rate(self, kind: str, op_type: str = "") -> float:
        """Operations per second of an op of `kind` and ONNX `op_type`: an "other" op type timed
        apart at its own speed (`other_speeds`; one on 8-bit NCHW values, `EIGHT_BIT_NCHW`, or run on
        NCHW values where it could run blocked, `IN_NCHW`, at the op type's where not timed so), else
        its kind's throughput."""
        if kind != "other":
            return self.ops_per_s(kind)
        return self.other_speeds.get(op_type, self.other_speeds.get(base_op_type(op_type), self.other_ops_per_s))

    def weight_seconds_per_byte(self, kept: float) -> float:
        """What a byte of weights costs a convolution or matmul to read where the node's cache keeps
        `kept` of them: that share at `cached_weight_Bps` (where measured), the rest at `weight_Bps`."""
        if not self.cached_weight_Bps:
            return 1.0 / self.weight_Bps
        return (1.0 - kept) / self.weight_Bps + kept / self.cached_weight_Bps

    def op_s(self, kind: str) -> float:
        """Fixed cost of one op of one of OP_KINDS."""
        return float(getattr(self, f"{kind}_op_s"))

    def faster(self, speed: float, fixed: bool = True) -> NodeProfile:
        """This node `speed` times as fast: every throughput (`*_per_s`, `weight_Bps`) times
        `speed`, every measured layer's time over it, and with `fixed` every fixed time (`*_s`)
        over it too; the cache and the layers' scaling as they are."""
        changes: dict[str, Any] = {f.name: getattr(self, f.name) * speed for f in fields(self) if f.name.endswith("_per_s") or f.name.endswith("Bps")}
        if fixed:
            changes.update({f.name: getattr(self, f.name) / speed for f in fields(self)
                            if f.name.endswith("_s") and not f.name.endswith("_per_s") and isinstance(getattr(self, f.name), float)})
        return replace(self, **changes, layer_s={k: v / speed for k, v in self.layer_s.items()},
                       other_speeds={k: v * speed for k, v in self.other_speeds.items()})

    def slowed(self, share: float) -> NodeProfile:
        """This node with `share` of its time (a CPU quota's): every throughput and time as
        `faster(share)` makes them; `cpu_share` records it."""
        return replace(self.faster(share), cpu_share=self.cpu_share * share)

    def quota_absorbs(self) -> float:
        """The most waiting a CPU quota lets this node carry into its next segments as time not
        stopped: in one period a rank may run `cpu_share` of it, so it is stopped for the rest, unless
        it waited for part of it (then it ran at full speed for that much longer): the period's
        stopped share, (1 - cpu_share) x the period; 0 without a quota."""
        if self.cpu_share >= 1.0:
            return 0.0
        return (1.0 - self.cpu_share) * (self.quota_period_ms or DEFAULT_QUOTA_PERIOD_MS) * 1e-3

    def send_time(self, nbytes: int) -> float:
        """Seconds this node spends sending a message of `nbytes`."""
        return self.send_s + nbytes * self.send_byte_s

    def take_time(self, nbytes: int) -> float:
        """Seconds this node spends taking a message of `nbytes` that has been sent, from the moment it asks for it."""
        return self.recv_s + nbytes * self.recv_byte_s

    def taken(self, ready: float, arrival: float, nbytes: int) -> float:
        """When this node, free at `ready` and asking then for a message of `nbytes` that arrives at
        `arrival` (`LinkProfile.message_s` after its post), has it: its take (`take_time`) runs from
        `ready`, and ends no sooner than `recv_s` after the arrival. On one host the link's transfer
        and the receiver's copy are the same time: a receiver that asks early pays the transfer,
        one that asks late the copy."""
        return max(ready + self.take_time(nbytes), arrival + self.recv_s)

    def boundary_s(self, pieces: int) -> float:
        """Fixed seconds of a segment boundary where a node takes `pieces` values and concatenates
        them with its own: `segment_s` and `cold_segment_s`, `value_s` and `cold_s` for each piece,
        and `cold_s` and `concat_input_s` for each value the concat joins (the planners' price of a
        receive; the simulator prices a lowered plan's segments one by one)."""
        return self.segment_s + self.cold_segment_s + pieces * (self.value_s + self.cold_s) + self.cold_s \
            + (pieces + 1) * self.concat_input_s

    def streamed_s(self, values: float) -> float:
        """Seconds beyond its "other" operations' an op that writes `values` values (a crop, a concat,
        a value handed from one segment to the next) takes where they and its input do not fit in
        `cache_bytes`: the values beyond what the cache holds (`cache_bytes` over BYTES_MOVED) move
        at `stream_ops_per_s`, the rest at the in-cache speed. Not all of them: a copy just past
        the cache finds most of its input where the op before left it, and its time grows
        continuously with its size, not in a step at `cache_bytes` (docs/benchmarks.md, session 30)."""
        if not self.cache_bytes or not self.stream_ops_per_s:
            return 0.0
        beyond = values - self.cache_bytes / BYTES_MOVED
        return max(0.0, beyond) * max(0.0, 1.0 / self.stream_ops_per_s - 1.0 / self.other_ops_per_s)

    def kept(self, working_set: float) -> float:
        """The share of `working_set` bytes (`simulate.working_set`: a node's weights and every value it
        writes in an inference) that this node's cache still holds when the next inference reads them
        again: all of it where it fits in `cache_bytes` (its convolutions find their filters there, as
        calibrate's probes do), else `cache_hits` of its size over the cache's; 0 where calibrate
        found no `cache_bytes`."""
        if not self.cache_bytes or working_set <= 0.0:
            return 0.0
        return cache_hits(working_set / self.cache_bytes)

    def moved_s(self, values: float, op_type: str = "") -> float:
        """Seconds to copy `values` values: one "other" operation each (at the speed of `op_type`
        where the node timed it apart: `op_rate`), and beyond the cache `streamed_s` (a value
        handed from one segment's session to the next)."""
        return values / self.op_rate("other", op_type) + self.streamed_s(values)

    def copy_s(self, values: float, op_type: str = "", joined: int = 0) -> float:
        """Seconds of an op that copies `values` values (a crop, a concat of `joined` values, a
        layout reorder; a quantized model's DequantizeLinear or QuantizeLinear of lowering's,
        `op_type`, at its own speed where timed): an "other" op's fixed cost, `moved_s` and
        `concat_input_s` for each value it joins."""
        return self.other_op_s + self.moved_s(values, op_type) + joined * self.concat_input_s

    def element_time(self, kind: str, elements: float) -> float:
        """Seconds an op of `kind` takes to write `elements` output values beyond its operations: for
        one of ELEMENT_KINDS its `{kind}_elements_per_s` (0: not measured, nothing); for an "other"
        op (an activation, a normalisation, an elementwise Mul) whose values no longer fit in the
        core's cache, what those beyond it take at `stream_ops_per_s` beyond the in-cache throughput its
        operations are priced at (`streamed_s`: its throughput is measured on maps in the cache,
        and a GELU over a 56 x 56 x 384 map moves 5 MB); no other kind's."""
        if kind == "other":
            return self.streamed_s(elements)
        rate = float(getattr(self, f"{kind}_elements_per_s")) if kind in ELEMENT_KINDS else 0.0
        return elements / rate if rate else 0.0

    def layer_time(self, name: str, kind: str, ops: float, whole_ops: float, weight_share: float = 1.0,
                   weight_bytes: float = 0.0, elements: float = 0.0, fused_values: float = 0.0, chained: bool = False,
                   op_type: str = "", reorders: Sequence[float] = (), reads: float = 0.0, read_ops: float = 0.0,
                   kept: float = 0.0, joined: int = 0, units: int = 0, whole_units: int = 0) -> float:
        """Seconds for `ops` operations of layer `name` (of OP_KINDS `kind`; `whole_ops` for its whole
        output), reading `weight_share` of its `weight_bytes` of weights and writing `elements`
        output values, and `fused_values` for the ops onnxruntime fuses into it that take a pass
        over its output (a Clip; not a ReLU or a residual Add in a blocked kernel, `OpTraits.in_kernel`):
        one "other" operation each. Where the layer was measured
        (its time holds its fused ops'): its kind's fixed cost (at most the measured time: a piece
        is one more op in a segment) plus the rest of the measured time scaled by its `Scaling`
        where measured too, else in proportion to the operations. Else a roofline: a convolution
        or matmul takes its operations at its kind's throughput (with what its output values cost
        beyond them, `element_time`, and its fused ops' values) or its weights (`weight_seconds_per_byte`:
        the share `kept` in the node's cache at `cached_weight_Bps`, the rest at `weight_Bps`), whichever is
        longer (a classifier's Gemm on one image is all weights: cutting its output channels halves them,
        cutting rows does not), plus its kind's fixed cost; a `chained` op (computed in the kernel of
        the op after it, `simulate.chained_layers`) only its operations, at its kind's throughput:
        inside a fused kernel an erf or a sigmoid is a few vector instructions on values at hand, not
        its own kernel's pass (onnxruntime's Gelu and QuickGelu kernels measured at that speed,
        docs/benchmarks.md, session 27). Any other "other" op of an ONNX `op_type` the node timed
        apart runs at that speed (`op_rate`). Each of the layout reorders onnxruntime adds for it
        (`simulate.layout_reorders`: the values each moves) costs what a copy of that many values
        does (`copy_s`); a measured layer's time holds them already (its run's reorders, shared
        among the layers). Of `ops`, `read_ops` are the bytes the piece `reads` beyond its throughput
        (`cost.extra_reads`) priced as operations (`OpTraits.read_ops` a byte, a constant fitted on
        one CPU); where the node measured `conv_read_Bps` they take that long instead; and nothing
        for the share of them `kept` in the node's cache from the inference before (`NodeProfile.kept`).
        A Concat that joins `joined` values pays `concat_input_s` for each beside its operations.
        A blocked convolution whose piece MLAS deals to the node's threads as `units` work units
        (`simulate.conv_work_units`; `whole_units` for the whole layer) takes its operations
        `thread_stretch` times as long as the throughput gives, the busiest thread's share; a measured
        layer's piece scaled in proportion to its operations by its stretch over the whole layer's."""
        measured = self.layer_s.get(name)
        if measured is None:
            reordered = math.fsum(self.copy_s(v) for v in reorders)
            if chained:
                return ops / self.ops_per_s(kind) + reordered
            rate = self.op_rate(kind, op_type)
            streamed = weight_share * weight_bytes * self.weight_seconds_per_byte(kept) if kind != "other" else 0.0
            read = (1.0 - kept) * (reads / self.conv_read_Bps if self.conv_read_Bps and read_ops else read_ops / rate)
            computed = (ops - read_ops) / rate * thread_stretch(units, self.threads) + read + self.element_time(kind, elements) \
                + fused_values / self.other_ops_per_s
            return max(computed, streamed) + self.op_s(kind) + reordered + joined * self.concat_input_s
        ops_share = ops / whole_ops if whole_ops > 0 else 1.0
        scaling = self.layer_scaling.get(name)
        fixed = min(self.op_s(kind), measured)
        if scaling is not None:
            return fixed + (measured - fixed) * scaling.share(weight_share, ops_share)
        return fixed + (measured - fixed) * ops_share * thread_stretch(units, self.threads) / thread_stretch(whole_units, self.threads)


@dataclass(frozen=True)
class LinkProfile:
    """Every link between two nodes: a message of b bytes takes latency_s + b / bandwidth_Bps."""

    latency_s: float = 5e-5
    bandwidth_Bps: float = 1e9

    def message_s(self, nbytes: int) -> float:
        return self.latency_s + nbytes / self.bandwidth_Bps


@dataclass(frozen=True)
class ClusterProfile:
    nodes: tuple[NodeProfile, ...] = (NodeProfile(),)
    link: LinkProfile = LinkProfile()
    source: str = "<default>"
    model_sha256: str = ""  # the model whose layers the nodes' layer_s hold ("" where none)
    model_path: str = ""

    def for_model(self, sha256: str) -> ClusterProfile:
        """This profile for the model with that file hash: without the layer times where they were
        measured on another model (a layer named alike there says nothing of this one)."""
        if not self.model_sha256 or self.model_sha256 == sha256:
            return self
        return replace(self, nodes=tuple(replace(n, layer_s={}, layer_scaling={}) for n in self.nodes), model_sha256="", model_path="")

    def node(self, n: int) -> NodeProfile:
        """Node n's profile (the last one listed where the profile lists fewer)."""
        return self.nodes[min(n, len(self.nodes) - 1)]

    def subset(self, nodes: tuple[int, ...]) -> ClusterProfile:
        """The cluster of these of its nodes, in this order (a plan for fewer nodes than the profile's)."""
        return replace(self, nodes=tuple(self.node(n) for n in nodes))


def with_speeds(profile: ClusterProfile, speeds: tuple[float, ...]) -> ClusterProfile:
    """`profile`'s first node for every node, its throughputs times the node's relative speed (the
    default profile for a cluster known only by its --speeds)."""
    scaled = tuple(profile.nodes[0].faster(s, fixed=False) for s in speeds)
    return ClusterProfile(scaled, profile.link, f"{profile.source} with speeds {','.join(f'{s:g}' for s in speeds)}")


# Roughly the hand weights elsewhere: recompute-halos' 1e5 operations per microsecond and
# 50 us per receive point, the search's data_w = 100 (a ~1 GB/s link beside ~25 GFLOP/s nodes).
DEFAULT_PROFILE = ClusterProfile()


PROFILE_RANGE = (1e-18, 1e18)  # a profile's non-zero numbers (seconds, bytes/s, ops/s): beyond it a typo, whose inverse overflows sums


def _number(source: str, where: str, key: str, value: Any, positive: bool) -> float:
    low, high = PROFILE_RANGE
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 or (positive and value == 0)
            or (value != 0 and not low <= value <= high)):
        kind = "a positive number" if positive else "a number >= 0"
        raise BBGrapError(f"{source}: '{where}.{key}' must be {kind} (if not 0, from {low:g} to {high:g}), got {value!r}")
    return float(value)


def _table(source: str, where: str, table: Any, cls: type) -> dict[str, float]:
    """The numeric fields of `cls` from one TOML table (missing ones keep their defaults); unknown keys refused."""
    if not isinstance(table, dict):
        raise BBGrapError(f"{source}: '{where}' must be a table")
    names = {f.name for f in fields(cls) if f.type in ("float", float)}
    unknown = sorted(set(table) - names)
    if unknown:
        raise BBGrapError(f"{source}: unknown key '{where}.{unknown[0]}' (known: {', '.join(sorted(names))})")
    return {k: _number(source, where, k, v, positive=k not in MAY_BE_ZERO) for k, v in table.items()}


def _node(source: str, k: int, table: Any) -> NodeProfile:
    """One [[node]] table, with its optional [node.layers] table of layer times."""
    where = f"node[{k}]"
    if not isinstance(table, dict):
        raise BBGrapError(f"{source}: '{where}' must be a table")
    rest = {key: v for key, v in table.items() if key not in (LAYERS, SCALING, HOST, OTHER_OPS, THREADS)}
    # written before grouped convolutions, 1x1 ones on NCHW input or integer kernels were measured: priced as depthwise or as float then
    for kind, then in (("grouped", "depthwise"), ("pointwise_nchw", "conv"), *INTEGER_KINDS.items()):
        for field_name in ("ops_per_s", "op_s", *(("elements_per_s",) if kind in ELEMENT_KINDS else ())):
            if f"{kind}_{field_name}" not in rest and f"{then}_{field_name}" in rest:
                rest[f"{kind}_{field_name}"] = rest[f"{then}_{field_name}"]
    threads = table.get(THREADS, 1)
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise BBGrapError(f"{source}: '{where}.{THREADS}' must be a whole number of at least 1, the node's threads (calibrate writes it)")
    host = table.get(HOST, "")
    if not isinstance(host, str):
        raise BBGrapError(f"{source}: '{where}.{HOST}' must be a string, the node's host name")
    layers = table.get(LAYERS, {})
    if not isinstance(layers, dict):
        raise BBGrapError(f"{source}: '{where}.{LAYERS}' must be a table of layer name = seconds")
    times = {name: _number(source, f"{where}.{LAYERS}", json.dumps(name), v, positive=False) for name, v in layers.items()}
    others = table.get(OTHER_OPS, {})
    if not isinstance(others, dict):
        raise BBGrapError(f"{source}: '{where}.{OTHER_OPS}' must be a table of op type = operations per second")
    speeds = {op: _number(source, f"{where}.{OTHER_OPS}", op, v, positive=True) for op, v in others.items()}
    return NodeProfile(**_table(source, where, rest, NodeProfile), threads=threads, host=host, layer_s=times,
                       layer_scaling=_scaling(source, f"{where}.{SCALING}", table.get(SCALING, {}), times), other_speeds=speeds)


def _scaling(source: str, where: str, table: Any, times: dict[str, float]) -> dict[str, Scaling]:
    """A [node.scaling] table: per measured layer its [rows, channels] slopes, each in [0, 1]."""
    if not isinstance(table, dict):
        raise BBGrapError(f"{source}: '{where}' must be a table of layer name = [rows, channels]")
    out = {}
    for name, v in table.items():
        key = f"{where}.{json.dumps(name)}"
        if not isinstance(v, list) or len(v) != 2:
            raise BBGrapError(f"{source}: '{key}' must be [rows, channels], two slopes from 0 to 1")
        slopes = [_number(source, where, json.dumps(name), x, positive=False) for x in v]
        if max(slopes) > 1:
            raise BBGrapError(f"{source}: '{key}' must be [rows, channels], two slopes from 0 to 1, got {v!r}")
        if name not in times:
            raise BBGrapError(f"{source}: '{key}' is for a layer without a time in [node.{LAYERS}]; calibrate again with --model FILE")
        out[name] = Scaling(*slopes)
    return out


def _model(source: str, table: Any) -> tuple[str, str]:
    """The [model] table: the sha256 (64 hex digits) and path of the model whose layers were measured."""
    if not isinstance(table, dict) or set(table) - {"sha256", "path"} or not isinstance(table.get("sha256"), str) \
            or len(table["sha256"]) != 64 or set(table["sha256"].lower()) - set("0123456789abcdef") \
            or not isinstance(table.get("path", ""), str):
        raise BBGrapError(f"{source}: '[model]' must hold sha256 = the model file's 64 hex digits and optionally its path")
    return table["sha256"], table.get("path", "")


def profile_from_dict(data: dict[str, Any], source: str) -> ClusterProfile:
    unknown = sorted(set(data) - {"node", "link", "model"})
    if unknown:
        raise BBGrapError(f"{source}: unknown table '{unknown[0]}' (known: link, model, node)")
    nodes = data.get("node")
    if not isinstance(nodes, list) or not nodes:
        raise BBGrapError(f"{source}: no [[node]] table; a profile lists at least one node")
    parsed = tuple(_node(source, k, t) for k, t in enumerate(nodes))
    sha, path = _model(source, data["model"]) if "model" in data else ("", "")
    if any(n.layer_s for n in parsed) and not sha:
        raise BBGrapError(f"{source}: layer times without a [model] table saying which model they are of; "
                          "calibrate again with --model FILE")
    return ClusterProfile(parsed, LinkProfile(**_table(source, "link", data.get("link", {}), LinkProfile)), source, sha, path)


def read_profile(path: str) -> ClusterProfile:
    """The profile in TOML file `path`; every problem is one BBGrapError line naming the file."""
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise BBGrapError(f"--profile {path}: cannot read it ({exc.strerror or type(exc).__name__})") from None
    except tomllib.TOMLDecodeError as exc:
        raise BBGrapError(f"--profile {path}: not valid TOML ({exc})") from None
    except UnicodeDecodeError:
        raise BBGrapError(f"--profile {path}: not UTF-8 text, so not a profile; give the TOML file bbgrap calibrate wrote") from None
    return profile_from_dict(data, path)


def profile_toml(profile: ClusterProfile, comment: str = "") -> str:
    """The profile as TOML text (the format in the module docstring)."""
    lines = [f"# {line}" for line in comment.splitlines()]
    if profile.model_sha256:
        lines += ["[model]", f"sha256 = {json.dumps(profile.model_sha256)}", f"path = {json.dumps(profile.model_path, ensure_ascii=False)}", ""]
    lines += ["[link]", *(f"{f.name} = {getattr(profile.link, f.name)!r}" for f in fields(LinkProfile))]
    for node in profile.nodes:
        lines += ["", "[[node]]", *([f"{HOST} = {json.dumps(node.host, ensure_ascii=False)}"] if node.host else []),
                  *(f"{f.name} = {getattr(node, f.name)!r}" for f in fields(NodeProfile)
                    if f.name not in (HOST, "layer_s", "layer_scaling", "other_speeds"))]
        if node.other_speeds:
            lines += [f"[node.{OTHER_OPS}]", *(f"{json.dumps(k)} = {v!r}" for k, v in node.other_speeds.items())]
        # a TOML basic string is JSON's, with characters beyond ASCII written as they are
        if node.layer_s:
            lines += [f"[node.{LAYERS}]", *(f"{json.dumps(k, ensure_ascii=False)} = {v!r}" for k, v in node.layer_s.items())]
        if node.layer_scaling:
            lines += [f"[node.{SCALING}]", *(f"{json.dumps(k, ensure_ascii=False)} = [{s.rows!r}, {s.channels!r}]"
                                              for k, s in node.layer_scaling.items())]
    return "\n".join(lines) + "\n"


def write_profile(path: str, profile: ClusterProfile, comment: str = "") -> None:
    """Write the profile to `path` whole or not at all."""
    with written_whole(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        fh.write(profile_toml(profile, comment))
