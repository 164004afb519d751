"""One accelerator: plain onnxruntime against BBGraP's plans on the same device, side by side.

For each model and resolution, in one run and interleaved round by round:
  A     onnxruntime on the original model, its input and output bound with IOBinding (the
        input copied to the device and the output back each inference, as a plan does);
  P1    the 1-node plan, run by bbgrap-run's engine in this process (activations stay on the
        device between segments: the cost of the plan's own machinery);
  PN    each N-node plan, all nodes in this process on the one device (the cost of the
        boundaries the plan adds, without any network).
Prints median latencies and the ratios P1/A and PN/P1; every plan's output is checked
against the plan's reference in the same run. With --mpi, also `mpirun -n N bbgrap-run`
(the ranks share the device, so that is no speed-up: it shows the ranks work there).

  python benchmarks/device.py --provider cuda --models resnet50 mobilenet_v2 --resolutions 224 1024 2048
  python benchmarks/device.py --provider cpu --models resnet18 --resolutions 64 --width 0.25   # the same path on the CPU
  python benchmarks/device.py --models exported/vit_b_16.onnx --nodes 2 4     # an exporter's model, at its own shape
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import numpy as np
import onnx
import onnxruntime as ort
from bbgrap.backends.engine import providers_for, session_options
from bbgrap.backends.executor import run_embedded
from bbgrap.backends.runtime import compare, embedded_runners
from bbgrap.backends.threads import PROCESS_THREAD_POOL
from table import Table  # benchmarks/table.py, beside this script

from bbgrap import zoo
from bbgrap.compiler import compile_model
from bbgrap.config import Config, Direction
from bbgrap.plan import read_manifest, read_sample

BIN = os.path.dirname(sys.executable)
TOLERANCE = 1e-4


def plain(path: str, provider: str, threads: int) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """Onnxruntime on the whole model with IOBinding: host input in, host output out."""
    providers = providers_for(provider, 0)
    sess = ort.InferenceSession(path, session_options(threads, spin=True), providers=providers)
    device = "cuda" if sess.get_providers()[0] == "CUDAExecutionProvider" else "cpu"
    names = [o.name for o in sess.get_outputs()]

    def run(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        binding = sess.io_binding()
        for name, value in inputs.items():
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, device, 0))
        for name in names:
            binding.bind_output(name, device, 0)
        sess.run_with_iobinding(binding)
        return {name: value.numpy() for name, value in zip(names, binding.get_outputs())}

    return run


def planned(plan_dir: str, provider: str, threads: int) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """Every node of the plan in this process, device values between its segments."""
    runners = embedded_runners(plan_dir, read_manifest(plan_dir), threads, provider, spin=True, iobinding="on", layout="auto")
    return lambda inputs: run_embedded(runners, inputs)


def median_ms(run: Callable[[dict[str, np.ndarray]], Any], inputs: dict[str, np.ndarray], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        run(inputs)
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def mpi_ms(plan_dir: str, nodes: int, provider: str, repeat: int) -> tuple[float, str]:
    proc = subprocess.run([os.path.join(BIN, "mpirun"), "-n", str(nodes), os.path.join(BIN, "bbgrap-run"), plan_dir,
                           "--provider", provider, "--repeat", str(repeat), "--json"], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        return float("nan"), (proc.stderr.strip().splitlines() or ["failed"])[-1]
    report = json.loads(proc.stdout)
    return float(report["latency_ms"]), "ok" if report["ok"] else "MISMATCH"


def prepare(model: str, resolution: int, width: float, nodes_list: list[int], work: str) -> tuple[str, int, str, dict[int, str]]:
    """The model's name, resolution and file, and its plans for 1 and each N nodes (compiled
    before the process's thread pool starts: the compiler runs onnxruntime sessions of its own).
    `model` is a zoo name, or an ONNX file (an exporter's model) taken at its own input shape."""
    if os.path.isfile(model):
        path = model
        model = os.path.splitext(os.path.basename(model))[0]
        resolution = onnx.load(path, load_external_data=False).graph.input[0].type.tensor_type.shape.dim[-1].dim_value
    else:
        path = os.path.join(work, f"{model}-{resolution}.onnx")
        onnx.save(zoo.build(model, resolution=resolution, width=width, seed=0), path)
    plans = {}
    for n in [1, *nodes_list]:
        plans[n] = os.path.join(work, f"{model}-{resolution}-n{n}")
        compile_model(path, Config(nodes=n, direction=Direction.H), plans[n])
    return model, resolution, path, plans


def bench(model: str, resolution: int, path: str, plans: dict[int, str], nodes_list: list[int], provider: str, rounds: int,
          repeat: int, threads: int, mpi: bool) -> dict[str, Any]:
    inputs, reference = read_sample(plans[1])
    sides: dict[str, Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]] = {"A": plain(path, provider, threads)}
    sides.update({f"P{n}": planned(plans[n], provider, threads) for n in plans})
    errors = {}
    for name, run in sides.items():  # warm up (cuDNN's algorithm search, arenas), and check exactness
        out = run(inputs)
        _, rel = compare(out, reference)
        errors[name] = rel
    samples: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(rounds):  # interleaved: the machine's noise hits every side alike
        for name, run in sides.items():
            samples[name].append(median_ms(run, inputs, repeat))
    row: dict[str, Any] = {"model": model, "resolution": resolution, "provider": provider}
    row.update({f"{name}_ms": statistics.median(v) for name, v in samples.items()})
    row["P1/A"] = row["P1_ms"] / row["A_ms"]
    for n in nodes_list:
        row[f"P{n}/P1"] = row[f"P{n}_ms"] / row["P1_ms"]
        if mpi:
            row[f"mpi{n}_ms"], row[f"mpi{n}"] = mpi_ms(plans[n], n, provider, repeat)
    row["max_rel_error"] = max(v for v in errors.values() if v is not None) if any(v is not None for v in errors.values()) else None
    row["exact"] = all(v is not None and v <= TOLERANCE for name, v in errors.items() if name != "A")
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--provider", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--models", nargs="+", default=["resnet50", "mobilenet_v2"], help="zoo model names or ONNX files (at their own shape)")
    p.add_argument("--resolutions", nargs="+", type=int, default=[224, 1024, 2048])
    p.add_argument("--width", type=float, default=1.0, help="channel multiplier of the zoo models (default 1)")
    p.add_argument("--nodes", nargs="+", type=int, default=[2])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeat", type=int, default=10, help="inferences per round and side")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (default: the cores this process may use)")
    p.add_argument("--mpi", action="store_true", help="also run mpirun -n N bbgrap-run on the device")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    threads = args.threads or len(os.sched_getaffinity(0))
    columns = [("model", "<26"), ("res", ">6"), ("A ms", ">10.2f"), ("P1 ms", ">10.2f"), ("P1/A", ">7.2f")]
    columns += [(f"P{n} ms", ">10.2f") for n in args.nodes] + [(f"P{n}/P1", ">8.2f") for n in args.nodes]
    columns += [(f"mpi{n} ms", ">10.2f") for n in args.nodes] if args.mpi else []
    table = Table(columns + [("max rel err", ">13.2e")])
    rows = []
    with tempfile.TemporaryDirectory(prefix="bbgrap-device-") as work:
        # a file is one case at its own shape; a zoo model one per resolution
        cases = [prepare(model, res, args.width, args.nodes, work) for model in args.models
                 for res in (args.resolutions[:1] if os.path.isfile(model) else args.resolutions)]
        PROCESS_THREAD_POOL.start(threads)  # as bbgrap-run: one pool for every session of the process
        for model, res, path, plans in cases:
            row = bench(model, res, path, plans, args.nodes, args.provider, args.rounds, args.repeat, threads, args.mpi)
            rows.append(row)
            if not args.json:
                cells = [model, res, row["A_ms"], row["P1_ms"], row["P1/A"]] + [row[f"P{n}_ms"] for n in args.nodes]
                cells += [row[f"P{n}/P1"] for n in args.nodes] + ([row[f"mpi{n}_ms"] for n in args.nodes] if args.mpi else [])
                table.row(*cells, row["max_rel_error"])
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0 if all(r["exact"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
