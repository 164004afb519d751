"""`bbgrap-run --trace FILE.json`: the timed inferences as a Chrome trace-event file, which
Perfetto (ui.perfetto.dev) and chrome://tracing open as it is.

One process per rank (its node), two tracks each: `compute` (every segment run, with the
layers it holds, inside one event per inference) and `messages` (posting the receives,
every send and every wait for a halo with its bytes, peer and tensor, and the completion
of the sends at the end). Every step also carries `cpu_us`, the CPU time of the thread that
runs the rank's steps (onnxruntime's calling thread, which works and spins beside its pool):
about the step's duration where the rank ran throughout, less where it was stopped (a CPU
quota) or waited for a core another process held, and where a wait slept. Times are
microseconds on rank 0's clock: every other rank's clock offset is measured against rank 0's
before the run (ping-pong, the round trip with the smallest delay), so events of different
ranks line up to within that round trip.
`check_trace` validates a file's structure (the tests use it; the format's own viewers
accept more than it does).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bbgrap.paths import written_whole
from bbgrap.plan_schema import MessageSpec

COMPUTE, MESSAGES = 0, 1


@dataclass(frozen=True)
class Step:
    """One recorded step of one inference: op is run/send/wait, or start/finish (the
    transport's posting of receives and completion of sends); `k` its segment or message;
    `cpu` the CPU seconds of the thread that ran it from t0 to t1."""

    inference: int
    op: str
    k: int
    t0: float
    t1: float
    cpu: float = 0.0


def clock_offset(exchange: Callable[[float], float], clock: Callable[[], float], rounds: int = 8) -> float:
    """This rank's clock minus the reference rank's (NTP's estimate): `exchange(t)` sends our
    time and returns the reference's time when it answered; the round with the shortest
    round trip wins."""
    best = (float("inf"), 0.0)
    for _ in range(rounds):
        t0 = clock()
        theirs = exchange(t0)
        t1 = clock()
        best = min(best, (t1 - t0, (t0 + t1) / 2 - theirs))
    return best[1]


def segment_layers(plan_dir: str, files: Sequence[str]) -> list[list[str]]:
    """The ONNX node names of each segment file (the layers it holds), read without weights."""
    import onnx

    names = []
    for rel in files:
        model = onnx.load(os.path.join(plan_dir, rel), load_external_data=False)
        names.append([n.name or n.op_type for n in model.graph.node])
    return names


def rank_events(rank: int, node: int, steps: Sequence[Step], offset: float, layers: Sequence[Sequence[str]],
                segment_files: Sequence[str], messages: Mapping[int, MessageSpec]) -> list[dict[str, Any]]:
    """The trace events of one rank (times still in seconds on rank 0's clock)."""
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank} (node {node})"}},
        {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}},
        {"ph": "M", "name": "thread_name", "pid": rank, "tid": COMPUTE, "args": {"name": "compute"}},
        {"ph": "M", "name": "thread_name", "pid": rank, "tid": MESSAGES, "args": {"name": "messages"}},
    ]
    by_inference: dict[int, list[Step]] = {}
    for s in steps:
        by_inference.setdefault(s.inference, []).append(s)
    for i, group in sorted(by_inference.items()):
        start, end = min(s.t0 for s in group) - offset, max(s.t1 for s in group) - offset
        events.append({"ph": "X", "name": f"inference {i}", "cat": "inference", "pid": rank, "tid": COMPUTE,
                       "ts": start, "dur": end - start, "args": {"inference": i}})
        for s in group:
            ev: dict[str, Any] = {"ph": "X", "pid": rank, "ts": s.t0 - offset, "dur": s.t1 - s.t0, "cat": s.op}
            cpu = {"cpu_us": round(s.cpu * 1e6, 3)}
            if s.op == "run":
                ev |= {"name": f"segment {s.k}", "tid": COMPUTE,
                       "args": {"file": segment_files[s.k], "layers": list(layers[s.k]) if layers else []} | cpu}
            elif s.op in ("send", "wait"):
                m = messages[s.k]
                peer = m.dst if s.op == "send" else m.src
                ev |= {"name": f"{s.op} {'→' if s.op == 'send' else '←'} rank {peer}", "tid": MESSAGES,
                       "args": {"message": s.k, "peer": peer, "bytes": m.nbytes, "tensor": m.tensor} | cpu}
            else:
                ev |= {"name": "post receives" if s.op == "start" else "complete sends", "tid": MESSAGES, "args": cpu}
            events.append(ev)
    return events


def write_trace(path: str, per_rank: Sequence[Sequence[dict[str, Any]]], meta: dict[str, Any]) -> None:
    """Merge the ranks' events (seconds) into one file (microseconds from the first event)."""
    events = [e for rank in per_rank for e in rank]
    origin = min((e["ts"] for e in events if e["ph"] == "X"), default=0.0)
    for e in events:
        if e["ph"] == "X":
            e["ts"] = round((e["ts"] - origin) * 1e6, 3)
            e["dur"] = round(e["dur"] * 1e6, 3)
    with written_whole(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms", "metadata": meta}, fh)


def check_trace(trace: Any) -> list[str]:
    """What is wrong with a trace-event file's structure (empty: nothing): the object form with
    `traceEvents`; every event with a known phase, name, integer pid and tid; complete events
    with numeric ts and dur >= 0, properly nested on each track (a child ends inside its parent)."""
    problems: list[str] = []
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        return ["not an object with a 'traceEvents' list"]
    tracks: dict[tuple[int, int], list[tuple[float, float, str]]] = {}
    for k, e in enumerate(trace["traceEvents"]):
        if not isinstance(e, dict) or e.get("ph") not in ("X", "M") or not isinstance(e.get("name"), str):
            problems.append(f"event {k}: not an X or M event with a name")
            continue
        if not all(isinstance(e.get(f), int) and not isinstance(e.get(f), bool) for f in ("pid", "tid")):
            problems.append(f"event {k} ({e['name']}): pid and tid must be integers")
            continue
        if e["ph"] == "X":
            if not all(isinstance(e.get(f), (int, float)) for f in ("ts", "dur")) or e["dur"] < 0:
                problems.append(f"event {k} ({e['name']}): ts and dur must be numbers, dur >= 0")
                continue
            tracks.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"], e["name"]))
    for (pid, tid), spans in tracks.items():
        open_spans: list[tuple[float, float, str]] = []
        for start, end, name in sorted(spans, key=lambda s: (s[0], -s[1])):
            while open_spans and open_spans[-1][1] <= start + 1e-3:
                open_spans.pop()
            if open_spans and end > open_spans[-1][1] + 1e-3:
                problems.append(f"pid {pid} tid {tid}: '{name}' overlaps '{open_spans[-1][2]}' without nesting in it")
            open_spans.append((start, end, name))
    return problems


OPS = 2  # the track of onnxruntime's own per-op profile


def op_events(rank: int, profiles: Sequence[str], steps: Sequence[Step], offset: float, inference: int) -> list[dict[str, Any]]:
    """onnxruntime's per-op profile (`profiles`: each segment's profiling file, in segment order)
    of one inference, on its own track: each segment's last `model_run` is that inference's run
    of it (it is the last one timed), moved onto our clock at the start we recorded for it."""
    starts = {s.k: s.t0 for s in steps if s.op == "run" and s.inference == inference}
    events: list[dict[str, Any]] = [{"ph": "M", "name": "thread_name", "pid": rank, "tid": OPS, "args": {"name": "onnxruntime ops"}}]
    for k, path in enumerate(profiles):
        with open(path, encoding="utf-8") as fh:
            recorded = json.load(fh)
        runs = [e for e in recorded if e.get("cat") == "Session" and e.get("name") == "model_run"]
        if not runs or k not in starts:
            continue
        run = max(runs, key=lambda e: e["ts"])
        shift = starts[k] - offset - run["ts"] * 1e-6
        for e in recorded:
            if e.get("cat") == "Node" and run["ts"] <= e["ts"] <= run["ts"] + run["dur"]:
                args = e.get("args", {})
                events.append({"ph": "X", "cat": "op", "pid": rank, "tid": OPS, "name": e["name"].removesuffix("_kernel_time"),
                               "ts": e["ts"] * 1e-6 + shift, "dur": e["dur"] * 1e-6,
                               "args": {"segment": k, "op": args.get("op_name"), "provider": args.get("provider"),
                                        "output_shape": args.get("output_type_shape")}})
    return events
