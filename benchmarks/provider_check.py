"""Does a provider compute a plan's segments as the CPU does? Each segment of each node run on
the CPU and on `--provider` with the same random inputs; prints the segments whose outputs differ
by more than the tolerance (relative to the CPU output's largest magnitude), with the ops in them.

A plan that is exact on the CPU and wrong on a GPU is wrong in one of its segments: this finds which
(session 23 found onnxruntime-gpu's Resize in tf_crop_and_resize mode this way; compile marks such
segments `cpu_only` since, backends/emit.py, and bbgrap-run keeps their nodes off the GPU).

  python benchmarks/provider_check.py PLAN_DIR --provider cuda
  python benchmarks/provider_check.py PLAN_DIR --provider cpu      # the CPU against itself: every segment agrees
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

import numpy as np
import onnxruntime as ort
from bbgrap.backends.engine import providers_for, segment_model

from bbgrap.plan import read_manifest

TOLERANCE = 1e-4
FEED_TYPES = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(bool)": np.bool_}


def random_feeds(sess: ort.InferenceSession, seed: int) -> dict[str, np.ndarray]:
    """Inputs of the session's shapes: floats standard normal, integers small and non-negative."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        kind = FEED_TYPES.get(i.type, np.float32)
        feeds[i.name] = rng.standard_normal(shape).astype(kind) if kind == np.float32 else rng.integers(0, 2, shape).astype(kind)
    return feeds


def relative(got: np.ndarray, want: np.ndarray) -> float:
    if got.shape != want.shape:
        return float("inf")
    if want.size == 0:
        return 0.0
    scale = float(np.max(np.abs(want.astype(np.float64))))
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    return float("inf") if not np.isfinite(diff).all() else float(np.max(diff)) / max(scale, 1e-30)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("plan", help="a plan directory (bbgrap compile -o)")
    p.add_argument("--provider", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--tolerance", type=float, default=TOLERANCE)
    args = p.parse_args()
    plan = read_manifest(args.plan)
    other = providers_for(args.provider, 0)
    differing = 0
    for node, program in enumerate(plan.programs):
        for k, seg in enumerate(program.segments):
            model = segment_model(args.plan, seg.file)
            blob = model.SerializeToString()
            cpu = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
            feeds = random_feeds(cpu, 1000 * node + k)
            want = cpu.run(None, feeds)
            got = ort.InferenceSession(blob, providers=other).run(None, feeds)
            error = max((relative(g, w) for g, w in zip(got, want)), default=0.0)
            if not error <= args.tolerance:
                differing += 1
                ops = Counter(op.op_type for op in model.graph.node)
                print(f"node {node} segment {k} ({seg.file}): relative error {error:.2e}; ops {dict(ops)}")
    total = sum(len(p.segments) for p in plan.programs)
    print(f"{differing} of {total} segments differ on {args.provider} from the CPU by more than {args.tolerance:g}")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
