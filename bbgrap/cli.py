"""`bbgrap`: compile a model into a plan, inspect a plan, write zoo models."""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
from typing import Any, Sequence

from bbgrap import package_version
from bbgrap.config import DIRECTIONS, PLANNERS, SEARCHES, Config, load_config
from bbgrap.ir import BBGrapError
from bbgrap.oneline import OneLineParser, env_rank
from bbgrap.paths import file_target_problem, inside, new_dir_problem, same_file, written_whole
from bbgrap.plan_schema import Plan, PredictionRecord
from bbgrap.progress import Progress

EPILOG = """examples:
  bbgrap zoo resnet50 -o resnet50.onnx
  bbgrap compile resnet50.onnx --nodes 4 --threshold 20      # writes ./bbgrap-plan
  mpirun -n 4 bbgrap-run                                     # runs it on 4 ranks
  bbgrap inspect bbgrap-plan --json
"""


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="bbgrap",
        description="BBGraP: partition an ONNX CNN across N nodes and run it there exactly.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"bbgrap {package_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    c = sub.add_parser("compile", help="compile MODEL into a plan for N nodes",
                       description="Compile an ONNX model into a plan directory for N nodes.")
    c.add_argument("model", help="the .onnx file")
    c.add_argument("--nodes", type=int, help="number of nodes (MPI ranks); default: the config's, else 1")
    c.add_argument("--threshold", type=float, help="search band around the speed-proportional size, in %% (default 20)")
    c.add_argument("--direction", help="cut direction: n (batch), c (channels), h (height) or w (width); default h")
    c.add_argument("--config", metavar="FILE", help="cluster/search config (TOML, see configs/)")
    c.add_argument("--speeds", help="relative node speeds, comma separated, e.g. 1,3,1; each layer is cut in proportion to them "
                   "(default: with --profile, each node's time for this model's layers on it, where the nodes differ by more "
                   "than 20%%; else equal)")
    c.add_argument("--memory-mb", metavar="MB[,MB...]",
                   help="memory each node gives the plan in MB (one for all, or one per node; bbgrap-run's own process comes "
                        "on top): heavy layers are cut along channels, sharding their weights, until every node's weights "
                        "and activations fit, with onnxruntime's prepacked weight copies or, where only that fits, without")
    c.add_argument("--search", help=f"search strategy: {', '.join(SEARCHES)} (default exact)")
    c.add_argument("--planner", help=f"how cuts are chosen across layers: {', '.join(PLANNERS)} (default dp: every layer's cut, "
                   "or the layer whole on one node, chosen jointly after the per-layer search, the exact minimum of the "
                   "layer-synchronous time by dynamic programming); greedy: the per-layer search alone (each layer's best cut "
                   "given its producers'); heft: list scheduling on each node's timeline (layers may go whole to one node); ga: a "
                   "genetic algorithm on that timeline seeded with the others; map-elites: MAP-Elites on that timeline, the fastest "
                   "plan per kind of plan (share of work on one node, number of boundaries) kept, seeded with the others. Costs come from --profile (else the default "
                   "profile scaled by --speeds); the planner's plan is kept where predicted at least 3%% faster than greedy's, else greedy's")
    c.add_argument("--balance", type=float, metavar="R",
                   help="keep every node's work (its FLOPs over its speed) within R times any other's (max/min, e.g. 1.3), "
                        "and no layer of more than 1%% of the work whole on one node: where the fastest predicted plan is less "
                        "even (a planner that places small layers whole on one node, a map too short to cut evenly), the "
                        "fastest predicted of the plans that are even so is kept, from the per-layer search's along h, w and c "
                        "and the even cuts along h, w and c (inspect shows which, and its predicted cost); an error where none "
                        "is (default 0: no bound)")
    c.add_argument("--input-shape", action="append", default=[], metavar="NAME:DIMS",
                   help="fix a symbolic input shape, e.g. input:1x3x224x224 (repeatable)")
    c.add_argument("-o", "--output", default="bbgrap-plan", metavar="DIR", help="plan directory (default ./bbgrap-plan)")
    c.add_argument("--no-search", action="store_true", help="keep the naive (even or speed-proportional) split")
    c.add_argument("--no-recompute", action="store_true",
                   help="receive every halo instead of recomputing the cheap ones locally (the thesis' plan; with --profile compile "
                        "already does so where the simulator predicts it at least 3%% faster)")
    c.add_argument("--no-optimize", action="store_true",
                   help="keep the naive gather-everything plan (implies --no-search and --no-recompute)")
    c.add_argument("--profile", metavar="FILE",
                   help="cluster profile (TOML, from bbgrap calibrate): cut in proportion to its nodes' speeds (where they differ, "
                   "moved so every rank's predicted compute is alike where that is predicted faster), print each rank's "
                   "predicted time and the speed-up over the fastest node alone; where N nodes are predicted no faster than one, "
                   "compile for the fastest predicted count below N, on the profile's fastest nodes (named, with their hosts)")
    c.add_argument("--force-nodes", action="store_true",
                   help="with --profile: keep --nodes even where fewer nodes are predicted faster")
    c.add_argument("--dump-ir-after", action="append", default=[], metavar="PASS",
                   help="write the IR after this pass to --dump-dir/PASS.txt (repeatable)")
    c.add_argument("--dump-dir", default="bbgrap-ir", metavar="DIR", help="where --dump-ir-after writes (default ./bbgrap-ir)")
    c.add_argument("--quiet", action="store_true", help="print nothing but errors")

    i = sub.add_parser("inspect", help="summarise a plan", description="Summarise a plan directory.")
    i.add_argument("plan", nargs="?", default="bbgrap-plan", help="plan directory (default ./bbgrap-plan)")
    i.add_argument("--json", action="store_true", help="print one JSON object")
    i.add_argument("--svg", metavar="FILE", help="write a picture of the plan (SVG): each layer's cut, every node's share "
                   "as a coloured band, recomputed halos, receive points, layers computed whole on one node")
    i.add_argument("--layers", action="store_true",
                   help="one row per layer: its cut, each node's range along it, operations (and how many are "
                   "recomputed), bytes its output sends, and for a layer computed whole on one node, which and why")

    k = sub.add_parser("calibrate", help="measure this cluster's nodes and links into a profile for compile --profile",
                       description="Measure each node's speed per kind of op (and of a few common op types apart: pools, LayerNormalization, Softmax, "
                       "Sigmoid, Erf, Mul, LRN, and a Concat with what each value it joins costs), its fixed costs per op, its segment boundary's costs "
                       "(per segment, per value a segment takes or gives, per message and per byte sent and taken, and what a segment "
                       "and each of its ops and values cost more after other segments: chains of segments run through the "
                       "executor, as bbgrap-run runs them), and the "
                       "links between nodes (ping-pong); write them as a cluster profile (TOML). Run it as bbgrap-run runs a "
                       "plan: mpirun -n N bbgrap calibrate -o cluster.toml (one rank per node), or alone for one node. A rank "
                       "under a CPU quota (a container's CPU limit) times its runs without the quota's stops and slows every "
                       "figure by the share of its threads' time the quota leaves (cpu_share). A rank of several threads times its "
                       "kinds of op twice, at the start and at the end, and keeps the faster of each (a host that slows a process "
                       "of several threads for seconds at a time). compile --profile cuts each layer "
                       "in proportion to the nodes' speeds on the model where they differ. With --refine RUN.json --profile FILE it "
                       "measures nothing: it corrects FILE by runs of plans compiled with it (bbgrap-run --json), each "
                       "node's figures by its segments' measured times against the predicted ones.")
    k.add_argument("-o", "--output", default="cluster.toml", metavar="FILE", help="the profile to write (default ./cluster.toml)")
    k.add_argument("--threads", type=int, help="onnxruntime threads per rank (default, or 0: as bbgrap-run, the rank's share of its "
                   "cores, at most a CPU quota's whole cores)")
    k.add_argument("--provider", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where each rank's ops, segments and messages are timed, as bbgrap-run's --provider (default auto: "
                   "CUDA when usable, each rank on its local rank's GPU as bbgrap-run picks it); plan with the profile of the "
                   "provider the plan will run on")
    k.add_argument("--model", metavar="FILE.onnx",
                   help="also time every layer of this model on each node, in the model run whole under onnxruntime's profiler "
                   "(its own cost per kernel and per input taken off; a few seconds more), and "
                   "how each convolution's and matmul's time scales on half its rows and half its channels: compile "
                   "--profile then prices that model's layers and their pieces by these times, not their kind's (the "
                   "profile records the file's hash; for another model it falls back to the kinds)")
    k.add_argument("--input-shape", action="append", default=[], metavar="NAME:DIMS",
                   help="with --model: fix a symbolic input shape, as compile's (repeatable)")
    k.add_argument("--refine", metavar="RUN.json", nargs="+",
                   help="measure nothing: correct --profile FILE by a run of a plan compiled with it "
                   "(mpirun -n N bbgrap-run PLAN --json --trace t.json > RUN.json; the trace gives each rank's CPU time, "
                   "which a node under a CPU quota needs), or by several runs (plans of several models or directions, "
                   "each compiled with FILE): per node, the line through its segments' predicted and "
                   "measured times (of every run) scales its figures (slope) and adds to each segment's fixed cost "
                   "(intercept), written to -o (a new file); compile --profile with the result cuts each layer in the "
                   "proportions the nodes showed")
    k.add_argument("--profile", metavar="FILE", help="with --refine: the profile the runs' plans were compiled with")

    z = sub.add_parser("zoo", help="write a standard CNN with random weights",
                       description="Write a standard architecture with random weights (no download).")
    z.add_argument("name", help="model name (vgg16, resnet18, resnet50, mobilenet_v2, inception, densenet)")
    z.add_argument("-o", "--output", required=True, metavar="FILE", help="the .onnx file to write")
    z.add_argument("--resolution", type=int, default=224, help="input height and width (default 224)")
    z.add_argument("--batch", type=int, default=1, help="batch size (default 1)")
    z.add_argument("--width", type=float, default=1.0, help="channel multiplier, e.g. 0.25 for a small variant (default 1)")
    z.add_argument("--seed", type=int, default=0, help="random seed of the weights (default 0)")
    return p


def _numbers(flag: str, text: str | None, example: str) -> tuple[float, ...] | None:
    """A comma-separated list of positive numbers given to `flag` (None: not given)."""
    if text is None:
        return None
    try:
        values = tuple(float(s) for s in text.split(","))
    except ValueError:
        values = ()
    if not values or not all(math.isfinite(s) and s > 0 for s in values):
        raise BBGrapError(f"{flag} '{text}' is not a comma-separated list of positive numbers, e.g. {example}")
    return values


def _check_dump_dir(directory: str, plan: str) -> None:
    """--dump-dir must be a writable directory, or one that can be made, outside the plan's
    directory `plan`, which its files would turn into a directory that is not a plan (checked
    before compiling)."""
    if same_file(directory, plan) or inside(directory, plan):
        raise BBGrapError(f"--dump-dir {directory} is in the plan's directory -o {plan}; dump the IR elsewhere, e.g. --dump-dir ir")
    if os.path.islink(directory) and not os.path.exists(directory):
        raise BBGrapError(f"--dump-dir {directory} is a symbolic link to a missing directory; choose another --dump-dir")
    if os.path.exists(directory):
        if not os.path.isdir(directory):
            raise BBGrapError(f"--dump-dir {directory} is a file, not a directory; choose another --dump-dir")
        if not os.access(directory, os.W_OK | os.X_OK):
            raise BBGrapError(f"--dump-dir {directory} is not writable; choose another --dump-dir")
        return
    problem = new_dir_problem(directory, "--dump-dir", directory)
    if problem:
        raise BBGrapError(problem)


def cmd_compile(args: argparse.Namespace) -> int:
    # everything about the arguments is checked before the compiler (onnx, onnxruntime) is imported
    base = load_config(args.config) if args.config else Config()
    speeds = _numbers("--speeds", args.speeds, "1,3,1")
    memory = _numbers("--memory-mb", args.memory_mb, "200 or 200,400")
    nodes = args.nodes if args.nodes is not None else (len(speeds) if speeds else None)
    if args.direction is not None and args.direction not in DIRECTIONS:
        raise BBGrapError(f"--direction '{args.direction}' is not one of {', '.join(DIRECTIONS)} (n: batch, c: channels, h: height, w: width)")
    if args.search is not None and args.search not in SEARCHES:
        raise BBGrapError(f"--search '{args.search}' is not one of {', '.join(SEARCHES)}")
    if args.planner is not None and args.planner not in PLANNERS:
        raise BBGrapError(f"--planner '{args.planner}' is not one of {', '.join(PLANNERS)}")
    cfg = base.with_overrides(nodes=nodes, threshold=args.threshold, direction=args.direction, speeds=speeds, search=args.search,
                              planner=args.planner, memory_mb=memory, balance=args.balance)
    if args.force_nodes and not args.profile:
        raise BBGrapError("--force-nodes only matters with --profile FILE; drop it or give a profile (bbgrap calibrate writes one)")
    profile = None
    if args.profile:
        from bbgrap.cluster import read_profile

        profile = read_profile(args.profile)
    from bbgrap.plan import check_output_dir

    check_output_dir(args.output)
    if args.dump_ir_after:
        _check_dump_dir(args.dump_dir, args.output)
    from bbgrap.compiler import compile_model
    from bbgrap.frontends.onnx import parse_input_shapes
    log = (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr))
    plan = compile_model(
        args.model, cfg, args.output, parse_input_shapes(args.input_shape),
        optimize=not args.no_optimize, search=not (args.no_search or args.no_optimize),
        dump_after=args.dump_ir_after, dump_dir=args.dump_dir,
        progress=None if args.quiet else Progress(), log=log, recompute=not args.no_recompute,
        profile=profile, force_nodes=args.force_nodes,
    )
    if not args.quiet:
        print(summary(plan, args.output))
        print(run_line(plan, args.output))
    return 0


def run_line(plan: Plan, output: str) -> str:
    """compile's last line: the command that runs the plan, naming its nodes' hosts (mpich's
    `-hosts`, in rank order) where the plan runs on some of the profile's nodes only and calibrate
    recorded them on more than one host."""
    pred = plan.compiled.prediction
    hosts = ""
    if pred is not None and pred.on_picked_nodes and all(pred.hosts) and len(set(pred.hosts)) > 1:
        hosts = f" -hosts {','.join(pred.hosts)}"
    return f"run it: mpirun -n {plan.nodes}{hosts} bbgrap-run {'' if output == 'bbgrap-plan' else output}".rstrip()


def prediction_text(pred: PredictionRecord) -> str:
    """compile --profile's lines: each rank's predicted compute / wait / total, the speed-up over one
    node, and where the plan has fewer nodes than asked for, why (one line) and which of the
    profile's nodes it runs on (one line)."""
    lines = [f"predicted with {pred.label}: {pred.latency_ms:.3f} ms per inference on {pred.nodes} node(s), "
             f"{pred.one_node_ms:.3f} ms on one node: speed-up {pred.speedup:.2f}x"]
    lines += [f"  rank {n}: compute {r.compute:.3f} ms, wait {r.wait:.3f} ms, total {r.total:.3f} ms" for n, r in enumerate(pred.ranks)]
    from bbgrap.compiler import PLANNER_MARGIN

    requested = pred.requested_nodes
    if pred.nodes != requested:
        lines.append(f"predicted: {requested} nodes are not at least {PLANNER_MARGIN:.0%} faster than {pred.nodes} "
                     f"({pred.candidates_ms[requested]:.3f} ms vs {pred.candidates_ms[pred.nodes]:.3f} ms"
                     f"{f'; one node {pred.one_node_ms:.3f} ms' if pred.nodes != 1 else ''}); "
                     f"compiled for {pred.nodes} node(s) instead (--force-nodes keeps {requested})")
    if pred.on_picked_nodes:
        named = ", ".join(f"{n}{f' ({h})' if h else ''}" for n, h in zip(pred.profile_nodes, pred.hosts))
        if pred.nodes == 1:
            lines.append(f"its node is the profile's fastest, node {named}: run its rank there")
        else:
            lines.append(f"its {pred.nodes} nodes are the profile's fastest, nodes {named}: run rank k on the k-th of them")
    if pred.nodes == requested and requested > 1 and pred.speedup <= 1.0:
        lines.append(f"predicted: {requested} nodes are not faster than 1 ({pred.latency_ms:.3f} ms vs "
                     f"{pred.one_node_ms:.3f} ms); kept {requested} as --force-nodes asks")
    return "\n".join(lines)


def inspect_json(plan: Plan) -> dict[str, Any]:
    stats = plan.stats
    return {
        "model": plan.model,
        "nodes": plan.nodes,
        "layers": plan.layers,
        "direction": plan.compiled.direction.value,
        "threshold": plan.compiled.threshold,
        "movement": plan.movement.value,
        "passes": list(plan.compiled.passes),
        "bytes_transferred": stats.bytes_transferred,
        "sync_points": stats.sync_points,
        "messages": stats.messages,
        "segments": stats.segments,
        "per_node": [n.to_json() for n in stats.per_node],
        "opaque": [o.to_json() for o in plan.opaque],
        "whole": whole_layers(plan),
        "on_every_node": [r.name for r in plan.compiled.layer_table if r.on_every_node()],
        "cpu_only": {str(p.node): p.cpu_only for p in plan.programs if p.cpu_only},  # nodes run on the CPU whatever --provider
        "search": plan.compiled.search.to_json() if plan.compiled.search is not None else None,
        "planner": plan.compiled.planner.to_json() if plan.compiled.planner is not None else None,
        "memory": plan.compiled.memory.to_json() if plan.compiled.memory is not None else None,
        "recompute": plan.compiled.recompute.to_json() if plan.compiled.recompute is not None else None,
        "balance": plan.compiled.balance.to_json() if plan.compiled.balance is not None else None,
        "prediction": plan.compiled.prediction.to_json() if plan.compiled.prediction is not None else None,
    }


def whole_layers(plan: Plan) -> list[dict[str, Any]]:
    """The layers computed whole on one node, with their share of the model's operations and why."""
    rows = plan.compiled.layer_table
    total = sum(r.flops for r in rows) or 1.0
    return [{"name": r.name, "op_type": r.op_type, "node": r.whole.node, "share": r.flops / total, "reason": r.whole.reason}
            for r in rows if r.whole is not None and plan.nodes > 1]


def layers_text(plan: Plan) -> str:
    """`bbgrap inspect --layers`: one row per layer."""
    rows = plan.compiled.layer_table
    total = sum(r.flops for r in rows) or 1.0
    lines = [f"{'layer':<28} {'op':<18} {'cut':<6} {'ranges per node':<28} {'MFLOP':>9} {'% model':>7} {'% recomp':>8} {'KB sent':>8}  note"]
    for r in rows:
        ranges = " ".join(f"{n}:{p.range[0]}-{p.range[1]}" for n, p in enumerate(r.per_node) if p.range)
        recomputed = sum(p.redundant_flops for p in r.per_node) / r.flops if r.flops else 0.0
        note = ""
        if r.whole is not None:
            note = f"whole on node {r.whole.node}: {r.whole.reason}"
        elif r.on_every_node():
            note = "whole on every node"
        lines.append(f"{r.name[:28]:<28} {r.op_type[:18]:<18} {r.cut:<6} {ranges[:28]:<28} {r.flops / 1e6:>9.2f} "
                     f"{100 * r.flops / total:>7.2f} {100 * recomputed:>8.1f} {r.bytes_sent / 1e3:>8.1f}  {note}".rstrip())
    return "\n".join(lines)


def summary(plan: Plan, where: str) -> str:
    info = inspect_json(plan)
    lines = [
        f"plan {where}: {info['model']}, {info['layers']} layers on {info['nodes']} nodes "
        f"(direction {info['direction']}, {info['movement']} transfers)",
        f"transfers: {info['bytes_transferred'] / 1e6:.3f} MB per inference in {info['messages']} messages, "
        f"{info['sync_points']} synchronisation points, {info['segments']} segments",
    ]
    memory = plan.compiled.memory
    for n, node in enumerate(info["per_node"]):
        estimate = "" if memory is None else f", memory about {memory.estimate_mb[n]:.0f} MB" + (
            f" of {memory.limit_mb[n]:g}" if memory.limit_mb else "")
        lines.append(
            f"  node {n}: {node['flops'] / 1e9:.3f} GFLOP ({node.get('redundant_flops', 0.0) / 1e9:.3f} beyond its own outputs), "
            f"sends {node['bytes_sent'] / 1e6:.3f} MB, "
            f"receives {node['bytes_received'] / 1e6:.3f} MB, weights {node['weight_bytes'] / 1e6:.2f} MB{estimate}"
        )
    if memory is not None and not memory.prepack:
        lines.append("weights not prepacked: the plan fits its nodes' memory only without onnxruntime's prepacked copies "
                     "(bbgrap-run turns them off, at some cost in speed)")
    if info["opaque"]:
        ops = sorted({o["op_type"] for o in info["opaque"]})
        lines.append(f"opaque layers (no region rule: each computed whole on one node): {len(info['opaque'])} ({', '.join(ops)})")
    whole = sorted(info["whole"], key=lambda w: -w["share"])
    if whole:
        top = "; ".join(f"{w['name']} ({w['op_type']}, {100 * w['share']:.1f} %: {w['reason']})" for w in whole[:3])
        lines.append(f"layers computed whole on one node: {len(whole)}, {100 * sum(w['share'] for w in whole):.1f} % of the "
                     f"operations; largest: {top} (bbgrap inspect --layers lists them all)")
    if info["on_every_node"]:
        lines.append(f"layers computed whole on every node: {len(info['on_every_node'])} (a squeeze-excite block's pool and 1x1 "
                     "convolutions from one exchange, or halos recomputed over every row; bbgrap inspect --layers notes them)")
    for n, why in info["cpu_only"].items():
        lines.append(f"node {n} runs on the CPU even with --provider auto on a GPU (--provider cuda refuses the plan): its {why}")
    s = info["search"]
    if s:
        lines.append(
            f"search: {s['strategy']}, objective {s['objective']:.4g}, {s['evaluated']} candidates evaluated of "
            f"10^{s['log10_total']:.1f}, {s['seconds']:.2f}s"
        )
    p = plan.compiled.planner
    if p is not None:
        lines.append(
            f"planner: {p.planner} ({'exact' if p.stats.exact else 'not proven optimal'}, {p.stats.evaluated} scored, "
            f"{p.stats.seconds:.2f}s); predicted {p.planner_ms:.3f} ms against {p.greedy_ms:.3f} ms for the per-layer search "
            f"alone ({p.profile}): kept {'the ' + p.planner + ' plan' if p.kept == p.planner else 'the per-layer search'}"
        )
    if plan.compiled.recompute is not None:
        lines.append(plan.compiled.recompute.summary())
    if plan.compiled.balance is not None:
        lines.append(plan.compiled.balance.summary())
    if plan.compiled.prediction is not None:
        lines.append(prediction_text(plan.compiled.prediction))
    return "\n".join(lines)


def cmd_inspect(args: argparse.Namespace) -> int:
    from bbgrap.plan import read_manifest

    plan = read_manifest(args.plan)
    if args.svg:
        from bbgrap.picture import plan_svg

        problem = file_target_problem(args.svg, "--svg", "plan.svg", [(args.plan, "the plan directory")])
        if problem:
            raise BBGrapError(problem)
        try:
            with written_whole(args.svg) as tmp, open(tmp, "w", encoding="utf-8") as fh:
                fh.write(plan_svg(plan))
        except OSError as exc:
            raise BBGrapError(f"cannot write {args.svg} ({exc.strerror or type(exc).__name__}); choose another path") from None
        return 0
    if args.json:
        info = inspect_json(plan)
        if args.layers:
            info["layers_table"] = [r.to_json() for r in plan.compiled.layer_table]
        print(json.dumps(info, indent=1))
    elif args.layers:
        print(layers_text(plan))
    else:
        print(summary(plan, args.plan))
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    problem = file_target_problem(args.output, "-o", "cluster.toml", [(args.model, "the --model file"), *((r, "a --refine file") for r in args.refine or ())])
    if problem is None and (args.refine is None) != (args.profile is None):
        problem = ("--refine RUN.json needs --profile FILE, the profile its plan was compiled with" if args.profile is None
                   else "--profile only matters with --refine RUN.json; drop it to measure the nodes")
    if problem is None and args.refine is not None and (args.model or args.threads is not None or args.input_shape or args.provider != "auto"):
        problem = "--refine measures nothing; drop --model, --threads, --input-shape and --provider, or drop --refine to measure"
    if problem is None and args.profile is not None and os.path.exists(args.output) and same_file(args.output, args.profile):
        problem = (f"-o {args.output} is the --profile being refined, which would be lost; write the refined one to "
                   "another file, e.g. -o refined.toml")
    if problem is None and args.threads is not None and args.threads < 0:
        problem = f"--threads {args.threads}: give at least 1 thread, or 0 for the rank's share of its cores (as bbgrap-run)"
    if problem is None:
        from bbgrap.backends.threads import threads_problem

        problem = threads_problem(args.threads)
    if problem is None and args.input_shape and not args.model:
        problem = "--input-shape only matters with --model FILE; drop it or name the model"
    model = None
    if problem is None and args.model:
        from bbgrap.backends.calibrate import model_to_time
        from bbgrap.frontends.onnx import parse_input_shapes

        try:
            model = model_to_time(args.model, parse_input_shapes(args.input_shape))
        except BBGrapError as exc:
            problem = str(exc)
    if problem:
        return calibrate_error(problem)
    if args.refine is not None:
        return refine_profile(args) if env_rank() == 0 else 0
    from bbgrap.backends.calibrate import run

    try:
        rank, text = run(args.output, args.threads or None, model, args.provider)  # 0: the default, as bbgrap-run's
    except BBGrapError as exc:  # the provider (no GPU, no CUDA provider), or --model on a GPU
        return calibrate_error(str(exc))
    if rank == 0:
        print(text)
    return 0


def calibrate_error(problem: str) -> int:
    """calibrate's exit status 2 for `problem`, which every rank finds: one line, by rank 0."""
    if env_rank() == 0:
        print(f"bbgrap: error: {problem}", file=sys.stderr)
    return 2


def refine_profile(args: argparse.Namespace) -> int:
    """calibrate --refine: the profile corrected by measured runs, written to -o (bbgrap/refine.py)."""
    from bbgrap.cluster import read_profile, write_profile
    from bbgrap.refine import describe, read_run, refine

    profile, checks = refine(read_profile(args.profile), [read_run(path) for path in args.refine])
    lines = describe(checks)
    write_profile(args.output, profile, f"bbgrap calibrate --refine {' '.join(args.refine)} --profile {args.profile}\n" + "\n".join(lines))
    print("\n".join([*lines, f"wrote {args.output}: compile --profile {args.output} cuts by these speeds"]))
    return 0


def cmd_zoo(args: argparse.Namespace) -> int:
    problem = file_target_problem(args.output, "-o", f"{args.name}.onnx")
    if args.seed < 0:
        problem = f"--seed {args.seed}: give a seed of 0 or more"
    if problem:
        raise BBGrapError(problem)
    import onnx

    from bbgrap import zoo

    try:
        model = zoo.build(args.name, resolution=args.resolution, batch=args.batch, width=args.width, seed=args.seed)
    except zoo.ZooError as exc:
        raise BBGrapError(str(exc)) from None
    try:
        with written_whole(args.output) as tmp:
            onnx.save(model, tmp)
    except OSError as exc:
        raise BBGrapError(f"cannot write {args.output} ({exc.strerror or type(exc).__name__}); free space or choose another path") from None
    params = sum(math.prod(i.dims) for i in model.graph.initializer)
    print(f"wrote {args.output}: {args.name} at {args.resolution}x{args.resolution}, batch {args.batch}, "
          f"{params / 1e6:.2f}M parameters")
    return 0


def _terminate(signum: int, frame: Any) -> None:
    """SIGTERM ends bbgrap like Ctrl-C: through the clean-up of whatever it was writing."""
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _terminate)
    args = _parser().parse_args(argv)
    handlers = {"compile": cmd_compile, "inspect": cmd_inspect, "calibrate": cmd_calibrate, "zoo": cmd_zoo}
    try:
        return handlers[args.command](args)
    except BBGrapError as exc:
        print(f"bbgrap: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bbgrap: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `bbgrap inspect | head`: the reader is gone, nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # a bug of bbgrap's, not the user's: one line, exit 3 (BBGRAP_DEBUG=1: the traceback)
        if os.environ.get("BBGRAP_DEBUG"):
            raise
        text = (str(exc).strip().splitlines() or [""])[0]
        print(f"bbgrap: internal error ({type(exc).__name__}: {text}); please report it with the model and the command "
              f"(BBGRAP_DEBUG=1 shows where)", file=sys.stderr)
        return 3

if __name__ == "__main__":
    sys.exit(main())
