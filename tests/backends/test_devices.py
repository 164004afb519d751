"""A rank's GPU: its local rank modulo the visible devices."""

from __future__ import annotations

import pytest
from bbgrap.backends.devices import device_for_rank, ranks_per_device, visible_devices


@pytest.mark.parametrize(("environ", "nodes", "expected"), [
    ({"CUDA_VISIBLE_DEVICES": "0"}, ["nvidia0", "nvidia1"], 1),
    ({"CUDA_VISIBLE_DEVICES": "2,3"}, [], 2),
    ({"CUDA_VISIBLE_DEVICES": ""}, ["nvidia0"], 0),
    ({"CUDA_VISIBLE_DEVICES": "0,-1,1"}, [], 1),           # CUDA ignores everything from an invalid entry on
    ({}, ["nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"], 2),
    ({}, [], 0),
])
def test_visible_devices(tmp_path, environ: dict[str, str], nodes: list[str], expected: int) -> None:
    for name in nodes:
        (tmp_path / name).touch()
    assert visible_devices(environ, str(tmp_path)) == expected


@pytest.mark.parametrize(("rank", "devices", "device"), [(0, 1, 0), (1, 1, 0), (3, 1, 0), (1, 2, 1), (2, 2, 0), (5, 4, 1), (1, 0, 0)])
def test_device_for_rank(rank: int, devices: int, device: int) -> None:
    assert device_for_rank(rank, devices) == device


def test_ranks_per_device() -> None:
    assert ranks_per_device(2, 1) == 2 and ranks_per_device(4, 4) == 1 and ranks_per_device(5, 4) == 2 and ranks_per_device(2, 0) == 0
