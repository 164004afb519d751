"""Shared machinery of the region-rule property tests.

`check_partition` is the core property: import a small ONNX model, cut one layer's
output into a grid of random boxes along axes its rule allows, compute every box
with the local op the rule describes (inputs cropped to `needs`, attributes updated
by `attrs`, result cropped from `computes`), and compare the assembled output with
onnxruntime on the whole model.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort
from bbgrap.frontends.onnx import Frontend, import_proto
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from onnx import helper
from onnx_builder import build_model, graph_of, model_of, value_info, value_info_of

from bbgrap.ir import Graph, Interval, Layer, ShapeMap, Tensor
from bbgrap.rules.base import Local, RegionRule
from bbgrap.rules.registry import default_registry
from bbgrap.rules.window import Window

WINDOWED = ("Conv", "MaxPool", "AveragePool", "LpPool", "QLinearConv", "QLinearAveragePool")

seeds = st.integers(0, 2**32 - 1)


def examples(n: int) -> int:
    """`n` hypothesis examples, times $BBGRAP_RULES_SCALE (default 1) for deeper bug hunts."""
    return max(1, int(n * float(os.environ.get("BBGRAP_RULES_SCALE", "1"))))


def rules_settings(n: int) -> settings:
    return settings(max_examples=examples(n), deadline=None, suppress_health_check=list(HealthCheck))

ort.set_default_logger_severity(4)


# model building -----------------------------------------------------------------------


def rng_of(data: st.DataObject) -> np.random.Generator:
    return np.random.default_rng(data.draw(seeds, label="seed"))


def const(rng: np.random.Generator, shape: Sequence[int], low: float | None = None, high: float | None = None) -> np.ndarray:
    """A float32 constant: standard normal, or uniform in [low, high)."""
    if low is None:
        return rng.standard_normal(tuple(shape)).astype(np.float32)
    return rng.uniform(low, high, tuple(shape)).astype(np.float32)


def single_op(
    op_type: str,
    inputs: Sequence[str],
    activations: Mapping[str, Sequence[int]],
    constants: Mapping[str, np.ndarray],
    opset: int,
    outputs: Sequence[str] = ("y",),
    opset_domain: str = "",
    **attrs: Any,
) -> onnx.ModelProto:
    """A one-node model `outputs = op_type(inputs)`."""
    node = helper.make_node(op_type, list(inputs), list(outputs), name="op", **attrs)
    return build_model([node], activations, constants, [o for o in outputs if o], opset, opset_domain)


def rounded_single_op(op_type: str, inputs: Sequence[str], activations: Mapping[str, Sequence[int]],
                      constants: Mapping[str, np.ndarray], **attrs: Any) -> onnx.ModelProto:
    """`single_op`'s model (opset 21) with its result y negated and quantized to 16 bits after it
    (Neg, QuantizeLinear): the op, named "op", is rounded later (`Graph.rounded_later`), as the
    float ops of a 16-bit QDQ model are, and its own output stays float."""
    nodes = [helper.make_node(op_type, list(inputs), ["y"], name="op", **attrs), helper.make_node("Neg", ["y"], ["n"], name="neg"),
             helper.make_node("QuantizeLinear", ["n", "q_scale", "q_zero"], ["q"], name="quantize")]
    rounding = {"q_scale": np.array(0.01, np.float32), "q_zero": np.array(32768, np.uint16)}
    return build_model(nodes, activations, {**constants, **rounding}, ["q"], 21)


# running ------------------------------------------------------------------------------


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def run_model(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], wanted: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Values of `wanted` tensors (default: the graph outputs) in onnxruntime."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    if wanted is not None:
        del probe.graph.output[:]
        for name in wanted:
            probe.graph.output.add().name = name
    names = [o.name for o in probe.graph.output]
    return dict(zip(names, _session(probe).run(names, dict(feeds))))


def tensor_values(model: onnx.ModelProto, front: Frontend) -> dict[str, np.ndarray]:
    """Every tensor of the imported graph: sample inputs, constants and (computed) activations."""
    produced = [t for layer in front.graph.layers for t in layer.outputs if t]
    values = dict(front.sample_inputs)
    values.update(front.graph.constants)
    values.update(run_model(model, front.sample_inputs, produced))
    return values


def run_local(layer: Layer, graph: Graph, local: Local, values: Mapping[str, np.ndarray]) -> np.ndarray:
    """Run the local op of `local` on the cropped inputs; returns its first output."""
    names: list[str] = []
    feeds: dict[str, np.ndarray] = {}
    inits: dict[str, np.ndarray] = {}
    assert len(local.needs) == len(layer.inputs), (local.needs, layer.inputs)
    for k, (tensor, need) in enumerate(zip(layer.inputs, local.needs)):
        name = f"in{k}"
        if k in local.inputs:  # the local op's own value of a constant input (Slice's starts)
            names.append(name)
            inits[name] = np.asarray(local.inputs[k])
            continue
        if not tensor:
            names.append("")
            continue
        if need is None:
            continue  # dropped from the local op (Concat)
        piece = np.array(np.asarray(values[tensor])[need.slices()], copy=True, order="C")  # keeps 0-d 0-d
        names.append(name)
        if tensor in graph.constants:
            inits[name] = piece
        else:
            feeds[name] = piece
    for k in sorted(i for i in local.inputs if i >= len(layer.inputs)):  # optional inputs the layer omits
        names.extend([""] * (k - len(names)))
        names.append(f"in{k}")
        inits[f"in{k}"] = np.asarray(local.inputs[k])
    while names and names[-1] == "":
        names.pop()
    attrs = dict(layer.attrs)
    attrs.update(local.attrs)
    outs = [f"out{k}" if t else "" for k, t in enumerate(layer.outputs)]
    node = helper.make_node(layer.op_type, names, outs, name="local", domain=layer.domain or None, **attrs)
    out_type = helper.np_dtype_to_tensor_dtype(np.dtype(graph.tensors[layer.outputs[0]].dtype))
    g = graph_of([node], [value_info_of(n, v) for n, v in feeds.items()], [value_info(outs[0], elem_type=out_type)], inits, "local")
    model = model_of(g, graph.opsets, check=False)
    return run_model(model, feeds)[outs[0]]


# the property -------------------------------------------------------------------------


def pieces(data: st.DataObject, size: int, max_cuts: int) -> list[Interval]:
    """Random contiguous pieces covering [0, size)."""
    if size < 2 or max_cuts == 0:
        return [Interval(0, size)]
    cuts = sorted(data.draw(st.sets(st.integers(1, size - 1), max_size=min(max_cuts, size - 1)), label="cuts"))
    bounds = [0] + cuts + [size]
    return [Interval(a, b) for a, b in zip(bounds, bounds[1:])]


@dataclass
class Checked:
    front: Frontend
    layer: Layer
    rule: RegionRule
    axes: frozenset[int]
    cut_axes: list[int]
    boxes: list[ShapeMap]
    locals: list[Local]


def check_needs_inside(layer: Layer, graph: Graph, local: Local, box: ShapeMap) -> None:
    """Needs are non-empty boxes inside their tensors, and `computes` covers the box."""
    for tensor, need in zip(layer.inputs, local.needs):
        if not tensor or need is None:
            continue
        full = ShapeMap.full(graph.tensors[tensor].shape)
        assert need.rank == full.rank, (tensor, need, full)
        assert need.is_box and not need.empty, (tensor, need)
        assert full.contains(need), f"need {need} of {tensor} lies outside {full}"
    out_full = ShapeMap.full(graph.tensors[layer.outputs[0]].shape)
    assert local.computes.contains(box), (local.computes, box)
    assert out_full.contains(local.computes), (local.computes, out_full)


def check_window_pads(layer: Layer, graph: Graph, local: Local, box: ShapeMap) -> None:
    """Windowed ops: local pads are within the original pads, and only pieces whose
    needed input touches a border get that border's padding — except that the piece
    ending at the output's end keeps the original end padding (documented design)."""
    x_shape = graph.tensors[layer.inputs[0]].shape
    kernel = layer.attrs["kernel_shape"]
    window = Window.of(layer, x_shape, kernel)
    k = len(kernel)
    pads = list(local.attrs["pads"])
    assert len(pads) == 2 * k
    need = local.needs[0]
    for a in range(k):
        iv, size = need.interval(2 + a), x_shape[2 + a]
        b, e = pads[a], pads[a + k]
        p0, p1 = window.pads[a], window.pads[a + k]
        assert 0 <= b <= p0 and 0 <= e <= p1, (pads, window.pads)
        if b > 0:
            assert iv.start == 0, (box, need, pads)
        if box.interval(2 + a).start == 0:
            assert b == p0 or iv.start == 0
        if e > 0:
            last = box.interval(2 + a).stop == graph.tensors[layer.outputs[0]].shape[2 + a]
            assert iv.stop == size or (last and e == p1), (box, need, pads)


def draw_boxes(
    data: st.DataObject,
    out_shape: Sequence[int],
    allowed: frozenset[int],
    cut_axes: Sequence[int] | None = None,
    max_cut_axes: int = 2,
    finest: bool = False,
) -> tuple[list[int], list[ShapeMap]]:
    """A grid of boxes covering the output: up to 4 pieces along the first cut axis,
    up to 2 along the others (`finest`: unit pieces along every cut axis).
    `cut_axes` forces the axes (each must be allowed)."""
    if cut_axes is None:
        options = sorted(allowed)
        n = min(max_cut_axes, len(options))
        chosen = data.draw(st.lists(st.sampled_from(options), min_size=min(1, n), max_size=n, unique=True), label="cut axes") if options else []
    else:
        chosen = list(cut_axes)
        assert set(chosen) <= allowed, (chosen, allowed)
    per_axis: list[list[Interval]] = []
    for a, size in enumerate(out_shape):
        if a in chosen and finest:
            per_axis.append([Interval(i, i + 1) for i in range(size)])
        elif a in chosen:
            per_axis.append(pieces(data, size, 3 if a == chosen[0] else 1))
        else:
            per_axis.append([Interval(0, size)])
    return chosen, [ShapeMap(tuple((iv,) for iv in combo)) for combo in itertools.product(*per_axis)]


Runner = Callable[[Layer, Graph, Local, Mapping[str, np.ndarray]], np.ndarray]


def assemble(
    layer: Layer,
    graph: Graph,
    rule: RegionRule,
    boxes: Sequence[ShapeMap],
    values: Mapping[str, np.ndarray],
    ref: np.ndarray,
    run: Runner = None,
    tolerance: float = 1e-5,
) -> list[Local]:
    """Compute every box with its local op (`run`, default onnxruntime), check the
    rule's structural promises, and compare the assembled output with `ref` (to `tolerance`,
    relative to the element and to the output's largest magnitude).

    All the local op computes must equal the whole op there too, not only the box: a node holds what its local op computed and gathers its own reads from it
    (bbgrap/movement.py), so rows computed beyond the box are data the plan uses. Rows it emits
    beyond `computes` (`Local.emits`) are cropped away before that and may differ."""
    run = run or run_local
    out_shape = graph.tensors[layer.outputs[0]].shape
    assert ref.shape == tuple(out_shape), (ref.shape, out_shape)
    result = np.full(out_shape, np.nan, dtype=np.float64)
    scale = max(1.0, float(np.abs(ref).max())) if ref.size else 1.0
    locals_: list[Local] = []
    for box in boxes:
        local = rule.local(layer, graph, box)
        locals_.append(local)
        check_needs_inside(layer, graph, local, box)
        if layer.op_type in WINDOWED:
            check_window_pads(layer, graph, local, box)
        y = run(layer, graph, local, values)
        assert y.shape == local.emitted.shape, f"local op gave {y.shape}, rule says it emits {local.emitted} for box {box}"
        assert local.emitted.contains(local.computes), (local.emitted, local.computes)
        y = y[local.computes.relative_to(local.emitted).slices()]  # what lowering keeps of it
        result[box.slices()] = y[box.relative_to(local.computes).slices()]
        np.testing.assert_allclose(
            y, ref[local.computes.slices()], rtol=tolerance, atol=tolerance * scale,
            err_msg=f"{layer.op_type} {dict(layer.attrs)}: box {box} computes {local.computes}, not all exact",
        )
    assert not np.isnan(result).any()
    np.testing.assert_allclose(
        result, ref, rtol=tolerance, atol=tolerance * scale,
        err_msg=f"{layer.op_type} {dict(layer.attrs)} boxes {[str(b) for b in boxes]}",
    )
    return locals_


def check_partition(
    data: st.DataObject,
    model: onnx.ModelProto,
    *,
    layer: str | None = None,
    expect_axes: frozenset[int] | set[int] | None = None,
    cut_axes: Sequence[int] | None = None,
    max_cut_axes: int = 2,
    finest: bool = False,
    tolerance: float = 1e-5,
) -> Checked:
    """The core property (see module docstring). `layer` defaults to the last layer;
    `cut_axes` forces the axes to cut (each must be allowed), else they are drawn;
    `tolerance` (see `assemble`)."""
    front = import_proto(model, seed=data.draw(seeds, label="import seed"))
    graph = front.graph
    lay = graph.layers[-1] if layer is None else graph.layer(layer)
    rule = default_registry().get(lay)
    assert rule is not None, f"no rule for {lay.op_type}"
    assert lay.group == rule.group
    allowed = frozenset(rule.axes(lay, graph))
    if expect_axes is not None:
        assert allowed == frozenset(expect_axes), (allowed, expect_axes)
    values = tensor_values(model, front)
    out_shape = graph.tensors[lay.outputs[0]].shape
    chosen, boxes = draw_boxes(data, out_shape, allowed, cut_axes, max_cut_axes, finest)
    locals_ = assemble(lay, graph, rule, boxes, values, np.asarray(values[lay.outputs[0]]), tolerance=tolerance)
    return Checked(front, lay, rule, allowed, chosen, boxes, locals_)


def manual_graph(
    op_type: str,
    attrs: Mapping[str, Any],
    activations: Mapping[str, np.ndarray],
    constants: Mapping[str, np.ndarray],
    out_shape: Sequence[int],
    opset: int = 13,
) -> tuple[Graph, Layer]:
    """A one-layer IR built by hand, for ops onnxruntime cannot run (so `import_proto`
    cannot import them); the output is `y`."""
    inputs = tuple(list(activations) + list(constants))
    rule = default_registry().get(Layer("op", op_type, "", attrs, inputs, ("y",)))
    layer = Layer("op", op_type, "", dict(attrs), inputs, ("y",), rule.group if rule else "opaque")
    tensors = {n: Tensor(n, tuple(v.shape), v.dtype.name) for n, v in list(activations.items()) + list(constants.items())}
    tensors["y"] = Tensor("y", tuple(out_shape), "float32")
    graph = Graph("manual", (layer,), tensors, dict(constants), tuple(activations), ("y",), {"": opset})
    return graph, layer
