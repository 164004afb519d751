"""Valid models a user's exporter writes that the zoo does not: each compiled by the default dp
planner and by the per-layer search, and run exactly (2026-11-24's audit: unread outputs an op
must keep, opset 10's Pad, candidates that collapse into one, a count of the data folded into a
constant)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from bbgrap.backends.runtime import shapes_held
from onnx import TensorProto, helper, numpy_helper

from bbgrap.ir import BBGrapError
from bbgrap.plan import read_manifest
from tests.helpers import assert_exact, bbgrap_run, compile_plan, mpirun, run_plan, save

RNG = np.random.default_rng(7)


def weights(name: str, cout: int, cin: int) -> onnx.TensorProto:
    return numpy_helper.from_array((RNG.standard_normal((cout, cin, 3, 3)) * 0.3).astype(np.float32), name)


def conv_model(middle: list[onnx.NodeProto], opset: int, extra: list[onnx.TensorProto] = (), mid_channels: int = 4,
               inputs: list[onnx.ValueInfoProto] = ()) -> onnx.ModelProto:
    """x[1,3,9,10] (and `inputs`) → Conv 3→4 (pad 1) → `middle` (reading `a`, writing `m`) → Conv → y."""
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1] * 4), *middle,
             helper.make_node("Conv", ["m", "w2"], ["y"], pads=[1] * 4)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 10]), *inputs],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, "h", "w"])],
                              [weights("w1", 4, 3), weights("w2", 4, mid_channels), *extra])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def if_with_an_unread_output() -> onnx.ModelProto:
    """An If of two outputs (each branch: two) of which only the first is read."""
    def branch(first: str, second: str) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node(first, ["a"], ["o"]), helper.make_node(second, ["a"], ["o2"])], first, [],
                                 [helper.make_tensor_value_info(o, TensorProto.FLOAT, [1, 4, 9, 10]) for o in ("o", "o2")])
    middle = [helper.make_node("ReduceSum", ["a"], ["s"], keepdims=0),
              helper.make_node("Greater", ["s", "zero"], ["c"]),
              helper.make_node("If", ["c"], ["m", "unread"], then_branch=branch("Relu", "Sigmoid"), else_branch=branch("Neg", "Tanh"))]
    return conv_model(middle, 17, [numpy_helper.from_array(np.array(0, np.float32), "zero")])


def transposed_weights(name: str, cin: int, cout: int, k: int) -> onnx.TensorProto:
    return numpy_helper.from_array((RNG.standard_normal((cin, cout, k, k)) * 0.3).astype(np.float32), name)


MODELS = {
    # a U-Net's or decoder's upsampling (2026-11-24's audit: whole on one node, priced as an elementwise op)
    "conv-transpose": lambda: conv_model([helper.make_node("ConvTranspose", ["a", "wt", "bt"], ["u"], strides=[2, 2], pads=[1, 1, 1, 1]),
                                          helper.make_node("Relu", ["u"], ["r"]),
                                          helper.make_node("ConvTranspose", ["r", "wt2"], ["m"], strides=[3, 2], output_padding=[2, 1],
                                                           group=2)], 17,
                                         [transposed_weights("wt", 4, 4, 4), numpy_helper.from_array(RNG.standard_normal(4).astype(np.float32), "bt"),
                                          transposed_weights("wt2", 4, 2, 2)]),
    # torch.topk(x, k).values: TopK's indices unread, but an output the op must have
    "topk-values": lambda: conv_model([helper.make_node("TopK", ["a", "k"], ["m", "indices"], axis=1)], 17,
                                      [numpy_helper.from_array(np.array([3], np.int64), "k")], mid_channels=3),
    "if-unread-output": if_with_an_unread_output,
    # ZeroPad2d as opset 10 wrote it: pads an attribute
    "pad-opset10": lambda: conv_model([helper.make_node("Pad", ["a"], ["m"], pads=[0, 0, 1, 2, 0, 0, 2, 1])], 10),
    # every cut of a ReduceSum over no axes (noop_with_empty_axes) is the same plan
    "reducesum-noop": lambda: conv_model([helper.make_node("ReduceSum", ["a", "axes"], ["m"], noop_with_empty_axes=1)], 18,
                                         [numpy_helper.from_array(np.zeros(0, np.int64), "axes")]),
}


@pytest.mark.parametrize("planner", ["dp", "greedy"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_odd_model_compiles_and_runs_exactly(tmp_path, name: str, planner: str) -> None:
    path = save(MODELS[name](), str(tmp_path))
    for nodes in (2, 3):
        plan = str(tmp_path / f"plan{nodes}")
        compile_plan(path, plan, nodes=nodes, planner=planner, search=True)
        assert_exact(plan)


@pytest.mark.parametrize("direction", ["w", "c"])
def test_transposed_convolutions_are_cut_and_exact(tmp_path, direction: str) -> None:
    path = save(MODELS["conv-transpose"](), str(tmp_path))
    plan = str(tmp_path / "plan")
    compiled = compile_plan(path, plan, nodes=3, direction=direction)
    assert_exact(plan)
    cuts = {row.name: row.cut for row in compiled.compiled.layer_table if row.op_type == "ConvTranspose"}
    assert len(cuts) == 2 and all(c == direction for c in cuts.values()), cuts


def test_a_count_of_the_data_is_not_folded_into_a_constant(tmp_path) -> None:
    """x / (the number of positive elements of conv(x)): Shape(NonZero(.)) is a count of this input's
    values, which the frontend folded into a constant from its sample; the plan must compute it,
    so that another input (half of it zero) gives onnxruntime's result too."""
    middle = [helper.make_node("Relu", ["a"], ["r"]), helper.make_node("NonZero", ["r"], ["nz"]),
              helper.make_node("Shape", ["nz"], ["s"]), helper.make_node("Gather", ["s", "one"], ["count"]),
              helper.make_node("Cast", ["count"], ["c"], to=TensorProto.FLOAT), helper.make_node("Div", ["r", "c"], ["m"])]
    model = conv_model(middle, 17, [numpy_helper.from_array(np.array(1, np.int64), "one")])
    path = save(model, str(tmp_path))
    x = RNG.standard_normal((1, 3, 9, 10)).astype(np.float32)
    x[:, :, :5] = 0
    (expected,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for planner in ("dp", "greedy"):
        plan = str(tmp_path / planner)
        compile_plan(path, plan, nodes=2, planner=planner, search=True)
        assert_exact(plan)
        outputs, _ = run_plan(plan, {"x": x})
        (got,) = outputs.values()
        assert np.isfinite(got).all() and np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max(), planner


def pads_from_an_input() -> onnx.ModelProto:
    """A Pad whose pads are a second input: the shapes after it are the input's values'."""
    return conv_model([helper.make_node("Pad", ["a", "pads"], ["m"])], 13,
                      inputs=[helper.make_tensor_value_info("pads", TensorProto.INT64, [8])])


OTHER_PADS = {"x": RNG.standard_normal((1, 3, 9, 10)).astype(np.float32), "pads": np.array([0, 0, 1, 0, 0, 0, 0, 2], np.int64)}


@pytest.mark.parametrize("planner", ["dp", "greedy"])
def test_layers_shaped_by_the_input_values_are_whole_and_run_on_other_values(tmp_path, planner: str) -> None:
    """The Pad and the Conv after it (shapes from the pads' values, held at the sample's, whose
    pads are 0) are computed whole, the plan records them, and it runs exactly on other pads, as
    the one segment holding them computes the shapes itself (it failed with a traceback before)."""
    path = save(pads_from_an_input(), str(tmp_path))
    (expected,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, OTHER_PADS)
    plan = str(tmp_path / "plan")
    compile_plan(path, plan, nodes=2, planner=planner, search=True)
    assert read_manifest(plan).compiled.shapes_from_values == ("Pad_1", "Conv_2")
    assert_exact(plan)
    outputs, _ = run_plan(plan, OTHER_PADS)
    (got,) = outputs.values()
    assert got.shape == expected.shape == (1, 4, 10, 12) and np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()


def test_auto_pad_after_a_held_shape_follows_the_input(tmp_path) -> None:
    """A SAME-padded strided convolution and pool after the Pad: the frontend writes auto_pad as
    explicit pads for the sample's shape, which would be wrong for another; where the shape is the
    input's values' it keeps auto_pad, and the plan matches onnxruntime on other pads."""
    middle = [helper.make_node("Pad", ["a", "pads"], ["p"]),
              helper.make_node("Conv", ["p", "w3"], ["c"], auto_pad="SAME_UPPER", strides=[2, 2]),
              helper.make_node("MaxPool", ["c"], ["m"], kernel_shape=[2, 2], auto_pad="SAME_LOWER")]
    model = conv_model(middle, 13, [weights("w3", 4, 4)], inputs=[helper.make_tensor_value_info("pads", TensorProto.INT64, [8])])
    path = save(model, str(tmp_path))
    other = {**OTHER_PADS, "pads": np.array([0, 0, 1, 0, 0, 0, 0, 3], np.int64)}
    (expected,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, other)
    plan = str(tmp_path / "plan")
    compile_plan(path, plan, nodes=2, search=True, planner="dp")
    assert_exact(plan)
    (got,) = run_plan(plan, other)[0].values()
    assert got.shape == expected.shape and np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()


def test_a_failed_inference_is_one_line_only_where_the_plan_holds_shapes_of_values(tmp_path) -> None:
    path = save(pads_from_an_input(), str(tmp_path))
    compile_plan(path, str(tmp_path / "held"), nodes=2)
    with pytest.raises(BBGrapError, match=r"an inference failed \(boom\): 2 layer\(s\) .*depend on the input's values \(first: 'Pad_1'\)"):
        with shapes_held(read_manifest(str(tmp_path / "held"))):
            raise RuntimeError("boom")
    compile_plan(save(MODELS["topk-values"](), str(tmp_path), "topk"), str(tmp_path / "static"), nodes=2)
    with pytest.raises(RuntimeError, match="boom"):  # not the input's doing: an internal error, as before
        with shapes_held(read_manifest(str(tmp_path / "static"))):
            raise RuntimeError("boom")


def test_mpirun_refuses_an_input_that_changes_held_shapes_in_one_line(tmp_path) -> None:
    """Node 1 (three times as fast) computes the Pad and the Conv whole and sends y to rank 0, a
    message of the sample's size: other pads make it longer, MPI refuses it, and the rank says
    why in one line (with MPICH's own line for the abort) and exit status 2, not a traceback."""
    path = save(pads_from_an_input(), str(tmp_path))
    plan = str(tmp_path / "plan")
    compile_plan(path, plan, nodes=2, speeds=(1.0, 3.0), search=True)
    np.savez(tmp_path / "other.npz", **OTHER_PADS)
    proc = mpirun(2, plan, "--input", str(tmp_path / "other.npz"), "--repeat", "1", "--warmup", "0", timeout=120)
    assert proc.returncode == 2, proc.stderr
    ours = [ln for ln in proc.stderr.splitlines() if ln.startswith("bbgrap-run: error: ")]
    assert len(ours) == 1 and "depend on the input's values" in ours[0] and "Traceback" not in proc.stderr, proc.stderr


def test_fractions_for_an_integer_input_are_refused(tmp_path) -> None:
    """2026-11-24's audit: an --input of 0.7 for an int64 input was cast to 0 without a word, for the
    plan and for --check's reference alike; whole numbers in a float array still pass."""
    path = save(pads_from_an_input(), str(tmp_path))
    plan = str(tmp_path / "plan")
    compile_plan(path, plan, nodes=2)
    np.savez(tmp_path / "frac.npz", x=OTHER_PADS["x"], pads=np.full(8, 0.7))
    proc = bbgrap_run(plan, "--input", str(tmp_path / "frac.npz"), "--check", "--repeat", "1")
    assert proc.returncode == 2 and "'pads' holds fractions" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    np.savez(tmp_path / "whole.npz", x=OTHER_PADS["x"], pads=OTHER_PADS["pads"].astype(np.float64))
    assert bbgrap_run(plan, "--input", str(tmp_path / "whole.npz"), "--check", "--repeat", "1").returncode == 0
