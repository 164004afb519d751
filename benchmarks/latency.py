"""Latency: N ranks of BBGraP against one onnxruntime, measured side by side.

For each model / resolution / batch / node count N, in one run and interleaved round by
round (so the machine's noise hits every side alike):
  A       plain onnxruntime on the original model with the cores one node has (K threads,
          pinned to K cores with --node-cores) — "one node of the cluster";
  B       plain onnxruntime with all N x K cores — "one bigger machine";
  BBGraP  `mpirun -n N bbgrap-run` on the compiled plan, each rank with bbgrap-run's default
          threads (its cores divided among the ranks sharing them: K each).
K is the host's cores / N unless --node-cores K simulates nodes of K cores on a larger host:
then every rank is pinned to K cores of its own (`mpirun -bind-to core:K`) and an N with
N x K above the host's cores is skipped. Prints median latencies, the ratios A/BBGraP and
B/BBGraP, and where the slowest rank's time went (computing its segments, waiting for
halos); every BBGraP run is checked against the plan's reference in the same run. The cut
direction is `auto` by default: the batch (`n`) when there are at least as many images as
nodes — no halos at all — else height (`h`).

  python benchmarks/latency.py                         # vgg16, resnet50, mobilenet_v2; 224 and 512; batch 1 and 8; 2 nodes
  python benchmarks/latency.py --models resnet50 --resolutions 224 --batches 1 --nodes 2 4 8 --node-cores 2
  python benchmarks/latency.py --models vgg16 --resolutions 224 --batches 1 --rounds 5 --json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from bbgrap.backends.threads import threads_per_rank

from bbgrap import zoo
from bbgrap.compiler import compile_model
from bbgrap.config import PLANNERS, Config, Direction
from bbgrap.plan import read_sample

BIN = os.path.dirname(sys.executable)
MIN_SIDE_SECONDS = 0.25
from table import Table  # noqa: E402  # benchmarks/table.py, beside this script (on sys.path as the script's folder)


def session(path: str | bytes, threads: int) -> ort.InferenceSession:
    """onnxruntime with `threads` intra-op threads on a model file (or its bytes), as a user runs it."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def time_session(sess: ort.InferenceSession, feeds: dict[str, np.ndarray], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        out.append(time.perf_counter() - t0)
    return out


def run_bbgrap(plan: str, nodes: int, repeat: int, node_cores: int | None, *flags: str, provider: str = "cpu") -> dict[str, Any]:
    """`mpirun -n nodes bbgrap-run plan --json` on `provider` (and further bbgrap-run `flags`): its result."""
    # fresh processes every round: warm them up as long as they are then timed
    bind = ["-bind-to", f"core:{node_cores}"] if node_cores else []
    cmd = [shutil.which("mpirun", path=BIN) or "mpirun", "-n", str(nodes), *bind, os.path.join(BIN, "bbgrap-run"), plan,
           "--json", "--repeat", str(repeat), "--warmup", str(max(2, repeat)), "--provider", provider, *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    if result["mismatch"] is not None:  # no error measured: an output missing, misshapen or non-finite where the model's is not
        result["max_abs_error"] = result["max_rel_error"] = math.inf
    return result


@contextlib.contextmanager
def pinned(cores: set[int]) -> Iterator[None]:
    """This thread pinned to `cores` for the block. Threads started inside it inherit that (a
    session's intra-op pool is started when the session is made), threads started before do not."""
    everything = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, everything)


def time_pinned(sess: ort.InferenceSession, feeds: dict[str, np.ndarray], repeat: int, cores: set[int]) -> list[float]:
    """time_session with the calling thread (which takes part in the session's pool) on `cores`;
    the session must have been made inside pinned(cores), for its pool's threads to be there too."""
    with pinned(cores):
        return time_session(sess, feeds, repeat)


def bench_case(model: str, resolution: int, batch: int, nodes: int, direction: str, rounds: int, repeat: int,
               search: bool, workdir: str, node_cores: int | None, planner: str = Config.planner,
               balance: float = 0.0) -> dict[str, Any]:
    if os.path.isfile(model):  # an ONNX file (an exporter's model), at its own input shape
        path = model
        model = os.path.splitext(os.path.basename(model))[0]
        shape = [d.dim_value for d in onnx.load(path, load_external_data=False).graph.input[0].type.tensor_type.shape.dim]
        batch, resolution = shape[0], shape[-1]
    else:
        path = os.path.join(workdir, f"{model}-{resolution}-{batch}.onnx")
        onnx.save(zoo.build(model, resolution=resolution, batch=batch), path)
    plan = os.path.join(workdir, f"plan-{model}-{resolution}-{batch}")
    if direction == "auto":
        direction = "n" if batch >= nodes else "h"
    manifest = compile_model(path, Config(nodes=nodes, direction=Direction(direction), planner=planner, balance=balance), plan,
                             search=search)
    feeds, _ = read_sample(plan)
    host = sorted(os.sched_getaffinity(0))
    node_threads = node_cores or threads_per_rank(nodes)  # what bbgrap-run gives each of N ranks on this host
    node_set, all_set = set(host[:node_threads]), set(host[:node_threads * nodes] if node_cores else host)
    with pinned(node_set):  # the pools' threads keep the affinity they start with
        one_node = session(path, node_threads)
    with pinned(all_set):
        bigger = session(path, len(all_set))
    time_pinned(one_node, feeds, 1, node_set)  # warm-up
    time_pinned(bigger, feeds, 1, all_set)
    # small models: enough inferences per side and round for about MIN_SIDE_SECONDS of the fastest side
    repeat = max(repeat, math.ceil(MIN_SIDE_SECONDS / max(min(time_pinned(bigger, feeds, 3, all_set)), 1e-6)))
    a, b, p, errors, profiles, layouts = [], [], [], [], [], set()
    for _ in range(rounds):
        a += time_pinned(one_node, feeds, repeat, node_set)
        b += time_pinned(bigger, feeds, repeat, all_set)
        r = run_bbgrap(plan, nodes, repeat, node_cores)
        p.append(r["latency_ms"] / 1e3)
        errors.append(r["max_rel_error"])
        # one rank runs in process and reports no per-rank profile: all of its time is its own
        profiles.append(r.get("profile_ms") or [{"compute": r["latency_ms"], "wait": 0.0, "send": 0.0}])
        layouts.add(r["layout"])
    a_ms, b_ms, p_ms = (statistics.median(x) * 1e3 for x in (a, b, p))
    # per rank, the median over rounds of its per-inference compute / wait / send
    profile = [{k: statistics.median(round_[rank][k] for round_ in profiles) for k in profiles[0][rank]}
               for rank in range(nodes)]
    return {
        "model": model, "resolution": resolution, "batch": batch, "nodes": nodes, "direction": direction,
        "profile_ms": profile, "sync_points": manifest.stats.sync_points, "segments": manifest.stats.segments,
        "searched": search, "planner": planner, "A_ms": a_ms, "B_ms": b_ms, "bbgrap_ms": p_ms,
        "A_over_bbgrap": a_ms / p_ms, "B_over_bbgrap": b_ms / p_ms,
        "max_rel_error": max(errors), "exact": max(errors) <= 1e-4,
        "bytes_transferred": manifest.stats.bytes_transferred, "threads_A": node_threads, "threads_B": len(all_set),
        "pinned": bool(node_cores),
        "repeat": repeat, "layout": ",".join(sorted(layouts)),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["vgg16", "resnet50", "mobilenet_v2"],
                   help="zoo models, or ONNX files (run at their own input shape: --resolutions and --batches do not apply)")
    p.add_argument("--resolutions", nargs="+", type=int, default=[224, 512])
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    p.add_argument("--nodes", type=int, nargs="+", default=[2], help="node counts N (default 2)")
    p.add_argument("--node-cores", type=int, help="simulate nodes of K cores: each rank pinned to K cores of its own, A on K "
                   "cores, B on N x K (default: the host's cores / N, unpinned)")
    p.add_argument("--direction", default="auto", help="cut direction n/c/h/w, or auto: n when batch >= nodes, else h (default)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--repeat", type=int, default=3,
                   help="inferences per side per round, at least (default 3; small models get enough for 0.25 s)")
    p.add_argument("--no-search", action="store_true", help="benchmark the naive split instead of the searched plan")
    p.add_argument("--balance", type=float, default=0.0, metavar="R", help="compile --balance R (default 0: no bound)")
    p.add_argument("--planner", default=Config.planner, choices=PLANNERS,
                   help=f"compile --planner (default {Config.planner}, as compile's; the figures of 2026-11-21 and before are greedy's)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    rows = []
    table = Table([("model", "<13"), ("res", ">5"), ("batch", ">6"), ("N", ">3"), ("K", ">3"), ("cut", ">4"), ("A ms", ">10.1f"), ("B ms", ">10.1f"),
                   ("BBGraP ms", ">11.1f"), ("A/BBGraP", ">10.2f"), ("B/BBGraP", ">10.2f"), ("compute", ">9.1f"), ("wait", ">7.1f"),
                   ("syncs", ">6"), ("rel err", ">9.1e")])
    cores = len(os.sched_getaffinity(0))
    counts = [n for n in args.nodes if not args.node_cores or n * args.node_cores <= cores]
    for n in sorted(set(args.nodes) - set(counts)):
        print(f"skipped N={n}: {n} x {args.node_cores} cores is more than this host's {cores}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="bbgrap-bench-") as work:
        cases = [(m, r, b, n) for m in args.models for r in ([0] if os.path.isfile(m) else args.resolutions)
                 for b in ([0] if os.path.isfile(m) else args.batches) for n in counts]
        for model, res, batch, nodes in cases:
            row = bench_case(model, res, batch, nodes, args.direction, args.rounds, args.repeat,
                             not args.no_search, work, args.node_cores, args.planner, args.balance)
            rows.append(row)
            if not args.json:
                slowest = max(row["profile_ms"], key=lambda r: r["compute"] + r["wait"])
                table.row(row["model"], row["resolution"], row["batch"], nodes, row["threads_A"], row["direction"], row["A_ms"], row["B_ms"], row["bbgrap_ms"],
                          row["A_over_bbgrap"], row["B_over_bbgrap"], slowest["compute"], slowest["wait"],
                          row["sync_points"], row["max_rel_error"])
    if args.json:
        print(json.dumps({"nodes": counts, "node_cores": args.node_cores, "cores": cores, "rows": rows}, indent=1))
    return 0 if all(r["exact"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
