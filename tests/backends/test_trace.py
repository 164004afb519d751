"""`bbgrap-run --trace`: a valid Chrome trace-event file, one event per segment run and per
message of every rank, in program order, adding up to the measured latency."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest
from bbgrap.backends.trace import check_trace
from helpers import MPIRUN, compile_plan, save

from bbgrap import zoo
from bbgrap.plan import read_manifest
from bbgrap.plan_schema import RunStep

BIN = os.path.dirname(sys.executable)


@pytest.fixture(scope="module")
def resnet50_plan(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("trace")
    # large enough that the Python between a rank's steps stays well under 5 % of an inference
    model = save(zoo.build("resnet50", resolution=128, width=0.5), str(d))
    plan = str(d / "plan")
    compile_plan(model, plan, nodes=4, direction="h", search=True)
    return plan


def run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def steps_by_inference(trace: dict, pid: int) -> dict[int, list[dict]]:
    events = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == pid]
    out: dict[int, list[dict]] = {}
    for inf in (e for e in events if e["cat"] == "inference"):
        inside = [e for e in events if e["cat"] != "inference" and inf["ts"] <= e["ts"] <= inf["ts"] + inf["dur"]]
        out[inf["args"]["inference"]] = [inf] + sorted(inside, key=lambda e: e["ts"])
    return out


@pytest.mark.parametrize("mode", ["mpi", "in-process"])
def test_trace_has_every_step_in_order_and_adds_up(tmp_path, resnet50_plan: str, mode: str) -> None:
    trace_path = str(tmp_path / "trace.json")
    cmd = [os.path.join(BIN, "bbgrap-run"), resnet50_plan, "--repeat", "4", "--warmup", "1", "--json", "--trace", trace_path]
    proc = run(([MPIRUN, "-n", "4"] if mode == "mpi" else []) + cmd)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    trace = json.load(open(trace_path))
    assert check_trace(trace) == []
    manifest = read_manifest(resnet50_plan)
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {n: f"rank {n} (node {n})" for n in range(4)}
    for node, program in enumerate(manifest.programs):
        inferences = steps_by_inference(trace, node)
        assert sorted(inferences) == [0, 1, 2, 3]
        for events in inferences.values():
            inference, steps = events[0], events[1:]
            kinds = [(e["cat"], e["args"].get("message")) for e in steps if e["cat"] in ("run", "send", "wait")]
            expected = [(op, k if op != "run" else None) for op, k, *_ in (s.to_json() for s in program.steps)]
            assert kinds == expected, "steps missing or out of program order"
            runs = [e for e in steps if e["cat"] == "run"]
            assert [e["args"]["file"] for e in runs] == [program.segments[s.segment].file for s in program.steps if isinstance(s, RunStep)]
            assert all(e["args"]["layers"] for e in runs)
            for e in steps:
                if e["cat"] in ("send", "wait"):
                    m = next(m for m in manifest.messages if m.id == e["args"]["message"])
                    assert e["args"]["peer"] == (m.dst if e["cat"] == "send" else m.src) and e["args"]["bytes"] == m.nbytes > 0
            if mode == "mpi":
                assert [s["cat"] for s in (steps[0], steps[-1])] == ["start", "finish"]
            # the steps lie inside the inference and cover most of it (the rest is the Python between
            # them, which a busy host can stretch: no tighter bound holds on a shared machine)
            covered = sum(e["dur"] for e in steps)
            assert 0.5 * inference["dur"] <= covered <= inference["dur"] * (1 + 1e-6) + 1.0
            # each step's CPU time, of the one thread that ran it: at most its duration, and the
            # segments' real work shows in it
            assert all(0.0 <= e["args"]["cpu_us"] <= e["dur"] + 1.0 for e in steps)
            assert sum(e["args"]["cpu_us"] for e in runs) > 0.0
    rank0 = statistics.median(e[0]["dur"] for e in steps_by_inference(trace, 0).values()) / 1e3
    if mode == "mpi":  # rank 0's inferences are what bbgrap-run reports as its latency
        assert rank0 == pytest.approx(result["latency_ms"], rel=0.05)
        for node in range(4):  # each segment's median run in --json (what calibrate --refine fits), as the trace has them
            runs_of: dict[int, list[dict]] = {}
            for events in steps_by_inference(trace, node).values():
                for e in events:
                    if e["cat"] == "run":
                        runs_of.setdefault(int(e["name"].split()[-1]), []).append(e)
            timed = result["profile_ms"][node]
            assert timed["segments"] == pytest.approx([statistics.median(e["dur"] for e in runs_of[k]) / 1e3 for k in sorted(runs_of)], abs=2e-3)
            assert timed["segments_cpu"] == pytest.approx([statistics.median(e["args"]["cpu_us"] for e in runs_of[k]) / 1e3
                                                           for k in sorted(runs_of)], abs=2e-3)


def test_check_trace_finds_broken_files() -> None:
    good = {"traceEvents": [{"ph": "X", "name": "a", "pid": 0, "tid": 0, "ts": 0.0, "dur": 10.0},
                            {"ph": "X", "name": "b", "pid": 0, "tid": 0, "ts": 2.0, "dur": 3.0}]}
    assert check_trace(good) == []
    crossing = {"traceEvents": good["traceEvents"] + [{"ph": "X", "name": "c", "pid": 0, "tid": 0, "ts": 8.0, "dur": 5.0}]}
    assert "overlaps" in check_trace(crossing)[0]
    assert check_trace([]) == ["not an object with a 'traceEvents' list"]
    assert "dur >= 0" in check_trace({"traceEvents": [{"ph": "X", "name": "a", "pid": 0, "tid": 0, "ts": 0, "dur": -1}]})[0]
    assert "integers" in check_trace({"traceEvents": [{"ph": "X", "name": "a", "pid": "0", "tid": 0, "ts": 0, "dur": 1}]})[0]


def test_trace_into_a_missing_directory_is_one_line_before_running(tmp_path, resnet50_plan: str) -> None:
    proc = run([os.path.join(BIN, "bbgrap-run"), resnet50_plan, "--trace", str(tmp_path / "no" / "t.json")])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--trace" in proc.stderr and "does not exist" in proc.stderr


@pytest.mark.parametrize("mode", ["mpi", "in-process"])
def test_trace_ops_puts_onnxruntimes_ops_inside_their_segments(tmp_path, resnet50_plan: str, mode: str) -> None:
    trace_path = str(tmp_path / "trace.json")
    cmd = [os.path.join(BIN, "bbgrap-run"), resnet50_plan, "--repeat", "2", "--warmup", "1", "--trace", trace_path, "--trace-ops"]
    proc = run(([MPIRUN, "-n", "4"] if mode == "mpi" else []) + cmd)
    assert proc.returncode == 0, proc.stderr
    trace = json.load(open(trace_path))
    assert check_trace(trace) == []
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    for rank in range(4):
        last = [e for e in steps_by_inference(trace, rank)[1] if e["cat"] == "run"]
        ops = [e for e in events if e["pid"] == rank and e["cat"] == "op"]
        assert {e["args"]["segment"] for e in ops} == {int(e["name"].split()[-1]) for e in last}, "a segment without its ops"
        for op in ops:  # each op of the last inference inside its segment's run (1 us of rounding)
            seg = next(e for e in last if e["name"] == f"segment {op['args']['segment']}")
            assert seg["ts"] - 1 <= op["ts"] and op["ts"] + op["dur"] <= seg["ts"] + seg["dur"] + 1
        assert {e["args"]["op"] for e in ops} >= {"Conv"}


def test_trace_ops_without_trace_is_one_line(resnet50_plan: str) -> None:
    proc = run([os.path.join(BIN, "bbgrap-run"), resnet50_plan, "--trace-ops"])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--trace FILE.json" in proc.stderr
