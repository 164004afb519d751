"""ONNX → ShapeMap IR.

Loads and checks the model, fixes symbolic input dimensions (`--input-shape`),
drops initializers that old exporters also list as graph inputs, folds constant
sub-graphs into plain weights, gives every tensor a static shape, turns `auto_pad`
into explicit pads, and builds the IR with the op groups of thesis table 3.1.

Static shapes and folded values come from one onnxruntime run on a sample input:
a tensor that depends on no graph input (other than through `Shape`/`Size`) has the
same value for every input, so its value in that run is its folded value; and the
run gives shapes where ONNX shape inference cannot (ops it does not know).
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from bbgrap.frontends import norms, quantized
from google.protobuf.message import Message
from onnx import helper, numpy_helper

from bbgrap.ir import BBGrapError, Dequantized, Graph, Layer, Tensor
from bbgrap.rules.base import is_default_domain
from bbgrap.rules.indexing import split_as_slices
from bbgrap.rules.registry import RuleRegistry, default_registry
from bbgrap.rules.window import WEIGHTS

NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}
SHAPE_ONLY = {"Shape", "Size"}
# ops whose output's shape is counted from their input's values
SIZED_BY_VALUES = {"NonZero", "Unique", "Compress", "NonMaxSuppression", "StringSplit"}
_REDUCES = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
            "ReduceLogSumExp", "ReduceSumSquare")
# ops whose output's shape these inputs' values set (a Reshape's shape, a Pad's pads, TopK's k)
SIZED_BY_INPUTS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "ConstantOfShape": (0,), "Range": (0, 1, 2), "Slice": (1, 2, 3, 4),
    "Pad": (1, 3), "Resize": (1, 2, 3), "Upsample": (1,), "TopK": (1,), "OneHot": (1,), "Split": (1,), "Squeeze": (1,),
    "Unsqueeze": (1,), "CenterCropPad": (1, 2), "MaxUnpool": (2,), "Col2Im": (1, 2), "DFT": (1,), "STFT": (2, 3),
    "MelWeightMatrix": (0, 1, 2), "HannWindow": (0,), "HammingWindow": (0,), "BlackmanWindow": (0,), "Loop": (0, 1),
    **{op: (1,) for op in _REDUCES},
}


@dataclass(frozen=True)
class Frontend:
    """The imported model: the IR, a sample input and the original model's output on it."""

    graph: Graph
    sample_inputs: dict[str, np.ndarray]
    reference_outputs: dict[str, np.ndarray]


def parse_input_shapes(specs: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """`NAME:1x3x224x224` → {NAME: (1, 3, 224, 224)}."""
    out: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        name, sep, dims = spec.rpartition(":")
        try:
            shape = tuple(int(d) for d in dims.lower().split("x"))
        except ValueError:
            shape = ()
        if not sep or not name or not shape:
            raise BBGrapError(f"--input-shape '{spec}' is not NAME:DIMS (for example input:1x3x224x224)")
        if name in out:
            raise BBGrapError(f"--input-shape gives '{name}' twice ({'x'.join(map(str, out[name]))} and {dims}); give it once")
        if min(shape) < 1:
            what = "a zero-size dimension (a tensor with no elements)" if min(shape) == 0 else "a negative dimension"
            raise BBGrapError(f"--input-shape '{spec}' has {what}; every dimension must be at least 1 (for example input:1x3x224x224)")
        out[name] = shape
    return out


def load_model(path: str) -> onnx.ModelProto:
    """Read and check an ONNX file, turning every failure into one clear line."""
    if os.path.isdir(path):
        raise BBGrapError(f"model '{path}' is a directory, not an ONNX file; give the path of an .onnx file")
    if not os.path.isfile(path):
        what = "is not a regular file" if os.path.exists(path) else "does not exist"
        raise BBGrapError(f"model file '{path}' {what}; give the path of an .onnx file")
    try:
        model = onnx.load(path)
    except Exception as exc:  # protobuf raises several types for garbage
        raise BBGrapError(f"'{path}' is not a readable ONNX model ({type(exc).__name__}); re-export it or check the file") from None
    if (damaged := _damaged_text(model)) is not None:
        raise BBGrapError(f"'{path}' holds a name or text that is not UTF-8 ({damaged[:40]!r}: a damaged file?); re-export the model")
    if not model.graph.node and (model.graph.input or model.graph.output):
        raise BBGrapError(f"'{path}' has a graph of no operations (no nodes), so there is nothing to compute; re-export the model")
    if not model.graph.node:
        raise BBGrapError(f"'{path}' holds no ONNX graph (empty or truncated file?); re-export the model")
    if not model.graph.output:
        raise BBGrapError(f"'{path}' declares no graph outputs, so there is nothing to compute; re-export the model with its outputs")
    latest = onnx.defs.onnx_opset_version()
    for o in model.opset_import:
        if is_default_domain(o.domain) and not 1 <= o.version <= latest:
            raise BBGrapError(
                f"'{path}' imports ONNX opset {o.version}, but this onnx knows opsets 1 to {latest}; "
                f"re-export the model with a released opset (for example 17)"
            )
    try:
        onnx.checker.check_model(path)  # by path: checked in C++, without re-serialising the model
    except Exception as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__  # the checker's message, on one line
        if len(reason) > 300:
            reason = reason[:300] + "..."
        raise BBGrapError(f"'{path}' is not a valid ONNX model: {reason.rstrip(' .:')}; fix the model or export it again") from None
    return model


def _damaged_text(message: Message) -> bytes | None:
    """The first string field of `message`, or of a message inside it, that is not UTF-8 (protobuf
    hands such a proto2 string over as bytes, which the checker passes and a later assignment
    refuses); None where there is none."""
    for field, value in message.ListFields():
        if field.type not in (field.TYPE_MESSAGE, field.TYPE_STRING):
            continue
        values = [value] if isinstance(value, (Message, str, bytes)) else value  # a repeated field's container, or one value
        for v in values:
            if field.type == field.TYPE_MESSAGE:
                if (found := _damaged_text(v)) is not None:
                    return found
            elif field.type == field.TYPE_STRING and isinstance(v, bytes):
                return v
    return None


def _real_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def _fix_inputs(model: onnx.ModelProto, overrides: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Static shape of every real graph input, from the model or `--input-shape`."""
    inputs = _real_inputs(model)
    names = [i.name for i in inputs]
    for name in overrides:
        if name not in names:
            raise BBGrapError(f"--input-shape names '{name}', but the model's inputs are {names}")
    shapes: dict[str, tuple[int, ...]] = {}
    for vi in inputs:
        if vi.type.WhichOneof("value") != "tensor_type":
            kind = vi.type.WhichOneof("value") or "no type"
            raise BBGrapError(f"input '{vi.name}' is not a tensor ({kind}); bbgrap partitions models whose inputs are tensors, "
                              f"so re-export the model with tensor inputs")
        try:
            helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        except (KeyError, ValueError, TypeError):
            raise BBGrapError(f"input '{vi.name}' has no known element type (elem_type {vi.type.tensor_type.elem_type}); "
                              f"re-export the model with typed inputs (for example float)") from None
        dims = vi.type.tensor_type.shape.dim
        if any(d.HasField("dim_value") and d.dim_value <= 0 for d in dims):
            shown = ", ".join(str(d.dim_value) if d.HasField("dim_value") else "?" for d in dims)
            raise BBGrapError(
                f"input '{vi.name}' has a zero-size or negative dimension [{shown}], so it holds no data to partition; "
                f"re-export the model with every dimension at least 1 (or symbolic, then fix it with --input-shape)"
            )
        model_shape = [d.dim_value if d.HasField("dim_value") else None for d in dims]
        shape = overrides.get(vi.name)
        if shape is None:
            if None in model_shape:
                sym = ["?" if v is None else str(v) for v in model_shape]
                raise BBGrapError(
                    f"input '{vi.name}' has a symbolic shape [{', '.join(sym)}]; fix it with "
                    f"--input-shape {vi.name}:{'x'.join('1' if v is None else str(v) for v in model_shape)}"
                )
            shape = tuple(int(v) for v in model_shape if v is not None)  # none is None here: raised above
        elif len(shape) != len(model_shape) or any(m is not None and m != s for m, s in zip(model_shape, shape)):
            raise BBGrapError(f"--input-shape {vi.name}:{'x'.join(map(str, shape))} does not fit the model's shape {model_shape}")
        shapes[vi.name] = tuple(shape)
        del dims[:]
        for d in shape:
            dims.add().dim_value = d
    return shapes


def name_nodes(model: onnx.ModelProto) -> None:
    """Name every node (an unnamed one after its op and position), uniquely: the names of the layers."""
    seen: set[str] = set()
    for k, node in enumerate(model.graph.node):
        name = node.name or f"{node.op_type}_{k}"
        while name in seen:
            name = f"{name}_{k}"
        seen.add(name)
        node.name = name


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The bodies of a control-flow node (If branches, Loop/Scan bodies)."""
    out: list[onnx.GraphProto] = []
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            out.append(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            out.extend(a.graphs)
    return out


def _outer_names(graph: onnx.GraphProto) -> set[str]:
    """Names that `graph` (a subgraph) and its nested subgraphs read from enclosing scopes:
    every name read but not defined inside (as an input, initializer or node output)."""
    defined = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    defined |= {i.values.name for i in graph.sparse_initializer}
    defined |= {o for node in graph.node for o in node.output if o}
    read: set[str] = set()
    for node in graph.node:
        read.update(t for t in node.input if t)
        for sub in _subgraphs(node):
            read |= _outer_names(sub)
    read.update(o.name for o in graph.output)  # an output may be an outer value passed through
    return read - defined


def captured_inputs(node: onnx.NodeProto) -> tuple[str, ...]:
    """Outer tensors a control-flow node's subgraphs read implicitly, in a stable order."""
    names: set[str] = set()
    for sub in _subgraphs(node):
        names |= _outer_names(sub)
    return tuple(sorted(names))


def _foldable(model: onnx.ModelProto, known: Mapping[str, object]) -> tuple[set[str], set[str]]:
    """Tensors whose value does not depend on the graph inputs' values: the weights, what is
    computed from them alone, and the shape or size of a tensor whose shape does not depend on
    the inputs' values either (the compiler fixes those shapes from the sample run); and the
    tensors whose shape does depend on the values.

    A shape depends on the values where shape inference (`known`: the static shapes it gives
    for these inputs' shapes) cannot tell it and the op's output is counted from the data
    (`SIZED_BY_VALUES`: NonZero, Unique), or an input that sizes the output comes from the data
    (`SIZED_BY_INPUTS`: a Reshape's shape, a Pad's pads, TopK's k), or the op reads such a
    tensor. `Shape(NonZero(x))` is a count of the data, not a constant of the model."""
    const = {i.name for i in model.graph.initializer}
    sized_by_data: set[str] = set()
    for node in model.graph.node:
        has_graph_attr = any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)
        computed = all(not t or t in const for t in node.input)
        sizing = [node.input[k] for k in SIZED_BY_INPUTS.get(node.op_type, ()) if k < len(node.input)]
        if not computed and (node.op_type in SIZED_BY_VALUES or any(t in sized_by_data for t in node.input)
                             or any(t and t not in const for t in sizing)):
            sized_by_data.update(t for t in node.output if t and t not in known)
        if not is_default_domain(node.domain) or has_graph_attr or node.op_type in NONDETERMINISTIC:
            continue
        if computed or (node.op_type in SHAPE_ONLY and node.input[0] not in sized_by_data):
            const.update(t for t in node.output if t)
    return const, sized_by_data


def _sample(shape: tuple[int, ...], elem_type: int, rng: np.random.Generator) -> np.ndarray:
    dtype = helper.tensor_dtype_to_np_dtype(elem_type)
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(shape).astype(dtype)
    return np.zeros(shape, dtype=dtype)


def _ort_reason(exc: BaseException) -> str:
    """onnxruntime's message without its error-code prefix, source path and C++ signature."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)
    text = re.sub(r"(^|\s)/onnxruntime_src/\S+:\d+ ", r"\1", text)
    match = re.search(r"(^|\s)(?:[\w<>*&]+ )?onnxruntime::\w+(::~?\w+)*\(", text)
    if match:  # drop the C++ function signature: up to its matching closing parenthesis
        depth, end = 0, match.end() - 1
        for end in range(match.end() - 1, len(text)):
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            if depth == 0:
                break
        text = (text[: match.start()] + text[end + 1 :]).strip() if depth == 0 else text
    return text if len(text) <= 300 else text[:300] + "..."


def _available_memory() -> int | None:
    """Bytes this process can still allocate: MemAvailable (else the physical memory),
    capped by an address-space limit (RLIMIT_AS) less what the process has mapped."""
    avail: int | None = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            return None
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            mapped = 0
            with open("/proc/self/status") as fh:
                for line in fh:
                    if line.startswith("VmSize:"):
                        mapped = int(line.split()[1]) * 1024
            avail = min(avail, max(0, soft - mapped))
    except (ImportError, OSError, ValueError, IndexError):
        pass
    return avail


def _size(nbytes: int) -> str:
    for unit, scale in (("EiB", 2**60), ("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes / 2**20:.1f} MiB"


def _check_sample_memory(
    model: onnx.ModelProto,
    shapes: Mapping[str, tuple[int, ...]],
    known: Mapping[str, tuple[tuple[int, ...], str]],
    overridden: bool,
    available: int | None = None,
) -> None:
    """Refuse, before allocating anything, a sample run that cannot fit in memory: the
    sample inputs (drawn in float64 first), the model's outputs, and the two largest
    activations live at once (an op's input and output), from the static shapes."""
    available = _available_memory() if available is None else available
    if available is None:
        return
    inputs = {vi.name: vi.type.tensor_type.elem_type for vi in _real_inputs(model)}
    in_bytes = {n: math.prod(shapes[n]) * np.dtype(helper.tensor_dtype_to_np_dtype(t)).itemsize for n, t in inputs.items()}
    sizes = {t: math.prod(shape) * np.dtype(dtype).itemsize for t, (shape, dtype) in known.items()}
    largest = sorted(sizes.items(), key=lambda kv: -kv[1])[:2]
    need = sum(in_bytes.values()) + 8 * max((math.prod(s) for s in shapes.values()), default=0)
    need += sum(sizes.get(o.name, 0) for o in model.graph.output) + sum(b for _, b in largest)
    if need <= available:
        return
    biggest = max(in_bytes, key=lambda n: in_bytes[n])
    parts = [f"input '{biggest}' {'x'.join(map(str, shapes[biggest]))} is {_size(in_bytes[biggest])}"]
    if largest and largest[0][1] > in_bytes[biggest]:
        t, b = largest[0]
        parts.append(f"activation '{t}' {'x'.join(map(str, known[t][0]))} is {_size(b)}")
    fix = "compile with a smaller --input-shape" if overridden else "re-export the model with a smaller input (or symbolic dimensions and a smaller --input-shape)"
    raise BBGrapError(f"the frontend's sample run of this model needs about {_size(need)} of memory ({', '.join(parts)}), "
                      f"but only {_size(available)} is available; {fix}")


def _run_everything(model: onnx.ModelProto, wanted: list[str], feeds: dict[str, np.ndarray], optimized: bool = False,
                    optimized_path: str | None = None) -> dict[str, np.ndarray]:
    """Run the model in onnxruntime and return the values of `wanted` tensors: as written
    (every value is there to be read), or `optimized` as onnxruntime runs it by default (its
    graph optimisations fuse a quantized model's QDQ patterns into integer kernels, whose
    results differ from the float ops' by up to a quantization step), and with `optimized_path`
    the graph it runs then written there."""
    import onnxruntime as ort

    saved = list(model.graph.output)
    del model.graph.output[:]
    for name in wanted:
        model.graph.output.add().name = name
    data = model.SerializeToString()
    del model.graph.output[:]
    model.graph.output.extend(saved)
    opts = ort.SessionOptions()
    opts.log_severity_level = 4  # fatal only: a failure is reported once, as bbgrap's own line
    if not optimized:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if optimized_path is not None:  # its weights beside it, so that a model of over 2 GB can be written too
        opts.optimized_model_filepath = optimized_path
        opts.add_session_config_entry("session.optimized_model_external_initializers_file_name", "optimized.weights")
    run_opts = ort.RunOptions()
    run_opts.log_severity_level = 4  # a failing kernel logs at error level through the run's logger
    try:
        sess = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
        values = sess.run(wanted, feeds, run_opts)
    except MemoryError:
        raise BBGrapError("out of memory in the frontend's sample run of this model; compile with a smaller --input-shape") from None
    except Exception as exc:
        raise BBGrapError(f"onnxruntime cannot run this model ({_ort_reason(exc).rstrip(' .')}); fix the model so that onnxruntime runs it") from None
    return dict(zip(wanted, values))


def _skeleton(model: onnx.ModelProto, max_elements: int = 4096) -> onnx.ModelProto:
    """The model with its large weights turned into typed graph inputs: same shapes
    for shape inference, without serialising hundreds of MB of weights."""
    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    g = light.graph
    g.node.extend(model.graph.node)
    g.input.extend(model.graph.input)
    g.output.extend(model.graph.output)
    for init in model.graph.initializer:
        if int(np.prod(init.dims, dtype=np.int64)) <= max_elements:
            g.initializer.append(init)
        else:
            g.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    return light


def _inferred(model: onnx.ModelProto) -> dict[str, tuple[tuple[int, ...], str]]:
    """Static shapes and dtypes that ONNX shape inference can give (others: from the run)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(_skeleton(model))
    except Exception:
        return {}
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        tt = vi.type.tensor_type
        if not tt.elem_type or not tt.HasField("shape"):
            continue
        dims = [d.dim_value if d.HasField("dim_value") else 0 for d in tt.shape.dim]
        if all(d > 0 for d in dims):
            out[vi.name] = (tuple(dims), np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)).name)
    return out


def _explicit_pads(attrs: dict[str, Any], in_spatial: Sequence[int], kernel: Sequence[int]) -> None:
    """Replace auto_pad by the explicit pads it stands for (ONNX's SAME rules)."""
    mode = attrs.pop("auto_pad", "NOTSET")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    k = len(kernel)
    if mode in ("NOTSET", ""):
        attrs.setdefault("pads", [0] * (2 * k))
        return
    if mode == "VALID":
        attrs["pads"] = [0] * (2 * k)
        return
    strides = attrs.get("strides", [1] * k)
    dilations = attrs.get("dilations", [1] * k)
    begins, ends = [], []
    for size, kern, s, d in zip(in_spatial, kernel, strides, dilations):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (kern - 1) * d + 1 - size)
        small, big = total // 2, total - total // 2
        begins.append(small if mode == "SAME_UPPER" else big)
        ends.append(big if mode == "SAME_UPPER" else small)
    attrs["pads"] = begins + ends


def import_model(
    path: str,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    seed: int = 0,
    registry: RuleRegistry | None = None,
) -> Frontend:
    """Load `path` and build the IR (see module docstring)."""
    model = load_model(path)
    return import_proto(model, os.path.splitext(os.path.basename(path))[0], input_shapes, seed, registry, copy=False)


def import_proto(
    model: onnx.ModelProto,
    name: str = "model",
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    seed: int = 0,
    registry: RuleRegistry | None = None,
    copy: bool = True,
) -> Frontend:
    """Build the IR from a model proto (`copy=False`: the proto may be modified)."""
    registry = registry or default_registry()
    if copy:
        model_copy = onnx.ModelProto()
        model_copy.CopyFrom(model)
        model = model_copy
    shapes = _fix_inputs(model, input_shapes or {})
    inits = {i.name for i in model.graph.initializer}
    real_inputs = [i for i in model.graph.input if i.name not in inits]
    del model.graph.input[:]
    model.graph.input.extend(real_inputs)
    if not real_inputs:
        raise BBGrapError("the model takes no input (every graph input is a weight, or there is none), so every run computes the "
                          "same result and there is nothing to run across nodes; export the model with its input")
    name_nodes(model)
    known = _inferred(model)
    _check_sample_memory(model, shapes, known, overridden=bool(input_shapes))

    rng = np.random.default_rng(seed)
    feeds = {vi.name: _sample(shapes[vi.name], vi.type.tensor_type.elem_type, rng) for vi in real_inputs}
    outputs = [o.name for o in model.graph.output]
    foldable, sized_by_data = _foldable(model, known)
    produced = [t for node in model.graph.node for t in node.output if t]
    wanted = [t for t in produced if t in foldable or t not in known]
    values = _run_everything(model, list(dict.fromkeys(wanted + outputs)), feeds)

    constants: dict[str, np.ndarray] = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    tensors: dict[str, Tensor] = {}
    for tname, (tshape, dtype) in known.items():
        tensors[tname] = Tensor(tname, tshape, dtype)
    for tname, value in list(feeds.items()) + list(values.items()):
        tensors[tname] = Tensor(tname, tuple(int(d) for d in value.shape), value.dtype.name)
    for tname, value in constants.items():
        tensors[tname] = Tensor(tname, tuple(int(d) for d in value.shape), value.dtype.name)

    opsets = {("" if is_default_domain(o.domain) else o.domain): int(o.version) for o in model.opset_import}
    layers: list[Layer] = []
    dequantized: dict[str, Dequantized] = {}
    live_outputs = set(outputs)
    for node in model.graph.node:
        if all(t in foldable for t in node.output if t) and not live_outputs.intersection(node.output):
            for t in node.output:
                if t:
                    constants[t] = np.asarray(values[t], order="C")  # ascontiguousarray would make a rank-0 value 1-D
            if (weight := quantized.dequantized_weight(node, constants)) is not None:
                dequantized[node.output[0]] = weight
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}
        captured = captured_inputs(node)
        rule = registry.rule_of(node.op_type, node.domain) if not captured else None  # a node with a body is computed whole
        held = any(t in sized_by_data for t in [*node.input, *node.output] if t)  # its shapes are the input's values'
        # (a held layer keeps auto_pad: its input's shape may vary; a channels-last one, which no rule cuts, its own)
        if rule is not None and rule.windowed and not held and not attrs.get("channels_last", 0):
            x = tensors[node.input[0]].shape
            kernel = attrs.get("kernel_shape") or list(tensors[node.input[WEIGHTS.get(node.op_type, 1)]].shape[2:])
            attrs["kernel_shape"] = list(kernel)
            _explicit_pads(attrs, x[2:], kernel)
        layer = Layer(node.name, node.op_type, node.domain, attrs, tuple(node.input) + captured, tuple(node.output), captured=captured)
        split = split_as_slices(layer, tensors, opsets.get("", 13))  # one Slice per output, each cut on its own
        if split is not None:
            constants.update(split[1])
            tensors.update((k, Tensor(k, v.shape, v.dtype.name)) for k, v in split[1].items())
        for piece in split[0] if split is not None else [layer]:
            piece_rule = registry.get(piece) if not captured else None  # a node with a body is computed whole
            # a layer of shapes from the input's values keeps its op's group, but no rule cuts it (RuleRegistry.get)
            layers.append(replace(piece, group=piece_rule.group if piece_rule is not None else "opaque", shape_from_values=held))

    layers = quantized.merge_twins(layers, outputs)
    layers = quantized.fuse(quantized.unsigned_pairs(layers, tensors, constants, outputs), tensors, constants, outputs)
    used = {t for layer in layers for t in layer.inputs if t}
    used |= {t for layer in layers if layer.fused is not None for t in quantized.operands(layer.fused) if t}
    dequantized = {k: v for k, v in dequantized.items() if k in used}
    used |= {t for weight in dequantized.values() for t in (weight.source, *weight.node.operands) if t}
    constants = {k: v for k, v in constants.items() if k in used}
    tensors = {k: v for k, v in tensors.items() if k in used or k in feeds or any(k in la.outputs for la in layers)}
    graph = Graph(
        name=name,
        layers=tuple(layers),
        tensors=tensors,
        constants=constants,
        inputs=tuple(feeds),
        outputs=tuple(outputs),
        opsets=opsets,
        dequantized=dequantized,
    )
    for out in outputs:
        if out not in graph.producers():
            raise BBGrapError(f"model output '{out}' is not computed by any node (it is an input or a constant), so there is "
                              f"nothing to partition for it; re-export the model with outputs that the network computes")
    # the reference is what onnxruntime gives for the model as it runs it, optimised (a quantized model's differs)
    if not (rounded := norms.rounded_norms(graph)):
        return Frontend(graph, feeds, _run_everything(model, outputs, feeds, optimized=True))
    with tempfile.TemporaryDirectory(prefix="bbgrap-frontend-") as tmp:  # how it runs them: its optimised graph
        path = os.path.join(tmp, "optimized.onnx")
        reference = _run_everything(model, outputs, feeds, optimized=True, optimized_path=path)
        optimised = onnx.load(path, load_external_data=False).graph.node
    return Frontend(norms.as_computed(graph, norms.ways(rounded, optimised)), feeds, reference)
