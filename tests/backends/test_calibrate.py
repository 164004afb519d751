"""bbgrap calibrate in one process: its models count operations as bbgrap/cost.py does, the fits,
the profile it writes, and bad flags (the run under mpirun -n 2 is in test_mpi.py)."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import onnx
import pytest
from bbgrap.backends.calibrate import add_model, calibrate_one, conv_model, fit_line, matmul_model
from bbgrap.frontends.onnx import import_model

from bbgrap.cli import main
from bbgrap.cluster import OP_KINDS, read_profile
from bbgrap.cost import layer_ops
from bbgrap.ir import ShapeMap


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


@pytest.mark.parametrize(("flags", "problem"), [
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
