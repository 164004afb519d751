"""Where a kinds-only profile misprices a model: its price against the model's layers measured.

For each model, one process on this host calibrates twice with the same threads: plain
(`bbgrap calibrate --threads T`: every layer priced by its kind of op) and with the model's layers
timed in it (`--model M`: onnxruntime's profiler, the fused kernels given to the layer they are
fused into, `simulate.fusion_anchor`). Prints the model's 1-node plan as the kinds-only profile
predicts it against the model's measured run, then per op type (of that layer) the layers' price
against their measured time, the largest first: an op type priced at a fraction of its time is
what the kinds do not describe; "by kind alone" prices every "other" op at the kind's speed,
without the op types calibrate times apart (`NodeProfile.other_speeds`). Both profiles are timed in
the same run, alternately per model.

  python benchmarks/kinds.py                                                     # the zoo's five, 96 px
  python benchmarks/kinds.py --models EXPORTS/vit_b_16-torchscript.onnx EXPORTS/convnext_tiny-torchscript.onnx
  python benchmarks/kinds.py --threads 2 --top 12
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace

from bbgrap.backends.calibrate import model_to_time

from bbgrap.cluster import ClusterProfile, read_profile
from bbgrap.compiler import one_node_work
from bbgrap.rules.registry import default_registry
from bbgrap.simulate import fusion_anchor, segment_seconds, work_seconds

BIN = os.path.dirname(sys.executable)
from prediction import add_model_arguments, models  # noqa: E402  # benchmarks/prediction.py, beside this script
from table import Table  # noqa: E402  # benchmarks/table.py, beside this script


def calibrate(path: str, threads: int, model: str | None = None) -> ClusterProfile:
    """This host as one node of `threads` threads (with `model`'s layers where given)."""
    cmd = [shutil.which("bbgrap", path=BIN) or "bbgrap", "calibrate", "--threads", str(threads), "-o", path]
    subprocess.run(cmd + (["--model", model] if model else []), check=True, capture_output=True, text=True, timeout=1200)
    return read_profile(path)


def priced(path: str, kinds: ClusterProfile) -> tuple[float, dict[str, float], dict[str, str]]:
    """The 1-node plan of the model at `path` as `kinds` predicts it (seconds), each layer's price there
    given to the layer it fuses into (`fusion_anchor`, as calibrate --model gives its time), and each
    layer's op type."""
    registry = default_registry()
    graph, works = one_node_work(model_to_time(path).front.graph, registry)
    anchors = {layer.name: fusion_anchor(layer, graph, registry) for layer in graph.layers}
    node = kinds.node(0)
    total, price = 0.0, collections.defaultdict[str, float](float)
    for work in works:
        total += segment_seconds(work, 0, kinds)
        for w in work.layers:
            price[anchors[w.name]] += work_seconds(node, w, node.kept(work.working_set))
    return total, dict(price), {layer.name: layer.op_type for layer in graph.layers}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(p)
    p.add_argument("--threads", type=int, default=1, help="onnxruntime threads of the one node (default 1)")
    p.add_argument("--top", type=int, default=8, help="op types listed per model, by measured time (default 8)")
    args = p.parse_args()
    table = Table([("model / op type", "<28"), ("layers", ">7"), ("measured ms", ">12.3f"), ("priced ms", ">10.3f"), ("priced/meas", ">12.2f"),
                   ("by kind alone", ">14.2f")])
    with tempfile.TemporaryDirectory(prefix="bbgrap-kinds-") as work:
        for name, path in models(work, args.models, args.resolution, args.width):
            kinds = calibrate(os.path.join(work, "kinds.toml"), args.threads)
            measured = calibrate(os.path.join(work, f"{name}.toml"), args.threads, path).node(0)
            total, price, op_type = priced(path, kinds)
            # the same profile without the op types calibrate timed apart: every "other" op at other_ops_per_s
            alone, alone_price, _ = priced(path, replace(kinds, nodes=tuple(replace(n, other_speeds={}) for n in kinds.nodes)))
            whole = sum(measured.layer_s.values()) + measured.segment_s
            table.row(name, len(op_type), whole * 1e3, total * 1e3, total / whole, alone / whole)
            per_type: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
            for layer in op_type:
                if layer in price or layer in measured.layer_s:
                    row = per_type[op_type[layer]]
                    row[0] += 1
                    row[1] += measured.layer_s.get(layer, 0.0)
                    row[2] += price.get(layer, 0.0)
                    row[3] += alone_price.get(layer, 0.0)
            for kind, (n, t, pr, al) in sorted(per_type.items(), key=lambda kv: -kv[1][1])[:args.top]:
                table.row(f"  {kind}", int(n), t * 1e3, pr * 1e3, pr / t if t > 0 else float("inf"), al / t if t > 0 else float("inf"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
