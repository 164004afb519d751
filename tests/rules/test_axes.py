"""`rule.axes` never offers an axis whose cut breaks exactness: for a range of ops,
every allowed axis is cut into unit pieces (the finest cut) and must stay exact."""

from __future__ import annotations

from typing import Callable

import onnx
from bbgrap.frontends.onnx import import_proto
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

from bbgrap.rules.registry import default_registry
from tests.rules.helpers import build_model, check_partition, const, rng_of, rules_settings, single_op

Factory = Callable[[st.DataObject], onnx.ModelProto]


def _x(data: st.DataObject, rank: int = 4, top: int = 6) -> list[int]:
    return [data.draw(st.integers(1, 2)), data.draw(st.integers(1, top))] + [data.draw(st.integers(1, top)) for _ in range(rank - 2)]


def _conv(data: st.DataObject) -> onnx.ModelProto:
    n, c, h, w = _x(data)
    group = data.draw(st.sampled_from([g for g in (1, 2, 3) if c % g == 0]))
    k = data.draw(st.integers(1, 3))
    h, w = max(h, k), max(w, k)
    return single_op("Conv", ["x", "w", "b"], {"x": [n, c, h, w]},
                     {"w": const(rng_of(data), [2 * group, c // group, k, k]), "b": const(rng_of(data), [2 * group])},
                     13, group=group, strides=[data.draw(st.integers(1, 2))] * 2, pads=[k - 1, 0, 0, k - 1])


def _pool(op: str) -> Factory:
    def make(data: st.DataObject) -> onnx.ModelProto:
        x = _x(data)
        k = data.draw(st.integers(1, 3))
        x[2], x[3] = max(x[2], k), max(x[3], k)
        attrs = {"kernel_shape": [k, k], "strides": [data.draw(st.integers(1, 3))] * 2,
                 "pads": [k - 1, 0, 0, k - 1], "ceil_mode": data.draw(st.integers(0, 1))}
        if op == "AveragePool":
            attrs["count_include_pad"] = data.draw(st.integers(0, 1))
        return single_op(op, ["x"], {"x": x}, {}, 13, **attrs)
    return make


def _simple(op: str, rank: int = 4, opset: int = 13, **attrs: object) -> Factory:
    return lambda data: single_op(op, ["x"], {"x": _x(data, rank)}, {}, opset, **attrs)


def _lrn(data: st.DataObject) -> onnx.ModelProto:
    return single_op("LRN", ["x"], {"x": _x(data)}, {}, 13, size=data.draw(st.sampled_from([1, 3, 5])))


def _bn(data: st.DataObject) -> onnx.ModelProto:
    x = _x(data)
    rng = rng_of(data)
    c = [x[1]]
    return single_op("BatchNormalization", ["x", "s", "b", "m", "v"], {"x": x},
                     {"s": const(rng, c), "b": const(rng, c), "m": const(rng, c), "v": const(rng, c, 0.5, 2)}, 15)


def _add(data: st.DataObject) -> onnx.ModelProto:
    x = _x(data)
    return single_op("Add", ["x", "k"], {"x": x}, {"k": const(rng_of(data), [x[1], 1, 1])}, 13)


def _concat(data: st.DataObject) -> onnx.ModelProto:
    a, b = _x(data), _x(data)
    b[0], b[2], b[3] = a[0], a[2], a[3]
    return single_op("Concat", ["a", "b"], {"a": a, "b": b}, {}, 13, axis=1)


def _gemm(data: st.DataObject) -> onnx.ModelProto:
    m, k, n = (data.draw(st.integers(1, 6)) for _ in range(3))
    return single_op("Gemm", ["a", "b", "c"], {"a": [m, k]}, {"b": const(rng_of(data), [n, k]), "c": const(rng_of(data), [n])}, 13, transB=1)


FACTORIES: dict[str, Factory] = {
    "Conv": _conv,
    "MaxPool": _pool("MaxPool"),
    "AveragePool": _pool("AveragePool"),
    "GlobalAveragePool": _simple("GlobalAveragePool"),
    "LRN": _lrn,
    "BatchNormalization": _bn,
    "Add": _add,
    "Relu": _simple("Relu"),
    "Concat": _concat,
    "Transpose": _simple("Transpose", perm=[0, 2, 3, 1]),
    "Flatten": _simple("Flatten", axis=1),
    "Gemm": _gemm,
    "Softmax-13": _simple("Softmax", axis=1),
    "Softmax-11": _simple("Softmax", opset=11, axis=2),
    "LogSoftmax-13": _simple("LogSoftmax", rank=3),
}


@rules_settings(60)
@given(st.data(), st.sampled_from(sorted(FACTORIES)))
def test_every_allowed_axis_is_exact(data: st.DataObject, name: str) -> None:
    model = FACTORIES[name](data)
    first = check_partition(data, model, cut_axes=[])  # the whole box
    for axis in sorted(first.axes):
        check_partition(data, model, cut_axes=[axis], finest=True)


def test_maxpool_with_indices_is_whole() -> None:
    """MaxPool's Indices output is position-dependent: no axis is offered."""
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], name="op", kernel_shape=[2, 2])
    graph = import_proto(build_model([node], {"x": [1, 2, 4, 4]}, {}, ["y", "i"], 13)).graph
    layer = graph.layers[0]
    assert default_registry().get(layer).axes(layer, graph) == frozenset()
