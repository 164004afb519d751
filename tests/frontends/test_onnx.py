"""The ONNX frontend on models as real exporters write them: every one compiled,
partitioned, run and compared with onnxruntime on the original."""

from __future__ import annotations

import models
import numpy as np
import pytest
from bbgrap.frontends.onnx import import_proto, parse_input_shapes
from helpers import assert_exact, bbgrap_run, compile_plan, save

from bbgrap.ir import BBGrapError


@pytest.mark.parametrize("opset", range(9, 22))
def test_every_opset_from_9_to_21(tmp_path, opset: int) -> None:
    path = save(models.opset(opset), str(tmp_path))
    compile_plan(path, str(tmp_path / "plan"), nodes=3, direction="h")
    assert_exact(str(tmp_path / "plan"))


@pytest.mark.parametrize("name", ["legacy_opset9", "legacy_opset8", "constant_weight_chain", "unknown_ops", "auto_pad_same"])
@pytest.mark.parametrize("direction", ["h", "w"])
def test_exported_models_run_exactly(tmp_path, name: str, direction: str) -> None:
    path = save(getattr(models, name)(), str(tmp_path))
    compile_plan(path, str(tmp_path / "plan"), nodes=2, direction=direction)
    assert_exact(str(tmp_path / "plan"))


def test_initializers_listed_as_inputs_are_weights() -> None:
    model = models.legacy_opset9()
    inits = {i.name for i in model.graph.initializer}
    assert inits & {i.name for i in model.graph.input}, "fixture should list initializers as inputs"
    graph = import_proto(model).graph
    assert not set(graph.inputs) & inits
    assert set(graph.constants) <= inits | set(graph.constants)


def test_constant_subgraphs_are_folded() -> None:
    graph = import_proto(models.constant_weight_chain()).graph
    ops = {layer.op_type for layer in graph.layers}
    assert not ops & {"Constant", "ConstantOfShape", "Reshape", "Unsqueeze", "Mul"} or "Conv" in ops
    for layer in graph.layers:
        if layer.op_type == "Conv":
            assert layer.inputs[1] in graph.constants, "conv weight should be a folded constant"


def test_unknown_ops_become_opaque() -> None:
    graph = import_proto(models.unknown_ops()).graph
    opaque = {layer.op_type for layer in graph.layers if layer.group == "opaque"}
    assert {"DepthToSpace", "InstanceNormalization"} <= opaque


def test_split_becomes_one_slice_per_output() -> None:
    """Each output of a Split is its own Slice layer (the IR cuts one output per layer)."""
    graph = import_proto(models.unknown_ops()).graph
    slices = [layer for layer in graph.layers if layer.name.startswith("split/")]
    assert [(s.op_type, s.outputs) for s in slices] == [("Slice", ("split.a",)), ("Slice", ("split.b",))]
    assert [graph.constants[s.inputs[1]].tolist() + graph.constants[s.inputs[2]].tolist() for s in slices] == [[0, 4], [4, 8]]
    assert all(s.group != "opaque" for s in slices) and "Split" not in {layer.op_type for layer in graph.layers}


def test_auto_pad_becomes_explicit_pads() -> None:
    graph = import_proto(models.auto_pad_same()).graph
    for layer in graph.layers:
        if layer.op_type in ("Conv", "MaxPool", "AveragePool"):
            assert "auto_pad" not in layer.attrs and "pads" in layer.attrs


def test_symbolic_batch_needs_input_shape(tmp_path) -> None:
    model = models.symbolic_batch()
    with pytest.raises(BBGrapError, match="--input-shape"):
        import_proto(model)
    name = model.graph.input[0].name
    path = save(model, str(tmp_path))
    compile_plan(path, str(tmp_path / "plan"), nodes=2, input_shapes={name: (2, 3, 16, 16)})
    assert_exact(str(tmp_path / "plan"))


def test_input_shape_parsing() -> None:
    assert parse_input_shapes(["input:1x3x224x224"]) == {"input": (1, 3, 224, 224)}
    assert parse_input_shapes(["a:b:2x3"]) == {"a:b": (2, 3)}
    for bad in ["input", "input:", "input:1xx3", "input:0x3"]:
        with pytest.raises(BBGrapError, match="--input-shape"):
            parse_input_shapes([bad])


def test_input_shape_for_unknown_input_is_an_error() -> None:
    with pytest.raises(BBGrapError, match="model's inputs are"):
        import_proto(models.opset(13), input_shapes={"nope": (1, 3, 16, 16)})


def test_reference_output_matches_onnxruntime() -> None:
    import onnxruntime as ort
    model = models.opset(13)
    front = import_proto(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, front.sample_inputs)
    for got, exp in zip(front.reference_outputs.values(), want):
        np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("nodes", [1, 2])
def test_a_folded_rank0_index_stays_rank_0(tmp_path, nodes: int) -> None:
    # issue 14: `x[:, 0]` as the exporters write it (Gather with an index computed from constants):
    # the folded index became shape (1,) and the plan failed at its first run ("Invalid rank")
    from helpers import assert_exact, compile_plan, save
    from onnx import helper, numpy_helper

    from tests.rules.helpers import build_model

    w = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    nodes_ = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
              helper.make_node("Constant", [], ["one"], name="one", value=numpy_helper.from_array(np.array(1, np.int64))),
              helper.make_node("Sub", ["one", "one"], ["zero"], name="zero"),  # a rank-0 value folded by the frontend
              helper.make_node("Gather", ["c", "zero"], ["y"], name="first_channel", axis=1)]
    model = build_model(nodes_, {"x": [1, 3, 8, 8]}, {"w": w}, ["y"], 17)
    plan = str(tmp_path / "plan")
    compile_plan(save(model, str(tmp_path)), plan, nodes=nodes)
    assert_exact(plan)


def test_a_model_with_external_weights_compiles_and_checks_exactly(tmp_path, monkeypatch) -> None:
    """The dynamo exporter (and large models) keep weights in a file beside the model: the frontend
    reads them from the model's directory whatever the working directory, and bbgrap-run --check
    runs the original model with them."""
    import os

    import onnx

    from bbgrap import zoo

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    path = str(model_dir / "net.onnx")
    onnx.save_model(zoo.build("resnet18", resolution=48, width=0.125, seed=4), path, save_as_external_data=True,
                    all_tensors_to_one_file=True, location="net.onnx.data", size_threshold=256)
    assert os.path.getsize(path) < os.path.getsize(model_dir / "net.onnx.data")  # the weights are outside the model file
    monkeypatch.chdir(tmp_path)  # not the model's directory
    plan = str(tmp_path / "plan")
    compile_plan(path, plan, nodes=2, direction="h", search=True)
    assert_exact(plan)
    proc = bbgrap_run(plan, "--check", "--repeat", "1", "--warmup", "0")
    assert proc.returncode == 0 and "against the model (ok)" in proc.stdout, proc.stdout + proc.stderr
