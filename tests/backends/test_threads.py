"""Threads per rank: every rank's cores, divided among the ranks that share them, and one
onnxruntime thread pool per bbgrap-run process however many segments it runs."""

from __future__ import annotations

import pytest
from bbgrap.backends.threads import threads_for_rank


@pytest.mark.parametrize(("affinities", "me", "threads"), [
    ([[0, 1, 2, 3]] * 2, 0, 2),                            # mpirun binds nothing: 4 cores shared by 2 ranks
    ([[0, 1, 2, 3]] * 4, 3, 1),
    ([list(range(16))] * 3, 1, 5),
    ([[0, 1], [2, 3]], 1, 2),                              # -bind-to core:2: each rank has cores of its own
    ([[0, 1, 2, 3, 4, 5, 6, 7], list(range(8, 16))], 0, 8),
    ([[0, 1, 2], [2, 3], [4, 5]], 0, 1),                   # partly overlapping: ranks 0 and 1 share core 2
    ([[0, 1, 2], [2, 3], [4, 5]], 2, 2),
    ([[0]] * 4, 2, 1),                                     # more ranks than cores: still one thread each
])
def test_threads_for_rank(affinities: list[list[int]], me: int, threads: int) -> None:
    assert threads_for_rank(affinities, me) == threads


def test_a_cpu_quota_caps_the_threads_shared_among_the_ranks_under_it() -> None:
    from bbgrap.backends.cpu_quota import CpuQuota

    pod = CpuQuota(2.5, "/cg/pod", 1)
    # alone under 2.5 cores on 16: two threads, not 16
    assert threads_for_rank([list(range(16))], 0, [pod]) == 2
    # two ranks under the one quota: one thread each; under quotas of their own: two each
    assert threads_for_rank([list(range(16))] * 2, 1, [pod, pod]) == 1
    assert threads_for_rank([list(range(16))] * 2, 1, [pod, CpuQuota(2.5, "/cg/other", 1)]) == 2
    # a quota below one core still leaves one thread; a quota beyond the cores changes nothing
    assert threads_for_rank([[0, 1]], 0, [CpuQuota(0.3, "/cg/small", 2)]) == 1
    assert threads_for_rank([[0, 1]], 0, [CpuQuota(8.0, "/cg/big", 2)]) == 2
    assert threads_for_rank([[0, 1]], 0, [None]) == 2


def test_host_ranks_give_this_ranks_threads_quota_and_the_hosts_cores() -> None:
    from bbgrap.backends.cpu_quota import CpuQuota
    from bbgrap.backends.threads import HostRanks

    pod = CpuQuota(2.5, "/cg/pod", 1)
    host = HostRanks(((0, 1, 2, 3), (4, 5, 6, 7)), (None, pod), 1)
    assert host.quota is pod and host.cores == 8
    assert host.threads() == threads_for_rank(host.affinities, 1, host.quotas) == 2
    assert HostRanks(((0, 1),) * 2, (None, None), 0).threads() == 1 and HostRanks(((0, 1),) * 2, (None, None), 0).cores == 2
