"""Tests for bbgrap.zoo: every model builds, is valid ONNX, runs, and is seeded."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from bbgrap import zoo

TINY = 0.125


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """Runs ``model`` on CPU with onnxruntime and returns its only output."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"input": x})[0]


def _input(batch: int, resolution: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 3, resolution, resolution), dtype=np.float32)


def _ops(model: onnx.ModelProto) -> Counter[str]:
    return Counter(node.op_type for node in model.graph.node)


def test_names() -> None:
    assert zoo.NAMES == ("vgg16", "resnet18", "resnet50", "mobilenet_v2", "inception", "densenet")


@pytest.mark.parametrize("resolution", [32, 64])
@pytest.mark.parametrize("name", zoo.NAMES)
def test_builds_valid_model_that_runs(name: str, resolution: int) -> None:
    for batch in (1, 2):
        model = zoo.build(name, resolution, batch=batch, width=TINY)
        onnx.checker.check_model(model, full_check=True)
        onnx.shape_inference.infer_shapes(model, strict_mode=True)
        assert model.opset_import[0].version == 17 and model.ir_version <= 9
        assert [i.name for i in model.graph.input] == ["input"]
        assert [o.name for o in model.graph.output] == ["output"]
        names = [node.name for node in model.graph.node]
        assert all(names) and len(set(names)) == len(names)
        y = _run(model, _input(batch, resolution))
        assert y.shape == (batch, zoo.NUM_CLASSES)
        assert np.isfinite(y).all()
        assert y.std() > 0


@pytest.mark.parametrize("name", zoo.NAMES)
def test_output_in_sane_range(name: str) -> None:
    y = _run(zoo.build(name, 64, width=0.25), _input(1, 64))
    if name == "inception":  # ends with Softmax
        np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-5)
        assert y.max() > 10 / zoo.NUM_CLASSES
    else:
        assert 0.1 < np.abs(y).max() < 100
        assert y.std() > 0.01 * np.abs(y).max()


@pytest.mark.parametrize("name", zoo.NAMES)
def test_seeded(name: str) -> None:
    first = zoo.build(name, 32, width=TINY, seed=3)
    assert first.SerializeToString() == zoo.build(name, 32, width=TINY, seed=3).SerializeToString()
    other = zoo.build(name, 32, width=TINY, seed=4)
    x = _input(1, 32)
    assert not np.array_equal(_run(first, x), _run(other, x))


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("vgg16", {"Conv": 13, "MaxPool": 5, "Gemm": 3, "Relu": 15}),
        ("resnet18", {"Conv": 20, "BatchNormalization": 20, "Add": 8, "MaxPool": 1, "GlobalAveragePool": 1}),
        ("resnet50", {"Conv": 53, "BatchNormalization": 53, "Add": 16, "Gemm": 1}),
        ("mobilenet_v2", {"Conv": 52, "Clip": 35, "Add": 10, "Gemm": 1}),
        ("inception", {"Conv": 57, "LRN": 2, "Concat": 9, "MaxPool": 13, "AveragePool": 1, "Softmax": 1}),
        ("densenet", {"Conv": 120, "AveragePool": 3, "Gemm": 1}),
    ],
)
def test_layer_structure(name: str, expected: dict[str, int]) -> None:
    ops = _ops(zoo.build(name, 64, width=TINY))
    assert {op: ops[op] for op in expected} == expected


def _attr(node: onnx.NodeProto, name: str) -> object:
    return next(onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name)


def test_depthwise_and_ceil_mode() -> None:
    mobilenet = zoo.build("mobilenet_v2", 32, width=TINY)
    depthwise = [n for n in mobilenet.graph.node if n.op_type == "Conv" and _attr(n, "group") > 1]
    assert len(depthwise) == 17
    inception = zoo.build("inception", 32, width=TINY)
    ceil = [n for n in inception.graph.node if n.op_type == "MaxPool" and _attr(n, "ceil_mode")]
    assert len(ceil) == 4


@pytest.mark.parametrize(
    ("name", "torchvision_params"),
    [("resnet18", 11_689_512), ("resnet50", 25_557_032), ("mobilenet_v2", 3_504_872), ("densenet", 7_978_856)],
)
def test_full_size_matches_torchvision(name: str, torchvision_params: int) -> None:
    """At width 1 the learnable parameters (BN running stats and Clip bounds aside) match torchvision."""
    model = zoo.build(name)
    learnable = sum(
        int(np.prod(t.dims))
        for t in model.graph.initializer
        if not t.name.endswith(("running_mean", "running_var")) and not t.name.startswith("relu6.")
    )
    assert learnable == torchvision_params


@pytest.mark.parametrize(("resolution", "pool"), [(224, None), (256, (2, 1)), (448, (2, 2)), (512, (4, 2))])
def test_vgg16_pools_large_maps_to_7x7(resolution: int, pool: tuple[int, int] | None) -> None:
    model = zoo.build("vgg16", resolution, width=1 / 32)
    pools = [n for n in model.graph.node if n.op_type == "AveragePool"]
    fc = next(t for t in model.graph.initializer if t.name == "classifier.0.weight")
    side = min(resolution // 32, 7)
    assert fc.dims[1] == 16 * side * side
    if pool is None:
        assert not pools
    else:
        assert (_attr(pools[0], "kernel_shape")[0], _attr(pools[0], "strides")[0]) == pool


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "alexnet"}, "vgg16, resnet18, resnet50, mobilenet_v2, inception, densenet"),
        ({"name": "resnet18", "resolution": 31}, "minimum is 32"),
        ({"name": "resnet18", "width": 0.0}, "width"),
        ({"name": "resnet18", "width": -1.0}, "width"),
        ({"name": "resnet18", "batch": 0}, "batch"),
        ({"name": "resnet18", "resolution": 64.5}, "resolution must be an integer"),
    ],
)
def test_errors(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(zoo.ZooError, match=message):
        zoo.build(**kwargs)  # type: ignore[arg-type]
    assert issubclass(zoo.ZooError, ValueError)
