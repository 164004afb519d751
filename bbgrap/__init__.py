"""BBGraP: run one DNN across N machines or GPUs, exactly (see README.md and docs/design.md)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def package_version() -> str:
    try:
        return version("bbgrap")
    except PackageNotFoundError:  # run from a source tree that was not installed
        return "unknown"
