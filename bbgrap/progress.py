"""Progress on stderr for the steps that can take seconds (import, passes, lowering, writing,
loading sessions): one line per step, redrawn in place, only when stderr is a terminal."""

from __future__ import annotations

import sys
import time


class Progress:
    """A one-line progress bar per step on stderr: only when stderr is a terminal, unless
    `enabled` says otherwise (False for --quiet)."""

    def __init__(self, enabled: bool | None = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.last = 0.0

    def __call__(self, label: str, done: int, total: int) -> None:
        now = time.monotonic()
        if not self.enabled or (now - self.last < 0.1 and done < total):
            return
        self.last = now
        width = 30
        filled = int(width * done / max(total, 1))
        sys.stderr.write(f"\r{label:<16} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()
