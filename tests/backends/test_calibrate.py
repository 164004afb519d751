"""bbgrap calibrate in one process: its models count operations as bbgrap/cost.py does, the fits,
the profile it writes, and bad flags (the run under mpirun -n 2 is in test_mpi.py)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from bbgrap.backends.boundary import Lockstep, Message
from bbgrap.backends.calibrate import (
    CHAIN,
    EIGHT_BIT_TIMED,
    IN_NCHW_TIMED,
    OTHER_TIMED,
    QDQ_TIMED,
    READ_CHAIN,
    READ_CHANNELS,
    READ_SIZE,
    STREAM_SIZES,
    FastestTimes,
    KindSpeed,
    Probe,
    ProfilerCost,
    add_model,
    calibrate_one,
    concat_probe,
    concat_speed,
    conv_model,
    conv_ops,
    conv_probe,
    eight_bit_probe,
    fastest_run,
    fusion_anchor,
    kernel_layer,
    layer_times,
    marginal_time,
    matmul_model,
    matmul_probe,
    measure_layers,
    message_fields,
    model_to_time,
    one_thread_add,
    op_speed,
    other_model,
    other_probe,
    pointwise_nchw_probe,
    profiler_cost,
    qconv_probe,
    qdq_probe,
    qmatmul_probe,
    read_model,
    read_speed,
    seconds_per,
    stream_regime,
    stream_speed,
    time_piece,
    wait_share,
    weights_model,
)
from bbgrap.backends.engine import CPU_TARGET, DeviceValues, HostValues, Target, gpu_present, target_for
from bbgrap.frontends.onnx import import_model
from helpers import save
from onnx import helper, numpy_helper
from onnx_builder import build_model

from bbgrap import zoo
from bbgrap.cli import main
from bbgrap.cluster import OP_KINDS, NodeProfile, fit_line, read_profile
from bbgrap.compiler import compile_model
from bbgrap.config import Config
from bbgrap.cost import layer_ops
from bbgrap.ir import BBGrapError, ShapeMap
from bbgrap.plan import file_sha256
from bbgrap.rules.registry import default_registry
from bbgrap.simulate import op_kind


@pytest.mark.parametrize(("model", "ops"), [
    conv_model(8, 6, per_group=8), conv_model(8, 6, per_group=1), conv_model(16, 6, per_group=8), conv_model(8, 6, 1, kernel=7),
    matmul_model(4, 16), add_model(10),
    *(other_model(op, 8) for op in (*OTHER_TIMED, *IN_NCHW_TIMED)),
])
def test_models_count_operations_as_the_cost_model_does(tmp_path, model: onnx.ModelProto, ops: float) -> None:
    path = str(tmp_path / "m.onnx")
    onnx.save(model, path)
    graph = import_model(path).graph
    counted = sum(layer_ops(layer, graph, ShapeMap.full(graph.tensors[layer.outputs[0]].shape)) for layer in graph.layers)
    assert math.isclose(counted, ops)


@pytest.mark.parametrize("op_type", [*OTHER_TIMED, *IN_NCHW_TIMED])
def test_each_other_op_probe_chains_its_op_on_a_value_of_one_shape(op_type: str) -> None:
    probe = other_probe(op_type, 8)
    model = probe.build(CHAIN)
    assert [n.op_type for n in model.graph.node] == [op_type] * CHAIN
    x = np.random.default_rng(1).standard_normal([d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]).astype(np.float32)
    (y,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert y.shape == x.shape and np.isfinite(y).all() and probe.elements == x.size


def _run_and_counted(tmp_path: Any, model: onnx.ModelProto, op_type: str, x: np.ndarray) -> tuple[list[str], list[np.ndarray], float]:
    """A probe's model as onnxruntime runs it: the op types of its optimised graph and its outputs
    for input `x`; and the operations the cost model counts for its first `op_type` layer."""
    opts = ort.SessionOptions()
    opts.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    ran = [n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node]
    ys = sess.run(None, {"x": x})
    path = str(tmp_path / "m.onnx")
    onnx.save(model, path)
    graph = import_model(path).graph
    layer = next(layer for layer in graph.layers if layer.op_type == op_type)
    return ran, ys, layer_ops(layer, graph, ShapeMap.full(graph.tensors[layer.outputs[0]].shape))


def test_fastest_times_answers_each_models_fastest_timing_so_far() -> None:
    """A probe timed again gives the faster of its timings (a spell that slowed the host the first
    time is left out); another model keeps its own."""
    times = iter([2.0, 1.0, 3.0, 5.0])
    fastest = FastestTimes(lambda model: next(times))
    one, other = add_model(4)[0], add_model(8)[0]
    assert [fastest(one), fastest(one), fastest(one), fastest(other)] == [2.0, 1.0, 1.0, 5.0]


def test_the_nchw_input_probe_runs_narrow_1x1_convolutions_side_by_side_on_onnxruntimes_nchw_input_kernel(tmp_path) -> None:
    """Each of the probe's convolutions takes the model's input of 12 channels (fewer than a block:
    onnxruntime's blocked Conv on NCHW input, no reorder of it), is priced as "pointwise_nchw" and
    counted as the probe says; the Sum adds them all."""
    probe = pointwise_nchw_probe(12, 64, 6)
    model = probe.build(CHAIN)
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    assert len(convs) == CHAIN and {n.input[0] for n in convs} == {"x"}
    x = np.random.default_rng(1).standard_normal((1, 12, 6, 6)).astype(np.float32)
    ran, (y,), counted = _run_and_counted(tmp_path, model, "Conv", x)
    assert ran.count("Conv") == CHAIN and "ReorderInput" not in ran
    weights = [numpy_helper.to_array(w)[:, :, 0, 0] for w in model.graph.initializer]
    assert np.allclose(y[0], sum(np.einsum("oc,chw->ohw", w, x[0]) for w in weights), rtol=1e-4, atol=1e-4)
    path = str(tmp_path / "m.onnx")
    graph = import_model(path).graph
    assert [op_kind(layer, graph) for layer in graph.layers if layer.op_type == "Conv"] == ["pointwise_nchw"] * CHAIN
    assert counted == probe.ops and probe.elements == y.size


@pytest.mark.parametrize("op_type", EIGHT_BIT_TIMED)
def test_an_eight_bit_probe_runs_its_ops_side_by_side_on_one_quantized_map_as_a_cnn_stem_pools(tmp_path, op_type: str) -> None:
    """Each of the probe's ops reads the one QuantizeLinear's 8-bit map (not the op before's
    output, whose pooled values would take the kernel's branches more predictably than a model's
    do), with a stem's window of stride 2, runs on the 8-bit values in NCHW (onnxruntime leaves it
    the op it is), and is counted as the cost model counts that op on such a map."""
    probe = eight_bit_probe(op_type, 6)
    model = probe.build(CHAIN)
    pools = [n for n in model.graph.node if n.op_type == op_type]
    assert len(pools) == CHAIN and {n.input[0] for n in pools} == {"q"}
    assert all(helper.get_attribute_value(a) == [2, 2] for n in pools for a in n.attribute if a.name == "strides")
    x = np.random.default_rng(1).standard_normal((1, 64, 12, 12)).astype(np.float32)
    ran, ys, counted = _run_and_counted(tmp_path, model, op_type, x)
    assert ran.count(op_type) == CHAIN
    assert len(ys) == CHAIN and all(y.dtype == np.uint8 and y.shape == (1, 64, 6, 6) for y in ys)
    assert probe.ops == counted == 9 * 64 * 36
    assert probe.elements == 64 * 36


@pytest.mark.parametrize("op_type", QDQ_TIMED)
def test_a_qdq_probe_runs_its_ops_side_by_side_each_as_onnxruntime_runs_it_in_a_model(tmp_path, op_type: str) -> None:
    """Each of the probe's ops reads the one value (a DequantizeLinear the 8-bit map of one
    QuantizeLinear: in sequence they would be a QDQ pair onnxruntime drops), onnxruntime runs every
    one of them (none merged or dropped), and the probe counts one operation per value written, as
    the cost model counts such an op of a model."""
    probe = qdq_probe(op_type, 6)
    model = probe.build(CHAIN)
    ops = [n for n in model.graph.node if n.op_type == op_type]
    assert len(ops) == CHAIN and len({n.input[0] for n in ops}) == 1
    x = np.random.default_rng(1).standard_normal((1, 64, 6, 6)).astype(np.float32)
    ran, ys, counted = _run_and_counted(tmp_path, model, op_type, x)
    assert ran.count(op_type) == CHAIN
    assert len(ys) == CHAIN and all(y.shape == x.shape and y.dtype == (np.float32 if op_type == "DequantizeLinear" else np.uint8) for y in ys)
    assert probe.ops == probe.elements == counted == x.size


def test_a_matmul_probe_chains_matmuls_each_by_its_own_weights() -> None:
    from onnx import numpy_helper

    probe = matmul_probe(4, 16)
    model = probe.build(CHAIN)
    weights = [numpy_helper.to_array(t) for t in model.graph.initializer]
    assert [n.input[1] for n in model.graph.node] == [t.name for t in model.graph.initializer] and len(weights) == CHAIN
    assert all(not np.array_equal(a, b) for a, b in zip(weights, weights[1:]))  # each its own, as a model's layers
    x = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    (y,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(y, x @ weights[0] @ weights[1] @ weights[2], rtol=1e-4, atol=1e-5)
    assert probe.ops == 2.0 * 4 * 16 * 16 and probe.elements == 4 * 16


@pytest.mark.parametrize(("probe", "kernel", "shape"), [(qconv_probe(16, 6), "QLinearConv", (1, 16, 6, 6)),
                                                    (qmatmul_probe(4, 16), "QLinearMatMul", (4, 16))])
def test_an_integer_kernel_probe_chains_ops_onnxruntime_fuses_into_the_kernel(tmp_path, probe: Probe, kernel: str,
                                                                              shape: tuple[int, ...]) -> None:
    """A qconv or qmatmul probe is a chain of QDQ patterns that onnxruntime runs as CHAIN integer
    kernels (the float op left nowhere) and keeps its value's shape, counted as its float op's work."""
    model = probe.build(CHAIN)
    opts = ort.SessionOptions()
    opts.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    ran = [n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node]
    assert ran.count(kernel) == CHAIN and not {"Conv", "MatMul"} & set(ran), ran
    x = np.random.default_rng(1).uniform(-1, 1, shape).astype(np.float32)
    assert sess.run(None, {"x": x})[0].shape == shape
    float_op = conv_probe(16, 6, 16) if kernel == "QLinearConv" else matmul_probe(4, 16)
    assert (probe.ops, probe.elements) == (float_op.ops, float_op.elements)


def test_a_probe_chains_its_op_and_counts_one_ops_work() -> None:
    probe = conv_probe(16, 6, 1, kernel=7)
    model = probe.build(CHAIN)
    assert [n.op_type for n in model.graph.node] == ["Conv"] * CHAIN
    assert all(a.i == 16 for n in model.graph.node for a in n.attribute if a.name == "group")
    assert probe.ops == conv_model(16, 6, 1, kernel=7)[1] == 2.0 * 49 * 16 * 36 and probe.elements == 16 * 36
    # the chain runs: every op keeps the map's shape
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert sess.run(None, {"x": np.ones((1, 16, 6, 6), np.float32)})[0].shape == (1, 16, 6, 6)


def _chain_clock(model_s: float, per_op: Any) -> Any:
    """A `timed` whose model of n ops takes `model_s` (a session's run, a lone op's reorders) + n x per_op(model)."""
    return lambda model: model_s + len(model.graph.node) * per_op(model)


def test_one_ops_time_is_its_share_of_a_chain_without_what_the_model_costs_once() -> None:
    probe = conv_probe(8, 4, 8)
    assert marginal_time(probe, _chain_clock(5e-5, lambda m: 2e-6)) == pytest.approx(2e-6)
    assert marginal_time(probe, lambda m: 1e-5 / len(m.graph.node)) == 0.0  # noise: a longer chain faster, nothing


def test_a_kind_whose_chains_noise_hides_is_priced_by_its_chain_not_as_free() -> None:
    """Where every longer chain ran no slower than its one op (noise on a busy host), the speed is
    the largest probe's chain over its operations, not the 1e12-fold one a zero time would give."""
    probes = [other_probe("MaxPool", s) for s in (14, 21, 28)]
    per_op, per_value = seconds_per(probes, lambda m: 1e-4)
    assert per_op == pytest.approx(1e-4 / (CHAIN * probes[-1].ops)) and per_value == 0.0
    # one probe's time survives the noise: that probe's time over its operations
    some = seconds_per(probes, lambda m: 1e-4 + (len(m.graph.node) > 1 and m.graph.input[0].type.tensor_type.shape.dim[2].dim_value == 21) * 2e-5)
    assert some[0] == pytest.approx(1e-5 / probes[1].ops)


def test_filter_reads_are_timed_on_a_chain_whose_filters_do_not_fit_in_the_cache() -> None:
    """`conv_read_Bps` is a read probe convolution's filter bytes over its time beyond its operations
    at the "conv" throughput and its fixed cost (each of the READ_CHAIN convolutions its own filters,
    more of them than a host's cache holds); 0 (not measured) where there is nothing beyond."""
    model = read_model(READ_CHAIN)
    filters = [t for t in model.graph.initializer]
    assert len(filters) == READ_CHAIN and len({t.raw_data for t in filters[:2]}) == 2  # each its own
    assert READ_CHAIN * 4 * READ_CHANNELS ** 2 * 9 > 32 * 2 ** 20  # beyond a host's 32 MB of cache
    conv = KindSpeed(1e11, 2e-6)
    ops = conv_ops(READ_CHANNELS, READ_SIZE, READ_CHANNELS)
    nbytes = 4.0 * READ_CHANNELS ** 2 * 9
    assert read_speed(_chain_clock(5e-5, lambda m: ops / 1e11 + 2e-6 + nbytes / 2e10), conv) == pytest.approx(2e10)
    assert read_speed(_chain_clock(5e-5, lambda m: ops / 1e11 + 2e-6), conv) == 0.0


def _work(model: onnx.ModelProto) -> tuple[float, float]:
    """A one-kind chain's per-op operations and output values, from its first op."""
    probe = {"Add": lambda: (1.0, 1.0)}.get(model.graph.node[0].op_type)
    if probe is not None:
        n = model.graph.input[0].type.tensor_type.shape.dim[0].dim_value
        return float(n), float(n)
    w = next(i for i in model.graph.initializer if i.name == "w")
    x = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    elements = float(np.prod(x))
    return 2.0 * w.dims[1] * w.dims[2] * w.dims[3] * elements, elements


def test_a_depthwise_convolutions_operations_and_output_values_are_priced_apart() -> None:
    # 1e11 operations per second, 2e9 values per second and 3 us per op; a lone model's 40 us cancels out
    per_op = lambda m: 3e-6 + _work(m)[0] / 1e11 + _work(m)[1] / 2e9  # noqa: E731
    probes = [conv_probe(32, s, 1, k) for k in (3, 7) for s in (7, 14, 28)]
    speed = op_speed(probes, conv_probe(8, 4, 1), _chain_clock(4e-5, per_op), elements=True)
    assert speed.ops_per_s == pytest.approx(1e11) and speed.elements_per_s == pytest.approx(2e9) and speed.op_s == pytest.approx(3e-6)
    # without the values' term (another kind): the line through the operations alone
    line = op_speed([conv_probe(32, s, 32) for s in (7, 14, 28)], conv_probe(8, 4, 8), _chain_clock(4e-5, lambda m: 3e-6 + _work(m)[0] / 1e11))
    assert line.ops_per_s == pytest.approx(1e11) and line.elements_per_s == 0.0 and line.op_s == pytest.approx(3e-6)
    # values that cost nothing (or noise below it): no values' term, the operations' line
    flat = op_speed(probes, conv_probe(8, 4, 1), _chain_clock(4e-5, lambda m: 3e-6 + _work(m)[0] / 1e11), elements=True)
    assert flat.elements_per_s == 0.0 and flat.ops_per_s == pytest.approx(1e11, rel=1e-6)


def test_a_convolution_probe_of_few_rows_is_priced_as_the_threads_run_it() -> None:
    """MLAS deals a blocked convolution's filter sets x output rows among the threads: on 16 threads
    the 7-row probe keeps 9 idle, the 56-row one runs 4 rounds of 14 units' worth. Timings made so
    are fitted back to the speed of threads all busy (and the fixed cost) where the fit knows the
    threads, and to a slower one where it does not."""
    from bbgrap.cluster import thread_stretch

    probes = [conv_probe(64, s, 64) for s in (7, 14, 28, 56)]
    assert [p.units for p in probes] == [7, 14, 28, 56]
    assert conv_probe(128, 7, 1).units == 0 and conv_probe(8, 4, 8).units == 0  # depthwise; not whole blocks
    # the units of a probe of 64 channels (one filter set) are its rows; the tiny probe's 8 channels are not blocked
    units = lambda m: m.graph.input[0].type.tensor_type.shape.dim[2].dim_value if m.graph.initializer[0].dims[0] == 64 else 0  # noqa: E731
    clock = _chain_clock(4e-5, lambda m: 3e-6 + _work(m)[0] * thread_stretch(units(m), 16) / 1e11)
    speed = op_speed(probes, conv_probe(8, 4, 8), clock, threads=16)
    assert speed.ops_per_s == pytest.approx(1e11) and speed.op_s == pytest.approx(3e-6)
    assert op_speed(probes, conv_probe(8, 4, 8), clock).ops_per_s < 0.9e11


def test_fit_line_recovers_a_line() -> None:
    intercept, slope = fit_line([1.0, 2.0, 4.0], [3.0, 5.0, 9.0])
    assert math.isclose(intercept, 1.0, abs_tol=1e-9) and math.isclose(slope, 2.0)


def test_message_costs_are_the_smallest_messages_and_the_slope_per_byte() -> None:
    got = message_fields([Message(4, 6e-6, 5e-7), Message(65536, 8e-6, 7e-6), Message(524288, 1.2e-5, 5.3e-5)])
    assert got["send_s"] == 6e-6 and got["recv_s"] == 5e-7
    assert got["send_byte_s"] == pytest.approx(fit_line([4, 65536, 524288], [6e-6, 8e-6, 1.2e-5])[1])
    assert got["recv_byte_s"] == pytest.approx(1e-10, rel=0.01)
    # a cost falling with bytes (noise): nothing per byte
    assert message_fields([Message(4, 6e-6, 5e-7), Message(65536, 5e-6, 5e-7)])["send_byte_s"] == 0.0


def test_the_wait_share_is_the_slope_of_the_waits_over_the_segments_and_never_negative() -> None:
    busy = [1e-5, 1e-4, 4e-4, 8e-4]
    assert math.isclose(wait_share([Lockstep(b, 1.2e-6 + 0.012 * b) for b in busy]), 0.012)
    assert wait_share([Lockstep(b, 5e-6 - 0.001 * b) for b in busy]) == 0.0


TWO_PASSES = """
import json
import bbgrap.backends.calibrate as calibrate

timings = {}

class Counted(calibrate.FastestTimes):
    def __call__(self, model):
        got = super().__call__(model)
        timings.setdefault(model.SerializeToString(), []).append(got)
        return got

sweeps = []
one_thread = calibrate.one_thread_add
calibrate.FastestTimes = Counted
calibrate.one_thread_add = lambda n, clock: sweeps.append(n) or one_thread(n, clock, repeat=3)
node = calibrate.calibrate_one(2, process_pool=True).nodes[0]
print(json.dumps({"timings": list(timings.values()), "sweeps": sweeps, "speeds": [node.ops_per_s(k) for k in calibrate.OP_KINDS]}))
"""


def test_a_node_of_several_threads_times_its_kinds_and_the_cache_sweep_twice_and_keeps_the_faster() -> None:
    """At two threads (on the process's one pool, as the command runs: its own process) every probe
    of the kinds, of the op types timed apart and of the cache's sweep is timed twice, each answer
    the fastest so far, and the one-thread sweep twice too."""
    done = subprocess.run([sys.executable, "-c", TWO_PASSES], capture_output=True, text=True, timeout=600, check=True)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["timings"] and all(len(t) >= 2 and t[-1] == min(t) for t in got["timings"])
    assert sorted(got["sweeps"]) == sorted(list(STREAM_SIZES) * 2)
    assert all(speed > 0 for speed in got["speeds"])


def test_calibrate_one_node_measures_every_kind_of_op() -> None:
    profile = calibrate_one(threads=1)
    (node,) = profile.nodes
    assert all(node.ops_per_s(kind) > 0 for kind in OP_KINDS)
    assert node.depthwise_elements_per_s >= 0  # 0 where noise left the values' slope at or below 0
    assert node.segment_s > 0 and node.value_s > 0 and all(node.op_s(kind) >= 0 for kind in OP_KINDS)
    # one node sends nothing: the defaults stay
    assert all(getattr(node, f) == getattr(NodeProfile(), f) for f in ("send_s", "send_byte_s", "recv_s", "recv_byte_s"))
    assert node.cold_s >= 0 and node.cold_segment_s >= 0
    assert node.weight_Bps > 0 and node.weight_Bps != NodeProfile().weight_Bps  # measured
    assert node.cached_weight_Bps > 0  # measured (0: not)
    assert node.stream_ops_per_s >= 0 and node.cache_bytes >= 0  # 0 and 0 where no slower regime showed


def test_copies_beyond_the_cache_are_found_where_the_cost_per_value_jumps() -> None:
    sizes = (1000, 2000, 4000, 8000, 16000)
    # 1 ns per value up to 4000 values, 4 ns per further value beyond: the jump is after 4000
    times = [1e-6 + 1e-9 * n if n <= 4000 else 1e-6 + 4e-6 + 4e-9 * (n - 4000) for n in sizes]
    speed, cache = stream_speed(times, sizes)
    assert math.isclose(speed, 1 / 4e-9) and cache == 8 * 4000
    assert stream_speed([1e-6 + 1e-9 * n for n in sizes], sizes) == (0.0, 0.0)  # no jump: a cache larger than the probes
    # noise that shortens the first step does not make the second one look like the cache's end
    noisy = [times[0] + 0.9e-6, *times[1:]]
    assert stream_speed(noisy, sizes) == (speed, cache)
    assert stream_speed([2e-6, 1e-6, 0.5e-6, 0.4e-6, 0.3e-6], sizes) == (0.0, 0.0)  # no slope to go by


def test_a_node_of_several_threads_takes_the_caches_size_from_one_thread_and_the_speed_beyond_it_from_its_own() -> None:
    # one thread: 1 ns per value up to 2^20 values, 3 ns beyond; the node's two threads: 0.5 ns, 1 ns beyond 2^21
    one = [1e-6 + 1e-9 * n if n <= 2**20 else 1e-6 + 1e-9 * 2**20 + 3e-9 * (n - 2**20) for n in STREAM_SIZES]
    node = [1e-6 + 0.5e-9 * n if n <= 2**21 else 1e-6 + 0.5e-9 * 2**21 + 1e-9 * (n - 2**21) for n in STREAM_SIZES]
    assert stream_speed(one) == (pytest.approx(1 / 3e-9), 8 * 2**20)
    assert stream_regime(node, one) == (pytest.approx(1 / 1e-9), 8 * 2**20)
    assert stream_regime(node, None) == stream_speed(node) == (pytest.approx(1 / 1e-9), 8 * 2**21)
    flat = [1e-6 + 0.5e-9 * n for n in STREAM_SIZES]  # the node's threads hide the step: no slower regime, but the cache's size
    assert stream_regime(flat, one) == (0.0, 8 * 2**20)
    assert stream_regime(node, flat) == stream_speed(node)  # one thread saw none: the node's
    # the one-thread sweep runs NumPy's Add: a process on onnxruntime's process-wide pool makes no session of one thread
    assert all(0 < one_thread_add(n, repeat=3) < 1 for n in STREAM_SIZES[:2])


def test_the_weights_probe_streams_the_bytes_it_says() -> None:
    model, nbytes = weights_model(2**20)
    (w,) = model.graph.initializer
    assert nbytes == 2**20 == math.prod(w.dims) * 4 and list(w.dims)[0] == model.graph.input[0].type.tensor_type.shape.dim[1].dim_value


def test_calibrate_writes_a_profile_compile_reads(tmp_path) -> None:
    # a process of its own: the command starts the process-wide thread pool, as bbgrap-run does
    out = tmp_path / "cluster.toml"
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "bbgrap"), "calibrate", "-o", str(out), "--threads", "1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert len(read_profile(str(out)).nodes) == 1
    assert f"wrote {out}" in proc.stdout


@pytest.fixture(scope="module")
def small_model(tmp_path_factory) -> str:
    return save(zoo.build("inception", resolution=32, width=0.125), str(tmp_path_factory.mktemp("model")))


def test_every_layer_of_a_model_is_timed_in_the_model_as_onnxruntime_runs_it(small_model: str) -> None:
    model = model_to_time(small_model)
    times = measure_layers(model.proto, model.front.graph, model.front.sample_inputs, threads=1, segment=0.0, runs=2)
    graph = model.front.graph
    assert set(times) == {layer.name for layer in graph.layers}
    assert all(t >= 0 for t in times.values())
    convs = [layer.name for layer in graph.layers if layer.op_type == "Conv"]
    assert all(times[c] > 0 for c in convs)  # each convolution's kernel, with what onnxruntime fused into it
    assert all(times[layer.name] == 0 for layer in graph.layers if layer.op_type == "BatchNormalization")  # folded away
    assert times["lrn1"] > 0  # an op of its own


def test_the_profilers_own_cost_comes_off_every_kernel_before_the_times_are_scaled_to_the_run(tmp_path) -> None:
    """onnxruntime's profiler reports a kernel of 0.2 us as about 2 us: its own cost is about the
    same for every kernel, so it comes off each kernel's time first; scaling the reported times
    to the run without the profiler instead would leave a small kernel several times its time
    and take that from the large ones."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Softmax", ["c"], ["y"], name="soft", axis=1)]
    front = import_model(save(build_model(nodes, {"x": [1, 8, 8, 8]}, {"w": rng.standard_normal((8, 8, 3, 3)).astype(np.float32)},
                                          ["y"], 17), str(tmp_path)))
    registry = default_registry()

    def events(conv_us: int, soft_us: int) -> list[dict[str, Any]]:
        """Two runs' profile (the first a warm-up) of the two kernels."""
        out: list[dict[str, Any]] = []
        for start in (0, 1000):
            out.append({"cat": "Session", "name": "model_run", "ts": start, "dur": 500})
            out.append({"cat": "Node", "name": "conv_kernel_time", "ts": start + 10, "dur": conv_us})
            out.append({"cat": "Node", "name": "soft_kernel_time", "ts": start + 10 + conv_us, "dur": soft_us})
        return out

    # 98.2 us and 0.2 us of kernel time, as the run without the profiler takes: nothing left to scale
    times = layer_times(events(100, 2), front.graph, registry, profiler=ProfilerCost(1.8e-6, 0.1e-6), run_s=98.4e-6)
    assert times == pytest.approx({"conv": 98.2e-6, "soft": 0.2e-6})
    # the profiler's cost left in and scaled away: the small kernel ten times its time
    scaled = layer_times(events(100, 2), front.graph, registry, profiler=ProfilerCost(), run_s=98.4e-6)
    assert scaled["soft"] == pytest.approx(2e-6 * 98.4 / 102) and scaled["conv"] < 97e-6
    # a kernel reported below the profiler's cost costs the least a kernel takes, not nothing or less
    assert layer_times(events(100, 1), front.graph, registry, ProfilerCost(1.8e-6, 0.1e-6), run_s=98.3e-6)["soft"] == pytest.approx(0.1e-6)


def test_the_profilers_own_cost_is_measured_on_a_chain_of_tiny_kernels() -> None:
    cost = profiler_cost(1, runs=3)
    assert 0.0 <= cost.per_kernel_s < 1e-4 and 0.0 < cost.least_s < 1e-4  # whole microseconds, cut down: a fraction of a microsecond may read as none
    assert 0.0 <= cost.per_input_s < 1e-5 and cost.of(1) == cost.per_kernel_s


def test_the_profilers_cost_per_input_comes_off_a_kernel_of_many_inputs(tmp_path) -> None:
    """The profiler records each input's type and shape: a Concat of many values is reported at
    several times its time, and that cost per input comes off it as the fixed one does."""
    nodes = [helper.make_node("Relu", ["x"], [f"r{i}"], name=f"relu{i}") for i in range(25)]
    nodes.append(helper.make_node("Concat", [f"r{i}" for i in range(25)], ["y"], name="cat", axis=1))
    front = import_model(save(build_model(nodes, {"x": [1, 16, 4, 4]}, {}, ["y"], 17), str(tmp_path)))

    def events() -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for start in (0, 1000):
            out.append({"cat": "Session", "name": "model_run", "ts": start, "dur": 500})
            out.append({"cat": "Node", "name": "relu0_kernel_time", "ts": start + 10, "dur": 3, "args": {"input_type_shape": [{}]}})
            out.append({"cat": "Node", "name": "cat_kernel_time", "ts": start + 20, "dur": 9, "args": {"input_type_shape": [{}] * 25}})
        return out

    cost = ProfilerCost(2e-6, 0.1e-6, 0.25e-6)
    assert cost.of(25) == pytest.approx(2e-6 + 24 * 0.25e-6)
    times = layer_times(events(), front.graph, default_registry(), cost, run_s=2e-6)
    assert times["relu0"] == pytest.approx(1e-6) and times["cat"] == pytest.approx(1e-6)
    # without it, the Concat would take all but a fifth of the run
    assert layer_times(events(), front.graph, default_registry(), ProfilerCost(2e-6, 0.1e-6), run_s=2e-6)["cat"] > 1.6e-6


def test_a_concats_speed_and_its_cost_per_value_joined_come_from_probes_of_unlike_joins() -> None:
    """concat_speed fits time = values / speed + joined x concat_input_s + a constant through the
    probes' marginal times; its probes' Concats take their inputs in orders of their own (onnxruntime
    would merge alike ones) and each writes its own output."""
    model = concat_probe(3, 7).build(3)
    orders = [tuple(n.input) for n in model.graph.node]
    assert len(set(orders)) == 3 and all(sorted(o) == ["x0", "x1", "x2"] for o in orders) and len(model.graph.output) == 3
    assert concat_probe(3, 7).ops == 3 * 16 * 49

    def timed(m: onnx.ModelProto) -> float:  # a session's 10 us, each Concat 1 us + 0.1 ns a value + 0.3 us a value joined
        return 1e-5 + sum(1e-6 + 1e-10 * 16 * len(n.input) * m.graph.input[0].type.tensor_type.shape.dim[2].dim_value ** 2
                          + 3e-7 * len(n.input) for n in m.graph.node)

    speed, per_join = concat_speed(timed)
    assert speed == pytest.approx(1e10) and per_join == pytest.approx(3e-7)
    # noise that makes joining pay back: no term for it, the values' line alone
    def noisy(m: onnx.ModelProto) -> float:
        return 1e-5 + sum(1e-10 * 16 * len(n.input) * m.graph.input[0].type.tensor_type.shape.dim[2].dim_value ** 2
                          - 1e-9 * len(n.input) for n in m.graph.node)

    speed, per_join = concat_speed(noisy)
    assert per_join == 0.0 and 0.9e10 < speed < 1.1e10


def exporter_named_convs() -> onnx.ModelProto:
    """Two convolutions, a ReLU after the first and a SiLU (x * Sigmoid(x)) after the second, their
    values named as the PyTorch exporters name them ('/conv1/Conv' makes '/conv1/Conv_output_0'):
    onnxruntime names its NCHWc kernels after the value their node makes, not after the node, and
    runs the SiLU as one QuickGelu kernel named '/silu/Mul/QuickGeluFusion/'."""
    rng = np.random.default_rng(0)
    names = ["/conv1/Conv", "/relu1/Relu", "/conv2/Conv", "/silu/Sigmoid", "/silu/Mul"]
    outs = [f"{n}_output_0" for n in names]
    nodes = [helper.make_node("Conv", ["x", "w1"], [outs[0]], name=names[0], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", [outs[0]], [outs[1]], name=names[1]),
             helper.make_node("Conv", [outs[1], "w2"], [outs[2]], name=names[2], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", [outs[2]], [outs[3]], name=names[3]),
             helper.make_node("Mul", [outs[2], outs[3]], [outs[4]], name=names[4])]
    weights = {"w1": rng.standard_normal((32, 16, 3, 3)).astype(np.float32), "w2": rng.standard_normal((32, 32, 3, 3)).astype(np.float32)}
    return build_model(nodes, {"x": [1, 16, 32, 32]}, weights, [outs[4]], 17)


def test_layers_are_timed_where_onnxruntime_names_kernels_after_their_values(tmp_path) -> None:
    model = model_to_time(save(exporter_named_convs(), str(tmp_path)))
    times = measure_layers(model.proto, model.front.graph, model.front.sample_inputs, threads=1, segment=0.0, runs=3)
    assert set(times) == {layer.name for layer in model.front.graph.layers}
    assert times["/conv1/Conv"] > 0 and times["/conv2/Conv"] > 0
    assert times["/relu1/Relu"] == 0  # in its convolution's kernel
    assert times["/silu/Mul"] > 0 and times["/silu/Sigmoid"] == 0  # the SiLU's one kernel, named after the Mul
    # the second convolution does twice the first's operations: neither takes the other's time
    assert 0.8 < times["/conv2/Conv"] / times["/conv1/Conv"] < 5


def test_a_small_models_fastest_run_is_taken_over_a_span_of_time_not_a_dozen_runs() -> None:
    class Sleepy:
        """A session whose every run takes at least 1 ms."""

        runs = 0

        def run(self) -> None:
            self.runs += 1
            time.sleep(0.001)

    sess = Sleepy()
    fastest = fastest_run(sess.run, runs=3, seconds=0.02)
    assert 3 < sess.runs <= 21  # until 20 ms of runs: more than the 3 asked for, never more than 1 ms each allows
    assert fastest >= 0.001


def test_kernels_are_given_to_the_layer_they_are_named_after_or_its_convolution() -> None:
    layers = {name: None for name in ("conv1", "classifier.0", "features.norm1", "layer1.1.relu")}
    assert kernel_layer("layer1.1.relu_nchwc", layers) == "layer1.1.relu"  # type: ignore[arg-type]
    assert kernel_layer("fused classifier.0", layers) == "classifier.0"  # type: ignore[arg-type]
    assert kernel_layer("features.norm1_bn_nchwc", layers) == "features.norm1"  # type: ignore[arg-type]
    assert kernel_layer("conv1", layers) == "conv1"  # type: ignore[arg-type]
    assert kernel_layer("ReorderOutput_token_12", layers) is None  # type: ignore[arg-type]
    made = {"/stem/Relu_output_0": SimpleNamespace(name="/stem/Relu")}
    assert kernel_layer("/stem/Relu_output_0_nchwc", layers, made) == "/stem/Relu"  # type: ignore[arg-type]
    assert kernel_layer("classifier.0/QuickGeluFusion/", layers) == "classifier.0"  # type: ignore[arg-type]
    assert kernel_layer("conv1/MatMulAddFusion_token_3", layers) == "conv1"  # type: ignore[arg-type]
    graph = import_model(save(zoo.build("resnet18", resolution=32, width=0.125), tempfile.mkdtemp())).graph
    registry = default_registry()
    assert fusion_anchor(graph.layer("layer1.1.relu"), graph, registry) == "layer1.1.conv2"  # relu <- add <- bn2 <- conv2, not the skip
    assert fusion_anchor(graph.layer("layer1.0.bn1"), graph, registry) == "layer1.0.conv1"
    assert fusion_anchor(graph.layer("layer1.0.conv1"), graph, registry) == "layer1.0.conv1"
    assert fusion_anchor(graph.layer("maxpool"), graph, registry) == "maxpool"


def test_calibrate_with_a_model_writes_its_layer_times_and_compile_uses_them(small_model: str, tmp_path) -> None:
    out = tmp_path / "cluster.toml"
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "bbgrap"), "calibrate", "-o", str(out), "--threads", "1",
                           "--model", small_model, "--provider", "cpu"], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    profile = read_profile(str(out))
    assert profile.model_sha256 == file_sha256(small_model) and profile.model_path == os.path.abspath(small_model)
    assert set(profile.nodes[0].layer_s) == {layer.name for layer in import_model(small_model).graph.layers}
    assert "layers of" in proc.stdout
    graph = import_model(small_model).graph
    timed = {k for k, v in profile.nodes[0].layer_s.items() if v > 0}
    scalable = {layer.name for layer in graph.layers if layer.op_type in ("Conv", "Gemm", "MatMul")} & timed
    assert any(graph.layer(k).op_type == "Conv" for k in scalable) and set(profile.nodes[0].layer_scaling) == scalable
    assert all(0 <= s.rows <= 1 and 0 <= s.channels <= 1 for s in profile.nodes[0].layer_scaling.values())
    # the prediction for one node is the measured layers' (the cheap ops fused into a convolution cost nothing)
    plan = compile_model(small_model, Config(nodes=1), str(tmp_path / "plan"), profile=profile)
    plain = compile_model(small_model, Config(nodes=1), str(tmp_path / "plain"), profile=replace(profile, model_sha256="0" * 64))
    assert plan.compiled.prediction is not None and plain.compiled.prediction is not None
    assert plan.compiled.prediction.latency_ms != plain.compiled.prediction.latency_ms
    assert plan.compiled.prediction.layer_times and not plain.compiled.prediction.layer_times
    assert plan.compiled.prediction.profile == plain.compiled.prediction.profile == profile.source
    assert plan.compiled.prediction.label.endswith("with this model's layer times") and plain.compiled.prediction.label == profile.source


def test_a_piece_is_timed_through_device_values_as_on_a_gpu() -> None:
    # calibrate --provider cuda's path (Target.runner: inputs bound once, outputs left on the device), on the CPU
    model, _ = conv_model(8, 14, per_group=8)
    bound = Target(("CPUExecutionProvider",), DeviceValues("cpu", 0))
    (host, host_shape), (dev, dev_shape) = (time_piece(model, 1, repeat=3, target=t) for t in (CPU_TARGET, bound))
    assert host_shape == dev_shape == (1, 8, 14, 14) and host > 0 and dev > 0


class CountingHostValues(HostValues):
    """Host values that count the runs made through them."""

    def __init__(self) -> None:
        self.runs = 0

    def run(self, session: Any, inputs: list[str], outputs: list[str], values: dict[str, Any]) -> list[Any]:
        self.runs += 1
        return super().run(session, inputs, outputs, values)


def test_a_run_calibrate_times_goes_through_the_values_run_as_a_plans_segment_does() -> None:
    # the plan's runner runs every segment through its values' `run` (on the host onnxruntime's binding,
    # without InferenceSession.run's per-call checks); calibrate times its runs the same way on any target
    model, _ = conv_model(8, 14, per_group=8)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((1, 8, 14, 14)).astype(np.float32)
    values = CountingHostValues()
    run = Target(("CPUExecutionProvider",), values).runner(sess, {sess.get_inputs()[0].name: x})
    got = run()
    assert values.runs == 1 and isinstance(got, list) and len(got) == 1
    np.testing.assert_array_equal(got[0], sess.run(None, {sess.get_inputs()[0].name: x})[0])


def test_a_gpu_target_is_asked_for_only_where_there_is_one() -> None:
    assert target_for("cpu", 0) is CPU_TARGET and not CPU_TARGET.on_gpu and CPU_TARGET.name == "cpu"
    if not gpu_present():
        assert target_for("auto", 0) is CPU_TARGET
        with pytest.raises(BBGrapError, match="--provider cuda"):
            target_for("cuda", 0)


@pytest.mark.skipif(gpu_present(), reason="this host has a GPU: --provider cuda calibrates it (tests/backends on a GPU host)")
def test_calibrating_a_gpu_that_is_not_there_is_one_line_and_writes_nothing(tmp_path, capsys) -> None:
    assert main(["calibrate", "-o", str(tmp_path / "c.toml"), "--provider", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bbgrap: error: --provider cuda:") and "--provider cpu" in err and err.count("\n") == 1
    assert not (tmp_path / "c.toml").exists()


@pytest.mark.parametrize(("flags", "problem"), [
    (["--input-shape", "x:1x3x8x8"], "--input-shape only matters with --model FILE"),
    (["--refine", "{tmp}/run.json", "--profile", "{tmp}/p.toml", "--provider", "cpu"], "--refine measures nothing"),
    (["--model", "{tmp}/missing.onnx"], "missing.onnx"),
    (["--threads", "-1"], "--threads -1: give at least 1 thread, or 0 for the rank's share of its cores"),
    (["-o", "{tmp}"], "is a directory"),
    (["-o", "{tmp}/missing/cluster.toml"], "does not exist"),
])
def test_bad_flags_are_one_line_and_exit_2(tmp_path, capsys, flags: list[str], problem: str) -> None:
    argv = ["calibrate", "-o", str(tmp_path / "c.toml"), *(f.format(tmp=tmp_path) for f in flags)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert problem in err and err.count("\n") == 1
    assert not (tmp_path / "c.toml").exists()
