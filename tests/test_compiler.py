"""bbgrap/compiler.py: --balance, a bound on how far apart the nodes' work may be."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import assert_exact, bbgrap, compile_plan, save
from onnx import TensorProto, helper, numpy_helper

from bbgrap.cli import summary
from bbgrap.compiler import flops_spread, largest_whole
from bbgrap.config import Direction
from bbgrap.ir import BBGrapError
from bbgrap.plan import read_manifest


def seven_rows(channels: int) -> onnx.ModelProto:
    """Two 3x3 convolutions on a 7 x 7 map of `channels` channels: 4 nodes cut its rows 2/2/2/1."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array((rng.standard_normal((channels, channels, 3, 3)) * 0.1).astype(np.float32), f"w{i}")
               for i in range(2)]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1], name="conv0"),
             helper.make_node("Relu", ["a"], ["b"], name="relu"),
             helper.make_node("Conv", ["b", "w1"], ["y"], pads=[1, 1, 1, 1], name="conv1")]
    graph = helper.make_graph(nodes, "seven", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, 7, 7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, 7, 7])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def spread_of(plan_dir: str) -> float:
    per_node = [n.flops for n in read_manifest(plan_dir).stats.per_node]
    return max(per_node) / min(per_node)


def test_without_balance_rows_cut_unevenly_and_with_it_an_even_plan_is_kept(tmp_path) -> None:
    model = save(seven_rows(64), str(tmp_path))
    plain, even = str(tmp_path / "plain"), str(tmp_path / "even")
    compile_plan(model, plain, nodes=4, direction="h")
    assert spread_of(plain) > 1.4  # 2/2/2/1 rows (recomputed halo rows on top)
    plan = compile_plan(model, even, nodes=4, direction="h", balance=1.1)
    assert spread_of(even) <= 1.1 and plan.compiled.direction is Direction.C  # 64 channels: 16 each
    record = plan.compiled.balance
    assert record is not None and record.bound == 1.1 and record.kept == "the even cut along c"
    assert record.fastest_spread > 1.4 and record.spread <= 1.1 and record.kept_ms > 0 and record.fastest_ms > 0
    assert record.summary().startswith("balance: at most 1.1 asked; the fastest predicted plan leaves the nodes' work ")
    assert record.summary() in summary(plan, even)  # inspect says so
    assert read_manifest(even).compiled.balance == record  # the manifest keeps it
    assert_exact(even)


def test_balance_one_line_error_names_the_most_even_plan(tmp_path) -> None:
    # 6 channels and 7 rows on 4 nodes: no cut gives every node the same work
    model = save(seven_rows(6), str(tmp_path))
    with pytest.raises(BBGrapError) as err:
        compile_plan(model, str(tmp_path / "p"), nodes=4, direction="h", balance=1.05)
    said = str(err.value)
    assert said.startswith("--balance 1.05: no plan found is that even (the most even, ") and "raise --balance to" in said
    assert "\n" not in said and not (tmp_path / "p").exists()  # nothing half-written


def test_a_plan_already_even_is_left_as_it_is(tmp_path) -> None:
    model = save(seven_rows(64), str(tmp_path))
    plan = compile_plan(model, str(tmp_path / "p"), nodes=4, direction="c", balance=1.1)
    assert plan.compiled.direction is Direction.C and spread_of(str(tmp_path / "p")) <= 1.1
    assert plan.compiled.balance is not None and plan.compiled.balance.kept == "the fastest predicted plan"
    assert compile_plan(model, str(tmp_path / "q"), nodes=4, direction="c").compiled.balance is None  # not asked: no record


def test_spread_is_work_over_speed_and_no_layer_is_whole(tmp_path) -> None:
    from bbgrap.frontends.onnx import import_model
    from bbgrap.passes.naive_partition import NaivePartition

    from bbgrap.pass_manager import PassManager

    graph = import_model(save(seven_rows(64), str(tmp_path))).graph
    cut = PassManager([NaivePartition(nodes=2, direction=Direction.C, speeds=(1.0, 3.0))]).run(graph)
    # 16 and 48 channels on nodes of speeds 1 and 3: each node's work over its speed alike
    assert flops_spread(cut, (1.0, 3.0)) == pytest.approx(1.0) and flops_spread(cut, (1.0, 1.0)) == pytest.approx(3.0)
    assert largest_whole(cut, Direction.C) == 0.0


def test_compile_balance_flag_is_one_line_and_exit_2(tmp_path) -> None:
    model = save(seven_rows(6), str(tmp_path))
    proc = bbgrap("compile", model, "--nodes", "4", "--balance", "0.5", "-o", str(tmp_path / "p"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--balance is the most" in proc.stderr
