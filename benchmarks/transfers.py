"""Bytes transferred per inference: naive (gather everything, thesis fig. 3.6a)
against optimized (send only what the next layer reads), for the zoo models at
2, 3 and 4 nodes and directions h and w, with the synchronisation points; and the
optimized plan after recompute-halos (cheap halos recomputed instead of received).

  python benchmarks/transfers.py                    # all zoo models at 224
  python benchmarks/transfers.py --models vgg16 resnet50 --resolution 224 --json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any

import onnx
from table import Table  # benchmarks/table.py, beside this script

from bbgrap import zoo
from bbgrap.compiler import compile_model
from bbgrap.config import Config, Direction


def measure(path: str, nodes: int, direction: str, work: str) -> dict[str, Any]:
    row: dict[str, Any] = {"nodes": nodes, "direction": direction}
    for label, optimize, recompute in (("naive", False, False), ("optimized", True, False), ("recomputed", True, True)):
        m = compile_model(path, Config(nodes=nodes, direction=Direction(direction)), os.path.join(work, "plan"), optimize=optimize,
                          search=False, recompute=recompute)
        row[f"{label}_bytes"] = m.stats.bytes_transferred
        row[f"{label}_sync_points"] = m.stats.sync_points
    row["ratio"] = row["naive_bytes"] / max(1, row["optimized_bytes"])
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(zoo.NAMES))
    p.add_argument("--nodes", nargs="+", type=int, default=[2, 3, 4])
    p.add_argument("--directions", nargs="+", default=["h", "w"])
    p.add_argument("--resolution", type=int, default=224)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    rows = []
    table = Table([("model", "<13"), ("nodes", ">6"), ("dir", ">4"), ("naive MB", ">11.2f"), ("optimized MB", ">14.3f"),
                   ("ratio", ">8.1f"), ("sync naive", ">12"), ("sync opt", ">10"), ("+recompute MB", ">15.3f"), ("sync", ">6")])
    with tempfile.TemporaryDirectory(prefix="bbgrap-transfers-") as work:
        for model in args.models:
            path = os.path.join(work, f"{model}.onnx")
            onnx.save(zoo.build(model, resolution=args.resolution), path)
            for nodes in args.nodes:
                for direction in args.directions:
                    row = {"model": model, **measure(path, nodes, direction, work)}
                    rows.append(row)
                    if not args.json:
                        table.row(model, nodes, direction, row["naive_bytes"] / 1e6, row["optimized_bytes"] / 1e6, row["ratio"],
                                  row["naive_sync_points"], row["optimized_sync_points"], row["recomputed_bytes"] / 1e6,
                                  row["recomputed_sync_points"])
    if args.json:
        print(json.dumps({"resolution": args.resolution, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
