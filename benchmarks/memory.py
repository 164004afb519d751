"""Memory per node (issue 16): what each rank of a plan took, measured, against compile's estimate.

For each zoo model, each plan is compiled for N nodes without a memory limit and with each
--memory-mb given, and run under `mpirun -n N bbgrap-run --json` in the layout asked for. Per
plan: the weights a node holds, whether they are prepacked, compile's estimate of the plan's
memory per node (`bbgrap/cost.py`, fit-memory's model), the measured peak resident memory of
each rank less its baseline before loading its part of the plan (bbgrap-run's own interpreter
and libraries), their ratio, the baseline, the plan directory's size against the model's, and
whether the result is exact. Beside them, onnxruntime on the whole model in one process (its
peak less the same kind of baseline).

  python benchmarks/memory.py                                   # vgg16, 4 nodes, no limit and 200 MB
  python benchmarks/memory.py --models resnet50 --memory-mb 400 100 --layouts nchw auto
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import onnx

from bbgrap import zoo
from bbgrap.compiler import compile_model
from bbgrap.config import Config

BIN = os.path.dirname(sys.executable)
from latency import run_bbgrap  # noqa: E402  # benchmarks/latency.py, beside this script
from table import Table  # noqa: E402  # benchmarks/table.py, beside this script

WHOLE = """
import json, sys
import numpy as np
import onnxruntime as ort
from bbgrap.backends.runtime import memory_baseline_mb, peak_memory_mb
base = memory_baseline_mb()
sess = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
feeds = {i.name: np.random.rand(*i.shape).astype(np.float32) for i in sess.get_inputs()}
sess.run(None, feeds)
print(json.dumps({"baseline_mb": base, "peak_mb": peak_memory_mb()}))
"""


def whole_model(path: str) -> dict[str, float]:
    """onnxruntime on the whole model in a fresh process: its baseline and peak resident memory (MB)."""
    proc = subprocess.run([sys.executable, "-c", WHOLE, path], capture_output=True, text=True, check=True, timeout=1800)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def du(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["vgg16"], choices=zoo.NAMES)
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--memory-mb", nargs="*", type=float, default=[200.0], help="limits to fit plans to (besides no limit)")
    p.add_argument("--layouts", nargs="+", default=["nchw"], choices=["nchw", "auto"],
                   help="bbgrap-run --layout (a plan fitted to memory keeps NCHW whatever is asked)")
    p.add_argument("--resolution", type=int, default=224)
    args = p.parse_args()
    table = Table([("model", "<10"), ("limit MB", ">9"), ("layout", ">9"), ("weights MB", ">11"), ("prepack", ">8"),
                   ("estimate MB", ">12"), ("measured MB", ">12"), ("meas/est", ">9"), ("baseline MB", ">12"),
                   ("plan/model", ">11"), ("exact", ">6")])
    with tempfile.TemporaryDirectory(prefix="bbgrap-memory-") as work:
        for name in args.models:
            path = os.path.join(work, f"{name}.onnx")
            onnx.save(zoo.build(name, resolution=args.resolution), path)
            whole = whole_model(path)
            table.row(name, "whole", "ort", f"{du(path) / 1e6:.0f}", "yes", "-", f"{whole['peak_mb'] - whole['baseline_mb']:.0f}",
                      "-", f"{whole['baseline_mb']:.0f}", "-", "-")
            for limit in [None, *args.memory_mb]:
                plan = os.path.join(work, f"plan-{name}-{limit}")
                cfg = Config(nodes=args.nodes, memory_mb=(limit,) * args.nodes if limit else ())
                try:
                    compiled = compile_model(path, cfg, plan)
                except Exception as exc:  # a plan that cannot fit: the compiler's one line
                    table.row(name, f"{limit:g}", "-", "-", "-", "-", "-", "-", "-", "-", f"  {exc}")
                    continue
                memory = compiled.compiled.memory
                assert memory is not None
                for layout in args.layouts:
                    result = run_bbgrap(plan, args.nodes, 2, None, "--layout", layout)
                    worst = max(range(args.nodes), key=lambda r: result["plan_memory_mb"][r] / memory.estimate_mb[r])
                    measured, estimate = result["plan_memory_mb"][worst], memory.estimate_mb[worst]
                    table.row(name, f"{limit:g}" if limit else "-", result["layout"], f"{memory.weights_mb[worst]:.0f}",
                              "yes" if memory.prepack else "no", f"{estimate:.0f}", f"{measured:.0f}", f"{measured / estimate:.2f}",
                              f"{result['baseline_memory_mb'][worst]:.0f}", f"{du(plan) / du(path):.2f}",
                              "yes" if result["ok"] else "NO")
    return 0


if __name__ == "__main__":
    sys.exit(main())
