"""A text table printed row by row, its header before the first row (the benchmarks
print as they measure, so a long run shows progress)."""

from __future__ import annotations

import re
from typing import Any, Sequence


class Table:
    """Columns as (title, format spec with alignment and width, e.g. "<13", ">10.2f")."""

    def __init__(self, columns: Sequence[tuple[str, str]]) -> None:
        self.columns = list(columns)
        self.printed = False

    def row(self, *values: Any) -> None:
        if not self.printed:
            print("".join(format(title, _frame(spec)) for title, spec in self.columns))
            self.printed = True
        print("".join(format(value, spec) for (_, spec), value in zip(self.columns, values)), flush=True)


def _frame(spec: str) -> str:
    """The alignment and width of a format spec, for its column's title."""
    match = re.match(r"[<>^]?\d*", spec)
    return match.group(0) if match else ""
