"""The simulator on hand-made programs, the cluster profile's TOML, and compile --profile's choice of node count."""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from bbgrap.frontends.onnx import import_proto
from helpers import save
from onnx import helper, numpy_helper
from onnx_builder import build_model

from bbgrap import zoo
from bbgrap.cli import prediction_text, run_line
from bbgrap.cluster import (
    DEFAULT_PROFILE,
    EIGHT_BIT_NCHW,
    ELEMENT_KINDS,
    ClusterProfile,
    LinkProfile,
    NodeProfile,
    Scaling,
    cache_hits,
    profile_toml,
    read_profile,
    with_speeds,
    write_profile,
)
from bbgrap.compiler import choose_nodes, compile_model, fastest_nodes, model_speeds, pipeline
from bbgrap.config import Config
from bbgrap.cost import receive_cost
from bbgrap.ir import BBGrapError, Graph
from bbgrap.plan import read_manifest
from bbgrap.simulate import (
    EQUAL_SPEEDS,
    Copy,
    LayerWork,
    Layouts,
    SegmentWork,
    SimStep,
    op_kind,
    predict,
    program_steps,
    simulate,
    value_elements,
)

# round numbers: 1e9 conv ops/s, 1e8 other ops/s, 1 ms per segment, 0.1 ms per conv, 0.01 ms per other op, nothing per value or send;
# 2 ms + 1 us per byte per message
NODE = NodeProfile(conv_ops_per_s=1e9, depthwise_ops_per_s=1e9, matmul_ops_per_s=1e9, other_ops_per_s=1e8,
                   conv_op_s=1e-4, depthwise_op_s=1e-4, matmul_op_s=1e-4, other_op_s=1e-5, segment_s=1e-3,
                   value_s=0.0, send_s=0.0)
PROFILE = ClusterProfile((NODE,), LinkProfile(latency_s=2e-3, bandwidth_Bps=1e6))


def run(conv: float = 0.0, other: float = 0.0, convs: int = 0, others: int = 0) -> SimStep:
    """A segment of `convs` convolutions doing `conv` operations in all and `others` "other" ops doing
    `other`; operations of no op count are priced alone (one layer chained into another's kernel: no fixed cost)."""
    layers: list[LayerWork] = []
    for kind, ops, n in (("conv", conv, convs), ("other", other, others)):
        if n:
            layers += [LayerWork(f"{kind}{i}", kind, ops / n, ops / n) for i in range(n)]
        elif ops:
            layers.append(LayerWork(kind, kind, ops, ops, chained=True))
    return SimStep("run", work=SegmentWork(tuple(layers)))


def send(m: int, src: int, dst: int, nbytes: int) -> SimStep:
    return SimStep("send", message=m, src=src, dst=dst, nbytes=nbytes)


def wait(m: int, src: int, dst: int, nbytes: int) -> SimStep:
    return SimStep("wait", message=m, src=src, dst=dst, nbytes=nbytes)


def test_one_segment_costs_its_operations_per_kind_plus_fixed_costs() -> None:
    pred = simulate([[run(conv=1e7, other=1e5, convs=3, others=2)]], PROFILE)
    expected = 1e-3 + 3 * 1e-4 + 2 * 1e-5 + 1e7 / 1e9 + 1e5 / 1e8
    assert math.isclose(pred.latency, expected)
    assert math.isclose(pred.ranks[0].compute, expected) and pred.ranks[0].wait == 0.0


def test_a_rank_waits_until_the_message_arrives() -> None:
    # rank 0: 11 ms segment, sends 1000 bytes (2 ms + 1 ms on the link); rank 1 waits, then runs one 1 ms segment
    steps = [[run(conv=1e7), send(0, 0, 1, 1000)], [wait(0, 0, 1, 1000), run()]]
    pred = simulate(steps, PROFILE)
    assert math.isclose(pred.ranks[0].total, 0.011)
    assert math.isclose(pred.ranks[1].wait, 0.014)
    assert math.isclose(pred.ranks[1].compute, 0.001)
    assert math.isclose(pred.latency, 0.015)


def test_every_value_a_segment_takes_or_gives_costs_value_s() -> None:
    node = replace(NODE, value_s=2e-4)
    work = SegmentWork((LayerWork("c", "conv", 1e7, 1e7),), handed=(0.0,) * 3)
    pred = simulate([[SimStep("run", work=work)]], replace(PROFILE, nodes=(node,)))
    assert math.isclose(pred.latency, 1e-3 + 1e-4 + 1e7 / 1e9 + 3 * 2e-4)


def test_a_segment_run_after_others_pays_cold_segment_s_and_cold_s_for_each_op_and_value() -> None:
    node = replace(NODE, cold_s=3e-5, cold_segment_s=7e-5)
    work = SegmentWork((LayerWork("c", "conv", 1e7, 1e7), LayerWork("a", "other", 5e4, 5e4), LayerWork("b", "other", 5e4, 5e4)), handed=(0.0,) * 4)
    alone = simulate([[SimStep("run", work=work)]], replace(PROFILE, nodes=(node,))).latency
    assert math.isclose(alone, 1e-3 + 1e-4 + 2 * 1e-5 + 1e7 / 1e9 + 1e5 / 1e8)
    after = simulate([[SimStep("run", work=replace(work, after_others=True))]], replace(PROFILE, nodes=(node,))).latency
    assert math.isclose(after - alone, 7e-5 + (1 + 2 + 4) * 3e-5)
    # a profile that did not measure it (the default: 0) prices both alike
    assert simulate([[SimStep("run", work=replace(work, after_others=True))]], PROFILE).latency == pytest.approx(alone)


def test_a_copy_larger_than_the_cache_moves_its_values_beyond_the_cache_at_the_streaming_speed() -> None:
    # 1e8 "other" ops/s in cache, 2.5e7 beyond 1 MB (125 000 values of 8 bytes moved): a 1e5-value
    # crop (0.8 MB) costs its operations only; of a 1e6-value concat (8 MB) the 875 000 values
    # beyond the cache stream
    node = replace(NODE, stream_ops_per_s=2.5e7, cache_bytes=1e6)
    extra = 1 / 2.5e7 - 1 / 1e8  # what a streamed value costs beyond an in-cache one
    assert node.streamed_s(1e5) == 0.0
    assert math.isclose(node.streamed_s(1e6), 8.75e5 * extra)
    # continuous in the size: just past the cache a copy costs hardly more than in it, not 4 times
    assert node.streamed_s(1.25e5) == 0.0 and node.streamed_s(1.26e5) == pytest.approx(1e3 * extra)
    # far beyond it, each further value at the streaming speed
    assert node.streamed_s(2e7) - node.streamed_s(1e7) == pytest.approx(1e7 * extra)
    work = SegmentWork(copies=(Copy(1e5), Copy(1e6)))
    pred = simulate([[SimStep("run", work=work)]], replace(PROFILE, nodes=(node,)))
    assert math.isclose(pred.latency, 1e-3 + 2 * 1e-5 + 1.1e6 / 1e8 + 8.75e5 * extra)
    # a profile that measured no such regime (the default: 0) prices every copy alike
    assert simulate([[SimStep("run", work=work)]], PROFILE).latency == pytest.approx(1e-3 + 2 * 1e-5 + 1.1e6 / 1e8)


def test_a_send_costs_its_sender_send_s_and_leaves_after_it() -> None:
    # rank 0 posts the message 0.5 ms after its segment, so it arrives 0.5 ms later than without
    node = replace(NODE, send_s=5e-4)
    steps = [[run(conv=1e7), send(0, 0, 1, 1000)], [wait(0, 0, 1, 1000), run()]]
    pred = simulate(steps, replace(PROFILE, nodes=(node,)))
    assert math.isclose(pred.ranks[0].compute, 0.011 + 5e-4) and math.isclose(pred.ranks[0].total, 0.0115)
    assert math.isclose(pred.ranks[1].wait, 0.0145) and math.isclose(pred.latency, 0.0155)


def test_a_message_that_is_already_there_costs_no_wait_but_recv_s() -> None:
    steps = [[send(0, 0, 1, 0)], [run(conv=1e8), wait(0, 0, 1, 0)]]
    pred = simulate(steps, PROFILE)
    assert pred.ranks[1].wait == 0.0 and math.isclose(pred.latency, 0.101)
    # taking it costs recv_s, counted as waiting (bbgrap-run's profile counts it so)
    taking = replace(PROFILE, nodes=(replace(NODE, recv_s=3e-4),))
    pred = simulate(steps, taking)
    assert math.isclose(pred.ranks[1].wait, 3e-4) and math.isclose(pred.latency, 0.101 + 3e-4)
    # and where the rank waits, recv_s comes after the arrival
    late = simulate([[run(conv=1e7), send(0, 0, 1, 1000)], [wait(0, 0, 1, 1000), run()]], taking)
    assert math.isclose(late.ranks[1].wait, 0.014 + 3e-4) and math.isclose(late.latency, 0.015 + 3e-4)


def test_a_wait_costs_wait_share_of_the_segment_before_it() -> None:
    """The ranks' jitter: each wait costs `wait_share` of the waiting rank's latest segment more, on
    top of the message's arrival and take, counted as waiting; none before a rank's first segment."""
    jittery = replace(PROFILE, nodes=(replace(NODE, wait_share=0.02),))
    # rank 1 runs 0.101 s, then takes a message that is there: 2 % of 0.101 s more
    there = simulate([[send(0, 0, 1, 0)], [run(conv=1e8), wait(0, 0, 1, 0)]], jittery)
    assert math.isclose(there.ranks[1].wait, 0.02 * 0.101) and math.isclose(there.latency, 0.101 * 1.02)
    # a wait before any segment: nothing more (0.014 s for the message, as without the share)
    first = simulate([[run(conv=1e7), send(0, 0, 1, 1000)], [wait(0, 0, 1, 1000), run()]], jittery)
    assert math.isclose(first.ranks[1].wait, 0.014)
    # the share is of the latest segment only: 1 ms, then 0.101 s, then the wait
    two = simulate([[send(0, 0, 1, 0)], [run(), run(conv=1e8), wait(0, 0, 1, 0)]], jittery)
    assert math.isclose(two.ranks[1].wait, 0.02 * 0.101)
    # the profile keeps it through scaling: a share, not a time
    assert replace(NODE, wait_share=0.02).faster(2.0).wait_share == 0.02


def test_a_message_costs_its_sender_and_its_receiver_per_byte() -> None:
    """send_byte_s a byte more to post; taking it, recv_byte_s a byte from the wait's start, and no
    sooner than recv_s after its arrival (NodeProfile.taken)."""
    node = replace(NODE, send_byte_s=1e-7, recv_s=3e-4, recv_byte_s=2e-6)
    per_byte = replace(PROFILE, nodes=(node,))
    # a late receiver (its segment ends at 0.1 s, the message arrived at 0.0031 s) pays the take: 3e-4 + 1000 x 2e-6
    late = simulate([[send(0, 0, 1, 1000)], [run(conv=1e8), wait(0, 0, 1, 1000)]], per_byte)
    assert math.isclose(late.ranks[0].compute, 1000 * 1e-7)
    assert math.isclose(late.ranks[1].wait, 3e-4 + 2e-3) and math.isclose(late.latency, 0.101 + 3e-4 + 2e-3)
    # an early one waits for the arrival (post 1e-4, latency 2e-3, 1000 B at 1e6 B/s) and recv_s, its take there by then
    early = simulate([[send(0, 0, 1, 1000)], [wait(0, 0, 1, 1000)]], per_byte)
    assert math.isclose(early.latency, 1e-4 + 2e-3 + 1e-3 + 3e-4)
    # taking more than the transfer: the take from the wait's start
    slow = replace(PROFILE, nodes=(replace(node, recv_byte_s=5e-6),))
    assert math.isclose(simulate([[send(0, 0, 1, 1000)], [wait(0, 0, 1, 1000)]], slow).latency, 3e-4 + 5e-3)


def test_messages_on_one_link_go_one_after_another() -> None:
    steps = [[send(0, 0, 1, 1000), send(1, 0, 1, 1000)], [wait(0, 0, 1, 1000), wait(1, 0, 1, 1000)]]
    assert math.isclose(simulate(steps, PROFILE).latency, 2 * (2e-3 + 1e-3))


def test_exchanges_in_both_directions_do_not_deadlock_and_a_missing_send_does() -> None:
    both = [[send(0, 0, 1, 0), wait(1, 1, 0, 0)], [send(1, 1, 0, 0), wait(0, 0, 1, 0)]]
    assert math.isclose(simulate(both, PROFILE).latency, 2e-3)
    with pytest.raises(BBGrapError, match="deadlocked"):
        simulate([[wait(0, 1, 0, 0)], [wait(1, 0, 1, 0)]], PROFILE)


def test_profile_toml_round_trip_and_nodes_past_the_list(tmp_path) -> None:
    profile = ClusterProfile((NODE, NodeProfile(conv_ops_per_s=3e10, cold_s=2.5e-7, cold_segment_s=1.1e-6, recv_s=5e-7, host="gpu-07 \u00e9")),
                             LinkProfile(1e-5, 2.5e9))
    path = str(tmp_path / "cluster.toml")
    write_profile(path, profile, "a comment\non two lines")
    back = read_profile(path)
    assert back.nodes == profile.nodes and back.link == profile.link
    assert back.node(7) == back.nodes[-1]
    assert profile_toml(back) == profile_toml(profile)


def test_profile_with_layer_times_round_trips_names_toml_must_quote(tmp_path) -> None:
    names = {"conv1": 1e-4, "blocks.0/attn.qkv": 2.5e-5, 'odd "name"\\x': 0.0, "ünï": 3e-6}
    profile = ClusterProfile((replace(NODE, layer_s=names), NodeProfile()), LinkProfile(1e-5, 2.5e9), model_sha256="ab" * 32,
                             model_path="/models/m é.onnx")
    path = str(tmp_path / "cluster.toml")
    write_profile(path, profile)
    back = read_profile(path)
    assert back.nodes[0].layer_s == names and back.nodes[1].layer_s == {}
    assert (back.model_sha256, back.model_path) == (profile.model_sha256, profile.model_path)
    assert profile_toml(back) == profile_toml(profile)


def test_a_measured_layer_costs_its_fixed_cost_and_its_share_of_the_rest() -> None:
    node = replace(NODE, layer_s={"conv1": 2e-3})
    assert math.isclose(node.layer_time("conv1", "conv", 5e5, 1e6), 1e-4 + 0.5 * (2e-3 - 1e-4))
    assert math.isclose(node.layer_time("conv1", "conv", 1e6, 1e6), 2e-3)
    assert math.isclose(node.layer_time("other", "conv", 5e5, 1e6), 5e5 / 1e9 + 1e-4)  # not measured: its kind's
    assert math.isclose(replace(NODE, layer_s={"tiny": 1e-6}).layer_time("tiny", "conv", 1.0, 2.0), 1e-6)  # fixed cost at most all


def test_a_measured_layer_with_its_scaling_costs_what_its_rows_and_channels_slopes_say() -> None:
    """Slopes 0.5 along rows, 1 along channels: beyond the kind's fixed cost (1e-4 s), half the
    rows cost 3/4 of the layer, half the output channels (half the weights, half the operations)
    half of it, a quarter tile 3/8; the whole layer costs its measurement."""
    node = replace(NODE, layer_s={"conv1": 2e-3}, layer_scaling={"conv1": Scaling(rows=0.5, channels=1.0)})
    rest = 2e-3 - 1e-4
    assert math.isclose(node.layer_time("conv1", "conv", 1e6, 1e6), 2e-3)
    assert math.isclose(node.layer_time("conv1", "conv", 5e5, 1e6, weight_share=1.0), 1e-4 + 0.75 * rest)
    assert math.isclose(node.layer_time("conv1", "conv", 5e5, 1e6, weight_share=0.5), 1e-4 + 0.5 * rest)
    assert math.isclose(node.layer_time("conv1", "conv", 2.5e5, 1e6, weight_share=0.5), 1e-4 + 0.375 * rest)


def test_profile_with_scaling_round_trips(tmp_path) -> None:
    node = replace(NODE, layer_s={"a": 1e-3, "b b": 2e-3}, layer_scaling={"b b": Scaling(0.25, 1.0)})
    profile = ClusterProfile((node,), LinkProfile(1e-5, 2.5e9), model_sha256="cd" * 32)
    path = str(tmp_path / "cluster.toml")
    write_profile(path, profile)
    back = read_profile(path)
    assert back.nodes[0].layer_scaling == {"b b": Scaling(0.25, 1.0)} and profile_toml(back) == profile_toml(profile)
    assert back.for_model("0" * 64).nodes[0].layer_scaling == {}


def test_a_segment_prices_the_layers_its_node_measured_and_the_rest_by_kind() -> None:
    work = SegmentWork((LayerWork("a", "conv", 1e6, 4e6), LayerWork("b", "conv", 1e6, 1e6), LayerWork("o", "other", 1e5, 1e5)))
    plain = simulate([[SimStep("run", work=work)]], PROFILE).latency
    assert math.isclose(plain, 1e-3 + 2e6 / 1e9 + 2 * 1e-4 + 1e5 / 1e8 + 1e-5)
    measured = ClusterProfile((replace(NODE, layer_s={"a": 9e-3}),), PROFILE.link)
    got = simulate([[SimStep("run", work=work)]], measured).latency
    assert math.isclose(got, plain - (1e6 / 1e9 + 1e-4) + (1e-4 + (9e-3 - 1e-4) / 4))


def test_layer_times_of_another_model_are_not_used(small_model: str, tmp_path) -> None:
    from bbgrap.plan import file_sha256

    layers = {layer: 1.0 for layer in ("conv1", "layer1.0.conv1")}
    other = ClusterProfile((replace(NODE, layer_s=layers),), PROFILE.link, model_sha256="0" * 64)
    assert other.for_model(file_sha256(small_model)).nodes[0].layer_s == {}
    mine = replace(other, model_sha256=file_sha256(small_model))
    assert mine.for_model(file_sha256(small_model)) is mine
    said: list[str] = []
    slow = compile_model(small_model, Config(nodes=1), str(tmp_path / "a"), profile=mine)
    fast = compile_model(small_model, Config(nodes=1), str(tmp_path / "b"), profile=other, log=said.append)
    assert slow.compiled.prediction is not None and fast.compiled.prediction is not None
    assert slow.compiled.prediction.latency_ms > 2000 > fast.compiled.prediction.latency_ms  # two layers of 1 s each
    assert any("layer times are of another model" in line for line in said)


@pytest.mark.parametrize(("text", "problem"), [
    ("[link]\nlatency_s = 1e-5\n", "no \\[\\[node\\]\\]"),
    ("[[node]]\nconv_ops_per_s = 0\n", "'node\\[0\\].conv_ops_per_s' must be a positive number"),
    ("[[node]]\nsegment_s = -1.0\n", "'node\\[0\\].segment_s' must be a number >= 0"),
    ("[[node]]\nconv_flops = 1\n", "unknown key 'node\\[0\\].conv_flops'"),
    ("[[node]]\n[links]\n", "unknown table 'links'"),
    ("[[node]\n", "not valid TOML"),
    ("[[node]]\n[node.layers]\nconv1 = 1e-4\n", "layer times without a \\[model\\] table"),
    ("[model]\nsha256 = \"00\"\n[[node]]\n", "'\\[model\\]' must hold sha256"),
    ('[model]\nsha256 = "%s"\n[[node]]\n[node.layers]\nconv1 = -1.0\n' % ("0" * 64), "'node\\[0\\].layers.\"conv1\"' must be a number >= 0"),
    ("[[node]]\nlayers = 3\n", "'node\\[0\\].layers' must be a table"),
    ('[model]\nsha256 = "%s"\n[[node]]\n[node.layers]\nc = 1.0\n[node.scaling]\nc = [0.5]\n' % ("0" * 64), "must be \\[rows, channels\\]"),
    ('[model]\nsha256 = "%s"\n[[node]]\n[node.layers]\nc = 1.0\n[node.scaling]\nc = [0.5, 1.5]\n' % ("0" * 64), "two slopes from 0 to 1"),
    ('[model]\nsha256 = "%s"\n[[node]]\n[node.layers]\nc = 1.0\n[node.scaling]\nd = [0.5, 1.0]\n' % ("0" * 64), "without a time"),
    ("[[node]]\nscaling = 3\n", "'node\\[0\\].scaling' must be a table"),
    ("[[node]]\nhost = 3\n", "'node\\[0\\].host' must be a string"),
    ("[[node]]\nother_ops = 3\n", "'node\\[0\\].other_ops' must be a table"),
    ("[[node]]\n[node.other_ops]\nMaxPool = 0.0\n", "'node\\[0\\].other_ops.MaxPool' must be a positive number"),
])
def test_bad_profiles_are_one_line_naming_the_key(tmp_path, text: str, problem: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(BBGrapError, match=problem) as err:
        read_profile(str(path))
    assert "\n" not in str(err.value)


def test_value_elements_reads_the_region_in_a_local_value_name() -> None:
    graph = Graph(name="g", layers=(), tensors={}, constants={}, inputs=(), outputs=(), opsets={})
    assert value_elements(graph, "conv1@0:1,0:8,2:5+7:9,0:4") == 1 * 8 * 5 * 4
    assert value_elements(graph, "x@empty") == 0
    assert value_elements(graph, "unknown") == 0


def test_choose_nodes_takes_the_fastest_and_the_fewer_on_a_tie() -> None:
    assert choose_nodes({1: 3.0, 2: 2.0, 4: 2.5}) == 2
    assert choose_nodes({1: 2.0, 2: 2.0}) == 1


def test_more_nodes_must_be_predicted_a_margin_faster_than_fewer() -> None:
    assert choose_nodes({1: 2.0, 2: 1.96}) == 1  # 2 % faster: within the simulator's error
    assert choose_nodes({1: 2.0, 2: 1.9, 4: 1.88}) == 2  # 4 nodes only 1 % faster than 2
    assert choose_nodes({1: 2.0, 2: 1.9, 4: 1.8}) == 4
    assert choose_nodes({1: 2.0, 2: 1.96}, margin=0.0) == 2


@pytest.fixture(scope="module")
def small_model(tmp_path_factory) -> str:
    return save(zoo.build("resnet18", resolution=32, width=0.125), str(tmp_path_factory.mktemp("model")))


def test_compile_with_a_profile_predicts_every_rank_and_the_one_node_plan(small_model: str, tmp_path) -> None:
    plan = compile_model(small_model, Config(nodes=2, planner="greedy"), str(tmp_path / "plan"), profile=DEFAULT_PROFILE, force_nodes=True)
    pred = plan.compiled.prediction
    assert pred is not None and plan.nodes == 2 and pred.nodes == 2 and len(pred.ranks) == 2
    assert set(pred.candidates_ms) == {1, 2}
    assert math.isclose(pred.speedup, pred.one_node_ms / pred.latency_ms, rel_tol=1e-3)
    for r in pred.ranks:
        assert r.compute > 0 and r.total >= r.compute + r.wait - 1e-9
    assert read_manifest(str(tmp_path / "plan")).compiled.prediction == pred  # kept in plan.json


def test_compile_falls_back_to_fewer_nodes_where_more_are_predicted_slower(small_model: str, tmp_path) -> None:
    slow_link = ClusterProfile((NodeProfile(),), LinkProfile(latency_s=1.0, bandwidth_Bps=1e9))
    plan = compile_model(small_model, Config(nodes=3, planner="greedy"), str(tmp_path / "plan"), profile=slow_link)
    assert plan.nodes == 1 and plan.compiled.prediction is not None
    assert plan.compiled.prediction.requested_nodes == 3 and set(plan.compiled.prediction.candidates_ms) == {1, 2, 3}
    forced = compile_model(small_model, Config(nodes=3, planner="greedy"), str(tmp_path / "plan"), profile=slow_link, force_nodes=True)
    assert forced.nodes == 3 and forced.compiled.prediction is not None and forced.compiled.prediction.speedup < 1
    plain = compile_model(small_model, Config(nodes=3, planner="greedy"), str(tmp_path / "plain"))
    assert plain.compiled.prediction is None


def test_fastest_nodes_are_kept_in_node_order_the_first_of_equals_first() -> None:
    assert fastest_nodes((1.0, 3.0, 1.0), 1) == (1,)
    assert fastest_nodes((1.0, 3.0, 2.0), 2) == (1, 2)
    assert fastest_nodes((2.0, 1.0, 2.0, 1.0), 2) == (0, 2)
    assert fastest_nodes((1.0,) * 4, 3) == (0, 1, 2)


def test_a_plan_for_fewer_nodes_runs_on_the_fastest_and_says_which(small_model: str, tmp_path, capsys) -> None:
    """A 1:1:3 cluster whose link costs a second: one node, and that is node 2, the fast one (the
    plan before this ran on node 0, three times slower); the prediction names it and its host,
    and compile's run line starts the rank there."""
    from bbgrap.cli import main

    base = NodeProfile()
    profile = ClusterProfile((replace(base, host="a"), replace(base, host="b"), replace(base.faster(3.0), host="c")),
                             LinkProfile(latency_s=1.0, bandwidth_Bps=1e9))
    plan = compile_model(small_model, Config(nodes=3, planner="greedy"), str(tmp_path / "plan"), profile=profile)
    pred = plan.compiled.prediction
    assert plan.nodes == 1 and pred is not None and pred.profile_nodes == (2,) and pred.hosts == ("c",)
    slow_one = compile_model(small_model, Config(nodes=1), str(tmp_path / "slow"), profile=profile.subset((0,))).compiled.prediction
    assert slow_one is not None and math.isclose(pred.one_node_ms * 3, slow_one.latency_ms, rel_tol=0.05)
    assert read_manifest(str(tmp_path / "plan")).compiled.prediction == pred
    path = tmp_path / "cluster.toml"
    write_profile(str(path), profile)
    assert main(["compile", small_model, "--nodes", "3", "-o", str(tmp_path / "cli"), "--profile", str(path)]) == 0
    out = capsys.readouterr().out
    assert "its node is the profile's fastest, node 2 (c): run its rank there" in out and "mpirun -n 1 bbgrap-run" in out
    two = ClusterProfile((replace(base, host="a"), replace(base.faster(2.0), host="b"), replace(base.faster(3.0), host="c")),
                         LinkProfile(latency_s=1e-3, bandwidth_Bps=1e9))
    forced = compile_model(small_model, Config(nodes=3, planner="greedy"), str(tmp_path / "forced"), profile=two, force_nodes=True)
    assert forced.compiled.prediction is not None and forced.compiled.prediction.profile_nodes == (0, 1, 2)
    assert run_line(forced, "forced") == "run it: mpirun -n 3 bbgrap-run forced"


def test_bbgrap_run_notes_ranks_on_other_hosts_than_their_nodes_where_speeds_differ(small_model: str, tmp_path, capsys) -> None:
    from bbgrap.backends.runtime import misplaced_ranks

    base = NodeProfile()
    mixed = ClusterProfile((replace(base, host="a"), replace(base.faster(3.0), host="b")))
    plan = compile_model(small_model, Config(nodes=2, planner="greedy"), str(tmp_path / "mixed"), profile=mixed, force_nodes=True)
    assert plan.compiled.speeds == (1.0, 3.0)
    assert misplaced_ranks(plan, ["a", "b"]) == []
    assert misplaced_ranks(plan, ["b", "a"]) == [(0, "b", "a"), (1, "a", "b")]
    like = ClusterProfile((replace(base, host="a"), replace(base, host="b")))
    even = compile_model(small_model, Config(nodes=2, planner="greedy"), str(tmp_path / "even"), profile=like, force_nodes=True)
    assert misplaced_ranks(even, ["x", "y"]) == []  # like nodes: any host will do
    unnamed = compile_model(small_model, Config(nodes=2, planner="greedy"), str(tmp_path / "unnamed"),
                            profile=ClusterProfile((base, base.faster(3.0))), force_nodes=True)
    assert misplaced_ranks(unnamed, ["x", "y"]) == []  # hosts not recorded
    # bbgrap-run's report: one note line naming them, and the ranks in --json
    from argparse import Namespace

    import numpy as np
    from bbgrap.backends.runtime import report

    out = {"y": np.ones(1, np.float32)}
    args = Namespace(plan=str(tmp_path / "mixed"), output=None, json=False, quiet=False, check=False, tolerance=1e-4)
    ranks = [{"compute": 0.5, "wait": 0.2, "send": 0.0}] * 2
    assert report(args, plan, out, out, [1e-3], 2, [], 0, [1.0, 1.0], [0.0, 0.0], ranks, misplaced=[(1, "a", "b")]) == 0
    said = capsys.readouterr().out
    assert "note: the plan is cut for nodes of different speeds, and rank 1 on a (its node: b)" in said
    # and the prediction beside the measurement: the latency's, each rank's
    pred = plan.compiled.prediction
    assert pred is not None
    assert f"predicted {pred.latency_ms:.2f} ms by compile --profile" in said and "measured / predicted" in said
    assert f"; predicted compute {pred.ranks[1].compute:.2f} ms, wait {pred.ranks[1].wait:.2f} ms" in said
    # a rank far off its prediction: a note says how to refine the profile by a run; none within 10 %
    off = [{"compute": pred.ranks[0].compute * 1.05, "wait": 0.0, "send": 0.0}, {"compute": pred.ranks[1].compute * 1.3, "wait": 0.0, "send": 0.0}]
    assert report(args, plan, out, out, [1e-3], 2, [], 0, [1.0, 1.0], [0.0, 0.0], off) == 0
    said_off = capsys.readouterr().out
    assert "note: rank(s) 1 computed more than 10% off the prediction" in said_off and f"--profile {pred.profile} " in said_off
    close = [{"compute": pred.ranks[r].compute * f, "wait": 0.0, "send": 0.0} for r, f in ((0, 1.05), (1, 0.95))]
    assert report(args, plan, out, out, [1e-3], 2, [], 0, [1.0, 1.0], [0.0, 0.0], close) == 0
    assert "calibrate --refine" not in capsys.readouterr().out
    assert report(args, plan, out, out, [1e-3], 1, [], 0, [1.0], [0.0]) == 0
    assert "on 2 separate nodes by compile --profile" in capsys.readouterr().out  # one process: no ratio
    assert report(Namespace(**{**vars(args), "json": True}), plan, out, out, [1e-3], 2, [], 0, [1.0, 1.0], [0.0, 0.0],
                  misplaced=[(1, "a", "b")]) == 0
    said = capsys.readouterr().out
    assert '"misplaced_ranks": [1]' in said and f'"predicted_ms": {pred.latency_ms}' in said
    # inspect shows what compile predicted
    from bbgrap.cli import inspect_json, summary

    assert prediction_text(pred) in summary(plan, "mixed") and inspect_json(plan)["prediction"] == pred.to_json()


def test_the_run_line_names_the_hosts_of_the_fastest_nodes_where_they_are_several() -> None:
    from bbgrap.plan_schema import PredictionRecord

    def line(nodes: tuple[int, ...], hosts: tuple[str, ...]) -> str:
        pred = PredictionRecord("p", False, 3, len(nodes), 1.0, (), 2.0, 2.0, {}, nodes, hosts)
        plan = SimpleNamespace(nodes=len(nodes), compiled=SimpleNamespace(prediction=pred))
        return run_line(plan, "bbgrap-plan")  # type: ignore[arg-type]

    assert line((1, 2), ("b", "c")) == "run it: mpirun -n 2 -hosts b,c bbgrap-run"
    assert line((1, 2), ("h", "h")) == "run it: mpirun -n 2 bbgrap-run"  # one host: ranks, not hosts, tell them apart
    assert line((1, 2), ("b", "")) == "run it: mpirun -n 2 bbgrap-run"  # a host not recorded
    assert line((0, 1), ("a", "b")) == "run it: mpirun -n 2 bbgrap-run"  # the first nodes: as mpirun starts them
    two = PredictionRecord("p", False, 3, 2, 1.0, (), 2.0, 2.0, {2: 1.0, 3: 1.1}, (1, 2), ("b", "c"))
    assert "its 2 nodes are the profile's fastest, nodes 1 (b), 2 (c): run rank k on the k-th of them" in prediction_text(two)


def test_model_speeds_are_the_slowest_nodes_time_for_the_model_over_each_nodes(small_model: str) -> None:
    from bbgrap.frontends.onnx import import_model

    graph = import_model(small_model).graph
    base = NodeProfile()
    mixed = ClusterProfile((base, base.faster(3.0), base))
    assert model_speeds(graph, mixed, 3) == (1.0, 3.0, 1.0)
    assert model_speeds(graph, mixed, 4) == (1.0, 3.0, 1.0, 1.0)  # the last node listed stands for the rest
    # like nodes a little apart (calibrate's noise) are equal: even cuts, band pools
    near = ClusterProfile((base, base.faster(1 + EQUAL_SPEEDS / 2)))
    assert model_speeds(graph, near, 2) == (1.0, 1.0)
    assert model_speeds(graph, ClusterProfile((base, base.faster(1 + 2 * EQUAL_SPEEDS))), 2) == (1.0, 1.4)


def test_model_speeds_price_the_one_node_plan_as_the_simulator_does(small_model: str) -> None:
    """Nodes that differ by kind, not by one factor: each one's speed is the simulator's time for the
    one-node plan on the slowest over its own (fused activations, segment costs and all)."""
    from bbgrap.backends.lower import lower
    from bbgrap.frontends.onnx import import_model

    from bbgrap.pass_manager import PassManager

    graph = import_model(small_model).graph
    slow = NodeProfile(conv_ops_per_s=5e9, other_ops_per_s=1e9, other_op_s=2e-5, segment_s=1e-3)
    fast = NodeProfile()
    one = PassManager(pipeline(Config(nodes=1))).run(graph)
    programs, _ = lower(one)
    alone = [predict(one, programs, ClusterProfile((p,))).latency for p in (slow, fast)]
    assert alone[0] > 2 * alone[1]
    assert model_speeds(graph, ClusterProfile((slow, fast)), 2) == (1.0, round(alone[0] / alone[1], 2))


def test_compile_cuts_in_proportion_to_the_profiles_speeds_unless_speeds_are_given(small_model: str, tmp_path) -> None:
    from helpers import assert_exact

    base = NodeProfile()
    profile = ClusterProfile((base, base.faster(3.0), base))
    said: list[str] = []
    plan = compile_model(small_model, Config(nodes=3, planner="greedy"), str(tmp_path / "plan"), profile=profile, force_nodes=True,
                         recompute=False, log=said.append)
    speeds = plan.compiled.speeds
    assert any(line.startswith("node speeds from <default>: 1,3,1") for line in said)
    # then moved by the ranks' predicted compute where that is predicted faster (`balanced_speeds`):
    # this small model's ranks pay the default profile's fixed costs, which do not shrink with a share
    balanced = [line for line in said if line.startswith("node speeds balanced")]
    assert speeds == (1.0, 3.0, 1.0) if not balanced else speeds[1] > 3.0 and f"{speeds[1]:g}" in balanced[-1]
    flops = [n.flops for n in plan.stats.per_node]
    assert flops[1] > 2 * flops[0] and flops[1] > 2 * flops[2]
    assert_exact(str(tmp_path / "plan"))
    given = compile_model(small_model, Config(nodes=3, planner="greedy", speeds=(1.0, 1.0, 1.0)), str(tmp_path / "given"),
                          profile=profile, force_nodes=True, recompute=False)
    assert given.compiled.speeds == (1.0, 1.0, 1.0)
    assert max(n.flops for n in given.stats.per_node) < 1.5 * min(n.flops for n in given.stats.per_node)


def test_program_steps_keep_every_step_of_the_lowered_programs(small_model: str) -> None:
    from bbgrap.backends.lower import lower
    from bbgrap.frontends.onnx import import_model

    from bbgrap.compiler import pipeline
    from bbgrap.pass_manager import PassManager

    graph = PassManager(pipeline(Config(nodes=2, planner="greedy"))).run(import_model(small_model).graph)
    programs, messages = lower(graph)
    steps = program_steps(graph, programs)
    assert [[s.op for s in rank] for rank in steps] == [[s.op for s in p.steps] for p in programs]
    sent = {s.message for rank in steps for s in rank if s.op == "send"}
    assert sent == {m.id for m in messages}
    # every convolution's operations are in some segment: at least what bbgrap/cost.py counts for the owned outputs
    from bbgrap.cost import layer_ops

    convs = sum(layer_ops(layer, graph, graph.partitions[layer.name].out[n]) for layer in graph.layers if layer.op_type == "Conv"
                for n in range(graph.nodes))
    total = sum(s.work.ops["conv"] + s.work.ops["depthwise"] for rank in steps for s in rank if s.work)
    assert total >= convs * 0.999
    # each segment lists the size of every value it takes or gives, and of every copy lowering made
    runs = [s.work for rank in steps for s in rank if s.work]
    segments = [step.seg for program in programs for step in program.steps if step.op == "run"]
    assert [len(w.handed) for w in runs] == [len(seg.inputs) + len(seg.outputs) for seg in segments]
    assert all(v > 0 for w in runs for v in (*w.handed, *(c.values for c in w.copies)))
    assert any(w.copies for w in runs)  # the 2-node plan has crops or concats
    # a node's segments run after its other segments where it has more than one, never where it has one
    for rank in steps:
        works = [s.work for s in rank if s.work]
        assert all(w.after_others == (len(works) > 1) for w in works)
    assert any(len([s for s in rank if s.work]) > 1 for rank in steps)
    one = program_steps(graph, [replace(programs[0], steps=[s for s in programs[0].steps if s.op == "run"][:1])])
    assert one[0][0].work is not None and not one[0][0].work.after_others


def test_a_node_whose_cache_holds_its_weights_and_values_reads_its_filters_for_nothing_and_the_share_kept_of_a_larger_set(small_model: str) -> None:
    """Each rank's segments carry the rank's working set (its pieces' shares of the weights, and every
    value it writes: its pieces', its copies' and those it hands on); a rank whose cache holds it is
    predicted without its convolutions' filter reads, one whose cache holds half of it with the share
    `cache_hits` says is not kept, and one that measured no cache with all of them."""
    from bbgrap.backends.lower import lower
    from bbgrap.frontends.onnx import import_model

    from bbgrap.pass_manager import PassManager
    from bbgrap.simulate import VALUE_BYTES, segment_seconds, working_set

    graph = PassManager(pipeline(Config(nodes=2, planner="greedy"))).run(import_model(small_model).graph)
    programs, _ = lower(graph)
    steps = program_steps(graph, programs)
    sets = []
    for rank in steps:
        works = [s.work for s in rank if s.work]
        pieces = [w for work in works for w in work.layers]
        written = [w.elements for w in pieces] + [c.values for w in works for c in w.copies] + [v for w in works for v in w.handed]
        expected = math.fsum(w.weight_share * w.weight_bytes for w in pieces) + VALUE_BYTES * math.fsum(written)
        assert [w.working_set for w in works] == pytest.approx([expected] * len(works))
        assert expected == pytest.approx(working_set((w.weight_share * w.weight_bytes for w in pieces), written))
        assert any(w.copies for w in works) and math.fsum(written) > sum(w.elements for w in pieces)
        assert any(w.reads > 0 for w in pieces)  # the model's convolutions read filters beyond the probes'
        sets.append(expected)
    node = NodeProfile(conv_ops_per_s=1e10, depthwise_ops_per_s=1e10, conv_read_Bps=1e9, weight_Bps=1e15)  # no weight-bound layer
    held = ClusterProfile(nodes=(replace(node, cache_bytes=max(sets)),))
    half = ClusterProfile(nodes=(replace(node, cache_bytes=min(sets) / 2),))
    none = ClusterProfile(nodes=(node,))
    for rank, work_set in enumerate(sets):
        reads = math.fsum(w.reads for s in steps[rank] if s.work for w in s.work.layers if w.read_ops)

        def gap(profile: ClusterProfile, rank: int = rank) -> float:
            return sum(segment_seconds(s.work, rank, profile) - segment_seconds(s.work, rank, held) for s in steps[rank] if s.work)

        assert gap(none) == pytest.approx(reads / 1e9)
        assert gap(half) == pytest.approx((1.0 - cache_hits(work_set / (min(sets) / 2))) * reads / 1e9) and 0.0 < gap(half) < gap(none)
    assert predict(graph, programs, held).latency < predict(graph, programs, half).latency < predict(graph, programs, none).latency


def test_ops_fused_into_a_convolution_cost_nothing(small_model: str) -> None:
    from bbgrap.backends.lower import lower
    from bbgrap.frontends.onnx import import_model

    from bbgrap.compiler import pipeline
    from bbgrap.pass_manager import PassManager
    from bbgrap.simulate import segment_work, whole_ops

    graph = PassManager(pipeline(Config(nodes=1))).run(import_model(small_model).graph)
    (program,), _ = lower(graph)
    (segment,) = [s.seg for s in program.steps if s.op == "run"]
    work = segment_work(graph, 0, segment, {layer.name: whole_ops(layer, graph) for layer in graph.layers})
    fused = [n for n in segment.nodes if n.op_type in ("BatchNormalization", "Relu")]
    assert fused and work.op_count == len(segment.nodes) - len(fused) - sum(n.op_type == "Add" for n in segment.nodes)


@pytest.mark.parametrize(("flags", "problem"), [
    (["--profile", "{tmp}/missing.toml"], "--profile {tmp}/missing.toml: cannot read it"),
    (["--force-nodes"], "--force-nodes only matters with --profile FILE"),
])
def test_compile_profile_flags_are_checked_first(small_model: str, tmp_path, capsys, flags: list[str], problem: str) -> None:
    from bbgrap.cli import main

    argv = ["compile", small_model, "--nodes", "2", "-o", str(tmp_path / "plan"), *(f.format(tmp=tmp_path) for f in flags)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert problem.format(tmp=tmp_path) in err and err.count("\n") == 1
    assert not (tmp_path / "plan").exists()


def test_compile_prints_each_rank_and_the_fallback(small_model: str, tmp_path, capsys) -> None:
    from bbgrap.cli import main

    profile = tmp_path / "slow-link.toml"
    write_profile(str(profile), ClusterProfile((NodeProfile(),), LinkProfile(latency_s=1.0, bandwidth_Bps=1e9)))
    assert main(["compile", small_model, "--nodes", "2", "-o", str(tmp_path / "plan"), "--profile", str(profile)]) == 0
    out = capsys.readouterr().out
    assert "rank 0: compute" in out
    assert "predicted: 2 nodes are not at least 3% faster than 1" in out and "compiled for 1 node(s) instead" in out
    assert "mpirun -n 1 bbgrap-run" in out


def test_an_unmeasured_convolution_or_matmul_takes_its_operations_or_its_weights_whichever_is_longer() -> None:
    """The roofline: 1e5 operations at 1e9/s take 1e-4 s, 1e6 bytes of weights at 1e8 B/s 1e-2 s;
    a piece reading half the weights (its output channels) streams half; a row cut reads them all;
    an "other" op's constants are not streamed weights; a large map is its operations."""
    node = replace(NODE, weight_Bps=1e8)
    assert math.isclose(node.layer_time("fc", "matmul", 1e5, 1e5, 1.0, 1e6), 1e-2 + 1e-4)
    assert math.isclose(node.layer_time("fc", "matmul", 5e4, 1e5, 0.5, 1e6), 5e-3 + 1e-4)
    assert math.isclose(node.layer_time("conv", "conv", 5e4, 1e5, 1.0, 1e6), 1e-2 + 1e-4)
    assert math.isclose(node.layer_time("add", "other", 1e5, 1e5, 1.0, 1e6), 1e5 / 1e8 + 1e-5)
    assert math.isclose(node.layer_time("conv", "conv", 1e8, 1e8, 1.0, 1e6), 1e8 / 1e9 + 1e-4)
    measured = replace(node, layer_s={"fc": 3e-3})  # a measurement already holds the streaming
    assert math.isclose(measured.layer_time("fc", "matmul", 1e5, 1e5, 1.0, 1e6), 3e-3)


def test_a_segment_prices_a_matmul_by_its_weights_where_they_take_longer() -> None:
    work = SegmentWork((LayerWork("fc", "matmul", 1e5, 1e5, 1.0, 1e6),))
    got = simulate([[SimStep("run", work=work)]], ClusterProfile((replace(NODE, weight_Bps=1e8),), PROFILE.link)).latency
    assert math.isclose(got, 1e-3 + 1e-2 + 1e-4)
    fast = simulate([[SimStep("run", work=work)]], ClusterProfile((replace(NODE, weight_Bps=1e12),), PROFILE.link)).latency
    assert math.isclose(fast, 1e-3 + 1e5 / 1e9 + 1e-4)


def test_weight_bandwidth_round_trips_and_scales_with_a_nodes_speed(tmp_path) -> None:
    profile = ClusterProfile((replace(NODE, weight_Bps=3e9, cached_weight_Bps=9e9),), PROFILE.link)
    path = str(tmp_path / "cluster.toml")
    write_profile(path, profile)
    assert (read_profile(path).nodes[0].weight_Bps, read_profile(path).nodes[0].cached_weight_Bps) == (3e9, 9e9)
    assert [(n.weight_Bps, n.cached_weight_Bps) for n in with_speeds(profile, (1.0, 2.0)).nodes] == [(3e9, 9e9), (6e9, 1.8e10)]
    (tmp_path / "old.toml").write_text("[[node]]\nweight_Bps = 3e9\n")
    assert read_profile(str(tmp_path / "old.toml")).nodes[0].cached_weight_Bps == 0.0  # written before: not measured


def test_the_share_of_weights_a_nodes_cache_keeps_streams_at_the_caches_speed() -> None:
    """A matmul whose weights the node's cache keeps (`kept`) reads them at `cached_weight_Bps`, the
    rest at `weight_Bps`; a profile that did not measure the first reads all at the second."""
    node = replace(NODE, weight_Bps=1e8, cached_weight_Bps=1e9)
    assert math.isclose(node.layer_time("fc", "matmul", 1e5, 1e5, 1.0, 1e6, kept=0.0), 1e6 / 1e8 + 1e-4)
    assert math.isclose(node.layer_time("fc", "matmul", 1e5, 1e5, 1.0, 1e6, kept=1.0), 1e6 / 1e9 + 1e-4)
    assert math.isclose(node.layer_time("fc", "matmul", 1e5, 1e5, 1.0, 1e6, kept=0.25), 0.75e6 / 1e8 + 0.25e6 / 1e9 + 1e-4)
    unmeasured = replace(node, cached_weight_Bps=0.0)
    assert math.isclose(unmeasured.layer_time("fc", "matmul", 1e5, 1e5, 1.0, 1e6, kept=1.0), 1e6 / 1e8 + 1e-4)


def test_the_streaming_regime_round_trips_scales_with_speed_and_may_be_absent(tmp_path) -> None:
    profile = ClusterProfile((replace(NODE, stream_ops_per_s=4e7, cache_bytes=2e6),), PROFILE.link)
    path = str(tmp_path / "cluster.toml")
    write_profile(path, profile)
    node = read_profile(path).nodes[0]
    assert (node.stream_ops_per_s, node.cache_bytes) == (4e7, 2e6)
    assert [n.stream_ops_per_s for n in with_speeds(profile, (1.0, 2.0)).nodes] == [4e7, 8e7]
    (tmp_path / "none.toml").write_text("[[node]]\nstream_ops_per_s = 0\ncache_bytes = 0\n")
    assert read_profile(str(tmp_path / "none.toml")).nodes[0].streamed_s(1e9) == 0.0
    (tmp_path / "bad.toml").write_text("[[node]]\ncache_bytes = -1\n")
    with pytest.raises(BBGrapError, match="cache_bytes' must be a number >= 0"):
        read_profile(str(tmp_path / "bad.toml"))


@pytest.mark.parametrize(("channels", "group", "kind"), [(16, 16, "depthwise"), (16, 2, "grouped"), (64, 8, "grouped"), (32, 2, "conv"),
                                                          (16, 1, "conv")])
def test_a_convolution_is_depthwise_grouped_or_dense_by_its_input_channels_per_group(channels: int, group: int, kind: str) -> None:
    """One input channel per group runs on onnxruntime's depthwise kernel; up to FEW_PER_GROUP (8)
    on a grouped one, several times slower per operation: 16 channels in 2 groups, 64 in 8; 32 in
    2 groups is a dense one."""
    w = np.zeros((channels, channels // group, 3, 3), np.float32)
    model = build_model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1] * 4, group=group)],
                        {"x": [1, channels, 8, 8]}, {"w": w}, ["y"], 17)
    graph = import_proto(model).graph
    assert op_kind(graph.layers[0], graph) == kind


@pytest.mark.parametrize(("cin", "kernel", "group", "kind"), [(8, 1, 1, "pointwise_nchw"), (15, 1, 1, "pointwise_nchw"),
                                                              (3, 1, 1, "pointwise_nchw"), (16, 1, 1, "conv"), (24, 1, 1, "conv"),
                                                              (8, 3, 1, "conv"), (3, 7, 1, "conv"), (8, 1, 8, "depthwise")])
def test_a_1x1_convolution_of_fewer_input_channels_than_a_block_is_priced_as_onnxruntimes_nchw_input_kernel(
        cin: int, kernel: int, group: int, kind: str) -> None:
    """A dense 1x1 float convolution of fewer than NCHWC_BLOCK (16) input channels runs on
    onnxruntime's kernel that takes NCHW input, at a third or less of the blocked kernel's speed:
    "pointwise_nchw"; one of 16 or more, or of a larger kernel (a stem's, on that kernel too but near
    the blocked one's speed), is "conv"; a depthwise one is "depthwise" whatever its channels."""
    w = np.zeros((48, cin // group, kernel, kernel), np.float32)
    model = build_model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[kernel // 2] * 4, group=group)],
                        {"x": [1, cin, 8, 8]}, {"w": w}, ["y"], 17)
    graph = import_proto(model).graph
    assert op_kind(graph.layers[0], graph) == kind


def test_a_1x1_convolution_on_nchw_input_takes_its_kinds_time_and_an_older_profile_prices_it_as_a_dense_one(tmp_path) -> None:
    """A narrow 1x1 convolution's prediction follows `pointwise_nchw_ops_per_s`, not the dense
    throughput; a profile written before that kind was measured gives it the conv figures."""
    w = np.ones((64, 8, 1, 1), np.float32)
    path = save(build_model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv")], {"x": [1, 8, 16, 16]}, {"w": w}, ["y"], 17), str(tmp_path))
    ops = 2.0 * 8 * 64 * 16 * 16

    def latency(node: NodeProfile) -> float:
        c = compile_model(path, Config(nodes=1), str(tmp_path / "plan"), profile=ClusterProfile((node,), PROFILE.link), judge=False)
        return c.compiled.prediction.latency_ms / 1e3

    slow, slower = replace(NODE, pointwise_nchw_ops_per_s=2e7), replace(NODE, pointwise_nchw_ops_per_s=1e7)
    priced = (latency(slower) - latency(slow)) / (1 / 1e7 - 1 / 2e7)  # its operations (and its filters' reads)
    assert ops <= priced < 1.2 * ops
    assert latency(replace(slow, conv_ops_per_s=1e3)) == latency(slow)  # not the dense kernel's throughput
    (tmp_path / "old.toml").write_text("[[node]]\nconv_ops_per_s = 2e11\nconv_op_s = 1e-6\n")
    old = read_profile(str(tmp_path / "old.toml")).nodes[0]
    assert (old.pointwise_nchw_ops_per_s, old.pointwise_nchw_op_s) == (2e11, 1e-6)
    (tmp_path / "new.toml").write_text("[[node]]\nconv_ops_per_s = 2e11\npointwise_nchw_ops_per_s = 3e10\n")
    assert read_profile(str(tmp_path / "new.toml")).nodes[0].pointwise_nchw_ops_per_s == 3e10


@pytest.mark.parametrize(("cin", "cout", "group", "kind"), [(16, 32, 1, "qconv"), (3, 32, 1, "qconv_gemm"), (16, 8, 1, "qconv_gemm"),
                                                            (16, 18, 1, "qconv_gemm"), (16, 16, 16, "qdepthwise"), (32, 32, 2, "qconv_gemm"),
                                                            (16, 16, 8, "grouped")])
def test_an_integer_convolution_is_priced_by_the_kernel_onnxruntime_runs_it_on(cin: int, cout: int, group: int, kind: str) -> None:
    """onnxruntime's direct kernel of an 8-bit convolution takes input channels in fours and at least
    16 output channels in fours, or one channel per group (depthwise): "qconv", "qdepthwise"; any
    other dense or grouped one (more than FEW_PER_GROUP per group) runs as im2col and a GEMM, "qconv_gemm"."""
    qparams = {"xs": np.array(0.1, np.float32), "xz": np.array(128, np.uint8), "ws": np.array(0.01, np.float32),
               "wz": np.array(0, np.int8), "ys": np.array(0.2, np.float32), "yz": np.array(128, np.uint8),
               "w": np.ones((cout, cin // group, 3, 3), np.int8)}
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"], name="qconv", pads=[1] * 4, group=group)
    graph_proto = helper.make_graph([node], "q", [helper.make_tensor_value_info("x", onnx.TensorProto.UINT8, [1, cin, 8, 8])],
                                    [helper.make_tensor_value_info("y", onnx.TensorProto.UINT8, None)],
                                    [numpy_helper.from_array(v, k) for k, v in qparams.items()])
    graph = import_proto(helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)).graph
    assert op_kind(graph.layers[0], graph) == kind


@pytest.mark.parametrize("kind", ELEMENT_KINDS)
def test_a_convolution_of_an_element_kind_pays_for_its_output_values_beside_its_operations(tmp_path, kind: str) -> None:
    """A depthwise convolution (float or integer) and an integer dense one (its direct kernel or
    im2col and a GEMM) pay for each output value at their kind's `elements_per_s` beside their
    operations; no other kind does, nor one whose values were not measured (0)."""
    node = replace(NODE, **{f"{kind}_ops_per_s": 1e10, f"{kind}_elements_per_s": 1e8, f"{kind}_op_s": 1e-4})
    assert math.isclose(node.layer_time("dw", kind, 1e6, 1e6, elements=1e4), 1e6 / 1e10 + 1e4 / 1e8 + 1e-4)
    assert math.isclose(node.layer_time("c", "conv", 1e6, 1e6, elements=1e4), 1e6 / 1e9 + 1e-4)  # no other kind
    unmeasured = replace(node, **{f"{kind}_elements_per_s": 0.0})
    assert math.isclose(unmeasured.layer_time("dw", kind, 1e6, 1e6, elements=1e4), 1e6 / 1e10 + 1e-4)  # 0: not measured
    # a segment's layer pays it; a node twice as fast pays half; the profile keeps it
    work = SegmentWork((LayerWork("dw", kind, 1e6, 1e6, 1.0, 0.0, 1e4),))
    profile = ClusterProfile((node,), PROFILE.link)
    assert math.isclose(simulate([[SimStep("run", work=work)]], profile).latency, 1e-3 + 1e6 / 1e10 + 1e4 / 1e8 + 1e-4)
    assert with_speeds(profile, (2.0,)).nodes[0].element_time(kind, 1e4) == 1e4 / 2e8
    path = str(tmp_path / "cluster.toml")
    write_profile(path, profile)
    assert getattr(read_profile(path).nodes[0], f"{kind}_elements_per_s") == 1e8


@pytest.mark.parametrize(("fused", "group", "priced"), [("Clip", 1, True), ("Relu", 1, False), ("Add", 1, False), ("Relu", 2, True)])
def test_an_op_fused_into_a_convolution_is_priced_on_its_account_where_its_kernel_makes_a_pass_for_it(fused: str, group: int, priced: bool) -> None:
    """A Clip fused into a convolution costs a pass over the output on the convolution's account; a
    ReLU or a residual Add in a blocked convolution's kernel nothing (it applies them as it writes
    each value), in a grouped one's (no blocked layout) a pass too; a BatchNormalization folds
    into the weights, no time at all."""
    from bbgrap.backends.lower import lower

    from bbgrap.compiler import pipeline
    from bbgrap.pass_manager import PassManager
    from bbgrap.simulate import segment_work, whole_ops

    c = 8
    w = np.ones((c, c // group, 3, 3), np.float32)
    bn = [np.ones(c, np.float32), np.zeros(c, np.float32), np.zeros(c, np.float32), np.ones(c, np.float32)]
    after = {"Clip": helper.make_node("Clip", ["n", "lo", "hi"], ["y"], name="act"), "Relu": helper.make_node("Relu", ["n"], ["y"], name="act"),
             "Add": helper.make_node("Add", ["n", "x"], ["y"], name="act")}[fused]
    model = build_model([helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1] * 4, group=group),
                         helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"], name="bn"), after],
                        {"x": [1, c, 6, 6]}, {"w": w, "s": bn[0], "b": bn[1], "m": bn[2], "v": bn[3], "lo": np.array(0, np.float32),
                                            "hi": np.array(6, np.float32)}, ["y"], 17)
    graph = PassManager(pipeline(Config(nodes=1, planner="greedy"))).run(import_proto(model).graph)
    programs, _ = lower(graph)
    (seg,) = [s.segment for s in programs[0].steps if s.op == "run"]
    work = segment_work(graph, 0, seg, {layer.name: whole_ops(layer, graph) for layer in graph.layers})
    (conv,) = work.layers
    assert conv.name == "conv" and conv.kind == ("conv" if group == 1 else "grouped")
    assert conv.fused_values == (c * 36 if priced else 0)  # the fused op's values, where priced; the BatchNormalization's none
    assert work.count["other"] == 0  # no op of their own
    node = replace(NODE, other_ops_per_s=1e8)
    assert math.isclose(node.layer_time("conv", "conv", 1e6, 1e6, fused_values=288), 1e6 / 1e9 + 288 / 1e8 + 1e-4)
    assert replace(node, layer_s={"conv": 2e-3}).layer_time("conv", "conv", 1e6, 1e6, fused_values=288) == 2e-3  # measured: held


def test_a_profile_written_before_grouped_convolutions_were_measured_prices_them_as_depthwise(tmp_path) -> None:
    (tmp_path / "old.toml").write_text("[[node]]\ndepthwise_ops_per_s = 3e9\ndepthwise_op_s = 2e-6\n")
    node = read_profile(str(tmp_path / "old.toml")).nodes[0]
    assert (node.grouped_ops_per_s, node.grouped_op_s) == (3e9, 2e-6) and node.depthwise_elements_per_s == 0.0
    (tmp_path / "new.toml").write_text("[[node]]\ndepthwise_ops_per_s = 3e9\ngrouped_ops_per_s = 1e9\n")
    assert read_profile(str(tmp_path / "new.toml")).nodes[0].grouped_ops_per_s == 1e9


def test_a_profile_written_before_integer_kernels_were_measured_prices_them_as_float_ones(tmp_path) -> None:
    (tmp_path / "old.toml").write_text("[[node]]\nconv_ops_per_s = 2e11\nconv_op_s = 1e-6\nmatmul_ops_per_s = 3e11\n")
    node = read_profile(str(tmp_path / "old.toml")).nodes[0]
    assert (node.qconv_ops_per_s, node.qconv_op_s, node.qmatmul_ops_per_s) == (2e11, 1e-6, 3e11)
    (tmp_path / "new.toml").write_text("[[node]]\nconv_ops_per_s = 2e11\nqconv_ops_per_s = 8e11\n")
    assert read_profile(str(tmp_path / "new.toml")).nodes[0].qconv_ops_per_s == 8e11


def test_a_profile_written_before_integer_depthwise_and_gemm_convolutions_were_measured_prices_them_as_float_ones(tmp_path) -> None:
    """An integer depthwise convolution as the float depthwise one (its values too), one onnxruntime runs as
    im2col and a GEMM as a float dense one; calibrated, at their own figures."""
    (tmp_path / "old.toml").write_text("[[node]]\nconv_ops_per_s = 2e11\ndepthwise_ops_per_s = 3e10\ndepthwise_elements_per_s = 5e9\n"
                                       "qconv_ops_per_s = 8e11\n")
    node = read_profile(str(tmp_path / "old.toml")).nodes[0]
    assert (node.qdepthwise_ops_per_s, node.qdepthwise_elements_per_s, node.qconv_gemm_ops_per_s) == (3e10, 5e9, 2e11)
    assert node.qconv_elements_per_s == node.qconv_gemm_elements_per_s == 0.0
    (tmp_path / "new.toml").write_text("[[node]]\ndepthwise_ops_per_s = 3e10\nqdepthwise_ops_per_s = 6e10\nqdepthwise_elements_per_s = 0\n")
    calibrated = read_profile(str(tmp_path / "new.toml")).nodes[0]
    assert (calibrated.qdepthwise_ops_per_s, calibrated.qdepthwise_elements_per_s) == (6e10, 0.0)


def test_an_8_bit_op_in_nchw_runs_at_its_own_speed_where_timed_else_at_its_op_types(tmp_path) -> None:
    node = replace(NODE, other_ops_per_s=1e9, other_speeds={"MaxPool": 4e10})
    assert node.op_rate("other", "MaxPool" + EIGHT_BIT_NCHW) == 4e10  # not timed so: the op type's
    assert node.op_rate("other", "Relu" + EIGHT_BIT_NCHW) == 1e9  # nor that: the kind's
    timed = replace(node, other_speeds={"MaxPool": 4e10, "MaxPool" + EIGHT_BIT_NCHW: 8e8})
    assert timed.op_rate("other", "MaxPool" + EIGHT_BIT_NCHW) == 8e8 and timed.op_rate("other", "MaxPool") == 4e10
    path = str(tmp_path / "cluster.toml")
    write_profile(path, ClusterProfile((timed,), PROFILE.link))
    assert read_profile(path).nodes[0].other_speeds == timed.other_speeds


def test_recompute_halos_prices_a_receive_with_every_fixed_cost_calibrate_measures() -> None:
    """A receive point costs (in the slowest node's convolution operations) the link's latency, the
    sender's post, the receiver's take, and a boundary of two pieces (a segment, after others)."""
    base = NodeProfile(conv_ops_per_s=1e10)
    link = LinkProfile(latency_s=1e-6, bandwidth_Bps=1e10)
    cheap = receive_cost(ClusterProfile((base,), link))
    dear = receive_cost(ClusterProfile((replace(base, recv_s=2e-6, cold_segment_s=3e-6, cold_s=1e-7),), link))
    assert dear.sync_ops - cheap.sync_ops == pytest.approx((2e-6 + 3e-6 + 3 * 1e-7) * 1e10)
    assert dear.byte_ops == cheap.byte_ops
    # per byte: the sender's, and the receiver's take where it is slower than the link
    copying = receive_cost(ClusterProfile((replace(base, send_byte_s=1e-11, recv_byte_s=3e-10),), link))
    assert copying.byte_ops - cheap.byte_ops == pytest.approx((1e-11 + 3e-10 - 1e-10) * 1e10)
    assert base.boundary_s(2) == pytest.approx(base.segment_s + 2 * base.value_s)


def test_an_elementwise_op_whose_values_leave_the_cache_writes_those_beyond_it_at_the_streaming_speed() -> None:
    """An "other" op's throughput is measured on maps in the core's cache; one writing more values
    than fit there (8 bytes moved per value) pays what a copy that large does, a chained op of a
    fused activation (computed in the kernel after it) only its operations."""
    node = replace(NODE, stream_ops_per_s=2.5e7, cache_bytes=1e6)
    assert node.layer_time("relu", "other", 1e5, 1e5, elements=1e5) == pytest.approx(1e5 / 1e8 + 1e-5)  # 0.8 MB: in the cache
    assert node.layer_time("relu", "other", 1e6, 1e6, elements=1e6) == pytest.approx(1e6 / 1e8 + 8.75e5 * (1 / 2.5e7 - 1 / 1e8) + 1e-5)
    assert node.layer_time("erf", "other", 1e6, 1e6, elements=1e6, chained=True) == pytest.approx(1e6 / 1e8)
    assert node.element_time("conv", 1e6) == 0.0  # a convolution's values are in its throughput
    assert NODE.layer_time("relu", "other", 1e6, 1e6, elements=1e6) == pytest.approx(1e6 / 1e8 + 1e-5)  # no regime measured
    # measured: as measured, chained or not
    assert replace(node, layer_s={"erf": 3e-4}).layer_time("erf", "other", 1e6, 1e6, elements=1e6, chained=True) == 3e-4


def _elementwise(nodes: list, outputs: list[str], c: int = 4) -> Graph:
    return import_proto(build_model(nodes, {"x": [1, c, 5, 5]}, {"w": np.ones((c, c, 1, 1), np.float32), "k": np.full((1,), 2.0, np.float32),
                                                                  "one": np.ones((1,), np.float32)}, outputs, 17)).graph


def test_an_activation_written_as_elementwise_ops_of_one_value_is_one_chain() -> None:
    from bbgrap.simulate import chained_layers

    conv = helper.make_node("Conv", ["x", "w"], ["c"], name="conv")
    # SiLU: x * sigmoid(x); GELU: x * (1 + erf(x / k)) / k
    silu = [helper.make_node("Sigmoid", ["c"], ["s"], name="sig"), helper.make_node("Mul", ["c", "s"], ["y"], name="silu")]
    assert chained_layers(_elementwise([conv, *silu], ["y"])) == {"sig"}
    gelu = [helper.make_node("Div", ["c", "k"], ["d"], name="div"), helper.make_node("Erf", ["d"], ["e"], name="erf"),
            helper.make_node("Add", ["e", "one"], ["e1"], name="add1"), helper.make_node("Mul", ["c", "e1"], ["m"], name="mul"),
            helper.make_node("Div", ["m", "k"], ["y"], name="half")]
    assert chained_layers(_elementwise([conv, *gelu], ["y"])) == {"div", "erf", "add1", "mul"}
    # a squeeze-excite scale (two values: its gate is a kernel of its own) and a residual Add start chains of
    # their own; a Relu after either is its own op
    pool = helper.make_node("GlobalAveragePool", ["c"], ["p"], name="pool")
    se = [pool, helper.make_node("Sigmoid", ["p"], ["g"], name="gate"), helper.make_node("Mul", ["c", "g"], ["z"], name="scale"),
          helper.make_node("Add", ["z", "x"], ["r"], name="res"), helper.make_node("Relu", ["r"], ["y"], name="relu")]
    assert chained_layers(_elementwise([conv, *se], ["y"])) == frozenset()
    # an op whose output another op also reads, or that is the model's output, computes its values out
    shared = [*silu, helper.make_node("Conv", ["s", "w"], ["t"], name="other_reader")]
    assert chained_layers(_elementwise([conv, *shared], ["y", "t"])) == frozenset()
    assert chained_layers(_elementwise([conv, *silu], ["y", "s"])) == frozenset()


def test_a_fused_activation_costs_one_fixed_cost_and_a_bias_folds_into_its_matmul() -> None:
    from bbgrap.backends.lower import lower

    from bbgrap.compiler import pipeline
    from bbgrap.pass_manager import PassManager
    from bbgrap.simulate import chained_layers, segment_seconds, segment_work, whole_ops

    def work_of(nodes: list, consts: dict[str, np.ndarray], inputs: dict[str, list[int]]) -> SegmentWork:
        graph = PassManager(pipeline(Config(nodes=1, planner="greedy"))).run(import_proto(build_model(nodes, inputs, consts, ["y"], 17)).graph)
        programs, _ = lower(graph)
        (seg,) = [s.segment for s in programs[0].steps if s.op == "run"]
        return segment_work(graph, 0, seg, {layer.name: whole_ops(layer, graph) for layer in graph.layers}, chained=chained_layers(graph))

    w = np.ones((8, 8), np.float32)
    matmul = helper.make_node("MatMul", ["x", "w"], ["h"], name="mm")
    silu = [helper.make_node("Sigmoid", ["b"], ["s"], name="sig"), helper.make_node("Mul", ["b", "s"], ["y"], name="silu")]
    work = work_of([matmul, helper.make_node("Add", ["bias", "h"], ["b"], name="bias"), *silu], {"w": w, "bias": np.ones(8, np.float32)}, {"x": [6, 8]})
    mm, sig, mul = work.layers
    assert (mm.name, mm.fused_values) == ("mm", 48)  # the bias: in the Gemm's kernel, on its account
    assert (sig.name, sig.chained, sig.elements) == ("sig", True, 0.0) and (mul.chained, mul.elements) == (False, 48.0)
    assert work.count == {**dict.fromkeys(work.count, 0), "matmul": 1, "other": 2}  # the ONNX ops but the bias
    # two kernels, the Gemm and the SiLU: the Sigmoid costs its operations, not an op's fixed cost
    unchained = replace(work, layers=tuple(replace(x, chained=False, elements=48.0) if x.chained else x for x in work.layers))
    assert segment_seconds(unchained, 0, PROFILE) - segment_seconds(work, 0, PROFILE) == pytest.approx(NODE.other_op_s)
    # a residual Add (an operand that is no constant) is an op of its own after the Gemm
    residual = work_of([matmul, helper.make_node("Add", ["h", "x"], ["y"], name="res")], {"w": w}, {"x": [6, 8]})
    assert [x.name for x in residual.layers] == ["mm", "res"] and residual.layers[0].fused_values == 0


def test_a_reshape_is_a_view_that_computes_and_writes_nothing() -> None:
    from bbgrap.backends.lower import lower

    from bbgrap.compiler import pipeline
    from bbgrap.cost import layer_ops
    from bbgrap.ir import ShapeMap
    from bbgrap.pass_manager import PassManager
    from bbgrap.simulate import segment_work, whole_ops

    model = build_model([helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Reshape", ["r", "shape"], ["y"], name="view")],
                        {"x": [1, 8, 64, 64]}, {"shape": np.array([1, 8, 4096], np.int64)}, ["y"], 17)
    graph = PassManager(pipeline(Config(nodes=1, planner="greedy"))).run(import_proto(model).graph)
    view = graph.layer("view")
    assert layer_ops(view, graph, ShapeMap.full(graph.tensors["y"].shape)) == 0.0  # no arithmetic: inspect's FLOPs count none
    programs, _ = lower(graph)
    (seg,) = [s.segment for s in programs[0].steps if s.op == "run"]
    work = segment_work(graph, 0, seg, {layer.name: whole_ops(layer, graph) for layer in graph.layers})
    relu, reshape = work.layers
    assert (relu.elements, reshape.ops, reshape.elements) == (8 * 4096, 0.0, 0.0)
    node = replace(NODE, stream_ops_per_s=2.5e7, cache_bytes=1e5)  # 32768 values of 8 bytes: beyond the cache
    assert node.layer_time("view", "other", reshape.ops, reshape.whole_ops, elements=reshape.elements) == node.other_op_s
    in_cache = relu.ops / node.other_ops_per_s + node.other_op_s
    assert node.layer_time("relu", "other", relu.ops, relu.whole_ops, elements=relu.elements) == pytest.approx(
        in_cache + (8 * 4096 - 1e5 / 8) * (1 / 2.5e7 - 1 / 1e8))


def test_an_other_op_timed_apart_runs_at_its_own_speed_and_round_trips(tmp_path) -> None:
    node = replace(NODE, other_speeds={"LayerNormalization": 2.5e7, "MaxPool": 4e8})
    assert node.op_rate("other", "LayerNormalization") == 2.5e7 and node.op_rate("other", "Relu") == 1e8
    assert node.op_rate("conv", "MaxPool") == 1e9  # a kind's throughput for anything not "other"
    assert node.layer_time("ln", "other", 1e5, 1e5, op_type="LayerNormalization") == pytest.approx(1e5 / 2.5e7 + 1e-5)
    assert node.layer_time("relu", "other", 1e5, 1e5, op_type="Relu") == pytest.approx(1e5 / 1e8 + 1e-5)
    # inside a fused kernel an op runs at the kind's speed, not its own kernel's
    assert node.layer_time("erf", "other", 1e5, 1e5, chained=True, op_type="LayerNormalization") == pytest.approx(1e5 / 1e8)
    # in a segment: each layer's time at its op's speed, beyond the kind's
    work = SegmentWork(layers=(LayerWork("ln", "other", 1e5, 1e5, op_type="LayerNormalization"),
                                                             LayerWork("relu", "other", 1e5, 1e5, op_type="Relu")))
    assert simulate([[SimStep("run", work=work)]], replace(PROFILE, nodes=(node,))).latency == pytest.approx(
        1e-3 + 2 * 1e-5 + 1e5 / 2.5e7 + 1e5 / 1e8)
    assert node.faster(2.0).other_speeds == {"LayerNormalization": 5e7, "MaxPool": 8e8}
    path = str(tmp_path / "cluster.toml")
    write_profile(path, ClusterProfile((node,)))
    assert read_profile(path).nodes[0] == node and "[node.other_ops]" in open(path).read()


def test_an_other_op_moves_the_mean_of_the_values_it_reads_and_writes() -> None:
    """A 3x3 pool of stride 2 reads about four values per value it writes: beyond the cache it streams
    (4 + 1) / 2 times its output's values; an Add of two maps 1.5 times; a convolution its output's."""
    from bbgrap.ir import ShapeMap
    from bbgrap.rules.registry import default_registry
    from bbgrap.simulate import values_moved

    graph = import_proto(build_model([helper.make_node("Conv", ["x", "w"], ["c"], name="conv", strides=[2, 2]),
                                      helper.make_node("Relu", ["c"], ["p2"], name="relu"),
                                      helper.make_node("MaxPool", ["x"], ["p"], name="pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4),
                                      helper.make_node("Add", ["p", "p2"], ["y"], name="add")],
                                     {"x": [1, 8, 32, 32]}, {"w": np.ones((8, 8, 1, 1), np.float32)}, ["y"], 17)).graph
    registry = default_registry()
    out = ShapeMap.full((1, 8, 16, 16))
    assert values_moved(graph.layer("pool"), graph, out, registry) == pytest.approx((8 * 32 * 32 + 8 * 16 * 16) / 2)
    assert values_moved(graph.layer("add"), graph, out, registry) == 1.5 * out.volume
    assert values_moved(graph.layer("conv"), graph, out, registry) == out.volume
    # a value a chained op makes stays in the fused kernel: the Add reads only the pool's
    assert values_moved(graph.layer("add"), graph, out, registry, chained=frozenset({"relu"})) == out.volume
    assert values_moved(graph.layer("relu"), graph, out, registry, in_chain=True) == 0.0


def test_a_depthwise_convolution_moves_the_more_of_the_values_it_reads_and_writes() -> None:
    """A depthwise convolution streams each value it reads through its taps: one of stride 2 reads
    four values per value it writes and is priced by those; one of stride 1 reads what it writes,
    and a piece of its rows the halo rows beside."""
    from bbgrap.ir import ShapeMap
    from bbgrap.rules.registry import default_registry
    from bbgrap.simulate import values_moved

    w = np.ones((8, 1, 3, 3), np.float32)
    graph = import_proto(build_model([helper.make_node("Conv", ["x", "w"], ["s2"], name="s2", strides=[2, 2], pads=[1] * 4, group=8),
                                      helper.make_node("Conv", ["s2", "w"], ["y"], name="s1", pads=[1] * 4, group=8)],
                                     {"x": [1, 8, 32, 32]}, {"w": w}, ["y"], 17)).graph
    registry = default_registry()
    out = ShapeMap.full((1, 8, 16, 16))
    assert values_moved(graph.layer("s2"), graph, out, registry) == 8 * 32 * 32
    assert values_moved(graph.layer("s1"), graph, out, registry) == out.volume
    top = ShapeMap.box((0, 0, 0, 0), (1, 8, 8, 16))
    assert values_moved(graph.layer("s1"), graph, top, registry) == 8 * 9 * 16


def _reorders_as_run(model: object, block: int) -> tuple[Layouts, int, list[str]]:
    """The whole model as one segment: `layout_reorders`' layouts, how many reorders onnxruntime's
    optimiser inserts inside it (not at the graph's edges, which are the segment's boundary), and
    the op types of its optimised graph."""
    import os
    import tempfile

    import onnx
    import onnxruntime as ort
    from bbgrap.backends.engine import session_options
    from bbgrap.backends.lower import lower

    from bbgrap.compiler import pipeline
    from bbgrap.pass_manager import PassManager
    from bbgrap.rules.registry import default_registry
    from bbgrap.simulate import chained_layers, layout_reorders

    graph = PassManager(pipeline(Config(nodes=1, planner="greedy"))).run(import_proto(model).graph)  # type: ignore[arg-type]
    programs, _ = lower(graph)
    (seg,) = [s.segment for s in programs[0].steps if s.op == "run"]
    ours = layout_reorders(graph, seg, default_registry(), chained_layers(graph), block)
    with tempfile.TemporaryDirectory() as work:
        opts = session_options(1)
        opts.optimized_model_filepath = os.path.join(work, "optimised.onnx")
        ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])  # type: ignore[attr-defined]
        optimised = onnx.load(opts.optimized_model_filepath)
    edges = {v.name for v in (*optimised.graph.input, *optimised.graph.output)}
    theirs = sum(n.op_type in ("ReorderInput", "ReorderOutput") and not edges.intersection([*n.input, *n.output])
                 for n in optimised.graph.node)
    return ours, theirs, [n.op_type for n in optimised.graph.node]


@pytest.mark.parametrize("case", ["squeeze_excite", "silu", "relu_pool_add", "concat_not_whole_blocks", "concat_whole_blocks",
                                  "reshape", "erf"])
def test_the_layout_reorders_priced_are_those_onnxruntime_inserts(case: str) -> None:
    """Each block as the exporters write it between two convolutions, in the block size of this
    CPU: as many reorders priced inside the segment as onnxruntime's optimiser inserts there, and
    the values each moves."""
    from bbgrap.backends.nchwc import block_size

    block = block_size()
    if not block:
        pytest.skip("this onnxruntime build has no blocked-layout (NCHWc) kernels: nothing to compare with")
    c = 2 * block

    def conv(name: str, x: str, y: str) -> object:
        return helper.make_node("Conv", [x, f"{name}_w"], [y], name=name, pads=[1, 1, 1, 1])

    blocks = {
        "squeeze_excite": [helper.make_node("GlobalAveragePool", ["a"], ["p"], name="pool"), conv("fc", "p", "q"),
                           helper.make_node("Sigmoid", ["q"], ["g"], name="gate"), helper.make_node("Mul", ["a", "g"], ["m"], name="scale")],
        "silu": [helper.make_node("Sigmoid", ["a"], ["s"], name="sig"), helper.make_node("Mul", ["a", "s"], ["m"], name="silu")],
        "relu_pool_add": [helper.make_node("MaxPool", ["a"], ["p"], name="pool", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                          helper.make_node("Relu", ["p"], ["r"], name="relu"), helper.make_node("Add", ["r", "a"], ["m"], name="res")],
        "concat_not_whole_blocks": [helper.make_node("Split", ["a", "halves"], ["h1", "h2"], name="split", axis=1),
                                    helper.make_node("Concat", ["h2", "h1"], ["m"], name="swap", axis=1)],
        "concat_whole_blocks": [helper.make_node("Concat", ["a", "a"], ["m0"], name="twice", axis=1),
                                helper.make_node("Split", ["m0", "two"], ["m", "rest"], name="first", axis=1)],
        "reshape": [helper.make_node("Reshape", ["a", "flat"], ["f"], name="flatten"), helper.make_node("Reshape", ["f", "back"], ["m"], name="back")],
        "erf": [helper.make_node("Erf", ["a"], ["m"], name="erf")],
    }
    rng = np.random.default_rng(0)
    consts = {f"{n}_w": rng.standard_normal((c, c, 3, 3)).astype(np.float32) / 10 for n in ("fc", "last_conv")}
    consts["first_conv_w"] = rng.standard_normal((c, 3, 3, 3)).astype(np.float32) / 10
    consts.update(halves=np.array([c // 2 - 4, c // 2 + 4], np.int64), two=np.array([c, c], np.int64),
                  flat=np.array([1, c, -1], np.int64), back=np.array([1, c, 6, 6], np.int64))
    nodes = [conv("first_conv", "x", "a"), *blocks[case], conv("last_conv", "m", "y")]
    used = {i for n in nodes for i in n.input}
    # an image of three channels in: no blocked edge, so onnxruntime's own layout, which bbgrap-run does not fold
    model = build_model(nodes, {"x": [1, 3, 6, 6]}, {k: v for k, v in consts.items() if k in used}, ["y"], 17)
    layouts, theirs, _ = _reorders_as_run(model, block)
    ours = layouts.reorders
    assert len(ours) == theirs, (case, ours)
    assert all(size in (c * 36, 2 * c * 36, c) for _, size in ours)  # a map's values (the concatenated one's), or the pooled gate's


@pytest.mark.parametrize("blocked_input", [True, False])
def test_a_batch_norm_is_priced_in_nchw_where_onnxruntime_runs_its_own_kernel(blocked_input: bool) -> None:
    """A BatchNormalization onnxruntime cannot fold into a convolution (the convolution's output is
    read twice) runs blocked where its input is (as a blocked 1x1 convolution) and with its own
    kernel on NCHW values where it is not (after a Reshape): `layout_reorders` marks it `in_nchw`
    exactly where onnxruntime's optimised graph keeps a BatchNormalization."""
    from bbgrap.backends.nchwc import block_size

    block = block_size()
    if not block:
        pytest.skip("this onnxruntime build has no blocked-layout (NCHWc) kernels: nothing to compare with")
    c = 2 * block
    rng = np.random.default_rng(0)
    consts = {"first_w": rng.standard_normal((c, 3, 3, 3)).astype(np.float32) / 10,
              "last_w": rng.standard_normal((c, c, 3, 3)).astype(np.float32) / 10,
              "flat": np.array([1, c, -1], np.int64), "back": np.array([1, c, 6, 6], np.int64),
              **{k: rng.uniform(0.5, 1.5, c).astype(np.float32) for k in ("gamma", "beta", "mean", "var")}}
    into = "a" if blocked_input else "r"
    nodes = [helper.make_node("Conv", ["x", "first_w"], ["a"], name="first", pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["a", "flat"], ["f"], name="flatten"), helper.make_node("Reshape", ["f", "back"], ["r"], name="unflatten"),
             helper.make_node("BatchNormalization", [into, "gamma", "beta", "mean", "var"], ["n"], name="norm"),
             helper.make_node("Add", ["n", "r"], ["m"], name="sum"),
             helper.make_node("Conv", ["m", "last_w"], ["y"], name="last", pads=[1, 1, 1, 1])]
    model = build_model(nodes, {"x": [1, 3, 6, 6]}, consts, ["y"], 17)
    layouts, _, ran = _reorders_as_run(model, block)
    assert ("norm" in layouts.in_nchw) == ("BatchNormalization" in ran) == (not blocked_input)


def test_a_concat_pays_for_each_value_its_piece_joins_and_the_cost_round_trips(tmp_path) -> None:
    """onnxruntime copies a Concat's inputs one after another, each at a cost of its own: a piece of
    the model's Concat pays `concat_input_s` for each value it keeps (a cut along channels drops
    the others), one of lowering's for each piece, and a planner's receive for its pieces and the
    node's own."""
    from bbgrap.config import Direction
    from bbgrap.pass_manager import PassManager
    from bbgrap.rules.registry import default_registry
    from bbgrap.simulate import layer_work, whole_ops

    nodes = [helper.make_node("Relu", ["x"], [f"r{i}"], name=f"relu{i}") for i in range(4)]
    nodes.append(helper.make_node("Concat", ["r0", "r1", "r2", "r3"], ["y"], name="cat", axis=1))
    model = build_model(nodes, {"x": [1, 16, 8, 8]}, {}, ["y"], 17)
    for direction, joined in ((Direction.H, [4, 4]), (Direction.C, [2, 2])):  # 64 channels cut 32 and 32
        config = Config(nodes=2, planner="greedy", direction=direction)
        graph = PassManager(pipeline(config, search=False, recompute=False)).run(import_proto(model).graph)
        cat = graph.layer("cat")
        works = [layer_work(cat, graph, graph.partitions["cat"], n, "other", whole_ops(cat, graph), default_registry()) for n in range(2)]
        assert [w.joined for w in works] == joined, direction
    assert layer_work(graph.layer("relu0"), graph, graph.partitions["relu0"], 0, "other", 1.0, default_registry()).joined == 0
    node = replace(NODE, concat_input_s=2e-7, other_speeds={"Concat": 5e7})
    priced = node.layer_time("cat", "other", 1e4, 1e4, op_type="Concat", joined=3)
    assert priced == pytest.approx(1e4 / 5e7 + node.other_op_s + 3 * 2e-7)
    assert node.copy_s(1e4, "Concat", 2) - node.copy_s(1e4, "Concat") == pytest.approx(2 * 2e-7)
    assert node.boundary_s(2) - NODE.boundary_s(2) == pytest.approx(3 * 2e-7)  # two pieces taken and its own
    # in a segment: a copy of lowering's that joins pieces
    work = SegmentWork(copies=(Copy(1e4, "Concat", 2),))
    assert simulate([[SimStep("run", work=work)]], replace(PROFILE, nodes=(node,))).latency == pytest.approx(
        1e-3 + node.other_op_s + 1e4 / 5e7 + 2 * 2e-7)
    assert node.faster(2.0).concat_input_s == pytest.approx(1e-7)
    path = str(tmp_path / "cluster.toml")
    write_profile(path, ClusterProfile((node,)))
    assert read_profile(path).nodes[0] == node and NodeProfile().concat_input_s == 0.0  # 0: not measured


@pytest.mark.parametrize(("units", "threads", "stretch"), [
    (7, 2, 8 / 7), (8, 2, 1.0), (3, 2, 4 / 3), (7, 16, 16 / 7), (56, 16, 64 / 56), (112, 16, 1.0), (0, 16, 1.0), (5, 1, 1.0)])
def test_a_kernel_dealt_in_whole_units_runs_as_long_as_its_busiest_thread(units: int, threads: int, stretch: float) -> None:
    from bbgrap.cluster import thread_stretch

    assert thread_stretch(units, threads) == pytest.approx(stretch)


def _conv_layer(out_channels: int, in_channels: int, rows: int, group: int = 1) -> tuple[Graph, str]:
    from bbgrap.pass_manager import PassManager

    w = np.zeros((out_channels, in_channels // group, 3, 3), np.float32)
    model = build_model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1] * 4, group=group)],
                        {"x": [1, in_channels, rows, 9]}, {"w": w}, ["y"], 17)
    graph = PassManager(pipeline(Config(nodes=1), search=False, recompute=False)).run(import_proto(model).graph)
    return graph, "conv"


def test_a_blocked_convolutions_work_units_are_its_filter_sets_times_its_output_rows() -> None:
    """MLAS deals a blocked convolution's output among the threads as filter sets of 64 output
    channels (4 blocks of 16) times output rows (times groups and images); a piece has its own rows
    and channels. Depthwise convolutions and convolutions of channels not in whole blocks: not known (0)."""
    from bbgrap.ir import Interval, ShapeMap
    from bbgrap.simulate import conv_work_units

    graph, name = _conv_layer(128, 64, 7)
    layer = graph.layer(name)
    full = ShapeMap.full((1, 128, 7, 9))
    assert conv_work_units(layer, graph, "conv", full) == 2 * 7
    assert conv_work_units(layer, graph, "conv", full.with_axis(2, Interval(0, 4))) == 2 * 4  # a piece of rows
    assert conv_work_units(layer, graph, "conv", full.with_axis(1, Interval(64, 128))) == 7  # of one filter set
    assert conv_work_units(layer, graph, "conv", full.with_axis(1, Interval(0, 16))) == 7  # a block is a set's pass still
    assert conv_work_units(layer, graph, "depthwise", full) == 0
    grouped, name = _conv_layer(128, 128, 5, group=4)  # 32 output and input channels a group
    assert conv_work_units(grouped.layer(name), grouped, "conv", ShapeMap.full((1, 128, 5, 9))) == 4 * 5
    assert conv_work_units(grouped.layer(name), grouped, "conv", ShapeMap.full((1, 128, 5, 9)).with_axis(1, Interval(0, 64))) == 2 * 5
    narrow, name = _conv_layer(24, 16, 7)  # 24 output channels: not whole blocks, not blocked
    assert conv_work_units(narrow.layer(name), narrow, "conv", ShapeMap.full((1, 24, 7, 9))) == 0


def test_a_piece_of_few_rows_keeps_some_of_the_nodes_threads_idle() -> None:
    """A convolution's operations take `thread_stretch` times as long as the throughput gives; a
    measured layer's piece its share of the time by its stretch over the whole layer's; one thread,
    or units not known, as before."""
    two = replace(NODE, threads=2)
    assert two.layer_time("c", "conv", 7e6, 7e6, units=7) == pytest.approx(7e6 / 1e9 * 8 / 7 + 1e-4)
    assert two.layer_time("c", "conv", 8e6, 8e6, units=8) == pytest.approx(8e6 / 1e9 + 1e-4)
    assert two.layer_time("c", "conv", 7e6, 7e6) == pytest.approx(7e6 / 1e9 + 1e-4)
    assert NODE.layer_time("c", "conv", 7e6, 7e6, units=7) == pytest.approx(7e6 / 1e9 + 1e-4)
    measured = replace(two, layer_s={"c": 2.1e-3})  # whole: 14 rows, 14 units, no idle thread
    assert measured.layer_time("c", "conv", 0.5e6, 1e6, units=7, whole_units=14) == pytest.approx(1e-4 + 2e-3 * 0.5 * 8 / 7)


def test_the_threads_round_trip_and_a_bad_count_is_one_line(tmp_path) -> None:
    path = str(tmp_path / "p.toml")
    write_profile(path, ClusterProfile((replace(NODE, threads=8), NODE)))
    assert [n.threads for n in read_profile(path).nodes] == [8, 1]
    assert replace(NODE, threads=8).faster(2.0).threads == 8
    for bad in ("0", "1.5", "true", '"8"'):
        (tmp_path / "bad.toml").write_text(f"[[node]]\nthreads = {bad}\n")
        with pytest.raises(BBGrapError, match="'node\\[0\\].threads' must be a whole number") as err:
            read_profile(str(tmp_path / "bad.toml"))
        assert "\n" not in str(err.value)


def test_a_plan_cut_into_rows_prices_each_pieces_units_on_the_nodes_threads() -> None:
    """The simulator and the planners price a piece by its own units: on 2 threads a 7-row
    convolution cut 4 + 3 rows costs its second node as much as its first."""
    from bbgrap.config import Direction
    from bbgrap.pass_manager import PassManager
    from bbgrap.rules.registry import default_registry
    from bbgrap.simulate import layer_work, whole_ops, work_seconds

    w = np.zeros((64, 64, 3, 3), np.float32)
    model = build_model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1] * 4)], {"x": [1, 64, 7, 28]}, {"w": w}, ["y"], 17)
    graph = PassManager(pipeline(Config(nodes=2, planner="greedy", direction=Direction.H), search=False, recompute=False)).run(import_proto(model).graph)
    conv = graph.layer("conv")
    works = [layer_work(conv, graph, graph.partitions["conv"], n, "conv", whole_ops(conv, graph), default_registry()) for n in range(2)]
    assert sorted(w.units for w in works) == [3, 4] and {w.whole_units for w in works} == {7}
    two = replace(NODE, threads=2)
    assert work_seconds(two, works[0]) == pytest.approx(work_seconds(two, works[1]))
    assert work_seconds(NODE, works[0]) != pytest.approx(work_seconds(NODE, works[1]))


def test_balanced_speeds_give_a_rank_predicted_to_compute_longer_a_smaller_share() -> None:
    """The cut's speeds moved so every rank would compute alike: each times the ranks' mean compute
    over its own, relative to the slowest; none where the ranks are within BALANCE_TOLERANCE."""
    from bbgrap.compiler import BALANCE_TOLERANCE, balanced_speeds
    from bbgrap.simulate import Prediction, RankTime

    def predicted(*compute: float) -> Prediction:
        return Prediction(len(compute), tuple(RankTime(c, 0.0, c) for c in compute))

    assert balanced_speeds((1.0, 3.0, 1.0), predicted(4.0, 2.0, 4.0)) == (1.0, 6.0, 1.0)
    assert balanced_speeds((1.0, 1.0), predicted(3.0, 2.0)) == (1.0, 1.5)
    assert balanced_speeds((1.0, 3.0), predicted(2.0, 2.0 * (1 + BALANCE_TOLERANCE))) is None
    assert balanced_speeds((1.0, 3.0), predicted(0.0, 2.0)) is None  # a rank with nothing to compute: nothing to move


def test_a_cluster_of_unlike_nodes_is_cut_so_its_ranks_compute_alike_where_predicted_faster(tmp_path) -> None:
    """A 1:3:1 cluster: the cut by the profile's speeds leaves the end ranks computing longer (a
    segment's fixed costs do not shrink with their share); compile moves the speeds by the ranks'
    predicted compute, keeps that plan where it is predicted faster, says so, and the plan is exact."""
    from helpers import assert_exact

    model = save(zoo.build("resnet18", resolution=64, width=0.5), str(tmp_path))
    base = replace(NodeProfile(), segment_s=2e-4)
    profile = ClusterProfile((base, base.faster(3.0), base), LinkProfile(latency_s=1e-5, bandwidth_Bps=1e10))
    said: list[str] = []
    plan = compile_model(model, Config(nodes=3, planner="greedy"), str(tmp_path / "plan"), profile=profile, force_nodes=True,
                         recompute=False, log=said.append)
    even = compile_model(model, Config(nodes=3, planner="greedy", speeds=(1.0, 3.0, 1.0)), str(tmp_path / "fixed"), profile=profile,
                         force_nodes=True, recompute=False)
    assert any(line.startswith("node speeds balanced") for line in said)
    got, fixed = plan.compiled.prediction, even.compiled.prediction
    assert got is not None and fixed is not None
    spread = [max(r.compute for r in p.ranks) / min(r.compute for r in p.ranks) for p in (got, fixed)]
    assert spread[0] < spread[1] and got.latency_ms < fixed.latency_ms
    assert plan.compiled.speeds != (1.0, 3.0, 1.0)
    assert_exact(str(tmp_path / "plan"))


def test_a_node_under_a_cpu_quota_runs_its_stopped_share_while_it_waited() -> None:
    """A rank under a quota spends none of it while it waits: its next segments take the place of
    the stops, down to its threads' full speed and as far as the quota's period allows."""
    quota = replace(NODE, segment_s=0.0, cpu_share=0.5, quota_period_ms=4.0)  # a wait carries at most 2 ms
    steps = [[run(conv=2e6, convs=1), send(0, 0, 1, 0)], [wait(0, 0, 1, 0), run(conv=2e6, convs=1)]]
    fast = replace(NODE, segment_s=0.0, conv_op_s=0.0)
    pred = simulate(steps, ClusterProfile((fast, replace(quota, conv_op_s=0.0)), LinkProfile(latency_s=1e-3, bandwidth_Bps=1e9)))
    # rank 1 waited 3 ms (2 ms of rank 0's segment and 1 ms of link); its 2 ms segment at half its threads' time is 1 ms of them
    assert pred.ranks[1].wait == pytest.approx(3e-3) and pred.ranks[1].compute == pytest.approx(2e-3)
    assert pred.ranks[1].total == pytest.approx(3e-3 + 1e-3)
    assert quota.quota_absorbs() == pytest.approx(2e-3) and NODE.quota_absorbs() == 0.0
    assert replace(NODE, cpu_share=0.25).quota_absorbs() == pytest.approx(0.075)  # not recorded: Linux's 100 ms period
    unlimited = simulate(steps, ClusterProfile((fast, replace(NODE, segment_s=0.0, conv_op_s=0.0)), LinkProfile(latency_s=1e-3, bandwidth_Bps=1e9)))
    assert unlimited.ranks[1].total == pytest.approx(3e-3 + 2e-3)  # no quota: the wait is lost


def test_the_quotas_period_round_trips(tmp_path) -> None:
    path = str(tmp_path / "p.toml")
    write_profile(path, ClusterProfile((replace(NODE, cpu_share=0.3, quota_period_ms=5.0),)))
    node = read_profile(path).node(0)
    assert node.quota_period_ms == 5.0 and node.quota_absorbs() == pytest.approx(0.7 * 5e-3)
    assert replace(NODE, cpu_share=0.3, quota_period_ms=5.0).faster(2.0).quota_period_ms == 5.0  # a period, not a cost
