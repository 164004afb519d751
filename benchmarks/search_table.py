"""Thesis table 4.1: search a convolution whose output is 1×3×448×488, cut along width.

For nodes 2/4/8/16 and thresholds 5/10/15/20 %: the number of candidate partitions
(log10; the thesis counts overlapped intervals, the compiler searches contiguous cuts:
both are printed), the candidates evaluated by the thesis' pruned search (as reported),
by our `pruned-tree` and by `exact`, the distinct node-cost calls and seconds of
`exact`, and whether the optima agree (and equal `exhaustive` where it is feasible).

  python benchmarks/search_table.py            # the whole table (about 2 minutes)
  python benchmarks/search_table.py --nodes 2 4 --json
"""

from __future__ import annotations

import argparse
import json
import sys

from bbgrap.search.conv_cost import ConvCost
from bbgrap.search.objective import Weights
from bbgrap.search.procedural import Partitions
from bbgrap.search.strategies import EXHAUSTIVE_LIMIT, search

THESIS = {  # (nodes, threshold): (log10 total, pruned evaluated), thesis table 4.1
    (2, 5): (2.5, 26), (2, 10): (3.1, 48), (2, 15): (3.4, 70), (2, 20): (3.6, 92),
    (4, 5): (5.7, 389), (4, 10): (7.4, 1355), (4, 15): (8.2, 2600), (4, 20): (9.0, 4622),
    (8, 5): (9.8, 966), (8, 10): (13.3, 3417), (8, 15): (15.5, 7344), (8, 20): (17.2, 12747),
    (16, 5): (17.1, 2501), (16, 10): (21.1, 5174), (16, 15): (26.6, 16528), (16, 20): (28.7, 43121),
}
from table import Table  # noqa: E402  # benchmarks/table.py, beside this script (on sys.path as the script's folder)


def row(nodes: int, threshold: int) -> dict:
    speeds = [1.0] * nodes
    cost = ConvCost(488, 448, tuple(speeds))
    w = Weights()
    exact = search(cost, speeds, threshold, w, "exact")
    pruned = search(cost, speeds, threshold, w, "pruned-tree")
    contiguous = Partitions(488, speeds, threshold)
    out = {
        "nodes": nodes, "threshold": threshold,
        "thesis_log10_total": THESIS[(nodes, threshold)][0],
        "log10_total_overlapped": Partitions(488, speeds, threshold, overlapped=True).log10_total(),
        "log10_total": contiguous.log10_total(),
        "thesis_pruned_evaluated": THESIS[(nodes, threshold)][1],
        "pruned_evaluated": pruned.evaluated, "pruned_seconds": pruned.seconds,
        "exact_evaluated": exact.evaluated, "exact_cost_calls": exact.cost_calls, "exact_seconds": exact.seconds,
        "pruned_found_optimum": pruned.objective == exact.objective,
        "exact_equals_exhaustive": None,
    }
    if contiguous.total() <= EXHAUSTIVE_LIMIT:
        ref = search(cost, speeds, threshold, w, "exhaustive")
        out["exact_equals_exhaustive"] = (ref.objective, ref.cuts) == (exact.objective, exact.cuts)
    out["beats_thesis"] = exact.evaluated < out["thesis_pruned_evaluated"]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", nargs="+", type=int, default=[2, 4, 8, 16])
    p.add_argument("--thresholds", nargs="+", type=int, default=[5, 10, 15, 20])
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    rows = []
    table = Table([("nodes", ">5"), ("thr%", ">5"), ("log10 total thesis", ">19.1f"), ("overlapped", ">11.1f"),
                   ("contiguous", ">11.1f"), ("thesis eval", ">12"), ("pruned eval", ">12"), ("exact eval", ">11"),
                   ("exact calls", ">12"), ("exact s", ">9.2f"), ("pruned opt", ">11"), ("=exhaustive", ">12")])
    for nodes in args.nodes:
        for t in args.thresholds:
            r = row(nodes, t)
            rows.append(r)
            if not args.json:
                eq = "-" if r["exact_equals_exhaustive"] is None else str(r["exact_equals_exhaustive"])
                table.row(nodes, t, r["thesis_log10_total"], r["log10_total_overlapped"], r["log10_total"],
                          r["thesis_pruned_evaluated"], r["pruned_evaluated"], r["exact_evaluated"], r["exact_cost_calls"],
                          r["exact_seconds"], str(r["pruned_found_optimum"]), eq)
    if args.json:
        print(json.dumps({"rows": rows}, indent=1))
    return 0 if all(r["beats_thesis"] and r["exact_equals_exhaustive"] is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
