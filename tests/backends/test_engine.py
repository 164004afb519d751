"""backends/engine.py: the session options a plan's segments get, and what a GPU cannot run of a plan."""

from __future__ import annotations

import json
import os
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest
from bbgrap.backends import engine
from bbgrap.backends.emit import cpu_only
from bbgrap.backends.engine import session_options
from helpers import compile_plan, save
from onnxruntime.quantization import QuantType

from bbgrap import zoo
from bbgrap.ir import BBGrapError
from bbgrap.plan import read_manifest
from bbgrap.plan_schema import Plan
from tests.backends.test_exporter_models import bilinear_head
from tests.backends.test_quantized import quantize


def test_sessions_without_prepacking_read_the_weights_as_they_are() -> None:
    packed, unpacked = session_options(1, spin=False, prepack=True), session_options(1, spin=False, prepack=False)
    assert unpacked.get_session_config_entry("session.disable_prepacking") == "1"
    # the level-3 optimiser would reorder the convolutions' weights into NCHWc copies of their own
    assert unpacked.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    assert packed.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL


CUDA_LISTED = [("CUDAExecutionProvider", {"device_id": 0}), "CPUExecutionProvider"]


def resize_plan(tmp_path: Path, transform: str) -> tuple[str, Plan]:
    """A bilinear ×2 head cut along h on 2 nodes: align_corners' pieces are tf_crop_and_resize
    Resizes of their rows, half_pixel's plain Resizes of theirs (ResizeRule)."""
    plan = str(tmp_path / f"plan-{transform}")
    compile_plan(save(bilinear_head(transform, [1, 1, 2, 2]), str(tmp_path), transform), plan, nodes=2, direction="h")
    return plan, read_manifest(plan)


def as_if_on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """load_runner as on a host with a GPU and onnxruntime-gpu (the sessions themselves are not made there)."""
    monkeypatch.setattr(engine, "gpu_present", lambda: True)
    monkeypatch.setattr(engine, "providers_for", lambda provider, device_id: CUDA_LISTED if provider != "cpu" else ["CPUExecutionProvider"])


def test_a_plan_with_tf_crop_and_resize_pieces_does_not_run_them_on_cuda(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    # onnxruntime-gpu 1.31.1's CUDA Resize gets tf_crop_and_resize wrong (measured on an H100, session 23)
    plan_dir, plan = resize_plan(tmp_path, "align_corners")
    plain_dir, plain = resize_plan(tmp_path, "half_pixel")
    # compile marks the segments (the manifest says so; bbgrap-run reads no segment file to find them)
    assert all("tf_crop_and_resize" in p.cpu_only for p in plan.programs)
    assert all(p.cpu_only == "" for p in plain.programs)
    marked = next(seg for seg in plan.programs[0].segments if seg.cpu_only)
    assert cpu_only(onnx.load(os.path.join(plan_dir, marked.file), load_external_data=False).graph.node) == marked.cpu_only
    as_if_on_a_gpu(monkeypatch)
    with pytest.raises(BBGrapError, match=r"--provider cuda: node 0's segment .*tf_crop_and_resize.*--provider cpu"):
        engine.load_runner(plan_dir, plan, 0, 1, "cuda")
    runner = engine.load_runner(plan_dir, plan, 0, 1, "auto")  # auto: this node on the CPU, exact
    assert runner.providers == ["CPUExecutionProvider"] and isinstance(runner.values, engine.HostValues)
    assert "tf_crop_and_resize" in runner.kept_on_cpu
    plain_runner = engine.load_runner(plain_dir, plain, 0, 1, "cpu")  # asked for the CPU: not "kept" there
    assert plain_runner.kept_on_cpu == ""


def test_cpu_only_names_a_tf_crop_and_resize_and_nothing_else() -> None:
    def resize(mode: str) -> onnx.NodeProto:
        return onnx.helper.make_node("Resize", ["x", "", "", "s"], ["y"], name="up", coordinate_transformation_mode=mode)

    assert "up as a tf_crop_and_resize" in cpu_only([resize("tf_crop_and_resize")])
    assert cpu_only([resize("half_pixel"), resize("align_corners"), onnx.helper.make_node("Relu", ["x"], ["y"])]) == ""


@pytest.mark.parametrize("op_type", ["QuantizeLinear", "QLinearConv", "QLinearAveragePool", "ConvInteger", "DynamicQuantizeLinear"])
def test_cpu_only_names_an_op_that_quantizes(op_type: str) -> None:
    # measured on an H200 (session 49): a QDQ model's plan on the GPU was 0.6 % off the CPU's reference, a 16-bit one 1.4e-4
    said = cpu_only([onnx.helper.make_node("Relu", ["x"], ["y"]), onnx.helper.make_node(op_type, ["y"], ["z"], name="q1")])
    assert said == f"quantizes ({op_type} q1), which onnxruntime's CUDA provider rounds otherwise than the CPU's integer kernels that computed the reference"
    # a weight dequantized for a float product is exact on both
    assert cpu_only([onnx.helper.make_node("DequantizeLinear", ["w", "s"], ["v"]), onnx.helper.make_node("MatMul", ["x", "v"], ["y"])]) == ""


def test_a_quantized_plan_runs_on_the_cpu_under_auto_and_is_refused_under_cuda(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = save(zoo.build("resnet18", resolution=32, width=0.25, seed=0), str(tmp_path), "float")
    path = quantize(src, str(tmp_path / "q.onnx"), False, QuantType.QUInt8)
    plan_dir = str(tmp_path / "plan")
    compile_plan(path, plan_dir, nodes=2, direction="h")
    plan = read_manifest(plan_dir)
    assert all(p.cpu_only.startswith("segment 0 ") and "quantizes (" in p.cpu_only for p in plan.programs)
    as_if_on_a_gpu(monkeypatch)
    with pytest.raises(BBGrapError, match=r"--provider cuda: node 1's segment 0 .*quantizes .*--provider cpu"):
        engine.load_runner(plan_dir, plan, 1, 1, "cuda")
    runner = engine.load_runner(plan_dir, plan, 1, 1, "auto")
    assert runner.providers == ["CPUExecutionProvider"] and "quantizes (" in runner.kept_on_cpu


def test_a_gpu_out_of_cublas_handles_is_one_line_naming_the_way_out(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan_dir, plan = resize_plan(tmp_path, "half_pixel")
    as_if_on_a_gpu(monkeypatch)

    def exhausted(*args: object) -> None:
        raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : CUBLAS failure 3: the resource allocation failed ; "
                           "expr=cublasCreate(&cublas_handle_);")

    monkeypatch.setattr(engine, "segment_session", exhausted)
    with pytest.raises(BBGrapError, match=r"node 0's first 0 segments.*cuBLAS and cuDNN handles of its own.*one rank per node") as caught:
        engine.load_runner(plan_dir, plan, 0, 1, "cuda")
    assert "\n" not in str(caught.value)


class FailingSession:
    """A session whose run fails with `message`, on the plain path and with IOBinding alike."""

    def __init__(self, message: str) -> None:
        self.message = message

    def run(self, *args: object) -> None:
        raise RuntimeError(self.message)

    def io_binding(self) -> object:
        class Binding:
            def bind_ortvalue_input(self, *args: object) -> None:
                pass

            def bind_output(self, *args: object) -> None:
                pass

        return Binding()

    def run_with_iobinding(self, binding: object) -> None:
        raise RuntimeError(self.message)


@pytest.mark.parametrize("values", [engine.HostValues(), engine.DeviceValues("cuda", 0)], ids=["host", "device"])
def test_a_gpu_out_of_cudnn_handles_at_a_run_is_one_line_and_other_failures_pass_through(values: engine.HostValues | engine.DeviceValues) -> None:
    # onnxruntime makes a CUDA session's cuDNN handle at its first run (the H100's suite failed there with this message)
    cudnn = ("[ONNXRuntimeError] : 1 : FAIL : CUDNN failure 4000: CUDNN_STATUS_INTERNAL_ERROR ; GPU=0 ; "
             "file=cuda_stream_handle.cc ; line=82 ; expr=cudnnCreate(&cudnn_handle_);")
    with pytest.raises(BBGrapError, match=r"cannot run a segment on the GPU: .*cuDNN handles.*one rank per node") as caught:
        values.run(FailingSession(cudnn), ["x"], ["y"], {"x": None})
    assert "\n" not in str(caught.value)
    with pytest.raises(RuntimeError, match="something else"):
        values.run(FailingSession("something else"), ["x"], ["y"], {"x": None})


def test_a_node_kept_on_the_cpu_is_named_by_inspect_and_by_bbgrap_run(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    from argparse import Namespace

    import numpy as np
    from bbgrap.backends.runtime import report

    from bbgrap.cli import summary

    plan_dir, plan = resize_plan(tmp_path, "align_corners")
    text = summary(plan, plan_dir)
    assert "node 0 runs on the CPU even with --provider auto on a GPU" in text and "tf_crop_and_resize" in text
    plain_dir, plain = resize_plan(tmp_path, "half_pixel")
    assert "runs on the CPU" not in summary(plain, plain_dir)
    # bbgrap-run's report: a line per node kept on the CPU (NodeRunner.kept_on_cpu, gathered from every rank), and --json
    out = {"y": np.ones(1, np.float32)}
    args = Namespace(plan=plan_dir, output=None, json=False, quiet=False, check=False, tolerance=1e-4)
    kept = ["", plan.programs[1].cpu_only]
    assert report(args, plan, out, out, [1e-3], 2, ["CUDAExecutionProvider"], 0, [1.0, 1.0], [0.0, 0.0], kept_on_cpu=kept) == 0
    said = capsys.readouterr().out
    assert f"node 1 runs on the CPU: its {kept[1]}" in said and "node 0 runs on the CPU" not in said
    assert report(Namespace(**{**vars(args), "json": True}), plan, out, out, [1e-3], 2, ["CUDAExecutionProvider"], 0,
                  [1.0, 1.0], [0.0, 0.0], kept_on_cpu=kept) == 0
    assert json.loads(capsys.readouterr().out)["kept_on_cpu"] == {"1": kept[1]}
