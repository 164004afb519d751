"""A rank's CPU quota read from cgroup files (v1 and v2, a limit set on an ancestor), the
clock that leaves the quota's stops out, and a node slowed by the share the quota leaves."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from bbgrap.backends.cpu_quota import WALL, BusyClock, CpuQuota, cpu_quota

from bbgrap.cluster import ClusterProfile, NodeProfile, Scaling, read_profile, write_profile


def fake_proc(tmp_path: Path, mountinfo: str, cgroup: str) -> str:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "mountinfo").write_text(mountinfo)
    (proc / "cgroup").write_text(cgroup)
    return str(proc)


def write(path: Path, **files: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (path / name.replace("__", ".")).write_text(text)


def test_v1_the_tightest_limit_of_the_group_and_its_ancestors(tmp_path: Path) -> None:
    root = tmp_path / "cg" / "cpu"
    write(root, cpu__cfs_quota_us="-1\n", cpu__cfs_period_us="100000\n")
    write(root / "pod", cpu__cfs_quota_us="7500\n", cpu__cfs_period_us="5000\n", cpu__stat="nr_periods 9\nthrottled_time 2500000000\n")
    write(root / "pod" / "rank", cpu__cfs_quota_us="-1\n", cpu__cfs_period_us="100000\n")
    proc = fake_proc(tmp_path, f"30 25 0:26 / {root} rw,nosuid - cgroup cgroup rw,cpu\n"
                               f"31 25 0:27 / {tmp_path}/cg/unified rw - cgroup2 cgroup2 rw\n",
                     "4:memory:/pod/rank\n1:cpu:/pod/rank\n0::/\n")
    quota = cpu_quota(proc)
    assert quota == CpuQuota(1.5, str(root / "pod"), 1, period_s=0.005)  # its own period, which a wait may fill
    assert quota.threads() == 1 and quota.share(1) == 1.0 and quota.share(3) == 0.5
    assert quota.throttled_s() == pytest.approx(2.5)


def test_v2_cpu_max_and_a_mount_that_shows_a_subtree(tmp_path: Path) -> None:
    mount = tmp_path / "cg"
    write(mount, cpu__max="max 100000\n")
    write(mount / "job", cpu__max="250000 100000\n", cpu__stat="usage_usec 7\nthrottled_usec 1500\n")
    # the mount's top is the cgroup /kube/pod: a membership /kube/pod/job is its job directory
    proc = fake_proc(tmp_path, f"40 1 0:30 /kube/pod {mount} rw - cgroup2 cgroup2 rw\n", "0::/kube/pod/job\n")
    quota = cpu_quota(proc)
    assert quota == CpuQuota(2.5, str(mount / "job"), 2)
    assert quota.threads() == 2 and quota.throttled_s() == pytest.approx(1.5e-3)


@pytest.mark.parametrize("limit", ["max 100000\n", "-5 100000\n", "nonsense\n"])
def test_no_quota_or_an_unreadable_one_is_none(tmp_path: Path, limit: str) -> None:
    mount = tmp_path / "cg"
    write(mount, cpu__max=limit)
    assert cpu_quota(fake_proc(tmp_path, f"40 1 0:30 / {mount} rw - cgroup2 cgroup2 rw\n", "0::/\n")) is None


def test_no_cgroup_files_is_none(tmp_path: Path) -> None:
    assert cpu_quota(str(tmp_path / "absent")) is None
    assert cpu_quota(fake_proc(tmp_path, "22 1 8:1 / / rw - ext4 /dev/vda rw\n", "0::/\n")) is None


def test_the_busy_clock_leaves_out_the_stops_booked_between_start_and_since(tmp_path: Path) -> None:
    group = tmp_path / "g"
    write(group, cpu__stat="throttled_time 0\n")
    clock = BusyClock(CpuQuota(0.5, str(group), 1), threads=2)
    mark = clock.start()
    (group / "cpu.stat").write_text("throttled_time 4000000000\n")  # 4 s stopped, over 2 CPUs: 2 s each
    assert clock.since(mark) < -1.0  # far less than the instant that passed: the stops were booked late
    assert WALL.since(WALL.start()) >= 0.0


def test_on_one_thread_under_a_quota_the_busy_clock_is_the_threads_cpu_time(tmp_path: Path) -> None:
    group = tmp_path / "g"
    write(group, cpu__stat="throttled_time 0\n")
    clock = BusyClock(CpuQuota(0.5, str(group), 1), threads=1)
    assert clock.on_cpu_time and not WALL.on_cpu_time and not BusyClock(CpuQuota(0.5, str(group), 1), threads=2).on_cpu_time
    mark = clock.start()
    (group / "cpu.stat").write_text("throttled_time 4000000000\n")  # booked stops do not count here
    time.sleep(0.05)  # nor time off the CPU: sleeping, stopped, or waiting for a core another process holds
    assert 0.0 <= clock.since(mark) < 0.02


def test_best_is_the_fastest_but_the_median_of_the_sound_runs_on_booked_stops(tmp_path: Path) -> None:
    times = [3.0, 1.0, -9.0, 2.0, 5.0]
    assert WALL.best(times) == -9.0  # (a plain clock never gives a negative time)
    assert WALL.best([3.0, 1.0, 2.0]) == 1.0
    assert BusyClock(CpuQuota(0.5, str(tmp_path), 1), threads=1).best([3.0, 1.0, 2.0]) == 1.0  # CPU time
    assert BusyClock(CpuQuota(0.5, str(tmp_path), 1), threads=2).best(times) == 2.5
    assert BusyClock(CpuQuota(0.5, str(tmp_path), 1), threads=2).best([-1.0, -2.0]) == -1.0


def test_a_slowed_node_takes_every_time_over_its_share_and_keeps_it_in_its_toml(tmp_path: Path) -> None:
    node = NodeProfile(conv_ops_per_s=4e9, weight_Bps=8e9, stream_ops_per_s=2e9, cache_bytes=1e6, segment_s=2e-6, cold_s=1e-7,
                       recv_s=5e-7, layer_s={"conv1": 1e-3}, layer_scaling={"conv1": Scaling(0.9, 0.8)})
    slow = node.slowed(0.25)
    assert slow.conv_ops_per_s == 1e9 and slow.weight_Bps == 2e9 and slow.stream_ops_per_s == 5e8 and slow.cache_bytes == 1e6
    assert slow.segment_s == 8e-6 and slow.cold_s == 4e-7 and slow.recv_s == 2e-6 and slow.other_op_s == node.other_op_s * 4
    assert slow.layer_s == {"conv1": 4e-3} and slow.layer_scaling == node.layer_scaling and slow.cpu_share == 0.25
    for kind in ("conv", "depthwise", "matmul", "other"):
        assert slow.layer_time("x", kind, 1e6, 1e6) == pytest.approx(4 * node.layer_time("x", kind, 1e6, 1e6))  # a layer not measured
    path = os.path.join(tmp_path, "cluster.toml")
    write_profile(path, ClusterProfile((node, slow), model_sha256="0" * 64, model_path="m.onnx"))
    assert read_profile(path).nodes[1].cpu_share == 0.25 and read_profile(path).nodes[0].cpu_share == 1.0
