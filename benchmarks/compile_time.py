"""Whole-model compile time (with the search) for the zoo models at 2–16 nodes.

  python benchmarks/compile_time.py                       # all zoo models at 224, 2/4/8/16 nodes, 20 %
  python benchmarks/compile_time.py --models resnet50 --nodes 16 --json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import onnx
from table import Table  # benchmarks/table.py, beside this script

from bbgrap import zoo
from bbgrap.compiler import compile_model
from bbgrap.config import Config, Direction


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(zoo.NAMES))
    p.add_argument("--nodes", nargs="+", type=int, default=[2, 4, 8, 16])
    p.add_argument("--threshold", type=float, default=20.0)
    p.add_argument("--direction", default="h")
    p.add_argument("--search", default="exact")
    p.add_argument("--resolution", type=int, default=224)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    rows = []
    table = Table([("model", "<13"), ("nodes", ">6"), ("compile s", ">11.2f"), ("search s", ">10.2f"), ("evaluated", ">11"),
                   ("log10 total", ">13.1f"), ("objective/naive", ">17.3f")])
    with tempfile.TemporaryDirectory(prefix="bbgrap-compile-") as work:
        for model in args.models:
            path = os.path.join(work, f"{model}.onnx")
            onnx.save(zoo.build(model, resolution=args.resolution), path)
            for nodes in args.nodes:
                cfg = Config(nodes=nodes, threshold=args.threshold, direction=Direction(args.direction), search=args.search)
                t0 = time.perf_counter()
                m = compile_model(path, cfg, os.path.join(work, "plan"))
                total = time.perf_counter() - t0
                s = m.compiled.search
                row = {"model": model, "nodes": nodes, "compile_s": total, "search_s": s.seconds if s else 0.0,
                       "evaluated": s.evaluated if s else 0, "log10_total": s.log10_total if s else 0.0,
                       "objective": s.objective if s else None, "naive_objective": s.naive_objective if s else None,
                       "bytes_transferred": m.stats.bytes_transferred}
                rows.append(row)
                if not args.json:
                    ratio = (row["objective"] / row["naive_objective"]) if row["naive_objective"] else float("nan")
                    table.row(model, nodes, total, row["search_s"], row["evaluated"], row["log10_total"], ratio)
    if args.json:
        print(json.dumps({"threshold": args.threshold, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
