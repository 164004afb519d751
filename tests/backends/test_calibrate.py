"""bbgrap calibrate in one process: its models count operations as bbgrap/cost.py does, the fits,
the profile it writes, and bad flags (the run under mpirun -n 2 is in test_mpi.py)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from dataclasses import replace

import onnx
import pytest
from bbgrap.backends.calibrate import add_model, calibrate_one, conv_model, fit_line, matmul_model, measure_layers
from bbgrap.frontends.onnx import import_model
from helpers import save

from bbgrap import zoo
from bbgrap.cli import main
from bbgrap.cluster import OP_KINDS, read_profile
from bbgrap.compiler import compile_model
from bbgrap.config import Config
from bbgrap.cost import layer_ops
from bbgrap.ir import ShapeMap
from bbgrap.plan import file_sha256


@pytest.mark.parametrize(("model", "ops"), [
    conv_model(8, 6, depthwise=False), conv_model(8, 6, depthwise=True), matmul_model(4, 16), add_model(10),
])
def test_models_count_operations_as_the_cost_model_does(tmp_path, model: onnx.ModelProto, ops: float) -> None:
    path = str(tmp_path / "m.onnx")
    onnx.save(model, path)
    graph = import_model(path).graph
    counted = sum(layer_ops(layer, graph, ShapeMap.full(graph.tensors[layer.outputs[0]].shape)) for layer in graph.layers)
    assert math.isclose(counted, ops)


def test_fit_line_recovers_a_line() -> None:
    intercept, slope = fit_line([1.0, 2.0, 4.0], [3.0, 5.0, 9.0])
    assert math.isclose(intercept, 1.0, abs_tol=1e-9) and math.isclose(slope, 2.0)


def test_calibrate_one_node_measures_every_kind_of_op() -> None:
    profile = calibrate_one(threads=1)
    (node,) = profile.nodes
    assert all(node.ops_per_s(kind) > 0 for kind in OP_KINDS)
    assert node.segment_s > 0 and all(node.op_s(kind) >= 0 for kind in OP_KINDS)


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


def test_every_layer_of_a_model_is_timed_in_sequence(small_model: str) -> None:
    front = import_model(small_model)
    times = measure_layers(front.graph, front.sample_inputs, threads=1, runs=2)
    assert set(times) == {layer.name for layer in front.graph.layers}
    assert all(t >= 0 for t in times.values()) and sum(times.values()) > 0


def test_a_layer_that_cannot_run_alone_is_left_out_with_what_reads_it(small_model: str, monkeypatch) -> None:
    import bbgrap.backends.calibrate as calibrate

    front = import_model(small_model)
    first = next(layer for layer in front.graph.layers if ".branch" in layer.name)  # beside it, the other branches
    real = calibrate.segment_model
    monkeypatch.setattr(calibrate, "segment_model", lambda g, seg, types, name: onnx.ModelProto() if name == first.name
                        else real(g, seg, types, name))
    times = measure_layers(front.graph, front.sample_inputs, threads=1, runs=1)
    readers = {layer.name for layer in front.graph.layers if set(layer.inputs) & set(first.outputs)}
    assert readers and first.name not in times and not readers & set(times)
    assert front.graph.layers[0].name in times and any(".branch" in name for name in times)  # the others still are


def test_calibrate_with_a_model_writes_its_layer_times_and_compile_uses_them(small_model: str, tmp_path) -> None:
    out = tmp_path / "cluster.toml"
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "bbgrap"), "calibrate", "-o", str(out), "--threads", "1",
                           "--model", small_model], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    profile = read_profile(str(out))
    assert profile.model_sha256 == file_sha256(small_model) and profile.model_path == os.path.abspath(small_model)
    assert set(profile.nodes[0].layer_s) == {layer.name for layer in import_model(small_model).graph.layers}
    assert "layers of" in proc.stdout
    # the prediction for one node is the measured layers' (the cheap ops fused into a convolution cost nothing)
    plan = compile_model(small_model, Config(nodes=1), str(tmp_path / "plan"), profile=profile)
    plain = compile_model(small_model, Config(nodes=1), str(tmp_path / "plain"), profile=replace(profile, model_sha256="0" * 64))
    assert plan.compiled.prediction is not None and plain.compiled.prediction is not None
    assert plan.compiled.prediction.latency_ms != plain.compiled.prediction.latency_ms


@pytest.mark.parametrize(("flags", "problem"), [
    (["--input-shape", "x:1x3x8x8"], "--input-shape only matters with --model FILE"),
    (["--model", "{tmp}/missing.onnx"], "missing.onnx"),
    (["--threads", "0"], "--threads 0: give at least 1 thread"),
    (["-o", "{tmp}"], "is a directory"),
    (["-o", "{tmp}/missing/cluster.toml"], "does not exist"),
])
def test_bad_flags_are_one_line_and_exit_2(tmp_path, capsys, flags: list[str], problem: str) -> None:
    argv = ["calibrate", "-o", str(tmp_path / "c.toml"), *(f.format(tmp=tmp_path) for f in flags)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert problem in err and err.count("\n") == 1
    assert not (tmp_path / "c.toml").exists()
