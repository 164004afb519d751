"""The fuzz test of issue 12: seeded mutants of small zoo models, each compiled in a capped
child process, must each end as one clean error line or as a plan that runs exactly
(see tests/fuzzing.py). Zero tracebacks, zero hangs, zero wrong results.

The quick set runs in the default suite; `pytest -m fuzz_large` runs hundreds more."""

from __future__ import annotations

import os

import fuzzing
import onnx
import pytest


def _report(summary: fuzzing.Summary) -> str:
    counts = ", ".join(f"{k} {v}" for k, v in summary.counts().items())
    seconds = sum(o.seconds for o in summary.outcomes)
    return f"{len(summary.outcomes)} mutants in {seconds:.1f} s: {counts}"


def _check(summary: fuzzing.Summary) -> None:
    print(_report(summary))
    for kind, row in summary.by_mutation().items():
        print(f"  {kind:<18} " + ", ".join(f"{k} {v}" for k, v in sorted(row.items())))
    bad = summary.bad()
    assert not bad, _report(summary) + "\n" + "\n".join(o.describe() for o in bad)
    kinds = summary.counts()
    assert kinds["clean-error"] and kinds["runs-exactly"], "the mutants should exercise both good outcomes"


def test_mutants_are_deterministic() -> None:
    n = len(fuzzing.MUTATIONS)
    a, b = fuzzing.mutants(7, n), fuzzing.mutants(7, n)
    assert [(m.name, m.data, m.nodes, m.flags) for m in a] == [(m.name, m.data, m.nodes, m.flags) for m in b]
    assert len({m.name.split("/")[1].split("(")[0] for m in a}) == len(fuzzing.MUTATIONS)


def test_classification_catches_bad_outcomes(tmp_path) -> None:
    """The harness itself: each bad outcome is caught, with a stand-in for the compiler."""
    import sys
    import time

    import numpy as np
    import onnx

    from bbgrap.cli import main

    good = fuzzing.Mutant("good", fuzzing.base_models()["resnet18"].SerializeToString(), 2)
    nan_model = onnx.ModelProto()
    nan_model.CopyFrom(fuzzing.base_models()["resnet18"])
    fc = next(i for i in nan_model.graph.initializer if i.name == "fc.weight")
    fc.CopyFrom(onnx.numpy_helper.from_array(np.full(onnx.numpy_helper.to_array(fc).shape, np.nan, np.float32), "fc.weight"))
    nan_path = str(tmp_path / "nan.onnx")
    onnx.save(nan_model, nan_path)

    def two_lines(argv: list[str]) -> int:
        print("bbgrap: error: one\nbbgrap: error: two", file=sys.stderr)
        return 2

    def writes_output(argv: list[str]) -> int:
        os.makedirs(argv[argv.index("-o") + 1])
        print("bbgrap: error: one", file=sys.stderr)
        return 2

    def other_model(argv: list[str]) -> int:  # compiles NaN weights: the plan's outputs are NaN
        return main([argv[0], nan_path, *argv[2:]])

    cases: list[tuple[str, fuzzing.Compile | None]] = [
        ("runs-exactly", None),
        ("hang", lambda argv: time.sleep(60) or 0),
        ("traceback", lambda argv: 1 // 0),
        ("bad-error", two_lines),
        ("bad-error", writes_output),
        ("wrong-result", other_model),
    ]
    for k, (kind, fn) in enumerate(cases):
        outcome = fuzzing.run_mutant(good, str(tmp_path / str(k)), timeout=2 if kind == "hang" else 60, compile_fn=fn)
        assert outcome.kind == kind, outcome.describe()
    np_ = np.array
    assert fuzzing._finite_match(np_([1.0, np.inf]), np_([1.0, np.inf])) is None
    assert fuzzing._finite_match(np_([1.0, np.nan]), np_([1.0, 2.0]))
    assert fuzzing._finite_match(np_([1.0, 2.0]), np_([1.0, np.inf]))
    assert fuzzing._finite_match(np_([1.0, 2.1]), np_([1.0, 2.0]))


def test_fuzz_quick(tmp_path) -> None:
    _check(fuzzing.fuzz(seed=12, count=60, root=str(tmp_path)))


@pytest.mark.fuzz_large
def test_fuzz_large(tmp_path) -> None:
    count = int(os.environ.get("BBGRAP_FUZZ_COUNT", "300"))
    _check(fuzzing.fuzz(seed=int(os.environ.get("BBGRAP_FUZZ_SEED", "2026")), count=count, root=str(tmp_path)))


def _named_cases() -> list[tuple[str, fuzzing.Mutant]]:
    """The issue's own examples, one deterministic mutant each (the seeded sets vary them)."""
    import random

    base = fuzzing.base_models()["resnet18"]
    cases: list[tuple[str, fuzzing.Mutant]] = []

    def add(name: str, mutation: fuzzing.Mutation, seed: int = 0, nodes: int = 2) -> None:
        label, model, flags = mutation(fuzzing._copy(base), random.Random(seed))
        data = model if isinstance(model, bytes) else model.SerializeToString()
        cases.append((name, fuzzing.Mutant(f"resnet18/{label}", data, nodes, flags)))

    def set_opset(version: int) -> fuzzing.Mutation:
        def mutate(m, r):  # type: ignore[no-untyped-def]
            m.opset_import[0].version = version
            return f"opset({version})", m, ()
        return mutate

    def dup_graph_output(m, r):  # type: ignore[no-untyped-def]
        m.graph.output.add().CopyFrom(m.graph.output[0])
        return "duplicate-graph-output", m, ()

    def if_node(m, r):  # type: ignore[no-untyped-def]
        return fuzzing.control_flow(m, random.Random(3))

    def dup_node_output(m, r):  # type: ignore[no-untyped-def]
        m.graph.node[5].output[0] = m.graph.node[2].output[0]
        return "duplicate-node-output", m, ()

    def unknown_domain(m, r):  # type: ignore[no-untyped-def]
        m.graph.node[3].domain = "com.example"
        m.opset_import.append(onnx.helper.make_opsetid("com.example", 1))
        return "unknown-domain", m, ()

    add("cycle", fuzzing.cycle)
    add("duplicate node output", dup_node_output)
    add("duplicate graph output", dup_graph_output)
    add("opset 1", set_opset(1))
    add("opset 99", set_opset(99))
    add("unknown domain", unknown_domain)
    add("control flow", if_node)
    add("truncated", fuzzing.truncate, seed=2)
    return cases


@pytest.mark.parametrize("name", [name for name, _ in _named_cases()])
def test_issue_examples_are_clean_errors_or_exact(tmp_path, name: str) -> None:
    mutant = dict(_named_cases())[name]
    outcome = fuzzing.run_mutant(mutant, str(tmp_path), timeout=60)
    assert outcome.kind in fuzzing.GOOD, outcome.describe()
