"""Prediction: the simulator's latency (bbgrap/simulate.py, a calibrated profile) against the real one.

For every node count N the cluster is calibrated once (`mpirun -n N bbgrap calibrate`, one
rank per node, as the plans then run); then for every zoo model x N x direction x with and
without recompute-halos the plan is compiled, its latency predicted from the profile, and
measured with `mpirun -n N bbgrap-run --json` (as benchmarks/latency.py does: warmed up,
the result checked against the plan's reference in the same run) in --rounds runs, each round
running every plan once, by node count (a slow spell of the machine, seconds long, then falls on
one run of a plan, not on all of them). Measured latency is the fastest inference of all runs (calibrate,
too, keeps the fastest run of its models: on a shared machine others' jobs only slow a run down)
and, beside it, the lowest of the runs' medians. Prints one row per plan,
Pearson's R between predicted and measured latency and the largest relative error, over all
plans and over the plans for more than one node, and per model and node count how much slower
the plan predicted fastest measured than the fastest measured.

  python benchmarks/prediction.py                              # 5 models x (N = 1, and N = 2 x h, w, c x recompute on/off)
  python benchmarks/prediction.py --models resnet18 --nodes 2 --directions h
  python benchmarks/prediction.py --per-layer                  # each model's layers measured by calibrate --model
  python benchmarks/prediction.py --per-layer --no-scaling     # ... but a piece costs its share of the operations
  python benchmarks/prediction.py --no-cold                    # ... and a segment after others as one alone (cold_segment_s = cold_s = 0)
  python benchmarks/prediction.py --float-kernels --models q.onnx   # a quantized model's integer kernels priced as float ones
  python benchmarks/prediction.py --per-layer --models resnet18 exported/mobilenet_v3_small.onnx   # zoo and exporter models
  python benchmarks/prediction.py --keep pred-run              # profiles, plans and each run's JSON kept in ./pred-run (for calibrate --refine)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, Iterator

import numpy as np
import onnx

from bbgrap import zoo
from bbgrap.cluster import INTEGER_KINDS, ClusterProfile, NodeProfile, read_profile
from bbgrap.compiler import compile_model
from bbgrap.config import Config, Direction
from bbgrap.simulate import Prediction

BIN = os.path.dirname(sys.executable)
from latency import run_bbgrap  # noqa: E402  # benchmarks/latency.py, beside this script
from table import Table  # noqa: E402  # benchmarks/table.py, beside this script


def models(work: str, names: list[str], resolution: int, width: float) -> Iterator[tuple[str, str]]:
    """(name, path) of each model: an ONNX file as it is (an exporter's model, at its own input
    shape), or a zoo model written to `work` as it is reached."""
    for name in names:
        if os.path.isfile(name):
            yield os.path.splitext(os.path.basename(name))[0], name
            continue
        path = os.path.join(work, f"{name}.onnx")
        onnx.save(zoo.build(name, resolution=resolution, width=width), path)
        yield name, path


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """--models, --resolution and --width: what `models` takes (the zoo's five at 96 px, width 0.5, by default)."""
    p.add_argument("--models", nargs="+", default=["resnet18", "mobilenet_v2", "vgg16", "inception", "densenet"],
                   help="zoo models (at --resolution and --width), or ONNX files (at their own input shape)")
    p.add_argument("--resolution", type=int, default=96)
    p.add_argument("--width", type=float, default=0.5, help="zoo channel multiplier (default 0.5)")


def calibrate(nodes: int, path: str, model: str | None = None, provider: str = "cpu") -> ClusterProfile:
    """The profile of this host run as `nodes` ranks (bbgrap calibrate under mpirun) on `provider`, with `model`'s layers where given."""
    cmd = [shutil.which("mpirun", path=BIN) or "mpirun", "-n", str(nodes), os.path.join(BIN, "bbgrap"), "calibrate", "-o", path,
           "--provider", provider]
    cmd += ["--model", model] if model else []
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    return read_profile(path)


@dataclass
class Profiles:
    """The calibrated profile for each model and node count: one per node count, calibrated once
    up front; or with `per_layer` one per model and node count, with that model's layers
    (calibrate --model), calibrated when asked for."""

    work: str
    nodes: list[int]
    per_layer: bool
    provider: str = "cpu"
    shared: dict[int, ClusterProfile] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.per_layer:
            self.shared = {n: calibrate(n, os.path.join(self.work, f"cluster-{n}.toml"), provider=self.provider) for n in self.nodes}

    def of(self, name: str, path: str, nodes: int) -> ClusterProfile:
        if not self.per_layer:
            return self.shared[nodes]
        return calibrate(nodes, os.path.join(self.work, f"cluster-{name}-{nodes}.toml"), path, self.provider)


def float_kernels(node: NodeProfile) -> NodeProfile:
    """`node` with the integer kernels of a quantized model priced as the float kinds they stand for
    (`cluster.INTEGER_KINDS`), as a profile written before calibrate measured them prices them."""
    return replace(node, **{f"{kind}_{figure}": getattr(node, f"{then}_{figure}", 0.0)
                            for kind, then in INTEGER_KINDS.items() for figure in ("ops_per_s", "op_s", "elements_per_s")
                            if hasattr(node, f"{kind}_{figure}")})


@dataclass
class Bench:
    """One compiled plan of the benchmark, its prediction and its runs (`bbgrap-run --json` each)."""

    name: str
    nodes: int
    direction: str
    recompute: bool
    plan: str
    prediction: Prediction
    segments: int
    messages: int
    runs: list[dict[str, Any]] = field(default_factory=list)


def compile_bench(model_path: str, name: str, nodes: int, direction: str, recompute: bool, profile: ClusterProfile,
                  workdir: str) -> Bench:
    """The plan of `name` for `nodes` nodes cut along `direction`, with or without recompute-halos, compiled into `workdir`."""
    plan = os.path.join(workdir, f"plan-{name}-{nodes}-{direction}-{int(recompute)}")
    # judge=False: the plan with recompute-halos even where compile would leave the pass out (this
    # benchmark measures both)
    compiled = compile_model(model_path, Config(nodes=nodes, direction=Direction(direction)), plan, recompute=recompute,
                             profile=profile, force_nodes=True, judge=False)
    pred = compiled.compiled.prediction
    assert pred is not None
    return Bench(name, nodes, direction, recompute, plan, pred, compiled.stats.segments, compiled.stats.messages)


def run_bench(bench: Bench, repeat: int, provider: str = "cpu") -> None:
    """One more run of the plan, kept beside it as `bbgrap-run --json` printed it (what `calibrate --refine` takes)."""
    run = run_bbgrap(bench.plan, bench.nodes, repeat, None, provider=provider)
    with open(f"{bench.plan}-run{len(bench.runs)}.json", "w") as f:
        json.dump(run, f)
    bench.runs.append(run)


def bench_row(bench: Bench) -> dict[str, Any]:
    """The plan's row: on a shared machine others' jobs only ever slow a run down, so the fastest
    inference of its runs (as calibrate takes the fastest run of its models) and the lowest median."""
    runs, nodes, pred = bench.runs, bench.nodes, bench.prediction
    real = min(runs, key=lambda r: r["latency_ms"])
    # one rank runs in process and reports no per-rank profile: all of its time is its own
    ranks = real.get("profile_ms") or [{"compute": real["latency_ms"], "wait": 0.0, "send": 0.0}]
    slowest = max(range(nodes), key=lambda r: ranks[r]["compute"] + ranks[r]["wait"])
    return {
        "model": bench.name, "nodes": nodes, "direction": bench.direction, "recompute": bench.recompute,
        "real_ms": min(r["latency_min_ms"] for r in runs), "real_median_ms": real["latency_ms"], "predicted_ms": pred.latency_ms,
        "real_compute_ms": ranks[slowest]["compute"], "real_wait_ms": ranks[slowest]["wait"],
        "predicted_compute_ms": pred.ranks[slowest].compute, "predicted_wait_ms": pred.ranks[slowest].wait,
        "segments": bench.segments, "messages": bench.messages,
        "max_rel_error": max(r["max_rel_error"] for r in runs), "exact": max(r["max_rel_error"] for r in runs) <= 1e-4,
    }


def agreement(rows: list[dict[str, Any]], real_key: str) -> dict[str, float]:
    """Pearson's R of predicted against real latency (`real_key`), and the relative errors |predicted - real| / real."""
    real = np.array([r[real_key] for r in rows])
    pred = np.array([r["predicted_ms"] for r in rows])
    r = float(np.corrcoef(real, pred)[0, 1]) if len(rows) > 1 else float("nan")
    return {"plans": len(rows), "pearson_r": r, "max_rel_error": float(np.max(np.abs(pred - real) / real)),
            "median_rel_error": float(np.median(np.abs(pred - real) / real))}


def choices(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model and node count (with more than one plan): the plan the simulator predicts fastest,
    and how much slower it measured than the fastest measured plan among them."""
    out = []
    for key in dict.fromkeys((r["model"], r["nodes"]) for r in rows):
        group = [r for r in rows if (r["model"], r["nodes"]) == key]
        if len(group) < 2:
            continue
        chosen = min(group, key=lambda r: r["predicted_ms"])
        best = min(r["real_ms"] for r in group)
        out.append({"model": key[0], "nodes": key[1], "plans": len(group), "chosen": f"{chosen['direction']}"
                    f"{'+recompute' if chosen['recompute'] else ''}", "gap": chosen["real_ms"] / best - 1})
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(p)
    p.add_argument("--nodes", type=int, nargs="+", default=[1, 2],
                   help="node counts (default 1 2; more ranks than cores time-slice ranks that spin on waits)")
    p.add_argument("--directions", nargs="+", default=["h", "w", "c"])
    p.add_argument("--repeat", type=int, default=20, help="timed inferences per run (default 20, after as many warm-ups)")
    p.add_argument("--rounds", type=int, default=3, help="runs per plan; the fastest counts (default 3)")
    p.add_argument("--per-layer", action="store_true",
                   help="calibrate once per model and node count with --model: the simulator prices each layer by its own "
                   "measured time (else once per node count, every layer by its kind's throughput)")
    p.add_argument("--no-scaling", action="store_true",
                   help="with --per-layer: drop what calibrate measured of how each layer scales with its piece, so a piece "
                   "costs its share of the operations (to compare the two)")
    p.add_argument("--no-cold", action="store_true",
                   help="drop what calibrate measured of a segment run after others (cold_segment_s = cold_s = 0), so it costs what it "
                   "costs alone (to compare the two)")
    p.add_argument("--float-kernels", action="store_true",
                   help="price the integer kernels of a quantized model (qconv, qmatmul) as the float kinds they stand for, as a "
                   "profile written before calibrate measured them does (to compare the two)")
    p.add_argument("--provider", choices=["cpu", "cuda"], default="cpu",
                   help="where calibrate times the nodes and bbgrap-run runs the plans (default cpu; cuda: each rank on its local rank's GPU)")
    p.add_argument("--keep", metavar="DIR",
                   help="keep the profiles, the compiled plans and each run's `bbgrap-run --json` result in DIR, a new or empty "
                   "directory (default: a temporary directory, deleted at the end)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.keep and os.path.exists(args.keep) and (not os.path.isdir(args.keep) or os.listdir(args.keep)):
        p.error(f"--keep {args.keep}: exists and is not an empty directory; name a new one")
    # the ablations: what calibrate measured that --no-scaling and --no-cold leave out of every node
    dropped: dict[str, Any] = {**({"layer_scaling": {}} if args.no_scaling else {}), **({"cold_segment_s": 0.0, "cold_s": 0.0} if args.no_cold else {})}
    benches: list[Bench] = []
    table = Table([("model", "<13"), ("N", ">3"), ("cut", ">4"), ("recomp", ">7"), ("min ms", ">8.2f"), ("median", ">8.2f"), ("pred ms", ">9.2f"),
                   ("err %", ">7.1f"), ("real c/w", ">13"), ("pred c/w", ">13"), ("segs", ">5"), ("rel err", ">9.1e")])
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
    with nullcontext(os.path.abspath(args.keep)) if args.keep else tempfile.TemporaryDirectory(prefix="bbgrap-predict-") as work:
        profiles = Profiles(work, args.nodes, args.per_layer, args.provider)
        for name, path in models(work, args.models, args.resolution, args.width):
            for n in args.nodes:
                profile = profiles.of(name, path, n)
                if dropped or args.float_kernels:
                    profile = replace(profile, nodes=tuple(replace(float_kernels(p) if args.float_kernels else p, **dropped)
                                                           for p in profile.nodes))
                variants = [(d, rec) for d in args.directions for rec in (True, False)] if n > 1 else [("h", False)]
                benches += [compile_bench(path, name, n, direction, recompute, profile, work) for direction, recompute in variants]
        for k in range(args.rounds):
            print(f"round {k + 1} of {args.rounds}: {len(benches)} plans", file=sys.stderr, flush=True)
            # the plans of one node count one after the other: on the 2-core VM a rank of two threads run
            # just after a run of two ranks has taken twice its time for seconds (plain onnxruntime too)
            for bench in sorted(benches, key=lambda b: b.nodes):
                run_bench(bench, args.repeat, args.provider)
        rows = [bench_row(b) for b in benches]
        if not args.json:
            for row in rows:
                table.row(row["model"], row["nodes"], row["direction"], "yes" if row["recompute"] else "no", row["real_ms"], row["real_median_ms"],
                          row["predicted_ms"], 100 * (row["predicted_ms"] - row["real_ms"]) / row["real_ms"],
                          f"{row['real_compute_ms']:.2f}/{row['real_wait_ms']:.2f}",
                          f"{row['predicted_compute_ms']:.2f}/{row['predicted_wait_ms']:.2f}",
                          row["segments"], row["max_rel_error"])
    stats = {f"{label}, against the {key.split('_')[1] if key != 'real_ms' else 'fastest'}": agreement(subset, key)
             for label, subset in (("all plans", rows), ("plans on >1 node", [r for r in rows if r["nodes"] > 1]))
             for key in ("real_ms", "real_median_ms") if subset}
    chosen = choices(rows)
    if args.json:
        print(json.dumps({"rows": rows, "agreement": stats, "choices": chosen, "cores": len(os.sched_getaffinity(0))}, indent=1))
    else:
        for label, a in stats.items():
            print(f"{label}: {a['plans']} plans, Pearson R {a['pearson_r']:.3f}, relative error median "
                  f"{100 * a['median_rel_error']:.1f} %, max {100 * a['max_rel_error']:.1f} %")
        for c in chosen:
            print(f"{c['model']} on {c['nodes']} nodes: the plan predicted fastest of {c['plans']} ({c['chosen']}) measured "
                  f"{100 * c['gap']:.1f} % slower than the fastest measured")
    return 0 if all(r["exact"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
