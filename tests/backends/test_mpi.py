"""Real `mpirun -n 2` / `-n 4` runs of compiled plans (MPICH from the package index),
and the runtime's handling of a wrong world size."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import MPIRUN, compile_plan, mpirun, save

from bbgrap import zoo
from bbgrap.cluster import NodeProfile, read_profile
from bbgrap.plan import read_manifest

BIN = os.path.dirname(sys.executable)
RUN = os.path.join(BIN, "bbgrap-run")


@pytest.mark.parametrize(("name", "nodes", "direction", "iobinding"), [
    ("resnet18", 2, "h", "off"), ("inception", 2, "w", "off"), ("mobilenet_v2", 4, "h", "off"), ("vgg16", 4, "w", "off"),
    ("densenet", 4, "c", "off"), ("resnet18", 2, "h", "on"), ("mobilenet_v2", 4, "h", "on"),
])
def test_mpirun_is_exact(tmp_path, name: str, nodes: int, direction: str, iobinding: str) -> None:
    # iobinding on: the device-value path (IOBinding) that CUDA uses, here bound to the CPU
    model = save(zoo.build(name, resolution=48, width=0.125), str(tmp_path))
    plan = str(tmp_path / "plan")
    compile_plan(model, plan, nodes=nodes, direction=direction)
    out = tmp_path / "out.npz"
    proc = mpirun(nodes, plan, "--json", "--repeat", "2", "--warmup", "1", "--output", str(out), "--iobinding", iobinding)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["mode"] == "mpi" and result["ranks"] == nodes and result["nodes"] == nodes
    assert result["max_rel_error"] <= 1e-4 and result["ok"]
    assert result["latency_ms"] > 0
    assert len(result["peak_memory_mb"]) == nodes and all(m > 10 for m in result["peak_memory_mb"])  # measured per rank
    assert result["oversubscribed"] == (nodes > len(os.sched_getaffinity(0)))  # more ranks than this host's cores
    assert out.exists()


@pytest.mark.parametrize(("nodes", "direction"), [(2, "h"), (4, "c")])
def test_mpirun_blocked_layout_between_segments_is_exact(tmp_path, nodes: int, direction: str) -> None:
    # wide enough that most activations between segments (and the halos) are in NCHWc blocks
    from bbgrap.backends.nchwc import block_size

    model = save(zoo.build("resnet50", resolution=64, width=0.25, seed=3), str(tmp_path))
    plan = str(tmp_path / "plan")
    compile_plan(model, plan, nodes=nodes, direction=direction)
    for layout, expected in (("auto", f"nchwc{block_size()}" if block_size() else "nchw"), ("nchw", "nchw")):
        # the CPU's blocked layout: on the CPU whatever BBGRAP_TEST_PROVIDER (a GPU rank keeps NCHW)
        proc = mpirun(nodes, plan, "--json", "--repeat", "2", "--warmup", "1", "--layout", layout, "--provider", "cpu")
        assert proc.returncode == 0, proc.stderr
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        assert result["layout"] == expected and result["ok"] and result["max_rel_error"] <= 1e-4


@pytest.mark.parametrize(("name", "nodes", "planner"), [("inception", 2, "heft"), ("resnet18", 3, "dp")])
def test_mpirun_of_a_planned_network_is_exact(tmp_path, name: str, nodes: int, planner: str) -> None:
    """Mixed cuts, layers placed whole on other nodes than 0, ranks idle for stretches: under real MPI."""
    model = save(zoo.build(name, resolution=48, width=0.125), str(tmp_path))
    plan = str(tmp_path / "plan")
    compiled = compile_plan(model, plan, nodes=nodes, search=True, planner=planner, judge=False)
    assert compiled.compiled.planner is not None and compiled.compiled.planner.kept == planner
    proc = mpirun(nodes, plan, "--json", "--repeat", "2", "--warmup", "1", "--check")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["ok"] and result["max_rel_error"] <= 1e-4


def test_mpirun_without_single_copy_transfers_is_exact(tmp_path) -> None:
    # MPICH without CMA (as under Ubuntu's default ptrace_scope): messages larger than its
    # shared-memory cells move in pieces, driven by the runtime's progress calls
    model = save(zoo.build("resnet18", resolution=96, width=0.5), str(tmp_path))
    plan = str(tmp_path / "plan")
    manifest = compile_plan(model, plan, nodes=2, direction="h")
    assert max(m.nbytes for m in manifest.messages) > 8192 * 4, "messages too small to span several cells"
    proc = mpirun(2, plan, "--json", "--repeat", "3", env={"MPIR_CVAR_CH4_CMA_ENABLE": "0"})
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["mode"] == "mpi" and result["ok"] and result["max_rel_error"] <= 1e-4


def test_wrong_world_size_is_one_clear_line(tmp_path) -> None:
    model = save(zoo.build("resnet18", resolution=32, width=0.125), str(tmp_path))
    plan = str(tmp_path / "plan")
    compile_plan(model, plan, nodes=4)
    proc = mpirun(3, plan)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if "bbgrap-run" in ln]
    assert len(lines) == 1 and "has 4 nodes but mpirun started 3 ranks" in lines[0]


def test_mpirun_one_rank_runs_all_nodes_in_process(tmp_path) -> None:
    model = save(zoo.build("resnet18", resolution=32, width=0.125), str(tmp_path))
    plan = str(tmp_path / "plan")
    compile_plan(model, plan, nodes=2)
    proc = mpirun(1, plan, "--json", "--repeat", "1")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["mode"] == "embedded" and result["ok"]


def test_failing_rank_aborts_instead_of_hanging(tmp_path) -> None:
    model = save(zoo.build("resnet18", resolution=32, width=0.125), str(tmp_path))
    plan = tmp_path / "plan"
    compile_plan(model, str(plan), nodes=2)
    # corrupt one segment of node 1 after its manifest was read: rank 1 fails to load it
    seg = next((plan / "node1").glob("seg*.onnx"))
    seg.write_bytes(b"garbage")
    proc = mpirun(2, str(plan), timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("bbgrap-run: error: ") and str(seg) in lines[0], proc.stderr  # once, by rank 0


def test_calibrate_under_mpirun_measures_each_rank_and_the_link(tmp_path) -> None:
    assert MPIRUN, "mpirun not found"
    out = tmp_path / "cluster.toml"
    model = save(zoo.build("resnet18", resolution=32, width=0.125), str(tmp_path))
    proc = subprocess.run([MPIRUN, "-n", "2", os.path.join(BIN, "bbgrap"), "calibrate", "-o", str(out), "--model", model,
                           "--provider", "cpu"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("wrote") == 1  # rank 0 reports, once
    profile = read_profile(str(out))
    assert len(profile.nodes) == 2 and profile.link.bandwidth_Bps > 0 and profile.link.latency_s > 0
    assert all(len(node.layer_s) == 69 for node in profile.nodes)  # every rank timed each of the model's layers
    assert all(node.send_s != NodeProfile().send_s for node in profile.nodes)  # every rank timed its sends
    assert all(node.recv_s > 0 for node in profile.nodes)  # ... and its receives (the default is 0)
    assert all(node.recv_byte_s > 0 for node in profile.nodes)  # ... whose copy grows with the message
    for flags in (["--threads", "-1"], ["--model", str(tmp_path / "missing.onnx")]):
        bad = subprocess.run([MPIRUN, "-n", "2", os.path.join(BIN, "bbgrap"), "calibrate", "-o", str(tmp_path / "bad.toml"), *flags],
                             capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and bad.stderr.count("bbgrap: error:") == 1, bad.stderr
    assert not (tmp_path / "bad.toml").exists()


def test_a_run_refines_the_profile_and_the_refined_plan_runs_exactly(tmp_path) -> None:
    """compile --profile, mpirun bbgrap-run --json --trace, calibrate --refine, compile again: the run's
    JSON carries the plan's prediction and each rank's CPU time, the refined nodes are the profile's
    scaled by each rank's measured over predicted time, and the plan compiled with them is exact."""
    from bbgrap.cluster import ClusterProfile, write_profile

    model = save(zoo.build("resnet18", resolution=48, width=0.125), str(tmp_path))
    profile = str(tmp_path / "cluster.toml")
    write_profile(profile, ClusterProfile((NodeProfile(), NodeProfile())))
    plan = str(tmp_path / "plan")

    def compile_with(path: str, out: str) -> None:
        done = subprocess.run([os.path.join(BIN, "bbgrap"), "compile", model, "--nodes", "2", "--profile", path, "--force-nodes",
                               "--quiet", "-o", out], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr

    compile_with(profile, plan)
    proc = mpirun(2, plan, "--json", "--repeat", "3", "--warmup", "1", "--trace", str(tmp_path / "trace.json"))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    prediction = read_manifest(plan).compiled.prediction
    assert prediction is not None and result["prediction"] == prediction.to_json()
    assert all(r["compute_cpu"] > 0 for r in result["profile_ms"] if r["compute"] > 0)
    (tmp_path / "run.json").write_text(json.dumps(result))
    refined = str(tmp_path / "refined.toml")
    done = subprocess.run([os.path.join(BIN, "bbgrap"), "calibrate", "--refine", str(tmp_path / "run.json"), "--profile", profile,
                           "-o", refined], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    from bbgrap.refine import read_run

    checks = read_run(str(tmp_path / "run.json")).checks(read_profile(profile))
    assert len(checks) == 2 and any(c.measured for c in checks)
    for check, node in zip(checks, read_profile(refined).nodes):
        if check.measured:  # each node as its rank's run says (its segments' line, or its total's ratio)
            fix = check.correction()
            assert node.conv_ops_per_s == pytest.approx(NodeProfile().conv_ops_per_s / fix.scale, rel=1e-6)
            assert node.segment_s == pytest.approx(max(0.0, NodeProfile().segment_s * fix.scale + fix.extra_s), rel=1e-6, abs=1e-12)
    again = str(tmp_path / "again")
    compile_with(refined, again)
    proc = mpirun(2, again, "--json", "--repeat", "1", "--warmup", "1")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["ok"]


def test_mpirun_a_plan_fitted_to_memory_without_prepacking(tmp_path) -> None:
    from tests.passes.test_fit_memory import OVERHEAD_MB, heavy_convs

    plan = str(tmp_path / "plan")
    compile_plan(heavy_convs(tmp_path), plan, nodes=2, direction="h", memory_mb=(OVERHEAD_MB + 3.0,) * 2)
    memory = read_manifest(plan).compiled.memory
    assert memory is not None and not memory.prepack
    proc = mpirun(2, plan, "--json", "--repeat", "1", "--warmup", "1")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["ok"] and result["max_rel_error"] <= 1e-4
    assert result["layout"] == "nchw"  # a plan fitted to memory keeps NCHW between segments, as its estimate assumes
    assert result["estimated_memory_mb"] == list(memory.estimate_mb)
    for peak, baseline, took in zip(result["peak_memory_mb"], result["baseline_memory_mb"], result["plan_memory_mb"], strict=True):
        assert 10 < baseline <= peak and took == pytest.approx(peak - baseline, abs=0.11)
