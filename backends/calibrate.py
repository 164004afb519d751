"""`bbgrap calibrate`: every node measures itself, rank 0 writes the cluster profile.

Run as `mpirun -n N bbgrap calibrate -o cluster.toml` (one rank per node, as bbgrap-run
runs a plan), or `bbgrap calibrate -o cluster.toml` for one node. Each rank, with the
threads, session options and provider bbgrap-run would give it (backends/threads.py, engine.py;
`--provider cuda`: on the rank's GPU, its values bound to the device as a plan's runner binds
them, `engine.Target`; layer times, `--model`, only on the CPU, whose profiler they come from):

* **a segment boundary** as bbgrap-run pays it (backends/boundary.py): chains of distinct
  one-element segments run through the executor give the fixed cost per segment (`segment_s`),
  per value a segment takes or gives (`value_s`) and, under mpirun with more than one rank,
  what a message of 4 B to 512 KB costs its sender to post (`send_s` + bytes x `send_byte_s`)
  and its receiver, busy elsewhere while it came, to take (`recv_s` + bytes x `recv_byte_s`;
  `message_fields`; one node keeps the defaults), and what a wait costs as ranks' segments vary
  (`wait_share`: ranks in lockstep, `wait_share` fits them); and what each op and value
  of a segment costs more where the node runs other segments between two of its runs, as a
  plan's node does (`cold_segment_s` and `cold_s`: two chains of CNN-shaped segments with their
  weights, in sequence against each alone);
* **throughput and fixed cost per kind of op** (bbgrap/cluster.py's OP_KINDS): for each kind
  (a 3x3 convolution, a depthwise convolution of 3x3 and of 7x7 kernels, a grouped 3x3 one of
  FEW_PER_GROUP channels per group, a 1x1 one of 8 and of 12 input channels, which onnxruntime
  runs on its kernel that takes NCHW input (`pointwise_nchw_probe`: side by side on one input,
  summed), a MatMul of MATMUL_ROWS rows, each of a chain by its own weights; in a quantized
  model's QDQ pattern, which onnxruntime runs as an integer kernel (`quantized_chain`: QLinearConv, QLinearMatMul), a dense convolution of 1x1 and 3x3 kernels on
  its direct kernel, one of 30 input channels (3x3 and 7x7), which it runs as im2col and a GEMM, a
  depthwise one of 3x3 and 5x5 kernels and the MatMul; an Add) probes at three to five sizes each, from
  small feature maps to large, each timed as one op and as a chain of CHAIN: one op's share of
  the chain beyond the first (`marginal_time`) is what an op costs inside a model, without the
  session's run and the layout reorders a lone convolution pays. The line through (operations,
  time) gives 1 / throughput as its slope; for the kinds of ELEMENT_KINDS (the depthwise and
  integer convolutions), whose two kernel sizes write alike output values for operations several
  times apart, a plane through (operations, values, time) also gives what each output value costs
  (`depthwise_elements_per_s` and the like). The op's fixed
  cost is what a tiny one of its kind (a 4x4 map of 8 channels; for "other" an Add of 64
  values) takes in a chain beyond its operations at that throughput. A few "other" op types
  (OTHER_TIMED: 3x3 pools, LayerNormalization, Softmax, Sigmoid, Erf, Mul, LRN) are timed
  so too, each its throughput apart (`NodeProfile.other_speeds`): per operation a pool runs
  several times an Add's speed and a LayerNormalization a fraction of it; a MaxPool on 8-bit
  values in NCHW (EIGHT_BIT_TIMED, `eight_bit_probe`), onnxruntime's generic kernel; a
  BatchNormalization on NCHW values (IN_NCHW_TIMED), its own kernel, not the blocked one; and a
  quantized model's DequantizeLinear and QuantizeLinear (QDQ_TIMED, `qdq_probe`); a Concat,
  its values and apart what each value it joins costs (`concat_speed`, `concat_input_s`). Each at the
  node's threads: some of these kernels use one thread however many the rank has. A node of
  several threads times all of them, and the copies below, twice, at the start and after the
  rest, each probe at the faster (`FastestTimes`): a host may slow a process of several threads
  for seconds at a time (a shared VM's; the NCHW-input kernel by half or more), and a plan's
  runs, too, count their fastest;
* **copies beyond the cache**: an Add over 2^15 to 2^22 values; the time each further value
  takes between one size and the next (the slope) jumps once an op's input and output no longer
  fit in the core's cache. Where it reaches STREAM_JUMP times the smaller sizes' slope, the last
  size before is `cache_bytes` and the slope over the two largest sizes gives `stream_ops_per_s`:
  a crop, concat or handed value larger moves its values beyond the cache at that speed
  (`NodeProfile.streamed_s`). A node of several threads sweeps at one thread too, for `cache_bytes`
  (`stream_regime`, with NumPy's Add, `one_thread_add`: a process on onnxruntime's process-wide pool
  can make no session of one thread): its threads split the larger Adds, which hides the step (two
  threads on the 2-core machine saw none), and the cache's size does not depend on them. A node
  reads from its cache the share of its filters it keeps there from one inference to the next
  (`NodeProfile.kept`: all where its weights and the values it writes in an inference fit);
* **how fast weights stream**: a MatMul of one row by 64 MB of weights, all weights and few
  operations as a classifier's Gemm on one image, gives `weight_Bps`, and one by 8 MB, which stay
  in a host's last-level cache from one run to the next, `cached_weight_Bps` (the simulator prices
  a convolution or matmul by the longer of its operations and its weights, the share of them the
  node's cache keeps at the second: `NodeProfile.layer_time`);
* **what reading filters costs**: a chain of READ_CHAIN convolutions on a small map, each with its
  own filters, more of them than a host's cache holds, gives `conv_read_Bps` (`read_speed`): the
  bytes a piece of a convolution reads beyond its throughput (`cost.extra_reads`) at that speed;
* **the given model's layers** (with `--model FILE`): the model run whole, as onnxruntime runs
  it (its fusions, its blocked layout), under onnxruntime's profiler; each kernel's time goes to
  the layer it is named after, or for an op fused into a convolution (a BatchNormalization, an
  activation, a residual Add) to that convolution, less the profiler's own cost per kernel
  (`profiler_cost`: a chain of tiny kernels profiled and not), and the times are scaled to add up
  to the model's run without the profiler (`measure_layers`). The simulator then prices a layer this
  node measured by its measurement instead of its kind's throughput (`NodeProfile.layer_time`):
  an op the microbenchmarks do not describe (a Softmax on an odd shape, a 1x1 convolution on a 7x7 map)
  costs what it costs here. For each convolution and constant-weight MatMul or Gemm it also
  measures how that time scales along rows and along output channels (backends/scaling.py:
  the layer alone, whole and on half its rows and half its output channels), so a half map
  of a small convolution costs what it does. The profile records the model file's hash, and compile
  uses the layer times only for that model;
* **the link** (ranks 0 and 1, all links taken alike): ping-pong at several sizes, half a
  round trip per size: the smallest message's time is the latency, the slope of time over
  bytes (least squares) 1 / the bandwidth. With one node nothing is
  measured and the default link is written.

All ranks measure at once, as they would compute at once. Every time is the fastest of
REPEAT runs after a warm-up (on a shared host other jobs only ever slow a run down); the
whole takes a few seconds. A node under a CPU quota (a container's CPU limit) takes at most the
quota's whole cores as threads, times its runs without the quota's stops and divides every time
by the share of its threads' time the quota leaves them (`NodeProfile.slowed`, `cpu_share`;
backends/cpu_quota.py). The boundary chains, each far shorter than a quota's period, are timed
on the wall clock.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import re
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import onnx
from bbgrap.backends.boundary import Lockstep, Message, measure_boundary, measure_cold
from bbgrap.backends.cpu_quota import WALL, BusyClock, CpuQuota, cpu_quota
from bbgrap.backends.devices import device_for_rank, visible_devices
from bbgrap.backends.engine import CPU_TARGET, Target, first_line, quiet_onnxruntime, session_options, target_for
from bbgrap.backends.probe_models import float_model
from bbgrap.backends.scaling import measure_scaling
from bbgrap.backends.threads import PROCESS_THREAD_POOL, host_ranks, threads_per_rank
from bbgrap.backends.transports import allgather, poll
from bbgrap.frontends.onnx import Frontend, import_proto, load_model, name_nodes
from onnx import helper

from bbgrap.cluster import (
    BYTES_MOVED,
    DEFAULT_PROFILE,
    EIGHT_BIT_NCHW,
    ELEMENT_KINDS,
    IN_NCHW,
    OP_KINDS,
    ClusterProfile,
    LinkProfile,
    NodeProfile,
    fit_line,
    thread_stretch,
    write_profile,
)
from bbgrap.ir import BBGrapError, Graph, Layer
from bbgrap.plan import file_sha256
from bbgrap.rules.base import NCHWC_BLOCK
from bbgrap.rules.registry import RuleRegistry, default_registry
from bbgrap.simulate import FEW_PER_GROUP, blocked_units, fusion_anchor

REPEAT = 15
LAYER_RUNS = 12  # profiled runs of a model (calibrate --model) after a warm-up; each layer's time: its fastest
MODEL_TIMED_S = 0.25  # the model's run without the profiler: the fastest of LAYER_RUNS runs or of this long, whichever is more
CHAIN_TIMED_S = 0.05  # profiler_cost's chains of tiny Sigmoids without the profiler: runs of a few microseconds, timed this long
STREAM_SIZES = tuple(2**k for k in range(15, 23))  # values of the Adds that find where copies leave the cache
STREAM_JUMP = 1.5  # a further value costing this many times the in-cache slope: beyond the cache
# weights_model's: beyond a host's last-level cache (twice the 32 MB of the 2-core machine's: a loop
# of them keeps next to nothing there), as a large model's weights are from one inference to the next
WEIGHT_PROBE_BYTES = 64 * 2**20
# ... and as a small model's are, in that cache but beyond a core's own (`cached_weight_Bps`)
CACHED_WEIGHT_BYTES = 8 * 2**20
PING_BYTES = (8, 64 * 1024, 512 * 1024, 2 * 1024 * 1024)


@dataclass(frozen=True)
class Probe:
    """A probe of one kind of op: `build(chain)` makes a model of `chain` such ops (in sequence, each
    on the one before's output, but for `eight_bit_probe`); `ops` and `elements` are one op's
    operations (bbgrap/cost.py's count) and output values; `units` the work units its kernel deals
    among the node's threads (`simulate.conv_work_units`; 0: not known)."""

    build: Callable[[int], onnx.ModelProto]
    ops: float
    elements: float
    units: int = 0

    def priced_ops(self, threads: int) -> float:
        """Its operations as `threads` threads run them: stretched by the idle threads' share of its
        last units (`cluster.thread_stretch`), as the simulator prices a piece (a probe of 7 rows of one
        filter set keeps 9 of 16 threads idle: its time says 16 threads' speed only once so stretched)."""
        return self.ops * thread_stretch(self.units, threads)


def _chain(op: str, shape: tuple[int, ...], constants: Mapping[str, np.ndarray], chain: int, opset: int = 13, **attrs: Any) -> onnx.ModelProto:
    """`chain` ops `op`, each on the one before's output and the `constants` (its further inputs, in
    order), from an input of `shape` to an output of the same shape."""
    nodes = [helper.make_node(op, ["x" if i == 0 else f"y{i - 1}", *constants], [f"y{i}"], **attrs) for i in range(chain)]
    return float_model(nodes, {"x": shape}, {f"y{chain - 1}": shape}, constants, opset=opset)


def conv_ops(channels: int, size: int, per_group: int, kernel: int = 3, width: int | None = None) -> float:
    """Operations of one of `conv_model`'s convolutions (bbgrap/cost.py's count)."""
    return 2.0 * per_group * kernel * kernel * channels * size * (size if width is None else width)


def conv_model(channels: int, size: int, per_group: int, kernel: int = 3, chain: int = 1,
               width: int | None = None) -> tuple[onnx.ModelProto, float]:
    """`chain` kernel x kernel convolutions of `per_group` input channels per group (1: depthwise;
    `channels`: dense), padded, so every output is size x size (size x `width` where given); and
    one's operations."""
    model = _chain("Conv", (1, channels, size, size if width is None else width), {"w": conv_weights(channels, per_group, kernel)}, chain,
                   pads=[kernel // 2] * 4, group=channels // per_group)
    return model, conv_ops(channels, size, per_group, kernel, width)


def conv_weights(channels: int, per_group: int, kernel: int = 3, seed: int = 0) -> np.ndarray:
    """The weights of a probe's convolutions (the same for each of a chain; another `seed`, others)."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((channels, per_group, kernel, kernel)) / math.sqrt(per_group * kernel * kernel)).astype(np.float32)


def conv_probe(channels: int, size: int, per_group: int, kernel: int = 3, width: int | None = None) -> Probe:
    """`conv_model`'s convolutions as a `Probe` (no model built until timed): maps of size rows
    and `width` columns (default: size)."""
    dense = per_group == channels and channels % NCHWC_BLOCK == 0  # a blocked kernel's ("conv", `simulate.conv_work_units`)
    return Probe(lambda chain: conv_model(channels, size, per_group, kernel, chain, width)[0], conv_ops(channels, size, per_group, kernel, width),
                 float(channels * size * (size if width is None else width)), blocked_units(1, 1, channels, size) if dense else 0)


def pointwise_nchw_probe(channels: int, outputs: int, size: int) -> Probe:
    """1x1 convolutions of `channels` (fewer than an NCHWc block) input channels and `outputs` output
    channels on one size x size input, which onnxruntime's kernel that takes NCHW input runs
    (`simulate.op_kind`, "pointwise_nchw"): a model of `chain` of them, each on the model's input
    (it cannot take a convolution's output, of other channels), their outputs summed by one Sum,
    whose read of each one the kind's time then holds beside the convolution's."""
    def build(chain: int) -> onnx.ModelProto:
        filters = {f"w{i}": conv_weights(outputs, channels, 1, seed=i) for i in range(chain)}
        nodes = [helper.make_node("Conv", ["x", f"w{i}"], [f"y{i}"]) for i in range(chain)]
        nodes.append(helper.make_node("Sum", [f"y{i}" for i in range(chain)], ["z"]))
        return float_model(nodes, {"x": (1, channels, size, size)}, {"z": (1, outputs, size, size)}, filters)

    return Probe(build, 2.0 * channels * outputs * size * size, float(outputs * size * size),
                 blocked_units(1, 1, outputs, size) if outputs % NCHWC_BLOCK == 0 else 0)


# a read probe (`read_model`): 3x3 convolutions of READ_CHANNELS channels on a READ_SIZE map (2.4 MB
# of filters each, few operations), READ_CHAIN of them: 57 MB, beyond a core's cache and a host's
# last level's share as a model's filters are (from about 16 MB on, each pays its filters' reads;
# docs/benchmarks.md, session 42)
READ_CHANNELS, READ_SIZE, READ_CHAIN = 256, 3, 24


def read_model(chain: int) -> onnx.ModelProto:
    """`chain` of the read probe's convolutions, each with its own filters."""
    filters = {f"w{i}": conv_weights(READ_CHANNELS, READ_CHANNELS, seed=i) for i in range(chain)}
    nodes = [helper.make_node("Conv", ["x" if i == 0 else f"y{i - 1}", f"w{i}"], [f"y{i}"], pads=[1] * 4) for i in range(chain)]
    shape = (1, READ_CHANNELS, READ_SIZE, READ_SIZE)
    return float_model(nodes, {"x": shape}, {f"y{chain - 1}": shape}, filters)


def read_speed(timed: Callable[[onnx.ModelProto], float], conv: KindSpeed) -> float:
    """`conv_read_Bps`: the bytes of a read probe convolution's filters over what one takes, in a
    chain of READ_CHAIN less one alone, beyond its operations at the "conv" throughput and its
    fixed cost; 0 (not measured) where that is under SMALL_TERM of its time (noise, or a cache
    that holds them all)."""
    each = (timed(read_model(READ_CHAIN)) - timed(read_model(1))) / (READ_CHAIN - 1)
    beyond = each - conv_ops(READ_CHANNELS, READ_SIZE, READ_CHANNELS) / conv.ops_per_s - conv.op_s
    return 4.0 * READ_CHANNELS * READ_CHANNELS * 9 / beyond if beyond > SMALL_TERM * each else 0.0


def matmul_ops(rows: int, size: int) -> float:
    """Operations of one of `matmul_model`'s MatMuls."""
    return 2.0 * rows * size * size


def matmul_model(rows: int, size: int, chain: int = 1) -> tuple[onnx.ModelProto, float]:
    """`chain` MatMuls of `rows` x `size` by a `size` x `size` weight, each its own weight as a
    model's layers have (a chain of one weight keeps it in the core's cache, and times a MatMul
    faster than a model runs it); and one's operations."""
    weights = {f"w{i}": w for i, w in enumerate(matmul_weights(size, chain))}
    nodes = [helper.make_node("MatMul", ["x" if i == 0 else f"y{i - 1}", f"w{i}"], [f"y{i}"]) for i in range(chain)]
    return float_model(nodes, {"x": (rows, size)}, {f"y{chain - 1}": (rows, size)}, weights), matmul_ops(rows, size)


def matmul_weights(size: int, chain: int) -> list[np.ndarray]:
    """The `size` x `size` weights of a probe's `chain` MatMuls, each its own."""
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((size, size)) / math.sqrt(size)).astype(np.float32) for _ in range(chain)]


def matmul_probe(rows: int, size: int) -> Probe:
    """`matmul_model`'s MatMuls as a `Probe` (no model built until timed)."""
    return Probe(lambda chain: matmul_model(rows, size, chain)[0], matmul_ops(rows, size), float(rows * size))


ACTIVATION_SCALE = 0.05  # the scale of a quantized probe's uint8 activations (zero point 128: values of about +-6)


def activation_params() -> dict[str, np.ndarray]:
    """A quantized probe's activations' scale ("s") and uint8 zero point ("z"), as constants of its model."""
    return {"s": np.array(ACTIVATION_SCALE, np.float32), "z": np.array(128, np.uint8)}


def quantized_chain(op: str, shape: tuple[int, ...], weights: Sequence[np.ndarray], **attrs: Any) -> onnx.ModelProto:
    """`len(weights)` ops `op` in sequence, each by its weights, as a quantized (QDQ) model writes
    them: the op between a DequantizeLinear of its uint8 input and of its int8 weights (per tensor)
    and a QuantizeLinear of its output, which onnxruntime fuses into one integer kernel (QLinearConv,
    QLinearMatMul); the float input of `shape` quantized once, the last output dequantized once."""
    constants: dict[str, np.ndarray] = {**activation_params(), "wz": np.array(0, np.int8)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q0"])]
    for i, w in enumerate(weights):
        scale = float(np.max(np.abs(w))) / 127 or 1.0
        constants[f"w{i}"], constants[f"ws{i}"] = np.round(w / scale).astype(np.int8), np.array(scale, np.float32)
        nodes += [helper.make_node("DequantizeLinear", [f"q{i}", "s", "z"], [f"x{i}"]),
                  helper.make_node("DequantizeLinear", [f"w{i}", f"ws{i}", "wz"], [f"f{i}"]),
                  helper.make_node(op, [f"x{i}", f"f{i}"], [f"y{i}"], **attrs),
                  helper.make_node("QuantizeLinear", [f"y{i}", "s", "z"], [f"q{i + 1}"])]
    nodes.append(helper.make_node("DequantizeLinear", [f"q{len(weights)}", "s", "z"], ["y"]))
    return float_model(nodes, {"x": shape}, {"y": shape}, constants)


def qconv_probe(channels: int, size: int, per_group: int | None = None, kernel: int = 3) -> Probe:
    """kernel x kernel convolutions of `channels` channels on a size x size map, of `per_group` input
    channels per group (None: dense; 1: depthwise), in an integer kernel (`quantized_chain`;
    conv_model's weights, the same for each) as a `Probe`."""
    per = channels if per_group is None else per_group
    weights = conv_weights(channels, per, kernel)  # (once: the probe builds a chain of one and of CHAIN)

    def build(chain: int) -> onnx.ModelProto:
        return quantized_chain("Conv", (1, channels, size, size), [weights] * chain, pads=[kernel // 2] * 4, group=channels // per)

    return Probe(build, conv_ops(channels, size, per, kernel), float(channels * size * size))


def qmatmul_probe(rows: int, size: int) -> Probe:
    """MatMuls of `rows` x `size` by a `size` x `size` weight in an integer kernel (`quantized_chain`;
    matmul_weights, each its own, as matmul_model's) as a `Probe`."""
    def build(chain: int) -> onnx.ModelProto:
        return quantized_chain("MatMul", (rows, size), matmul_weights(size, chain))

    return Probe(build, matmul_ops(rows, size), float(rows * size))


def weights_model(nbytes: int) -> tuple[onnx.ModelProto, float]:
    """A MatMul of one row by `nbytes` of weights (a classifier's Gemm on one image: all weights,
    two operations per weight), and the bytes it streams."""
    rows = 2048
    w = np.random.default_rng(0).standard_normal((rows, nbytes // 4 // rows)).astype(np.float32)
    node = helper.make_node("MatMul", ["x", "w"], ["y"])
    return float_model([node], {"x": (1, rows)}, {"y": (1, w.shape[1])}, {"w": w}), float(w.nbytes)


def add_model(elements: int, chain: int = 1) -> tuple[onnx.ModelProto, float]:
    """`chain` Adds of a constant to `elements` values; and one's operations (one per value)."""
    return _chain("Add", (elements,), {"one": np.ones((1,), dtype=np.float32)}, chain), float(elements)


# "other" op types timed apart (`other_probe`): each runs at its own speed per operation, a pooling
# window's several times an Add's, a LayerNormalization's a fraction (docs/benchmarks.md, session 27),
# an LRN's (a power per value: GoogLeNet's and AlexNet's) a few hundredths (session 42)
# (not a Transpose: onnxruntime merges a chain of them into one)
OTHER_TIMED = ("MaxPool", "AveragePool", "LayerNormalization", "Softmax", "Sigmoid", "Erf", "Mul", "LRN")
# ... and on a quantized model's 8-bit values in NCHW (`eight_bit_probe`), where onnxruntime's MaxPool
# is a generic kernel (its AveragePool, a QLinearAveragePool, is not)
EIGHT_BIT_TIMED = ("MaxPool",)
# ... on NCHW values, where onnxruntime runs them with their own kernel, not blocked (`cluster.IN_NCHW`):
# a BatchNormalization's uses one thread however many the rank has (docs/benchmarks.md, session 43)
IN_NCHW_TIMED = ("BatchNormalization",)
# the ops lowering writes around a quantized model's layer run in float (`qdq_probe`): onnxruntime's
# DequantizeLinear of a tensor's one scale uses one thread, its QuantizeLinear all (session 43)
QDQ_TIMED = ("DequantizeLinear", "QuantizeLinear")
TOKEN_WIDTH = 256  # channels of the (tokens, channels) values a LayerNormalization or Softmax probe runs over
OTHER_SIZES = (14, 21, 28)  # sizes of the probes of these op types (but EIGHT_BIT_TIMED's): in the core's cache, as the Adds' (`TimedApart`)


LRN_SIZE = 5  # channels in an LRN probe's window (GoogLeNet's)


def other_ops(op_type: str, size: int) -> float:
    """Operations of one of `other_model`'s ops (bbgrap/cost.py's count: a window's nine per value
    for a pool, an LRN's LRN_SIZE, one per value for the rest)."""
    per_value = {"MaxPool": 9, "AveragePool": 9, "LRN": LRN_SIZE}.get(op_type, 1)
    return float(64 * size * size * per_value)


def other_model(op_type: str, size: int, chain: int = 1) -> tuple[onnx.ModelProto, float]:
    """`chain` ops `op_type` (one of OTHER_TIMED or IN_NCHW_TIMED), each on the one before's output
    of the same shape: 64 channels of size x size for a map op (a 3x3 pool, padded; an LRN across
    LRN_SIZE channels, GoogLeNet's; an activation; a Mul by a constant; a BatchNormalization, on the
    model's NCHW input and so with its own kernel), or as many values as (tokens, TOKEN_WIDTH) for a
    LayerNormalization or Softmax over its last axis; and one op's operations (`other_ops`)."""
    tokens = op_type in ("LayerNormalization", "Softmax")
    shape = (64 * size * size // TOKEN_WIDTH, TOKEN_WIDTH) if tokens else (1, 64, size, size)
    constants: dict[str, np.ndarray] = {}
    attrs: dict[str, Any] = {}
    if op_type in ("MaxPool", "AveragePool"):
        attrs = {"kernel_shape": [3, 3], "pads": [1] * 4}
    elif op_type in ("Softmax", "LayerNormalization"):
        attrs = {"axis": -1}
    elif op_type == "LRN":
        attrs = {"size": LRN_SIZE, "alpha": 1e-4, "beta": 0.75, "bias": 1.0}
    if op_type == "LayerNormalization":
        constants = {"scale": np.ones(TOKEN_WIDTH, np.float32), "bias": np.zeros(TOKEN_WIDTH, np.float32)}
    elif op_type == "BatchNormalization":
        rng = np.random.default_rng(0)
        constants = {k: rng.uniform(0.5, 1.5, 64).astype(np.float32) for k in ("scale", "bias", "mean", "var")}
    elif op_type == "Mul":
        constants = {"half": np.full((1,), 0.5, np.float32)}
    return _chain(op_type, shape, constants, chain, opset=17, **attrs), other_ops(op_type, size)


def eight_bit_probe(op_type: str, size: int) -> Probe:
    """Ops `op_type` (one of EIGHT_BIT_TIMED) on 8-bit values in NCHW, as onnxruntime runs a
    quantized model's op after a float one (`cluster.EIGHT_BIT_NCHW`), shaped as such a model's are: a
    CNN stem's 3x3 window of stride 2 (padded), each to a size x size map of 64 channels from the
    one QuantizeLinear of a float input, as a `Probe` whose `chain` ops stand side by side, each
    its own 8-bit output. Not in sequence: onnxruntime's generic kernel branches on each value, and
    a pool of pooled values (whose windows share their largest) takes its branches far more
    predictably than a model's pool of a convolution's output: a chain prices it at about two
    thirds of its time (docs/benchmarks.md, session 42). other_model's operations."""
    def build(chain: int) -> onnx.ModelProto:
        nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
                 *(helper.make_node(op_type, ["q"], [f"y{i}"], kernel_shape=[3, 3], pads=[1] * 4, strides=[2, 2]) for i in range(chain))]
        return float_model(nodes, {"x": (1, 64, 2 * size, 2 * size)}, {f"y{i}": (1, 64, size, size) for i in range(chain)},
                           activation_params(), output_type=onnx.TensorProto.UINT8)

    return Probe(build, other_ops(op_type, size), float(64 * size * size))


def qdq_probe(op_type: str, size: int) -> Probe:
    """Ops `op_type` (one of QDQ_TIMED) with a tensor's one scale and zero point (`activation_params`)
    side by side, each reading one 64 x size x size map and writing its own output: a
    DequantizeLinear the 8-bit map of one QuantizeLinear, a QuantizeLinear the float input (in
    sequence they would be a QDQ pair onnxruntime drops). One operation per value written."""
    def build(chain: int) -> onnx.ModelProto:
        shape = (1, 64, size, size)
        first = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"])] if op_type == "DequantizeLinear" else []
        source = "q" if first else "x"
        nodes = [*first, *(helper.make_node(op_type, [source, "s", "z"], [f"y{i}"]) for i in range(chain))]
        output_type = onnx.TensorProto.FLOAT if first else onnx.TensorProto.UINT8
        return float_model(nodes, {"x": shape}, {f"y{i}": shape for i in range(chain)}, activation_params(), output_type=output_type)

    values = float(64 * size * size)
    return Probe(build, values, values)


CONCAT_CHANNELS = 16  # channels of each value a Concat probe joins: one block, a DenseNet's growth (`concat_probe`)
# (values joined, map size) of the Concat probes: 3 to 24 values (an Inception block's 4, a DenseNet
# block's up to 25), in a core's cache and beyond its L2 (`concat_speed`)
CONCAT_PROBES = tuple((k, s) for k in (3, 8, 24) for s in (7, 14, 28))


def concat_probe(joined: int, size: int) -> Probe:
    """Concats of `joined` values of CONCAT_CHANNELS x size x size along the channels, side by side,
    each of the same `joined` inputs in an order of its own (rotated: onnxruntime merges ops of
    the same inputs in the same order into one) and its own output; one Concat's operations (one
    per value written, as bbgrap/cost.py counts them) and values."""
    shape = (1, CONCAT_CHANNELS, size, size)

    def build(chain: int) -> onnx.ModelProto:
        names = [f"x{i}" for i in range(joined)]
        nodes = [helper.make_node("Concat", names[c:] + names[:c], [f"y{c}"], axis=1) for c in range(chain)]
        return float_model(nodes, dict.fromkeys(names, shape), {f"y{c}": None for c in range(chain)}, {})

    values = float(joined * math.prod(shape))
    return Probe(build, values, values)


def concat_speed(timed: Callable[[onnx.ModelProto], float], probes: Sequence[tuple[int, int]] = CONCAT_PROBES) -> tuple[float, float]:
    """A Concat's operations (values written) per second and seconds per value it joins
    (`NodeProfile.concat_input_s`), from the `marginal_time`s of `concat_probe`s of `probes`
    (values joined, size): least squares of time = values x the first's inverse + joined x the
    second + a constant (the op's fixed cost, which the "other" kind's tiny probe gives). onnxruntime
    copies a Concat's inputs one after another on one thread whatever the node's threads (a
    DenseNet's Concats ran no faster at two threads than at one, docs/benchmarks.md, session 47),
    and each input has a small cost of its own beside its values (a DenseNet's Concat joins up to
    25: about 0.1 us each on the development machine). Where noise leaves the
    joins' term below 0, none, and the values' the line through (values, time) (`line_per_op`, as
    `seconds_per`)."""
    built = [concat_probe(k, s) for k, s in probes]
    times = [marginal_time(p, timed) for p in built]
    design = np.array([[p.ops, k, 1.0] for p, (k, _) in zip(built, probes)])
    (per_value, per_join, _), *_ = np.linalg.lstsq(design, np.array(times), rcond=None)
    if per_join <= 0 or per_value <= 0:
        per_value, per_join = line_per_op(built, times, timed), 0.0
    return 1.0 / float(per_value), float(per_join)


def other_probe(op_type: str, size: int) -> Probe:
    """`other_model`'s ops as a `Probe` (no model built until timed)."""
    return Probe(lambda chain: other_model(op_type, size, chain)[0], other_ops(op_type, size), float(64 * size * size))


@dataclass(frozen=True)
class TimedApart:
    """"Other" op types calibrate times apart (`NodeProfile.other_speeds`): each `probe(op, size)` at
    `sizes`, written under the op type and `suffix` (`cluster.EIGHT_BIT_NCHW`, `cluster.IN_NCHW`)."""

    op_types: tuple[str, ...]
    probe: Callable[[str, int], Probe]
    sizes: tuple[int, ...] = OTHER_SIZES
    suffix: str = ""


TIMED_APART = (TimedApart(OTHER_TIMED, other_probe), TimedApart(EIGHT_BIT_TIMED, eight_bit_probe, (14, 28, 56), EIGHT_BIT_NCHW),
               TimedApart(IN_NCHW_TIMED, other_probe, suffix=IN_NCHW), TimedApart(QDQ_TIMED, qdq_probe))


def add_probe(elements: int) -> Probe:
    """`add_model`'s Adds as a `Probe`."""
    return Probe(lambda chain: add_model(elements, chain)[0], float(elements), float(elements))


def timed_run(run: Callable[[], object], clock: BusyClock = WALL) -> float:
    """Seconds of one `run` (of an onnxruntime session: `Target.runner`), on `clock` (without a
    CPU quota's stops)."""
    mark = clock.start()
    run()
    return clock.since(mark)


def fastest_run(run: Callable[[], object], runs: int, seconds: float, clock: BusyClock = WALL) -> float:
    """The fastest of at least `runs` runs that go on for at least `seconds` (`BusyClock.best`: on the
    stops a quota books for more than one thread, their median): a small model's dozen runs take
    a few milliseconds, which one busy moment of a shared host covers whole."""
    times = [timed_run(run, clock) for _ in range(runs)]
    while sum(max(t, 0.0) for t in times) < seconds:
        times.append(timed_run(run, clock))
    return clock.best(times)


def time_piece(model: onnx.ModelProto, threads: int, repeat: int = REPEAT, clock: BusyClock = WALL,
               target: Target = CPU_TARGET) -> tuple[float, tuple[int, ...]]:
    """Seconds of one run of `model` (a session as bbgrap-run makes them on `target`, its values
    held as a plan's runner holds them there; warmed up by three runs): the fastest of `repeat` on
    `clock`, since other work on the host only ever slows a run down (`BusyClock.best`: on the
    stops a quota books for more than one thread, their median); and the shape of its first output."""
    sess = target.session(model.SerializeToString(), target.options(threads))
    feeds = {i.name: np.random.default_rng(1).standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in model.graph.input}
    shape = tuple(sess.run(None, feeds)[0].shape)
    return warm_fastest(target.runner(sess, feeds), repeat, clock), shape


def warm_fastest(run: Callable[[], object], repeat: int, clock: BusyClock = WALL) -> float:
    """The fastest of `repeat` runs of `run` on `clock` (`BusyClock.best`), after two runs that warm it up."""
    for _ in range(2):
        run()
    return clock.best([timed_run(run, clock) for _ in range(repeat)])


def time_model(model: onnx.ModelProto, threads: int, repeat: int = REPEAT, clock: BusyClock = WALL, target: Target = CPU_TARGET) -> float:
    """Seconds of one run of `model`, as `time_piece` times it."""
    return time_piece(model, threads, repeat, clock, target)[0]


# A tiny op of each kind: what it takes beyond its operations (`op_speed`) is the kind's fixed cost per op
TINY: dict[str, Probe] = {"conv": conv_probe(8, 4, 8), "depthwise": conv_probe(8, 4, 1), "grouped": conv_probe(16, 4, 8),
                          "pointwise_nchw": pointwise_nchw_probe(8, 16, 4),
                          "matmul": matmul_probe(1, 16), "qconv": qconv_probe(8, 4), "qconv_gemm": qconv_probe(6, 4), "qdepthwise": qconv_probe(16, 4, 1), "qmatmul": qmatmul_probe(1, 16),
                          "other": add_probe(64)}
CHAIN = 3  # ops in a probe's longer chain (`marginal_time`)
MATMUL_ROWS = 196  # rows of the MatMul probes: a 14 x 14 map's pixels, about a ViT's tokens
SMALL_TERM = 0.01  # a fitted term below this share of the time it comes from is none (`seconds_per`: output values; `read_speed`)


def marginal_time(probe: Probe, timed: Callable[[onnx.ModelProto], float]) -> float:
    """Seconds one more op of the probe's kind takes in a chain of them: a chain of CHAIN ops' time
    less one op's, over CHAIN - 1 (at least 0). A model of one op pays what an op inside a model
    does not: the session's run, and for a convolution the reorders of its input and output
    between NCHW and onnxruntime's blocked layout, which take longer than a depthwise or a 1x1
    convolution itself (docs/benchmarks.md, session 26); both cancel in the difference, as they do
    in a plan, whose segment boundaries pay them (`segment_s`, `value_s`, the values' copies).
    `timed`: seconds of one run of a model (`time_model` with the node's threads and clock)."""
    return max(0.0, (timed(probe.build(CHAIN)) - timed(probe.build(1))) / (CHAIN - 1))


@dataclass(frozen=True)
class KindSpeed:
    """One kind of op's figures: operations per second, fixed seconds per op, and output values
    per second beyond the operations (0: not fitted)."""

    ops_per_s: float
    op_s: float
    elements_per_s: float = 0.0


def seconds_per(probes: Sequence[Probe], timed: Callable[[onnx.ModelProto], float], elements: bool = False,
                threads: int = 1) -> tuple[float, float]:
    """Seconds per operation and per output value (0: no term) of one kind of op, from the
    `marginal_time`s of its `probes` (least squares): with `elements`, time = operations x the first
    + output values x the second + a constant (for a depthwise convolution, whose probes of two
    kernel sizes write alike values for unlike operations), else the line through (operations,
    time), whose slope is the first. Where noise makes the operations' slope no larger than 0: the
    largest of the probes' times over their operations, and no term for values; where every
    chain ran as fast as its one op (ops too small for the timer on a noisy host), the largest
    probe's whole chain over its operations (its session's run included: slower than the op,
    not infinitely fast); where the values take under SMALL_TERM of the largest probe's time
    (rounding, noise), no term for them either. Operations count as `threads` threads run them
    (`Probe.priced_ops`)."""
    times = [marginal_time(p, timed) for p in probes]
    per_op = per_value = 0.0
    if elements:
        design = np.array([[p.priced_ops(threads), p.elements, 1.0] for p in probes])
        (per_op, per_value, _), *_ = np.linalg.lstsq(design, np.array(times), rcond=None)
        if per_value * max(p.elements for p in probes) <= SMALL_TERM * max(times):
            per_op = per_value = 0.0
    if per_op <= 0:
        per_op, per_value = line_per_op(probes, times, timed, threads), 0.0
    return float(per_op), float(per_value)


def line_per_op(probes: Sequence[Probe], times: Sequence[float], timed: Callable[[onnx.ModelProto], float], threads: int = 1) -> float:
    """Seconds per operation of the line through the `probes`' (operations, marginal `times`): its
    slope; where noise leaves that no larger than 0, the largest of the times over their operations;
    where every chain ran as fast as its one op, the largest probe's whole chain over its operations
    (`seconds_per`; operations as `threads` threads run them, `Probe.priced_ops`)."""
    ops = [p.priced_ops(threads) for p in probes]
    _, per_op = fit_line(ops, times)
    if per_op <= 0:
        per_op = max(t / n for t, n in zip(times, ops))
    if per_op <= 0:
        per_op = timed(probes[-1].build(CHAIN)) / (CHAIN * ops[-1])
    return float(per_op)


def op_speed(probes: Sequence[Probe], tiny: Probe, timed: Callable[[onnx.ModelProto], float], elements: bool = False,
             threads: int = 1) -> KindSpeed:
    """One kind of op's figures: its speeds from its `probes` (`seconds_per`), and as its fixed cost
    what the `tiny` probe's marginal time leaves beyond its operations and values at those speeds
    (not the fit's constant, which one noisy large probe moves by far more than the fixed cost);
    operations as `threads` threads run them (`Probe.priced_ops`)."""
    per_op, per_value = seconds_per(probes, timed, elements, threads)
    fixed = max(0.0, marginal_time(tiny, timed) - tiny.priced_ops(threads) * per_op - tiny.elements * per_value)
    return KindSpeed(1.0 / per_op, fixed, 1.0 / per_value if per_value > 0 else 0.0)


class FastestTimes:
    """`timed` that answers, for each model, the fastest of all its timings so far (a model known
    by its bytes): a kind's probes timed again later, where a spell of the host slowed a kernel
    the first time (`measure_node`), give the faster of the two."""

    def __init__(self, timed: Callable[[onnx.ModelProto], float]) -> None:
        self.timed = timed
        self.best: dict[bytes, float] = {}

    def __call__(self, model: onnx.ModelProto) -> float:
        key = hashlib.sha256(model.SerializeToString()).digest()
        self.best[key] = min(self.timed(model), self.best.get(key, math.inf))
        return self.best[key]


def stream_speed(times: Sequence[float], sizes: Sequence[int] = STREAM_SIZES) -> tuple[float, float]:
    """`(stream_ops_per_s, cache_bytes)` from the times of Adds over `sizes` values (module
    docstring); (0, 0) where no step between sizes costs STREAM_JUMP times the in-cache slope per
    value (a cache larger than the largest Add, or smaller than the third size), or noise leaves no
    slope to go by. The in-cache slope is the larger of the first two steps', so that one step
    shortened by noise does not pass for the cache's."""
    slopes = [(t1 - t0) / (n1 - n0) for (n0, t0), (n1, t1) in zip(zip(sizes, times), zip(sizes[1:], times[1:]))]
    base = max(slopes[:2])
    beyond = next((k for k, slope in enumerate(slopes) if slope >= STREAM_JUMP * base), None)
    if base <= 0 or beyond is None or slopes[-1] <= 0:
        return 0.0, 0.0
    return 1.0 / slopes[-1], float(BYTES_MOVED * sizes[beyond])


def one_thread_add(elements: int, clock: BusyClock = WALL, repeat: int = REPEAT) -> float:
    """Seconds of NumPy's Add of a constant to `elements` float32 values into another array, on one
    thread (onnxruntime's Add reads and writes as much a value): the fastest of `repeat` on `clock`
    after a warm-up. bbgrap calibrate runs its sessions on onnxruntime's process-wide pool, as
    bbgrap-run does, beside which onnxruntime makes no session of one thread."""
    values = np.random.default_rng(1).standard_normal(elements).astype(np.float32)
    out, one = np.empty_like(values), np.float32(1.0)
    return warm_fastest(lambda: np.add(values, one, out=out), repeat, clock)


def stream_regime(node_times: Sequence[float], one_thread_times: Sequence[float] | None) -> tuple[float, float]:
    """`(stream_ops_per_s, cache_bytes)`: the speed beyond the cache from the Adds over STREAM_SIZES
    timed at the node's threads (`stream_speed`; 0 where they showed no slower regime), and the
    cache's size from those timed at one thread (`one_thread_times`, for a node of several threads:
    its threads split the larger Adds, which hides the step; the cache's size does not depend on
    them) where they show it, else from the node's."""
    speed, cache = stream_speed(node_times)
    if one_thread_times is not None:
        cache = stream_speed(one_thread_times)[1] or cache
    return speed, cache


@dataclass(frozen=True)
class ModelToTime:
    """The model `calibrate --model` times layer by layer: as loaded, its nodes named as its layers
    are (`proto`); imported (`front`); and its file."""

    proto: onnx.ModelProto
    front: Frontend
    path: str


def model_to_time(path: str, input_shapes: Mapping[str, tuple[int, ...]] | None = None) -> ModelToTime:
    """Load and import `path` (each problem one BBGrapError line, as compile's)."""
    proto = load_model(path)
    front = import_proto(proto, os.path.splitext(os.path.basename(path))[0], input_shapes)
    name_nodes(proto)
    return ModelToTime(proto, front, path)


FUSED_SUFFIX = re.compile(r"(_bn|_nchwc|_token_\d+|/[A-Za-z]+Fusion/?)$")


def kernel_layer(kernel: str, layers: Mapping[str, Layer], producers: Mapping[str, Layer] | None = None) -> str | None:
    """The layer an onnxruntime kernel is named after: its node's name, or that name with what the
    optimiser adds to a node it makes of it ('fused ' before; '_bn', '_nchwc', '_token_N' and a
    fusion's '/QuickGeluFusion/' after, in any order and number). The NCHWc transformer names the
    node it makes after the node's output value, so a name that is a value of `producers` (value ->
    the layer that makes it) is given to that layer: the exporters name a value after its node
    ('/conv/Conv' makes '/conv/Conv_output_0'). None for a kernel of its own (a layout reorder)."""
    name, before = kernel.removeprefix("fused "), ""
    while name != before:
        name, before = FUSED_SUFFIX.sub("", name), name
    if name in layers:
        return name
    made_by = (producers or {}).get(name)
    return made_by.name if made_by is not None else None


def profiled_runs(model: bytes, feeds: Mapping[str, np.ndarray], threads: int, runs: int) -> list[dict[str, Any]]:
    """onnxruntime's profile (its events) of `runs` + 1 runs of the serialized `model` on its
    inputs of `feeds` in a session with `threads` as bbgrap-run's, the first run a warm-up (the
    session is gone on return: a large model's is not held twice)."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="bbgrap-calibrate-") as work:
        opts = session_options(threads)
        opts.enable_profiling = True
        opts.profile_file_prefix = os.path.join(work, "profile")
        sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        mine = {i.name: feeds[i.name] for i in sess.get_inputs()}
        for _ in range(runs + 1):
            sess.run(None, mine)
        with open(sess.end_profiling(), encoding="utf-8") as fh:
            events: list[dict[str, Any]] = json.load(fh)
    return events


def plain_run(model: bytes, feeds: Mapping[str, np.ndarray], threads: int, runs: int, seconds: float, clock: BusyClock = WALL) -> float:
    """Seconds of the serialized `model`'s fastest run without the profiler (`fastest_run` of at
    least `runs` runs and `seconds`) on its inputs of `feeds`, in a CPU session with `threads` as
    `profiled_runs` makes it, after one run to warm it up: what a profiled model's or chain's
    reported kernel times are set against."""
    import onnxruntime as ort

    sess = ort.InferenceSession(model, session_options(threads), providers=["CPUExecutionProvider"])
    mine = {i.name: feeds[i.name] for i in sess.get_inputs()}
    sess.run(None, mine)
    return fastest_run(CPU_TARGET.runner(sess, mine), runs, seconds, clock)


PROFILER_CHAIN = 64  # tiny ops of the chains that give the profiler's own cost per kernel (`profiler_cost`)
PROFILER_INPUTS = 16  # inputs of each Sum of the chain that gives its cost per input (`profiler_cost`)


@dataclass(frozen=True)
class ProfilerCost:
    """What onnxruntime's profiler adds to each kernel's reported time: `per_kernel_s` for a kernel
    of one input and `per_input_s` for each further input (`of`); and the least a kernel takes
    without it (`least_s`: a tiny op's): what is left of a kernel's reported time is never less,
    so a kernel that ran is never priced at nothing."""

    per_kernel_s: float = 0.0
    least_s: float = 0.0
    per_input_s: float = 0.0

    def of(self, inputs: int) -> float:
        """Seconds the profiler adds to a kernel of `inputs` inputs."""
        return self.per_kernel_s + max(0, inputs - 1) * self.per_input_s


def profiled_extra(model: onnx.ModelProto, one: onnx.ModelProto, threads: int, runs: int, clock: BusyClock = WALL) -> tuple[float, float]:
    """Seconds the profiler adds to each kernel of `model`, a chain of PROFILER_CHAIN alike tiny ops
    on an input x of 16 values, and the time per op without it: the mean of its kernels' reported
    times over `runs` runs less the time per op (the chain's fastest run less `one`'s, its first op
    alone, over the ops between)."""
    feeds = {"x": np.zeros((1, 16), np.float32)}
    whole, alone = (plain_run(m.SerializeToString(), feeds, threads, runs, CHAIN_TIMED_S, clock) for m in (model, one))
    per_op = max(0.0, whole - alone) / (PROFILER_CHAIN - 1)
    events = profiled_runs(model.SerializeToString(), feeds, threads, runs)
    reported = [1e-6 * e["dur"] for e in events if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")]
    return (max(0.0, math.fsum(reported) / len(reported) - per_op) if reported else 0.0), per_op


def profiler_cost(threads: int, runs: int = LAYER_RUNS, clock: BusyClock = WALL) -> ProfilerCost:
    """Seconds onnxruntime's profiler adds to the time it reports for each kernel (`profiled_extra`):
    on a chain of PROFILER_CHAIN Sigmoids of 16 values, each a fraction of a microsecond's work,
    and on a chain of as many Sums of PROFILER_INPUTS such values (the one before's and constants),
    whose extra beyond the Sigmoids' is the cost of each further input: the profiler records every
    input's type and shape, about a tenth of a microsecond each, so a Concat of 25 values is
    reported at several times its time (docs/benchmarks.md, session 47). The cost is otherwise
    about the same for every kernel, large or small (it reports a kernel of 0.2 us as about 2 us),
    so scaling a model's kernel times to its run without the profiler would leave its small
    kernels several times their time and take it from its large ones; the profiler reports whole
    microseconds, cut down, as it does the model's kernels. A tiny Sigmoid's time per op is the
    least a kernel takes: a model's kernel reported at 1 us may be left with less than nothing
    after the cost comes off."""
    def extra(op: str, constants: Mapping[str, np.ndarray]) -> tuple[float, float]:
        return profiled_extra(_chain(op, (1, 16), constants, PROFILER_CHAIN), _chain(op, (1, 16), constants, 1), threads, runs, clock)

    per_kernel, per_op = extra("Sigmoid", {})
    summed, _ = extra("Sum", {f"c{i}": np.ones((1, 16), np.float32) for i in range(PROFILER_INPUTS - 1)})
    return ProfilerCost(per_kernel, per_op, max(0.0, summed - per_kernel) / (PROFILER_INPUTS - 1))


def layer_times(events: Sequence[Mapping[str, Any]], graph: Graph, registry: RuleRegistry, profiler: ProfilerCost,
                run_s: float) -> dict[str, float]:
    """Seconds of each layer of `graph` from onnxruntime's profile `events` of the model's runs
    (the first a warm-up): each kernel's reported time less the `profiler`'s own cost for a kernel
    of its inputs (`ProfilerCost.of`; at least its `least_s`), given to the layer it is named after or that layer's `fusion_anchor`;
    per layer the least over the runs, all scaled to add up to `run_s` (the model's run without
    the profiler, less a run's fixed cost). A layer of no kernel costs 0."""
    layers = {layer.name: layer for layer in graph.layers}
    producers = graph.producers()
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    per_run: list[dict[str, float]] = [{} for _ in spans]
    anchors: dict[str, str] = {}
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        name = kernel_layer(e["name"].removesuffix("_kernel_time"), layers, producers)
        run = next((k for k, (t0, t1) in enumerate(spans) if t0 <= e["ts"] <= t1), None)
        if name is None or run is None:
            continue
        if name not in anchors:
            anchors[name] = fusion_anchor(layers[name], graph, registry)
        anchor = anchors[name]
        inputs = len(e.get("args", {}).get("input_type_shape", ())) or 1
        per_run[run][anchor] = per_run[run].get(anchor, 0.0) + max(profiler.least_s, 1e-6 * e["dur"] - profiler.of(inputs))
    timed = per_run[1:]  # the first run warms up
    times = {name: min(r.get(name, 0.0) for r in timed) for name in set().union(*timed)} if timed else {}
    # what is left of the profiler's own cost: the layers' times add up to the model's run without it
    kernels = sum(times.values())
    scale = run_s / kernels if kernels > 0 else 1.0
    return {name: times.get(name, 0.0) * scale for name in layers}  # in another layer's kernel, or folded away


def measure_layers(model: onnx.ModelProto, graph: Graph, inputs: dict[str, np.ndarray], threads: int, segment: float,
                   registry: RuleRegistry | None = None, runs: int = LAYER_RUNS, clock: BusyClock = WALL,
                   profiler: ProfilerCost | None = None) -> dict[str, float]:
    """Seconds of each layer of `graph` on this node, in the model as onnxruntime runs it whole
    (`model`, its nodes named as the layers are): its profiler's kernel times, the fastest of `runs`
    runs after a warm-up, each kernel's time given to the layer it is named after, or for an op
    fused into a convolution to that convolution (`fusion_anchor`). The profiler adds its own
    cost to every kernel: the `profiler`'s (None: measured, `profiler_cost`) comes off each kernel's
    time, and the rest is scaled to add up to the model's fastest run without the profiler, less
    `segment` (a run's fixed cost, which the simulator charges per segment). A layer of
    no kernel costs 0 here: the optimiser folded it away (a BatchNormalization or activation fused
    into a convolution, an Identity) or into another layer's kernel (x * Sigmoid(x) runs as one
    QuickGelu kernel named after the Mul), whose time, as every kernel's, is in the model's run."""

    registry = registry or default_registry()
    overhead = profiler_cost(threads, clock=clock) if profiler is None else profiler
    try:
        serialized = model.SerializeToString()
        events = profiled_runs(serialized, inputs, threads, runs)
    except Exception as exc:  # noqa: BLE001  # onnxruntime's own errors (and protobuf's 2 GB limit)
        raise BBGrapError(f"--model: onnxruntime cannot run it whole to time its layers ({first_line(exc)})") from None
    wall = plain_run(serialized, inputs, threads, runs, MODEL_TIMED_S, clock)
    return layer_times(events, graph, registry, overhead, max(0.0, wall - segment))


def measure_node(threads: int, model: ModelToTime | None = None, comm: Any = None, quota: CpuQuota | None = None,
                 target: Target = CPU_TARGET) -> NodeProfile:
    """This process's node (on this host) on `target`'s provider: throughput and fixed cost per
    kind of op, a segment boundary's costs (a message's too on an MPI `comm` of more than one rank:
    every rank at once), and with `model` that model's layers (module docstring; on the CPU only).
    Under a CPU `quota` (the process's, which its threads were chosen by) every run is timed without
    the quota's stops, and every time is then divided by the share of the threads' time the quota
    leaves them (backends/cpu_quota.py): over an inference the stops slow the node by that much."""
    if model is not None and target.on_gpu:
        raise BBGrapError("--model times layers with onnxruntime's CPU profiler, which a GPU's kernels are not in; on the "
                          "GPU drop --model (its layers are then priced by their kinds of op), or time the CPU with --provider cpu")
    clock = BusyClock(quota, threads)
    timed = functools.partial(time_model, threads=threads, clock=clock, target=target)
    boundary = measure_boundary(threads, comm, target)
    # what a lone session's run costs beyond its ops: the op kinds' one-op models and the model's run are such runs
    segment = timed(add_model(1)[0])
    sizes = (7, 14, 28, 56)
    probes: dict[str, list[Probe]] = {
        # (up to 112 x 112, where a large map's memory traffic shows)
        "conv": [conv_probe(64, s, 64) for s in (*sizes, 112)],
        # two kernel sizes: output values alike, operations 49 / 9 apart
        "depthwise": [conv_probe(128, s, 1, k) for k in (3, 7) for s in sizes],
        "grouped": [conv_probe(128, s, FEW_PER_GROUP) for s in sizes],
        # (a narrow model's first expansions: 8 and 12 input channels to 4 blocks of output channels)
        "pointwise_nchw": [pointwise_nchw_probe(c, 64, s) for c in (8, 12) for s in sizes[1:]],
        # a 14 x 14 map's pixels or a ViT's tokens by weights of up to 2.4 MB, beyond a core's L2 cache
        "matmul": [matmul_probe(MATMUL_ROWS, s) for s in (128, 256, 512, 768)],
        # the same in the integer kernels of a quantized model; 1x1 and 3x3 ones write alike output
        # values for operations 9 apart (each value requantized), as the depthwise ones of 3x3 and
        # 5x5 kernels (of 64 channels: whole groups of 16, which its direct kernel takes)
        "qconv": [qconv_probe(64, s, kernel=k) for k in (1, 3) for s in (*sizes, 112)],
        "qdepthwise": [qconv_probe(64, s, 1, k) for k in (3, 5) for s in sizes],
        # (30 input channels, not a multiple of 4: im2col and a GEMM, as a stem's three; 3x3 and 7x7)
        "qconv_gemm": [qconv_probe(30, s, kernel=k) for k in (3, 7) for s in (14, 28, 56)],
        "qmatmul": [qmatmul_probe(MATMUL_ROWS, s) for s in (128, 256, 512, 768)],
        # (in the core's cache: a chain of Adds over a 56 x 56 map spills it, which `stream_ops_per_s` prices)
        "other": [add_probe(s * s * 64) for s in (7, 14, 21, 28)],
    }
    fastest = FastestTimes(timed)
    several = threads > 1 and not target.on_gpu
    dealt = 1 if target.on_gpu else threads  # the threads a blocked convolution's units are dealt to (`NodeProfile.threads`)
    fields: dict[str, Any] = {}

    def time_kinds() -> tuple[dict[str, KindSpeed], dict[str, float], list[float], float]:
        # each kind's speeds, those of the "other" op types timed apart (and a Concat's per value it
        # joins), and the Adds over STREAM_SIZES
        others = {op + apart.suffix: 1.0 / seconds_per([apart.probe(op, s) for s in apart.sizes], fastest)[0]
                  for apart in TIMED_APART for op in apart.op_types}
        others["Concat"], joins = concat_speed(fastest)
        return ({kind: op_speed(p, TINY[kind], fastest, elements=kind in ELEMENT_KINDS, threads=dealt) for kind, p in probes.items()},
                others, [fastest(add_model(n)[0]) for n in STREAM_SIZES], joins)

    def one_thread_adds() -> list[float]:
        return [one_thread_add(n, clock) for n in STREAM_SIZES]

    speeds, other_speeds, adds, fields["concat_input_s"] = time_kinds()
    ones = one_thread_adds() if several else None
    for name, probe_bytes in (("weight_Bps", WEIGHT_PROBE_BYTES), ("cached_weight_Bps", CACHED_WEIGHT_BYTES)):
        streamed, nbytes = weights_model(probe_bytes)
        fields[name] = nbytes / max(timed(streamed) - segment, 1e-9)
    fields["conv_read_Bps"] = read_speed(timed, speeds["conv"])
    layers, scaling = {}, {}
    if model is not None:
        layers = measure_layers(model.proto, model.front.graph, model.front.sample_inputs, threads, segment, clock=clock)
        scaling = measure_scaling(model.front.graph, functools.partial(time_piece, threads=threads, clock=clock), layers)
    if boundary.messages:
        fields.update(message_fields(boundary.messages))
    cold = measure_cold(threads, fields["cached_weight_Bps"], target=target)
    fields["cold_s"], fields["cold_segment_s"] = cold.per_object_s, cold.segment_s
    if boundary.lockstep:
        fields["wait_share"] = wait_share(boundary.lockstep)
    if several and ones is not None:
        # timed again, seconds later, each probe at the faster of the two: a host's spell that slows a
        # process of several threads for seconds (a kernel that takes NCHW input by half or more; the
        # sweep that finds the cache's size, which it can halve) falls on one
        speeds, other_speeds, adds, fields["concat_input_s"] = time_kinds()
        ones = [min(a, b) for a, b in zip(ones, one_thread_adds())]
    fields["stream_ops_per_s"], fields["cache_bytes"] = stream_regime(adds, ones)
    fields.update({f"{kind}_ops_per_s": speed.ops_per_s for kind, speed in speeds.items()})
    fields.update({f"{kind}_op_s": speed.op_s for kind, speed in speeds.items()})
    fields.update({f"{kind}_elements_per_s": speeds[kind].elements_per_s for kind in ELEMENT_KINDS})
    node = NodeProfile(**fields, segment_s=boundary.segment_s, value_s=boundary.value_s, threads=dealt,
                       host=os.uname().nodename, layer_s=layers, layer_scaling=scaling, other_speeds=other_speeds)
    return replace(node.slowed(quota.share(threads)), quota_period_ms=quota.period_s * 1e3) if quota is not None else node


def message_fields(messages: Sequence[Message]) -> dict[str, float]:
    """`send_s`, `send_byte_s`, `recv_s` and `recv_byte_s` from what messages of several sizes cost
    (backends/boundary.py): as for the link, the smallest message's cost is the fixed part, the
    slope of cost over bytes (least squares, at least 0) the part per byte."""
    smallest = min(messages, key=lambda m: m.nbytes)
    sizes = [m.nbytes for m in messages]
    out = {}
    for side in ("send", "recv"):
        costs = [getattr(m, f"{side}_s") for m in messages]
        out[f"{side}_s"] = getattr(smallest, f"{side}_s")
        out[f"{side}_byte_s"] = max(0.0, fit_line(sizes, costs)[1])
    return out


def wait_share(lockstep: Sequence[Lockstep]) -> float:
    """`wait_share` from the lockstep chain's shapes (backends/boundary.py): the slope of the waits
    over the segments' times (least squares), at least 0."""
    return max(0.0, fit_line([p.busy_s for p in lockstep], [p.wait_s for p in lockstep])[1])


def ping_pong(comm: Any, peer: int, nbytes: int, repeat: int = REPEAT) -> float:
    """Half the fastest round trip of `nbytes` between this rank and `peer` (rank 0 starts)."""
    buf = np.zeros(max(nbytes, 1), dtype=np.uint8)
    times = []
    first = comm.Get_rank() < peer
    for k in range(repeat + 2):
        t0 = time.perf_counter()
        if first:
            comm.Send(buf, dest=peer, tag=9100)
            comm.Recv(buf, source=peer, tag=9101)
        else:
            comm.Recv(buf, source=peer, tag=9100)
            comm.Send(buf, dest=peer, tag=9101)
        if k >= 2:
            times.append((time.perf_counter() - t0) / 2)
    return min(times)


def measure_link(comm: Any) -> LinkProfile | None:
    """Latency and bandwidth between ranks 0 and 1 (on rank 0; None elsewhere)."""
    rank = comm.Get_rank()
    if rank > 1:
        return None
    times = [ping_pong(comm, 1 - rank, n) for n in PING_BYTES]
    if rank != 0:
        return None
    _, slope = fit_line(PING_BYTES, times)
    bandwidth = 1.0 / slope if slope > 0 else PING_BYTES[-1] / times[-1]
    # the smallest message's time is the latency: the fit's intercept is dominated by the large ones
    return LinkProfile(latency_s=times[0], bandwidth_Bps=bandwidth)


def describe(profile: ClusterProfile) -> str:
    """A few lines for the terminal: each node's throughputs and fixed costs, the link."""
    lines = []
    for n, p in enumerate(profile.nodes):
        values = {kind: f" + {1e9 / rate:.2f} ns per output value" for kind in ELEMENT_KINDS if (rate := getattr(p, f"{kind}_elements_per_s"))}
        lines.append(f"node {n}{f' ({p.host})' if p.host else ''}, {p.threads} thread{'s' if p.threads > 1 else ''}: "
                     + ", ".join(f"{kind} {p.ops_per_s(kind) / 1e9:.2f}{values.get(kind, '')}" for kind in OP_KINDS)
                     + f" Gop/s, weights {p.weight_Bps / 1e9:.1f} GB/s ({p.cached_weight_Bps / 1e9:.1f} from the cache); per op "
                     + ", ".join(f"{kind} {p.op_s(kind) * 1e6:.1f}" for kind in OP_KINDS)
                     + f" us; per segment {p.segment_s * 1e6:.1f} us, per value {p.value_s * 1e6:.2f} us, "
                     f"per message sent {p.send_s * 1e6:.1f} us + {p.send_byte_s * 1e12:.0f} ps/B, taken {p.recv_s * 1e6:.1f} us + {p.recv_byte_s * 1e12:.0f} ps/B, a wait {100 * p.wait_share:.1f} % of the segment before it; a segment after others {p.cold_segment_s * 1e6:.1f} us and per op or value {p.cold_s * 1e6:.2f} us")
        if p.cpu_share < 1.0:
            lines.append(f"  under a CPU quota: {p.cpu_share:.0%} of its threads' time, every figure above slowed by it")
        if p.other_speeds:
            lines.append("  other ops timed apart: " + ", ".join(f"{op} {v / 1e9:.2f}" for op, v in p.other_speeds.items())
                         + f" Gop/s (the rest {p.other_ops_per_s / 1e9:.2f})"
                         + (f"; a Concat {p.concat_input_s * 1e6:.2f} us per value it joins" if p.concat_input_s else ""))
        if p.conv_read_Bps:
            lines.append(f"  a convolution's filters read from beyond the cache at {p.conv_read_Bps / 1e9:.1f} GB/s")
        if p.cache_bytes:
            beyond = f"; copies of more at {p.stream_ops_per_s / 1e9:.2f} Gop/s" if p.stream_ops_per_s else ""
            lines.append(f"  a cache of {p.cache_bytes / 2**20:.1f} MB (read and written){beyond}: a node reads its filters "
                         "there, all where its weights and values fit, a share where they do not")
        if p.layer_s:
            lines.append(f"  {len(p.layer_s)} layers of {os.path.basename(profile.model_path)} measured: "
                         f"{sum(p.layer_s.values()) * 1e3:.3f} ms in all; how {len(p.layer_scaling)} of them scale with a piece")
    lines.append(f"link: {profile.link.latency_s * 1e6:.1f} us + {profile.link.bandwidth_Bps / 1e9:.2f} GB/s")
    return "\n".join(lines)


def calibrate_one(threads: int | None, process_pool: bool = False, model: ModelToTime | None = None,
                  provider: str = "cpu") -> ClusterProfile:
    """One node in this process, with all its cores (or `threads`) on `provider` (auto, cpu or
    cuda: its first GPU), and `model`'s layers where given; the default link. `process_pool`: on
    the process's one thread pool, as bbgrap-run runs (only for the command: it is process-wide)."""
    quiet_onnxruntime()
    target = target_for(provider, 0)
    quota = cpu_quota()
    mine = threads or threads_per_rank(1, quota)
    if process_pool:
        PROCESS_THREAD_POOL.start(mine)
    node = measure_node(mine, model, quota=quota, target=target)
    return replace(DEFAULT_PROFILE, nodes=(node,), source=f"bbgrap calibrate (1 node, {target.name})")


def calibrate_mpi(comm: Any, threads: int | None, model: ModelToTime | None = None, provider: str = "cpu") -> ClusterProfile | None:
    """Every rank measures itself (and `model`'s layers where given) on `provider`, a rank's GPU as
    bbgrap-run picks it (backends/devices.py); the profile on rank 0 (None elsewhere)."""
    from mpi4py import MPI

    quiet_onnxruntime()
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    target = target_for(provider, device_for_rank(local.Get_rank(), visible_devices()))
    host = host_ranks(local)
    mine = threads or host.threads()
    PROCESS_THREAD_POOL.start(mine)
    poll(comm.Ibarrier(), nap=0.001)
    node = measure_node(mine, model, comm, host.quota, target)
    poll(comm.Ibarrier(), nap=0.001)
    link = measure_link(comm)
    nodes = allgather(comm, node)
    if comm.Get_rank() != 0:
        return None
    assert link is not None
    return ClusterProfile(tuple(nodes), link, f"bbgrap calibrate ({comm.Get_size()} nodes, {target.name})")


def run(output: str, threads: int | None, model: ModelToTime | None = None, provider: str = "cpu") -> tuple[int, str]:
    """Calibrate on `provider` (under mpirun with more than one rank: one node per rank) and write
    `output` on rank 0; with `model` its layers too. Returns (this rank, what to
    print: the profile on rank 0, '' elsewhere)."""
    from bbgrap.backends.runtime import under_mpi

    profile: ClusterProfile | None
    rank = 0
    if under_mpi():
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        rank = comm.Get_rank()
        profile = calibrate_mpi(comm, threads, model, provider) if comm.Get_size() > 1 else calibrate_one(threads, True, model, provider)
    else:
        profile = calibrate_one(threads, True, model, provider)
    if profile is None:
        return rank, ""
    if model is not None:
        profile = replace(profile, model_sha256=file_sha256(model.path), model_path=os.path.abspath(model.path))
    host = os.uname().nodename
    try:
        write_profile(output, profile, f"{profile.source} on {host}, {time.strftime('%Y-%m-%d %H:%M:%S')}")
    except OSError as exc:
        raise BBGrapError(f"cannot write {output} ({exc.strerror or type(exc).__name__}); free space or choose another -o") from None
    return rank, f"wrote {output}: {len(profile.nodes)} node(s)\n{describe(profile)}"
