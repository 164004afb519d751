"""The small float32 ONNX models `bbgrap calibrate` times (one-op models, a layer alone, the
segments of a boundary chain), built in one place."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

Shape = Sequence[int] | None  # None: whatever shape the model makes (outputs only)


def float_model(nodes: Sequence[onnx.NodeProto], inputs: Mapping[str, Shape], outputs: Mapping[str, Shape],
                constants: Mapping[str, np.ndarray], name: str = "calibrate", opset: int = 13,
                output_type: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """A model of `nodes` (default domain, `opset`) with float32 `inputs` and `outputs` (of
    `output_type`) of the given shapes and `constants` as initializers."""
    def info(k: str, shape: Shape, elem_type: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(k, elem_type, None if shape is None else list(shape))

    graph = helper.make_graph(list(nodes), name, [info(k, v) for k, v in inputs.items()],
                              [info(k, v, output_type) for k, v in outputs.items()],
                              initializer=[numpy_helper.from_array(v, k) for k, v in constants.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="bbgrap-calibrate")
    model.ir_version = 7
    return model
