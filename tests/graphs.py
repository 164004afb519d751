"""Small hand-built ONNX graphs for the pass tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def conv_chain(kernels: list[int], channels: int = 2, height: int = 8, width: int = 5, relu_after: bool = False) -> onnx.ModelProto:
    """x → conv(k0) → conv(k1) → … (stride 1, 'same' pads), optionally a Relu at the end."""
    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i, k in enumerate(kernels):
        w = numpy_helper.from_array(rng.standard_normal((channels, channels, k, k)).astype(np.float32) * 0.3, f"w{i}")
        inits.append(w)
        p = (k - 1) // 2
        nodes.append(helper.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], name=f"conv{i}", pads=[p, p, p, p]))
        prev = f"c{i}"
    if relu_after:
        nodes.append(helper.make_node("Relu", [prev], ["r"], name="relu"))
        prev = "r"
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(
        nodes, "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, height, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, height, width])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model
