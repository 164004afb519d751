"""How fast onnxruntime runs a grouped 3x3 convolution per operation, by input channels per group.

The simulator prices a convolution by its kind's throughput (`simulate.op_kind`): a dense one,
or a depthwise one, with which it counts a grouped convolution of at most `FEW_PER_GROUP` input
channels per group. This prints, for the map sizes of regnet_y_400mf's stages, each convolution's
multiply-adds per second and its ratio to the dense convolution (all channels in one group) and
to the depthwise one (one channel per group) of the same size, all timed in one run, interleaved.

  python benchmarks/grouped_conv.py                  # one onnxruntime thread
  python benchmarks/grouped_conv.py --threads 8 --json
"""

from __future__ import annotations

import argparse
import json
import statistics

import numpy as np
import onnxruntime as ort
from bbgrap.backends.probe_models import float_model
from latency import session, time_session  # benchmarks/latency.py, beside this script
from onnx import helper

from bbgrap.simulate import FEW_PER_GROUP

SHAPES = ((48, 56), (104, 28), (208, 14), (440, 7))  # (channels, map size): regnet_y_400mf's stages
PER_GROUP = (1, 4, 8, 16, 32)  # input channels per group, besides all of them


def grouped_session(channels: int, size: int, per_group: int, threads: int) -> ort.InferenceSession:
    weight = np.random.default_rng(0).random((channels, per_group, 3, 3), np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1] * 4, group=channels // per_group)
    shape = (1, channels, size, size)
    return session(float_model([node], {"x": shape}, {"y": shape}, {"w": weight}, "grouped_conv").SerializeToString(), threads)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads (default 1)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds; each figure is the median (default 5)")
    p.add_argument("--repeat", type=int, default=20, help="runs per convolution per round (default 20)")
    p.add_argument("--json", action="store_true", help="print one JSON object per shape")
    args = p.parse_args()
    print(f"grouped 3x3 convolutions, {args.threads} thread(s); priced as depthwise up to {FEW_PER_GROUP} channels per group")
    for channels, size in SHAPES:
        groups = sorted({g for g in PER_GROUP if channels % g == 0} | {channels})
        sessions = {g: grouped_session(channels, size, g, args.threads) for g in groups}
        x = np.random.default_rng(1).random((1, channels, size, size), np.float32)
        times: dict[int, list[float]] = {g: [] for g in groups}
        for s in sessions.values():
            s.run(None, {"x": x})
        for _ in range(args.rounds):
            for g, s in sessions.items():
                times[g].append(statistics.median(time_session(s, {"x": x}, args.repeat)))
        rate = {g: channels * size * size * g * 9 / statistics.median(times[g]) for g in groups}
        if args.json:
            print(json.dumps({"channels": channels, "size": size, "threads": args.threads,
                              "macs_per_s": {str(g): rate[g] for g in groups}}))
            continue
        cells = "  ".join(f"{g}/group {rate[g] / 1e9:5.1f} G ({rate[g] / rate[channels]:.2f} dense, {rate[g] / rate[1]:.1f} dw)"
                          for g in groups)
        print(f"{channels:4d} ch {size:3d}x{size:<3d}  {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
