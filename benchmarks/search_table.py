"""Reproduce thesis table 4.1: partitions searched by the pruned tree vs the exact search.

A 3x3 convolution (stride 1, pad 1, 3 -> 3 channels) whose output is 1x3x448x488,
with its input held split evenly across the nodes along the cut axis
(`bbgrap.search.conv_cost.ConvCost`), homogeneous speeds and all objective weights 1
(the thesis does not say which weights it used).  For nodes 2/4/8/16 and thresholds
5/10/15/20 % it prints the number of valid partitions, what `pruned-tree` and `exact`
evaluated (complete partitions whose objective was computed: the thesis' "Pruned"
row) and how many distinct node_cost calls they made, and whether both found the
optimum of `exhaustive` where that is feasible (<= 2e6 partitions).

Setups:
* `brief` (default): cut along the 488 axis, contiguous non-overlapping intervals.
* `thesis`: cut along the 448 axis with the thesis' overlapped option; this is the
  setup whose totals match table 4.1 exactly.  The pruned tree is run there only up to
  4 nodes (beyond that our reading of it takes minutes).

    python benchmarks/search_table.py [--setup brief|thesis] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from typing import Optional

from bbgrap.search.conv_cost import ConvCost
from bbgrap.search.objective import Weights
from bbgrap.search.procedural import Partitions
from bbgrap.search.strategies import EXHAUSTIVE_LIMIT, SearchResult, search

NODES = (2, 4, 8, 16)
THRESHOLDS = (5, 10, 15, 20)
# Thesis table 4.1: (log10 total, pruned) per nodes, per threshold.
THESIS_TOTAL = {2: (2.5, 3.1, 3.4, 3.6), 4: (5.7, 7.4, 8.2, 9.0), 8: (9.8, 13.3, 15.5, 17.2), 16: (17.1, 21.1, 26.6, 28.7)}
THESIS_PRUNED = {2: (26, 48, 70, 92), 4: (389, 1355, 2600, 4622), 8: (966, 3417, 7344, 12747), 16: (2501, 5174, 16528, 43121)}
SETUPS = {"brief": (488, 448, False), "thesis": (448, 488, True)}  # cut extent, other axis, overlapped


@dataclass(frozen=True)
class Run:
    evaluated: int
    cost_calls: int
    seconds: float
    objective: float
    optimal: Optional[bool]  # equals exhaustive's optimum (None: exhaustive not run)


@dataclass(frozen=True)
class Cell:
    nodes: int
    threshold: int
    log10_total: float
    thesis_log10_total: float
    thesis_pruned: int
    pruned_tree: Optional[Run]
    exact: Run
    exhaustive_objective: Optional[float]
    log10_reduction: float  # log10(total / exact evaluated)


def _run(result: SearchResult, optimum: Optional[float]) -> Run:
    optimal = None if optimum is None else result.objective == optimum
    return Run(result.evaluated, result.cost_calls, round(result.seconds, 3), result.objective, optimal)


def measure(nodes: int, threshold: int, setup: str) -> Cell:
    extent, other, overlapped = SETUPS[setup]
    speeds = [1.0] * nodes
    cost = ConvCost(extent, other, tuple(speeds))
    weights = Weights()
    total = Partitions(extent, speeds, threshold, overlapped).total()
    optimum = None
    if total <= EXHAUSTIVE_LIMIT:
        optimum = search(cost, speeds, threshold, weights, "exhaustive", overlapped).objective
    exact = search(cost, speeds, threshold, weights, "exact", overlapped)
    pruned = None
    if setup == "brief" or nodes <= 4:
        pruned = _run(search(cost, speeds, threshold, weights, "pruned-tree", overlapped), optimum)
    column = THRESHOLDS.index(threshold)
    return Cell(
        nodes,
        threshold,
        math.log10(total),
        THESIS_TOTAL[nodes][column],
        THESIS_PRUNED[nodes][column],
        pruned,
        _run(exact, optimum),
        optimum,
        round(math.log10(total) - math.log10(exact.evaluated), 1),
    )


def _mark(run: Optional[Run], exact: Optional[Run]) -> str:
    if run is None:
        return "-"
    if run.optimal is not None:
        return "yes" if run.optimal else "NO"
    if exact is None:
        return "proven"  # exact itself, where exhaustive is out of reach
    return "=exact" if run.objective == exact.objective else "worse"


def print_table(cells: list[Cell], setup: str, seconds: float) -> None:
    extent, other, overlapped = SETUPS[setup]
    print(f"table 4.1, setup '{setup}': conv output 1x3x448x488 cut along the {extent} axis, "
          f"{'overlapped' if overlapped else 'non-overlapped'} intervals, weights all 1")
    header = (
        f"{'nodes':>5} {'thr%':>4} {'log10 total':>12} {'(thesis)':>8} | "
        f"{'pruned-tree eval':>16} {'calls':>6} {'s':>6} | {'exact eval':>10} {'calls':>6} {'s':>6} | "
        f"{'thesis eval':>11} {'log10 red.':>10} | {'optimum? pruned':>15} {'exact':>6}"
    )
    print(header)
    print("-" * len(header))
    for c in cells:
        p = c.pruned_tree
        pruned = f"{p.evaluated:>16} {p.cost_calls:>6} {p.seconds:>6.2f}" if p else f"{'(not run)':>16} {'':>6} {'':>6}"
        print(
            f"{c.nodes:>5} {c.threshold:>4} {c.log10_total:>12.1f} {c.thesis_log10_total:>8.1f} | {pruned} | "
            f"{c.exact.evaluated:>10} {c.exact.cost_calls:>6} {c.exact.seconds:>6.2f} | "
            f"{c.thesis_pruned:>11} {c.log10_reduction:>10.1f} | {_mark(p, c.exact):>15} {_mark(c.exact, None):>6}"
        )
    print("optimum?: 'yes'/'NO' against exhaustive (run where <= 2e6 partitions); otherwise the pruned "
          "tree's objective compared with exact's ('=exact' or 'worse'), exact's being proven optimal.")
    beaten = all(c.exact.evaluated < c.thesis_pruned for c in cells)
    ran = [c for c in cells if c.pruned_tree is not None]
    fewer = all(c.exact.evaluated < c.pruned_tree.evaluated and c.exact.cost_calls < c.pruned_tree.cost_calls for c in ran if c.pruned_tree)
    print(f"exact evaluates fewer partitions than the thesis in every cell: {beaten}; fewer evaluations and "
          f"node_cost calls than pruned-tree in every cell where both ran: {fewer}; total {seconds:.1f} s")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setup", choices=sorted(SETUPS), default="brief")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    cells = [measure(n, t, args.setup) for n in NODES for t in THRESHOLDS]
    seconds = time.perf_counter() - began
    if args.json:
        print(json.dumps({"setup": args.setup, "seconds": round(seconds, 1), "cells": [asdict(c) for c in cells]}))
    else:
        print_table(cells, args.setup, seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
