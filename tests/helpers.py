"""Shared test helpers: compile a model through the real pipeline and run the plan, in process
or as a user runs the commands."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Any

import numpy as np
import onnx
from bbgrap.backends.runtime import compare, embedded_runners, run_embedded

from bbgrap.compiler import compile_model
from bbgrap.config import Config, Direction
from bbgrap.plan import read_manifest, read_sample
from bbgrap.plan_schema import Plan

TOLERANCE = 1e-4  # max error relative to the output's largest magnitude (issue #2)
# where the in-process runs execute: cpu (the default), or cuda on a machine with a GPU. Under cuda
# they run as bbgrap-run --provider auto does there: every node on the GPU but one whose segments
# only the CPU computes exactly (emit.cpu_only), which --provider cuda refuses (test_engine.py)
PROVIDER = os.environ.get("BBGRAP_TEST_PROVIDER", "cpu")


def save(model: onnx.ModelProto, directory: str, name: str = "model") -> str:
    path = os.path.join(directory, f"{name}.onnx")
    onnx.save(model, path)
    return path


def compile_plan(model_path: str, plan_dir: str, **options: Any) -> Plan:
    """Compile with Config fields from `options` (nodes, direction, speeds, custom, ...) and
    the compile flags optimize/search/input_shapes/recompute.

    Unlike the CLI, `search` defaults to False: the naive (even or speed-proportional) cut,
    which most tests' expectations of regions, transfers and FLOPs are written against,
    with transfers eliminated and halos recomputed as the CLI does. Pass search=True for
    the CLI's default pipeline (tests/backends/test_e2e.py runs it on every zoo model). Likewise
    the planner defaults to greedy (the per-layer machinery the tests look at), not the CLI's dp;
    with a `planner`, judge=False keeps the planner's own plan (else the faster predicted of it and greedy's)."""
    options.setdefault("planner", "greedy")
    flags = {k: options.pop(k) for k in ("optimize", "search", "input_shapes", "recompute", "judge") if k in options}
    if "search_strategy" in options:
        options["search"] = options.pop("search_strategy")
    if isinstance(options.get("direction"), str):
        options["direction"] = Direction(options["direction"])
    cfg = Config(**options)
    return compile_model(model_path, cfg, plan_dir, flags.get("input_shapes"), flags.get("optimize", True), flags.get("search", False),
                         recompute=flags.get("recompute", True), judge=flags.get("judge", True))


def run_plan(plan_dir: str, inputs: dict[str, np.ndarray] | None = None, iobinding: str = "off",
             layout: str = "auto") -> tuple[dict[str, np.ndarray], float]:
    """Run every node in this process (activations between segments in `layout`, as
    bbgrap-run --layout); returns the outputs and the max relative error against the
    plan's reference (or against `inputs`' reference run by the caller)."""
    manifest = read_manifest(plan_dir)
    sample, reference = read_sample(plan_dir)
    runners = embedded_runners(plan_dir, manifest, 1, "auto" if PROVIDER == "cuda" else PROVIDER, False, iobinding, layout)
    if PROVIDER == "cuda":
        # a node with no segment (a plan that left it idle) runs nothing anywhere
        off = [r.node for r in runners if r.sessions and r.providers[0] != "CUDAExecutionProvider" and not r.kept_on_cpu]
        assert not off, f"BBGRAP_TEST_PROVIDER=cuda, but nodes {off} run on the CPU (no usable GPU?)"
    outputs = run_embedded(runners, inputs or sample)
    _, rel = compare(outputs, reference) if inputs is None else (None, None)
    return outputs, (rel if rel is not None else float("nan"))


def assert_exact(plan_dir: str, iobinding: str = "off", layout: str = "auto") -> float:
    """The plan's outputs match its reference within TOLERANCE, and are all finite (compare counts a
    non-finite value the reference lacks as an infinite error; a test model has none at all)."""
    outputs, rel = run_plan(plan_dir, iobinding=iobinding, layout=layout)
    assert outputs, "plan produced no output"
    bad = [name for name, out in outputs.items() if not np.isfinite(out).all()]
    assert not bad, f"plan {plan_dir}: non-finite values in {bad}"
    assert np.isfinite(rel) and rel <= TOLERANCE, f"plan {plan_dir}: max relative error {rel}"
    return rel


BIN = os.path.dirname(sys.executable)
MPIRUN = shutil.which("mpirun", path=BIN) or shutil.which("mpirun")  # the mpich wheel's, in this environment


def mpirun(n: int, *args: str, timeout: int = 180, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`mpirun -n n bbgrap-run ARGS` of this environment, as a user runs a plan on n ranks."""
    assert MPIRUN, "mpirun not found: install with pip install -e '.[test]' (pulls the mpich wheel)"
    return subprocess.run([MPIRUN, "-n", str(n), os.path.join(BIN, "bbgrap-run"), *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def bbgrap(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    """The `bbgrap` command of this environment, as a user runs it."""
    return subprocess.run([os.path.join(BIN, "bbgrap"), *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def bbgrap_run(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    """The `bbgrap-run` command of this environment, in one process."""
    return subprocess.run([os.path.join(BIN, "bbgrap-run"), *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def one_error_line(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    """Exit status 2 and one line on stderr naming `words`, with no traceback."""
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for w in words:
        assert w in lines[0], lines[0]
