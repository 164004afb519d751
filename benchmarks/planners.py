"""Planners side by side: the per-layer search (greedy) against the whole-network planners (dp, heft, ga, map-elites).

For every node count N the cluster is calibrated once (`mpirun -n N bbgrap calibrate`, one
rank per node); then every zoo model is compiled for N nodes with each planner
(`compile --planner P --profile cluster.toml --force-nodes`), its latency predicted by the
simulator of the lowered plan, and measured with `mpirun -n N bbgrap-run --json` in --rounds
rounds, the plans of one model taking turns in every round (warmed up, checked against the
plan's reference in the same run; the fastest inference of all rounds counts, as on a shared
machine others' jobs only slow a run down). A planner's
plan is the faster predicted of its own and greedy's (`kept`); the planner's own prediction
is printed beside it. Prints one row per plan, with the measured and predicted ratio to greedy
(< 1: faster than greedy), and per model which plan measured fastest.

  python benchmarks/planners.py                                   # 4 zoo models x N = 2, 4 (4 ranks need 4 cores)
  python benchmarks/planners.py --models resnet18 --nodes 2 --planners greedy dp
  python benchmarks/planners.py --nodes 2 --per-layer             # each model's layers measured (calibrate --model)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any

from latency import run_bbgrap  # noqa: E402  # benchmarks/latency.py, beside this script
from prediction import Profiles, models  # noqa: E402
from table import Table  # noqa: E402  # benchmarks/table.py, beside this script

from bbgrap.cluster import ClusterProfile
from bbgrap.compiler import compile_model
from bbgrap.config import PLANNERS, Config, Direction


def compile_for(model_path: str, name: str, nodes: int, planner: str, direction: str, profile: ClusterProfile,
                workdir: str) -> tuple[str, dict[str, Any]]:
    """The plan of one planner, and its row so far (what was predicted)."""
    plan = os.path.join(workdir, f"plan-{name}-{nodes}-{planner}")
    compiled = compile_model(model_path, Config(nodes=nodes, direction=Direction(direction), planner=planner), plan,
                             profile=profile, force_nodes=True)
    pred, record = compiled.compiled.prediction, compiled.compiled.planner
    assert pred is not None
    return plan, {
        "model": name, "nodes": nodes, "planner": planner,
        "kept": record.kept if record is not None else "greedy",
        "own_predicted_ms": record.planner_ms if record is not None else pred.latency_ms,
        "predicted_ms": pred.latency_ms, "compile_s": compiled.compiled.compile_seconds,
        "segments": compiled.stats.segments, "messages": compiled.stats.messages,
        "exact_dp": record.stats.exact if record is not None else None,
    }


def measure(plans: list[tuple[str, dict[str, Any]]], nodes: int, repeat: int, rounds: int) -> None:
    """Every plan run once per round, the plans in turn (so that a slow spell of the shared machine
    falls on all of them alike); the fastest inference of all rounds counts."""
    runs: list[list[dict[str, Any]]] = [[] for _ in plans]
    for _ in range(rounds):
        for k, (plan, _) in enumerate(plans):
            runs[k].append(run_bbgrap(plan, nodes, repeat, None))
    for (_, row), got in zip(plans, runs):
        row["real_ms"] = min(r["latency_min_ms"] for r in got)
        row["real_median_ms"] = min(r["latency_ms"] for r in got)
        row["max_rel_error"] = max(r["max_rel_error"] for r in got)
        row["exact"] = row["max_rel_error"] <= 1e-4


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["resnet18", "mobilenet_v2", "inception", "densenet"],
                   help="zoo models (at --resolution and --width), or ONNX files (at their own input shape)")
    p.add_argument("--resolution", type=int, default=96)
    p.add_argument("--width", type=float, default=0.5, help="zoo channel multiplier (default 0.5)")
    p.add_argument("--nodes", type=int, nargs="+", default=[2, 4])
    p.add_argument("--planners", nargs="+", default=list(PLANNERS), choices=PLANNERS)
    p.add_argument("--direction", default="h")
    p.add_argument("--repeat", type=int, default=20, help="timed inferences per run (default 20, after as many warm-ups)")
    p.add_argument("--rounds", type=int, default=3, help="runs per plan; the fastest counts (default 3)")
    p.add_argument("--per-layer", action="store_true",
                   help="calibrate once per model and node count with --model, so the planners price each layer by its own "
                   "measured time (else once per node count, every layer by its kind's throughput)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    rows: list[dict[str, Any]] = []
    table = Table([("model", "<13"), ("N", ">3"), ("planner", ">8"), ("kept", ">7"), ("real ms", ">9.2f"), ("/greedy", ">8.3f"),
                   ("pred ms", ">9.2f"), ("/greedy", ">8.3f"), ("own pred", ">9.2f"), ("segs", ">5"), ("msgs", ">5"),
                   ("compile s", ">10.1f"), ("rel err", ">9.1e")])
    with tempfile.TemporaryDirectory(prefix="bbgrap-planners-") as work:
        profiles = Profiles(work, args.nodes, args.per_layer)
        for name, path in models(work, args.models, args.resolution, args.width):
            for n in args.nodes:
                profile = profiles.of(name, path, n)
                plans = [compile_for(path, name, n, planner, args.direction, profile, work) for planner in args.planners]
                measure(plans, n, args.repeat, args.rounds)
                base = plans[0][1]
                for _, row in plans:
                    row["real_vs_first"] = row["real_ms"] / base["real_ms"]
                    row["predicted_vs_first"] = row["predicted_ms"] / base["predicted_ms"]
                    rows.append(row)
                    if not args.json:
                        table.row(name, n, row["planner"], row["kept"], row["real_ms"], row["real_vs_first"], row["predicted_ms"],
                                  row["predicted_vs_first"], row["own_predicted_ms"], row["segments"], row["messages"],
                                  row["compile_s"], row["max_rel_error"])
                group = [r for r in rows if r["model"] == name and r["nodes"] == n]
                fastest = min(group, key=lambda r: r["real_ms"])
                chosen = min(group, key=lambda r: r["predicted_ms"])
                if not args.json:
                    print(f"  {name} on {n}: fastest measured {fastest['planner']} ({fastest['real_ms']:.2f} ms); fastest predicted "
                          f"{chosen['planner']}, measured {chosen['real_ms'] / fastest['real_ms']:.3f}x the fastest")
    if args.json:
        print(json.dumps({"rows": rows, "cores": len(os.sched_getaffinity(0))}, indent=1))
    return 0 if all(r["exact"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
