"""The plan-network pass end to end: every planner's own plan (not only the one the compiler keeps)
is exact on the zoo models, mixed cuts, placements and all; the compiler keeps the faster
predicted of the planner's plan and the per-layer search's and records both; a custom partition
is left alone; a bad planner name is one line."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import assert_exact, compile_plan, save
from onnx import helper
from onnx_builder import build_model

from bbgrap import forked, zoo
from bbgrap.cli import layers_text, summary
from bbgrap.compiler import PLANNER_MARGIN
from bbgrap.config import CustomPartition, Direction
from bbgrap.plan import Plan, read_manifest
from bbgrap.search import network


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    work = str(tmp_path_factory.mktemp("plan-network"))
    return {name: save(zoo.build(name, resolution=48, width=0.125), work, name) for name in zoo.NAMES}


@pytest.mark.parametrize("planner", ["dp", "heft", "ga", "map-elites"])
@pytest.mark.parametrize(("name", "nodes", "speeds"), [("resnet18", 2, ()), ("inception", 3, (1.0, 2.0, 1.0)), ("mobilenet_v2", 4, ())])
def test_every_planners_own_plan_is_exact(tmp_path, models: dict[str, str], planner: str, name: str, nodes: int,
                                          speeds: tuple[float, ...]) -> None:
    plan = compile_plan(models[name], str(tmp_path / "plan"), nodes=nodes, speeds=speeds, search=True, planner=planner, judge=False)
    record = plan.compiled.planner
    assert record is not None and record.kept == planner and record.stats.planner == planner
    assert record.stats.layers > 0 and record.stats.candidates > record.stats.layers
    assert "plan-network" in plan.compiled.passes
    if planner == "dp":
        assert record.stats.exact and record.stats.synchronous_ms <= record.stats.start_synchronous_ms * (1 + 1e-9)
    assert_exact(str(tmp_path / "plan"))


@pytest.mark.parametrize("name", sorted(set(zoo.NAMES) - {"resnet18", "inception", "mobilenet_v2"}))
def test_the_other_zoo_models_planned_are_exact(tmp_path, models: dict[str, str], name: str) -> None:
    plan = compile_plan(models[name], str(tmp_path / "plan"), nodes=3, search=True, planner="ga", judge=False)
    assert plan.compiled.planner is not None
    assert_exact(str(tmp_path / "plan"))


def test_the_compiler_keeps_the_planners_plan_only_where_predicted_clearly_faster(tmp_path, models: dict[str, str]) -> None:
    plan = compile_plan(models["resnet18"], str(tmp_path / "plan"), nodes=2, search=True, planner="heft")
    record = plan.compiled.planner
    assert record is not None and record.kept in ("heft", "greedy")
    assert record.kept == ("heft" if record.planner_ms <= (1 - PLANNER_MARGIN) * record.greedy_ms else "greedy")
    assert_exact(str(tmp_path / "plan"))


@pytest.mark.parametrize(("name", "resolution", "width", "kept"), [("resnet18", 96, 0.25, "greedy"), ("mobilenet_v2", 48, 0.125, "dp")])
def test_the_per_layer_plan_predicted_in_a_child_process_is_predicted_as_here(tmp_path, monkeypatch: pytest.MonkeyPatch, name: str,
                                                                              resolution: int, width: float, kept: str) -> None:
    """compile predicts the per-layer search's plan in a forked child where it has two cores:
    the same figures and the same plan kept as with one core (all in this process), both where
    the planner's plan is kept and where the per-layer search's is (and so made again here)."""
    model = save(zoo.build(name, resolution=resolution, width=width), str(tmp_path), name)
    plans = {}
    for cpus in (1, 2):
        monkeypatch.setattr(forked, "usable_cpus", lambda n=cpus: n)
        plans[cpus] = compile_plan(model, str(tmp_path / f"plan{cpus}"), nodes=2, search=True, planner="dp")
    one, two = plans[1].compiled.planner, plans[2].compiled.planner
    assert one is not None and two is not None and one.kept == kept
    assert (one.kept, one.planner_ms, one.greedy_ms) == (two.kept, two.planner_ms, two.greedy_ms)
    assert plans[1].compiled.layer_table == plans[2].compiled.layer_table
    assert_exact(str(tmp_path / "plan2"))


def test_a_custom_partition_is_kept(tmp_path, models: dict[str, str]) -> None:
    custom = (CustomPartition("conv1", Direction.H, (20, 4)),)
    plan = compile_plan(models["resnet18"], str(tmp_path / "plan"), nodes=2, search=True, planner="dp", judge=False, custom=custom)
    row = next(r for r in plan.compiled.layer_table if r.name == "conv1")
    assert [n.range for n in row.per_node] == [(0, 20), (20, 24)]
    assert_exact(str(tmp_path / "plan"))


def test_a_classifier_whose_weights_outweigh_its_operations_is_cut_by_output_channels(tmp_path) -> None:
    """A one-image Gemm of 4 MB of weights does 2 M operations (about 80 us on the default node)
    but streams its weights for about 1 ms: the planner prices it by the longer (the roofline,
    `NodeProfile.layer_time`) and cuts its output channels, so each node streams half, where
    pricing its operations alone left it whole on node 0 with all 4 MB."""
    rng = np.random.default_rng(0)
    consts = {"w1": rng.standard_normal((256, 3, 3, 3)).astype(np.float32) * 0.1,
              "fc": rng.standard_normal((4096, 256)).astype(np.float32) * 0.05, "fb": rng.standard_normal(4096).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["p"]), helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "fc", "fb"], ["y"], transB=1)]
    model = save(build_model(nodes, {"x": [1, 3, 16, 16]}, consts, ["y"], 17), str(tmp_path), "classifier")
    plan = compile_plan(model, str(tmp_path / "plan"), nodes=2, search=True, planner="dp", judge=False)
    assert plan.compiled.planner is not None and plan.compiled.memory is not None
    assert max(plan.compiled.memory.weights_mb) < 3.0, plan.compiled.memory.weights_mb  # 4.1 MB in all
    assert_exact(str(tmp_path / "plan"))


def squeeze_excite_net(channels: int = 32, size: int = 56) -> onnx.ModelProto:
    """conv → relu → conv → squeeze-excite (GlobalAveragePool, 1x1 conv, Relu, 1x1 conv, Sigmoid,
    Mul) → conv: big enough for the planner to cut the convolutions along rows."""
    rng = np.random.default_rng(0)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.3).astype(np.float32)

    c = channels
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], name="conv0", pads=[1] * 4), helper.make_node("Relu", ["a"], ["r"], name="relu0"),
             helper.make_node("Conv", ["r", "w1"], ["b"], name="conv1", pads=[1] * 4),
             helper.make_node("GlobalAveragePool", ["b"], ["p"], name="se_pool"),
             helper.make_node("Conv", ["p", "f1"], ["s1"], name="se_fc1"), helper.make_node("Relu", ["s1"], ["s1r"], name="se_relu"),
             helper.make_node("Conv", ["s1r", "f2"], ["s2"], name="se_fc2"), helper.make_node("Sigmoid", ["s2"], ["g"], name="se_gate"),
             helper.make_node("Mul", ["b", "g"], ["m"], name="se_scale"),
             helper.make_node("Conv", ["m", "w2"], ["y"], name="conv2", pads=[1] * 4)]
    consts = {"w0": w(c, 3, 3, 3), "w1": w(c, c, 3, 3), "f1": w(c // 4, c, 1, 1), "f2": w(c, c // 4, 1, 1), "w2": w(c, c, 3, 3)}
    return build_model(nodes, {"x": [1, 3, size, size]}, consts, ["y"], 17)


@pytest.mark.parametrize("nodes", [2, 3])
def test_a_squeeze_excite_tail_is_computed_on_every_node_instead_of_a_round_trip(tmp_path, monkeypatch: pytest.MonkeyPatch,
                                                                                 nodes: int) -> None:
    """The pool's 1x1 convolutions, whose result scales every node's rows, are computed whole on
    every node (one exchange before them) rather than on node 0 with the result sent back: one
    synchronisation point less, a lower objective, and the plan exact. Without the candidate
    (`REPLICATE_MAX_ELEMENTS` 0) the planner cannot make that plan."""
    model = save(squeeze_excite_net(), str(tmp_path), "se")
    tail = ("se_fc1", "se_relu", "se_fc2", "se_gate")

    def planned(where: str) -> Plan:
        compile_plan(model, str(tmp_path / where), nodes=nodes, search=True, planner="dp", judge=False)
        assert_exact(str(tmp_path / where))
        return read_manifest(str(tmp_path / where))

    every = planned("every")
    rows = {r.name: r for r in every.compiled.layer_table}
    assert all(rows[name].on_every_node() for name in tail), [(r.name, r.cut, r.per_node) for r in rows.values()]
    assert not rows["conv1"].on_every_node()
    count = sum(1 for r in rows.values() if r.on_every_node())
    assert f"layers computed whole on every node: {count} " in summary(every, "every")
    assert all(("whole on every node" in line) == rows[line.split()[0]].on_every_node() for line in layers_text(every).splitlines()[1:])
    monkeypatch.setattr(network, "REPLICATE_MAX_ELEMENTS", 0)
    once = planned("once")
    assert not any(r.on_every_node() for r in once.compiled.layer_table)
    assert every.stats.sync_points < once.stats.sync_points
    assert every.compiled.planner is not None and once.compiled.planner is not None
    assert every.compiled.planner.stats.synchronous_ms < once.compiled.planner.stats.synchronous_ms
