"""bbgrap-run as a user runs it, with wrong results and bad input (issue 12): a non-finite
output is a mismatch (exit 1); a damaged or mixed plan, a bad flag or a bad --input is one
line on stderr, exit 2, the same line under `mpirun -n 2` (printed once, by rank 0), with
no traceback and none of onnxruntime's banners; --check runs the original model;
--version."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from bbgrap.backends.engine import gpu_present, load_segment
from bbgrap.backends.runtime import compare, mismatch, plan_id_problem
from helpers import MPIRUN, assert_exact, compile_plan, save
from onnx import numpy_helper

from bbgrap import zoo
from bbgrap.plan import file_sha256

BIN = os.path.dirname(sys.executable)
RUN = os.path.join(BIN, "bbgrap-run")
QUICK = ("--repeat", "1", "--warmup", "0")


def run(*args: str, ranks: int = 0) -> subprocess.CompletedProcess[str]:
    """bbgrap-run alone (ranks 0), or under `mpirun -n ranks`."""
    cmd = [RUN, *args]
    if ranks:
        assert MPIRUN, "mpirun not found: install with pip install -e '.[test]' (pulls the mpich wheel)"
        cmd = [MPIRUN, "-n", str(ranks), *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


def one_line(proc: subprocess.CompletedProcess[str], *words: str) -> str:
    """Exit 2 with one line on stderr naming `words`, nothing else anywhere."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("bbgrap-run: error: "), lines[0]
    assert "Traceback" not in proc.stderr and "\x1b[" not in proc.stderr + proc.stdout
    assert not proc.stdout.strip(), proc.stdout  # e.g. onnxruntime's "*** EP Error *** ... Falling back" banner
    assert "mpirun -n 0" not in lines[0]
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """(model, plan) for 2 nodes; tests copy the plan before changing it."""
    d = tmp_path_factory.mktemp("runtime-errors")
    model = save(zoo.build("resnet18", resolution=32, width=0.125), str(d))
    plan = str(d / "plan")
    compile_plan(model, plan, nodes=2)
    return model, plan


def copy_plan(plan: str, tmp_path: Path) -> Path:
    target = tmp_path / "plan"
    shutil.copytree(plan, target)
    return target


def rewrite_manifest(plan: Path, change: Callable[[dict], object]) -> None:
    manifest = json.loads((plan / "plan.json").read_text())
    change(manifest)
    (plan / "plan.json").write_text(json.dumps(manifest))


def nan_weights(plan: Path, node: int) -> None:
    """Every float initializer of `node`'s segments NaN, and the manifest's checksums updated to
    match: a self-consistent plan (as a compiler bug or NaN weights in the model would give),
    which the per-file checks must not be what catches. The NaN weights are written into the
    segments themselves (the shared weights file, which other nodes read too, stays)."""
    for seg in sorted((plan / f"node{node}").glob("seg*.onnx")):
        model = load_segment(str(plan), str(seg.relative_to(plan)))
        for init in model.graph.initializer:
            arr = numpy_helper.to_array(init)
            if arr.dtype.kind == "f":
                init.CopyFrom(numpy_helper.from_array(np.full_like(arr, np.nan), init.name))
        onnx.save(model, str(seg))
    rewrite_manifest(plan, lambda m: m["files"].update(
        {f"node{node}/{seg.name}": file_sha256(str(seg)) for seg in (plan / f"node{node}").glob("seg*.onnx")}))


# ---- defect 1: NaN passes the check --------------------------------------------------------


def test_compare_counts_non_finite_values_the_reference_lacks_as_infinite() -> None:
    ref = {"y": np.array([1.0, -2.0, 4.0], np.float32)}
    assert compare({"y": ref["y"].copy()}, ref) == (0.0, 0.0)
    assert compare({"y": np.array([1.0, -2.0, 3.0], np.float32)}, ref) == (1.0, 0.25)
    for bad in (np.nan, np.inf, -np.inf):
        assert compare({"y": np.array([1.0, bad, 4.0], np.float32)}, ref) == (math.inf, math.inf)
        assert compare({"y": np.full(3, bad, np.float32)}, ref) == (math.inf, math.inf)
    # a finite value where the reference is not, and different non-finite values at one place
    assert compare(ref, {"y": np.array([1.0, np.nan, 4.0], np.float32)}) == (math.inf, math.inf)
    assert compare({"y": np.array([np.inf, 0.0])}, {"y": np.array([-np.inf, 0.0])}) == (math.inf, math.inf)
    assert compare({"y": np.array([np.nan, 0.0])}, {"y": np.array([np.inf, 0.0])}) == (math.inf, math.inf)
    assert compare({"y": np.array([np.nan, 0.0])}, {"y": np.array([0.0, np.nan])}) == (math.inf, math.inf)
    # the same non-finite value at the same place reproduces the model there; the rest is measured
    assert compare({"y": np.array([np.nan, np.inf, 2.5])}, {"y": np.array([np.nan, np.inf, 2.0])}) == (0.5, 0.25)
    assert compare({}, ref) == (math.inf, math.inf)  # an output missing
    assert compare({"y": ref["y"][:2]}, ref) == (math.inf, math.inf)  # another shape


def test_mismatch_names_the_output_and_the_first_place() -> None:
    ref = {"y": np.array([[1.0, np.nan], [np.inf, 4.0]], np.float32)}
    assert mismatch({"y": ref["y"].copy()}, ref) is None
    assert mismatch({"y": np.array([[1.5, np.nan], [np.inf, 9.0]], np.float32)}, ref) is None  # only finite errors: compare's
    assert mismatch({}, ref) == "output 'y' is missing"
    assert mismatch({"y": ref["y"][:1]}, ref) == "output 'y' has shape [1, 2] where the model's has [2, 2]"
    got = {"y": np.array([[1.0, 0.0], [-np.inf, np.nan]], np.float32)}
    assert mismatch(got, ref) == "output 'y' differs from the model in non-finite values at 3 place(s) (first at [0, 1]: 0.0 where the model has nan)"


@pytest.mark.parametrize("ranks", [0, 2])
def test_nan_weights_are_a_mismatch(compiled: tuple[str, str], tmp_path, ranks: int) -> None:
    plan = copy_plan(compiled[1], tmp_path)
    nan_weights(plan, 1)
    proc = run(str(plan), *QUICK, ranks=ranks)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "MISMATCH" in proc.stdout and "in non-finite values at" in proc.stdout, proc.stdout
    assert "Traceback" not in proc.stderr and "differs from the reference: output" in proc.stderr, proc.stderr
    line = run(str(plan), *QUICK, "--json", ranks=ranks).stdout.strip().splitlines()[-1]
    result = json.loads(line, parse_constant=lambda c: pytest.fail(f"--json wrote {c}, which JSON does not have"))
    assert result["ok"] is False and result["max_rel_error"] is None and result["max_abs_error"] is None
    assert "in non-finite values at" in result["mismatch"] and result["reference"] == "sample"


def test_assert_exact_fails_on_nan_weights(compiled: tuple[str, str], tmp_path) -> None:
    plan = copy_plan(compiled[1], tmp_path)
    assert_exact(str(plan))  # the plan as compiled is exact
    nan_weights(plan, 1)
    with pytest.raises(AssertionError, match="non-finite"):
        assert_exact(str(plan))


# ---- defects 3, 10, 11, 12: bad plans and bad input, in-process and under mpirun ----------


def damage(case: str, plan: Path, tmp_path: Path) -> list[str]:
    """Damage the copied `plan` as `case` says; bbgrap-run's arguments."""
    args = [str(plan)]
    if case == "no plan":
        args = [str(tmp_path / "nosuch")]
    elif case == "truncated plan.json":
        (plan / "plan.json").write_text((plan / "plan.json").read_text()[:100])
    elif case == "plan.json not an object":
        (plan / "plan.json").write_text("[1, 2]")
    elif case == "plan.json without programs":
        rewrite_manifest(plan, lambda m: m.pop("programs"))
    elif case == "plan.json with nodes 0":
        rewrite_manifest(plan, lambda m: m.update(nodes=0))
    elif case == "plan.json with 3 nodes":
        rewrite_manifest(plan, lambda m: m.update(nodes=3))
    elif case == "other version":
        rewrite_manifest(plan, lambda m: m.update(version=99))
    elif case == "sample.npz missing":
        (plan / "sample.npz").unlink()
    elif case == "sample.npz corrupt":
        (plan / "sample.npz").write_bytes(b"PK\x03\x04 not a zip")
    elif case == "damaged segment":
        seg = plan / "node1" / "seg000.onnx"
        data = bytearray(seg.read_bytes())
        data[len(data) // 2] ^= 0xFF
        seg.write_bytes(bytes(data))
    elif case == "segment onnxruntime cannot load":  # damaged with its checksum updated (e.g. a compiler bug)
        seg = plan / "node1" / "seg000.onnx"
        data = bytearray(seg.read_bytes())
        data[len(data) // 2] ^= 0xFF
        data[100] ^= 0xFF
        seg.write_bytes(bytes(data))
        rewrite_manifest(plan, lambda m: m["files"].update({"node1/seg000.onnx": file_sha256(str(seg))}))
    elif case == "node from another compile":
        other = tmp_path / "other"
        compile_plan(save(zoo.build("resnet18", resolution=32, width=0.125, seed=7), str(tmp_path), "other"), str(other), nodes=2)
        shutil.rmtree(plan / "node1")
        shutil.copytree(other / "node1", plan / "node1")
    elif case == "string array in --input":
        np.savez(tmp_path / "in.npz", input=np.full((1, 3, 32, 32), "x"))
        args += ["--input", str(tmp_path / "in.npz")]
    elif case == "--input not an npz":
        (tmp_path / "in.npz").write_text("hello")
        args += ["--input", str(tmp_path / "in.npz")]
    elif case == "--output into a missing directory":
        args = [str(tmp_path / "nosuch"), "--output", str(tmp_path / "missing" / "out.npz")]  # found before the plan
    elif case == "--output a directory":
        args += ["--output", str(tmp_path)]
    elif case == "--output over --input":
        np.savez(tmp_path / "in.npz", input=np.zeros((1, 3, 32, 32), np.float32))
        args += ["--input", str(tmp_path / "in.npz"), "--output", str(tmp_path / "in.npz")]
    elif case == "--output over the plan's model":  # a copy of it, recorded as the plan's model
        shutil.copy(json.loads((plan / "plan.json").read_text())["source"]["path"], tmp_path / "model.onnx")
        rewrite_manifest(plan, lambda m: m["source"].update(path=str(tmp_path / "model.onnx")))
        args += ["--output", str(tmp_path / "model.onnx")]
    elif case == "--trace into the plan":
        args += ["--trace", str(plan / "plan.json")]
    elif case == "segment reads a value it lacks":  # 2026-11-24's audit: a KeyError deep in the run
        rewrite_manifest(plan, lambda m: m["programs"][1]["segments"][-1]["inputs"].append("nosuch"))
    elif case == "segment and manifest name a value apart":  # renamed in the manifest only, consistently
        name = json.loads((plan / "plan.json").read_text())["programs"][1]["segments"][0]["outputs"][0]
        (plan / "plan.json").write_text((plan / "plan.json").read_text().replace(json.dumps(name), json.dumps(name + "x")))
    elif case == "--threads 20000":  # onnxruntime started them all: minutes, and deaf to SIGTERM
        args += ["--threads", "20000"]
    elif case == "--output over --trace":
        args += ["--output", str(tmp_path / "same.json"), "--trace", str(tmp_path / "same.json")]
    elif case.startswith("--tolerance "):
        args += [f"--tolerance={case.split()[1]}"]  # "=": argparse reads a lone "-1e-3" as an option
    elif case == "--check, model gone":
        rewrite_manifest(plan, lambda m: m["source"].update(path=str(tmp_path / "gone.onnx")))
        args += ["--check"]
    elif case == "--check, model changed":
        changed = save(zoo.build("resnet18", resolution=32, width=0.125, seed=5), str(tmp_path), "changed")
        rewrite_manifest(plan, lambda m: m["source"].update(path=changed))
        args += ["--check"]
    elif case == "--model missing":
        args += ["--model", str(tmp_path / "nosuch.onnx")]
    elif case == "--model not a model":
        (tmp_path / "bad.onnx").write_bytes(b"not a model")
        args += ["--model", str(tmp_path / "bad.onnx")]
    else:
        raise AssertionError(case)
    return [*args, *QUICK]


CASES = {  # case: words its one line must hold
    "no plan": ["nosuch", "not a bbgrap plan", "bbgrap compile"],
    "truncated plan.json": ["plan.json", "compile the plan again"],
    "plan.json not an object": ["plan.json", "compile the plan again"],
    "plan.json without programs": ["programs", "compile the plan again"],
    "plan.json with nodes 0": ["nodes", "compile the plan again"],
    "plan.json with 3 nodes": ["compile the plan again"],
    "other version": ["version 99", "compile it again"],
    "sample.npz missing": ["sample.npz"],
    "sample.npz corrupt": ["sample.npz"],
    "damaged segment": ["node1/seg000.onnx", "compile the plan again"],
    "segment onnxruntime cannot load": ["cannot load", "node1/seg000.onnx", "compile the plan again"],
    "node from another compile": ["node1/seg", "another compile"],
    "string array in --input": ["--input", "'input'", "numeric"],
    "--input not an npz": ["--input", "not a readable .npz"],
    "--output into a missing directory": ["--output", "does not exist"],
    "--output over --input": ["--output", "is the --input file", "write it elsewhere"],
    "--output over the plan's model": ["--output", "is the model the plan was compiled from", "write it elsewhere"],
    "--trace into the plan": ["--trace", "is inside the plan directory", "write it elsewhere"],
    "--output over --trace": ["--output", "is the --trace file", "write it elsewhere"],
    "--threads 20000": ["--threads 20000", "per core of this host"],
    "segment reads a value it lacks": ["plan.json is damaged", "'nosuch'", "compile the plan again"],
    "segment and manifest name a value apart": ["plan.json is damaged", "seg000.onnx", "compile the plan again"],
    "--output a directory": ["--output", "is a directory"],
    "--tolerance nan": ["--tolerance", "finite number >= 0"],
    "--tolerance inf": ["--tolerance", "finite number >= 0"],
    "--tolerance -1e-3": ["--tolerance", "finite number >= 0"],
    "--check, model gone": ["--check", "gone.onnx", "--model"],
    "--check, model changed": ["--check", "changed.onnx", "changed since", "--model"],
    "--model missing": ["--model", "nosuch.onnx"],
    "--model not a model": ["--check", "bad.onnx"],
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_plan_or_input_is_one_line_exit_2_in_process_and_under_mpirun(compiled: tuple[str, str], tmp_path, case: str) -> None:
    plan = copy_plan(compiled[1], tmp_path)
    args = damage(case, plan, tmp_path)
    line = one_line(run(*args), *CASES[case])
    assert one_line(run(*args, ranks=2), *CASES[case]) == line  # the same line, once
    assert not (tmp_path / "missing").exists()


def test_provider_cuda_without_a_gpu_is_one_line(compiled: tuple[str, str]) -> None:
    if gpu_present():
        pytest.skip("this host has an NVIDIA GPU: --provider cuda runs here (test_e2e and test_mpi cover it)")
    for ranks in (0, 2):
        one_line(run(compiled[1], "--provider", "cuda", *QUICK, ranks=ranks), "--provider cuda", "--provider cpu")


def test_ranks_that_read_different_compiles_refuse_under_mpirun(compiled: tuple[str, str], tmp_path) -> None:
    # a host with a stale copy: mpirun's MPMD form gives rank 1 another directory, an earlier
    # compile of the same model (each consistent in itself, so only the plan ids differ)
    model, plan = compiled
    stale = str(tmp_path / "stale")
    compile_plan(model, stale, nodes=2)
    assert MPIRUN, "mpirun not found: install with pip install -e '.[test]' (pulls the mpich wheel)"
    proc = subprocess.run([MPIRUN, "-n", "1", RUN, plan, *QUICK, ":", "-n", "1", RUN, stale, *QUICK],
                          capture_output=True, text=True, timeout=180)
    one_line(proc, "ranks 0 and 1 read different compiles", "copy the same plan directory to every host")


def test_ranks_that_read_different_compiles_refuse() -> None:
    assert plan_id_problem("p", ["a", "a", None]) is None  # rank 2 reports its own error
    assert plan_id_problem("p", [None, None]) is None
    problem = plan_id_problem("p", ["a", "a", "b"])
    assert problem is not None and "ranks 0 and 2" in problem and "different compiles of 'p'" in problem and "a and b" in problem


# ---- defect 15: --check ---------------------------------------------------------------------


@pytest.mark.parametrize("ranks", [0, 2])
def test_check_runs_the_original_model_on_the_users_input(compiled: tuple[str, str], tmp_path, ranks: int) -> None:
    plan = compiled[1]
    np.savez(tmp_path / "in.npz", input=np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32))
    unchecked = json.loads(run(plan, "--input", str(tmp_path / "in.npz"), "--json", *QUICK, ranks=ranks).stdout.splitlines()[-1])
    assert unchecked["max_rel_error"] is None and unchecked["reference"] is None
    proc = run(plan, "--input", str(tmp_path / "in.npz"), "--check", "--json", *QUICK, ranks=ranks)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["reference"] == "model" and result["ok"] and 0 <= result["max_rel_error"] <= 1e-4
    # another model with the same inputs and outputs given with --model: taken as given, and the
    # plan does not match it; the status reaches the user through mpirun
    other = save(zoo.build("resnet18", resolution=32, width=0.125, seed=9), str(tmp_path), "other")
    proc = run(plan, "--input", str(tmp_path / "in.npz"), "--model", other, *QUICK, ranks=ranks)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "MISMATCH" in proc.stdout and "against the model" in proc.stdout
    assert [ln for ln in proc.stderr.splitlines() if ln.strip()] == [ln for ln in proc.stderr.splitlines() if "differs from the model" in ln]


# ---- defect 16, and --help ------------------------------------------------------------------


@pytest.mark.parametrize("ranks", [0, 2])
def test_version(ranks: int) -> None:
    from importlib.metadata import version

    proc = run("--version", ranks=ranks)
    assert proc.returncode == 0 and proc.stdout == f"bbgrap-run {version('bbgrap')}\n" and not proc.stderr


def test_help_names_every_flag() -> None:
    out = run("--help").stdout
    for flag in ("--input", "--output", "--check", "--model", "--repeat", "--warmup", "--threads", "--provider", "--iobinding",
                 "--layout", "--tolerance", "--json", "--version", "130/143"):
        assert flag in out, flag
