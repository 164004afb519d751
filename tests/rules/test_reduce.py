"""Reductions and LayerNormalization: every piece of every partition, run in onnxruntime on its
cropped inputs, equals the same part of the whole op's output (tests/rules/helpers.py)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tests.rules.helpers import check_partition, const, rng_of, rules_settings, single_op


@rules_settings(80)
@given(st.data(), st.sampled_from(["ReduceMean", "ReduceSum", "ReduceMax", "ReduceL2", "ReduceSumSquare"]),
       st.integers(2, 4), st.booleans(), st.sampled_from([13, 17, 18]))
def test_reduce(data: st.DataObject, op: str, rank: int, keepdims: bool, opset: int) -> None:
    """Any axes (negative too, or none: all), keepdims or not, axes as an attribute or (opset 18,
    ReduceSum from 13) as a constant input; the axes not reduced can be cut."""
    dims = [data.draw(st.integers(1, 6), label=f"dim {i}") for i in range(rank)]
    axes = sorted(data.draw(st.sets(st.integers(0, rank - 1), max_size=rank), label="axes"))
    axes = [a - rank if data.draw(st.booleans(), label=f"negative {a}") else a for a in axes]
    as_input = opset >= 18 or (op == "ReduceSum" and opset >= 13)
    attrs = {"keepdims": int(keepdims)}
    if as_input and axes:
        model = single_op(op, ["x", "axes"], {"x": dims}, {"axes": np.array(axes, np.int64)}, opset, **attrs)
    else:
        model = single_op(op, ["x"], {"x": dims}, {}, opset, **attrs, **({"axes": axes} if axes else {}))
    reduced = {a % rank for a in axes} or set(range(rank))
    kept = list(range(rank)) if keepdims else [a for a in range(rank) if a not in reduced]
    check_partition(data, model, expect_axes={k for k, a in enumerate(kept) if a not in reduced})


@rules_settings(60)
@given(st.data(), st.integers(2, 4), st.booleans())
def test_layer_norm(data: st.DataObject, rank: int, bias: bool) -> None:
    """The axes from `axis` on are normalised (and read whole with Scale and B); the rest pass through."""
    rng = rng_of(data)
    dims = [data.draw(st.integers(1, 6), label=f"dim {i}") for i in range(rank)]
    axis = data.draw(st.integers(-rank + 1, rank - 1), label="axis")
    start = axis % rank
    consts = {"scale": const(rng, dims[start:])}
    inputs = ["x", "scale"]
    if bias:
        consts["b"] = const(rng, dims[start:])
        inputs.append("b")
    model = single_op("LayerNormalization", inputs, {"x": dims}, consts, 17, axis=axis, epsilon=1e-5)
    check_partition(data, model, expect_axes=set(range(start)))
