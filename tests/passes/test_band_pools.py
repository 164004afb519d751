"""band-pools: which global pools it rewrites, that the rewrite computes the same pool (run in
onnxruntime), and that a squeeze-excite block's map then stays where it is, exactly."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from bbgrap.frontends.onnx import import_proto
from bbgrap.passes.band_pools import BANDS_SUFFIX, BandPools
from bbgrap.passes.naive_partition import NaivePartition
from helpers import assert_exact, compile_plan, save
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx_builder import build_model

from bbgrap.ir import Graph
from bbgrap.pass_manager import PassError
from bbgrap.plan import read_manifest
from tests.passes.test_plan_network import squeeze_excite_net


def pool_graph(channels: int, height: int, width: int) -> Graph:
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("GlobalAveragePool", ["r"], ["p"], name="pool")]
    return import_proto(build_model(nodes, {"x": [1, channels, height, width]}, {}, ["p"], 17), "pool").graph


def reduce_mean_graph(opset: int, axes: list[int], keepdims: int = 1) -> Graph:
    """A ReduceMean over `axes` of a 1 x 8 x 12 x 10 map, its axes an attribute (opset 13) or a
    constant input (opset 18), as the exporters write a global pool."""
    if opset >= 18:
        node = helper.make_node("ReduceMean", ["r", "axes"], ["p"], name="pool", keepdims=keepdims)
        consts = {"axes": np.array(axes, np.int64)}
    else:
        node = helper.make_node("ReduceMean", ["r"], ["p"], name="pool", axes=axes, keepdims=keepdims)
        consts = {}
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"), node]
    return import_proto(build_model(nodes, {"x": [1, 8, 12, 10]}, consts, ["p"], opset), "pool").graph


@pytest.mark.parametrize(("opset", "axes"), [(13, [2, 3]), (18, [-2, -1]), (18, [3, 2])])
def test_a_reduce_mean_over_rows_and_columns_is_a_global_pool_too(opset: int, axes: list[int]) -> None:
    graph = BandPools(2)(reduce_mean_graph(opset, axes)).graph
    assert [layer.op_type for layer in graph.layers] == ["Relu", "AveragePool", "GlobalAveragePool"]
    assert graph.layer("pool").inputs == ("r",) and graph.layer("pool").attrs == {"kernel_shape": [6, 10], "strides": [6, 10]}


@pytest.mark.parametrize(("axes", "keepdims"), [([2, 3], 0), ([1, 2, 3], 1), ([3], 1)])
def test_a_reduce_mean_that_is_not_a_global_pool_keeping_its_axes_is_left(axes: list[int], keepdims: int) -> None:
    assert not BandPools(2)(reduce_mean_graph(13, axes, keepdims)).modified


def test_a_reduce_mean_of_integers_is_left() -> None:
    """AveragePool takes no integers; ReduceMean does."""
    nodes = [helper.make_node("Cast", ["x"], ["r"], name="cast", to=TensorProto.INT32),
             helper.make_node("ReduceMean", ["r"], ["p"], name="pool", axes=[2, 3], keepdims=1)]
    graph = import_proto(build_model(nodes, {"x": [1, 8, 12, 10]}, {}, ["p"], 13), "ints").graph
    assert graph.tensors["r"].dtype == "int32"
    assert not BandPools(2)(graph).modified


def test_a_quantized_models_fused_pool_is_left() -> None:
    """A pool with a QuantizeLinear after it (Layer.fused): onnxruntime's integer kernel rounds the
    mean, and the mean of N rounded band means is not the rounded mean."""
    consts = {"s": np.array(0.01, np.float32), "z": np.array(3, np.uint8)}
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("GlobalAveragePool", ["r"], ["p"], name="pool"),
             helper.make_node("QuantizeLinear", ["p", "s", "z"], ["q"], name="quantize")]
    graph = import_proto(build_model(nodes, {"x": [1, 8, 12, 10]}, consts, ["q"], 17), "quantized").graph
    assert graph.layer("pool").fused is not None and graph.tensors[graph.layer("pool").inputs[0]].dtype == "float32"
    assert not BandPools(2)(graph).modified


def test_a_pool_over_rows_that_split_evenly_becomes_a_pool_of_bands() -> None:
    graph = BandPools(2)(pool_graph(8, 12, 10)).graph
    assert [(layer.name, layer.op_type) for layer in graph.layers] == [("relu", "Relu"), ("pool", "AveragePool"),
                                                                        (f"pool{BANDS_SUFFIX}", "GlobalAveragePool")]
    band = graph.layer("pool")
    assert band.attrs == {"kernel_shape": [6, 10], "strides": [6, 10]}
    assert graph.tensors[band.outputs[0]].shape == (1, 8, 2, 1)
    assert graph.layer(f"pool{BANDS_SUFFIX}").outputs == ("p",)  # the model's output keeps its name
    assert BandPools(4)(pool_graph(8, 12, 10)).graph.layer("pool").attrs["kernel_shape"] == [3, 10]


@pytest.mark.parametrize(("nodes", "height", "keep"), [(1, 12, ()), (3, 10, ()), (4, 6, ()), (2, 12, ("pool",))])
def test_a_pool_is_left_whole_where_its_rows_do_not_split_into_bands_of_two_or_more(nodes: int, height: int, keep: tuple[str, ...]) -> None:
    graph = pool_graph(8, height, 10)
    result = BandPools(nodes, frozenset(keep))(graph)
    assert not result.modified and result.graph is graph


def test_it_runs_before_partitioning_only() -> None:
    graph = NaivePartition(2)(pool_graph(8, 12, 10)).graph
    with pytest.raises(PassError, match="before naive-partition"):
        BandPools(2)(graph)


@settings(max_examples=25, deadline=None)
@given(nodes=st.integers(2, 4), rows=st.integers(2, 5), width=st.integers(1, 9), channels=st.integers(1, 6), seed=st.integers(0, 99))
def test_the_pool_of_bands_is_the_global_pool(nodes: int, rows: int, width: int, channels: int, seed: int) -> None:
    """The rewritten layers, run in onnxruntime, give the global pool's output (eq. in the module docstring)."""
    graph = BandPools(nodes)(pool_graph(channels, rows * nodes, width)).graph
    band, mean = graph.layers[1], graph.layers[2]
    nodes_ = [helper.make_node(band.op_type, list(band.inputs), list(band.outputs), **band.attrs),
              helper.make_node(mean.op_type, list(mean.inputs), list(mean.outputs))]
    model = build_model(nodes_, {"r": [1, channels, rows * nodes, width]}, {}, ["p"], 17)
    x = np.random.default_rng(seed).standard_normal((1, channels, rows * nodes, width)).astype(np.float32) * 10
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"r": x})[0]
    np.testing.assert_allclose(got, x.mean(axis=(2, 3), keepdims=True), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("nodes", [2, 4])
@pytest.mark.parametrize("planner", ["greedy", "dp"])
def test_a_squeeze_excite_map_stays_on_its_nodes_and_the_plan_is_exact(tmp_path, nodes: int, planner: str) -> None:
    """Each node pools its own rows of the map: the band pool is cut along rows, one band per node,
    and no row of the map crosses nodes (before, each node received the others' rows of it to pool
    the whole map). Without recompute-halos, which may still trade the bands' receive point for
    receiving the map where its cost model says a receive point costs more than the bytes."""
    model = save(squeeze_excite_net(), str(tmp_path), "se")
    plan_dir = str(tmp_path / "plan")
    compile_plan(model, plan_dir, nodes=nodes, search=True, planner=planner, judge=False, recompute=False)
    assert_exact(plan_dir)
    rows = {r.name: r for r in read_manifest(plan_dir).compiled.layer_table}
    assert rows["se_pool"].op_type == "AveragePool" and rows["se_pool"].cut == "h"
    assert [n.range for n in rows["se_pool"].per_node] == [(k, k + 1) for k in range(nodes)]
    assert rows["conv1"].bytes_sent == 0  # the map: read by the band pool and the scale, each node its own rows
    with_recompute = str(tmp_path / "recompute")
    compile_plan(model, with_recompute, nodes=nodes, search=True, planner=planner, judge=False)
    assert_exact(with_recompute)


def test_three_nodes_keep_the_global_pool_of_56_rows(tmp_path) -> None:
    model = save(squeeze_excite_net(), str(tmp_path), "se")
    compile_plan(model, str(tmp_path / "plan"), nodes=3, search=True, planner="dp", judge=False)
    assert_exact(str(tmp_path / "plan"))
    rows = {r.name: r for r in read_manifest(str(tmp_path / "plan")).compiled.layer_table}
    assert rows["se_pool"].op_type == "GlobalAveragePool" and f"se_pool{BANDS_SUFFIX}" not in rows
