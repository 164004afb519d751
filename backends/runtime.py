"""`bbgrap-run [PLAN]`: execute a plan, check it against its reference, time it.

Without `mpirun` (or with `mpirun -n 1`) every node runs in this one process, interleaved
on a mailbox; with `mpirun -n N` (N = the plan's nodes) each rank runs one node and moves
halos with mpi4py's buffer methods. This module is the command: its arguments, the plan's
loading and checks across ranks, the inputs and the reference (`--check`), the report,
the trace and the signals. The layers under it, each testable alone:
* backends/executor.py — one node's program run step by step (no onnxruntime, no MPI);
* backends/engine.py — onnxruntime sessions: options, providers, host or device values,
  the blocked layout between segments;
* backends/transports.py — messages in one process (a mailbox) or between MPI ranks;
* backends/threads.py, backends/devices.py — threads and GPU per rank.

Every failure to start is one line on stderr, exit 2 (under mpirun printed by rank 0 once
every rank has reached the same collectives); a result that differs from the reference,
non-finite values included, exits 1; SIGINT/SIGTERM end the process at once with 130/143,
and mpirun then ends the other ranks (MPI waits are polled so that a rank waiting for a
peer still runs its signal handler).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from bbgrap.backends import nchwc
from bbgrap.backends.cpu_quota import WAIT_NAP_S, cpu_quota
from bbgrap.backends.devices import device_for_rank, ranks_per_device, visible_devices
from bbgrap.backends.engine import (
    boundary_block,
    first_line,
    layout_name,
    load_runner,
    node_layouts,
    plan_layout,
    quiet_onnxruntime,
    quiet_stdout,
    session_options,
)
from bbgrap.backends.executor import NodeRunner, Profile, run_embedded, run_node
from bbgrap.backends.threads import PROCESS_THREAD_POOL, host_ranks, threads_per_rank, threads_problem
from bbgrap.backends.trace import clock_offset, op_events, rank_events, segment_layers, write_trace
from bbgrap.backends.transports import MPITransport, allgather, poll

from bbgrap import package_version
from bbgrap.ir import BBGrapError
from bbgrap.oneline import OneLineParser, env_rank
from bbgrap.paths import file_target_problem, written_whole
from bbgrap.plan import file_sha256, read_manifest, read_sample, verify_files
from bbgrap.plan_schema import Plan
from bbgrap.progress import Progress

REFINE_HINT = 0.1  # a rank whose time in segments and sends is this far off its prediction: bbgrap-run says how to refine the profile
MPI_ENV = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS", "HYDI_CONTROL_FD")


def agreed_boundary_block(comm: Any, layout: str, provider: str, device_id: int, able: bool = True) -> int:
    """The block every rank of `comm` keeps activations in between segments (0: NCHW);
    collective: every rank calls it, `able=False` where this rank failed to start."""
    return nchwc.agreed_block(allgather(comm, boundary_block(layout, provider, device_id) if able else 0))


def mismatch(outputs: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> str | None:
    """What makes the plan's outputs differ from `reference` beyond any tolerance, in words, or None:
    an output missing, another shape, or a non-finite value the reference does not have at the same
    place (NaN where it has a number or another non-finite value, a number or -inf where it has
    +inf, ...). The same non-finite value at the same place (NaN for NaN, +inf for +inf) is no
    mismatch: the plan reproduces the model there."""
    for name, ref in reference.items():
        got = outputs.get(name)
        if got is None:
            return f"output '{name}' is missing"
        if got.shape != ref.shape:
            return f"output '{name}' has shape {list(got.shape)} where the model's has {list(ref.shape)}"
        a, b = got.astype(np.float64), ref.astype(np.float64)
        differ = np.isfinite(a) != np.isfinite(b)
        both = ~np.isfinite(a) & ~np.isfinite(b)
        differ[both] = ~((a[both] == b[both]) | (np.isnan(a[both]) & np.isnan(b[both])))
        if differ.any():
            at = tuple(int(i) for i in np.argwhere(differ)[0])
            return (f"output '{name}' differs from the model in non-finite values at {int(differ.sum())} place(s) "
                    f"(first at {list(at)}: {a[at]} where the model has {b[at]})")
    return None


def compare(outputs: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> tuple[float | None, float | None]:
    """Max absolute error, and max error relative to each output's largest finite magnitude, over the
    places where the reference is finite; infinite (a mismatch at any tolerance) where `mismatch`
    names one; (None, None) without a reference."""
    if not reference:
        return None, None
    if mismatch(outputs, reference) is not None:
        return math.inf, math.inf
    abs_err, rel_err = 0.0, 0.0
    for name, ref in reference.items():
        a, b = outputs[name].astype(np.float64), ref.astype(np.float64)
        finite = np.isfinite(b)
        diff = float(np.max(np.abs(a[finite] - b[finite]))) if finite.any() else 0.0
        scale = float(np.max(np.abs(b[finite]))) if finite.any() else 0.0
        abs_err = max(abs_err, diff)
        rel_err = max(rel_err, diff / scale if scale > 0 else diff)
    return abs_err, rel_err


def finite_or_none(value: float | None) -> float | None:
    """`value` for a JSON number: JSON has no infinity or NaN (json.dumps would write `Infinity`,
    which strict parsers reject), so a non-finite one is null."""
    return value if value is not None and math.isfinite(value) else None


def tolerance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"'{text}' must be a finite number >= 0")
    return value


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = OneLineParser(
        prog="bbgrap-run",
        description="Run a BBGraP plan: all nodes in this process, or one node per rank under "
        "'mpirun -n N bbgrap-run'. Checks the result against the plan's reference (or with --check against "
        "the original model) and prints latency. Exit status: 0 ok, 1 the result differs from the reference, "
        "2 bad input or plan, 130/143 interrupted (SIGINT/SIGTERM).",
    )
    p.add_argument("plan", nargs="?", default="bbgrap-plan", help="plan directory (default: ./bbgrap-plan)")
    p.add_argument("--input", metavar="FILE.npz", help="inputs keyed by the model's input names (default: the plan's sample)")
    p.add_argument("--output", metavar="FILE.npz", help="write the outputs, keyed by the model's output names, to exactly this file")
    p.add_argument("--check", action="store_true",
                   help="run the original model on the same input (on rank 0, onnxruntime on the CPU) and compare; the model is "
                   "the file the plan was compiled from, refused if it changed since, or --model")
    p.add_argument("--model", metavar="FILE.onnx",
                   help="the original model for --check (implies it); taken as given, without comparing it to the compiled one")
    p.add_argument("--repeat", type=int, default=10, help="timed inferences; latency is their median (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed inferences first (default 2)")
    p.add_argument("--threads", type=int, default=0, help="onnxruntime intra-op threads per rank (default: cores / ranks on the host, at most a CPU quota's whole cores)")
    p.add_argument("--provider", choices=("auto", "cpu", "cuda"), default="auto", help="execution provider (default auto: CUDA when usable)")
    p.add_argument("--iobinding", choices=("auto", "on", "off"), default="auto",
                   help="keep activations as device-bound onnxruntime values between segments (default auto: with CUDA)")
    p.add_argument("--layout", choices=("auto", "nchw"), default="auto",
                   help="activations between segments: auto keeps them in onnxruntime's blocked CPU layout (NCHWc) where "
                   "every rank has the same one and that saves reorders (two per boundary); nchw converts at every boundary")
    p.add_argument("--tolerance", type=tolerance, default=1e-4,
                   help="max error relative to the output's largest magnitude, a finite number >= 0 (default 1e-4); a NaN or "
                   "infinity where the reference has another value is a mismatch at any tolerance")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--trace", metavar="FILE.json",
                   help="write the timed inferences as a Chrome trace-event file (Perfetto, chrome://tracing): per rank, "
                   "every segment run with its layers, every send and wait with bytes and peer, each step with the CPU time "
                   "of the thread that ran it (cpu_us: less than its duration where the rank was stopped or off its core), "
                   "clocks aligned to rank 0's")
    p.add_argument("--trace-ops", action="store_true",
                   help="with --trace: add onnxruntime's own per-op profile of the last timed inference on a track of its "
                   "own (profiling slows every inference a little)")
    p.add_argument("--quiet", action="store_true", help="print nothing but errors (and --json's object); the exit status says "
                   "whether the result matched")
    p.add_argument("--version", action="store_true", help="print bbgrap-run's version and exit")
    args = p.parse_args(argv)
    for name in ("repeat", "warmup", "threads"):
        if getattr(args, name) < (1 if name == "repeat" else 0):
            p.error(f"--{name} must be {'at least 1' if name == 'repeat' else 'non-negative'}")
    if (problem := threads_problem(args.threads)) is not None:
        p.error(problem)
    for flag, path, example, other in (("--output", args.output, "out.npz", (args.trace, "the --trace file")),
                                       ("--trace", args.trace, "trace.json", (args.output, "the --output file"))):
        problem = file_target_problem(path, flag, example, [(args.input, "the --input file"), (args.model, "the --model file"),
                                                            (args.plan, "the plan directory"), other]) if path and not args.version else None
        if problem:
            p.error(problem)
    if args.trace_ops and not args.trace:
        p.error("--trace-ops adds to a trace: give --trace FILE.json too")
    args.check = args.check or args.model is not None
    return args


def check_targets(args: argparse.Namespace, plan: Plan) -> None:
    """--output and --trace must not write over the model the plan was compiled from (which
    --check reads); raises BBGrapError. What the command line names is checked in parse_args."""
    model = plan.compiled.source.path if plan.compiled.source is not None else None
    for flag, path, example in (("--output", args.output, "out.npz"), ("--trace", args.trace, "trace.json")):
        problem = file_target_problem(path, flag, example, [(model, "the model the plan was compiled from")]) if path else None
        if problem:
            raise BBGrapError(problem)


def load_inputs(args: argparse.Namespace, plan: Plan) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The inputs to run on and the plan's reference outputs for them (none for --input)."""
    if not args.input:
        return read_sample(args.plan, plan)
    try:
        with np.load(args.input) as data:
            given = {k: data[k] for k in data.files}
    except Exception as exc:
        raise BBGrapError(f"--input {args.input}: not a readable .npz file ({type(exc).__name__}); save the inputs with numpy.savez") from None
    for spec in plan.inputs:
        arr = given.get(spec.name)
        if arr is None:
            raise BBGrapError(f"--input {args.input} has no array '{spec.name}' (it has {sorted(given)}); save it under that name")
        if arr.dtype.kind not in "biuf":
            raise BBGrapError(f"--input {args.input}: '{spec.name}' holds {arr.dtype} values, the model takes {spec.dtype}; "
                              f"save it as a numeric array")
        if arr.shape != spec.shape:
            raise BBGrapError(f"--input {args.input}: '{spec.name}' has shape {list(arr.shape)}, the plan was compiled for {list(spec.shape)}; "
                              f"give that shape or compile again")
        if np.dtype(spec.dtype).kind in "biu" and arr.dtype.kind == "f" and not np.array_equal(arr, np.round(arr)):
            raise BBGrapError(f"--input {args.input}: '{spec.name}' holds fractions, the model takes {spec.dtype}; save whole numbers "
                              f"(or an integer array)")
        given[spec.name] = arr.astype(spec.dtype, copy=False)
    return {s.name: given[s.name] for s in plan.inputs}, {}


def model_reference(args: argparse.Namespace, plan: Plan, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """--check: the original model's outputs on `inputs`, from onnxruntime on the CPU. The model is
    --model as given, or the file the plan was compiled from, refused if its sha256 changed since."""
    import onnxruntime as ort

    path = args.model
    if path is None:
        source = plan.compiled.source
        if source is None:
            raise BBGrapError(f"--check: plan '{args.plan}' does not record the model it was compiled from; give it with --model FILE")
        path = source.path
        if not os.path.isfile(path):
            raise BBGrapError(f"--check: the plan's model {path} is gone; give it with --model FILE")
        if file_sha256(path) != source.sha256:
            raise BBGrapError(f"--check: {path} has changed since the plan was compiled (another sha256); compile the plan again, "
                              f"or give --model {path} to check against it as it is now")
    elif not os.path.isfile(path):
        raise BBGrapError(f"--model {path}: {'is a directory' if os.path.isdir(path) else 'no such file'}; give the .onnx file")
    quiet_onnxruntime()
    opts = session_options(1, spin=False, shared_arena=False)
    opts.intra_op_num_threads = 0  # onnxruntime's default: the cores
    try:
        with quiet_stdout():
            session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        wanted = {i.name for i in session.get_inputs()}
        if not wanted <= set(inputs):
            raise BBGrapError(f"--check: {path} takes inputs {sorted(wanted)}, the plan {sorted(inputs)}; give the model the plan was compiled from")
        with quiet_stdout():
            outputs = session.run(names, {k: inputs[k] for k in wanted})
    except BBGrapError:
        raise
    except Exception as exc:
        raise BBGrapError(f"--check: onnxruntime cannot run {path} ({type(exc).__name__}: {first_line(exc)}); give the model the plan was "
                          f"compiled from with --model FILE") from None
    reference = dict(zip(names, outputs))
    planned = {spec.name for spec in plan.outputs}
    if not planned <= set(reference):
        raise BBGrapError(f"--check: {path} has outputs {sorted(reference)}, the plan {sorted(planned)}; give the model the plan was "
                          f"compiled from")
    return {name: reference[name] for name in sorted(planned)}


def write_outputs(path: str, outputs: dict[str, np.ndarray]) -> None:
    """--output, written whole or not at all: into a temporary file beside it, then renamed."""
    try:
        with written_whole(path) as tmp, open(tmp, "wb") as fh:  # a file object: savez adds .npz to a name without it
            np.savez(fh, **outputs)  # type: ignore[arg-type]  # numpy's stub matches ** to allow_pickle
    except OSError as exc:
        raise BBGrapError(f"cannot write --output {path} ({exc.strerror or exc}); write elsewhere") from None


def peak_memory_mb() -> float:
    """This process's peak resident memory so far (since `memory_baseline_mb`, where the system
    can reset the peak), in MB: what a node needs to run its part. On Linux the peak of this
    process's own memory (VmHWM): getrusage's keeps the peak of the process it was started from."""
    import resource

    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / (1 << 10)  # kB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / (1 << 10)  # bytes on macOS, KB on Linux


def memory_baseline_mb() -> float:
    """This process's resident memory before it loads its part of the plan: the interpreter and
    the onnxruntime, numpy and MPI libraries (and --check's run of the model on rank 0, whose peak
    is forgotten where Linux lets a process reset its peak), in MB. The peak after the
    inferences less this is what the plan itself took (compile's estimate: `Plan.compiled.memory`)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:  # Linux >= 4.0: the peak starts again from the current size
            fh.write("5")
    except OSError:
        pass  # elsewhere the peak keeps what came before, and the plan's part is overstated by it
    return peak_memory_mb()


def misplaced_ranks(plan: Plan, hosts: Sequence[str]) -> list[tuple[int, str, str]]:
    """(rank, its host, the host its node was calibrated on) for each rank of a plan cut for nodes of
    different speeds that runs on another host than its node's (compile --profile records the
    hosts where calibrate did): the plan is still exact, but its cuts follow that node's speed."""
    pred = plan.compiled.prediction
    if pred is None or len(set(plan.compiled.speeds)) <= 1:
        return []
    return [(r, mine, meant) for r, (mine, meant) in enumerate(zip(hosts, pred.hosts)) if meant and mine != meant]


def report(args: argparse.Namespace, plan: Plan, outputs: dict[str, np.ndarray],
           reference: dict[str, np.ndarray], latencies: list[float], ranks: int, providers: list[str], block: int,
           peak_mb: list[float], baseline_mb: list[float], profiles: list[dict[str, float]] | None = None,
           crowded: tuple[int, int] | None = None,
           shared_gpus: tuple[int, int] | None = None, misplaced: Sequence[tuple[int, str, str]] = (),
           kept_on_cpu: Sequence[str] = ()) -> int:
    """Print (or --json) the result; `peak_mb`: each rank's peak resident memory, `baseline_mb` its
    memory before it loaded its part of the plan (one entry each: all nodes
    in this process); `crowded` = (ranks, cores) where more threads than cores share a host,
    `shared_gpus` = (ranks, GPUs) where more ranks than GPUs share one, `misplaced`: the ranks on
    other hosts than their nodes' (`misplaced_ranks`), `kept_on_cpu`: per node, why it runs on the CPU
    where the others may use the GPU ("" for a node that is not: `NodeRunner.kept_on_cpu`)."""
    abs_err, rel_err = compare(outputs, reference)
    problem = mismatch(outputs, reference) if rel_err == math.inf else None  # its words: only an infinite error has them
    ok = rel_err is None or rel_err <= args.tolerance
    memory = plan.compiled.memory

    def plan_memory(rank: int, node: int | None) -> str:
        took = f"{peak_mb[rank] - baseline_mb[rank]:.0f} MB for the plan beyond {baseline_mb[rank]:.0f} MB before it"
        if memory is None:
            return took
        estimate = memory.estimate_mb[node] if node is not None else sum(memory.estimate_mb)
        notes = ("" if memory.prepack else ", weights not prepacked") + (", for NCHW between segments" if block else "")
        return f"{took}; estimated {estimate:.0f} MB{notes}"

    if args.output:
        write_outputs(args.output, outputs)
    result = {
        "plan": args.plan,
        "model": plan.model,
        "nodes": plan.nodes,
        "ranks": ranks,
        "mode": "mpi" if ranks > 1 else "embedded",
        "provider": providers[0] if providers else "CPUExecutionProvider",
        "layout": layout_name(block),
        "latency_ms": statistics.median(latencies) * 1e3,
        "latency_min_ms": min(latencies) * 1e3,
        "repeat": len(latencies),
        "max_abs_error": finite_or_none(abs_err),  # null without a reference, or where "mismatch" names why no error is measured
        "max_rel_error": finite_or_none(rel_err),
        "mismatch": problem,
        "reference": "model" if args.check else "sample" if reference else None,
        "ok": ok,
        "peak_memory_mb": [round(m, 1) for m in peak_mb],  # per rank
        "baseline_memory_mb": [round(m, 1) for m in baseline_mb],  # per rank, before its part of the plan
        "plan_memory_mb": [round(p - b, 1) for p, b in zip(peak_mb, baseline_mb)],  # per rank: what its part took
        "estimated_memory_mb": list(memory.estimate_mb) if memory is not None else None,  # per node, compile's estimate
    }
    if profiles:
        result["profile_ms"] = profiles  # per rank, per inference: compute, wait, send
    result["oversubscribed"] = crowded is not None
    result["shared_gpus"] = shared_gpus is not None
    result["misplaced_ranks"] = [r for r, _, _ in misplaced]
    result["kept_on_cpu"] = {str(n): why for n, why in enumerate(kept_on_cpu) if why}
    pred = plan.compiled.prediction
    result["predicted_ms"] = pred.latency_ms if pred is not None else None  # compile --profile's prediction
    result["prediction"] = pred.to_json() if pred is not None else None  # all of it: each rank's, the profile (calibrate --refine)
    if args.json:
        print(json.dumps(result, allow_nan=False))
    elif not args.quiet:
        against = "against the model" if args.check else "against the sample's reference"
        check = ("no reference (--check compares with the model)" if rel_err is None
                 else f"MISMATCH {against}: {problem}" if problem is not None
                 else f"max abs error {abs_err:.3g}, rel {rel_err:.3g} {against} ({'ok' if ok else 'MISMATCH'})")
        print(f"{plan.model}: {plan.nodes} nodes on {ranks} rank(s), {result['mode']}, {result['provider']}, "
              f"{result['layout']} between segments")
        for n, why in enumerate(kept_on_cpu):
            if why:
                print(f"node {n} runs on the CPU: its {why}")
        print(f"latency {result['latency_ms']:.2f} ms (median of {len(latencies)}), {check}")
        if pred is not None and ranks > 1:
            print(f"predicted {pred.latency_ms:.2f} ms by compile --profile ({pred.label}): measured / predicted "
                  f"{result['latency_ms'] / max(pred.latency_ms, 1e-9):.2f}")
        elif pred is not None:
            print(f"predicted {pred.latency_ms:.2f} ms on {plan.nodes} separate nodes by compile --profile ({pred.label}); "
                  "this process runs them one after another")
        predicted_ranks = pred.ranks if pred is not None else ()
        off = []  # the ranks whose time in segments and sends is more than REFINE_HINT off their prediction
        for r, prof in enumerate(profiles or []):
            mine = predicted_ranks[r] if r < len(predicted_ranks) else None
            predicted = f"; predicted compute {mine.compute:.2f} ms, wait {mine.wait:.2f} ms" if mine is not None else ""
            print(f"  rank {r}: compute {prof['compute']:.2f} ms, waiting for halos {prof['wait']:.2f} ms, sends {prof['send']:.2f} ms, "
                  f"peak memory {peak_mb[r]:.0f} MB ({plan_memory(r, r)}){predicted}")
            if mine is not None and mine.compute > 0 and abs((prof["compute"] + prof["send"]) / mine.compute - 1) > REFINE_HINT:
                off.append(r)
        if off and pred is not None:
            print(f"note: rank(s) {', '.join(map(str, off))} computed more than {REFINE_HINT:.0%} off the prediction; to correct "
                  "the profile by a run: bbgrap-run --json --trace t.json > run.json, then bbgrap calibrate --refine run.json "
                  f"--profile {pred.profile} -o refined.toml, and compile with --profile refined.toml")
        if not profiles:
            print(f"peak memory {peak_mb[0]:.0f} MB (this process, every node it runs: {plan_memory(0, None)})")
        if crowded is not None:
            print(f"note: {crowded[0]} ranks share {crowded[1]} cores on this host, so they take turns on them (their waiting "
                  f"is mostly that): the latency of {plan.nodes} separate nodes would be lower")
        if shared_gpus is not None:
            print(f"note: {shared_gpus[0]} ranks share {shared_gpus[1]} GPU(s) on this host (rank k uses GPU k mod "
                  f"{shared_gpus[1]}), so they take turns on them: the latency of {plan.nodes} separate GPUs would be lower")
        if misplaced:
            where = ", ".join(f"rank {r} on {mine} (its node: {meant})" for r, mine, meant in misplaced)
            print(f"note: the plan is cut for nodes of different speeds, and {where}: the result is exact, but the cuts "
                  f"follow the calibrated nodes' speeds (start rank k on the k-th host compile named)")
    if not ok:
        differs = f": {problem}" if problem is not None else f" by {rel_err:.3g} > --tolerance {args.tolerance:g}"
        print(f"bbgrap-run: error: result differs from the {'model' if args.check else 'reference'}{differs}", file=sys.stderr)
    return 0 if ok else 1


def embedded_runners(plan_dir: str, plan: Plan, threads: int, provider: str, spin: bool, iobinding: str,
                     layout: str, profile_dir: str | None = None, progress: Progress | None = None) -> list[NodeRunner]:
    """Every node of the plan, to run in this one process (as `layout` and the other
    bbgrap-run flags say; `profile_dir`: onnxruntime's per-op profiles go there, --trace-ops)."""
    nodes = range(plan.nodes)
    step = progress or Progress(enabled=False)
    step("lay out", 0, 1)
    layouts = node_layouts(plan_dir, plan, nodes, threads, spin, boundary_block(plan_layout(layout, plan), provider, 0))
    step("lay out", 1, 1)
    runners = []
    for n in nodes:
        step("load sessions", n, len(nodes))
        runners.append(load_runner(plan_dir, plan, n, threads, provider, spin=spin, iobinding=iobinding, layout=layouts[n],
                                   profile_prefix=os.path.join(profile_dir, f"node{n}") if profile_dir else None))
    step("load sessions", len(nodes), len(nodes))
    return runners


@contextlib.contextmanager
def shapes_held(plan: Plan) -> Iterator[None]:
    """An inference of a plan whose layers' shapes depend on the input's values (held at the
    sample input's: CompileRecord.shapes_from_values): a failure in it (onnxruntime refusing a
    segment's input of another shape, a message of another size) is that input changing them,
    one line. In any other plan a failure is not the input's doing and stays an internal error."""
    try:
        yield
    except BBGrapError:
        raise
    except Exception as exc:
        layers = plan.compiled.shapes_from_values
        if not layers:
            raise
        reason = " ".join(first_line(exc).split())
        raise BBGrapError(f"an inference failed ({reason[:200]}): {len(layers)} layer(s) have shapes that depend on the input's values "
                          f"(first: '{layers[0]}'), held in this plan at the sample input's, and this input changes them; give inputs "
                          "that keep those shapes, or export the model with those values constant") from None


def main_embedded(args: argparse.Namespace, ops_dir: str | None) -> int:
    plan = read_manifest(args.plan)
    check_targets(args, plan)
    verify_files(args.plan, plan, range(plan.nodes))
    inputs, reference = load_inputs(args, plan)
    threads = args.threads or threads_per_rank(1, cpu_quota())
    PROCESS_THREAD_POOL.start(threads)  # one pool for every node's segments, before the first session
    if args.check:
        reference = model_reference(args, plan, inputs)
    spin = plan.nodes == 1
    baseline = memory_baseline_mb()
    runners = embedded_runners(args.plan, plan, threads, args.provider, spin, args.iobinding, args.layout, ops_dir,
                               Progress(enabled=False if args.quiet else None))
    latencies = []
    outputs: dict[str, np.ndarray] = {}
    profiles = [Profile(steps=[] if args.trace else None) for _ in runners]
    for k in range(args.warmup + args.repeat):
        for profile in profiles:
            profile.inference = k - args.warmup
        t0 = time.perf_counter()
        with shapes_held(plan):
            outputs = run_embedded(runners, inputs, profiles if k >= args.warmup else None)
        if k >= args.warmup:
            latencies.append(time.perf_counter() - t0)
    if args.trace:  # one process: one clock, each node a 'rank' of its own in the trace
        save_trace(args, plan, [trace_events(args.plan, plan, r.node, r.node, p, 0.0, r if ops_dir else None)
                                    for r, p in zip(runners, profiles)])
    return report(args, plan, outputs, reference, latencies, 1, runners[0].providers, runners[0].block, [peak_memory_mb()], [baseline],
                  kept_on_cpu=[r.kept_on_cpu for r in runners])


def trace_events(plan_dir: str, plan: Plan, rank: int, node: int, profile: Profile, offset: float,
                 runner: NodeRunner | None = None) -> list[dict[str, Any]]:
    """This rank's (or in-process node's) recorded steps as trace events; with `runner` (whose
    sessions profiled every run, --trace-ops) also onnxruntime's ops of the last inference."""
    files = plan.node_files([node])
    messages = {m.id: m for m in plan.messages}
    events = rank_events(rank, node, profile.steps or [], offset, segment_layers(plan_dir, files), files, messages)
    if runner is not None:
        paths = [s.end_profiling() for s in runner.sessions]
        try:
            last = max((s.inference for s in profile.steps or []), default=0)
            events += op_events(rank, paths, profile.steps or [], offset, last)
        finally:
            for path in paths:
                with contextlib.suppress(OSError):
                    os.remove(path)
    return events


def save_trace(args: argparse.Namespace, plan: Plan, per_rank: Sequence[Sequence[dict[str, Any]]]) -> None:
    try:
        write_trace(args.trace, per_rank, {"plan": args.plan, "model": plan.model, "nodes": plan.nodes,
                                           "plan_id": plan.plan_id, "repeat": args.repeat})
    except OSError as exc:
        raise BBGrapError(f"--trace {args.trace}: cannot write it ({exc.strerror or type(exc).__name__}); write elsewhere") from None


def plan_id_problem(plan: str, ids: Sequence[Any]) -> str | None:
    """Why the ranks (which read `plan` each on its host) must not run together: their copies come
    from different compiles (a stale copy on one host). `ids`: each rank's plan_id, None where it
    could not read it (that rank reports its own error)."""
    known = [(r, i) for r, i in enumerate(ids) if i is not None]
    odd = next(((r, i) for r, i in known if i != known[0][1]), None)
    if odd is None:
        return None
    return (f"ranks {known[0][0]} and {odd[0]} read different compiles of '{plan}' (plan_id {known[0][1]} and {odd[1]}); "
            f"copy the same plan directory to every host")


def rank_clock_offset(comm: Any) -> float:
    """This rank's perf_counter minus rank 0's (trace.clock_offset against rank 0, rank by rank)."""
    rounds, offset = 8, 0.0
    for r in range(1, comm.Get_size()):
        if comm.Get_rank() == 0:
            for _ in range(rounds):
                comm.recv(source=r, tag=7001)
                comm.send(time.perf_counter(), dest=r, tag=7002)
        elif comm.Get_rank() == r:
            def exchange(t: float) -> float:
                comm.send(t, dest=0, tag=7001)
                return float(comm.recv(source=0, tag=7002))

            offset = clock_offset(exchange, time.perf_counter, rounds)
    return offset


def main_mpi(args: argparse.Namespace, ops_dir: str | None) -> int:
    """One node per rank. Every rank reaches every collective below whatever fails on it (it
    passes its error along), so rank 0 can print the first error once and all exit 2. `ops_dir`:
    where onnxruntime's per-op profiles go (--trace-ops)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)  # collective: every rank calls it, whatever fails below
    host = host_ranks(local)
    hosts = allgather(comm, os.uname().nodename)
    error: str | None = None
    plan: Plan | None = None
    inputs: dict[str, np.ndarray] = {}
    reference: dict[str, np.ndarray] = {}
    threads = 1
    try:
        plan = read_manifest(args.plan)
        if plan.nodes != size:
            raise BBGrapError(
                f"plan '{args.plan}' has {plan.nodes} nodes but mpirun started {size} ranks; "
                f"run 'mpirun -n {plan.nodes} bbgrap-run' (or bbgrap-run alone, all nodes in one process)"
            )
    except BBGrapError as exc:
        error = str(exc)
    error = error or plan_id_problem(args.plan, allgather(comm, plan.plan_id if plan is not None and error is None else None))
    try:
        if error is None and plan is not None:
            check_targets(args, plan)
            verify_files(args.plan, plan, [rank])
            inputs, reference = load_inputs(args, plan)
            threads = args.threads or host.threads()
            PROCESS_THREAD_POOL.start(threads)  # before the first session, --check's included
            if args.check:
                reference = model_reference(args, plan, inputs) if rank == 0 else {}
    except BBGrapError as exc:
        error = str(exc)
    able = not any(allgather(comm, error))  # a plan some rank cannot use is not laid out or loaded anywhere
    baseline = memory_baseline_mb()
    devices = visible_devices()
    device = device_for_rank(local.Get_rank(), devices)  # ranks outnumbering the GPUs share them
    block = agreed_boundary_block(comm, plan_layout(args.layout, plan), args.provider, device, able=able)
    runner: NodeRunner | None = None
    try:
        layouts = node_layouts(args.plan, plan, [rank] if able else [], threads, True, block,
                               lambda votes: allgather(comm, votes))
        if able and plan is not None:
            step = Progress(enabled=False if args.quiet else None)  # a rank's stderr is a terminal only where mpirun's is
            step(f"rank {rank}: load", 0, 1)
            runner = load_runner(args.plan, plan, rank, threads, args.provider, device_id=device,
                                 iobinding=args.iobinding, layout=layouts[rank],
                                 profile_prefix=os.path.join(ops_dir, f"node{rank}") if ops_dir else None)
            step(f"rank {rank}: load", 1, 1)
    except BBGrapError as exc:
        error = error or str(exc)
    errors = allgather(comm, error)
    if any(errors) or runner is None or plan is None:
        if rank == 0:
            print(f"bbgrap-run: error: {next(e for e in errors if e)}", file=sys.stderr)
        return 2
    transport = MPITransport(comm, runner, nap=WAIT_NAP_S if host.quota is not None else 0.0)  # spinning would spend the quota
    latencies = []
    outputs: dict[str, np.ndarray] = {}
    profile = Profile(steps=[] if args.trace else None)
    offset = rank_clock_offset(comm) if args.trace else 0.0
    for k in range(args.warmup + args.repeat):
        profile.inference = k - args.warmup
        poll(comm.Ibarrier())
        t0 = time.perf_counter()
        with shapes_held(plan):
            outputs = run_node(runner, transport, inputs, profile if k >= args.warmup else None)
        elapsed = time.perf_counter() - t0
        if k >= args.warmup:
            latencies.append(elapsed)
    profiles = allgather(comm, profile.as_ms(args.repeat))
    kept_on_cpu = allgather(comm, runner.kept_on_cpu)
    peak_mb = allgather(comm, peak_memory_mb())
    baseline_mb = allgather(comm, baseline)
    traced = allgather(comm, trace_events(args.plan, plan, rank, rank, profile, offset, runner if ops_dir else None)
                       if args.trace else [])
    status = 0
    if rank == 0 and args.trace:
        try:
            save_trace(args, plan, traced)
        except BBGrapError as exc:
            print(f"bbgrap-run: error: {exc}", file=sys.stderr)
            status = 2
    if rank == 0 and status == 0:
        crowded = (local.Get_size(), host.cores) if local.Get_size() * threads > host.cores else None
        try:
            sharing = ranks_per_device(local.Get_size(), devices) if runner.providers[0] == "CUDAExecutionProvider" else 0
            status = report(args, plan, outputs, reference, latencies, size, runner.providers, runner.block, peak_mb, baseline_mb, profiles, crowded,
                            (local.Get_size(), devices) if sharing > 1 else None, misplaced_ranks(plan, hosts), kept_on_cpu)
        except BBGrapError as exc:
            print(f"bbgrap-run: error: {exc}", file=sys.stderr)
            status = 2
    # The other ranks wait here (polled, so a signal still ends them) rather than in MPI_Finalize
    # while rank 0 reports; mpirun exits with the highest status, rank 0's.
    poll(comm.Ibarrier(), nap=0.001)
    return status


ABORT_GRACE_S = 0.5  # for mpirun's proxy to pass a rank's last words on before MPI_Abort ends the job


def abort_job(message: str, status: int) -> None:
    """Print `message` on stderr and end every rank of the job with `status` (the others may be
    waiting for this one). MPI_Abort kills the processes that forward the ranks' output, so the
    line is given ABORT_GRACE_S to get out first: without it, mpirun now and then printed nothing."""
    from mpi4py import MPI

    print(message, file=sys.stderr, flush=True)
    time.sleep(ABORT_GRACE_S)
    MPI.COMM_WORLD.Abort(status)


def under_mpi() -> bool:
    return any(v in os.environ for v in MPI_ENV)


def exit_on_signal(signum: int, frame: Any) -> None:
    """SIGINT/SIGTERM: end this process now with 128 + the signal's number (130/143), without a
    traceback and without MPI_Finalize, which would wait for ranks that are still computing;
    mpirun (MPICH's hydra) ends the job's other ranks when one exits with a nonzero status, and
    forwards a SIGINT/SIGTERM it gets itself to the ranks."""
    os._exit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, exit_on_signal)
    args = parse_args(argv)
    if args.version:
        if env_rank() == 0:
            print(f"bbgrap-run {package_version()}")
        return 0
    # --trace-ops: onnxruntime's profiling files go here until the trace has them (removed on every way out but a signal)
    with tempfile.TemporaryDirectory(prefix="bbgrap-ops-") if args.trace_ops else contextlib.nullcontext() as ops_dir:
        if under_mpi():
            from mpi4py import MPI

            if MPI.COMM_WORLD.Get_size() > 1:
                try:
                    return main_mpi(args, ops_dir)
                except BBGrapError as exc:  # a rank's own failure after the ranks agreed to run (shapes_held)
                    abort_job(f"bbgrap-run: error: rank {MPI.COMM_WORLD.Get_rank()}: {exc}", 2)
                    return 2
                except Exception:
                    rank = MPI.COMM_WORLD.Get_rank()
                    abort_job(f"bbgrap-run: rank {rank} failed, aborting the job:\n{traceback.format_exc()}", 1)
                    return 1
        try:
            return main_embedded(args, ops_dir)
        except BBGrapError as exc:
            print(f"bbgrap-run: error: {exc}", file=sys.stderr)
            return 2


if __name__ == "__main__":
    sys.exit(main())
