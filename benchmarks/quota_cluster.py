"""Nodes of different speeds emulated on one host (issue 16's heterogeneous goal).

Two ways to make the nodes differ:

* CPU quotas (the default; needs root): each rank is pinned to a core (its own by default;
  `--cores` may put several on one) and put in a cgroup of its own whose CFS quota gives it a
  share of that core (default 0.3 and 0.9: a 1:3 cluster of two nodes). Ranks that share a core
  need shares that sum to at most 1, so that each still gets its whole share:
  `--shares 0.3,0.9,0.3 --cores 0,1,0` is a 1:3:1 cluster on two cores.
* core counts (`--pinned`; no root): each rank is pinned to cores of its own, as many as its
  `--cores` item names, and runs one onnxruntime thread per core, as `bbgrap-run` gives a rank
  pinned alone: `--pinned --cores 0,1-3,4` is a 1:3:1 cluster of 1, 3 and 1 cores. A node of three
  cores is not three times as fast (threads meet at every op), so the speeds set are measured.

Then, in one run:

0. each node's speed measured alone: the model's one-node plan run by `bbgrap-run` on that
   node's cores (under its quota), every node at once (as the plans' ranks run, side by side);
1. `mpirun -n N bbgrap calibrate` on the nodes: each node's speed on the model as the
   profile gives it (`compiler.model_speeds`), against those measured (and the shares set);
2. `bbgrap compile --profile` twice: cut by the profile's speeds (the default) and evenly
   (`--speeds 1,...,1`), both with --force-nodes;
3. both plans run on the nodes (`bbgrap-run --trace`), alternating, ROUNDS times: the
   latency of each and their ratio; and the time each rank's work (its segments and sends) takes
   on its node (balance: the slowest rank's over the fastest's): under quotas its CPU time (the
   trace's `cpu_us`, which leaves out the quota's stops and the other ranks on its core) over its
   share; pinned, their wall time (the rank has its cores to itself, and its threads' CPU time
   would count each core);
4. with `--refine K`, before step 3, K times: the latest plan (first the one cut by the profile's
   speeds) run once on the nodes (`bbgrap-run --json --trace`: each rank's CPU time, which a
   node under a quota is refined by), its profile refined by that run (`bbgrap calibrate
   --refine`), and a plan compiled with the refined profile, which the rounds of step 3 run too.

Quotas need root and a writable cgroup cpu controller (v1 `cpu` or v2 with `cpu` enabled); it
says so in one line and exits 2 otherwise. The cgroups it makes (bbgrap-quota-RANK) are removed
at the end. Usage: `sudo python quota_cluster.py MODEL.onnx [--shares 0.3,0.9] [--cores 0,1]
[--period-us 5000] [--layer-times] [--refine K] [--keep DIR]`, or `python quota_cluster.py
MODEL.onnx --pinned --cores 0,1-3,4 [...]`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence

GROUP = "bbgrap-quota-{rank}"
RANK_VARIABLE = "BBGRAP_QUOTA_RANK"  # the rank a command started without mpirun runs as (PMI_RANK would make MPI look for mpirun)
ROUNDS = 3


def cgroup_root() -> tuple[str, int] | None:
    """Where to make cpu cgroups: the v1 cpu hierarchy's mount, else the v2 mount with cpu on."""
    v1 = "/sys/fs/cgroup/cpu"
    if os.path.exists(os.path.join(v1, "cpu.cfs_quota_us")) and os.access(v1, os.W_OK):
        return v1, 1
    v2 = "/sys/fs/cgroup"
    try:
        with open(os.path.join(v2, "cgroup.subtree_control"), encoding="ascii") as fh:
            if "cpu" in fh.read().split() and os.access(v2, os.W_OK):
                return v2, 2
    except OSError:
        pass
    return None


CoreSets = list[tuple[int, ...]]


def parse_cores(text: str) -> CoreSets:
    """Each rank's cores from `--cores`: one comma-separated item per rank, a core (`4`) or a
    range of them (`1-3`); ValueError (argparse's one line) for an item that names no core."""
    sets: CoreSets = []
    for item in text.split(","):
        first, _, last = item.partition("-")
        sets.append(tuple(range(int(first), int(last or first) + 1)))
        if not sets[-1]:
            raise ValueError(f"{item} names no core")
    return sets


def cores_text(cores: CoreSets) -> str:
    """`--cores` as parse_cores reads it."""
    return ",".join(str(c[0]) if len(c) == 1 else f"{c[0]}-{c[-1]}" for c in cores)


def enter(share: float, period_us: int, core: int, rank: int) -> None:
    """Put this process in its rank's cgroup with `share` of a core, pinned to `core`."""
    found = cgroup_root()
    assert found is not None
    root, version = found
    group = os.path.join(root, GROUP.format(rank=rank))
    os.makedirs(group, exist_ok=True)
    quota = max(1000, int(share * period_us))
    if version == 1:
        with open(os.path.join(group, "cpu.cfs_period_us"), "w") as fh:
            fh.write(str(period_us))
        with open(os.path.join(group, "cpu.cfs_quota_us"), "w") as fh:
            fh.write(str(quota))
    else:
        with open(os.path.join(group, "cpu.max"), "w") as fh:
            fh.write(f"{quota} {period_us}")
    with open(os.path.join(group, "cgroup.procs"), "w") as fh:
        fh.write(str(os.getpid()))
    os.sched_setaffinity(0, {core})


def remove_groups(ranks: int) -> None:
    found = cgroup_root()
    if found is None:
        return
    for rank in range(ranks):
        try:
            os.rmdir(os.path.join(found[0], GROUP.format(rank=rank)))
        except OSError:
            pass


def wrapper(shares: Sequence[float], cores: CoreSets, period_us: int) -> list[str]:
    """The command that puts a rank in its quota on its cores (a share of 0: pinned only) and then
    runs the command after it."""
    return [sys.executable, os.path.abspath(__file__), "--enter", ",".join(map(str, shares)), "--cores", cores_text(cores),
            "--period-us", str(period_us), "--"]


def failed(command: Sequence[str], out: str, err: str) -> None:
    sys.exit(f"quota_cluster: {' '.join(command[:2])} failed: {(err or out).strip().splitlines()[-1:]}")


def launch(shares: Sequence[float], cores: CoreSets, period_us: int, command: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """`mpirun -n N` of `command`, every rank entering its quota on its cores first."""
    mpirun = os.path.join(os.path.dirname(sys.executable), "mpirun")
    proc = subprocess.run([mpirun, "-n", str(len(shares)), *wrapper(shares, cores, period_us), *command], capture_output=True, text=True)
    if proc.returncode != 0:
        failed(command, proc.stdout, proc.stderr)
    return proc


def each_alone(shares: Sequence[float], cores: CoreSets, period_us: int, command: Sequence[str]) -> list[str]:
    """`command` on every node at once, each in a process of its own (no mpirun) in its quota on its
    cores, as the plans' ranks run side by side; each one's standard output."""
    procs = [subprocess.Popen([*wrapper(shares, cores, period_us), *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, RANK_VARIABLE: str(rank)}) for rank in range(len(shares))]
    outs = [proc.communicate() for proc in procs]
    for proc, (out, err) in zip(procs, outs):
        if proc.returncode != 0:
            failed(command, out, err)
    return [out for out, _ in outs]


def rank_work(trace: str, ranks: int, wall: bool = False) -> tuple[float, list[float]]:
    """The median latency (ms) of a --trace file and each rank's median CPU time (ms) in its
    segments and sends (`wall`: their wall time)."""
    with open(trace, encoding="utf-8") as fh:
        events = json.load(fh)
    events = events["traceEvents"] if isinstance(events, dict) else events
    spans = {r: sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "inference" and e["pid"] == r) for r in range(ranks)}
    latency: list[float] = []
    work: list[list[float]] = [[] for _ in range(ranks)]
    for k in range(len(spans[0])):
        latency.append(max(spans[r][k][1] for r in range(ranks)) - min(spans[r][k][0] for r in range(ranks)))
        for r in range(ranks):
            a, b = spans[r][k]
            work[r].append(sum(e["dur"] if wall else e["args"]["cpu_us"] for e in events if e.get("cat") in ("run", "send") and e["pid"] == r and a <= e["ts"] <= b))
    return statistics.median(latency) / 1e3, [statistics.median(w) / 1e3 for w in work]


def cores_problem(shares: Sequence[float] | None, cores: CoreSets, usable: Sequence[int]) -> str:
    """What is wrong with putting ranks of these shares on these cores, or pinning them there
    without quotas where `shares` is None ('' where nothing is)."""
    if shares is None:
        if len(cores) < 2:
            return f"--pinned needs a --cores item per rank, two or more (e.g. --cores 0,1-3,4 for 1:3:1), not {cores_text(cores)}"
    elif len(cores) != len(shares):
        return f"--cores names {len(cores)} cores for {len(shares)} ranks; give one per rank (e.g. --cores {','.join(map(str, range(len(shares))))})"
    if any(c not in usable for s in cores for c in s):
        return f"--cores {cores_text(cores)}: this process may use cores {','.join(map(str, usable))} only"
    if shares is None:
        for a in range(len(cores)):
            for b in range(a):
                if set(cores[a]) & set(cores[b]):
                    return f"ranks {b} and {a} share cores ({cores_text(cores)}); --pinned gives each rank cores of its own"
        return ""
    if any(len(s) != 1 for s in cores):
        return f"--cores {cores_text(cores)}: under quotas each rank runs on one core (ranks on several cores: --pinned)"
    if any(not 0 < s <= 1 for s in shares):
        return f"--shares {','.join(f'{s:g}' for s in shares)}: each must be above 0 and at most 1"
    for core in set(cores):
        total = sum(s for s, c in zip(shares, cores) if c == core)
        if total > 1 + 1e-9:
            return (f"the ranks on core {core[0]} have shares summing to {total:g}: at most 1, or they slow each other down beyond "
                    "their quotas (lower --shares or spread --cores)")
    return ""


def main(args: argparse.Namespace) -> int:
    from bbgrap.frontends.onnx import import_model

    from bbgrap.cluster import read_profile
    from bbgrap.compiler import model_speeds

    if args.pinned and args.shares is not None:
        print("quota_cluster: --pinned runs each rank on its cores without a quota; leave out --shares (or --pinned)", file=sys.stderr)
        return 2
    quotas = None if args.pinned else (args.shares or [0.3, 0.9])
    cores = args.cores if args.cores is not None else [(r,) for r in range(len(quotas or ()))]
    problem = cores_problem(quotas, cores, sorted(os.sched_getaffinity(0)))
    if problem:
        print(f"quota_cluster: {problem}", file=sys.stderr)
        return 2
    n = len(cores)
    shares = quotas or [0.0] * n  # a share of 0: pinned only
    where = "pinned" if quotas is None else "under the quotas"
    bindir = os.path.dirname(sys.executable)
    graph = import_model(args.model).graph  # each profile's speeds on it

    def compile_plan(profile: str, out: str, *extra: str) -> None:
        subprocess.run([os.path.join(bindir, "bbgrap"), "compile", args.model, "--nodes", str(n), "--profile", profile, "--force-nodes",
                        "--quiet", "-o", out, *extra], check=True)

    work_dir = args.keep or tempfile.mkdtemp(prefix="bbgrap-quota-")
    os.makedirs(work_dir, exist_ok=True)
    try:
        one = os.path.join(work_dir, "plan-one")
        subprocess.run([os.path.join(bindir, "bbgrap"), "compile", args.model, "--nodes", "1", "--quiet", "-o", one], check=True)

        def run(plan: str, *flags: str) -> list[str]:
            """bbgrap-run of `plan` on the CPU (on a GPU host its default would take the GPU)."""
            return [os.path.join(bindir, "bbgrap-run"), plan, "--provider", "cpu", "--repeat", str(args.repeat), "--quiet", *flags]

        alone = [json.loads(out)["latency_min_ms"] for out in each_alone(shares, cores, args.period_us, run(one, "--json"))]
        measured_speeds = [alone[0] / t for t in alone]
        profile = os.path.join(work_dir, "cluster.toml")
        launch(shares, cores, args.period_us, [os.path.join(bindir, "bbgrap"), "calibrate", "-o", profile, "--provider", "cpu",
                                               *(["--model", args.model] if args.layer_times else [])])
        speeds = model_speeds(graph, read_profile(profile), n)
        ratio = [s / speeds[0] for s in speeds]
        nodes = (f"cores {cores_text(cores)}, pinned" if quotas is None else
                 f"shares set {','.join(f'{s:g}' for s in shares)} (period {args.period_us} us), set {', '.join(f'{s / shares[0]:.2f}' for s in shares)}")
        print(f"{nodes}: speeds relative to rank 0 measured alone {', '.join(f'{m:.2f}' for m in measured_speeds)} (the one-node plan "
              f"{', '.join(f'{t:.2f}' for t in alone)} ms on each node), found by calibrate {', '.join(f'{r:.2f}' for r in ratio)} "
              f"(worst {max(abs(r / m - 1) for r, m in zip(ratio, measured_speeds)):.1%} off)")
        plans = {"by the profile's speeds": [], "even": ["--speeds", ",".join(["1"] * n)]}
        dirs: dict[str, str] = {}
        for name, extra in plans.items():
            dirs[name] = os.path.join(work_dir, f"plan-{len(dirs)}")
            compile_plan(profile, dirs[name], *extra)
        latest, latest_profile = dirs["by the profile's speeds"], profile
        for k in range(1, args.refine + 1):  # the latest plan run once under the quotas, its profile refined by that run, compiled again
            run_json, refined = os.path.join(work_dir, f"run-{k}.json"), os.path.join(work_dir, f"refined-{k}.toml")
            with open(run_json, "w", encoding="utf-8") as fh:
                fh.write(launch(shares, cores, args.period_us, run(latest, "--json", "--trace", os.path.join(work_dir, f"trace-run-{k}.json"))).stdout)
            subprocess.run([os.path.join(bindir, "bbgrap"), "calibrate", "--refine", run_json, "--profile", latest_profile, "-o", refined],
                           check=True, capture_output=True)
            speeds = model_speeds(graph, read_profile(refined), n)
            name = f"refined {k}x"
            print(f"{name} (by a run of the plan before): speeds relative to rank 0 {', '.join(f'{s / speeds[0]:.2f}' for s in speeds)}")
            latest = dirs[name] = os.path.join(work_dir, f"plan-{len(dirs)}")
            latest_profile = refined
            compile_plan(refined, latest)
        measured: dict[str, list[float]] = {name: [] for name in dirs}
        work: dict[str, list[list[float]]] = {name: [] for name in dirs}
        for _ in range(ROUNDS):
            for name, plan in dirs.items():
                trace = os.path.join(work_dir, f"trace-{os.path.basename(plan)}.json")
                launch(shares, cores, args.period_us, run(plan, "--trace", trace))
                latency, per_rank = rank_work(trace, n, wall=quotas is None)
                measured[name].append(latency)
                work[name].append(per_rank)
        for name in dirs:
            on_node = [statistics.median(w[r] for w in work[name]) / (shares[r] or 1) for r in range(n)]
            busy = [t for t in on_node if t > 0]  # a rank the plan gives no segment does no work: not a node of the balance
            idle = ", ".join(str(r) for r, t in enumerate(on_node) if t <= 0)
            spent = "CPU time in segments and sends over its share" if quotas else "wall time in segments and sends"
            print(f"{name}: {where} {statistics.median(measured[name]):.2f} ms (rounds {', '.join(f'{t:.2f}' for t in measured[name])}); "
                  f"each rank's {spent} {', '.join(f'{t:.2f}' for t in on_node)} ms: "
                  f"slowest/fastest {max(busy) / min(busy):.2f}{f' (idle: rank {idle})' if idle else ''}")
        names = list(dirs)
        for name in names[:1] + names[2:]:
            print(f"{name} / {names[1]} {where}: {statistics.median(measured[name]) / statistics.median(measured[names[1]]):.3f}")
    finally:
        if not args.keep:
            shutil.rmtree(work_dir, ignore_errors=True)
        if quotas is not None:
            remove_groups(n)
    return 0


def parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", nargs="?", help="the ONNX model")
    p.add_argument("--shares", type=lambda s: [float(x) for x in s.split(",")], default=None,
                   help="each rank's share of its core (default 0.3,0.9)")
    p.add_argument("--cores", type=parse_cores, default=None,
                   help="the core each rank is pinned to (default: rank i on core i); ranks sharing a core need shares summing to at most 1; "
                   "with --pinned each rank's cores, a core or a range (0,1-3,4)")
    p.add_argument("--pinned", action="store_true", help="no quotas (no root needed): each rank pinned to its --cores alone, one "
                   "onnxruntime thread per core, so nodes differ by their core counts")
    p.add_argument("--period-us", type=int, default=5000, help="the quota's period in microseconds (default 5000; at least 1000)")
    p.add_argument("--repeat", type=int, default=30, help="timed inferences per run (default 30)")
    p.add_argument("--layer-times", action="store_true", help="calibrate with --model: each layer's time and scaling measured on "
                   "every rank, not only each op kind's")
    p.add_argument("--refine", type=int, default=0, metavar="K", help="also, K times: run the latest plan once under the quotas "
                   "(the first: the one cut by the profile's speeds), refine its profile by that run (bbgrap calibrate --refine) "
                   "and compile a plan with the refined profile (default 0)")
    p.add_argument("--keep", metavar="DIR", help="keep the profile (cluster.toml), the plans (plan-0: by the profile's speeds, "
                   "plan-1: even, plan-2...: refined), each run and refined profile of --refine, and each plan's last trace in DIR")
    p.add_argument("--enter", help=argparse.SUPPRESS)
    return p.parse_args(argv)


if __name__ == "__main__":
    cut = sys.argv.index("--") if "--" in sys.argv else len(sys.argv)
    opts = parse(sys.argv[1:cut])
    if opts.enter is not None:  # a rank: into its quota (a share of 0: pinned only), then the command after --
        rank = int(os.environ.get(RANK_VARIABLE, os.environ.get("PMI_RANK", "0")))
        share = [float(x) for x in opts.enter.split(",")][rank]
        core_set = opts.cores[rank]
        command = sys.argv[cut + 1:]
        if share > 0:
            enter(share, opts.period_us, core_set[0], rank)
        else:
            os.sched_setaffinity(0, set(core_set))
        os.execv(command[0], command)
    if opts.model is None:
        sys.exit("quota_cluster: give the model: python quota_cluster.py MODEL.onnx")
    if not opts.pinned and cgroup_root() is None:
        print("quota_cluster: no writable cgroup cpu controller (needs root and cgroup v1 'cpu' or v2 with cpu enabled)", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(opts))
