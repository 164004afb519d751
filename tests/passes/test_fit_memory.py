"""fit-memory: with the nodes' memory given, heavy layers cut along height are re-cut along
channels (sharding their weights) until every node's estimate fits, with onnxruntime's prepacked
copies of the weights where that fits and without them where only that does; a plan that cannot
fit is one line saying by how much; every plan stays exact, and bbgrap-run runs it the way the
estimate assumed."""

from __future__ import annotations

import os

import numpy as np
import pytest
from bbgrap.backends.engine import plan_layout
from bbgrap.passes.fit_memory import MB
from helpers import assert_exact, bbgrap, compile_plan, one_error_line, save
from onnx import helper

from bbgrap.cost import CPU_MEMORY, CPU_MEMORY_UNPACKED, NodeMemory
from bbgrap.ir import BBGrapError
from bbgrap.plan import read_manifest
from tests.rules.helpers import build_model

OVERHEAD_MB = CPU_MEMORY.overhead_bytes / MB  # with prepacked weights
UNPACKED_OVERHEAD_MB = CPU_MEMORY_UNPACKED.overhead_bytes / MB


def heavy_convs(tmp_path) -> str:
    """Two 256-channel 3x3 convolutions (2.4 MB of weights each) on a 16x16 map."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c2"], ["y"])]
    consts = {k: (rng.standard_normal((256, 256, 3, 3)) * 0.02).astype(np.float32) for k in ("w1", "w2")}
    return save(build_model(nodes, {"x": [1, 256, 16, 16]}, consts, ["y"], 17), str(tmp_path))


def node_weights(plan: str) -> list[int]:
    return [n.weight_bytes for n in read_manifest(plan).stats.per_node]


def convs_only(weights: int) -> NodeMemory:
    """A node holding `weights` bytes of convolution weights, and no activations."""
    return NodeMemory(weights, weights, 0)


def test_without_a_limit_every_node_holds_every_weight(tmp_path) -> None:
    plan = str(tmp_path / "plan")
    compile_plan(heavy_convs(tmp_path), plan, nodes=4, direction="h")
    assert all(w > 4.5 * MB for w in node_weights(plan))
    compiled = read_manifest(plan).compiled
    assert "fit-memory" not in compiled.passes
    assert compiled.memory is not None and compiled.memory.prepack and compiled.memory.limit_mb == ()
    assert not compiled.fitted_to_memory and plan_layout("auto", read_manifest(plan)) == "auto"
    # the estimate: the convolutions' weights twice (mapped and reordered), the live activations, the overhead
    assert all(e == pytest.approx(2 * w + a + OVERHEAD_MB, abs=2e-3)
               for e, w, a in zip(compiled.memory.estimate_mb, compiled.memory.weights_mb, compiled.memory.activations_mb))


@pytest.mark.parametrize("search", [False, True])
def test_a_limit_shards_the_heavy_layers_until_every_node_fits(tmp_path, search: bool) -> None:
    plan = str(tmp_path / "plan")
    # replicated, each node holds 4.7 MB of weights (9.4 MB counting onnxruntime's packed copy)
    limit = OVERHEAD_MB + 7.0
    compile_plan(heavy_convs(tmp_path), plan, nodes=4, direction="h", memory_mb=(limit,) * 4, search=search)
    manifest = read_manifest(plan)
    assert "fit-memory" in manifest.compiled.passes
    assert all(CPU_MEMORY.of(convs_only(w)) < limit * MB for w in node_weights(plan)), node_weights(plan)
    cuts = {r.name: r.cut for r in manifest.compiled.layer_table}
    assert "c" in cuts.values() and "h" in cuts.values(), cuts  # one conv sharded, the other still cut by rows
    memory = manifest.compiled.memory
    assert memory is not None and memory.prepack and memory.limit_mb == (limit,) * 4
    assert max(memory.estimate_mb) <= limit and manifest.compiled.fitted_to_memory
    assert plan_layout("auto", manifest) == "nchw"  # as the estimate assumes
    assert_exact(plan)


def test_a_plan_that_fits_only_without_prepacked_weights_turns_prepacking_off(tmp_path) -> None:
    plan = str(tmp_path / "plan")
    # With prepacked copies, both convolutions sharded over 4 nodes still take 2.4 MB beyond the
    # overhead; without them, 4.7 MB of weights fit unsharded under a smaller overhead.
    limit = OVERHEAD_MB + 2.0
    compile_plan(heavy_convs(tmp_path), plan, nodes=4, direction="h", memory_mb=(limit,) * 4)
    manifest = read_manifest(plan)
    memory = manifest.compiled.memory
    assert memory is not None and not memory.prepack and not manifest.compiled.prepack
    assert all(CPU_MEMORY_UNPACKED.of(convs_only(w)) < limit * MB < CPU_MEMORY.of(convs_only(w // 4))
               for w in node_weights(plan)), node_weights(plan)
    assert {r.cut for r in manifest.compiled.layer_table if r.op_type == "Conv"} == {"h"}  # no sharding needed without copies
    assert max(memory.estimate_mb) <= limit
    assert "not prepacked" in bbgrap("inspect", plan).stdout
    assert_exact(plan)  # in one process, the sessions as bbgrap-run makes them: without prepacking


def test_a_plan_that_cannot_fit_says_by_how_much(tmp_path) -> None:
    with pytest.raises(BBGrapError, match=r"does not fit: node \d needs about \d+ MB \(\d+ MB of weights without prepacked copies, "
                                          r".* MB more than its memory limit .*--memory-mb"):
        compile_plan(heavy_convs(tmp_path), str(tmp_path / "plan"), nodes=2, direction="h", memory_mb=(UNPACKED_OVERHEAD_MB + 1.0,) * 2)
    assert not os.path.exists(tmp_path / "plan")


@pytest.mark.parametrize(("value", "words"), [(f"{UNPACKED_OVERHEAD_MB + 1:g}", "does not fit"), ("x", "--memory-mb 'x'"), ("1,2,3", "--memory-mb has 3 entries")])
def test_the_flag_is_checked_and_a_plan_too_big_is_one_line(tmp_path, value: str, words: str) -> None:
    model = heavy_convs(tmp_path)
    one_error_line(bbgrap("compile", model, "--nodes", "2", "--memory-mb", value, "-o", str(tmp_path / "plan"), "--quiet"), words)
    assert not os.path.exists(tmp_path / "plan")
