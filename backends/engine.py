"""The engine: onnxruntime sessions for a node's segments.

Session options (one thread pool and one CPU arena per process), the execution provider
(CPU, or CUDA with one device per rank and full FP32), the values segments exchange
(numpy arrays on the host, or onnxruntime values bound to the device with IOBinding),
and onnxruntime's blocked NCHWc layout across segment boundaries on the CPU
(backends/nchwc.py). `load_runner` turns one node of a plan into an executor.NodeRunner.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from bbgrap.backends import nchwc
from bbgrap.backends.executor import NodeRunner
from bbgrap.backends.threads import PROCESS_THREAD_POOL

from bbgrap.ir import BBGrapError
from bbgrap.plan import MANIFEST
from bbgrap.plan_schema import Plan, Program

RUN_ON_GPU = "cannot run a segment on the GPU"  # what failed, in gpu_handles_error's line
GPU_HANDLES = ("cublasCreate", "cudnnCreate")  # in onnxruntime's message where a CUDA session cannot make its cuBLAS or cuDNN handle


def out_of_gpu_handles(exc: BaseException) -> bool:
    """Whether onnxruntime failed because its CUDA provider could make no more cuBLAS or cuDNN
    handles: it gives every session its own (cuBLAS when the session loads, cuDNN at its first run),
    and a process holding a few hundred sessions on one GPU runs out."""
    return any(handle in str(exc) for handle in GPU_HANDLES)


@contextlib.contextmanager
def gpu_handles_named(what: str) -> Iterator[None]:
    """The block's `out_of_gpu_handles` failure as `gpu_handles_error(what)`; any other as it is."""
    try:
        yield
    except Exception as exc:
        if out_of_gpu_handles(exc):
            raise gpu_handles_error(what) from None
        raise


def gpu_handles_error(what: str) -> BBGrapError:
    """The one line for `out_of_gpu_handles`, after `what` failed."""
    return BBGrapError(f"{what}: onnxruntime's CUDA provider gives every session cuBLAS and cuDNN handles of its own, and this "
                       "process could make no more (it runs every segment of the nodes it holds; one process on the H100 measured "
                       "here made 546 sessions); run one rank per node under mpirun, or compile a plan of fewer segments")


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
        with gpu_handles_named(RUN_ON_GPU):
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
        with gpu_handles_named(RUN_ON_GPU):
            session.run_with_iobinding(binding)
        return binding.get_outputs()


def session_options(threads: int, spin: bool = True, shared_arena: bool = True, prepack: bool = True) -> Any:
    """Sessions of one process: on the process's one intra-op thread pool where bbgrap-run
    started it (backends/threads.py), else each with a pool of `threads` threads (`spin=False`
    where several nodes share this process's cores). `shared_arena` for CPU-only sessions
    (the GPU path keeps onnxruntime's defaults). Without `prepack` (a plan fitted to its nodes'
    memory that way, fit-memory) the kernels read the weights mapped from the plan's weights
    file instead of keeping a copy of them in their own layout (prepacked, or reordered for
    the blocked NCHWc convolutions), at some cost in speed."""
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
    if not prepack:  # no second copy of the weights: neither prepacked nor reordered into NCHWc by the level-3 optimiser
        opts.add_session_config_entry("session.disable_prepacking", "1")
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    opts.log_severity_level = 4  # its errors come back as exceptions; the C++ log would repeat them in raw colour codes
    return opts


@functools.cache
def shared_cpu_arena() -> None:
    """Register one CPU arena allocator with onnxruntime's environment (once per process);
    sessions opt in with `session.use_env_allocators`."""
    import onnxruntime as ort

    info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
    ort.create_and_register_allocator(info, ort.OrtArenaCfg(0, -1, -1, -1))


def gpu_present() -> bool:
    """An NVIDIA device node exists (onnxruntime-gpu lists CUDA even where there is none)."""
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")


def providers_for(provider: str, device_id: int) -> list[Any]:
    import onnxruntime as ort

    quiet_onnxruntime()
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


NO_GPU = "--provider cuda: this host has no NVIDIA GPU (no /dev/nvidia0); use --provider cpu"
FELL_BACK = "--provider cuda: onnxruntime fell back to the CPU (no usable GPU or CUDA libraries); use --provider cpu"


@dataclass(frozen=True)
class Target:
    """Where a rank's measured sessions run (`bbgrap calibrate --provider`): onnxruntime's
    providers, and how values are held between runs, as a plan's runner on that provider holds
    them (host arrays on the CPU; device values bound with IOBinding on a GPU, the copies to and
    from the host only where a message or the model's input and output needs them)."""

    providers: tuple[Any, ...]
    values: HostValues | DeviceValues

    @property
    def on_gpu(self) -> bool:
        return isinstance(self.values, DeviceValues) and self.values.device == "cuda"

    @property
    def name(self) -> str:
        return "cuda" if self.on_gpu else "cpu"

    def options(self, threads: int) -> Any:
        """Session options as load_runner gives a segment on this provider."""
        return session_options(threads, shared_arena=not self.on_gpu)

    def session(self, model: bytes, opts: Any) -> Any:
        """An onnxruntime session of `model` on this provider (one that would fall back to the
        CPU is an error: its times would not be the GPU's)."""
        import onnxruntime as ort

        sess = ort.InferenceSession(model, opts, providers=list(self.providers))
        if self.on_gpu and sess.get_providers()[0] != "CUDAExecutionProvider":
            raise BBGrapError(FELL_BACK)
        return sess

    def runner(self, sess: Any, feeds: dict[str, np.ndarray]) -> Callable[[], object]:
        """One run of `sess` on `feeds` through the values' `run`, as the plan's runner makes it: host
        arrays fed as they are; with device values, `feeds` copied to the device once and every output
        left there."""
        values = self.values
        bound = {name: values.to_device(array) for name, array in feeds.items()}
        inputs, outputs = list(bound), [o.name for o in sess.get_outputs()]
        return lambda: values.run(sess, inputs, outputs, bound)


CPU_TARGET = Target(("CPUExecutionProvider",), HostValues())


def target_for(provider: str, device_id: int) -> Target:
    """The Target of `provider` (auto, cpu or cuda, as bbgrap-run's --provider) on GPU `device_id`:
    auto is CUDA where onnxruntime has it and a GPU is present, else the CPU."""
    if provider == "cuda" and not gpu_present():
        raise BBGrapError(NO_GPU)
    providers = providers_for(provider, device_id)
    if providers == ["CPUExecutionProvider"]:
        return CPU_TARGET
    return Target(tuple(providers), DeviceValues("cuda", device_id))


def quiet_onnxruntime() -> None:
    """Keep onnxruntime's own C++ log (errors in raw ANSI colour codes, e.g. a CUDA provider library
    that does not load) off the terminal: what matters comes back as an exception or a fallback
    that bbgrap-run reports in its own words."""
    import onnxruntime as ort

    ort.set_default_logger_severity(4)


@contextlib.contextmanager
def quiet_stdout() -> Iterator[None]:
    """onnxruntime's Python InferenceSession prints a multi-line '*** EP Error *** ... Falling back'
    banner to stdout when a provider fails to create a session; keep it from bbgrap-run's output
    (the exception, or the provider the session ends up with, is reported instead)."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


def _version(text: str) -> tuple[int, ...]:
    """'1.18.0' or '1.20.1.dev5' -> (1, 18, 0) / (1, 20, 1): the leading numeric parts."""
    parts = []
    for piece in text.split("."):
        if not piece.isdigit():
            break
        parts.append(int(piece))
    return tuple(parts)


def plan_layout(layout: str, plan: Plan | None) -> str:
    """The layout asked for, except that a plan fitted to its nodes' memory keeps NCHW: fit-memory's
    estimate was measured on NCHW runs, and a plan fitted without prepacked copies
    (`prepack: false`) must not get the NCHWc copies of its convolutions' weights that laying
    it out makes."""
    return layout if plan is None or not plan.compiled.fitted_to_memory else "nchw"


def boundary_block(layout: str, provider: str, device_id: int) -> int:
    """The NCHWc block this rank would keep activations in across segment boundaries
    (see backends/nchwc.py): onnxruntime's on this CPU where `layout` is auto and the
    segments run on the CPU, else 0 (NCHW). Ranks must agree (nchwc.agreed_block)."""
    try:
        on_cpu = providers_for(provider, device_id) == ["CPUExecutionProvider"]
    except BBGrapError:
        return 0  # load_runner reports it
    return nchwc.block_size() if layout == "auto" and on_cpu else 0


def layout_name(block: int) -> str:
    return f"nchwc{block}" if block else "nchw"


def node_layouts(plan_dir: str, plan: Plan | None, nodes: Sequence[int], threads: int, spin: bool, block: int,
                 gather: Callable[[dict[str, bool]], list[dict[str, bool]]] = lambda votes: [votes]
                 ) -> dict[int, nchwc.NodeLayout | None]:
    """The blocked layout of these nodes' segment edges (None for all where `block` is 0), agreed
    with the other nodes' votes through `gather` (under MPI: comm.allgather, which every rank
    must reach, with `nodes` empty where the rank failed to start, and `plan` None where it
    could not read the plan)."""
    error: str | None = None
    layouts: dict[int, nchwc.NodeLayout | None] = {n: None for n in nodes}
    try:
        for n in nodes if block else []:
            assert plan is not None, "a rank that could not read the plan lays out no node"
            # The model's inputs and outputs stay NCHW: users hand them in and read them.
            keep = {i.value for i in plan.inputs} | {v for p in plan.programs for v in p.outputs.values()}
            loads = [functools.partial(segment_model, plan_dir, seg.file) for seg in plan.programs[n].segments]
            try:
                with quiet_stdout():
                    layouts[n] = nchwc.NodeLayout(loads, keep, block, lambda: session_options(threads, spin))
            except Exception as exc:
                unloadable_segment(plan_dir, plan.programs[n])  # a segment onnxruntime cannot load is no layout problem
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


def cannot_load(path: str, exc: BaseException) -> BBGrapError:
    """The one-line error for a segment file that onnx or onnxruntime cannot load."""
    return BBGrapError(f"cannot load {path}: {first_line(exc)}; compile the plan again")


# where onnxruntime looks for the external data of a model it is given as bytes
EXTERNAL_FOLDER = "session.model_external_initializers_file_folder_path"


def load_segment(plan_dir: str, rel: str) -> Any:
    """A segment as an ONNX model with its weights in it (those in the plan's shared weights file
    read from there: their locations are relative to the plan directory, not the segment's)."""
    import onnx
    from onnx.external_data_helper import load_external_data_for_model

    model = onnx.load(os.path.join(plan_dir, rel), load_external_data=False)
    load_external_data_for_model(model, plan_dir)
    return model


def segment_session(plan_dir: str, rel: str, opts: Any, providers: Sequence[Any]) -> Any:
    """An onnxruntime session of one segment, its shared weights read (or mapped) from the plan's
    weights file. `opts` is told where that file is (every segment of a plan shares it)."""
    import onnxruntime as ort

    opts.add_session_config_entry(EXTERNAL_FOLDER, plan_dir)
    with open(os.path.join(plan_dir, rel), "rb") as fh:
        model = fh.read()
    return ort.InferenceSession(model, opts, providers=list(providers))


def segment_model(plan_dir: str, rel: str) -> Any:
    """One segment as an ONNX model, weights included (a file it cannot load: BBGrapError)."""
    try:
        return load_segment(plan_dir, rel)
    except Exception as exc:
        raise cannot_load(os.path.join(plan_dir, rel), exc) from None


def unloadable_segment(plan_dir: str, program: Program) -> None:
    """Raise, naming the file, where onnxruntime cannot load one of a node's segments as it is."""
    for seg in program.segments:
        try:
            with quiet_stdout():
                segment_session(plan_dir, seg.file, session_options(1, spin=False, shared_arena=False), ["CPUExecutionProvider"])
        except Exception as exc:
            raise cannot_load(os.path.join(plan_dir, seg.file), exc) from None


def load_runner(plan_dir: str, plan: Plan, node: int, threads: int, provider: str,
                device_id: int = 0, spin: bool = True, iobinding: str = "auto",
                layout: nchwc.NodeLayout | None = None, profile_prefix: str | None = None) -> NodeRunner:
    """Node `node`'s sessions; `iobinding` auto binds device values where the provider is CUDA;
    `layout` (from node_layouts, CPU only) keeps the activations it agreed on in onnxruntime's
    NCHWc layout across segment boundaries, and is closed once the sessions hold what they read of
    its files; `profile_prefix`: every session records onnxruntime's per-op profile into files of
    that prefix (`end_profiling` gives each one's path)."""
    import onnxruntime as ort

    prog = plan.programs[node]
    providers = list(target_for(provider, device_id).providers)  # no GPU under --provider cuda: NO_GPU, before onnxruntime tries CUDA
    kept_on_cpu = ""
    if providers != ["CPUExecutionProvider"] and prog.cpu_only:
        if provider == "cuda":
            raise BBGrapError(f"--provider cuda: node {node}'s {prog.cpu_only}; "
                              "run this plan with --provider cpu (or --provider auto: such a node then runs on the CPU)")
        providers, kept_on_cpu = ["CPUExecutionProvider"], prog.cpu_only  # auto: this node on the CPU, where it is exact
    on_cpu = providers == ["CPUExecutionProvider"]
    given, layout = layout, layout if on_cpu else None
    opts = session_options(threads, spin, shared_arena=on_cpu, prepack=plan.compiled.prepack)
    plain = session_options(threads, spin, prepack=plan.compiled.prepack)
    plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # blocked segments come optimised
    sessions = []
    for k, seg in enumerate(prog.segments):
        path = os.path.join(plan_dir, seg.file)
        for o in (opts, plain) if profile_prefix else ():
            o.enable_profiling = True
            o.profile_file_prefix = f"{profile_prefix}-seg{k:03d}"  # a file per session (onnxruntime names them by the ms)
        try:
            with quiet_stdout():
                if layout is not None and (blocked := layout.path(k)) is not None:
                    sess = ort.InferenceSession(blocked, plain, providers=providers)
                    layout.release(k)  # the session holds what it read
                else:
                    sess = segment_session(plan_dir, seg.file, opts, providers)
        except Exception as exc:
            if not on_cpu and out_of_gpu_handles(exc):
                raise gpu_handles_error(f"cannot load {path} on the GPU after node {node}'s first {k} segments") from None
            raise cannot_load(path, exc) from None
        declared, made = {i.name for i in sess.get_inputs()}, {o.name for o in sess.get_outputs()}
        if declared != set(seg.inputs) or not set(seg.outputs) <= made:
            odd = sorted(declared ^ set(seg.inputs) or set(seg.outputs) - made)[0]
            raise BBGrapError(f"{os.path.join(plan_dir, MANIFEST)} is damaged (segment {path} and the manifest differ on its "
                              f"value '{odd}'); compile the plan again")
        if provider == "cuda" and sess.get_providers()[0] != "CUDAExecutionProvider":
            raise BBGrapError(FELL_BACK)
        if provider == "auto" and sess.get_providers()[0] != "CUDAExecutionProvider" and providers[0] != "CPUExecutionProvider":
            providers = ["CPUExecutionProvider"]  # no usable GPU: stop trying CUDA for the other segments
        sessions.append(sess)
    if given is not None:
        given.close()
    messages = {m.id: m for m in plan.messages if node in (m.src, m.dst)}
    on_gpu = bool(sessions) and sessions[0].get_providers()[0] == "CUDAExecutionProvider"
    values: HostValues | DeviceValues = HostValues()
    if iobinding == "on" or (iobinding == "auto" and on_gpu):
        values = DeviceValues("cuda" if on_gpu else "cpu", device_id if on_gpu else 0)
    return NodeRunner(
        node=node,
        steps=prog.steps,
        sessions=sessions,
        seg_inputs=[list(s.inputs) for s in prog.segments],
        seg_outputs=[list(s.outputs) for s in prog.segments],
        outputs=prog.outputs,
        input_values={i.name: i.value for i in plan.inputs},
        messages=messages,
        providers=sessions[0].get_providers() if sessions else ["CPUExecutionProvider"],
        values=values,
        block=layout.block if layout is not None and layout.agreed else 0,
        kept_on_cpu=kept_on_cpu,
    )
