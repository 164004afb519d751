"""How a convolution's threads share its work: measured beside the simulator's `thread_stretch`.

onnxruntime's MLAS deals a blocked convolution's output among a session's threads in whole units
(filter sets of 64 output channels x output rows, `simulate.conv_work_units`): a map of few rows
keeps some threads idle, and a piece cut from it by rows more of them. For each number of threads
(1 and each count up to the cores, or --threads) and each map of --rows rows, this times a chain of
3x3 convolutions of --channels channels (calibrate's conv probe, `marginal_time`: one convolution
more in the chain) and prints its time per convolution, the speed-up over one thread, and the
threads' efficiency measured (speed-up over threads) beside what the simulator takes it to be
(1 / thread_stretch). Each size is timed with all its thread counts one after the other, --rounds
times, the fastest counting.

  python benchmarks/thread_units.py                                   # 1 and 2 threads on the 2-core machine
  python benchmarks/thread_units.py --threads 1 4 8 16 --rows 4 7 8 14 16 --channels 64 128
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from bbgrap.backends.calibrate import conv_probe, marginal_time, time_model
from table import Table  # noqa: E402  # benchmarks/table.py, beside this script

from bbgrap.cluster import thread_stretch


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cores = len(os.sched_getaffinity(0))
    p.add_argument("--threads", type=int, nargs="+", default=sorted({1, cores}), help=f"threads of the session (default 1 and {cores}, the cores)")
    p.add_argument("--rows", type=int, nargs="+", default=[3, 4, 7, 8, 14], help="output rows of the map (default 3 4 7 8 14)")
    p.add_argument("--channels", type=int, nargs="+", default=[64, 128], help="input and output channels, whole blocks of 16 (default 64 128)")
    p.add_argument("--width", type=int, default=56, help="the map's width (default 56)")
    p.add_argument("--rounds", type=int, default=3, help="timings of each; the fastest counts (default 3)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if any(c % 16 for c in args.channels):
        p.error("--channels: give multiples of 16 (whole NCHWc blocks), which onnxruntime runs in its blocked kernel")
    table = Table([("channels", ">9"), ("rows", ">5"), ("threads", ">8"), ("us/conv", ">9.1f"), ("speed-up", ">9.2f"),
                   ("efficiency", ">11.2f"), ("simulated", ">10.2f")])
    rows = []
    for channels in args.channels:
        for r in args.rows:
            probe = conv_probe(channels, r, channels, width=args.width)  # r rows of --width columns
            times = {t: min(marginal_time(probe, lambda m, t=t: time_model(m, t)) for _ in range(args.rounds)) for t in args.threads}
            one = times.get(1)
            for t in args.threads:
                speedup = one / times[t] if one else float("nan")
                row = {"channels": channels, "rows": r, "threads": t, "us_per_conv": times[t] * 1e6, "speedup": speedup,
                       "efficiency": speedup / t, "simulated": 1.0 / thread_stretch(probe.units, t)}
                rows.append(row)
                if not args.json:
                    table.row(channels, r, t, row["us_per_conv"], speedup, row["efficiency"], row["simulated"])
    if args.json:
        print(json.dumps({"rows": rows, "cores": cores}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
