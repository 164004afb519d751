"""Latency: N ranks of BBGraP against one onnxruntime, measured side by side.

For each model / resolution / batch, in one run and interleaved round by round (so
the machine's noise hits every side alike):
  A       plain onnxruntime on the original model with the threads one node has
          (cores / N: 1 on a 2-core machine) — "one node of the cluster";
  B       plain onnxruntime with all the host's cores — "one bigger machine";
  BBGraP  `mpirun -n N bbgrap-run` on the compiled plan, one thread per rank.
Prints median latencies, the ratios A/BBGraP and B/BBGraP, and where the slowest
rank's time went (computing its segments, waiting for halos); every BBGraP run is
checked against the plan's reference in the same run. The cut direction is `auto` by
default: the batch (`n`) when there are at least as many images as nodes — no halos
at all — else height (`h`).

  python benchmarks/latency.py                         # vgg16, resnet50, mobilenet_v2; 224 and 512; batch 1 and 8
  python benchmarks/latency.py --models vgg16 --resolutions 224 --batches 1 --rounds 5 --json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from bbgrap import zoo
from bbgrap.backends.runtime import threads_per_rank
from bbgrap.compiler import compile_model
from bbgrap.config import Config
from bbgrap.plan import read_sample

BIN = os.path.dirname(sys.executable)
MIN_SIDE_SECONDS = 0.25
from table import Table  # benchmarks/table.py, beside this script


def session(path: str, threads: int) -> ort.InferenceSession:
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


def run_bbgrap(plan: str, nodes: int, repeat: int) -> dict[str, Any]:
    # fresh processes every round: warm them up as long as they are then timed
    cmd = [shutil.which("mpirun", path=BIN) or "mpirun", "-n", str(nodes), os.path.join(BIN, "bbgrap-run"), plan,
           "--json", "--repeat", str(repeat), "--warmup", str(max(2, repeat)), "--threads", "1", "--provider", "cpu"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_case(model: str, resolution: int, batch: int, nodes: int, direction: str, rounds: int, repeat: int,
               search: bool, workdir: str) -> dict[str, Any]:
    path = os.path.join(workdir, f"{model}-{resolution}-{batch}.onnx")
    onnx.save(zoo.build(model, resolution=resolution, batch=batch), path)
    plan = os.path.join(workdir, f"plan-{model}-{resolution}-{batch}")
    if direction == "auto":
        direction = "n" if batch >= nodes else "h"
    manifest = compile_model(path, Config(nodes=nodes, direction=direction), plan, search=search)
    feeds, _ = read_sample(plan)
    cores = len(os.sched_getaffinity(0))
    node_threads = threads_per_rank(nodes)  # what bbgrap-run gives each of N ranks on this host
    one_node = session(path, node_threads)
    bigger = session(path, cores)
    for s in (one_node, bigger):
        time_session(s, feeds, 1)  # warm-up
    # small models: enough inferences per side and round for about MIN_SIDE_SECONDS of the fastest side
    repeat = max(repeat, math.ceil(MIN_SIDE_SECONDS / max(min(time_session(bigger, feeds, 3)), 1e-6)))
    a, b, p, errors, profiles, layouts = [], [], [], [], [], set()
    for _ in range(rounds):
        a += time_session(one_node, feeds, repeat)
        b += time_session(bigger, feeds, repeat)
        r = run_bbgrap(plan, nodes, repeat)
        p.append(r["latency_ms"] / 1e3)
        errors.append(r["max_rel_error"])
        profiles.append(r["profile_ms"])
        layouts.add(r["layout"])
    a_ms, b_ms, p_ms = (statistics.median(x) * 1e3 for x in (a, b, p))
    # per rank, the median over rounds of its per-inference compute / wait / send
    profile = [{k: statistics.median(round_[rank][k] for round_ in profiles) for k in profiles[0][rank]}
               for rank in range(nodes)]
    return {
        "model": model, "resolution": resolution, "batch": batch, "nodes": nodes, "direction": direction,
        "profile_ms": profile, "sync_points": manifest["stats"]["sync_points"], "segments": manifest["stats"]["segments"],
        "searched": search, "A_ms": a_ms, "B_ms": b_ms, "bbgrap_ms": p_ms,
        "A_over_bbgrap": a_ms / p_ms, "B_over_bbgrap": b_ms / p_ms,
        "max_rel_error": max(errors), "exact": max(errors) <= 1e-4,
        "bytes_transferred": manifest["stats"]["bytes_transferred"], "threads_A": node_threads, "threads_B": cores,
        "repeat": repeat, "layout": ",".join(sorted(layouts)),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["vgg16", "resnet50", "mobilenet_v2"])
    p.add_argument("--resolutions", nargs="+", type=int, default=[224, 512])
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--direction", default="auto", help="cut direction n/c/h/w, or auto: n when batch >= nodes, else h (default)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--repeat", type=int, default=3,
                   help="inferences per side per round, at least (default 3; small models get enough for 0.25 s)")
    p.add_argument("--no-search", action="store_true", help="benchmark the naive split instead of the searched plan")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    rows = []
    table = Table([("model", "<13"), ("res", ">5"), ("batch", ">6"), ("cut", ">4"), ("A ms", ">10.1f"), ("B ms", ">10.1f"),
                   ("BBGraP ms", ">11.1f"), ("A/BBGraP", ">10.2f"), ("B/BBGraP", ">10.2f"), ("compute", ">9.1f"), ("wait", ">7.1f"),
                   ("syncs", ">6"), ("rel err", ">9.1e")])
    with tempfile.TemporaryDirectory(prefix="bbgrap-bench-") as work:
        for model in args.models:
            for res in args.resolutions:
                for batch in args.batches:
                    row = bench_case(model, res, batch, args.nodes, args.direction, args.rounds, args.repeat,
                                     not args.no_search, work)
                    rows.append(row)
                    if not args.json:
                        slowest = max(row["profile_ms"], key=lambda r: r["compute"] + r["wait"])
                        table.row(model, res, batch, row["direction"], row["A_ms"], row["B_ms"], row["bbgrap_ms"],
                                  row["A_over_bbgrap"], row["B_over_bbgrap"], slowest["compute"], slowest["wait"],
                                  row["sync_points"], row["max_rel_error"])
    if args.json:
        print(json.dumps({"nodes": args.nodes, "cores": len(os.sched_getaffinity(0)), "rows": rows}, indent=1))
    return 0 if all(r["exact"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
