"""Conv region rule: any output box computed locally equals the whole Conv."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from tests.rules.helpers import check_partition, const, rng_of, rounded_single_op, rules_settings, single_op

SETTINGS = rules_settings(60)


def weights_and_bias(draw: st.DrawFn, rng: np.random.Generator, attrs: dict, group: int, w_shape: list[int],
                     c_out: int) -> tuple[dict, list[str]]:
    """The group attribute (where not 1), weights `w` of `w_shape` and, drawn, a bias of `c_out`:
    the constants and the op's input names."""
    if group != 1:
        attrs["group"] = group
    consts = {"w": const(rng, w_shape)}
    inputs = ["x", "w"]
    if draw(st.booleans(), label="bias"):
        consts["b"] = const(rng, [c_out])
        inputs.append("b")
    return consts, inputs


@st.composite
def conv_models(draw: st.DrawFn, rank: int | None = None) -> tuple:
    data = draw(st.data())
    rng = rng_of(data)
    k = rank if rank is not None else draw(st.sampled_from([1, 2]), label="spatial rank")
    mode = draw(st.sampled_from(["groups1", "depthwise", "grouped"]), label="group mode")
    if mode == "groups1":
        group, c_in, c_out = 1, draw(st.integers(1, 12)), draw(st.integers(1, 12))
    elif mode == "depthwise":
        c_in = draw(st.integers(1, 12))
        group = c_in
        c_out = c_in * draw(st.integers(1, 2))
    else:
        group = draw(st.integers(2, 4))
        c_in = group * draw(st.integers(1, 3))
        c_out = group * draw(st.integers(1, 3))
    kernel = [draw(st.integers(1, 5)) for _ in range(k)]
    strides = [draw(st.integers(1, 3)) for _ in range(k)]
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]), label="auto_pad")
    # onnxruntime refuses dilations with SAME_UPPER / SAME_LOWER
    max_d = 1 if auto_pad.startswith("SAME") else 3
    dilations = [draw(st.integers(1, max_d)) for _ in range(k)]
    eff = [(kk - 1) * d + 1 for kk, d in zip(kernel, dilations)]
    spatial = [draw(st.integers(e, max(e, 20 if k < 3 else 7))) for e in eff]
    batch = draw(st.integers(1, 2))
    attrs: dict = {"strides": strides, "dilations": dilations}
    if draw(st.booleans(), label="kernel_shape attr"):
        attrs["kernel_shape"] = kernel
    if auto_pad == "NOTSET":
        attrs["pads"] = [draw(st.integers(0, kk - 1)) for kk in kernel + kernel]
    else:
        attrs["auto_pad"] = auto_pad
    consts, inputs = weights_and_bias(draw, rng, attrs, group, [c_out, c_in // group, *kernel], c_out)
    opset = draw(st.integers(13, 17), label="opset")
    model = single_op("Conv", inputs, {"x": [batch, c_in, *spatial]}, consts, opset, **attrs)
    return data, model, group


@SETTINGS
@given(conv_models())
def test_conv_any_axis(case: tuple) -> None:
    data, model, _ = case
    check_partition(data, model, expect_axes=set(range(len(model.graph.input[0].type.tensor_type.shape.dim))))


@SETTINGS
@given(conv_models(rank=2))
def test_conv_channel_cuts_split_groups(case: tuple) -> None:
    """Channel cuts, including ones through the middle of groups: whole groups are
    computed and cropped, and the local group count follows."""
    data, model, group = case
    checked = check_partition(data, model, cut_axes=[1])
    w = checked.front.graph.tensors["w"].shape
    per_out = w[0] // group
    for box, local in zip(checked.boxes, checked.locals):
        ch, computed = box.interval(1), local.computes.interval(1)
        if group == 1:
            assert computed == ch and "group" not in local.attrs
        else:
            assert computed.start % per_out == 0 and computed.stop % per_out == 0
            assert computed.start <= ch.start and ch.stop <= computed.stop
            assert computed.start > ch.start - per_out and computed.stop < ch.stop + per_out
            assert int(local.attrs.get("group", group)) == len(computed) // per_out


@SETTINGS
@given(conv_models(rank=2))
def test_conv_spatial_grid(case: tuple) -> None:
    """A 2-D grid of boxes over both spatial axes (padding only at borders)."""
    data, model, _ = case
    check_partition(data, model, cut_axes=[2, 3])


@rules_settings(30)
@given(conv_models(rank=3))
def test_conv_3d(case: tuple) -> None:
    """3-D convolutions (the windowed rule is rank-generic)."""
    data, model, _ = case
    check_partition(data, model, expect_axes={0, 1, 2, 3, 4})


@st.composite
def conv_transpose_models(draw: st.DrawFn, explicit: bool = True) -> tuple:
    """A ConvTranspose of spatial rank 1-3, groups, strides (longer than the kernel too),
    dilations, pads (beyond the kernel too) or VALID, output_padding and bias; with `explicit`
    False, auto_pad SAME_* or output_shape."""
    data = draw(st.data())
    rng = rng_of(data)
    k = draw(st.sampled_from([1, 2, 2, 3]), label="spatial rank")
    group = draw(st.sampled_from([1, 1, 2, 3]), label="group")
    c_in, c_out = group * draw(st.integers(1, 3)), group * draw(st.integers(1, 3))
    kernel = [draw(st.integers(1, 4)) for _ in range(k)]
    strides = [draw(st.integers(1, 3)) for _ in range(k)]
    dilations = [draw(st.integers(1, 2)) for _ in range(k)]
    spatial = [draw(st.integers(1, 9 if k < 3 else 4)) for _ in range(k)]
    attrs: dict = {"strides": strides, "dilations": dilations}
    if draw(st.booleans(), label="kernel_shape attr"):
        attrs["kernel_shape"] = kernel
    if explicit and draw(st.integers(0, 5), label="VALID") == 0:
        attrs["auto_pad"] = "VALID"  # pads of 0
    elif explicit:
        attrs["pads"] = [draw(st.integers(0, (kk - 1) * d + 2)) for kk, d in zip(kernel + kernel, dilations + dilations)]
    if explicit:
        attrs["output_padding"] = [draw(st.integers(0, s - 1)) for s in strides]
        pads = attrs.get("pads", [0] * (2 * k))
        sizes = [(n - 1) * s + (kk - 1) * d + 1 + op - p0 - p1 for n, s, kk, d, op, p0, p1 in
                 zip(spatial, strides, kernel, dilations, attrs["output_padding"], pads[:k], pads[k:])]
        assume(min(sizes) >= 1)
    elif draw(st.booleans(), label="auto_pad"):
        attrs["auto_pad"] = draw(st.sampled_from(["SAME_UPPER", "SAME_LOWER"]))
    else:
        attrs["output_shape"] = [n * s for n, s in zip(spatial, strides)]
    consts, inputs = weights_and_bias(draw, rng, attrs, group, [c_in, c_out // group, *kernel], c_out)
    model = single_op("ConvTranspose", inputs, {"x": [draw(st.integers(1, 2)), c_in, *spatial]}, consts, draw(st.integers(11, 17)), **attrs)
    return data, model, group


@rules_settings(120)
@given(conv_transpose_models())
def test_conv_transpose_any_axis(case: tuple) -> None:
    """U-Net and decoder upsampling (2026-11-24's audit: it had no rule, so it ran whole on one
    node and was priced as one operation an element): every output box, along every axis,
    including rows only the bias reaches (strides longer than the kernel, output_padding)."""
    data, model, _ = case
    check_partition(data, model, expect_axes=set(range(len(model.graph.input[0].type.tensor_type.shape.dim))))


@rules_settings(60)
@given(conv_transpose_models())
def test_conv_transpose_every_row_alone(case: tuple) -> None:
    data, model, _ = case
    rank = len(model.graph.input[0].type.tensor_type.shape.dim)
    check_partition(data, model, cut_axes=[data.draw(st.integers(2, rank - 1), label="axis")], finest=True)


@rules_settings(40)
@given(conv_transpose_models(explicit=False))
def test_conv_transpose_with_auto_pad_or_output_shape_is_cut_by_batch_and_channels(case: tuple) -> None:
    data, model, _ = case
    check_partition(data, model, expect_axes={0, 1})


def test_conv_transpose_is_priced_by_its_multiply_adds() -> None:
    """2·C_in·(C_out/group)·∏kernel per input position (the audit's decoder: 33.6 MFLOP, priced 0.13)."""
    from bbgrap.frontends.onnx import import_proto

    from bbgrap.rules.registry import default_registry

    rng = np.random.default_rng(0)
    model = single_op("ConvTranspose", ["x", "w"], {"x": [1, 32, 32, 32]}, {"w": const(rng, [32, 32, 4, 4])}, 17,
                      strides=[2, 2], pads=[1, 1, 1, 1])
    graph = import_proto(model).graph
    layer = graph.layers[0]
    rule = default_registry().get(layer)
    assert rule is not None
    flops = rule.ops_per_element(layer, graph) * math.prod(graph.tensors[layer.outputs[0]].shape)
    assert flops == pytest.approx(2 * 32 * 32 * 16 * 32 * 32)


@rules_settings(30)
@given(st.data())
def test_a_convolution_by_unpacked_weights_rounded_later_is_cut_to_the_bit(data: st.DataObject) -> None:
    """onnxruntime convolves with weights it does not pack (an activation here; weights a 16-bit
    model dequantizes at run time) along other paths for a single output channel and a single
    output pixel, and any channels of a single pixel, each a last bit off the whole op. Where the
    result is rounded later, such a piece computes a channel or pixel beside it too, and a
    convolution of one pixel is not cut along channels (`multiplies_unpacked`): every piece, down
    to one channel or pixel, is the whole op's to the bit."""
    cin, cout = data.draw(st.integers(1, 12), label="C_in"), data.draw(st.integers(2, 6), label="C_out")
    h, w = data.draw(st.integers(1, 4), label="H"), data.draw(st.integers(1, 4), label="W")
    k = data.draw(st.sampled_from([1, 3]), label="kernel")
    model = rounded_single_op("Conv", ["x", "w"], {"x": [1, cin, h, w], "w": [cout, cin, k, k]}, {}, pads=[k // 2] * 4)
    checked = check_partition(data, model, layer="op", finest=data.draw(st.booleans(), label="finest"), tolerance=0.0)
    assert (1 in checked.axes) == (h * w > 1), checked.axes
    if any(len(box.interval(1)) == 1 for box in checked.boxes) and 1 in checked.cut_axes:
        assert any(local.emits is not None for local in checked.locals), "a piece of one channel computes two"
