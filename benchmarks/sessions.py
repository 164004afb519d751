"""How many onnxruntime sessions one process holds, and what each keeps, per provider and arena.

A plan's node runs one onnxruntime session per segment, and bbgrap-run (or a test, or device.py)
holding every node of a plan in one process holds them all: on a GPU each CUDA session has its
own cuBLAS and cuDNN handles and its own arena, and a process of a few hundred failed to make
more (README, Limitations). This makes `--count` sessions of a small convolution segment, runs
each once as a plan's runner does, and prints the memory the process holds after 1, 10, 50, 100,
... of them (host: resident set; GPU: the device's used memory, by NVML), then the time of a chain
of `--chain` of them with values kept where they are (IOBinding on the GPU), as segments run.
`--arena shared` registers one arena of the provider with onnxruntime's environment and has every
session allocate from it (`session.use_env_allocators`), as bbgrap-run does on the CPU.

  python benchmarks/sessions.py --provider cuda --arena own --count 300
  python benchmarks/sessions.py --provider cuda --arena shared --count 300
  python benchmarks/sessions.py --provider cpu --count 200
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import numpy as np
import onnxruntime as ort
from bbgrap.backends.engine import providers_for, shared_cpu_arena
from onnx import TensorProto, helper, numpy_helper

CHANNELS, SIDE = 64, 56
MARKS = (1, 10, 50, 100, 200, 400, 800)


def segment(layers: int = 2) -> bytes:
    """`layers` 3x3 convolutions and a ReLU on a CHANNELS x SIDE x SIDE map: a typical segment."""
    rng = np.random.default_rng(0)
    nodes, weights, x = [], [], "x"
    for i in range(layers):
        weights.append(numpy_helper.from_array((rng.standard_normal((CHANNELS, CHANNELS, 3, 3)) * 0.05).astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]))
        x = f"c{i}"
    nodes.append(helper.make_node("Relu", [x], ["y"]))
    shape = [1, CHANNELS, SIDE, SIDE]
    graph = helper.make_graph(nodes, "segment", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def host_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def gpu_mib() -> float:
    import pynvml  # nvidia-ml-py, on a GPU machine

    pynvml.nvmlInit()
    return float(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used) / 2**20


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--provider", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--arena", choices=["own", "shared"], default="own", help="each session's arena, or one of the process")
    p.add_argument("--count", type=int, default=300, help="sessions to make (stops at the first that fails)")
    p.add_argument("--chain", type=int, default=20, help="sessions in the timed chain")
    args = p.parse_args()
    providers = providers_for(args.provider, 0)
    device = "cuda" if args.provider == "cuda" else "cpu"
    memory = gpu_mib if device == "cuda" else host_mib
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 4
    if args.arena == "shared":
        if device == "cuda":  # bbgrap-run does not share a CUDA arena: registered here as onnxruntime allows
            info = ort.OrtMemoryInfo("Cuda", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
            ort.create_and_register_allocator_v2("CUDAExecutionProvider", info, {"device_id": "0"}, ort.OrtArenaCfg(0, -1, -1, -1))
        else:
            shared_cpu_arena()  # the CPU arena bbgrap-run's sessions share
        opts.add_session_config_entry("session.use_env_allocators", "1")
    model = segment()
    x = np.random.default_rng(1).standard_normal((1, CHANNELS, SIDE, SIDE)).astype(np.float32)
    base, started = memory(), time.perf_counter()
    sessions: list[Any] = []
    rows: list[dict[str, Any]] = []
    for i in range(args.count):
        try:
            sess = ort.InferenceSession(model, opts, providers=providers)
            sess.run(None, {"x": x})
        except Exception as exc:  # the first session the process could not make or run
            rows.append({"failed_at": i, "error": str(exc).splitlines()[0][:200]})
            break
        sessions.append(sess)
        if i + 1 in MARKS:
            rows.append({"sessions": i + 1, "mib": round(memory() - base, 1), "mib_per_session": round((memory() - base) / (i + 1), 2),
                         "seconds": round(time.perf_counter() - started, 1)})
    chain = sessions[:args.chain]
    if chain:
        def run_chain() -> None:
            value = ort.OrtValue.ortvalue_from_numpy(x, device, 0)
            for sess in chain:
                binding = sess.io_binding()
                binding.bind_ortvalue_input("x", value)
                binding.bind_output("y", device, 0)
                sess.run_with_iobinding(binding)
                value = binding.get_outputs()[0]
            value.numpy()

        for _ in range(3):
            run_chain()
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            run_chain()
            times.append(time.perf_counter() - t0)
        rows.append({"chain": len(chain), "chain_ms": round(1e3 * statistics.median(times), 3),
                     "per_session_ms": round(1e3 * statistics.median(times) / len(chain), 4)})
    for row in rows:
        print(json.dumps({"provider": args.provider, "arena": args.arena, **row}), flush=True)
    return 0 if sessions else 1


if __name__ == "__main__":
    sys.exit(main())
