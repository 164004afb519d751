"""`bbgrap inspect --layers` (bbgrap/report.py): one row per layer, consistent with the plan's
own accounting, and every layer computed whole on one node named with its reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import onnx
import pytest
from bbgrap.frontends.onnx import import_proto
from helpers import assert_exact, compile_plan, save
from onnx import helper

from bbgrap import zoo
from bbgrap.plan import read_manifest
from bbgrap.report import whole_reason
from bbgrap.rules.base import MS_DOMAIN
from bbgrap.rules.registry import default_registry
from tests.rules.helpers import build_model, single_op
from tests.rules.test_qoperator import Quantization, qoperator

BIN = os.path.dirname(sys.executable)


def conv_then_hardmax() -> onnx.ModelProto:
    """A convolution (cut by rows) feeding Hardmax, an op without a region rule (whole on node 0)."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Hardmax", ["c"], ["y"], name="hardmax", axis=-1)]
    w = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    return build_model(nodes, {"x": [1, 3, 16, 16]}, {"w": w}, ["y"], 13)


@pytest.mark.parametrize(("name", "nodes", "direction", "search"), [
    ("resnet18", 2, "h", True), ("mobilenet_v2", 3, "w", True), ("inception", 2, "w", True),
    ("densenet", 4, "c", False),  # a searched channel cut of densenet takes 13 s
])
def test_rows_add_up_to_the_plan(tmp_path, name: str, nodes: int, direction: str, search: bool) -> None:
    model = save(zoo.build(name, resolution=32, width=0.125), str(tmp_path))
    plan = str(tmp_path / "plan")
    compile_plan(model, plan, nodes=nodes, direction=direction, search=search)
    manifest = read_manifest(plan)
    rows = manifest.compiled.layer_table
    assert len(rows) == manifest.layers
    for n in range(nodes):
        per_node = sum(r.per_node[n].flops for r in rows)
        assert per_node == pytest.approx(manifest.stats.per_node[n].flops, rel=1e-9)
        redundant = sum(r.per_node[n].redundant_flops for r in rows)
        assert redundant == pytest.approx(manifest.stats.per_node[n].redundant_flops, rel=1e-9, abs=1e-6)
    assert sum(r.bytes_sent for r in rows) == manifest.stats.bytes_transferred
    for r in rows:
        ranges = [p.range for p in r.per_node if p.range]
        if r.cut != "whole":  # the owned ranges tile the extent along the cut
            assert sorted(ranges)[0][0] == 0 and all(a[1] == b[0] for a, b in zip(sorted(ranges), sorted(ranges)[1:]))
    assert_exact(plan)


def test_a_layer_without_rule_is_whole_with_its_reason(tmp_path) -> None:
    model = save(conv_then_hardmax(), str(tmp_path))
    plan = str(tmp_path / "plan")
    proc = subprocess.run([os.path.join(BIN, "bbgrap"), "compile", model, "--nodes", "2", "-o", plan, "--quiet"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = {r.name: r for r in read_manifest(plan).compiled.layer_table}
    assert rows["conv"].cut == "h" and [p.range for p in rows["conv"].per_node] == [(0, 8), (8, 16)]
    hardmax = rows["hardmax"].whole
    assert rows["hardmax"].cut == "whole" and hardmax is not None and hardmax.node == 0
    assert hardmax.reason == "no region rule for Hardmax"
    assert hardmax.no_rule is True
    text = subprocess.run([os.path.join(BIN, "bbgrap"), "inspect", plan, "--layers"], capture_output=True, text=True, timeout=60).stdout
    assert "whole on node 0: no region rule for Hardmax" in text
    summary = subprocess.run([os.path.join(BIN, "bbgrap"), "inspect", plan], capture_output=True, text=True, timeout=60).stdout
    assert "layers computed whole on one node: 1" in summary and "hardmax (Hardmax" in summary
    info = json.loads(subprocess.run([os.path.join(BIN, "bbgrap"), "inspect", plan, "--json", "--layers"],
                                     capture_output=True, text=True, timeout=60).stdout)
    assert info["whole"][0]["name"] == "hardmax" and 0 < info["whole"][0]["share"] < 1
    assert len(info["layers_table"]) == 2
    assert_exact(plan)


def test_an_op_of_another_domain_with_a_rule_is_whole_for_its_rules_reason() -> None:
    """A com.microsoft op the registry has a rule for (a channels-last QLinearAveragePool, which
    its rule does not cut) is whole for that rule's reason, not for having no rule; an op of a
    domain without rules is whole for that."""
    rng = np.random.default_rng(0)
    model = single_op("AveragePool", ["x"], {"x": [1, 6, 7, 3]}, {}, 13, kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    graph = import_proto(qoperator(model, Quantization(np.uint8, False, False), rng, channels_last=1)).graph
    pool = graph.layers[-1]
    assert pool.domain == MS_DOMAIN
    assert whole_reason(graph, pool, default_registry()) == "its rule cannot cut this QLinearAveragePool along any axis"
    custom = replace(pool, domain="org.example")
    assert whole_reason(graph, custom, default_registry()) == "no region rule: op of the custom domain 'org.example'"
