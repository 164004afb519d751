"""Adding an op's rule takes its family module and its test, nothing else: a rule defined here
and registered into a registry built like the default one is used by every stage the compiler
has (frontend, passes, cost model, lowering, the layer table), and the plan is exact.

The op is CumSum (no shipped rule): a running sum along one axis, elementwise along the others
(docs/design.md walks through the same example)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_exact, save
from onnx import helper

from bbgrap.compiler import compile_model
from bbgrap.config import Config, Direction
from bbgrap.ir import Graph, Interval, Layer, ShapeMap
from bbgrap.rules.base import Local, RegionRule, RuleRegistry, all_axes, full, shape
from bbgrap.rules.registry import build_default_registry, default_registry
from tests.rules.helpers import build_model


class CumSumRule(RegionRule):
    """CumSum along its constant `axis`: that axis is never cut and is read whole (whatever
    `exclusive` and `reverse` say); every other axis passes its region through."""

    def _axis(self, layer: Layer, graph: Graph) -> int:
        rank = len(shape(graph, layer.inputs[0]))
        axis = int(np.asarray(graph.constants[layer.inputs[1]]).reshape(-1)[0])
        return axis + rank if axis < 0 else axis

    def axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        if layer.inputs[1] not in graph.constants:
            return frozenset()
        return all_axes(layer, graph) - {self._axis(layer, graph)}

    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        axis = self._axis(layer, graph)
        extent = shape(graph, layer.inputs[0])[axis]
        need = out.with_axis(axis, Interval(0, extent))
        return Local((need, full(graph, layer.inputs[1])), out.with_axis(axis, Interval(0, extent)))

    def ops_per_element(self, layer: Layer, graph: Graph) -> float:
        return 1.0


def with_cumsum() -> RuleRegistry:
    registry = build_default_registry()
    registry.register(["CumSum"], CumSumRule())
    return registry


def conv_cumsum_model():
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("CumSum", ["c", "axis"], ["s"]),
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    constants = {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "axis": np.array(3, dtype=np.int64)}
    return build_model(nodes, {"x": [1, 3, 16, 12]}, constants, ["y"], 17)


@pytest.mark.parametrize("direction", [Direction.H, Direction.C])
def test_a_rule_registered_beside_the_families_is_used_by_every_stage(tmp_path, direction: Direction) -> None:
    assert "CumSum" not in default_registry()
    model = save(conv_cumsum_model(), str(tmp_path))
    shipped = compile_model(model, Config(nodes=2, direction=direction, planner="greedy"), str(tmp_path / "shipped"))
    cumsum = next(r for r in shipped.compiled.layer_table if r.op_type == "CumSum")
    assert cumsum.whole is not None and cumsum.whole.no_rule, cumsum

    plan = str(tmp_path / "plan")
    manifest = compile_model(model, Config(nodes=2, direction=direction, planner="greedy"), plan, registry=with_cumsum())
    cumsum = next(r for r in manifest.compiled.layer_table if r.op_type == "CumSum")
    assert cumsum.cut == direction.value and cumsum.whole is None, cumsum
    assert all(n.flops > 0 for n in cumsum.per_node), "both nodes compute part of the CumSum"
    assert not manifest.opaque
    assert_exact(plan)
