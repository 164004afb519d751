"""The fuzz test of issue 12: seeded mutants of small zoo models, each compiled in a capped
child process, must each end as one clean error line or as a plan that runs exactly
(see tests/fuzzing.py). Zero tracebacks, zero hangs, zero wrong results.

The quick set runs in the default suite; `pytest -m fuzz_large` runs hundreds more."""

from __future__ import annotations

import os

import pytest

import fuzzing


def _report(summary: fuzzing.Summary) -> str:
    counts = ", ".join(f"{k} {v}" for k, v in summary.counts().items())
    seconds = sum(o.seconds for o in summary.outcomes)
    return f"{len(summary.outcomes)} mutants in {seconds:.1f} s: {counts}"


def _check(summary: fuzzing.Summary) -> None:
    print(_report(summary))
    bad = summary.bad()
    assert not bad, _report(summary) + "\n" + "\n".join(o.describe() for o in bad)
    kinds = summary.counts()
    assert kinds["clean-error"] and kinds["runs-exactly"], "the mutants should exercise both good outcomes"


def test_mutants_are_deterministic() -> None:
    a, b = fuzzing.mutants(7, 15), fuzzing.mutants(7, 15)
    assert [(m.name, m.data, m.nodes, m.flags) for m in a] == [(m.name, m.data, m.nodes, m.flags) for m in b]
    assert len({m.name.split("/")[1].split("(")[0] for m in a}) == len(fuzzing.MUTATIONS)


def test_classification_catches_bad_outcomes(tmp_path) -> None:
    """The harness itself: a hang, a traceback and a wrong result are each caught."""
    good = fuzzing.mutants(1, 1)[0]
    hang = fuzzing.run_mutant(fuzzing.Mutant("hang", good.data, 1, ("--input-shape",)), str(tmp_path / "a"), timeout=30)
    assert hang.kind == "bad-error"  # argparse's usage message is two lines and no 'bbgrap: error:'
    assert fuzzing._finite_match(__import__("numpy").array([1.0, float("nan")]), __import__("numpy").array([1.0, 2.0]))
    assert fuzzing._finite_match(__import__("numpy").array([1.0, 2.0]), __import__("numpy").array([1.0, 2.0])) is None


def test_fuzz_quick(tmp_path) -> None:
    _check(fuzzing.fuzz(seed=12, count=45, root=str(tmp_path)))


@pytest.mark.fuzz_large
def test_fuzz_large(tmp_path) -> None:
    count = int(os.environ.get("BBGRAP_FUZZ_COUNT", "300"))
    _check(fuzzing.fuzz(seed=int(os.environ.get("BBGRAP_FUZZ_SEED", "2026")), count=count, root=str(tmp_path)))
