"""The plan's shared weights file: one copy of every large weight, whatever the number of nodes
that use it, so a plan takes about its model's size on disk; every plan stays exact, and a
damaged weights file is refused in one line."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from bbgrap.backends.emit import EXTERNAL_MIN_BYTES, PAGE, WEIGHTS_FILE, SharedWeights
from helpers import assert_exact, bbgrap_run, compile_plan, one_error_line, save

from bbgrap import zoo
from bbgrap.plan import read_manifest


def plan_bytes(plan: str) -> int:
    return sum(f.stat().st_size for f in Path(plan).rglob("*") if f.is_file() and f.name != "sample.npz")


@pytest.fixture(scope="module")
def resnet(tmp_path_factory: pytest.TempPathFactory) -> str:
    return save(zoo.build("resnet18", resolution=64, width=0.5, seed=2), str(tmp_path_factory.mktemp("model")))


@pytest.mark.parametrize(("nodes", "direction"), [(4, "h"), (3, "w"), (4, "c")])
def test_a_plan_takes_about_its_models_size_and_stays_exact(tmp_path, resnet: str, nodes: int, direction: str) -> None:
    plan = str(tmp_path / "plan")
    compile_plan(resnet, plan, nodes=nodes, direction=direction, search=True)
    manifest = read_manifest(plan)
    assert manifest.weights == WEIGHTS_FILE and WEIGHTS_FILE in manifest.files
    model = os.path.getsize(resnet)
    assert plan_bytes(plan) <= 1.2 * model, (plan_bytes(plan), model)
    if direction != "c":  # nodes that share the spatial cuts use the same weights: held once, not per node
        assert sum(n.weight_bytes for n in manifest.stats.per_node) > plan_bytes(plan)
    assert_exact(plan)


def test_segments_point_into_the_shared_file_and_small_tensors_stay_inline(tmp_path, resnet: str) -> None:
    plan = tmp_path / "plan"
    compile_plan(resnet, str(plan), nodes=2, direction="h")
    size = (plan / WEIGHTS_FILE).stat().st_size
    external = inline = 0
    for seg in plan.glob("node*/seg*.onnx"):
        for init in onnx.load(str(seg), load_external_data=False).graph.initializer:
            if init.data_location == onnx.TensorProto.EXTERNAL:
                info = {e.key: e.value for e in init.external_data}
                assert info["location"] == WEIGHTS_FILE
                offset, length = int(info["offset"]), int(info["length"])
                assert offset % PAGE == 0 and offset + length <= size and length >= EXTERNAL_MIN_BYTES
                external += 1
            else:
                assert len(init.raw_data) < EXTERNAL_MIN_BYTES
                inline += 1
    assert external and inline


def offset_of(init: onnx.TensorProto) -> str:
    return {e.key: e.value for e in init.external_data}["offset"]


def test_the_same_name_with_other_bytes_gets_its_own_place() -> None:
    pool = SharedWeights()
    made = [pool.initializer("w@0:64,0:16", np.full((64, 16), value, np.float32)) for value in (1.0, 1.0, 2.0)]
    offsets = [offset_of(init) for init in made]
    assert offsets[0] == offsets[1] != offsets[2]
    assert len(pool.data) == PAGE + 64 * 16 * 4


def test_an_array_made_again_is_the_same_initializer_and_small_ones_stay_inline() -> None:
    pool = SharedWeights()
    w, bias = np.arange(64 * 16, dtype=np.float32).reshape(64, 16), np.ones(4, np.float32)
    first, again = pool.initializer("w", w), pool.initializer("w", w)
    assert again is first and first.data_location == onnx.TensorProto.EXTERNAL and not first.raw_data
    assert first == (fresh := SharedWeights()).initializer("w", w.copy()) and fresh.data == pool.data
    small = pool.initializer("b", bias)
    assert small.data_location != onnx.TensorProto.EXTERNAL and onnx.numpy_helper.to_array(small).tolist() == bias.tolist()
    assert len(pool.data) == w.nbytes


def test_a_damaged_weights_file_is_refused_in_one_line(tmp_path, resnet: str) -> None:
    plan = tmp_path / "plan"
    compile_plan(resnet, str(plan), nodes=2, direction="h")
    damaged = tmp_path / "damaged"
    shutil.copytree(plan, damaged)
    data = bytearray((damaged / WEIGHTS_FILE).read_bytes())
    data[PAGE + 7] ^= 0xFF
    (damaged / WEIGHTS_FILE).write_bytes(bytes(data))
    one_error_line(bbgrap_run(str(damaged), "--repeat", "1", "--warmup", "0"), WEIGHTS_FILE)
