"""A segment boundary as bbgrap-run pays it, measured through the executor (`bbgrap calibrate`).

The simulator (bbgrap/simulate.py) charges every segment a fixed `segment_s`, every value a
segment takes or gives `value_s`, and every message its sender posts `send_s`. A lone
onnxruntime session run over and over, as the op-kind measurements time one, costs less than
a segment does in a plan: bbgrap-run runs a node's segments one after another through the
executor (backends/executor.py), each a different session, records its profile, and lets MPI
move the sends posted so far before each segment. So calibrate times chains of CHAIN distinct
sessions as the executor runs them (`execute`, the node's transport, a `Profile`):

* **narrow**: segment i adds a constant of its own to one one-element value and hands it on;
* **wide**: the same with WIDE values in and WIDE out, an Add each; its busy time per segment
  (runs and sends, not waits) beyond the narrow chain's, over the 2 (WIDE - 1) further values,
  is `value_s` (onnxruntime wraps every feed and every fetch; an Add more is part of the price),
  and the narrow chain's busy time per segment less its two values' is `segment_s`;
* **sending** (under MPI, every rank at once, each sending to the next rank in a ring): the
  narrow chain with a send of each segment's value after it, the next rank receiving them
  all at the end; its busy time per segment beyond the narrow chain's is `send_s` (the
  post, and MPI's progress on it before the next segment).

Each chain's time is the fastest of REPEAT runs after two warm-ups.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from bbgrap.backends.engine import HostValues, session_options
from bbgrap.backends.executor import NodeRunner, Profile, Transport, run_node
from bbgrap.backends.probe_models import float_model
from bbgrap.backends.transports import Mailbox
from onnx import helper

from bbgrap.plan_schema import MessageSpec, RunStep, SendStep, WaitStep
from bbgrap.plan_schema import Step as PlanStep

CHAIN = 32  # segments of a chain
WIDE = 8  # values each segment of the wide chain takes and gives
REPEAT = 15


@dataclass(frozen=True)
class Ring:
    """Where a rank's sending chain sends (`dst`) and what it receives from (`src`)."""

    node: int
    dst: int
    src: int


@dataclass(frozen=True)
class Boundary:
    """What calibrate measured of a segment boundary (module docstring), in seconds; `send_s`
    None where there was no other rank to send to."""

    segment_s: float
    value_s: float
    send_s: float | None


def value(i: int, j: int) -> str:
    return f"v{i}_{j}"


def chain_runner(threads: int, width: int = 1, ring: Ring | None = None, length: int = CHAIN) -> NodeRunner:
    """A node's program of `length` segments, each adding its constant to `width` values; with
    `ring`, a send of each segment's first value to `ring.dst` after it and, at the end, a wait
    for each of `ring.src`'s. Message ids: sender * length + segment."""
    import onnxruntime as ort

    node = ring.node if ring is not None else 0
    sessions, seg_inputs, seg_outputs = [], [], []
    steps: list[PlanStep] = []
    messages: dict[int, MessageSpec] = {}
    opts = session_options(threads)

    def message(src: int, dst: int, i: int, name: str) -> MessageSpec:
        return MessageSpec(src * length + i, src, dst, name, ((0, 1),), (1,), "float32", name)

    for i in range(length):
        ins, outs = [value(i, j) for j in range(width)], [value(i + 1, j) for j in range(width)]
        nodes = [helper.make_node("Add", [a, "c"], [b]) for a, b in zip(ins, outs)]
        model = float_model(nodes, dict.fromkeys(ins, (1,)), dict.fromkeys(outs, (1,)), {"c": np.full((1,), i + 1, np.float32)}, "boundary")
        sessions.append(ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]))
        seg_inputs.append(ins)
        seg_outputs.append(outs)
        steps.append(RunStep(i))
        if ring is not None:
            sent = message(node, ring.dst, i, outs[0])
            messages[sent.id] = sent
            steps.append(SendStep(sent.id, outs[0]))
    if ring is not None:
        for i in range(length):
            got = message(ring.src, node, i, f"got{i}")
            messages[got.id] = got
            steps.append(WaitStep(got.id))
    return NodeRunner(node, steps, sessions, seg_inputs, seg_outputs, {"y": value(length, 0)},
                      {f"x{j}": value(0, j) for j in range(width)}, messages, HostValues())


def chain_inputs(width: int) -> dict[str, np.ndarray]:
    return {f"x{j}": np.zeros((1,), np.float32) for j in range(width)}


def busy_seconds(runner: NodeRunner, transport: Transport, repeat: int = REPEAT) -> float:
    """The fastest of `repeat` runs (after two) of the runner's program: its runs and sends, not its waits."""
    width = len(runner.input_values)
    best = float("inf")
    for k in range(repeat + 2):
        profile = Profile()
        run_node(runner, transport, chain_inputs(width), profile)
        if k >= 2:
            best = min(best, profile.compute + profile.send)
    return best


def measure_boundary(threads: int, comm: Any = None) -> Boundary:
    """This node's segment boundary (module docstring); the sending chain only on an MPI `comm` of
    more than one rank, whose every rank must call this at once."""
    narrow = busy_seconds(chain_runner(threads), Mailbox()) / CHAIN
    wide = busy_seconds(chain_runner(threads, WIDE), Mailbox()) / CHAIN
    value_s = max(0.0, wide - narrow) / (2 * (WIDE - 1))
    send_s: float | None = None
    if comm is not None and comm.Get_size() > 1:
        from bbgrap.backends.transports import MPITransport

        rank, size = comm.Get_rank(), comm.Get_size()
        runner = chain_runner(threads, ring=Ring(rank, (rank + 1) % size, (rank - 1) % size))
        send_s = max(0.0, busy_seconds(runner, MPITransport(comm, runner)) / CHAIN - narrow)
    return Boundary(max(0.0, narrow - 2 * value_s), value_s, send_s)
