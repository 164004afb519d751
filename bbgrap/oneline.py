"""The commands' argument errors in bbgrap's form: one line naming the problem and the fix, exit 2,
printed once under mpirun. Standard library only, so a command checks its arguments before it
imports anything heavy."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

RANK_ENV = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")  # this process's rank, before MPI starts


def env_rank() -> int:
    """This process's rank as the MPI launcher's environment says (0 outside mpirun), known
    before MPI starts."""
    for name in RANK_ENV:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


class OneLineParser(argparse.ArgumentParser):
    """argparse with bbgrap's error form: one line on stderr (argparse prints the usage above it),
    exit 2; under mpirun printed by rank 0 only (every rank parses the same arguments). Its
    subcommands' parsers are of this class too. An option is spelled whole: argparse's default
    would read `--force` as `--force-nodes`, a different option from the one the user meant."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> Any:  # argparse's signature says NoReturn; it exits
        if env_rank() == 0:
            fix = "" if ";" in message else f"; see {self.prog} --help"  # bbgrap's own messages name their fix
            print(f"{self.prog}: error: {message}{fix}", file=sys.stderr)
        sys.exit(2)
