"""Compare plans of one model side by side in one mpirun, inference by inference.

Every rank loads every plan once; the plans then take turns, one inference each and in
a fresh random order every round, so the machine's noise (other jobs, frequency, cache
state, which plan ran just before) hits them alike. Prints
each plan's median latency and the median of the paired differences to the first
plan: on a shared machine that difference is stable to a few percent of a
millisecond where separate runs of the same plan scatter by 5-10 %. Every plan's
result is checked against its reference first.

  bbgrap compile model.onnx --nodes 2 -o with
  bbgrap compile model.onnx --nodes 2 --no-recompute -o without
  python benchmarks/compare.py with without --repeat 200
  python benchmarks/compare.py with --layout both     # NCHWc against NCHW between segments
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time

BIN = os.path.dirname(sys.executable)


def worker(plans: list[str], repeat: int, warmup: int, tolerance: float, layout: str) -> int:
    from bbgrap.backends.engine import layout_name, load_runner, node_layouts
    from bbgrap.backends.executor import run_node
    from bbgrap.backends.runtime import agreed_boundary_block, compare
    from bbgrap.backends.threads import threads_per_rank
    from bbgrap.backends.transports import MPITransport
    from mpi4py import MPI

    from bbgrap.plan import read_manifest, read_sample

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    threads = threads_per_rank(local.Get_size())
    block = agreed_boundary_block(comm, "auto", "auto", local.Get_rank())
    blocks = {"auto": [block], "nchw": [0], "both": [block, 0]}[layout]
    sides, labels = [], []
    for plan in plans:
        manifest = read_manifest(plan)
        inputs, reference = read_sample(plan)
        for b in blocks:
            layouts = node_layouts(plan, manifest, [rank], threads, True, b, comm.allgather)
            runner = load_runner(plan, manifest, rank, threads, "auto", layout=layouts[rank])
            sides.append((runner, MPITransport(comm, runner), inputs, reference))
            labels.append(f"{plan} ({layout_name(b)})")
    plans = labels
    times: list[list[float]] = [[] for _ in plans]
    errors: list[float | None] = [None for _ in plans]
    shuffle = random.Random(0)  # the same order on every rank
    for k in range(warmup + repeat):
        order = list(range(len(sides)))
        shuffle.shuffle(order)  # a fresh order each turn: no plan always runs first or after the same one
        for i in order:
            runner, transport, inputs, reference = sides[i]
            comm.Barrier()
            t0 = time.perf_counter()
            outputs = run_node(runner, transport, inputs)
            elapsed = time.perf_counter() - t0
            if k >= warmup:
                times[i].append(elapsed)
            if k == 0 and rank == 0:
                errors[i] = compare(outputs, reference)[1]
    if rank != 0:
        return 0
    bad = [p for p, e in zip(plans, errors) if e is not None and e > tolerance]
    for plan, err, ts in zip(plans, errors, times):
        paired = [a - b for a, b in zip(ts, times[0])]
        faster = sum(d < 0 for d in paired) / len(paired)
        check = "no reference" if err is None else f"rel error {err:.1e}"
        print(f"{plan:<32} median {statistics.median(ts) * 1e3:9.3f} ms   vs first {statistics.median(paired) * 1e3:+8.3f} ms"
              f"   faster in {faster:4.0%} of turns   {check}")
    if bad:
        print(f"compare: error: {', '.join(bad)} differ from their reference by more than {tolerance:g}", file=sys.stderr)
        return 1
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("plans", nargs="+", help="plan directories compiled for the same number of nodes")
    p.add_argument("--repeat", type=int, default=100, help="timed turns, at least 1 (default 100)")
    p.add_argument("--warmup", type=int, default=10, help="untimed turns first (default 10)")
    p.add_argument("--tolerance", type=float, default=1e-4, help="max relative error against the reference (default 1e-4)")
    p.add_argument("--layout", choices=("auto", "nchw", "both"), default="auto",
                   help="activations between segments, as bbgrap-run --layout; both: each plan in each layout (default auto)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.repeat < 1 or args.warmup < 0:
        p.error("--repeat must be at least 1 and --warmup non-negative")
    if args.worker:
        return worker(args.plans, args.repeat, args.warmup, args.tolerance, args.layout)
    from bbgrap.ir import BBGrapError
    from bbgrap.plan import read_manifest

    try:
        nodes = {plan: read_manifest(plan).nodes for plan in args.plans}
    except BBGrapError as exc:
        p.error(str(exc))
    if len(set(nodes.values())) != 1:
        p.error(f"the plans have different node counts {nodes}; compile them for the same --nodes")
    cmd = [os.path.join(BIN, "mpirun"), "-n", str(nodes[args.plans[0]]), sys.executable, os.path.abspath(__file__),
           "--worker", "--repeat", str(args.repeat), "--warmup", str(args.warmup), "--tolerance", str(args.tolerance), "--layout", args.layout, *args.plans]
    return subprocess.run(cmd).returncode


if __name__ == "__main__":
    sys.exit(main())
