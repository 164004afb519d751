"""Which GPU a rank uses: its local rank modulo the devices it can see, so ranks
outnumbering the GPUs of a host share them (a host with one GPU runs any number of
ranks on it) instead of asking for a device that is not there."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping


def visible_devices(environ: Mapping[str, str] | None = None, dev: str = "/dev") -> int:
    """The NVIDIA devices this process may use: CUDA_VISIBLE_DEVICES where it is set (an
    empty value hides them all), else the /dev/nvidia<N> device nodes."""
    environ = os.environ if environ is None else environ
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        ids = [d.strip() for d in listed.split(",") if d.strip()]
        # CUDA stops at the first invalid entry (e.g. -1)
        valid = []
        for d in ids:
            if d.startswith("-"):
                break
            valid.append(d)
        return len(valid)
    try:
        return sum(1 for name in os.listdir(dev) if re.fullmatch(r"nvidia\d+", name))
    except OSError:
        return 0


def device_for_rank(local_rank: int, devices: int) -> int:
    """The device of the `local_rank`-th rank on its host (0 where none is visible)."""
    return local_rank % devices if devices > 0 else 0


def ranks_per_device(local_ranks: int, devices: int) -> int:
    """How many ranks share the busiest device (for the note bbgrap-run prints)."""
    return -(-local_ranks // devices) if devices > 0 else 0
