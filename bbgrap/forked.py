"""A number worked out in a forked child process while this process works on.

compile uses it to lower and simulate the per-layer search's plan on a second core while it
lowers and simulates the whole-network planner's plan: only the prediction (one float) comes
back, and the plan itself is built again here in the rare case it is the one kept. The child
prints nothing (its progress would interleave with this process's). Where the process has one
core, cannot fork (or the fork fails), or the child fails, the work runs here when its result
is asked for, so the result never depends on the child.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
import warnings
from types import TracebackType
from typing import Callable


def usable_cpus() -> int:
    """The cores this process may run on (its affinity where the OS tells it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class Forked:
    """`work()` started in a forked child on entering the `with` block; `result()` its value.
    Leaving the block reaps the child (and stops it if its result was never asked for)."""

    def __init__(self, work: Callable[[], float]) -> None:
        self._work = work
        self._pid: int | None = None
        self._read: int | None = None

    def __enter__(self) -> Forked:
        if not hasattr(os, "fork") or usable_cpus() < 2:
            return self
        try:
            read, write = os.pipe()
        except OSError:  # out of file descriptors: the work runs here
            return self
        try:
            with warnings.catch_warnings():
                # Python 3.12+ warns that forking a process with threads may deadlock the child: a thread
                # holding a lock at the fork is gone in the child. compile's other threads are the idle
                # pools of onnxruntime (from the reference run) and of numpy's BLAS; the child uses
                # neither (lowering and simulation are Python), and glibc's allocator survives a fork.
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
        except OSError:  # no process to be had (a process limit, no memory): the work runs here
            os.close(read)
            os.close(write)
            return self
        if pid == 0:  # the child: compute quietly, write the value (nothing on failure), leave without cleanup
            os.close(read)
            quiet = os.open(os.devnull, os.O_WRONLY)
            os.dup2(quiet, 1)  # progress and logs are the parent's to print: the work is repeated there on failure
            os.dup2(quiet, 2)
            sys.stdout = sys.stderr = open(os.devnull, "w")  # also where Python's streams are not fds 1 and 2
            try:
                value = repr(float(self._work())).encode()
            except BaseException:
                value = b""
            try:
                os.write(write, value)
            finally:
                os._exit(0)
        os.close(write)
        self._pid, self._read = pid, read
        return self

    def result(self, timeout: float | None = None) -> float:
        """The child's value; computed here where there is no child, it gave none, or it gave none
        within `timeout` seconds (a child stuck for good must not hold the compile: it is stopped)."""
        if self._read is not None:
            chunks: list[bytes] = []
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not select.select([self._read], [], [], left)[0]:
                    chunks = []  # too late: whatever came is not the whole value
                    self._stop()
                    break
                chunk = os.read(self._read, 4096)
                if not chunk:
                    break
                chunks.append(chunk)
            self._reap()
            if chunks:
                return float(b"".join(chunks))
        return float(self._work())

    def _stop(self) -> None:
        if self._pid is not None:
            try:
                os.kill(self._pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _reap(self) -> None:
        if self._read is not None:
            os.close(self._read)
            self._read = None
        if self._pid is not None:
            os.waitpid(self._pid, 0)
            self._pid = None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self._stop()
        self._reap()
