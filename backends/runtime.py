"""`bbgrap-run [PLAN]`: execute a plan, check it against its reference, time it.

Without `mpirun` (or with `mpirun -n 1`) every node runs in this one process,
interleaved on a mailbox; with `mpirun -n N` (N = the plan's nodes) each rank runs
one node and moves halos with mpi4py's buffer methods: every receive is posted
into a preallocated numpy buffer before the inference starts, every send is an
`Isend` of a segment's output as soon as it exists, and a rank waits on a receive
only right before the segment that reads it. One onnxruntime session per segment,
created once. With the CUDA provider (or `--iobinding on`) segments exchange
onnxruntime values bound to the device (IOBinding): activations stay in device
memory between segments and only what crosses ranks is copied to the host.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol, Sequence

import numpy as np

from bbgrap.backends import nchwc
from bbgrap.backends.threads import PROCESS_THREAD_POOL
from bbgrap.ir import BBGrapError
from bbgrap.plan import read_manifest, read_sample

MPI_ENV = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS", "HYDI_CONTROL_FD")


@dataclass(frozen=True)
class MessageSpec:
    id: int
    src: int
    dst: int
    shape: tuple[int, ...]
    dtype: str
    value: str


class HostValues:
    """Segment inputs and outputs as numpy arrays in host memory (the CPU default)."""

    def to_device(self, array: np.ndarray) -> Any:
        return array

    def to_host(self, value: Any) -> np.ndarray:
        return value

    def run(self, session: Any, inputs: list[str], outputs: list[str], values: dict[str, Any]) -> list[Any]:
        feeds = {name: values[name] for name in inputs}
        # The plan fixed every segment's feeds; skip InferenceSession.run's per-call Python
        # checks where the binding is there (mobilenet_v2 on 2 ranks, side by side: -0.1 ms of 5.3).
        binding = getattr(session, "_sess", None)
        return binding.run(outputs, feeds, None) if binding is not None else session.run(outputs, feeds)


class DeviceValues:
    """Segment inputs and outputs as onnxruntime values on one device, bound with IOBinding,
    so activations stay there between segments; only messages and the model's inputs and
    outputs pass through host memory."""

    def __init__(self, device: str, device_id: int) -> None:
        self.device, self.device_id = device, device_id

    def to_device(self, array: np.ndarray) -> Any:
        import onnxruntime as ort

        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), self.device, self.device_id)

    def to_host(self, value: Any) -> np.ndarray:
        return value.numpy()

    def run(self, session: Any, inputs: list[str], outputs: list[str], values: dict[str, Any]) -> list[Any]:
        binding = session.io_binding()
        for name in inputs:
            binding.bind_ortvalue_input(name, values[name])
        for name in outputs:
            binding.bind_output(name, self.device, self.device_id)
        session.run_with_iobinding(binding)
        return binding.get_outputs()


@dataclass
class NodeRunner:
    """One node's program with its onnxruntime sessions (created once)."""

    node: int
    steps: list[tuple[str, int, str]]  # (op, segment or message id, local value sent)
    sessions: list[Any]
    seg_inputs: list[list[str]]
    seg_outputs: list[list[str]]
    outputs: dict[str, str]
    input_values: dict[str, str]
    messages: dict[int, MessageSpec]
    providers: list[str] = field(default_factory=list)
    values: HostValues | DeviceValues = field(default_factory=HostValues)
    block: int = 0  # NCHWc block of the activations between segments; 0: NCHW


class Transport(Protocol):
    def start(self) -> None: ...
    def send(self, msg: MessageSpec, data: np.ndarray) -> None: ...
    def receive(self, msg: MessageSpec) -> np.ndarray | None: ...
    def progress(self) -> None: ...
    def finish(self) -> None: ...


def session_options(threads: int, spin: bool = True, shared_arena: bool = True) -> Any:
    """Sessions of one process: on the process's one intra-op thread pool where bbgrap-run
    started it (backends/threads.py), else each with a pool of `threads` threads (`spin=False`
    where several nodes share this process's cores). `shared_arena` for CPU-only sessions
    (the GPU path keeps onnxruntime's defaults)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    PROCESS_THREAD_POOL.apply(opts, threads, spin)
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # All segments of this process allocate from one CPU arena (see shared_cpu_arena): the
    # next segment reuses memory the last one left in cache, where one arena per segment
    # would touch a cold buffer each time. No arena at all was worse: large activations
    # went through mmap and page faults every inference.
    if shared_arena:
        shared_cpu_arena()
        opts.add_session_config_entry("session.use_env_allocators", "1")
    opts.log_severity_level = 3
    return opts


@functools.cache
def shared_cpu_arena() -> None:
    """Register one CPU arena allocator with onnxruntime's environment (once per process);
    sessions opt in with `session.use_env_allocators`."""
    import onnxruntime as ort

    info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
    ort.create_and_register_allocator(info, ort.OrtArenaCfg(0, -1, -1, -1))


def threads_per_rank(ranks_on_host: int) -> int:
    """The host's cores shared out among the ranks on it (at least one thread each)."""
    return max(1, len(os.sched_getaffinity(0)) // ranks_on_host)


def threads_for_rank(affinities: Sequence[Sequence[int]], me: int) -> int:
    """Threads for local rank `me` given every local rank's CPU affinity: its cores divided
    among the ranks whose cores overlap its own (all of them where mpirun binds nothing;
    only itself where each rank is pinned to cores of its own)."""
    mine = set(affinities[me])
    sharing = sum(1 for other in affinities if mine & set(other))
    return max(1, len(mine) // max(sharing, 1))


def gpu_present() -> bool:
    """An NVIDIA device node exists (onnxruntime-gpu lists CUDA even where there is none)."""
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")


def providers_for(provider: str, device_id: int) -> list[Any]:
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    cuda_ok = "CUDAExecutionProvider" in ort.get_available_providers()
    if provider == "cuda" and not cuda_ok:
        raise BBGrapError("--provider cuda: this onnxruntime has no CUDA provider; install onnxruntime-gpu or use --provider cpu")
    if provider == "cpu" or not cuda_ok or (provider == "auto" and not gpu_present()):
        return ["CPUExecutionProvider"]
    options: dict[str, Any] = {"device_id": device_id}
    if _version(ort.__version__) >= (1, 18):
        # Full FP32 convolutions: TensorFloat-32 (onnxruntime's default on Ampere and newer GPUs)
        # rounds inputs to 10 mantissa bits, about 1e-3 off the reference, where plans are exact to 1e-4.
        options["use_tf32"] = "0"
    return [("CUDAExecutionProvider", options), "CPUExecutionProvider"]


def _version(text: str) -> tuple[int, ...]:
    """'1.18.0' or '1.20.1.dev5' -> (1, 18, 0) / (1, 20, 1): the leading numeric parts."""
    parts = []
    for piece in text.split("."):
        if not piece.isdigit():
            break
        parts.append(int(piece))
    return tuple(parts)


def boundary_block(layout: str, provider: str, device_id: int) -> int:
    """The NCHWc block this rank would keep activations in across segment boundaries
    (see backends/nchwc.py): onnxruntime's on this CPU where `layout` is auto and the
    segments run on the CPU, else 0 (NCHW). Ranks must agree (nchwc.agreed_block)."""
    try:
        on_cpu = providers_for(provider, device_id) == ["CPUExecutionProvider"]
    except BBGrapError:
        return 0  # load_runner reports it
    return nchwc.block_size() if layout == "auto" and on_cpu else 0


def agreed_boundary_block(comm: Any, layout: str, provider: str, device_id: int, able: bool = True) -> int:
    """The block every rank of `comm` keeps activations in between segments (0: NCHW);
    collective: every rank calls it, `able=False` where this rank failed to start."""
    return nchwc.agreed_block(comm.allgather(boundary_block(layout, provider, device_id) if able else 0))


def layout_name(block: int) -> str:
    return f"nchwc{block}" if block else "nchw"


def node_layouts(plan_dir: str, manifest: dict[str, Any], nodes: Sequence[int], threads: int, spin: bool, block: int,
                 gather: Callable[[dict[str, bool]], list[dict[str, bool]]] = lambda votes: [votes]
                 ) -> dict[int, nchwc.NodeLayout | None]:
    """The blocked layout of these nodes' segment edges (None for all where `block` is 0), agreed
    with the other nodes' votes through `gather` (under MPI: comm.allgather, which every rank
    must reach, with `nodes` empty where the rank failed to start)."""
    error: str | None = None
    layouts: dict[int, nchwc.NodeLayout | None] = {n: None for n in nodes}
    try:
        # The model's inputs and outputs stay NCHW: users hand them in and read them.
        keep = {i["value"] for i in manifest["inputs"]} | {v for p in manifest["programs"] for v in p["outputs"].values()}
        for n in nodes if block else []:
            models = segment_models(plan_dir, manifest["programs"][n])
            try:
                layouts[n] = nchwc.NodeLayout(models, keep, block, lambda: session_options(threads, spin))
            except Exception as exc:
                raise BBGrapError(f"cannot lay out the plan '{plan_dir}' in onnxruntime's blocked layout "
                                  f"({type(exc).__name__}: {first_line(exc)}); run bbgrap-run with --layout nchw") from None
    except BBGrapError as exc:  # reported after the collective below
        error = str(exc)
    votes = gather(nchwc.merged_votes(layout.votes for layout in layouts.values() if layout is not None))
    if error is not None:
        raise BBGrapError(error)
    for layout in layouts.values():
        if layout is not None:
            layout.agree(votes)
    return layouts


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def segment_models(plan_dir: str, program: dict[str, Any]) -> list[Any]:
    """A node's segments as ONNX models."""
    import onnx

    models = []
    for seg in program["segments"]:
        path = os.path.join(plan_dir, seg["file"])
        try:
            models.append(onnx.load(path))
        except Exception as exc:
            raise BBGrapError(f"cannot load {path}: {first_line(exc)}; compile the plan again") from None
    return models


def load_runner(plan_dir: str, manifest: dict[str, Any], node: int, threads: int, provider: str,
                device_id: int = 0, spin: bool = True, iobinding: str = "auto",
                layout: nchwc.NodeLayout | None = None) -> NodeRunner:
    """Node `node`'s sessions; `iobinding` auto binds device values where the provider is CUDA;
    `layout` (from node_layouts, CPU only) keeps the activations it agreed on in onnxruntime's
    NCHWc layout across segment boundaries."""
    import onnxruntime as ort

    prog = manifest["programs"][node]
    providers = providers_for(provider, device_id)
    on_cpu = providers == ["CPUExecutionProvider"]
    layout = layout if on_cpu else None
    opts = session_options(threads, spin, shared_arena=on_cpu)
    plain = session_options(threads, spin)
    plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # blocked segments come optimised
    sessions = []
    for k, seg in enumerate(prog["segments"]):
        path = os.path.join(plan_dir, seg["file"])
        try:
            blocked = layout.model(k) if layout is not None else None
            if blocked is not None:
                sess = ort.InferenceSession(blocked.SerializeToString(), plain, providers=providers)
            else:
                sess = ort.InferenceSession(path, opts, providers=providers)
        except Exception as exc:
            raise BBGrapError(f"cannot load {path}: {first_line(exc)}; compile the plan again") from None
        if provider == "cuda" and sess.get_providers()[0] != "CUDAExecutionProvider":
            raise BBGrapError("--provider cuda: onnxruntime fell back to the CPU (no usable GPU or CUDA libraries); use --provider cpu")
        if provider == "auto" and sess.get_providers()[0] != "CUDAExecutionProvider" and providers[0] != "CPUExecutionProvider":
            providers = ["CPUExecutionProvider"]  # no usable GPU: stop trying CUDA for the other segments
        sessions.append(sess)
    messages = {
        m["id"]: MessageSpec(m["id"], m["src"], m["dst"], tuple(m["shape"]), m["dtype"], m["value"])
        for m in manifest["messages"]
        if node in (m["src"], m["dst"])
    }
    on_gpu = bool(sessions) and sessions[0].get_providers()[0] == "CUDAExecutionProvider"
    values: HostValues | DeviceValues = HostValues()
    if iobinding == "on" or (iobinding == "auto" and on_gpu):
        values = DeviceValues("cuda" if on_gpu else "cpu", device_id if on_gpu else 0)
    return NodeRunner(
        node=node,
        steps=[(step[0], step[1], step[2] if len(step) > 2 else "") for step in prog["steps"]],
        sessions=sessions,
        seg_inputs=[s["inputs"] for s in prog["segments"]],
        seg_outputs=[s["outputs"] for s in prog["segments"]],
        outputs=prog["outputs"],
        input_values={i["name"]: i["value"] for i in manifest["inputs"]},
        messages=messages,
        providers=sessions[0].get_providers() if sessions else ["CPUExecutionProvider"],
        values=values,
        block=layout.block if layout is not None and layout.agreed else 0,
    )


@dataclass
class Profile:
    """Where one node's time goes: its segments, waiting for messages, posting sends."""

    compute: float = 0.0
    wait: float = 0.0
    send: float = 0.0

    def as_ms(self, runs: int) -> dict[str, float]:
        return {k: round(v * 1e3 / max(runs, 1), 3) for k, v in self.__dict__.items()}


def execute(runner: NodeRunner, inputs: dict[str, np.ndarray], transport: Transport,
            profile: Profile | None = None) -> Iterator[None]:
    """Run one node's program; yields whenever it waits for a message not yet there."""
    store = runner.values
    values: dict[str, Any] = {runner.input_values[k]: store.to_device(v) for k, v in inputs.items()}
    clock = time.perf_counter
    for op, k, sent in runner.steps:
        t0 = clock()
        if op == "run":
            transport.progress()
            outs = store.run(runner.sessions[k], runner.seg_inputs[k], runner.seg_outputs[k], values)
            values.update(zip(runner.seg_outputs[k], outs))
        elif op == "send":
            transport.send(runner.messages[k], store.to_host(values[sent]))
        else:
            msg = runner.messages[k]
            data = transport.receive(msg)
            while data is None:
                yield
                data = transport.receive(msg)
            values[msg.value] = store.to_device(data)
        if profile is not None:
            spent = clock() - t0
            if op == "run":
                profile.compute += spent
            elif op == "send":
                profile.send += spent
            else:
                profile.wait += spent
    runner_outputs = {name: store.to_host(values[v]) for name, v in runner.outputs.items()}
    inputs.clear()
    inputs.update(runner_outputs)


class Mailbox:
    """In-process transport: sends land in a dict, receives take from it."""

    def __init__(self) -> None:
        self.box: dict[int, np.ndarray] = {}
        self.events = 0  # sends and receives so far: progress, for deadlock detection

    def start(self) -> None:
        self.box.clear()

    def send(self, msg: MessageSpec, data: np.ndarray) -> None:
        self.box[msg.id] = data
        self.events += 1

    def receive(self, msg: MessageSpec) -> np.ndarray | None:
        data = self.box.pop(msg.id, None)
        self.events += data is not None
        return data

    def progress(self) -> None:
        pass

    def finish(self) -> None:
        pass


def run_embedded(runners: Sequence[NodeRunner], inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """All nodes in this process, interleaved: a node runs until it waits for a message."""
    mailbox = Mailbox()
    results = [dict(inputs) for _ in runners]
    active = {r.node: execute(r, results[r.node], mailbox) for r in runners}
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


class MPITransport:
    """Nonblocking point-to-point transfers into preallocated buffers."""

    def __init__(self, comm: Any, runner: NodeRunner) -> None:
        self.comm = comm
        self.incoming = {m.id: m for m in runner.messages.values() if m.dst == runner.node}
        self.buffers = {k: np.empty(m.shape, dtype=m.dtype) for k, m in self.incoming.items()}
        self.recv_requests: dict[int, Any] = {}
        self.send_requests: list[Any] = []
        self.keep: list[np.ndarray] = []

    def start(self) -> None:
        self.recv_requests = {k: self.comm.Irecv(self.buffers[k], source=m.src, tag=k) for k, m in self.incoming.items()}

    def send(self, msg: MessageSpec, data: np.ndarray) -> None:
        data = np.ascontiguousarray(data)
        self.keep.append(data)
        self.send_requests.append(self.comm.Isend(data, dest=msg.dst, tag=msg.id))

    def receive(self, msg: MessageSpec) -> np.ndarray:
        self.recv_requests.pop(msg.id).Wait()
        return self.buffers[msg.id]

    def progress(self) -> None:
        """Let MPI move the sends posted so far before the next segment. Where the library
        cannot copy a large message straight from the sender's memory (MPICH without CMA, e.g.
        under Ubuntu's default ptrace_scope), the rest of it moves only while the sender is
        inside MPI: mobilenet_v2 on 2 ranks with MPIR_CVAR_CH4_CMA_ENABLE=0, 6.1 -> 5.2-5.4 ms;
        with CMA, unchanged."""
        if self.send_requests:
            from mpi4py import MPI

            # Testsome frees the sends that are done (Testall frees none unless all are), so the
            # list stays short: resnet50, 20 calls per inference, 0.11 -> 0.006 ms.
            MPI.Request.Testsome(self.send_requests)
            self.send_requests = [r for r in self.send_requests if r]

    def finish(self) -> None:
        from mpi4py import MPI

        MPI.Request.Waitall(self.send_requests)
        self.send_requests.clear()
        self.keep.clear()


def run_mpi_node(runner: NodeRunner, transport: MPITransport, inputs: dict[str, np.ndarray],
                 profile: Profile | None = None) -> dict[str, np.ndarray]:
    transport.start()
    result = dict(inputs)
    for _ in execute(runner, result, transport, profile):
        pass  # MPITransport.receive blocks, so the program never yields
    transport.finish()
    return result


def compare(outputs: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> tuple[float | None, float | None]:
    """Max absolute error, and max error relative to each output's largest magnitude."""
    if not reference:
        return None, None
    abs_err, rel_err = 0.0, 0.0
    for name, ref in reference.items():
        got = outputs[name]
        if got.shape != ref.shape:
            return float("inf"), float("inf")
        diff = float(np.max(np.abs(got.astype(np.float64) - ref.astype(np.float64)))) if ref.size else 0.0
        scale = float(np.max(np.abs(ref))) if ref.size else 0.0
        abs_err = max(abs_err, diff)
        rel_err = max(rel_err, diff / scale if scale > 0 else diff)
    return abs_err, rel_err


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bbgrap-run",
        description="Run a BBGraP plan: all nodes in this process, or one node per rank under "
        "'mpirun -n N bbgrap-run'. Checks the result against the plan's reference and prints latency.",
    )
    p.add_argument("plan", nargs="?", default="bbgrap-plan", help="plan directory (default: ./bbgrap-plan)")
    p.add_argument("--input", metavar="FILE.npz", help="inputs keyed by the model's input names (default: the plan's sample)")
    p.add_argument("--output", metavar="FILE.npz", help="write the outputs, keyed by the model's output names")
    p.add_argument("--repeat", type=int, default=10, help="timed inferences; latency is their median (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed inferences first (default 2)")
    p.add_argument("--threads", type=int, default=0, help="onnxruntime intra-op threads per rank (default: cores / ranks on the host)")
    p.add_argument("--provider", choices=("auto", "cpu", "cuda"), default="auto", help="execution provider (default auto: CUDA when usable)")
    p.add_argument("--iobinding", choices=("auto", "on", "off"), default="auto",
                   help="keep activations as device-bound onnxruntime values between segments (default auto: with CUDA)")
    p.add_argument("--layout", choices=("auto", "nchw"), default="auto",
                   help="activations between segments: auto keeps them in onnxruntime's blocked CPU layout (NCHWc) where "
                   "every rank has the same one and that saves reorders (two per boundary); nchw converts at every boundary")
    p.add_argument("--tolerance", type=float, default=1e-4, help="max error relative to the output's largest magnitude (default 1e-4)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = p.parse_args(argv)
    for name in ("repeat", "warmup", "threads"):
        if getattr(args, name) < (1 if name == "repeat" else 0):
            p.error(f"--{name} must be {'at least 1' if name == 'repeat' else 'non-negative'}")
    return args


def load_inputs(args: argparse.Namespace, manifest: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    inputs, reference = read_sample(args.plan)
    if args.input:
        try:
            with np.load(args.input) as data:
                given = {k: data[k] for k in data.files}
        except Exception as exc:
            raise BBGrapError(f"--input {args.input}: not a readable .npz file ({type(exc).__name__})") from None
        for spec in manifest["inputs"]:
            arr = given.get(spec["name"])
            if arr is None:
                raise BBGrapError(f"--input {args.input} has no array '{spec['name']}' (it has {sorted(given)})")
            if list(arr.shape) != spec["shape"]:
                raise BBGrapError(f"--input {args.input}: '{spec['name']}' has shape {list(arr.shape)}, the plan was compiled for {spec['shape']}")
            given[spec["name"]] = arr.astype(spec["dtype"], copy=False)
        inputs, reference = {s["name"]: given[s["name"]] for s in manifest["inputs"]}, {}
    return inputs, reference


def report(args: argparse.Namespace, manifest: dict[str, Any], outputs: dict[str, np.ndarray],
           reference: dict[str, np.ndarray], latencies: list[float], ranks: int, providers: list[str], block: int,
           profiles: list[dict[str, float]] | None = None, crowded: tuple[int, int] | None = None) -> int:
    """Print (or --json) the result; `crowded` = (ranks, cores) where more ranks than cores share a host."""
    abs_err, rel_err = compare(outputs, reference)
    ok = rel_err is None or rel_err <= args.tolerance
    if args.output:
        np.savez(args.output, **outputs)
    result = {
        "plan": args.plan,
        "model": manifest["model"],
        "nodes": manifest["nodes"],
        "ranks": ranks,
        "mode": "mpi" if ranks > 1 else "embedded",
        "provider": providers[0] if providers else "CPUExecutionProvider",
        "layout": layout_name(block),
        "latency_ms": statistics.median(latencies) * 1e3,
        "latency_min_ms": min(latencies) * 1e3,
        "repeat": len(latencies),
        "max_abs_error": abs_err,
        "max_rel_error": rel_err,
        "ok": ok,
    }
    if profiles:
        result["profile_ms"] = profiles  # per rank, per inference: compute, wait, send
    result["oversubscribed"] = crowded is not None
    if args.json:
        print(json.dumps(result))
    else:
        check = "no reference" if rel_err is None else f"max abs error {abs_err:.3g}, rel {rel_err:.3g} ({'ok' if ok else 'MISMATCH'})"
        print(f"{manifest['model']}: {manifest['nodes']} nodes on {ranks} rank(s), {result['mode']}, {result['provider']}, "
              f"{result['layout']} between segments")
        print(f"latency {result['latency_ms']:.2f} ms (median of {len(latencies)}), {check}")
        for r, prof in enumerate(profiles or []):
            print(f"  rank {r}: compute {prof['compute']:.2f} ms, waiting for halos {prof['wait']:.2f} ms, sends {prof['send']:.2f} ms")
        if crowded is not None:
            print(f"note: {crowded[0]} ranks share {crowded[1]} cores on this host, so they take turns on them (their waiting "
                  f"is mostly that): the latency of {manifest['nodes']} separate nodes would be lower")
    if not ok:
        print(f"bbgrap-run: error: result differs from the reference by {rel_err:.3g} > --tolerance {args.tolerance:g}", file=sys.stderr)
    return 0 if ok else 1


def embedded_runners(plan_dir: str, manifest: dict[str, Any], threads: int, provider: str, spin: bool, iobinding: str,
                     layout: str) -> list[NodeRunner]:
    """Every node of the plan, to run in this one process (as `layout` and the other
    bbgrap-run flags say)."""
    nodes = range(manifest["nodes"])
    layouts = node_layouts(plan_dir, manifest, nodes, threads, spin, boundary_block(layout, provider, 0))
    return [load_runner(plan_dir, manifest, n, threads, provider, spin=spin, iobinding=iobinding, layout=layouts[n]) for n in nodes]


def main_embedded(args: argparse.Namespace) -> int:
    manifest = read_manifest(args.plan)
    inputs, reference = load_inputs(args, manifest)
    threads = args.threads or len(os.sched_getaffinity(0))
    PROCESS_THREAD_POOL.start(threads)  # one pool for every node's segments
    spin = manifest["nodes"] == 1
    runners = embedded_runners(args.plan, manifest, threads, args.provider, spin, args.iobinding, args.layout)
    latencies = []
    outputs: dict[str, np.ndarray] = {}
    for k in range(args.warmup + args.repeat):
        t0 = time.perf_counter()
        outputs = run_embedded(runners, inputs)
        if k >= args.warmup:
            latencies.append(time.perf_counter() - t0)
    return report(args, manifest, outputs, reference, latencies, 1, runners[0].providers, runners[0].block)


def main_mpi(args: argparse.Namespace) -> int:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)  # collective: every rank calls it, whatever fails below
    affinities = local.allgather(sorted(os.sched_getaffinity(0)))
    error: str | None = None
    manifest: dict[str, Any] = {}
    threads = 1
    try:
        manifest = read_manifest(args.plan)
        if manifest["nodes"] != size:
            raise BBGrapError(
                f"plan '{args.plan}' has {manifest['nodes']} nodes but mpirun started {size} ranks; "
                f"run 'mpirun -n {manifest['nodes']} bbgrap-run' (or bbgrap-run alone, all nodes in one process)"
            )
        inputs, reference = load_inputs(args, manifest)
        threads = args.threads or threads_for_rank(affinities, local.Get_rank())
        PROCESS_THREAD_POOL.start(threads)
    except BBGrapError as exc:
        error = str(exc)
    block = agreed_boundary_block(comm, args.layout, args.provider, local.Get_rank(), able=error is None)
    try:
        layouts = node_layouts(args.plan, manifest, [rank] if error is None else [], threads, True, block, comm.allgather)
        if error is None:
            runner = load_runner(args.plan, manifest, rank, threads, args.provider, device_id=local.Get_rank(),
                                 iobinding=args.iobinding, layout=layouts[rank])
    except BBGrapError as exc:
        error = error or str(exc)
    errors = comm.allgather(error)
    if any(errors):
        if rank == 0:
            print(f"bbgrap-run: error: {next(e for e in errors if e)}", file=sys.stderr)
        return 2
    transport = MPITransport(comm, runner)
    latencies = []
    outputs: dict[str, np.ndarray] = {}
    profile = Profile()
    for k in range(args.warmup + args.repeat):
        comm.Barrier()
        t0 = time.perf_counter()
        outputs = run_mpi_node(runner, transport, inputs, profile if k >= args.warmup else None)
        elapsed = time.perf_counter() - t0
        if k >= args.warmup:
            latencies.append(elapsed)
    profiles = comm.gather(profile.as_ms(args.repeat), root=0)
    if rank != 0:
        return 0
    cores = len(os.sched_getaffinity(0))
    crowded = (local.Get_size(), cores) if local.Get_size() * threads > cores else None
    return report(args, manifest, outputs, reference, latencies, size, runner.providers, runner.block, profiles, crowded)


def under_mpi() -> bool:
    return any(v in os.environ for v in MPI_ENV)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if under_mpi():
        from mpi4py import MPI

        if MPI.COMM_WORLD.Get_size() > 1:
            try:
                return main_mpi(args)
            except Exception:
                rank = MPI.COMM_WORLD.Get_rank()
                print(f"bbgrap-run: rank {rank} failed, aborting the job:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
                MPI.COMM_WORLD.Abort(1)
                return 1
    try:
        return main_embedded(args)
    except BBGrapError as exc:
        print(f"bbgrap-run: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
