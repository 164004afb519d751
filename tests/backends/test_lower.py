"""Lowering's segment layout: copy-only segments fold into the segment before them, and crops
between convolutions become one-tap convolutions."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from bbgrap.backends.lower import (
    SELECT_MAX_TAPS,
    Message,
    Segment,
    Step,
    _crops_as_convolutions,
    _merge_copy_segments,
    _moves_data,
    _window_slack,
    lower,
    segment_model,
)
from bbgrap.frontends.onnx import import_model
from helpers import assert_exact, save
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper
from onnx_builder import graph_of, model_of, value_info

from bbgrap import zoo
from bbgrap.compiler import compile_model, pipeline
from bbgrap.config import Config
from bbgrap.ir import Layer, ShapeMap
from bbgrap.pass_manager import PassManager
from bbgrap.rules.registry import default_registry


def run(*ops: str) -> Step:
    return Step("run", segment=Segment(nodes=[helper.make_node(op, ["x"], [f"y{k}"]) for k, op in enumerate(ops)]))


def message(k: int) -> Message:
    return Message(k, 0, 1, "t", ShapeMap.full((1, 1)), "float32")


def layout(steps: list[Step]) -> list[str]:
    return [",".join(n.op_type for n in s.segment.nodes) if s.op == "run" else s.op for s in steps]


def test_copy_segment_folds_back_over_sends_but_not_over_a_wait() -> None:
    steps = [run("Conv"), Step("send", message=message(0)), run("Slice", "Concat"), Step("wait", message=message(1)),
             run("Concat"), run("Conv"), Step("send", message=message(2)), run("Relu")]
    assert layout(_merge_copy_segments(steps, default_registry())) == ["Conv,Slice,Concat", "send", "wait", "Concat", "Conv", "send", "Relu"]


def test_plans_keep_no_copy_segment_after_sends_and_stay_exact(tmp_path) -> None:
    # at this size resnet50's node 0 crops a tensor right after sending its neighbour's part
    # (as full-size mobilenet_v2's channel-cut tail does): without the fold, a segment of its own
    model = save(zoo.build("resnet50", resolution=64, width=0.25, seed=3), str(tmp_path))
    compile_model(model, Config(nodes=2, planner="greedy"), str(tmp_path / "plan"))
    assert_exact(str(tmp_path / "plan"))
    programs, _ = lower(PassManager(pipeline(Config(nodes=2, planner="greedy"))).run(import_model(model).graph))
    for prog in programs:
        before = ""  # the last step that is not a send
        for step in prog.steps:
            if step.op == "run" and all(_moves_data(n, default_registry()) for n in step.segment.nodes):
                assert before != "run", f"node {prog.node}: a copy-only segment follows a segment with only sends between"
            if step.op != "send":
                before = step.op


# crops as one-tap convolutions ---------------------------------------------------------------

OPSETS = SimpleNamespace(opsets={"": 13})


def crop_segment(shape: tuple[int, ...], starts: list[int], stops: list[int], producer: str = "Relu",
                 consumer: str = "MaxPool", output: bool = False) -> tuple[Segment, dict[str, tuple[str, tuple[int, ...]]]]:
    """x -> producer -> a -> Slice(rows/columns of a) -> b -> consumer -> y."""
    out = (shape[0], shape[1], stops[0] - starts[0], stops[1] - starts[1])
    meta = {"x": ("float32", shape), "a": ("float32", shape), "b": ("float32", out), "y": ("float32", out)}
    seg = Segment(inputs=["x"], outputs=["y", "b"] if output else ["y"])
    seg.initializers = {"s": np.asarray(starts, np.int64), "e": np.asarray(stops, np.int64), "ax": np.asarray([2, 3], np.int64)}
    seg.nodes = [helper.make_node(producer, ["x"], ["a"]), helper.make_node("Slice", ["a", "s", "e", "ax"], ["b"], name="crop")]
    attrs = {"kernel_shape": [1, 1]} if consumer == "MaxPool" else {"axis": 1} if consumer == "Concat" else {}
    seg.nodes.append(helper.make_node(consumer, ["b", "b"] if consumer == "Concat" else ["b"], ["y"], **attrs))
    return seg, meta


def run_segment(seg: Segment, meta: dict[str, tuple[str, tuple[int, ...]]], x: np.ndarray, optimize: bool) -> np.ndarray:
    opts = ort.SessionOptions()
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    model = segment_model(OPSETS, seg, meta, "crop")  # type: ignore[arg-type]
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(["y"], {"x": x})[0]


@settings(max_examples=40, deadline=None)
@given(channels=st.sampled_from([1, 3, 8, 16, 24]), height=st.integers(2, 9), width=st.integers(2, 9), data=st.data())
def test_a_crop_between_nchwc_ops_becomes_an_exact_one_tap_convolution(channels: int, height: int, width: int, data) -> None:
    # onnxruntime runs the select kernel in its blocked layout where channels allow: both paths
    drop_h = data.draw(st.integers(0, min(height - 1, SELECT_MAX_TAPS - 1)))
    drop_w = data.draw(st.integers(0, min(width - 1, SELECT_MAX_TAPS // (drop_h + 1) - 1)))
    top, left = data.draw(st.integers(0, drop_h)), data.draw(st.integers(0, drop_w))
    starts, stops = [top, left], [height - drop_h + top, width - drop_w + left]
    seg, meta = crop_segment((1, channels, height, width), starts, stops)
    _crops_as_convolutions(seg, meta, default_registry())
    assert [n.op_type for n in seg.nodes] == ["Relu", "Conv", "MaxPool"]
    assert set(seg.initializers) == {"b/select"}, "the Slice's index tensors must go with it"
    x = np.random.default_rng(channels * 100 + height * 10 + width).standard_normal((1, channels, height, width)).astype(np.float32)
    want = np.maximum(x, 0)[:, :, starts[0]:stops[0], starts[1]:stops[1]]
    for optimize in (False, True):
        np.testing.assert_array_equal(run_segment(seg, meta, x, optimize), want)


@pytest.mark.parametrize("producer", ["Sigmoid", "Tanh", "HardSigmoid"])
def test_a_crop_after_an_activation_that_keeps_the_blocked_layout_becomes_a_select_kernel(producer: str) -> None:
    # onnxruntime 1.31 keeps these on blocked data on their own (simulate.layout_reorders)
    seg, meta = crop_segment((1, 16, 6, 5), [1, 0], [5, 5], producer=producer)
    _crops_as_convolutions(seg, meta, default_registry())
    assert [n.op_type for n in seg.nodes] == [producer, "Conv", "MaxPool"]
    x = np.random.default_rng(7).standard_normal((1, 16, 6, 5)).astype(np.float32)
    want = run_segment(*crop_segment((1, 16, 6, 5), [1, 0], [5, 5], producer=producer), x, False)
    for optimize in (False, True):
        np.testing.assert_array_equal(run_segment(seg, meta, x, optimize), want)


@pytest.mark.parametrize("case", [
    dict(output=True),  # the crop leaves the segment (it is sent): a Slice of NCHW data is what goes out
    dict(consumer="Concat"),  # a consumer that works in NCHW: the conversion would only move
    dict(producer="Erf"),  # nor after an op onnxruntime runs on NCHW (it reorders before it)
    dict(starts=[0, 0], stops=[3, 4]),  # 3 x 2 = 6 taps: a big crop costs more as a convolution
])
def test_crops_that_would_not_gain_stay_slices(case: dict) -> None:
    args = {"starts": [1, 0], "stops": [5, 5], **case}
    seg, meta = crop_segment((1, 8, 6, 5), args.pop("starts"), args.pop("stops"), **args)
    _crops_as_convolutions(seg, meta, default_registry())
    assert [n.op_type for n in seg.nodes][1] == "Slice"


def test_a_crop_of_a_segment_input_stays_a_slice() -> None:
    seg, meta = crop_segment((1, 8, 6, 5), [1, 0], [5, 5])
    seg.nodes = seg.nodes[1:]
    seg.nodes[0].input[0] = "x"
    meta["x"] = meta["a"]
    _crops_as_convolutions(seg, meta, default_registry())
    assert [n.op_type for n in seg.nodes] == ["Slice", "MaxPool"]


def test_compiled_resnet_uses_select_kernels_and_stays_exact(tmp_path) -> None:
    # recomputed halos leave a residual one row longer than the branch it is added to
    model = save(zoo.build("resnet50", resolution=64, width=0.25, seed=3), str(tmp_path))
    compile_model(model, Config(nodes=2, planner="greedy"), str(tmp_path / "plan"))
    selects = [n for f in sorted((tmp_path / "plan").glob("node*/*.onnx")) for n in onnx.load(str(f), load_external_data=False).graph.node
               if n.op_type == "Conv" and n.input[1].endswith("/select")]
    assert selects
    assert_exact(str(tmp_path / "plan"))


# windowed ops read past a crop they do not need -------------------------------------------------

def slack(op: str, kernel: tuple[int, int], strides: tuple[int, int], pads: list[int], have: tuple[int, int],
          need: tuple[int, int]) -> tuple[int, int]:
    """Rows x columns `_window_slack` lets the op read of a `have`-sized input where it needs `need`."""
    attrs = {"strides": list(strides), "pads": pads, **({"kernel_shape": list(kernel)} if op != "Conv" else {})}
    layer = Layer("op", op, "", attrs, ("x", "w"), ("y",))
    graph = SimpleNamespace(tensors={"w": SimpleNamespace(shape=(4, 4, *kernel))})
    region = _window_slack(graph, layer, {"pads": pads}, ShapeMap.full((1, 4, *have)), ShapeMap.full((1, 4, *need)))  # type: ignore[arg-type]
    return region.shape[2], region.shape[3]


def test_a_strided_window_reads_the_trailing_row_it_does_not_need() -> None:
    # resnet50's 1x1 stride-2 downsampling: 14 rows give the same 7 outputs as 13
    assert slack("Conv", (1, 1), (2, 2), [0, 0, 0, 0], (14, 28), (13, 27)) == (14, 28)
    assert slack("MaxPool", (3, 3), (2, 2), [1, 1, 0, 0], (15, 15), (14, 14)) == (15, 15)


@pytest.mark.parametrize("op, kernel, strides, pads, have, need", [
    ("Conv", (1, 1), (1, 1), [0, 0, 0, 0], (14, 14), (13, 13)),  # stride 1: one more row is one more output
    ("Conv", (3, 3), (2, 2), [1, 1, 0, 0], (15, 15), (13, 13)),  # two more rows at stride 2: one more window
    ("Conv", (3, 3), (2, 2), [1, 1, 1, 1], (14, 14), (13, 13)),  # the local op pads that end: a row would replace zeros
])
def test_a_window_that_would_change_keeps_its_crop(op: str, kernel: tuple[int, int], strides: tuple[int, int],
                                                   pads: list[int], have: tuple[int, int], need: tuple[int, int]) -> None:
    assert slack(op, kernel, strides, pads, have, need) == need


@settings(max_examples=40, deadline=None)
@given(op=st.sampled_from(["Conv", "MaxPool", "AveragePool"]), k=st.integers(1, 3), s=st.integers(1, 3),
       begin=st.integers(0, 1), end=st.integers(0, 1), rows=st.integers(3, 9), extra=st.integers(1, 3))
def test_reading_the_slack_computes_the_same_output(op: str, k: int, s: int, begin: int, end: int, rows: int, extra: int) -> None:
    pads = [min(begin, k - 1)] * 2 + [min(end, k - 1)] * 2  # onnxruntime's pools want pads < kernel
    need, have = (rows, rows), (rows + extra, rows + extra)
    if rows + 2 * begin < k:
        return
    got = slack(op, (k, k), (s, s), pads, have, need)
    x = np.random.default_rng(rows * 10 + extra).standard_normal((1, 4, *have)).astype(np.float32)
    attrs = {"strides": [s, s], "pads": pads, "kernel_shape": [k, k]}
    inputs = ["x", "w"] if op == "Conv" else ["x"]
    inits = [onnx.numpy_helper.from_array(np.random.default_rng(k).standard_normal((4, 4, k, k)).astype(np.float32), "w")] if op == "Conv" else []

    def run(shape: tuple[int, int]) -> np.ndarray:
        constants = {t.name: onnx.numpy_helper.to_array(t) for t in inits}
        g = graph_of([helper.make_node(op, inputs, ["y"], **attrs)], [value_info("x", [1, 4, *shape])], [value_info("y")], constants, name="w")
        sess = ort.InferenceSession(model_of(g, check=False).SerializeToString(), providers=["CPUExecutionProvider"])
        return sess.run(["y"], {"x": np.ascontiguousarray(x[:, :, :shape[0], :shape[1]])})[0]

    np.testing.assert_allclose(run(got), run(need), rtol=1e-6, atol=1e-6)
