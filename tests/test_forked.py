"""bbgrap/forked.py: the value comes from a child where the process can fork onto a second core,
and from this process where it cannot or the child fails; the child never outlives the block."""

from __future__ import annotations

import os
import time

import pytest

from bbgrap import forked
from bbgrap.forked import Forked


def test_value_computed_in_a_child_where_there_are_two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forked, "usable_cpus", lambda: 2)
    with Forked(lambda: float(os.getpid())) as pending:
        value = pending.result()
    assert value != float(os.getpid())  # another process worked it out
    assert value > 0


def test_value_computed_here_with_one_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forked, "usable_cpus", lambda: 1)
    with Forked(lambda: float(os.getpid())) as pending:
        assert pending.result() == float(os.getpid())


def test_a_failing_child_is_redone_here_and_its_error_raised_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forked, "usable_cpus", lambda: 2)
    calls: list[int] = []

    def work() -> float:
        calls.append(os.getpid())
        raise ValueError("no plan")

    with Forked(work) as pending, pytest.raises(ValueError, match="no plan"):
        pending.result()
    assert calls == [os.getpid()]  # the child's call is not in this process's list; this one's is


def test_a_child_whose_result_is_not_asked_for_is_stopped_and_reaped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forked, "usable_cpus", lambda: 2)
    block = Forked(lambda: float(__import__("time").sleep(60) or 1.0))
    with block:
        pid = block._pid
        assert pid is not None
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # already reaped: no such child


def test_the_child_prints_nothing(monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(forked, "usable_cpus", lambda: 2)

    def work() -> float:
        print("progress from the child", flush=True)
        os.write(2, b"and on stderr\n")
        return 2.0

    with Forked(work) as pending:
        assert pending.result() == 2.0
    out, err = capfd.readouterr()
    assert "child" not in out and "stderr" not in err


def test_a_fork_that_fails_leaves_the_work_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forked, "usable_cpus", lambda: 2)

    def no_fork() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")  # what a process limit gives

    monkeypatch.setattr(os, "fork", no_fork)
    with Forked(lambda: float(os.getpid())) as pending:
        assert pending.result() == float(os.getpid())


def test_a_child_stuck_past_its_timeout_is_stopped_and_the_work_done_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forked, "usable_cpus", lambda: 2)
    parent = os.getpid()

    def work() -> float:
        if os.getpid() != parent:
            time.sleep(60)  # the child hangs
        return float(os.getpid())

    started = time.monotonic()
    with Forked(work) as pending:
        assert pending.result(timeout=0.5) == float(parent)
    assert time.monotonic() - started < 30
