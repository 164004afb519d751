"""fit-memory: with the nodes' memory given, heavy layers cut along height are re-cut along
channels (sharding their weights) until every node's estimate fits; a plan that cannot fit is
one line saying by how much; every plan stays exact."""

from __future__ import annotations

import os

import numpy as np
import pytest
from bbgrap.passes.fit_memory import MB
from helpers import assert_exact, bbgrap, compile_plan, one_error_line, save
from onnx import helper

from bbgrap.cost import CPU_MEMORY
from bbgrap.ir import BBGrapError
from bbgrap.plan import read_manifest
from tests.rules.helpers import build_model

RUNTIME_MB = CPU_MEMORY.runtime_bytes / MB


def heavy_convs(tmp_path) -> str:
    """Two 256-channel 3x3 convolutions (2.4 MB of weights each) on a 16x16 map."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c2"], ["y"])]
    consts = {k: (rng.standard_normal((256, 256, 3, 3)) * 0.02).astype(np.float32) for k in ("w1", "w2")}
    return save(build_model(nodes, {"x": [1, 256, 16, 16]}, consts, ["y"], 17), str(tmp_path))


def node_weights(plan: str) -> list[int]:
    return [n.weight_bytes for n in read_manifest(plan).stats.per_node]


def test_without_a_limit_every_node_holds_every_weight(tmp_path) -> None:
    plan = str(tmp_path / "plan")
    compile_plan(heavy_convs(tmp_path), plan, nodes=4, direction="h")
    assert all(w > 4.5 * MB for w in node_weights(plan))
    assert "fit-memory" not in read_manifest(plan).compiled.passes


@pytest.mark.parametrize("search", [False, True])
def test_a_limit_shards_the_heavy_layers_until_every_node_fits(tmp_path, search: bool) -> None:
    plan = str(tmp_path / "plan")
    # replicated, each node holds 4.7 MB of weights (9.4 MB counting onnxruntime's packed copy)
    limit = RUNTIME_MB + 7.0
    compile_plan(heavy_convs(tmp_path), plan, nodes=4, direction="h", memory_mb=(limit,) * 4, search=search)
    manifest = read_manifest(plan)
    assert "fit-memory" in manifest.compiled.passes
    assert all(CPU_MEMORY.of(w, 0) < limit * MB for w in node_weights(plan)), node_weights(plan)
    cuts = {r.name: r.cut for r in manifest.compiled.layer_table}
    assert "c" in cuts.values() and "h" in cuts.values(), cuts  # one conv sharded, the other still cut by rows
    assert_exact(plan)


def test_a_plan_that_cannot_fit_says_by_how_much(tmp_path) -> None:
    with pytest.raises(BBGrapError, match=r"does not fit: node \d needs about \d+ MB .* MB more than cluster.memory_mb"):
        compile_plan(heavy_convs(tmp_path), str(tmp_path / "plan"), nodes=2, direction="h", memory_mb=(RUNTIME_MB + 1.0,) * 2)
    assert not os.path.exists(tmp_path / "plan")


@pytest.mark.parametrize(("value", "words"), [(f"{RUNTIME_MB + 1:g}", "does not fit"), ("x", "--memory-mb 'x'"), ("1,2,3", "--memory-mb has 3 entries")])
def test_the_flag_is_checked_and_a_plan_too_big_is_one_line(tmp_path, value: str, words: str) -> None:
    model = heavy_convs(tmp_path)
    one_error_line(bbgrap("compile", model, "--nodes", "2", "--memory-mb", value, "-o", str(tmp_path / "plan"), "--quiet"), words)
    assert not os.path.exists(tmp_path / "plan")
