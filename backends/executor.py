"""The executor: one node's program (segments, sends, waits) run step by step.

It knows nothing of onnxruntime or MPI: a segment runs through the node's `Values`
(backends/engine.py: numpy arrays on the host, or onnxruntime values bound to a device)
and a message moves through a `Transport` (backends/transports.py: a mailbox in one
process, or MPI). `execute` is a generator that yields whenever the node waits for a
message not yet there, so `run_embedded` can interleave every node of a plan in one
process; with a blocking transport `run_node` runs one node to its end. A `Profile`
adds up where a node's time goes (and, for --trace, records every step).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from bbgrap.backends.trace import Step
from bbgrap.backends.transports import Mailbox

from bbgrap.plan_schema import MessageSpec, RunStep, SendStep
from bbgrap.plan_schema import Step as PlanStep


class Values(Protocol):
    """How a node's segments take and give values: to_device for what arrives (inputs,
    messages), to_host for what leaves (sends, outputs), run for one segment."""

    def to_device(self, array: np.ndarray) -> Any: ...
    def to_host(self, value: Any) -> np.ndarray: ...
    def run(self, session: Any, inputs: list[str], outputs: list[str], values: dict[str, Any]) -> list[Any]: ...


@dataclass
class NodeRunner:
    """One node's program with its onnxruntime sessions (created once)."""

    node: int
    steps: Sequence[PlanStep]
    sessions: list[Any]
    seg_inputs: list[list[str]]
    seg_outputs: list[list[str]]
    outputs: Mapping[str, str]  # model output name -> local value
    input_values: dict[str, str]  # model input name -> local value
    messages: dict[int, MessageSpec]  # the messages this node sends or receives, by id
    values: Values
    providers: list[str] = field(default_factory=list)
    block: int = 0  # NCHWc block of the activations between segments; 0: NCHW
    kept_on_cpu: str = ""  # why the node runs on the CPU under --provider auto on a GPU host (a segment's cpu_only); "" otherwise


class Transport(Protocol):
    def start(self) -> None: ...
    def send(self, msg: MessageSpec, data: np.ndarray) -> None: ...
    def receive(self, msg: MessageSpec) -> np.ndarray | None: ...
    def progress(self) -> None: ...
    def finish(self) -> None: ...


@dataclass
class Profile:
    """Where one node's time goes: its segments, waiting for messages, posting sends; with
    `steps` (bbgrap-run --trace) also every step of every inference, as trace.Step."""

    wait: float = 0.0
    send: float = 0.0
    steps: list[Step] | None = None
    inference: int = 0  # the inference the steps recorded now belong to
    # where steps are recorded: the CPU time of the thread that runs them in sends (a rank under a
    # CPU quota is stopped where its quota runs out, in a segment or a wait alike)
    send_cpu: float = 0.0
    # each segment's runs (by its index in the node's program): wall seconds, and where steps are
    # recorded CPU seconds (all of them: the rank's time in segments on either clock)
    segment_runs: dict[int, list[float]] = field(default_factory=dict)
    segment_cpu_runs: dict[int, list[float]] = field(default_factory=dict)

    @property
    def compute(self) -> float:
        """Seconds in segments, every run of every one."""
        return math.fsum(t for runs in self.segment_runs.values() for t in runs)

    @property
    def compute_cpu(self) -> float:
        """CPU seconds in segments, every run of every one (0 where steps are not recorded)."""
        return math.fsum(t for runs in self.segment_cpu_runs.values() for t in runs)

    def mark(self) -> tuple[float, float]:
        """Now, to `book` a step from: the wall clock and, where steps are recorded, the CPU time of
        the thread that runs the steps (a system call, left out otherwise)."""
        return time.perf_counter(), time.thread_time() if self.steps is not None else 0.0

    def book(self, op: str, k: int, since: tuple[float, float]) -> None:
        """Book one step of `op` (run/send/wait, start/finish) from `since` (`mark`'s) to now."""
        cpu = time.thread_time() - since[1] if self.steps is not None else 0.0  # read inside the wall interval
        t0, t1 = since[0], time.perf_counter()
        if op == "run":
            self.segment_runs.setdefault(k, []).append(t1 - t0)
            if self.steps is not None:
                self.segment_cpu_runs.setdefault(k, []).append(cpu)
        elif op == "send":
            self.send += t1 - t0
            self.send_cpu += cpu
        elif op == "wait":
            self.wait += t1 - t0
        if self.steps is not None:
            self.steps.append(Step(self.inference, op, k, t0, t1, cpu))

    def as_ms(self, runs: int) -> dict[str, float | list[float]]:
        """Milliseconds per inference over `runs`: compute, wait and send on the wall clock, and where
        steps were recorded (bbgrap-run --trace) compute_cpu and send_cpu, the thread's CPU time; and
        each segment's median run (`segments`; with steps recorded also on the CPU clock,
        `segments_cpu`), in program order."""
        per_run = {"compute": self.compute, "wait": self.wait, "send": self.send}
        if self.steps is not None:
            per_run |= {"compute_cpu": self.compute_cpu, "send_cpu": self.send_cpu}
        out: dict[str, float | list[float]] = {k: round(v * 1e3 / max(runs, 1), 3) for k, v in per_run.items()}
        out["segments"] = [round(statistics.median(self.segment_runs[k]) * 1e3, 4) for k in sorted(self.segment_runs)]
        if self.steps is not None:
            out["segments_cpu"] = [round(statistics.median(self.segment_cpu_runs[k]) * 1e3, 4) for k in sorted(self.segment_cpu_runs)]
        return out


def execute(runner: NodeRunner, inputs: dict[str, np.ndarray], transport: Transport,
            profile: Profile | None = None) -> Iterator[None]:
    """Run one node's program; yields whenever it waits for a message not yet there."""
    store = runner.values
    values: dict[str, Any] = {runner.input_values[k]: store.to_device(v) for k, v in inputs.items()}
    for step in runner.steps:
        since = profile.mark() if profile is not None else (0.0, 0.0)
        if isinstance(step, RunStep):
            k = step.segment
            transport.progress()
            outs = store.run(runner.sessions[k], runner.seg_inputs[k], runner.seg_outputs[k], values)
            values.update(zip(runner.seg_outputs[k], outs))
        elif isinstance(step, SendStep):
            k = step.message
            transport.send(runner.messages[k], store.to_host(values[step.value]))
        else:
            k = step.message
            msg = runner.messages[k]
            data = transport.receive(msg)
            while data is None:
                yield
                data = transport.receive(msg)
            values[msg.value] = store.to_device(data)
        if profile is not None:
            profile.book(step.op, k, since)
    runner_outputs = {name: store.to_host(values[v]) for name, v in runner.outputs.items()}
    inputs.clear()
    inputs.update(runner_outputs)


def run_embedded(runners: Sequence[NodeRunner], inputs: dict[str, np.ndarray],
                 profiles: Sequence[Profile] | None = None) -> dict[str, np.ndarray]:
    """All nodes in this process, interleaved: a node runs until it waits for a message
    (`profiles`: one per node, in the runners' order)."""
    mailbox = Mailbox()
    results = [dict(inputs) for _ in runners]
    active = {r.node: execute(r, results[r.node], mailbox, profiles[i] if profiles else None) for i, r in enumerate(runners)}
    while active:
        before = mailbox.events
        finished = []
        for node, gen in active.items():
            try:
                next(gen)
            except StopIteration:
                finished.append(node)
        for node in finished:
            del active[node]
        if active and not finished and mailbox.events == before:
            raise RuntimeError(f"plan deadlocked: nodes {sorted(active)} all wait for messages nobody sends")
    return results[0]


def run_node(runner: NodeRunner, transport: Transport, inputs: dict[str, np.ndarray],
                 profile: Profile | None = None) -> dict[str, np.ndarray]:
    since = profile.mark() if profile is not None else (0.0, 0.0)
    transport.start()
    if profile is not None:
        profile.book("start", 0, since)
    result = dict(inputs)
    for _ in execute(runner, result, transport, profile):
        pass  # a blocking transport (MPI) returns every message: the program never yields
    since = profile.mark() if profile is not None else (0.0, 0.0)
    transport.finish()
    if profile is not None:
        profile.book("finish", 0, since)
    return result
