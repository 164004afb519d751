"""onnxruntime's threads in one process: one intra-op thread pool for every session.

A pool per session was one set of `threads` spinning threads per segment: a rank of 20
segments with 8 threads owned 160 threads on 8 cores. bbgrap-run starts one pool per
process (`PROCESS_THREAD_POOL.start`) before its first session, and every session the
process then makes takes its options from here (`PROCESS_THREAD_POOL.apply`, or
`probe_options` for a session outside the plan): onnxruntime's environment, which holds
the pool, is process-wide and refuses a session with a pool of its own beside it. So the
record of it is process-wide too, and only bbgrap-run's entry points start it, never
library callers that also make other sessions (the frontend, the tests).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bbgrap.backends.cpu_quota import CpuQuota, cpu_quota
from bbgrap.backends.transports import allgather


@dataclass
class ProcessThreadPool:
    threads: int = 0  # intra-op threads of the process's pool; 0: none, sessions get pools of their own

    def start(self, threads: int) -> None:
        """Once per process, before its first session. Where onnxruntime refuses (its
        environment holds a pool already), sessions keep pools of their own."""
        from onnxruntime.capi import _pybind_state

        if self.threads:
            return
        try:
            _pybind_state.set_global_thread_pool_sizes(threads, 1)
        except Exception:
            return
        self.threads = threads

    def apply(self, opts: Any, threads: int, spin: bool = True) -> None:
        """Run the session of `opts` on the process's pool where one was started (`threads` is then
        the pool's affair), else on a pool of its own of `threads` threads (`spin=False`: its
        threads sleep when idle)."""
        if self.threads:
            opts.use_per_session_threads = False
            return
        if not spin:
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1


PROCESS_THREAD_POOL = ProcessThreadPool()


def probe_options(threads: int = 1) -> Any:
    """Options for a session outside the plan (a probe, a reference run) that onnxruntime
    accepts whether or not the process's pool was started."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    PROCESS_THREAD_POOL.apply(opts, threads, spin=False)
    return opts


def threads_per_rank(ranks_on_host: int, quota: CpuQuota | None = None) -> int:
    """The host's cores shared out among the ranks on it (at least one thread each), at most the
    CPU quota's whole cores where the process runs under one (backends/cpu_quota.py)."""
    threads = max(1, len(os.sched_getaffinity(0)) // ranks_on_host)
    return min(threads, quota.threads()) if quota is not None else threads


def threads_for_rank(affinities: Sequence[Sequence[int]], me: int, quotas: Sequence[CpuQuota | None] = ()) -> int:
    """Threads for local rank `me` given every local rank's CPU affinity: its cores divided
    among the ranks whose cores overlap its own (all of them where mpirun binds nothing;
    only itself where each rank is pinned to cores of its own); where `quotas` (every local
    rank's CPU quota) gives it one, at most the quota's whole cores divided among the ranks
    under the same quota (at least one thread)."""
    mine = set(affinities[me])
    sharing = sum(1 for other in affinities if mine & set(other))
    threads = max(1, len(mine) // max(sharing, 1))
    quota = quotas[me] if me < len(quotas) else None
    if quota is None:
        return threads
    under = sum(1 for q in quotas if q is not None and q.group == quota.group)
    return min(threads, quota.threads(under))


@dataclass(frozen=True)
class HostRanks:
    """The MPI ranks of this host: each one's CPU affinity and CPU quota, and which of them this is."""

    affinities: tuple[tuple[int, ...], ...]
    quotas: tuple[CpuQuota | None, ...]
    me: int

    @property
    def quota(self) -> CpuQuota | None:
        return self.quotas[self.me]

    @property
    def cores(self) -> int:
        """The cores the host's ranks may use, together."""
        return len(set().union(*map(set, self.affinities)))

    def threads(self) -> int:
        """This rank's default threads (`threads_for_rank`)."""
        return threads_for_rank(self.affinities, self.me, self.quotas)


def host_ranks(local: Any) -> HostRanks:
    """This host's ranks (`HostRanks`): a collective over `local` (MPI's COMM_TYPE_SHARED
    communicator), which every local rank calls, whatever else it finds wrong."""
    affinities, quotas = zip(*allgather(local, (tuple(sorted(os.sched_getaffinity(0))), cpu_quota())))
    return HostRanks(tuple(affinities), tuple(quotas), local.Get_rank())


THREADS_PER_CORE_MAX = 4  # --threads beyond this many per core of the host is a typo, not a setting


def threads_problem(threads: int | None) -> str | None:
    """Why --threads `threads` is refused: more than THREADS_PER_CORE_MAX per core this process may
    use (onnxruntime starts every one of them: 20000 took minutes and ignored SIGTERM); None where
    it is fine (or not given)."""
    cores = len(os.sched_getaffinity(0))
    if threads is not None and threads > THREADS_PER_CORE_MAX * cores:
        return (f"--threads {threads} is more than {THREADS_PER_CORE_MAX} per core of this host ({cores} cores); give at most "
                f"{THREADS_PER_CORE_MAX * cores}, or leave it out for the rank's share of the cores")
    return None
