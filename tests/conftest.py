"""Test-wide set-up: `tests/` on the path for the shared helpers, and the markers.

* `mpi`: the test launches real `mpirun` jobs;
* `slow`: end-to-end runs of compiled models, subprocesses, fuzzing: `pytest -m "not slow"`
  is the quick loop (unit and property tests), plain `pytest` (CI) runs everything;
* `fuzz_large`: the larger fuzz set, only with `pytest -m fuzz_large`.
Markers are given by module here, so a new test in one of these modules is marked too.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

MPI_MODULES = {"test_mpi", "test_faults", "test_trace"}
SLOW_MODULES = MPI_MODULES | {"test_e2e", "test_nchwc", "test_search_pass", "test_cli", "test_picture", "test_report",
                              "test_fuzz", "test_plan", "test_runtime_errors", "test_recompute_halos", "test_zoo",
                              "test_exporter_models"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "mpi: launches real mpirun jobs")
    config.addinivalue_line("markers", "slow: end-to-end runs of compiled models, subprocesses or fuzzing (not in the quick loop)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        module = getattr(getattr(item, "module", None), "__name__", "").rsplit(".", 1)[-1]
        if module in MPI_MODULES:
            item.add_marker(pytest.mark.mpi)
        if module in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
