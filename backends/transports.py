"""Transports: how messages move between nodes. `Mailbox` in one process (a dict), and
`MPITransport` between MPI ranks (mpi4py buffer methods into preallocated buffers),
with the polled waits (`poll`, `allgather`) that keep a waiting rank responsive to
signals. Both fit executor.Transport.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from bbgrap.backends.executor import NodeRunner

    from bbgrap.plan_schema import MessageSpec


class Mailbox:
    """In-process transport: sends land in a dict, receives take from it."""

    def __init__(self) -> None:
        self.box: dict[int, np.ndarray] = {}
        self.events = 0  # sends and receives so far: progress, for deadlock detection

    def start(self) -> None:
        self.box.clear()

    def send(self, msg: MessageSpec, data: np.ndarray) -> None:
        self.box[msg.id] = data
        self.events += 1

    def receive(self, msg: MessageSpec) -> np.ndarray | None:
        data = self.box.pop(msg.id, None)
        self.events += data is not None
        return data

    def progress(self) -> None:
        pass

    def finish(self) -> None:
        pass


def poll(request: Any, nap: float = 0.0) -> None:
    """Wait for one MPI request in a Python loop: inside MPI's blocking Wait this rank would not
    run its signal handlers (exit_on_signal), so a Ctrl-C would leave it waiting for a peer
    that is gone. Test makes the same progress Wait would (MPICH's Wait polls too); `nap`
    seconds of sleep between tests where the wait is not timed and may be long (setup, rank 0
    reporting), so a waiting rank leaves the cores to the ranks still working."""
    poll_until(request.Test, nap)


def poll_until(done: Callable[[], bool], nap: float = 0.0) -> None:
    """Call `done` (an MPI test) until it is true, with `nap` seconds of sleep between calls
    (0: spin), as `poll` waits."""
    while not done():
        if nap:
            time.sleep(nap)


def allgather(comm: Any, value: Any) -> list[Any]:
    """comm.allgather, entered once every rank has arrived (a polled barrier first, see poll)."""
    poll(comm.Ibarrier(), nap=0.001)
    return comm.allgather(value)


class MPITransport:
    """Nonblocking point-to-point transfers into preallocated buffers; `nap`: seconds of sleep
    between two tests of a receive or of the last sends that have not finished (0: spin, the
    fastest where the rank has its cores to itself; a rank under a CPU quota would spend it on
    the wait: backends/cpu_quota.py)."""

    def __init__(self, comm: Any, runner: NodeRunner, nap: float = 0.0) -> None:
        self.comm = comm
        self.nap = nap
        self.incoming = {m.id: m for m in runner.messages.values() if m.dst == runner.node}
        self.buffers = {k: np.empty(m.shape, dtype=m.dtype) for k, m in self.incoming.items()}
        self.recv_requests: dict[int, Any] = {}
        self.send_requests: list[Any] = []
        self.keep: list[np.ndarray] = []

    def start(self) -> None:
        self.recv_requests = {k: self.comm.Irecv(self.buffers[k], source=m.src, tag=k) for k, m in self.incoming.items()}

    def send(self, msg: MessageSpec, data: np.ndarray) -> None:
        data = np.ascontiguousarray(data)
        self.keep.append(data)
        self.send_requests.append(self.comm.Isend(data, dest=msg.dst, tag=msg.id))

    def receive(self, msg: MessageSpec) -> np.ndarray:
        poll(self.recv_requests.pop(msg.id), self.nap)
        return self.buffers[msg.id]

    def progress(self) -> None:
        """Let MPI move the sends posted so far before the next segment. Where the library
        cannot copy a large message straight from the sender's memory (MPICH without CMA, e.g.
        under Ubuntu's default ptrace_scope), the rest of it moves only while the sender is
        inside MPI: mobilenet_v2 on 2 ranks with MPIR_CVAR_CH4_CMA_ENABLE=0, 6.1 -> 5.2-5.4 ms;
        with CMA, unchanged."""
        if self.send_requests:
            from mpi4py import MPI

            # Testsome frees the sends that are done (Testall frees none unless all are), so the
            # list stays short: resnet50, 20 calls per inference, 0.11 -> 0.006 ms.
            MPI.Request.Testsome(self.send_requests)
            self.send_requests = [r for r in self.send_requests if r]

    def finish(self) -> None:
        from mpi4py import MPI

        poll_until(lambda: bool(MPI.Request.Testall(self.send_requests)), self.nap)
        self.send_requests.clear()
        self.keep.clear()
