"""Pool region rules: windowed pools, global pools and LRN."""

from __future__ import annotations

import numpy as np
from bbgrap.frontends.onnx import import_proto
from hypothesis import given
from hypothesis import strategies as st

from bbgrap.ir import Interval
from bbgrap.report import whole_reason
from bbgrap.rules.registry import default_registry
from tests.rules.helpers import (
    assemble,
    check_partition,
    draw_boxes,
    manual_graph,
    rng_of,
    rounded_single_op,
    rules_settings,
    run_model,
    single_op,
)

SETTINGS = rules_settings(60)

# which output axis a cut runs along
AXIS = {"n": 0, "c": 1, "h": 2, "w": 3}


def _window_pool(draw: st.DrawFn, op: str, rank: int) -> tuple:
    kernel = [draw(st.integers(1, 4)) for _ in range(rank)]
    strides = [draw(st.integers(1, 3)) for _ in range(rank)]
    attrs: dict = {"kernel_shape": kernel, "strides": strides}
    dilations = [1] * rank
    if op == "MaxPool" and draw(st.booleans(), label="dilated"):
        dilations = [draw(st.integers(1, 3)) for _ in range(rank)]
        attrs["dilations"] = dilations
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    spatial = [draw(st.integers(e, max(e, 20))) for e in eff]
    attrs["pads"] = [draw(st.integers(0, k - 1)) for k in kernel + kernel]
    if op != "LpPool":
        attrs["ceil_mode"] = draw(st.integers(0, 1), label="ceil_mode")
    else:
        attrs["p"] = draw(st.integers(1, 3), label="p")
    if op == "AveragePool":
        attrs["count_include_pad"] = draw(st.integers(0, 1), label="count_include_pad")
    shape = [draw(st.integers(1, 2)), draw(st.integers(1, 12)), *spatial]
    opset = draw(st.integers(13, 17), label="opset")
    return single_op(op, ["x"], {"x": shape}, {}, opset, **attrs)


@rules_settings(80)
@given(st.data(), st.sampled_from(["MaxPool", "AveragePool"]), st.sampled_from(["n", "c", "h", "w", "hw", "nc", "cw"]))
def test_window_pool(data: st.DataObject, op: str, axes: str) -> None:
    model = _window_pool(data.draw, op, 2)
    check_partition(data, model, expect_axes={0, 1, 2, 3}, cut_axes=[AXIS[a] for a in axes])


@SETTINGS
@given(st.data(), st.sampled_from(["MaxPool", "AveragePool", "LpPool"]))
def test_window_pool_1d(data: st.DataObject, op: str) -> None:
    model = _window_pool(data.draw, op, 1)
    check_partition(data, model, expect_axes={0, 1, 2})


@SETTINGS
@given(st.data(), st.sampled_from(["SAME_UPPER", "SAME_LOWER", "VALID"]), st.sampled_from(["MaxPool", "AveragePool"]))
def test_window_pool_auto_pad(data: st.DataObject, auto_pad: str, op: str) -> None:
    """auto_pad on pools (turned into explicit pads by the frontend)."""
    kernel = [data.draw(st.integers(1, 4)) for _ in range(2)]
    # onnxruntime's SAME pools fail ("padding values must be non-negative") when a
    # stride exceeds the kernel, though ONNX clamps that padding at 0
    strides = [data.draw(st.integers(1, min(3, k) if auto_pad != "VALID" else 3)) for k in kernel]
    spatial = [data.draw(st.integers(k, 20)) for k in kernel]
    model = single_op(op, ["x"], {"x": [1, data.draw(st.integers(1, 4)), *spatial]}, {}, 13,
                      kernel_shape=kernel, strides=strides, auto_pad=auto_pad)
    check_partition(data, model, cut_axes=data.draw(st.sampled_from([[2], [3], [2, 3]])))


@SETTINGS
@given(st.data(), st.sampled_from(["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"]))
def test_global_pool(data: st.DataObject, op: str) -> None:
    shape = [data.draw(st.integers(1, 2)), data.draw(st.integers(1, 12)), data.draw(st.integers(1, 20)), data.draw(st.integers(1, 20))]
    model = single_op(op, ["x"], {"x": shape}, {}, data.draw(st.integers(13, 17)))
    check_partition(data, model, expect_axes={0, 1})





def lrn_spec(x: np.ndarray, size: int, alpha: float, beta: float, bias: float) -> np.ndarray:
    """LRN as the ONNX spec defines it (any size, even ones included)."""
    x64 = x.astype(np.float64)
    channels = x.shape[1]
    lo, hi = (size - 1) // 2, -(-(size - 1) // 2)
    square_sum = np.zeros_like(x64)
    for c in range(channels):
        square_sum[:, c] = (x64[:, max(0, c - lo):min(channels - 1, c + hi) + 1] ** 2).sum(axis=1)
    return (x64 / (bias + alpha / size * square_sum) ** beta).astype(np.float32)


def _run_lrn_spec(layer, graph, local, values) -> np.ndarray:
    a = layer.attrs
    x = np.asarray(values[layer.inputs[0]])[local.needs[0].slices()]
    return lrn_spec(x, int(a["size"]), float(a.get("alpha", 1e-4)), float(a.get("beta", 0.75)), float(a.get("bias", 1.0)))


def _lrn_case(data: st.DataObject, sizes: st.SearchStrategy[int]) -> tuple[int, int, list[int], dict]:
    size = data.draw(sizes, label="size")
    channels = data.draw(st.integers(1, 12), label="channels")
    shape = [data.draw(st.integers(1, 2)), channels, data.draw(st.integers(1, 12)), data.draw(st.integers(1, 12))]
    attrs = {
        "size": size,
        "alpha": data.draw(st.sampled_from([1e-4, 0.5, 2.0])),
        "beta": data.draw(st.sampled_from([0.75, 0.5, 1.0])),
        "bias": data.draw(st.sampled_from([1.0, 2.0])),
    }
    return size, channels, shape, attrs


def _check_halo(boxes, locals_, size: int, channels: int) -> None:
    """A piece keeps exactly its box. It reads its box, and along channels the window's halo:
    ⌊(size − 1)/2⌋ channels before, ⌈(size − 1)/2⌉ after, clipped; it emits all it reads
    (LRNRule's docstring)."""
    for box, local in zip(boxes, locals_):
        c = box.interval(1)
        halo = box.with_axis(1, Interval(max(0, c.start - (size - 1) // 2), min(channels, c.stop + size // 2)))
        assert local.computes == box and local.needs[0] == local.emitted == halo, (box, local)


@SETTINGS
@given(st.data(), st.sampled_from(["h", "w", "n", "c", "hw", "cw"]))
def test_lrn(data: st.DataObject, axes: str) -> None:
    """Odd sizes, in onnxruntime (which accepts only odd sizes)."""
    size, channels, shape, attrs = _lrn_case(data, st.sampled_from([1, 3, 5]))
    model = single_op("LRN", ["x"], {"x": shape}, {}, data.draw(st.integers(13, 17)), **attrs)
    checked = check_partition(data, model, expect_axes={0, 1, 2, 3}, cut_axes=[AXIS[a] for a in axes])
    _check_halo(checked.boxes, checked.locals, size, channels)
    # the spec model used for even sizes agrees with onnxruntime on odd ones
    x = checked.front.sample_inputs["x"]
    np.testing.assert_allclose(lrn_spec(x, size, attrs["alpha"], attrs["beta"], attrs["bias"]),
                               checked.front.reference_outputs["y"], rtol=1e-5, atol=1e-5)


def test_a_rounded_lrn_is_not_cut_and_inspect_says_why() -> None:
    """onnxruntime sums LRN's squares over the channels from its input's first and raises them to
    the power in vectors whose ends depend on the tensor's size: a piece of channels, and one of a
    few pixels, is a last bit off the whole op (checked below), which a rounding after it (a 16-bit
    model's QuantizeLinear) can make a step. There the layer is not cut, and the reason says so."""
    x = np.random.default_rng(0).standard_normal((1, 12, 1, 4)).astype(np.float32)
    attrs = {"size": 5, "alpha": 0.5, "beta": 0.75, "bias": 1.0}
    model = rounded_single_op("LRN", ["x"], {"x": list(x.shape)}, {}, **attrs)
    graph = import_proto(model).graph
    layer = graph.layer("op")
    rule = default_registry().get(layer)
    assert graph.rounded_later(layer) and rule.axes(layer, graph) == frozenset()
    assert "last bit" in whole_reason(graph, layer, default_registry())

    def lrn(x: np.ndarray, **attrs: float) -> np.ndarray:
        return run_model(single_op("LRN", ["x"], {"x": list(x.shape)}, {}, 17, **attrs), {"x": np.ascontiguousarray(x)})["y"]

    assert not np.array_equal(lrn(x[:, 2:], **attrs)[:, 2:], lrn(x, **attrs)[:, 4:])
    small = {"size": 3, "alpha": 1e-4, "beta": 0.75, "bias": 2.0}
    x = np.random.default_rng(16).standard_normal((1, 3, 2, 5)).astype(np.float32)
    assert not np.array_equal(lrn(x[..., :1], **small), lrn(x, **small)[..., :1])


@SETTINGS
@given(st.data(), st.sampled_from(["h", "w", "c", "hw", "ch"]))
def test_lrn_even_size(data: st.DataObject, axes: str) -> None:
    """Even sizes (asymmetric channel halo: floor((size-1)/2) before, ceil after),
    against the spec's formula since onnxruntime refuses even sizes."""
    size, channels, shape, attrs = _lrn_case(data, st.sampled_from([2, 4]))
    x = rng_of(data).standard_normal(shape).astype(np.float32)
    graph, layer = manual_graph("LRN", attrs, {"x": x}, {}, shape)
    rule = default_registry().get(layer)
    assert rule.axes(layer, graph) == frozenset({0, 1, 2, 3})
    _, boxes = draw_boxes(data, shape, rule.axes(layer, graph), cut_axes=[AXIS[a] for a in axes])
    ref = lrn_spec(x, size, attrs["alpha"], attrs["beta"], attrs["bias"])
    locals_ = assemble(layer, graph, rule, boxes, {"x": x}, ref, run=_run_lrn_spec)
    _check_halo(boxes, locals_, size, channels)
