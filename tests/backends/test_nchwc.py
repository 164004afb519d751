"""Segment boundaries in onnxruntime's blocked layout: the layout helpers against
onnxruntime's own reorder, each fold on hand-built segments (and that it fires), the
guards that keep NCHW, and compiled plans that stay exact with blocked boundaries."""

from __future__ import annotations

import os
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from bbgrap.backends import nchwc
from bbgrap.backends.engine import boundary_block, load_runner, load_segment, node_layouts, session_options
from helpers import assert_exact, compile_plan, save
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper
from onnx_builder import graph_of, model_of, value_info

from bbgrap import zoo
from bbgrap.plan import read_manifest

BLOCK = nchwc.block_size()
needs_nchwc = pytest.mark.skipif(BLOCK == 0, reason="this onnxruntime build has no NCHWc kernels (not x86-64)")


def options() -> ort.SessionOptions:
    return session_options(1, spin=False)


def model(nodes: list[onnx.NodeProto], inputs: dict[str, list[int]], outputs: list[str],
          weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    graph = graph_of(nodes, [value_info(n, s) for n, s in inputs.items()], [value_info(n) for n in outputs], weights, "segment")
    return onnx.shape_inference.infer_shapes(model_of(graph, {"": 17}, ir_version=9, check=False))  # outputs of unknown rank


def run_plain(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(m.SerializeToString(), options(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in m.graph.output], session.run(None, feeds)))


def run_blocked(m: onnx.ModelProto, feeds: dict[str, np.ndarray], keep: set[str] = frozenset()
                ) -> tuple[dict[str, np.ndarray], onnx.ModelProto]:
    """The segment with blocked boundaries, fed and read through numpy's reorder."""
    blocked = nchwc.boundary_values(m, set(keep), BLOCK)
    folded = nchwc.blocked_model(m, blocked, BLOCK, options)
    assert_topological(folded)
    opts = options()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(folded.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    got = session.run(None, {k: nchwc.to_blocked(v, BLOCK) if k in blocked else v for k, v in feeds.items()})
    names = [o.name for o in folded.graph.output]
    return {n: nchwc.from_blocked(v, BLOCK) if n in blocked else v for n, v in zip(names, got)}, folded


def assert_topological(m: onnx.ModelProto) -> None:
    """Every node reads only graph inputs, constants and earlier nodes' outputs (as ONNX requires)."""
    known = {"", *(i.name for i in m.graph.input), *(i.name for i in m.graph.initializer)}
    for node in m.graph.node:
        missing = [name for name in node.input if name not in known]
        assert not missing, f"{node.op_type} reads {missing} before they are made"
        known.update(node.output)


def ops(m: onnx.ModelProto) -> Counter[str]:
    return Counter(n.op_type for n in m.graph.node)


def conv_weights(rng: np.random.Generator, c: int, k: int) -> np.ndarray:
    return (rng.standard_normal((c, c, k, k)) / (c * k)).astype(np.float32)


def residual_segment(c: int, rows: tuple[int, int], width: int, cut_row: int, axis: int = 2,
                     rng: np.random.Generator | None = None) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """What lowering makes of a bottleneck's tail at a receive point: the local rows and a
    received halo joined (along `axis`), a 3x3 convolution, the residual added, Relu; the
    block's output goes on, and one row of it (from `cut_row`) is cropped to send."""
    rng = rng or np.random.default_rng(0)
    h = rows[0] + rows[1] if axis == 2 else rows[0]
    w = width if axis == 2 else width + rows[1]
    shapes = {"own": [1, c, rows[0], width], "halo": [1, c, rows[1], width] if axis == 2 else [1, c, rows[0], rows[1]]}
    out_h, out_w = (h - 2, w) if axis == 2 else (h, w - 2)
    shapes["residual"] = [1, c, out_h, out_w]
    pads = [0, 1, 0, 1] if axis == 2 else [1, 0, 1, 0]
    starts, ends = np.array([cut_row]), np.array([cut_row + 1])
    nodes = [
        helper.make_node("Concat", ["own", "halo"], ["joined"], axis=axis),
        helper.make_node("Conv", ["joined", "w3"], ["conv"], pads=pads),
        helper.make_node("Conv", ["conv", "w1", "b1"], ["conv1"]),
        helper.make_node("Add", ["conv1", "residual"], ["sum"]),
        helper.make_node("Relu", ["sum"], ["out"]),
        helper.make_node("Slice", ["out", "starts", "ends", "axes"], ["row"]),
    ]
    weights = {"w3": conv_weights(rng, c, 3), "w1": conv_weights(rng, c, 1),
               "b1": rng.standard_normal(c).astype(np.float32), "starts": starts.astype(np.int64),
               "ends": ends.astype(np.int64), "axes": np.array([axis], np.int64)}
    m = model(nodes, shapes, ["out", "row"], {k: v for k, v in weights.items()})
    feeds = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    return m, feeds


def test_agreed_block_needs_every_rank_on_the_same_block() -> None:
    assert nchwc.agreed_block([16, 16, 16]) == 16
    assert nchwc.agreed_block([16, 8]) == 0  # different CPUs: NCHW everywhere
    assert nchwc.agreed_block([16, 0]) == 0  # one rank on a GPU
    assert nchwc.agreed_block([0]) == 0


def test_layout_flag_and_provider_choose_the_block() -> None:
    assert boundary_block("nchw", "cpu", 0) == 0
    assert boundary_block("auto", "cpu", 0) == BLOCK


@needs_nchwc
def test_numpy_reorder_matches_onnxruntime() -> None:
    x = np.random.default_rng(1).standard_normal((2, 2 * BLOCK, 3, 5)).astype(np.float32)
    reorder = helper.make_node("ReorderInput", ["x"], ["y"], domain=nchwc.DOMAIN)
    m = model_of(graph_of([reorder], [value_info("x", x.shape)], [value_info("y")]), {"": 17, nchwc.DOMAIN: 1}, ir_version=9, check=False)
    got = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, nchwc.to_blocked(x, BLOCK))
    np.testing.assert_array_equal(nchwc.from_blocked(got, BLOCK), x)


@needs_nchwc
def test_residual_segment_folds_every_reorder_and_stays_exact() -> None:
    m, feeds = residual_segment(2 * BLOCK, (5, 1), 6, cut_row=3)
    got, folded = run_blocked(m, feeds)
    want = run_plain(m, feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5)
    count = ops(folded)
    assert count["ReorderInput"] == 0 and count["ReorderOutput"] == 0, count
    assert count["Add"] == 0 and count["Relu"] == 0, count  # fused into the blocked convolution
    fused = [n for n in folded.graph.node if n.op_type == "Conv" and len(n.input) == 4]
    assert len(fused) == 1 and any(a.name == "activation" for a in fused[0].attribute)


@needs_nchwc
@settings(max_examples=25, deadline=None)
@given(blocks=st.integers(1, 3), own=st.integers(2, 6), halo=st.integers(1, 3), width=st.integers(3, 9),
       axis=st.sampled_from([2, 3]), data=st.data())
def test_blocked_boundaries_equal_nchw(blocks: int, own: int, halo: int, width: int, axis: int, data) -> None:
    rows = (own, halo)
    out_extent = (own + halo - 2) if axis == 2 else (width + halo - 2)
    cut = data.draw(st.integers(0, out_extent - 1))
    m, feeds = residual_segment(blocks * BLOCK, rows, width, cut_row=cut, axis=axis, rng=np.random.default_rng(cut))
    got, folded = run_blocked(m, feeds)
    want = run_plain(m, feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5)
    assert ops(folded)["ReorderOutput"] == 0


@needs_nchwc
def test_channel_concat_broadcast_add_and_kept_values_stay_nchw_where_needed() -> None:
    # a Concat along channels, an Add that broadcasts, and a model output in `keep`: the
    # folds must leave the reorders they need, and the result must not change
    rng = np.random.default_rng(2)
    c = BLOCK
    nodes = [
        helper.make_node("Concat", ["a", "b"], ["cat"], axis=1),
        helper.make_node("Conv", ["cat", "w"], ["conv"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["conv", "bias"], ["biased"]),
        helper.make_node("Relu", ["biased"], ["out"]),
        helper.make_node("Flatten", ["out"], ["flat"]),
    ]
    m = model(nodes, {"a": [1, c, 4, 4], "b": [1, c, 4, 4], "bias": [1, 2 * c, 1, 1]}, ["out", "flat"],
              {"w": conv_weights(rng, 2 * c, 3)})
    feeds = {"a": rng.standard_normal((1, c, 4, 4)).astype(np.float32),
             "b": rng.standard_normal((1, c, 4, 4)).astype(np.float32),
             "bias": rng.standard_normal((1, 2 * c, 1, 1)).astype(np.float32)}
    for keep in (set(), {"out"}):
        got, folded = run_blocked(m, feeds, keep)
        want = run_plain(m, feeds)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5)
        assert ("out" in nchwc.boundary_values(m, keep, BLOCK)) == (not keep)


@needs_nchwc
@pytest.mark.parametrize("lo, hi", [(1, 3), (1, 2), (0, 1)])  # in blocks; the last case also cuts half a block
def test_channel_split_slice_and_concat_fold_on_whole_blocks(lo: int, hi: int) -> None:
    # the tail of a channel-cut plan: a received tensor split by channels, parts joined again,
    # and a range of channels cropped to send; the crop folds only on whole blocks
    rng = np.random.default_rng(lo * 10 + hi)
    c = 4 * BLOCK
    half_block = lo == 0
    starts, ends = (np.array([lo * BLOCK]), np.array([hi * BLOCK - BLOCK // 2 if half_block else hi * BLOCK]))
    nodes = [
        helper.make_node("Split", ["x", "sizes"], ["p", "q"], axis=1),
        helper.make_node("Relu", ["p"], ["rp"]),
        helper.make_node("Concat", ["q", "rp", "y"], ["joined"], axis=1),
        helper.make_node("Conv", ["joined", "w"], ["out"], pads=[1, 1, 1, 1]),
        helper.make_node("Slice", ["joined", "starts", "ends", "axes"], ["part"]),
    ]
    m = model(nodes, {"x": [1, c, 3, 4], "y": [1, BLOCK, 3, 4]}, ["out", "part"],
              {"sizes": np.array([BLOCK, c - BLOCK], np.int64), "w": conv_weights(rng, c + BLOCK, 3),
               "starts": starts.astype(np.int64), "ends": ends.astype(np.int64), "axes": np.array([1], np.int64)})
    feeds = {"x": rng.standard_normal((1, c, 3, 4)).astype(np.float32), "y": rng.standard_normal((1, BLOCK, 3, 4)).astype(np.float32)}
    got, folded = run_blocked(m, feeds)
    want = run_plain(m, feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5)
    assert nchwc.boundary_values(m, set(), BLOCK) == {"x", "y", "out"} | (set() if half_block else {"part"})
    assert ops(folded)["ReorderOutput"] == int(half_block), ops(folded)  # half a block: the crop runs on NCHW


@needs_nchwc
@pytest.mark.parametrize("case", ["blocks and rows", "half a block in"])
def test_channel_slice_bounds_in_blocks(case: str) -> None:
    # channel blocks and rows at once run on the 5-D view, channels counted in blocks; a whole
    # block's worth of channels starting half a block in cannot, and stays NCHW
    moved = case == "blocks and rows"
    lo, hi, axes = ([BLOCK, 1], [3 * BLOCK, 3], [1, 2]) if moved else ([BLOCK // 2], [BLOCK + BLOCK // 2], [1])
    rng = np.random.default_rng(7)
    m = model([helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["y"]),
               helper.make_node("Conv", ["y", "w"], ["z"], pads=[1, 1, 1, 1])],
              {"x": [1, 4 * BLOCK, 4, 3]}, ["z"],
              {"starts": np.array(lo, np.int64), "ends": np.array(hi, np.int64), "axes": np.array(axes, np.int64),
               "w": conv_weights(rng, hi[0] - lo[0], 3)})
    feeds = {"x": rng.standard_normal((1, 4 * BLOCK, 4, 3)).astype(np.float32)}
    got, folded = run_blocked(m, feeds)
    np.testing.assert_allclose(got["z"], run_plain(m, feeds)["z"], rtol=1e-5, atol=1e-5)
    assert (ops(folded)["ReorderOutput"] == 0) == moved, ops(folded)


@needs_nchwc
def test_add_after_an_activation_does_not_fuse_into_the_convolution() -> None:
    # Relu(Conv(x)) + r is not Relu(Conv(x) + r): the Add must stay a blocked Add
    rng = np.random.default_rng(4)
    c = BLOCK
    nodes = [helper.make_node("Conv", ["x", "w"], ["conv"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["conv"], ["act"]),
             helper.make_node("Add", ["act", "r"], ["out"])]
    m = model(nodes, {"x": [1, c, 4, 4], "r": [1, c, 4, 4]}, ["out"], {"w": conv_weights(rng, c, 3)})
    feeds = {k: rng.standard_normal((1, c, 4, 4)).astype(np.float32) for k in ("x", "r")}
    got, folded = run_blocked(m, feeds)
    np.testing.assert_allclose(got["out"], run_plain(m, feeds)["out"], rtol=1e-5, atol=1e-5)
    assert ops(folded)["Add"] == 1 and ops(folded)["ReorderOutput"] == 0, ops(folded)


@needs_nchwc
def test_an_input_passed_through_as_an_output_stays_as_it_came() -> None:
    m = model([helper.make_node("Relu", ["x"], ["y"])], {"x": [1, BLOCK, 2, 3]}, ["x", "y"], {})
    x = np.random.default_rng(5).standard_normal((1, BLOCK, 2, 3)).astype(np.float32)
    got, _ = run_blocked(m, {"x": x})
    np.testing.assert_array_equal(got["x"], x)
    np.testing.assert_array_equal(got["y"], np.maximum(x, 0))


def test_merged_votes_need_every_segment_on_every_node() -> None:
    merged = nchwc.merged_votes([{"a": True, "b": True}, {"b": False, "c": True}, {"a": True}])
    assert merged == {"a": True, "b": False, "c": True}


@needs_nchwc
def test_votes_keep_a_value_nchw_where_a_reader_takes_it_in_nchw() -> None:
    # segment 0 makes y with a convolution (blocked for free); segment 1 reads it in a
    # BatchNormalization, which onnxruntime runs in NCHW here: y crosses in NCHW, x stays blocked
    rng = np.random.default_rng(6)
    c = BLOCK
    first = model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], {"x": [1, c, 4, 4]}, ["y"],
                  {"w": conv_weights(rng, c, 3)})
    ones, zeros = np.ones(c, np.float32), np.zeros(c, np.float32)
    second = model([helper.make_node("BatchNormalization", ["y", "s", "b", "m", "v"], ["z"])], {"y": [1, c, 4, 4]}, ["z"],
                   {"s": ones * 2, "b": zeros + 1, "m": zeros, "v": ones})
    layout = nchwc.NodeLayout([lambda: first, lambda: second], set(), BLOCK, options)
    assert layout.votes == {"x": True, "y": False, "z": False}
    layout.agree([layout.votes])
    assert layout.agreed == {"x"}
    assert layout.model(1) is None  # nothing of the second segment stays blocked: it runs as it is
    kept = layout.model(0)
    assert ops(kept)["ReorderInput"] == 0 and ops(kept)["ReorderOutput"] == 1  # x read blocked, y handed over in NCHW
    x = rng.standard_normal((1, c, 4, 4)).astype(np.float32)
    opts = options()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    y = ort.InferenceSession(kept.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, {"x": nchwc.to_blocked(x, BLOCK)})[0]
    np.testing.assert_allclose(y, run_plain(first, {"x": x})["y"], rtol=1e-5, atol=1e-5)


@needs_nchwc
def test_layout_keeps_folded_segments_on_disk_until_closed() -> None:
    # the folded segments' weights wait in files, not in memory, until the sessions are built
    rng = np.random.default_rng(7)
    c = BLOCK
    weights = conv_weights(rng, c, 3)
    first = model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], {"x": [1, c, 4, 4]}, ["y"], {"w": weights})
    loaded: list[int] = []

    def load() -> onnx.ModelProto:
        loaded.append(0)
        return first

    layout = nchwc.NodeLayout([load], set(), BLOCK, options)
    assert loaded == [0]  # each segment read once, when it is laid out
    path = layout.folded[0]
    assert path is not None and os.path.isfile(path)
    on_disk = onnx.load(path, load_external_data=False)
    big = [t for t in on_disk.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert big and not any(t.raw_data for t in big)  # the weights are in the file beside it
    layout.agree([layout.votes])
    assert layout.agreed == {"x", "y"}  # read and made by the blocked convolution itself
    kept = layout.model(0)
    assert kept is not None and layout.path(0) == path
    x = rng.standard_normal((1, c, 4, 4)).astype(np.float32)
    opts = options()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    layout.close()
    assert not os.path.exists(os.path.dirname(path))
    y = session.run(None, {"x": nchwc.to_blocked(x, BLOCK)})[0]  # the session kept what it read
    expected = run_plain(first, {"x": x})["y"]
    np.testing.assert_allclose(nchwc.from_blocked(y, BLOCK), expected, rtol=1e-5, atol=1e-5)


@needs_nchwc
def test_channels_off_the_block_stay_nchw() -> None:
    m = model([helper.make_node("Relu", ["x"], ["y"])], {"x": [1, BLOCK + 4, 2, 2]}, ["y"], {})
    assert nchwc.boundary_values(m, set(), BLOCK) == set()
    m = model([helper.make_node("Relu", ["x"], ["y"])], {"x": [1, BLOCK, 2, 2]}, ["y"], {})
    assert nchwc.boundary_values(m, set(), BLOCK) == {"x", "y"}
    assert nchwc.boundary_values(m, {"x"}, BLOCK) == {"y"}


@needs_nchwc
@pytest.mark.parametrize("direction", ["h", "w", "c"])
def test_compiled_resnet_with_blocked_boundaries_is_exact(tmp_path, direction: str) -> None:
    path = save(zoo.build("resnet50", resolution=64, width=0.25, seed=3), str(tmp_path))
    compile_plan(path, str(tmp_path / "plan"), nodes=2, direction=direction)
    assert_exact(str(tmp_path / "plan"), layout="auto")
    assert_exact(str(tmp_path / "plan"), layout="nchw")
    manifest = read_manifest(str(tmp_path / "plan"))
    layouts = node_layouts(str(tmp_path / "plan"), manifest, [0, 1], 1, False, BLOCK)
    plan_dir = str(tmp_path / "plan")

    def reorders(model: onnx.ModelProto) -> list[str]:
        return [n.input[0] for n in model.graph.node if n.op_type in ("ReorderInput", "ReorderOutput")]

    as_nchw = [reorders(nchwc.optimized(load_segment(plan_dir, s.file), options())) for s in manifest.programs[0].segments]
    as_run = [reorders(m) if (m := layouts[0].model(k)) is not None else r for k, r in enumerate(as_nchw)]
    blocked = [k for k in range(len(as_nchw)) if layouts[0].path(k) is not None]
    runner = load_runner(plan_dir, manifest, 0, 1, "cpu", spin=False, layout=layouts[0])
    assert runner.block == BLOCK and blocked
    with pytest.raises(AssertionError, match="released"):  # the runner's sessions took the layout's files
        layouts[0].path(blocked[0])
    if direction == "h":
        # rows cut up to the 4x4 stage, channels after it: the boundaries between convolutions
        # are blocked and folded; what is left reorders the last block's output for the
        # classifier's pool, which reads it in NCHW
        left = [name for r in as_run for name in r]
        assert len(left) * 4 < sum(map(len, as_nchw)), (left, as_nchw)
        assert all(name.startswith(("layer4.1.relu@", "layer4.2.relu@", "reorder_token")) for name in left), left
