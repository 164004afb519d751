"""The region-rule registry: duplicates, unknown ops, groups, and the frontend's use of it."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest
from bbgrap.frontends.onnx import import_proto
from onnx import helper

from bbgrap.ir import GROUPS, Layer
from bbgrap.rules.base import MS_DOMAIN, RegionRule, RuleRegistry
from bbgrap.rules.registry import FAMILIES, build_default_registry, default_registry
from bbgrap.rules.structural import WholeRule
from tests.rules.helpers import build_model, single_op


def _layer(op: str, domain: str = "") -> Layer:
    return Layer("n", op, domain, {}, ("x",), ("y",))


def test_duplicate_registration_raises() -> None:
    registry = RuleRegistry()
    registry.register(["Foo"], WholeRule())
    with pytest.raises(ValueError, match="Foo"):
        registry.register(["Bar", "Foo"], WholeRule())


def test_duplicate_within_one_call_raises() -> None:
    with pytest.raises(ValueError):
        RuleRegistry().register(["Foo", "Foo"], WholeRule())


@pytest.mark.parametrize("family", FAMILIES, ids=lambda family: family.__name__.rsplit(".", 1)[-1])
def test_default_registry_rejects_reregistration(family: ModuleType) -> None:
    """A registry built exactly as the default one refuses every shipped family registered again."""
    registry = build_default_registry()
    with pytest.raises(ValueError, match="registered twice"):
        family.register(registry)


def test_default_registry_rejects_every_shipped_op_again() -> None:
    """Not only a family's first op: each op of the default registry, registered again, is an error."""
    ops = default_registry().op_types()
    assert "Conv" in ops and "MaxPool" in ops and "Relu" in ops
    registry = build_default_registry()
    for op in ops:
        with pytest.raises(ValueError, match=f"region rule for {op} registered twice"):
            registry.register([op], WholeRule())


def test_build_default_registry_builds_the_default_one_anew() -> None:
    built = build_default_registry()
    assert built is not default_registry() and built is not build_default_registry()
    assert built.op_types() == default_registry().op_types()
    assert built.op_types(MS_DOMAIN) == default_registry().op_types(MS_DOMAIN)
    for op in built.op_types():
        assert type(built.rule_of(op)) is type(default_registry().rule_of(op)), op
        assert built.traits(op) == default_registry().traits(op), op


def test_unknown_op_has_no_rule() -> None:
    assert default_registry().get(_layer("NoSuchOp")) is None
    assert "NoSuchOp" not in default_registry()


def test_other_domain_has_no_rule() -> None:
    """Same op name in a custom domain: not ONNX's op, no rule."""
    assert default_registry().get(_layer("Conv", "com.microsoft")) is None
    assert default_registry().get(_layer("Conv", "ai.onnx")) is not None
    assert default_registry().get(_layer("Conv", "")) is not None


QOPERATOR_MS = ["QGemm", "QLinearAdd", "QLinearAveragePool", "QLinearConcat", "QLinearGlobalAveragePool", "QLinearLeakyRelu",
                 "QLinearMul", "QLinearSigmoid"]


def test_com_microsoft_qoperator_ops_have_rules() -> None:
    """onnxruntime's QOperator contrib ops have rules in their own domain only; ONNX's QLinearConv
    and QLinearMatMul in the default one. (Its com.microsoft QuantizeLinear/DequantizeLinear, of
    16-bit types as well, have the standard ones' rule.)"""
    registry = default_registry()
    assert registry.op_types(MS_DOMAIN) == sorted([*QOPERATOR_MS, "QuantizeLinear", "DequantizeLinear"])
    for op in ("QuantizeLinear", "DequantizeLinear"):
        assert registry.get(_layer(op, MS_DOMAIN)) is registry.get(_layer(op)) is not None, op
    for op in QOPERATOR_MS:
        assert registry.get(_layer(op, MS_DOMAIN)) is not None and registry.get(_layer(op)) is None, op
        assert op not in registry
    for op in ("QLinearConv", "QLinearMatMul"):
        assert registry.get(_layer(op)) is not None and registry.get(_layer(op, MS_DOMAIN)) is None, op


def test_domain_registration_is_separate() -> None:
    """One op name registered in two domains is two rules; twice in one domain is an error."""
    registry = RuleRegistry()
    registry.register(["Foo"], WholeRule())
    registry.register(["Foo"], WholeRule(), domain=MS_DOMAIN)
    with pytest.raises(ValueError, match=f"region rule for {MS_DOMAIN}.Foo registered twice"):
        registry.register(["Foo"], WholeRule(), domain=MS_DOMAIN)
    assert registry.rule_of("Foo", "ai.onnx") is registry.rule_of("Foo") is not registry.rule_of("Foo", MS_DOMAIN)


def test_default_registry_is_built_once() -> None:
    assert default_registry() is default_registry()


@pytest.mark.parametrize("op", default_registry().op_types())
def test_every_op_maps_to_rule_with_valid_group(op: str) -> None:
    rule = default_registry().get(_layer(op))
    assert isinstance(rule, RegionRule)
    assert rule.group in GROUPS and rule.group != "opaque"


@pytest.mark.parametrize(
    ("op", "group"),
    [
        ("Conv", "convolutions"),
        ("MaxPool", "pools"),
        ("AveragePool", "pools"),
        ("GlobalAveragePool", "pools"),
        ("LRN", "pools"),
        ("Add", "arithmetic"),
        ("Mul", "arithmetic"),
        ("Relu", "others"),
        ("BatchNormalization", "others"),
        ("Concat", "others"),
        ("Gemm", "others"),
    ],
)
def test_groups_follow_table_3_1(op: str, group: str) -> None:
    assert default_registry().get(_layer(op)).group == group


def test_frontend_tags_layers_with_rule_group() -> None:
    """Imported layers carry their rule's group; ops without a rule are opaque."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Erf", ["r"], ["e"], name="erf"),
        helper.make_node("TopK", ["e", "k"], ["y", "i"], name="topk", axis=1),
    ]
    model = build_model(nodes, {"x": [1, 4]}, {"k": np.array([2], np.int64)}, ["y"], 13)
    graph = import_proto(model).graph
    groups = {layer.name: layer.group for layer in graph.layers}
    assert groups == {"relu": "others", "erf": "others", "topk": "opaque"}
    assert default_registry().get(graph.layer("topk")) is None


def test_single_op_model_imports_one_layer() -> None:
    graph = import_proto(single_op("Relu", ["x"], {"x": [1, 2, 3, 3]}, {}, 13)).graph
    assert [la.op_type for la in graph.layers] == ["Relu"]
