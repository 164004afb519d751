"""The one builder of the ONNX models the tests make by hand.

`build_model` is the short form (float32 inputs by shape, constants by array, outputs by
name, typed from ONNX's shape inference, checked); `value_info`, `graph_of` and `model_of`
are its steps, for what the short form does not say: control-flow bodies, inputs of other
types or symbolic dimensions, declared outputs, initialisers listed among the inputs (old
IR versions), other domains' opsets, models the checker must not see.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

Shape = Sequence[int | str] | None  # None: rank unknown
NO_CONSTANTS: Mapping[str, np.ndarray] = MappingProxyType({})
ONNX_13: Mapping[str, int] = MappingProxyType({"": 13})
IR_VERSION = 8


def value_info(name: str, shape: Shape = None, elem_type: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    """A typed graph input or output (float32 unless `elem_type` says otherwise)."""
    return helper.make_tensor_value_info(name, elem_type, None if shape is None else list(shape))


def value_info_of(name: str, array: np.ndarray) -> onnx.ValueInfoProto:
    """A graph input with the type and shape of `array`."""
    return value_info(name, array.shape, helper.np_dtype_to_tensor_dtype(array.dtype))


def graph_of(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto | str],
    constants: Mapping[str, np.ndarray] = NO_CONSTANTS,
    name: str = "g",
    constants_as_inputs: bool = False,
) -> onnx.GraphProto:
    """A graph (a model's, or a control-flow body): an output given by name only is typed by
    `model_of` from shape inference; `constants` become initialisers, also listed among the
    inputs with `constants_as_inputs` (as IR versions below 4 required)."""
    initializers = [numpy_helper.from_array(np.asarray(value), key) for key, value in constants.items()]
    listed = list(inputs)
    if constants_as_inputs:
        listed += [value_info(t.name, list(t.dims), t.data_type) for t in initializers]
    typed = [out if isinstance(out, onnx.ValueInfoProto) else onnx.ValueInfoProto(name=out) for out in outputs]
    return helper.make_graph(list(nodes), name, listed, typed, initializers)


def model_of(
    graph: onnx.GraphProto,
    opsets: Mapping[str, int] = ONNX_13,
    ir_version: int | None = IR_VERSION,
    producer_name: str | None = None,
    check: bool = True,
    full_check: bool = False,
) -> onnx.ModelProto:
    """`graph` as a model importing `opsets` (domain -> version; ONNX's own domain spelled ""
    or "ai.onnx"), IR version `ir_version` (None: the lowest these opsets allow). Outputs
    without a type get the one ONNX infers (strict mode), so that the checker accepts them;
    then the checker runs, unless `check` is False (a model meant to be invalid, or one of
    another domain's ops the checker does not know)."""
    imports = [helper.make_opsetid(domain, version) for domain, version in opsets.items()]
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = helper.find_min_ir_version_for(imports) if ir_version is None else ir_version
    if producer_name is not None:
        model.producer_name = producer_name
    if any(not out.HasField("type") for out in model.graph.output):
        inferred = {vi.name: vi for vi in onnx.shape_inference.infer_shapes(model, strict_mode=True).graph.output}
        for out in model.graph.output:
            if not out.HasField("type"):
                out.CopyFrom(inferred[out.name])
    if check:
        onnx.checker.check_model(model, full_check=full_check)
    return model


def build_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Mapping[str, Sequence[int]],
    constants: Mapping[str, np.ndarray],
    outputs: Sequence[str],
    opset: int,
    opset_domain: str = "",
) -> onnx.ModelProto:
    """A checked model: float32 graph inputs `inputs`, initialisers `constants`, outputs
    typed from shape inference; `opset_domain` spells the default domain ("" or its alias
    "ai.onnx")."""
    graph = graph_of(nodes, [value_info(n, s) for n, s in inputs.items()], outputs, constants)
    return model_of(graph, {opset_domain: opset})
