"""backends/engine.py: the session options a plan's segments get."""

from __future__ import annotations

import onnxruntime as ort
from bbgrap.backends.engine import session_options


def test_sessions_without_prepacking_read_the_weights_as_they_are() -> None:
    packed, unpacked = session_options(1, spin=False, prepack=True), session_options(1, spin=False, prepack=False)
    assert unpacked.get_session_config_entry("session.disable_prepacking") == "1"
    # the level-3 optimiser would reorder the convolutions' weights into NCHWc copies of their own
    assert unpacked.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    assert packed.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
