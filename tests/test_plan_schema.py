"""The manifest's schema (bbgrap/plan_schema.py): a compiled plan reads back as the Plan the
compiler returned and writes the same JSON; every required field, missing or of the wrong
type, is one line naming it; what crosses records (nodes, segments, messages, files) is
checked; a plan of another version is refused with "compile it again"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
from helpers import compile_plan, save
from onnx import helper

from bbgrap.ir import BBGrapError
from bbgrap.plan import MANIFEST, manifest_text, read_manifest
from bbgrap.plan_schema import PLAN_VERSION, Plan, PlanSchemaError, PlanVersionError, RunStep, SendStep, WaitStep
from tests.rules.helpers import build_model

MAPS = {"files", "outputs"}  # objects of names, not records: checked whole
# source: absent for a plan built from a model in memory; shapes_from_values, balance: in plans written before them
OPTIONAL = {"source", "shapes_from_values", "balance"}


def conv_then_hardmax_model() -> Any:
    """Rows of a convolution on 2 nodes gathered for Hardmax (no region rule: opaque, whole on
    node 0): messages, an opaque layer and a whole layer's row, all in one small plan."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Hardmax", ["c"], ["y"], name="hardmax", axis=-1)]
    w = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    return build_model(nodes, {"x": [1, 3, 16, 16]}, {"w": w}, ["y"], 13)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Plan, Path]:
    work = tmp_path_factory.mktemp("schema")
    plan = compile_plan(save(conv_then_hardmax_model(), str(work)), str(work / "plan"), nodes=2, search=True,
                        recompute=False)  # else node 0 recomputes the rows node 1 would send
    return plan, work / "plan"


@pytest.fixture()
def raw(compiled: tuple[Plan, Path]) -> dict[str, Any]:
    return json.loads((compiled[1] / MANIFEST).read_text())


def test_the_plan_compiled_is_the_plan_read(compiled: tuple[Plan, Path]) -> None:
    plan, directory = compiled
    assert plan.messages and plan.opaque and plan.compiled.search is not None and plan.compiled.source is not None
    assert any(r.whole is not None for r in plan.compiled.layer_table)
    assert {type(s) for p in plan.programs for s in p.steps} == {RunStep, SendStep, WaitStep}
    assert read_manifest(str(directory)) == plan


def test_json_round_trip_is_identical(compiled: tuple[Plan, Path]) -> None:
    text = (compiled[1] / MANIFEST).read_text()
    plan = Plan.from_json(json.loads(text))
    assert manifest_text(plan.to_json()) == text  # same keys, order, and numbers (an integer stays one)
    assert Plan.from_json(plan.to_json()) == plan
    assert plan.to_json()["version"] == PLAN_VERSION == 5


def fields(value: Any, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    """(path, container, key) of every field of the manifest's records (first item of each list of
    records), list items that are records included."""
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else key
            yield where, value, key
            if key not in MAPS:
                yield from fields(item, where)
    elif isinstance(value, list) and value and isinstance(value[0], dict):
        yield f"{path}[0]", value, 0
        yield from fields(value[0], f"{path}[0]")


def mistyped(value: Any) -> Any:
    """A JSON value of another type than `value`."""
    return "x" if not isinstance(value, str) else 3


def schema_error(manifest: Any) -> str:
    with pytest.raises(PlanSchemaError) as err:
        Plan.from_json(manifest)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_every_field_missing_or_mistyped_is_named(raw: dict[str, Any]) -> None:
    checked = 0
    for path, container, key in list(fields(raw)):
        if path in ("format", "version"):
            continue  # their own errors: below
        original = container[key]
        if isinstance(container, dict) and path not in OPTIONAL:
            del container[key]
            assert f"'{path}' is missing" in schema_error(raw), path
            container[key] = original
        container[key] = mistyped(original)
        assert f"'{path}'" in schema_error(raw), path
        container[key] = original
        checked += 1
    Plan.from_json(raw)  # every change undone
    assert checked > 80


def test_every_field_of_the_planner_record_is_named(tmp_path: Path) -> None:
    plan = compile_plan(save(conv_then_hardmax_model(), str(tmp_path)), str(tmp_path / "plan"), nodes=2, search=True, planner="dp")
    assert plan.compiled.planner is not None and plan.compiled.planner.stats.planner == "dp"
    raw = json.loads((tmp_path / "plan" / MANIFEST).read_text())
    checked = 0
    for path, container, key in list(fields(raw["planner"], "planner")):
        original = container[key]
        del container[key]
        assert f"'{path}' is missing" in schema_error(raw), path
        container[key] = mistyped(original)
        assert f"'{path}'" in schema_error(raw), path
        container[key] = original
        checked += 1
    assert Plan.from_json(raw) == plan
    assert checked == 6 + 10  # the record's fields and its statistics'


def test_optional_source(raw: dict[str, Any]) -> None:
    del raw["source"]
    assert Plan.from_json(raw).compiled.source is None
    raw["search"] = None
    assert Plan.from_json(raw).compiled.search is None


@pytest.mark.parametrize(("edit", "words"), [
    (lambda m: m.update(nodes=3), "'programs' does not hold one program for each of the 3 nodes"),
    (lambda m: m.update(nodes=0), "'nodes' is not a positive integer"),
    (lambda m: m["messages"][0].update(dst=2), "'messages[0].dst' is not a node (0 to 1)"),
    (lambda m: m["programs"][1].update(node=0), "'programs[1].node' is 0, not 1"),
    (lambda m: m["programs"][0]["steps"].append(["run", 99]), "runs segment 99"),
    (lambda m: m["programs"][0]["steps"].append(["wait", 99]), "names message 99, which 'messages' lacks"),
    (lambda m: m["programs"][0]["steps"].append(["jump", 0]), "is not a step"),
    (lambda m: m["programs"][0]["steps"].append(["send", 0]), "is not a step"),
    (lambda m: m["files"].pop(m["programs"][0]["segments"][0]["file"]), "is not one of the plan's 'files'"),
    (lambda m: m["files"].update({"../x": "0"}), "'files' names '../x'"),
    (lambda m: m["stats"]["per_node"].pop(), "'stats.per_node' does not hold one entry for each of the 2 nodes"),
    (lambda m: m.update(inputs=[]), "'inputs' is empty"),
    (lambda m: m["layer_table"][-1].pop("whole_on"), "'layer_table[1].whole_on' is missing"),
])
def test_what_crosses_records_is_checked(raw: dict[str, Any], edit: Any, words: str) -> None:
    edit(raw)
    assert words in schema_error(raw)


def test_a_step_names_a_message_of_its_node(raw: dict[str, Any]) -> None:
    sender = next(m for m in raw["messages"])
    other = 1 - sender["src"]
    raw["programs"][other]["steps"].append(["send", sender["id"], sender["value"]])
    assert f"sends message {sender['id']}, which goes from node {sender['src']}" in schema_error(raw)


@pytest.mark.parametrize("version", [2, 3, 4])
def test_another_version_is_refused(compiled: tuple[Plan, Path], raw: dict[str, Any], tmp_path: Path, version: int) -> None:
    # version 3 plans do not say which segments only the CPU computes exactly (run on a GPU they could be wrong);
    # version 4 plans name their profile with a note appended to its path
    raw["version"] = version
    with pytest.raises(PlanVersionError):
        Plan.from_json(raw)
    (tmp_path / MANIFEST).write_text(json.dumps(raw))
    with pytest.raises(BBGrapError, match=rf"has format version {version}, this bbgrap reads version 5; compile it again"):
        read_manifest(str(tmp_path))
    raw.pop("format")
    assert "not a bbgrap plan manifest" in schema_error(raw)


def test_a_predictions_nodes_and_hosts_are_named_where_missing_or_of_the_wrong_length() -> None:
    from bbgrap.plan_schema import PredictionRecord

    rec = PredictionRecord("p", False, 3, 2, 1.0, (), 2.0, 2.0, {1: 2.0, 2: 1.0, 3: 1.5}, (1, 2), ("b", "c"))
    value = json.loads(json.dumps(rec.to_json()))
    assert PredictionRecord.from_json(value, "compiled.prediction") == rec
    for key in ("profile_nodes", "hosts"):
        with pytest.raises(PlanSchemaError, match=rf"'compiled.prediction.{key}' is missing"):
            PredictionRecord.from_json({k: v for k, v in value.items() if k != key}, "compiled.prediction")
    with pytest.raises(PlanSchemaError, match=r"'compiled.prediction.profile_nodes' is not a list of 2 node numbers"):
        PredictionRecord.from_json({**value, "profile_nodes": [1]}, "compiled.prediction")
    with pytest.raises(PlanSchemaError, match=r"'compiled.prediction.hosts' does not hold one host name for each of the 2 nodes"):
        PredictionRecord.from_json({**value, "hosts": ["b"]}, "compiled.prediction")


def test_a_prediction_names_its_profile_by_path_and_says_apart_whether_it_used_layer_times() -> None:
    """The profile's path is recorded as compile was given it (calibrate --refine opens it; a path
    ending in the words of the note reads back as itself), the layer times beside it."""
    from bbgrap.plan_schema import LAYER_TIMES_NOTE, PredictionRecord

    odd_path = "profiles/p" + LAYER_TIMES_NOTE
    rec = PredictionRecord(odd_path, True, 2, 2, 1.0, (), 2.0, 2.0, {2: 1.0}, (0, 1), ("", ""))
    value = json.loads(json.dumps(rec.to_json()))
    assert value["profile"] == odd_path and value["layer_times"] is True
    back = PredictionRecord.from_json(value, "compiled.prediction")
    assert back == rec and back.profile == odd_path and back.label == odd_path + LAYER_TIMES_NOTE
    assert PredictionRecord.from_json({**value, "layer_times": False}, "compiled.prediction").label == odd_path
    for broken in ({k: v for k, v in value.items() if k != "layer_times"}, {**value, "layer_times": "yes"}):
        with pytest.raises(PlanSchemaError, match=r"'compiled.prediction.layer_times'"):
            PredictionRecord.from_json(broken, "compiled.prediction")
