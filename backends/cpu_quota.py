"""A rank's CPU quota: Linux CFS bandwidth control, which a container's CPU limit sets.

A process whose cgroup has a quota of q cores may run q x period seconds of CPU in every
period (100 ms by default; Kubernetes' CPU limits set it); past that every thread of the group
stops until the next period. Three things follow for bbgrap-run and calibrate:

* **threads**: onnxruntime threads beyond the quota's cores only spend it sooner. A rank takes
  at most floor(q) threads (at least one), shared with the other local ranks in the same cgroup
  (`backends/threads.py`);
* **waiting**: a rank that spins while it waits for a message spends its quota on the wait and
  is stopped once the message is there. Under a quota bbgrap-run naps WAIT_NAP_S between its
  tests of an unfinished receive (`backends/transports.py`);
* **calibrating**: a run that the quota stopped is timed without the stop (`BusyClock`: on one
  thread its CPU time), and the node's times are then divided by the share of its threads' time
  the quota leaves it (`CpuQuota.share`): over a run of many periods the stops make the node that
  much slower.

cgroup v1 (`cpu.cfs_quota_us` / `cpu.cfs_period_us`, `throttled_time` in ns in `cpu.stat`) and
v2 (`cpu.max`: "QUOTA PERIOD" or "max ...", `throttled_usec` in `cpu.stat`) are read from the
process's cgroup up to its hierarchy's root; the smallest quota found is the limit.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

WAIT_NAP_S = 1e-5  # a rank under a quota sleeps this long between two tests of a receive that has not finished


@dataclass(frozen=True)
class CpuQuota:
    """A cgroup's CPU limit: `cores` (quota over period), where its statistics are, and its
    period (within which a group that waited may still run its whole quota)."""

    cores: float
    group: str  # the directory of the cgroup that sets the limit
    version: int  # 1 or 2
    period_s: float = 0.1  # the CFS period (Linux's default: 100 ms)

    def threads(self, ranks: int = 1) -> int:
        """The most threads each of `ranks` ranks under the quota keeps busy: their share of its
        whole cores, at least one."""
        return max(1, math.floor(self.cores / max(ranks, 1) + 1e-9))

    def share(self, threads: int) -> float:
        """The share of `threads` threads' time the quota leaves them, at most 1."""
        return min(1.0, self.cores / max(threads, 1))

    def throttled_s(self) -> float:
        """Seconds the group has been stopped so far, summed over the CPUs it was stopped on (its
        cpu.stat); 0 where the file cannot be read."""
        key, unit = ("throttled_time", 1e-9) if self.version == 1 else ("throttled_usec", 1e-6)
        try:
            with open(os.path.join(self.group, "cpu.stat"), encoding="ascii") as fh:
                for line in fh:
                    name, _, value = line.partition(" ")
                    if name == key:
                        return int(value) * unit
        except (OSError, ValueError):
            pass
        return 0.0


@dataclass(frozen=True)
class _Hierarchy:
    mount: str  # where it is mounted
    root: str  # the cgroup the mount shows at its top
    version: int


def _hierarchies(mountinfo: str) -> list[_Hierarchy]:
    """The cgroup hierarchies of /proc/PID/mountinfo that hold the cpu controller (v1) or are v2."""
    found = []
    with open(mountinfo, encoding="utf-8") as fh:
        for line in fh:
            parts = line.split()
            if "-" not in parts:
                continue
            sep = parts.index("-")
            fstype, options = parts[sep + 1], parts[sep + 3] if len(parts) > sep + 3 else ""
            mount = parts[4].replace("\\040", " ")
            if fstype == "cgroup" and "cpu" in options.split(","):
                found.append(_Hierarchy(mount, parts[3], 1))
            elif fstype == "cgroup2":
                found.append(_Hierarchy(mount, parts[3], 2))
    return found


def _limit(directory: str, version: int) -> tuple[float, float] | None:
    """The cores one cgroup's own quota allows and its period (s); None where it sets none."""
    try:
        if version == 1:
            with open(os.path.join(directory, "cpu.cfs_quota_us"), encoding="ascii") as fh:
                quota = int(fh.read())
            with open(os.path.join(directory, "cpu.cfs_period_us"), encoding="ascii") as fh:
                period = int(fh.read())
        else:
            with open(os.path.join(directory, "cpu.max"), encoding="ascii") as fh:
                text, _, rest = fh.read().strip().partition(" ")
            if text == "max":
                return None
            quota, period = int(text), int(rest or 100000)
    except (OSError, ValueError):
        return None
    return (quota / period, period / 1e6) if quota > 0 and period > 0 else None


def cpu_quota(proc: str = "/proc/self") -> CpuQuota | None:
    """The CPU quota of the process `proc` describes (this one by default): the smallest limit of
    its cgroup and the cgroup's ancestors, in the cpu hierarchy (v1) or else the unified one (v2);
    None where none is set or the files cannot be read."""
    try:
        hierarchies = _hierarchies(os.path.join(proc, "mountinfo"))
        with open(os.path.join(proc, "cgroup"), encoding="utf-8") as fh:
            memberships = [line.rstrip("\n").split(":", 2) for line in fh if line.count(":") >= 2]
    except OSError:
        return None
    for version in (1, 2):
        paths = [path for hid, controllers, path in memberships
                 if (version == 1 and "cpu" in controllers.split(",")) or (version == 2 and hid == "0" and not controllers)]
        for h in (h for h in hierarchies if h.version == version):
            for path in paths:
                rel = path[len(h.root):] if h.root != "/" and path.startswith(h.root) else path
                directory = os.path.normpath(os.path.join(h.mount, rel.lstrip("/")))
                best: CpuQuota | None = None
                at = directory
                while True:
                    limit = _limit(at, version)
                    if limit is not None and (best is None or limit[0] < best.cores):
                        best = CpuQuota(limit[0], at, version, limit[1])
                    if at == os.path.normpath(h.mount) or not at.startswith(os.path.normpath(h.mount)):
                        break
                    at = os.path.dirname(at)
                if best is not None:
                    return best
    return None


@dataclass(frozen=True)
class BusyClock:
    """A stopwatch that leaves out the time a quota stopped the process (a plain one without a
    quota). On one thread it is that thread's CPU time, which leaves out every stop and every
    moment another process held the core (ranks emulating small nodes on one core). On more,
    the wall clock less the stops the group's statistics book, summed over the CPUs it was
    stopped on, so a run on `threads` threads, all stopped together, subtracts that over
    `threads` (an onnxruntime pool's waiting threads spin, so their CPU time is no measure)."""

    quota: CpuQuota | None = None
    threads: int = 1

    @property
    def on_cpu_time(self) -> bool:
        return self.quota is not None and self.threads == 1

    def start(self) -> tuple[float, float]:
        if self.on_cpu_time:
            return 0.0, time.thread_time()
        stopped = self.quota.throttled_s() if self.quota is not None else 0.0
        return time.perf_counter(), stopped

    def since(self, mark: tuple[float, float]) -> float:
        """Seconds since `mark` (start's), less the stops in between; on more than one thread
        negative where the stops the group's statistics gave that interval outlast it (see `best`)."""
        if self.on_cpu_time:
            return time.thread_time() - mark[1]
        now = time.perf_counter()
        if self.quota is None:
            return now - mark[0]
        return now - mark[0] - (self.quota.throttled_s() - mark[1]) / max(self.threads, 1)

    def best(self, times: Sequence[float]) -> float:
        """What a run takes, from several runs' times on this clock: the fastest (other work on a
        host only ever slows a run down), except on the booked stops of more than one thread under
        a quota: there the median of those that are not negative, because the kernel books a
        group's stops in lumps, late, so one run may be charged a stop of the one before it (a
        1.3 ms run charged 10.5 ms) and another none of its own, and the fastest would be such a run."""
        if self.quota is None or self.on_cpu_time:
            return min(times)
        kept = [t for t in times if t >= 0.0]
        return statistics.median(kept) if kept else max(times)


WALL = BusyClock()
