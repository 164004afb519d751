"""Fuzzing the compiler with damaged and mutated ONNX models (issue 12).

`mutants(seed, count)` derives mutants from small zoo models: damaged bytes of the
serialized protobuf and graph mutations (deleted nodes, swapped inputs, inconsistent
kernel_shape/pads/strides/group, unsupported opsets, symbolic, zero and huge input
dimensions, cycles, duplicate outputs, unknown domains, control-flow nodes). The same
seed always gives the same mutants.

`run_mutant` compiles one mutant with `bbgrap.cli.main` in a forked child, under an
address-space limit and a wall-clock limit, and classifies the outcome:

* `clean-error`: exit 2, exactly one stderr line starting `bbgrap: error:`, no traceback,
  nothing written to `-o`;
* `runs-exactly`: exit 0, and the plan, run in the child, matches onnxruntime on the mutant
  itself on the plan's sample input (every output finite where the reference is, within
  the tests' tolerance);
* `traceback`, `hang`, and the other failures: `bad-error` (an error that is not one clean
  line, or wrote to `-o`), `wrong-result` (compiled, but the plan fails to run or differs).

Forking after one import of everything keeps a mutant at a fraction of a second.
"""

from __future__ import annotations

import io
import os
import random
import resource
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper
from onnx_builder import graph_of, value_info

GOOD = ("clean-error", "runs-exactly")
BAD = ("traceback", "hang", "bad-error", "wrong-result")
EXIT_EXACT, EXIT_WRONG, EXIT_TRACEBACK = 0, 3, 4
TOLERANCE = 1e-4  # as tests/helpers.py: max error relative to the output's largest magnitude


@dataclass(frozen=True)
class Mutant:
    """One fuzz case: model bytes and the compile flags beyond `compile MODEL -o DIR`."""

    name: str  # base model and mutation, e.g. "resnet18/delete-node(layer1.0.conv1)"
    data: bytes
    nodes: int = 1
    flags: tuple[str, ...] = ()


@dataclass
class Outcome:
    mutant: Mutant
    kind: str
    stderr: str = ""
    seconds: float = 0.0

    def describe(self) -> str:
        head = " | ".join(self.stderr.strip().splitlines()[-3:])[:400]
        return f"{self.kind}: {self.mutant.name} (--nodes {self.mutant.nodes} {' '.join(self.mutant.flags)}): {head}"


@dataclass
class Summary:
    outcomes: list[Outcome] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        out = {k: 0 for k in GOOD + BAD}
        for o in self.outcomes:
            out[o.kind] += 1
        return out

    def by_mutation(self) -> dict[str, dict[str, int]]:
        """Outcome counts per kind of mutation (the label before its parenthesis)."""
        out: dict[str, dict[str, int]] = {}
        for o in self.outcomes:
            kind = o.mutant.name.split("/", 1)[-1].split("(", 1)[0]
            row = out.setdefault(kind, {})
            row[o.kind] = row.get(o.kind, 0) + 1
        return dict(sorted(out.items()))

    def bad(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.kind in BAD]


# --------------------------------------------------------------------------------------
# mutations

_BASES: dict[str, onnx.ModelProto] = {}


def base_models() -> dict[str, onnx.ModelProto]:
    """The models mutated: resnet18 and mobilenet_v2 at 32×32, an eighth of the width."""
    if not _BASES:
        from bbgrap import zoo

        for name in ("resnet18", "mobilenet_v2"):
            _BASES[name] = zoo.build(name, resolution=32, width=0.125)
    return _BASES


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _nodes(model: onnx.ModelProto, op: str | None = None) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if op is None or n.op_type == op]


def _set_ints(node: onnx.NodeProto, name: str, values: list[int]) -> None:
    for a in list(node.attribute):
        if a.name == name:
            node.attribute.remove(a)
    node.attribute.append(helper.make_attribute(name, values))


def _tensors(model: onnx.ModelProto) -> list[str]:
    return [i.name for i in model.graph.input] + [o for n in model.graph.node for o in n.output if o]


Mutation = Callable[[onnx.ModelProto, random.Random], tuple[str, onnx.ModelProto | bytes, tuple[str, ...]]]


def flip_bytes(m: onnx.ModelProto, r: random.Random) -> tuple[str, bytes, tuple[str, ...]]:
    data = bytearray(m.SerializeToString())
    k = r.choice([1, 2, 8, 64])
    # most of a model's bytes are weights; aim half the flips at the graph structure
    structure = len(data) - sum(len(i.SerializeToString()) for i in m.graph.initializer)
    for _ in range(k):
        pos = r.randrange(len(data)) if r.random() < 0.5 or structure <= 0 else len(data) - 1 - r.randrange(structure)
        data[pos] ^= 1 << r.randrange(8)
    return f"flip-bytes({k})", bytes(data), ()


def truncate(m: onnx.ModelProto, r: random.Random) -> tuple[str, bytes, tuple[str, ...]]:
    data = m.SerializeToString()
    cut = r.choice([0, 1, 10, r.randrange(len(data)), len(data) - r.randrange(1, 2000)])
    return f"truncate({cut})", data[:cut], ()


def delete_node(m: onnx.ModelProto, r: random.Random) -> tuple[str, onnx.ModelProto, tuple[str, ...]]:
    k = r.randrange(len(m.graph.node))
    name = m.graph.node[k].name
    del m.graph.node[k]
    return f"delete-node({name})", m, ()


def swap_inputs(m: onnx.ModelProto, r: random.Random) -> tuple[str, onnx.ModelProto, tuple[str, ...]]:
    node = r.choice([n for n in m.graph.node if len(n.input) >= 2] or list(m.graph.node))
    if len(node.input) >= 2 and r.random() < 0.5:
        i, j = r.sample(range(len(node.input)), 2)
        node.input[i], node.input[j] = node.input[j], node.input[i]
        return f"swap-inputs({node.name},{i},{j})", m, ()
    earlier = []
    for n in m.graph.node:
        if n is node:
            break
        earlier += [o for o in n.output if o]
    other = r.choice(earlier + [m.graph.input[0].name])
    node.input[0] = other
    return f"rewire-input({node.name}<-{other})", m, ()


def bad_window(m: onnx.ModelProto, r: random.Random) -> tuple[str, onnx.ModelProto, tuple[str, ...]]:
    node = r.choice(_nodes(m, "Conv") + _nodes(m, "MaxPool"))
    attr = r.choice(["kernel_shape", "pads", "strides", "dilations", "group"] if node.op_type == "Conv" else ["kernel_shape", "pads", "strides"])
    if attr == "group":
        value: list[int] | int = r.choice([0, -1, 2, 3, 7, 1 << 20])
        for a in list(node.attribute):
            if a.name == "group":
                node.attribute.remove(a)
        node.attribute.append(helper.make_attribute("group", value))
    else:
        n = 4 if attr == "pads" else 2
        if r.random() < 0.3:
            n = r.choice([1, 3, 6])  # wrong length
        huge = 1 << 12 if attr == "pads" else 1 << 20  # a million rows of padding: a valid model, but minutes to run
        value = [r.choice([-1, 0, 1, 2, 5, 40, huge]) for _ in range(n)]
        _set_ints(node, attr, value)
    return f"{attr}({node.name}={value})", m, ()


def auto_pad(m: onnx.ModelProto, r: random.Random) -> tuple[str, onnx.ModelProto, tuple[str, ...]]:
    node = r.choice(_nodes(m, "Conv") + _nodes(m, "MaxPool"))
    mode = r.choice(["SAME_UPPER", "SAME_LOWER", "VALID", "BOGUS"])
    for a in list(node.attribute):
        if a.name == "pads":
            node.attribute.remove(a)
    node.attribute.append(helper.make_attribute("auto_pad", mode))
    return f"auto-pad({node.name}={mode})", m, ()


def opset(m: onnx.ModelProto, r: random.Random) -> tuple[str, onnx.ModelProto, tuple[str, ...]]:
    v = r.choice([1, 7, 9, 27, 99])
    m.opset_import[0].version = v
    return f"opset({v})", m, ()


def input_dims(m: onnx.ModelProto, r: random.Random) -> tuple[str, onnx.ModelProto, tuple[str, ...]]:
    vi = m.graph.input[0]
    dims = vi.type.tensor_type.shape.dim
    axis = r.randrange(len(dims))
    kind = r.choice(["symbolic", "symbolic+shape", "zero", "zero-shape", "huge", "huge-shape", "batch-shape", "rank", "dtype"])
    flags: tuple[str, ...] = ()
    shape = [d.dim_value for d in dims]
    if kind == "symbolic":
        dims[axis].dim_param = "n"
    elif kind == "symbolic+shape":
        dims[axis].dim_param = "n"
        shape[axis] = r.choice([1, 2, 3, 33]) if axis != 1 else 3
        flags = ("--input-shape", f"{vi.name}:{'x'.join(map(str, shape))}")
    elif kind == "zero":
        dims[axis].dim_value = 0
    elif kind == "zero-shape":
        dims[axis].dim_param = "n"
        shape[axis] = 0
        flags = ("--input-shape", f"{vi.name}:{'x'.join(map(str, shape))}")
    elif kind == "huge":
        dims[2].dim_value = dims[3].dim_value = r.choice([20000, 1 << 31])
    elif kind == "huge-shape":
        dims[2].dim_param, dims[3].dim_param = "h", "w"
        shape[2] = shape[3] = r.choice([20000, 1 << 40])
        flags = ("--input-shape", f"{vi.name}:{'x'.join(map(str, shape))}")
    elif kind == "batch-shape":
        dims[0].dim_param = "n"
        shape[0] = 2
        flags = ("--input-shape", f"{vi.name}:{'x'.join(map(str, shape))}")
    elif kind == "rank":
        dims.add().dim_value = 1
    elif r.random() < 0.2:
        vi.type.CopyFrom(helper.make_sequence_type_proto(vi.type))
    else:
        vi.type.tensor_type.elem_type = r.choice([TensorProto.UNDEFINED, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT64,
                                                  TensorProto.STRING, TensorProto.BFLOAT16, TensorProto.BOOL])
    return f"input-dims({kind},axis {axis})", m, flags


def cycle(m: onnx.ModelProto, r: random.Random) -> tuple[str, onnx.ModelProto, tuple[str, ...]]:
    i = r.randrange(len(m.graph.node) - 1)
    j = r.randrange(i + 1, len(m.graph.node))
    a, b = m.graph.node[i], m.graph.node[j]
    a.input[0] = b.output[0]
    if r.random() < 0.5:  # topologically sorted on paper, a cycle all the same
        nodes = list(m.graph.node)
        del m.graph.node[:]
        m.graph.node.extend(nodes[:i] + nodes[i + 1: j + 1] + [nodes[i]] + nodes[j + 1:])
    return f"cycle({a.name}<-{b.name})", m, ()


def duplicate_output(m: onnx.ModelProto, r: random.Random) -> tuple[str, onnx.ModelProto, tuple[str, ...]]:
    kind = r.choice(["node", "graph-output", "input-name"])
    if kind == "node":
        i, j = sorted(r.sample(range(len(m.graph.node)), 2))
        m.graph.node[j].output[0] = m.graph.node[i].output[0]
    elif kind == "graph-output":
        m.graph.output.add().CopyFrom(m.graph.output[0])
    else:
        r.choice(list(m.graph.node)).output[0] = m.graph.input[0].name
    return f"duplicate-output({kind})", m, ()


def unknown_domain(m: onnx.ModelProto, r: random.Random) -> tuple[str, onnx.ModelProto, tuple[str, ...]]:
    node = r.choice(list(m.graph.node))
    node.domain = r.choice(["com.example", "ai.onnx.ml", "com.microsoft"])
    if r.random() < 0.7:
        m.opset_import.append(helper.make_opsetid(node.domain, 1))
    return f"domain({node.name}:{node.op_type}@{node.domain})", m, ()


def unknown_op(m: onnx.ModelProto, r: random.Random) -> tuple[str, onnx.ModelProto, tuple[str, ...]]:
    node = r.choice(list(m.graph.node))
    old = node.op_type
    node.op_type = r.choice(["Frobnicate", "Relu", "Identity", "Sigmoid", "Conv", "Add", "Flatten", "Transpose", "Softmax"])
    return f"op-type({node.name}:{old}->{node.op_type})", m, ()


def control_flow(m: onnx.ModelProto, r: random.Random) -> tuple[str, onnx.ModelProto, tuple[str, ...]]:
    """Replace a node by an If or a Loop whose body computes it from the outer tensors it
    reads by name; the condition comes from the data or is a constant."""
    node = r.choice([n for n in m.graph.node if len(n.output) == 1 and n.input])
    x, y = node.input[0], node.output[0]

    def body_node(inputs: list[str], output: str) -> onnx.NodeProto:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.input[:] = inputs
        copy.output[:] = [output]
        copy.name = ""
        return copy

    kind = r.choice(["if-data", "if-const", "loop"])
    k = list(m.graph.node).index(node)
    cf = f"cf_{k}"
    new: list[onnx.NodeProto] = []
    if kind.startswith("if"):
        then_g = graph_of([body_node(list(node.input), f"{cf}_out")], [], [value_info(f"{cf}_out")], name=f"{cf}_then")
        else_g = graph_of([body_node(list(node.input), f"{cf}_pos"), helper.make_node("Neg", [f"{cf}_pos"], [f"{cf}_out"])],
                          [], [value_info(f"{cf}_out")], name=f"{cf}_else")
        if kind == "if-data":
            new += [helper.make_node("ReduceMax", [x], [f"{cf}_max"], keepdims=1),
                    helper.make_node("Reshape", [f"{cf}_max", f"{cf}_one"], [f"{cf}_max1"]),
                    helper.make_node("Greater", [f"{cf}_max1", f"{cf}_zero"], [f"{cf}_cond"])]
            m.graph.initializer.extend([onnx.numpy_helper.from_array(np.array([1], np.int64), f"{cf}_one"),
                                        onnx.numpy_helper.from_array(np.array([0.0], np.float32), f"{cf}_zero")])
        else:
            m.graph.initializer.append(onnx.numpy_helper.from_array(np.array([r.random() < 0.5]), f"{cf}_cond"))
        new.append(helper.make_node("If", [f"{cf}_cond"], [y], name=cf, then_branch=then_g, else_branch=else_g))
    else:
        body = graph_of(
            [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Mul", ["v_in", f"{cf}_half"], ["v_sum"]),
             body_node(["v_sum", *node.input[1:]], "v_out")],
            [value_info("i", [], TensorProto.INT64), value_info("cond_in", [], TensorProto.BOOL), value_info("v_in")],
            [value_info("cond_out", [], TensorProto.BOOL), value_info("v_out")],
            name=f"{cf}_body",
        )
        m.graph.initializer.extend([onnx.numpy_helper.from_array(np.array(1, np.int64), f"{cf}_trips"),
                                    onnx.numpy_helper.from_array(np.array(1.0, np.float32), f"{cf}_half")])
        new.append(helper.make_node("Loop", [f"{cf}_trips", "", x], [y], name=cf, body=body))
    nodes = list(m.graph.node)
    del m.graph.node[:]
    m.graph.node.extend(nodes[:k] + new + nodes[k + 1:])
    return f"control-flow({kind} for {node.name})", m, ()


def weights(m: onnx.ModelProto, r: random.Random) -> tuple[str, onnx.ModelProto, tuple[str, ...]]:
    init = r.choice(list(m.graph.initializer))
    kind = r.choice(["drop", "reshape", "nan"])
    if kind == "drop":
        m.graph.initializer.remove(init)
    elif kind == "reshape":
        if init.dims:
            init.dims[0] += 1  # the data no longer fits the shape
    else:
        arr = onnx.numpy_helper.to_array(init).copy()
        if arr.dtype.kind == "f" and arr.size:
            arr.reshape(-1)[0] = np.nan
        init.CopyFrom(onnx.numpy_helper.from_array(arr, init.name))
    return f"weights({kind} {init.name})", m, ()


def outputs(m: onnx.ModelProto, r: random.Random) -> tuple[str, onnx.ModelProto, tuple[str, ...]]:
    kind = r.choice(["missing", "input", "intermediate", "none"])
    if kind == "missing":
        m.graph.output[0].name = "no_such_tensor"
    elif kind == "input":
        m.graph.output[0].name = m.graph.input[0].name
    elif kind == "intermediate":
        t = r.choice(_tensors(m)[1:])
        m.graph.output.add().CopyFrom(value_info(t))
    else:
        del m.graph.output[:]
    return f"outputs({kind})", m, ()


def valid_window(m: onnx.ModelProto, r: random.Random) -> tuple[str, onnx.ModelProto, tuple[str, ...]]:
    """Plausible window attributes (small strides, pads below the kernel, dilations, ceil_mode)
    that keep the layer valid: later layers may then disagree on shapes, or it all runs."""
    node = r.choice(_nodes(m, "Conv") + _nodes(m, "MaxPool") + _nodes(m, "AveragePool"))
    kernel = next((list(a.ints) for a in node.attribute if a.name == "kernel_shape"), [1, 1])
    changes: dict[str, list[int] | int] = {"strides": [r.choice([1, 2, 3]) for _ in range(2)]}
    changes["pads"] = [r.randrange(k) if k > 1 else 0 for k in kernel * 2]
    if node.op_type == "Conv" and r.random() < 0.5:
        changes["dilations"] = [r.choice([1, 2]) for _ in range(2)]
    if node.op_type != "Conv" and r.random() < 0.5:
        changes["ceil_mode"] = 1
    if node.op_type == "AveragePool" and r.random() < 0.5:
        changes["count_include_pad"] = 1
    for name, value in changes.items():
        if isinstance(value, int):
            for a in list(node.attribute):
                if a.name == name:
                    node.attribute.remove(a)
            node.attribute.append(helper.make_attribute(name, value))
        else:
            _set_ints(node, name, value)
    return f"window({node.name}:{changes})", m, ()


def _insert_after(m: onnx.ModelProto, node: onnx.NodeProto, make: Callable[[str, str], list[onnx.NodeProto]]) -> None:
    """Put the nodes `make(old_output, new_name)` after `node`: its readers read new_name."""
    old = node.output[0]
    new = f"{old}__fuzz"
    for n in m.graph.node:
        n.input[:] = [new if i == old else i for i in n.input]
    for o in m.graph.output:
        if o.name == old:
            o.name = new
    k = list(m.graph.node).index(node)
    nodes = list(m.graph.node)
    del m.graph.node[:]
    m.graph.node.extend(nodes[: k + 1] + make(old, new) + nodes[k + 1:])


def _const(m: onnx.ModelProto, name: str, value: np.ndarray) -> str:
    m.graph.initializer.append(onnx.numpy_helper.from_array(value, name))
    return name


def insert_op(m: onnx.ModelProto, r: random.Random) -> tuple[str, onnx.ModelProto, tuple[str, ...]]:
    """Insert shape-preserving ops (or pairs) after a 4-D activation: layouts, pads and
    slices, softmaxes, normalisations, dynamic reshapes, casts, data-dependent selects."""
    node = r.choice([n for n in m.graph.node if n.op_type in ("Conv", "Relu", "Clip", "Add", "BatchNormalization", "MaxPool")])
    kind = r.choice(["transpose", "pad-slice", "softmax", "lrn", "split-concat", "swish", "dynamic-reshape", "where",
                     "cast", "reduce-mul", "instance-norm", "depth-space", "slice-steps", "resize-pool", "flatten-reshape",
                     "contrib-op"])
    k = f"fz{list(m.graph.node).index(node)}"
    inferred = onnx.shape_inference.infer_shapes(m).graph.value_info
    ch = next((v.type.tensor_type.shape.dim[1].dim_value for v in inferred if v.name == node.output[0]), 1)

    def make(x: str, y: str) -> list[onnx.NodeProto]:
        mk = helper.make_node
        if kind == "transpose":
            return [mk("Transpose", [x], [f"{k}_t"], perm=[0, 1, 3, 2]), mk("Transpose", [f"{k}_t"], [y], perm=[0, 1, 3, 2])]
        if kind == "pad-slice":
            mode = r.choice(["constant", "reflect", "edge"])
            pads = _const(m, f"{k}_pads", np.array([0, 0, 1, 2, 0, 0, 1, 2], np.int64))
            starts, ends, axes = (_const(m, f"{k}_{n}", np.array(v, np.int64)) for n, v in
                                  (("starts", [1, 2]), ("ends", [-1, -2]), ("axes", [2, 3])))
            return [mk("Pad", [x, pads], [f"{k}_p"], mode=mode), mk("Slice", [f"{k}_p", starts, ends, axes], [y])]
        if kind == "softmax":
            return [mk("Softmax", [x], [y], axis=r.choice([1, -1, 2]))]
        if kind == "lrn":
            return [mk("LRN", [x], [y], size=r.choice([1, 3, 5]))]
        if kind == "split-concat":
            return [mk("Split", [x], [f"{k}_a", f"{k}_b"], axis=r.choice([2, 3])),
                    mk("Concat", [f"{k}_b", f"{k}_a"], [y], axis=r.choice([2, 3]))]
        if kind == "contrib-op":  # an op of another domain that onnxruntime knows
            if not any(o.domain == "com.microsoft" for o in m.opset_import):
                m.opset_import.append(helper.make_opsetid("com.microsoft", 1))
            return [mk("Gelu", [x], [y], domain="com.microsoft")]
        if kind == "swish":
            return [mk("Sigmoid", [x], [f"{k}_s"]), mk("Mul", [x, f"{k}_s"], [y])]
        if kind == "dynamic-reshape":
            return [mk("Shape", [x], [f"{k}_shape"]), mk("Reshape", [x, f"{k}_shape"], [y])]
        if kind == "where":
            zero = _const(m, f"{k}_zero", np.array(0.0, np.float32))
            return [mk("Greater", [x, zero], [f"{k}_g"]), mk("Where", [f"{k}_g", x, zero], [y])]
        if kind == "cast":
            return [mk("Cast", [x], [f"{k}_h"], to=TensorProto.FLOAT16), mk("Cast", [f"{k}_h"], [y], to=TensorProto.FLOAT)]
        if kind == "reduce-mul":
            return [mk("ReduceMean", [x], [f"{k}_m"], axes=[2, 3], keepdims=1), mk("Mul", [x, f"{k}_m"], [y])]
        if kind == "instance-norm":
            scale, bias = _const(m, f"{k}_sc", np.ones(ch, np.float32)), _const(m, f"{k}_b", np.zeros(ch, np.float32))
            return [mk("InstanceNormalization", [x, scale, bias], [y])]
        if kind == "depth-space":
            return [mk("SpaceToDepth", [x], [f"{k}_d"], blocksize=2), mk("DepthToSpace", [f"{k}_d"], [y], blocksize=2)]
        if kind == "slice-steps":
            starts, ends, axes, steps = (_const(m, f"{k}_{n}", np.array(v, np.int64)) for n, v in
                                         (("starts", [0]), ("ends", [1 << 30]), ("axes", [r.choice([2, 3])]), ("steps", [r.choice([1, 2])])))
            return [mk("Slice", [x, starts, ends, axes, steps], [y])]
        if kind == "resize-pool":
            scales = _const(m, f"{k}_scales", np.array([1, 1, 2, 2], np.float32))
            return [mk("Resize", [x, "", scales], [f"{k}_r"], mode="nearest"),
                    mk("MaxPool", [f"{k}_r"], [y], kernel_shape=[2, 2], strides=[2, 2])]
        return [mk("Flatten", [x], [f"{k}_f"], axis=r.choice([1, 2])), mk("Shape", [x], [f"{k}_shape"]),
                mk("Reshape", [f"{k}_f", f"{k}_shape"], [y])]

    _insert_after(m, node, make)
    return f"insert({kind} after {node.name})", m, ()


def direction(m: onnx.ModelProto, r: random.Random) -> tuple[str, onnx.ModelProto, tuple[str, ...]]:
    """The model as it is, cut another way (and at an odd input size, when symbolic)."""
    flags: tuple[str, ...] = ("--direction", r.choice(["n", "c", "h", "w"]))
    if r.random() < 0.5:
        vi = m.graph.input[0]
        dims = vi.type.tensor_type.shape.dim
        shape = [d.dim_value for d in dims]
        dims[0].dim_param, dims[2].dim_param, dims[3].dim_param = "n", "h", "w"
        shape[0], shape[2], shape[3] = r.choice([1, 2, 3]), r.choice([7, 17, 33, 40]), r.choice([9, 32, 45])
        flags += ("--input-shape", f"{vi.name}:{'x'.join(map(str, shape))}")
    return f"direction({' '.join(flags)})", m, flags


MUTATIONS: tuple[Mutation, ...] = (
    flip_bytes, truncate, delete_node, swap_inputs, bad_window, auto_pad, opset, input_dims, cycle,
    duplicate_output, unknown_domain, unknown_op, control_flow, weights, outputs, valid_window, insert_op, direction,
)


def mutants(seed: int, count: int, nodes: tuple[int, ...] = (1, 2)) -> list[Mutant]:
    """`count` mutants, cycling through the mutations so every kind is present, each
    compiled for one of `nodes` nodes."""
    r = random.Random(seed)
    bases = base_models()
    out: list[Mutant] = []
    for k in range(count):
        mutation = MUTATIONS[k % len(MUTATIONS)]
        base = r.choice(sorted(bases))
        label, mutated, flags = mutation(_copy(bases[base]), r)
        data = mutated if isinstance(mutated, bytes) else mutated.SerializeToString()
        out.append(Mutant(f"{base}/{label}", data, r.choice(nodes), flags))
    return out


# --------------------------------------------------------------------------------------
# running


def _finite_match(got: np.ndarray, want: np.ndarray) -> str | None:
    """Why `got` is not `want` to the tests' tolerance (NaN/Inf match only themselves), or None."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"shape/dtype {got.shape} {got.dtype}, expected {want.shape} {want.dtype}"
    if got.dtype.kind not in "fc":
        return None if np.array_equal(got, want) else "values differ"
    fin_g, fin_w = np.isfinite(got), np.isfinite(want)
    if not np.array_equal(fin_g, fin_w):
        return f"{int((~fin_g & fin_w).sum())} non-finite values where the reference is finite, {int((fin_g & ~fin_w).sum())} the reverse"
    if not np.array_equal(got[~fin_g], want[~fin_w], equal_nan=True):
        return "non-finite values differ"
    if not fin_w.any():
        return None
    scale = max(float(np.abs(want[fin_w]).max()), 1e-30)
    err = float(np.abs(got[fin_g].astype(np.float64) - want[fin_w]).max()) / scale
    return None if err <= TOLERANCE else f"max relative error {err:.3g}"


def _check_plan(plan: str, model: bytes) -> str | None:
    """Run the plan in this process and compare it with onnxruntime on the mutant itself."""
    import onnxruntime as ort
    from bbgrap.backends.runtime import embedded_runners, run_embedded

    from bbgrap.plan import read_manifest, read_sample

    manifest = read_manifest(plan)
    sample, _ = read_sample(plan)
    got = run_embedded(embedded_runners(plan, manifest, 1, "cpu", False, "off", "auto"), sample)
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    want = dict(zip(names, sess.run(names, sample)))
    if sorted(got) != sorted(want):
        return f"outputs {sorted(got)}, expected {sorted(want)}"
    for name in want:
        why = _finite_match(np.asarray(got[name]), np.asarray(want[name]))
        if why:
            return f"output '{name}': {why}"
    return None


Compile = Callable[[list[str]], int]


def _child(mutant: Mutant, path: str, plan: str, err_path: str, memory: int, compile_fn: Compile | None) -> None:
    """Compile (and, if it compiles, check) one mutant; never returns."""
    code = EXIT_TRACEBACK
    try:
        fd = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 2)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", buffering=0), write_through=True)
        sys.stdout = open(os.devnull, "w")
        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        resource.setrlimit(resource.RLIMIT_AS, (memory if soft == resource.RLIM_INFINITY else min(soft, memory), resource.RLIM_INFINITY))
        from bbgrap.cli import main

        run: Compile = main if compile_fn is None else compile_fn
        code = run(["compile", path, "-o", plan, "--nodes", str(mutant.nodes), "--quiet", *mutant.flags])
        if code == 0:
            try:
                why = _check_plan(plan, mutant.data)
            except Exception as exc:  # a plan that compiles must run
                why = f"the plan does not run: {type(exc).__name__}: {exc}"
            if why:
                print(f"plan differs from onnxruntime: {why}", file=sys.stderr)
                code = EXIT_WRONG
    except SystemExit as exc:  # argparse
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = EXIT_TRACEBACK
    finally:
        try:
            sys.stderr.flush()
        finally:
            os._exit(code)


def run_mutant(mutant: Mutant, workdir: str, timeout: float = 20.0, memory: int = 3 << 30, compile_fn: Compile | None = None) -> Outcome:
    """Compile `mutant` in a forked child under `memory` bytes of address space (beyond what
    this process maps already) and `timeout` seconds, and classify the outcome.
    `compile_fn` replaces `bbgrap.cli.main` (the harness's own tests)."""
    os.makedirs(workdir, exist_ok=True)
    path, plan, err = (os.path.join(workdir, n) for n in ("model.onnx", "plan", "stderr.txt"))
    with open(path, "wb") as fh:
        fh.write(mutant.data)
    mapped = 0
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmSize:"):
                mapped = int(line.split()[1]) * 1024
    sys.stdout.flush()
    sys.stderr.flush()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(mutant, path, plan, err, mapped + memory, compile_fn)
    status = None
    while time.monotonic() - start < timeout:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.005)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        status = None
    seconds = time.monotonic() - start
    with open(err, errors="replace") as fh:
        stderr = fh.read()
    if status is None:
        return Outcome(mutant, "hang", stderr + f"\n(killed after {timeout:.0f} s)", seconds)
    if os.WIFSIGNALED(status):
        return Outcome(mutant, "traceback", stderr + f"\n(killed by signal {os.WTERMSIG(status)})", seconds)
    code = os.WEXITSTATUS(status)
    lines = stderr.splitlines()
    if code == 0:
        kind = "runs-exactly"
    elif code == EXIT_WRONG:
        kind = "wrong-result"
    elif "Traceback (most recent call last)" in stderr or code == EXIT_TRACEBACK:
        kind = "traceback"
    elif code == 2 and len(lines) == 1 and lines[0].startswith("bbgrap: error: ") and not os.path.lexists(plan):
        kind = "clean-error"
    else:
        kind = "bad-error"
        stderr += f"\n(exit {code}, {len(lines)} lines, plan written: {os.path.lexists(plan)})"
    return Outcome(mutant, kind, stderr, seconds)


def fuzz(seed: int, count: int, root: str, timeout: float = 20.0, nodes: tuple[int, ...] = (1, 2)) -> Summary:
    """Run `count` seeded mutants, each in its own directory under `root`."""
    summary = Summary()
    for k, mutant in enumerate(mutants(seed, count, nodes)):
        summary.outcomes.append(run_mutant(mutant, os.path.join(root, f"m{k:04d}"), timeout))
    return summary
