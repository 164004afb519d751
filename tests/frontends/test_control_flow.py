"""Control-flow nodes (If, Loop) whose bodies read outer tensors by name (issue 12,
defect 9): lowering renames every tensor into per-region value names, so a body that
captures an outer value implicitly must still find it. Each model is compiled at 1 and 2
nodes and every plan must run and match onnxruntime on the original exactly."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from bbgrap.frontends.onnx import captured_inputs, import_proto
from helpers import assert_exact, compile_plan, save
from onnx import TensorProto, helper
from onnx_builder import graph_of, model_of, value_info

SHAPE = [1, 2, 8, 8]


def _vi(name: str, shape: list[int] = SHAPE) -> onnx.ValueInfoProto:
    return value_info(name, shape)


def _model(nodes: list[onnx.NodeProto], inits: dict[str, np.ndarray]) -> onnx.ModelProto:
    """x → Conv → c → ... → Conv → y, with the control flow in between (reading c)."""
    w = np.random.default_rng(0).standard_normal((2, 2, 3, 3)).astype(np.float32)
    head = helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1])
    tail = helper.make_node("Conv", ["z", "w"], ["y"], pads=[1, 1, 1, 1])
    return model_of(graph_of([head, *nodes, tail], [_vi("x")], [_vi("y")], {"w": w, **inits}), full_check=True)


def if_model(scalar_condition: bool = False) -> onnx.ModelProto:
    """An If whose branches read the outer activation `c`, the outer weight `w` and the
    graph input `x`, none of them passed as inputs; the condition depends on the data."""
    shape = [] if scalar_condition else [1, 1, 1, 1]
    nodes = [
        helper.make_node("ReduceSum", ["c"], ["s"], keepdims=0 if scalar_condition else 1),
        helper.make_node("Greater", ["s", "zero"], ["cond"]),
    ]
    then_g = graph_of(
        [helper.make_node("Conv", ["c", "w"], ["t0"], pads=[1, 1, 1, 1]), helper.make_node("Add", ["t0", "x"], ["t"])],
        [], [_vi("t")], name="then")
    else_g = graph_of([helper.make_node("Neg", ["c"], ["e"])], [], [_vi("e")], name="else")
    nodes.append(helper.make_node("If", ["cond"], ["z"], then_branch=then_g, else_branch=else_g))
    return _model(nodes, {"zero": np.zeros(shape, np.float32)})


def loop_model() -> onnx.ModelProto:
    """A Loop of 3 iterations whose body adds the outer activation `c` to its carried
    value, with an If nested in the body that reads `c` too (two scopes out)."""
    inner_then = graph_of([helper.make_node("Mul", ["v1", "c"], ["m"])], [], [_vi("m")], name="inner_then")
    inner_else = graph_of([helper.make_node("Sub", ["v1", "c"], ["d"])], [], [_vi("d")], name="inner_else")
    body = graph_of(
        [
            helper.make_node("Add", ["v_in", "c"], ["v1"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("If", ["cond_in"], ["v_out"], then_branch=inner_then, else_branch=inner_else),
        ],
        [value_info("i", [], TensorProto.INT64), value_info("cond_in", [], TensorProto.BOOL), _vi("v_in")],
        [value_info("cond_out", [], TensorProto.BOOL), _vi("v_out")],
        name="body",
    )
    nodes = [helper.make_node("Loop", ["trips", "", "c"], ["z"], body=body)]
    return _model(nodes, {"trips": np.array(3, np.int64)})


def scan_model() -> onnx.ModelProto:
    """A Scan over the rows of `c` whose body adds the outer activation `m` (c's mean over
    rows), read by name."""
    row = [1, 2, 8]
    body = graph_of([helper.make_node("Add", ["row_in", "m"], ["row_out"])], [_vi("row_in", row)], [_vi("row_out", row)], name="body")
    nodes = [
        helper.make_node("ReduceMean", ["c"], ["m"], axes=[2], keepdims=0),
        helper.make_node("Scan", ["c"], ["z"], body=body, num_scan_inputs=1, scan_input_axes=[2], scan_output_axes=[2]),
    ]
    return _model(nodes, {})


def test_captured_names_are_found_in_nested_bodies() -> None:
    loop = next(n for n in loop_model().graph.node if n.op_type == "Loop")
    assert captured_inputs(loop) == ("c",)  # body's own inputs and outputs are not captured
    iff = next(n for n in if_model().graph.node if n.op_type == "If")
    assert captured_inputs(iff) == ("c", "w", "x")
    graph = import_proto(if_model()).graph
    layer = next(la for la in graph.layers if la.op_type == "If")
    assert layer.captured == ("c", "w", "x") and layer.explicit_inputs == ("cond",) and layer.group == "opaque"


@pytest.mark.parametrize("build", [if_model, loop_model, scan_model], ids=["if", "loop", "scan"])
@pytest.mark.parametrize("nodes", [1, 2])
def test_control_flow_reading_outer_tensors_runs_exactly(tmp_path, build, nodes: int) -> None:
    path = save(build(), str(tmp_path))
    compile_plan(path, str(tmp_path / "plan"), nodes=nodes)
    assert_exact(str(tmp_path / "plan"))


def test_scalar_region_can_be_empty() -> None:
    """A scalar's region has no axis to be empty along; `empty_like(0)` must still be empty,
    or a scalar layer computed whole on node 0 would seem computed on every node."""
    from bbgrap.ir import ShapeMap

    void, whole = ShapeMap.empty_like(0), ShapeMap.full(())
    assert void.empty and void.volume == 0 and not whole.empty and whole.volume == 1
    assert whole.contains(void) and not void.contains(whole)
    assert whole.intersect(void).empty and void.intersect(whole).empty and whole.intersect(whole) == whole


def test_scalar_condition_runs_exactly(tmp_path) -> None:
    path = save(if_model(scalar_condition=True), str(tmp_path))
    compile_plan(path, str(tmp_path / "plan"), nodes=2)
    assert_exact(str(tmp_path / "plan"))


def test_weight_before_a_received_input_stays_with_its_op(tmp_path) -> None:
    """Einsum(W, c) cut along its rows i reads every row j of `c`, so each node receives the other's
    half of `c`: the wait for it must not split the op from its weight W, bound first (found by
    the fuzz test, with an If whose constant condition came before a captured tensor, when Einsum
    had no rule and ran whole on node 0)."""
    mat = np.random.default_rng(1).standard_normal((8, 8)).astype(np.float32)
    model = _model([helper.make_node("Einsum", ["mat", "c"], ["z"], equation="ij,ncjk->ncik")], {"mat": mat})
    path = save(model, str(tmp_path))
    compile_plan(path, str(tmp_path / "plan"), nodes=2, optimize=False)  # naive: `c` is computed on both nodes
    assert_exact(str(tmp_path / "plan"))


def test_if_with_constant_condition_reading_a_received_tensor(tmp_path) -> None:
    """An If whose only activation is captured (its condition is a weight) and split over
    both nodes: the captured tensor must be gathered before it is bound."""
    then_g = graph_of([helper.make_node("Relu", ["c"], ["t"])], [], [_vi("t")], name="then")
    else_g = graph_of([helper.make_node("Neg", ["c"], ["e"])], [], [_vi("e")], name="else")
    model = _model([helper.make_node("If", ["cond"], ["z"], then_branch=then_g, else_branch=else_g)], {"cond": np.array([True])})
    path = save(model, str(tmp_path))
    compile_plan(path, str(tmp_path / "plan"), nodes=2, optimize=False)  # naive: `c` is computed on both nodes
    assert_exact(str(tmp_path / "plan"))
