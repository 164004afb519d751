"""A segment boundary as bbgrap-run pays it, measured through the executor (`bbgrap calibrate`).

The simulator (bbgrap/simulate.py) charges every segment a fixed `segment_s`, every value a
segment takes or gives `value_s`, every message its sender posts `send_s` and its bytes
`send_byte_s` each, and every message its receiver takes `recv_s` and `recv_byte_s` a byte. A lone
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
* **messages** (under MPI, every rank, in turns): a rank's chain with a send of each segment's
  value after it, to the next rank, whose receives are posted but which sleeps meanwhile, as a
  plan's receiver is busy in a segment of its own; then the receiver takes them one by one. On
  one host MPI moves a large message only when its receiver asks for it, so the receiver's
  take grows with the message and the sender's post hardly does. At each of MESSAGE_ELEMENTS'
  sizes: the sender's busy time per segment beyond a chain of the same values without sends
  (the post, and MPI's progress on the sends not finished yet before each segment), and the
  median of the receiver's takes; calibrate fits `send_s` + bytes x `send_byte_s` and `recv_s`
  + bytes x `recv_byte_s` through them. Ranks take turns (`turn`): a rank and the one it sends
  to never send at once;
* **jitter** (`measure_jitter`, under MPI, every rank at once): ranks in lockstep, as a plan's ranks
  are between two exchanges: each runs a segment (a MatMul of LOCKSTEP_SIZES' shapes, about 10 µs
  to 1 ms on one core), sends a one-element value to the next rank and waits for the previous
  rank's, LOCKSTEP_ROUNDS times. Both ranks' segments vary from run to run, and a rank waits for
  the later of the two ends, which comes on average after both means; what a wait takes grows
  with the segments' length. Per shape the median over runs of a round's segment time and of its
  mean wait (`Lockstep`): the median, because one run in which the host took a core from a rank for
  a few milliseconds makes the other rank's waits of that run tens of times their usual length;
  calibrate fits `wait_share`, the share of the segment before it that a wait costs beyond the
  message's arrival and take (which the link's latency and `recv_s` price already), as the slope
  of the waits over the segments (least squares, at least 0);
* **cold** (`measure_cold`): those chains fit in a core's cache, a plan's segments do not. A
  node's segments each have their own weights, and by the time one runs again (the next
  inference) the others have pushed its session's kernels, buffers and weights out of the
  cache. Chains of segments shaped like a CNN's (some values concatenated, two convolutions
  with their activations, one value out), with their weights together beyond any core's cache,
  run in sequence and each alone as often (COLD_TRIES times, the chains in turn, the median of each
  chain's: one such difference of a chain varies by half from one try to the next): the
  difference per segment, less its weights read at the node's `cached_weight_Bps` (in sequence
  from the host's cache, alone from the core's), is a fixed part and a part per op and value.
  Two chains, COLD_CHAIN segments of COLD_VALUES values and FEW_CHAIN of FEW_VALUES, give the
  line through the two: its slope per op or value is `cold_s`, its value at no op or value
  `cold_segment_s`. The
  weights' reload is left to the layers' own times: a layer measured in the model's run, or
  priced by its weights streamed, holds it; a layer priced by its kind's throughput does not yet
  (docs/design.md, "Segments after others").

Each chain's time is the fastest of REPEAT runs after two warm-ups.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import onnx
from bbgrap.backends.engine import CPU_TARGET, Target
from bbgrap.backends.executor import NodeRunner, Profile, Transport, execute, run_node
from bbgrap.backends.probe_models import float_model
from bbgrap.backends.transports import Mailbox
from onnx import helper

from bbgrap.plan_schema import MessageSpec, RunStep, SendStep, WaitStep
from bbgrap.plan_schema import Step as PlanStep

CHAIN = 32  # segments of a chain
WIDE = 8  # values each segment of the wide chain takes and gives
REPEAT = 15
COLD_CHAIN = 64  # segments of the cold chain: 6.6 MB of weights in all
COLD_VALUES = 16  # values each of its segments concatenates (DenseNet's and Inception's concats take 4 to 30)
FEW_CHAIN, FEW_VALUES = 128, 2  # the second cold chain: 5.8 MB of weights, about as far beyond the cache
COLD_TRIES = 5  # times each cold chain's extra is measured, the two chains in turn; the median counts
COLD_CHANNELS, COLD_SIDE = 16, 8  # each value: COLD_CHANNELS x COLD_SIDE x COLD_SIDE
# float32 values of the messages timed: 4 B to 512 KB (a CNN's halos and pieces at 224 px)
MESSAGE_ELEMENTS = (1, 4096, 32768, 131072)
ASLEEP_S = 0.01  # how long a receiver sleeps before it takes its messages: far beyond any sender's chain
LOCKSTEP_ROUNDS = 32  # segments of a lockstep chain, each followed by an exchange
LOCKSTEP_SIZES = ((1, 16), (16, 128), (64, 256), (128, 512), (256, 512))  # its MatMul: rows x width (x width weights)


@dataclass(frozen=True)
class Ring:
    """Where a rank's sending chain sends (`dst`) and what it receives from (`src`)."""

    node: int
    dst: int
    src: int


@dataclass(frozen=True)
class Message:
    """What a message of `nbytes` cost this node (module docstring), in seconds: sending it
    (`send_s`) and taking it (`recv_s`), its peer busy elsewhere meanwhile."""

    nbytes: int
    send_s: float
    recv_s: float


@dataclass(frozen=True)
class Lockstep:
    """One shape of the lockstep chain (module docstring, jitter), in seconds per round: the
    segment's (and send's) time and the wait after it, medians over runs (`lockstep_of`)."""

    busy_s: float
    wait_s: float


@dataclass(frozen=True)
class Boundary:
    """What calibrate measured of a segment boundary (module docstring), in seconds; `messages` one
    per size of MESSAGE_ELEMENTS and `lockstep` one per shape of LOCKSTEP_SIZES, none where there
    was no other rank to send to."""

    segment_s: float
    value_s: float
    messages: tuple[Message, ...] = ()
    lockstep: tuple[Lockstep, ...] = ()


@dataclass
class ProgramBuilder:
    """A probe node's program on `target`, step by step (the chains and the lockstep chain): each
    segment's session, its inputs and outputs, the steps and the messages they name."""

    target: Target
    threads: int
    sessions: list[Any] = field(default_factory=list)
    seg_inputs: list[list[str]] = field(default_factory=list)
    seg_outputs: list[list[str]] = field(default_factory=list)
    steps: list[PlanStep] = field(default_factory=list)
    messages: dict[int, MessageSpec] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.opts = self.target.options(self.threads)

    def run(self, model: onnx.ModelProto, inputs: list[str], outputs: list[str]) -> None:
        """A segment computing `outputs` from `inputs`, run in the next step."""
        self.steps.append(RunStep(len(self.sessions)))
        self.sessions.append(self.target.session(model.SerializeToString(), self.opts))
        self.seg_inputs.append(inputs)
        self.seg_outputs.append(outputs)

    def send(self, message: MessageSpec) -> None:
        self.messages[message.id] = message
        self.steps.append(SendStep(message.id, message.value))

    def wait(self, message: MessageSpec) -> None:
        self.messages[message.id] = message
        self.steps.append(WaitStep(message.id))

    def runner(self, node: int, outputs: dict[str, str], inputs: dict[str, str]) -> NodeRunner:
        """Node `node`'s runner of the program: `outputs` and `inputs` map the program's names to its values."""
        return NodeRunner(node, self.steps, self.sessions, self.seg_inputs, self.seg_outputs, outputs, inputs, self.messages,
                          self.target.values)


def value(i: int, j: int) -> str:
    return f"v{i}_{j}"


def chain_runner(threads: int, width: int = 1, ring: Ring | None = None, length: int = CHAIN, elements: int = 1,
                 target: Target = CPU_TARGET) -> NodeRunner:
    """A node's program of `length` segments, each adding its constant to `width` values of
    `elements` float32 each, on `target`; with `ring`, a send of each segment's first value to
    `ring.dst` after it and, at the end, a wait for each of `ring.src`'s. Message ids: sender *
    length + segment."""
    node = ring.node if ring is not None else 0
    program = ProgramBuilder(target, threads)

    def message(src: int, dst: int, i: int, name: str) -> MessageSpec:
        return MessageSpec(src * length + i, src, dst, name, ((0, elements),), (elements,), "float32", name)

    for i in range(length):
        ins, outs = [value(i, j) for j in range(width)], [value(i + 1, j) for j in range(width)]
        nodes = [helper.make_node("Add", [a, "c"], [b]) for a, b in zip(ins, outs)]
        program.run(float_model(nodes, dict.fromkeys(ins, (elements,)), dict.fromkeys(outs, (elements,)),
                                {"c": np.full((1,), i + 1, np.float32)}, "boundary"), ins, outs)
        if ring is not None:
            program.send(message(node, ring.dst, i, outs[0]))
    if ring is not None:
        for i in range(length):
            program.wait(message(ring.src, node, i, f"got{i}"))
    return program.runner(node, {"y": value(length, 0)}, {f"x{j}": value(0, j) for j in range(width)})


def chain_inputs(width: int, elements: int = 1) -> dict[str, np.ndarray]:
    return {f"x{j}": np.zeros((elements,), np.float32) for j in range(width)}


def timed_runs(runner: NodeRunner, transport: Transport, repeat: int = REPEAT, inputs: dict[str, np.ndarray] | None = None,
               steps: bool = False) -> Iterator[tuple[float, Profile]]:
    """`repeat` runs (after two warm-ups) of the runner's program through the executor: each
    one's seconds and profile (`steps`: with its steps recorded; `inputs`: the program's, else a
    chain's one-element values)."""
    for k in range(repeat + 2):
        profile = Profile(steps=[] if steps else None)
        given = dict(inputs) if inputs is not None else chain_inputs(len(runner.input_values))
        t0 = time.perf_counter()
        run_node(runner, transport, given, profile)
        elapsed = time.perf_counter() - t0
        if k >= 2:
            yield elapsed, profile


def busy_seconds(runner: NodeRunner, transport: Transport, repeat: int = REPEAT,
                 inputs: dict[str, np.ndarray] | None = None) -> float:
    """The fastest of `repeat` runs (after two) of the runner's program, less its waits: its runs
    and sends, and the executor's own time around and between them (posting the receives, going
    from one step to the next), which a plan's node pays too (`inputs`: the program's, else a
    chain's one-element values)."""
    return min(elapsed - profile.wait for elapsed, profile in timed_runs(runner, transport, repeat, inputs))


def turn(rank: int, size: int) -> int:
    """The turn in which `rank` sends to the next rank of `size` (module docstring): even and odd
    ranks alternate, and of an odd number of ranks the last, whose next is rank 0, has a third."""
    return 2 if size % 2 and rank == size - 1 else rank % 2


def sending_seconds(runner: NodeRunner, transport: Transport, inputs: dict[str, np.ndarray]) -> float:
    """Seconds of the runner's program (runs and sends, no waits) up to its last step; its sends
    are finished after the clock stops, once their receiver takes them."""
    transport.start()
    t0 = time.perf_counter()
    for _ in execute(runner, dict(inputs), transport):
        pass
    elapsed = time.perf_counter() - t0
    transport.finish()
    return elapsed


def taking_seconds(runner: NodeRunner, transport: Transport) -> float:
    """The median of the seconds the runner's receives each take, posted at the start as
    bbgrap-run posts them and taken in program order after ASLEEP_S of sleep."""
    transport.start()
    time.sleep(ASLEEP_S)
    takes = []
    for step in runner.steps:
        if isinstance(step, WaitStep):
            t0 = time.perf_counter()
            transport.receive(runner.messages[step.message])
            takes.append(time.perf_counter() - t0)
    transport.finish()
    takes.sort()
    return takes[len(takes) // 2]


def measure_messages(threads: int, comm: Any, repeat: int = REPEAT, target: Target = CPU_TARGET) -> tuple[Message, ...]:
    """What a message of each of MESSAGE_ELEMENTS' sizes costs this rank to send and to take (module
    docstring), each the fastest of `repeat` turns after two; every rank of `comm` calls it at once.
    Each side keeps one transport, and so its receive buffers, over its turns, as bbgrap-run
    keeps one over its inferences: buffers new to each turn would add their pages' first touch
    to the takes (docs/design.md, "A message, per byte")."""
    from bbgrap.backends.transports import MPITransport

    rank, size = comm.Get_rank(), comm.Get_size()
    src, dst = (rank - 1) % size, (rank + 1) % size
    turns = 3 if size % 2 else 2
    out = []
    for elements in MESSAGE_ELEMENTS:
        inputs = chain_inputs(1, elements)
        plain = busy_seconds(chain_runner(threads, elements=elements, target=target), Mailbox(), inputs=inputs) / CHAIN
        ring = chain_runner(threads, ring=Ring(rank, dst, src), elements=elements, target=target)
        sender = replace(ring, steps=[s for s in ring.steps if not isinstance(s, WaitStep)],
                         messages={k: m for k, m in ring.messages.items() if m.src == rank})
        receiver = replace(ring, steps=[s for s in ring.steps if isinstance(s, WaitStep)], outputs={},
                           messages={k: m for k, m in ring.messages.items() if m.dst == rank})
        sending, taking = MPITransport(comm, sender), MPITransport(comm, receiver)
        sends, takes = [], []
        for _ in range(repeat + 2):
            for t in range(turns):
                comm.Barrier()
                if turn(rank, size) == t:
                    sends.append(sending_seconds(sender, sending, inputs) / CHAIN - plain)
                elif turn(src, size) == t:
                    takes.append(taking_seconds(receiver, taking))
        out.append(Message(4 * elements, max(0.0, min(sends[2:])), min(takes[2:])))
    return tuple(out)


def lockstep_runner(threads: int, ring: Ring, rows: int, width: int, rounds: int = LOCKSTEP_ROUNDS,
                    target: Target = CPU_TARGET) -> NodeRunner:
    """A node's program of `rounds` rounds on `target`: segment i computes tanh(a_i W) (a_i: `rows` x
    `width`, W: `width` x `width`) and its largest value, sends that to `ring.dst` and waits for
    `ring.src`'s of round i (module docstring, jitter). Message ids: sender * rounds + round."""
    w = (np.random.default_rng(0).standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
    program = ProgramBuilder(target, threads)
    for i in range(rounds):
        a, b, top, got = f"a{i}", f"a{i + 1}", f"top{i}", f"got{i}"
        nodes = [helper.make_node("MatMul", [a, "w"], ["m"]), helper.make_node("Tanh", ["m"], [b]),
                 helper.make_node("ReduceMax", [b], [top], keepdims=1)]
        program.run(float_model(nodes, {a: (rows, width)}, {b: (rows, width), top: (1, 1)}, {"w": w}, "lockstep"), [a], [b, top])
        program.send(MessageSpec(ring.node * rounds + i, ring.node, ring.dst, top, ((0, 1), (0, 1)), (1, 1), "float32", top))
        program.wait(MessageSpec(ring.src * rounds + i, ring.src, ring.node, got, ((0, 1), (0, 1)), (1, 1), "float32", got))
    return program.runner(ring.node, {"y": f"a{rounds}"}, {"x": "a0"})


def measure_jitter(threads: int, comm: Any, repeat: int = REPEAT, target: Target = CPU_TARGET) -> tuple[Lockstep, ...]:
    """The lockstep chain (module docstring, jitter): every rank of `comm` calls this at once. Per
    shape of LOCKSTEP_SIZES, `repeat` runs after two, summed up by `lockstep_of`."""
    from bbgrap.backends.transports import MPITransport

    rank, size = comm.Get_rank(), comm.Get_size()
    ring = Ring(rank, (rank + 1) % size, (rank - 1) % size)
    out = []
    for rows, width in LOCKSTEP_SIZES:
        runner = lockstep_runner(threads, ring, rows, width, target=target)
        inputs = {"x": np.ones((rows, width), np.float32)}
        comm.Barrier()
        runs = [(elapsed - profile.wait, profile.wait) for elapsed, profile in
                timed_runs(runner, MPITransport(comm, runner), repeat, inputs)]
        out.append(lockstep_of(runs))
    return tuple(out)


def lockstep_of(runs: Sequence[tuple[float, float]], rounds: int = LOCKSTEP_ROUNDS) -> Lockstep:
    """One shape's `Lockstep` from its runs, each (busy, wait) seconds over `rounds` rounds: the
    medians over runs, per round (module docstring, jitter). A run's own waits are averaged over
    its rounds, as the later of two varying ends is on average; across runs the median, so that
    a run the host interrupted does not count."""
    return Lockstep(float(np.median([b for b, _ in runs])) / rounds, float(np.median([w for _, w in runs])) / rounds)


def measure_boundary(threads: int, comm: Any = None, target: Target = CPU_TARGET) -> Boundary:
    """This node's segment boundary on `target` (module docstring); its messages and jitter only on
    an MPI `comm` of more than one rank, whose every rank must call this at once."""
    narrow = busy_seconds(chain_runner(threads, target=target), Mailbox()) / CHAIN
    wide = busy_seconds(chain_runner(threads, WIDE, target=target), Mailbox()) / CHAIN
    value_s = max(0.0, wide - narrow) / (2 * (WIDE - 1))
    alone = Boundary(max(0.0, narrow - 2 * value_s), value_s)
    if comm is None or comm.Get_size() < 2:
        return alone
    return replace(alone, messages=measure_messages(threads, comm, target=target), lockstep=measure_jitter(threads, comm, target=target))


@dataclass(frozen=True)
class ColdChain:
    """The cold chain (module docstring): its runner, what it takes, and each segment's weights'
    bytes and ops and values."""

    runner: NodeRunner
    inputs: dict[str, np.ndarray]
    weight_bytes: int
    objects: int


def cold_chain(threads: int, length: int = COLD_CHAIN, values: int = COLD_VALUES, target: Target = CPU_TARGET) -> ColdChain:
    """`length` segments on `target`, segment i concatenating its `values` inputs x{i}_j and giving
    y{i}: Concat, a 1x1 convolution to 64 channels, Relu, a 3x3 one back to COLD_CHANNELS, Relu
    (He initialised: the values stay of order one, far from subnormal numbers)."""
    rng = np.random.default_rng(0)
    c, side = COLD_CHANNELS, COLD_SIDE
    wide = values * c
    program = ProgramBuilder(target, threads)
    for i in range(length):
        ins, out = [f"x{i}_{j}" for j in range(values)], f"y{i}"
        nodes = [helper.make_node("Concat", ins, ["cat"], axis=1), helper.make_node("Conv", ["cat", "w1"], ["t"]),
                 helper.make_node("Relu", ["t"], ["u"]), helper.make_node("Conv", ["u", "w3"], ["z"], pads=[1, 1, 1, 1]),
                 helper.make_node("Relu", ["z"], [out])]
        weights = {"w1": (rng.standard_normal((64, wide, 1, 1)) * np.sqrt(2 / wide)).astype(np.float32),
                   "w3": (rng.standard_normal((c, 64, 3, 3)) * np.sqrt(2 / (64 * 9))).astype(np.float32)}
        program.run(float_model(nodes, dict.fromkeys(ins, (1, c, side, side)), {out: (1, c, side, side)}, weights, "cold"), ins, [out])
    names = [x for ins in program.seg_inputs for x in ins]
    runner = program.runner(0, {"y": f"y{length - 1}"}, {x: x for x in names})
    inputs = {x: rng.random((1, c, side, side), dtype=np.float32) for x in names}
    # five ops, `values` values in and one out
    return ColdChain(runner, inputs, 4 * (64 * wide + c * 64 * 9), 5 + values + 1)


@dataclass(frozen=True)
class Cold:
    """What a segment run after others costs more than run alone (module docstring), in seconds:
    `segment_s` for the segment, `per_object_s` for each of its ops and values."""

    segment_s: float
    per_object_s: float


def cold_extra(chain: ColdChain, weight_Bps: float) -> float:
    """Seconds a segment of `chain` takes more in sequence than alone (the median of three of its
    segments each run alone as often), through the executor, less its weights read at `weight_Bps`."""
    length = len(chain.runner.steps)
    in_sequence = busy_seconds(chain.runner, Mailbox(), inputs=chain.inputs) / length
    alone = sorted(busy_seconds(replace(chain.runner, steps=[RunStep(k)] * length, outputs={"y": f"y{k}"}), Mailbox(),
                                inputs=chain.inputs) / length for k in (0, length // 2, length - 1))[1]
    return max(0.0, in_sequence - alone - chain.weight_bytes / weight_Bps)


def measure_cold(threads: int, weight_Bps: float, many: ColdChain | None = None, few: ColdChain | None = None,
                 target: Target = CPU_TARGET) -> Cold:
    """`cold_segment_s` and `cold_s` (module docstring) from the two cold chains on `target` (given:
    a test's smaller ones); both at least 0."""
    many = many or cold_chain(threads, target=target)
    few = few or cold_chain(threads, FEW_CHAIN, FEW_VALUES, target)
    tries = [[cold_extra(c, weight_Bps) for c in (few, many)] for _ in range(COLD_TRIES)]
    return cold_line(*((c.objects, float(np.median([t[k] for t in tries]))) for k, c in enumerate((few, many))))


def cold_line(few: tuple[int, float], many: tuple[int, float]) -> Cold:
    """The line through (ops and values, seconds more) of the two chains (of different ops and
    values), its slope and its value at 0 each at least 0 (noise can tilt it either way)."""
    (a, x_a), (b, x_b) = few, many
    slope = max(0.0, (x_b - x_a) / (b - a))
    return Cold(max(0.0, x_a - slope * a), slope)
