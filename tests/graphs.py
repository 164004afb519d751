"""Small hand-built ONNX graphs for the pass tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper
from onnx_builder import graph_of, model_of, value_info


def conv_chain(kernels: list[int], channels: int = 2, height: int = 8, width: int = 5, relu_after: bool = False) -> onnx.ModelProto:
    """x → conv(k0) → conv(k1) → … (stride 1, 'same' pads), optionally a Relu at the end."""
    rng = np.random.default_rng(0)
    nodes, weights, prev = [], {}, "x"
    for i, k in enumerate(kernels):
        weights[f"w{i}"] = rng.standard_normal((channels, channels, k, k)).astype(np.float32) * 0.3
        p = (k - 1) // 2
        nodes.append(helper.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], name=f"conv{i}", pads=[p, p, p, p]))
        prev = f"c{i}"
    if relu_after:
        nodes.append(helper.make_node("Relu", [prev], ["r"], name="relu"))
        prev = "r"
    nodes[-1].output[0] = "y"
    shape = [1, channels, height, width]
    return model_of(graph_of(nodes, [value_info("x", shape)], [value_info("y", shape)], weights, "chain"))
