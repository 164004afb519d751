"""backends/engine.py: the session options a plan's segments get, and what a GPU cannot run of a plan."""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort
import pytest
from bbgrap.backends import engine
from bbgrap.backends.engine import session_options
from helpers import compile_plan, save

from bbgrap.ir import BBGrapError
from bbgrap.plan import read_manifest
from bbgrap.plan_schema import Plan
from tests.backends.test_exporter_models import bilinear_head


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
    assert all(engine.cuda_wrong(plan_dir, p) is not None for p in plan.programs)
    assert "tf_crop_and_resize" in (engine.cuda_wrong(plan_dir, plan.programs[0]) or "")
    assert all(engine.cuda_wrong(plain_dir, p) is None for p in plain.programs)
    as_if_on_a_gpu(monkeypatch)
    with pytest.raises(BBGrapError, match=r"--provider cuda: node 0's segment .*tf_crop_and_resize.*--provider cpu"):
        engine.load_runner(plan_dir, plan, 0, 1, "cuda")
    runner = engine.load_runner(plan_dir, plan, 0, 1, "auto")  # auto: this node on the CPU, exact
    assert runner.providers == ["CPUExecutionProvider"] and isinstance(runner.values, engine.HostValues)


def test_a_gpu_out_of_cublas_handles_is_one_line_naming_the_way_out(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan_dir, plan = resize_plan(tmp_path, "half_pixel")
    as_if_on_a_gpu(monkeypatch)

    def exhausted(*args: object) -> None:
        raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : CUBLAS failure 3: the resource allocation failed ; "
                           "expr=cublasCreate(&cublas_handle_);")

    monkeypatch.setattr(engine, "segment_session", exhausted)
    with pytest.raises(BBGrapError, match=r"cuBLAS handle of its own.*node 0's first 0 segments.*one rank per node") as caught:
        engine.load_runner(plan_dir, plan, 0, 1, "cuda")
    assert "\n" not in str(caught.value)
