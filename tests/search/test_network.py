"""Whole-network planners (bbgrap/search/network.py): the DP is the exact minimum of its objective
(checked against every choice on small graphs, chains and a residual block), the beam says when
it is not; HEFT places parallel branches on different nodes; the GA is never worse than its
seeds; the costs follow the profile (a slow link makes cuts dearer)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from bbgrap.frontends.onnx import import_model
from onnx import helper

from bbgrap.cluster import ClusterProfile, LinkProfile, NodeProfile, cache_hits
from bbgrap.compiler import pipeline
from bbgrap.config import Config
from bbgrap.ir import Graph, Interval, ShapeMap
from bbgrap.pass_manager import PassManager
from bbgrap.rules.registry import default_registry
from bbgrap.search import network
from bbgrap.search.network import (
    BOUNDARY_BINS,
    WHOLE_BINS,
    Boxes,
    NetworkCost,
    Senders,
    descriptor,
    layer_candidates,
    plan_dp,
    plan_ga,
    plan_heft,
    plan_map_elites,
    plan_network,
    received_values,
)
from tests.onnx_builder import build_model

RNG = np.random.default_rng(0)


def conv(name: str, x: str, y: str, cin: int, cout: int, kernel: int = 3) -> tuple[helper.NodeProto, dict[str, np.ndarray]]:
    w = RNG.standard_normal((cout, cin, kernel, kernel)).astype(np.float32)
    pad = kernel // 2
    return helper.make_node("Conv", [x, f"{name}.w"], [y], name=name, pads=[pad] * 4), {f"{name}.w": w}


def residual_model() -> object:
    """conv → relu → conv → add(relu) → conv: a chain with one skip connection."""
    nodes, consts = [], {}
    for node, c in (conv("c1", "x", "a", 3, 4), conv("c2", "r", "b", 4, 4), conv("c3", "s", "y", 4, 2)):
        nodes.append(node)
        consts.update(c)
    nodes[1:1] = [helper.make_node("Relu", ["a"], ["r"], name="relu")]
    nodes[3:3] = [helper.make_node("Add", ["b", "r"], ["s"], name="add")]
    return build_model(nodes, {"x": [1, 3, 12, 10]}, consts, ["y"], 13)


def branches_model(size: int = 32, channels: int = 16) -> object:
    """Two independent three-convolution branches from the input, concatenated."""
    nodes, consts = [], {}
    for b in ("p", "q"):
        prev, cin = "x", 8
        for k in range(3):
            node, c = conv(f"{b}{k}", prev, f"{b}{k}.y", cin, channels, kernel=3 if size > 1 else 1)
            nodes.append(node)
            consts.update(c)
            prev, cin = f"{b}{k}.y", channels
    nodes.append(helper.make_node("Concat", ["p2.y", "q2.y"], ["y"], name="concat", axis=1))
    return build_model(nodes, {"x": [1, 8, size, size]}, consts, ["y"], 13)


def partitioned(model: object, nodes: int, tmp_path) -> Graph:
    import onnx

    path = str(tmp_path / "m.onnx")
    onnx.save(model, path)
    cfg = Config(nodes=nodes, planner="greedy")  # the per-layer search's plan, which the tests re-plan
    passes = [p for p in pipeline(cfg, recompute=False) if p.name != "fit-memory"]
    return PassManager(passes).run(import_model(path).graph)


def network_cost(graph: Graph, profile: ClusterProfile) -> NetworkCost:
    registry = default_registry()
    offered = [layer_candidates(graph, layer, graph.partitions[layer.name], (1.0,) * graph.nodes, registry, False) for layer in graph.layers]
    return NetworkCost(graph, [c for c, _ in offered], [k for _, k in offered], profile, registry)


def on_node_0(cost: NetworkCost) -> tuple[int, ...]:
    """The choice of every layer whole on node 0."""
    return tuple(next(c for c in range(k) if cost.candidates[i][c].axis is None) for i, k in enumerate(cost.cuts))


PROFILES = {
    "fast link": ClusterProfile((NodeProfile(),), LinkProfile(latency_s=1e-6, bandwidth_Bps=1e10)),
    "slow link": ClusterProfile((NodeProfile(),), LinkProfile(latency_s=1e-3, bandwidth_Bps=1e7)),
    "mixed speeds": ClusterProfile((NodeProfile(), NodeProfile(conv_ops_per_s=7.5e10)), LinkProfile()),
}


@pytest.mark.parametrize("profile", PROFILES.values(), ids=PROFILES.keys())
@pytest.mark.parametrize("nodes", [2, 3])
def test_dp_is_the_minimum_over_every_choice(tmp_path, profile: ClusterProfile, nodes: int) -> None:
    graph = partitioned(residual_model(), nodes, tmp_path)
    cost = network_cost(graph, profile)
    assert max(cost.cuts) >= 3, "the test needs real choices"
    result = plan_dp(cost)
    every = min(cost.synchronous(x) for x in itertools.product(*(range(k) for k in cost.cuts)))
    assert result.exact
    assert result.synchronous == pytest.approx(every, rel=1e-12)
    assert cost.synchronous(result.choice) == pytest.approx(result.synchronous, rel=1e-12)
    assert result.synchronous <= cost.synchronous(tuple(0 for _ in cost.candidates)) * (1 + 1e-12)  # the start is a choice


def test_receives_are_what_the_regions_say(tmp_path) -> None:
    """Each node receives, from each other node, the part of its need that node owns and it does
    not hold itself: checked with the IR's region algebra for every pair of candidates."""
    graph = partitioned(residual_model(), 3, tmp_path)
    cost = network_cost(graph, PROFILES["fast link"])
    checked = 0
    for i, layer in enumerate(graph.layers):
        for k, j in cost.edges[i]:
            for d, source in enumerate(cost.candidates[j]):
                for c, part in enumerate(cost.candidates[i]):
                    got = cost.receives(i, k, j, d, c).messages
                    for n in range(graph.nodes):
                        need = part.needs[n][k]
                        expected = []
                        for s in source.active_nodes():
                            if s == n or need is None or part.out[n].empty:
                                continue
                            common = need.intersect(source.out[s])
                            values = common.volume - common.intersect(source.computes[n]).volume
                            if values > 0:
                                expected.append((s, 4 * values))
                        assert list(got[n]) == expected, (layer.name, n, d, c)
                        checked += 1
    assert checked > 100


def test_a_receive_costs_the_boundary_each_piece_and_each_senders_post(tmp_path) -> None:
    """A node receiving for a layer pays segment_s, value_s per piece and the concat; each piece
    arrives its sender's send_s and the link's time after the one before, and is taken recv_s
    after it arrives, while the next one moves (NodeProfile.taken): with the fixed costs raised,
    every receive's seconds grow by value_s and send_s per piece and recv_s once, exactly."""
    graph = partitioned(residual_model(), 3, tmp_path)
    link = LinkProfile(latency_s=1e-6, bandwidth_Bps=1e10)
    base = network_cost(graph, ClusterProfile((NodeProfile(value_s=0.0, send_s=0.0),), link))
    dearer = network_cost(graph, ClusterProfile((NodeProfile(value_s=3e-6, send_s=7e-6, recv_s=2e-6),), link))
    checked = 0
    for i in range(len(graph.layers)):
        for k, j in base.edges[i]:
            for d in range(len(base.candidates[j])):
                for c in range(len(base.candidates[i])):
                    a, b = base.receives(i, k, j, d, c), dearer.receives(i, k, j, d, c)
                    for n, got in enumerate(a.messages):
                        assert b.seconds[n] - a.seconds[n] == pytest.approx(len(got) * (3e-6 + 7e-6) + bool(got) * 2e-6, abs=1e-12)
                        checked += bool(got)
    assert checked > 10


def test_a_receive_whose_takes_outlast_the_transfers_costs_the_takes(tmp_path) -> None:
    """Where taking a message (recv_s + bytes x recv_byte_s) outlasts its transfer, as a copy on
    one host does when the receiver asks late, a node's receive lasts its takes, one after
    another (NodeProfile.taken), not the messages' arrivals."""
    graph = partitioned(residual_model(), 3, tmp_path)
    link = LinkProfile(latency_s=0.0, bandwidth_Bps=1e12)
    node = NodeProfile(value_s=0.0, send_s=0.0, send_byte_s=1e-10, recv_s=1e-6, recv_byte_s=1e-7)
    cost = network_cost(graph, ClusterProfile((node,), link))
    checked = 0
    for i in range(len(graph.layers)):
        for k, j in cost.edges[i]:
            for d in range(len(cost.candidates[j])):
                for c in range(len(cost.candidates[i])):
                    rec = cost.receives(i, k, j, d, c)
                    for n, got in enumerate(rec.messages):
                        takes = sum(node.recv_s + b * node.recv_byte_s for _, b in got)
                        assert rec.seconds[n] - rec.extra[n] == pytest.approx(takes, rel=1e-9, abs=1e-15)
                        checked += bool(got)
    assert checked > 10


def random_box(rng: np.random.Generator, shape: tuple[int, ...]) -> ShapeMap:
    starts = [int(rng.integers(0, d)) for d in shape]
    return ShapeMap.box(starts, [int(rng.integers(a + 1, d + 1)) for a, d in zip(starts, shape)])


@pytest.mark.parametrize("seed", range(40))
def test_all_pairs_at_once_are_the_region_algebras_pair_by_pair(seed: int) -> None:
    """received_values' numpy path (every region a box: all pairs of nodes at once) gives what its
    region-by-region path gives, on random cuts with recomputed halos and random needs."""
    rng = np.random.default_rng(seed)
    nodes = int(rng.integers(2, 7))
    shape = (1, int(rng.integers(1, 5)), int(rng.integers(nodes, 3 * nodes + 2)), int(rng.integers(1, 9)))
    bounds = sorted(int(b) for b in rng.integers(0, shape[2] + 1, nodes - 1))
    full = ShapeMap.full(shape)
    owned, computes = [], []
    for lo, hi in zip([0, *bounds], [*bounds, shape[2]]):
        if hi == lo:
            owned.append(ShapeMap.empty_like(4))
            computes.append(ShapeMap.empty_like(4))
            continue
        owned.append(full.with_axis(2, Interval(lo, hi)))
        grown = Interval(max(0, lo - int(rng.integers(0, 5))), min(shape[2], hi + int(rng.integers(0, 5))))
        computes.append(full.with_axis(2, grown))
    needs = [None if rng.random() < 0.2 else random_box(rng, shape) for _ in range(nodes)]
    senders = Senders.of(owned, computes)
    boxes = Boxes.of(needs, 4)
    at_once = received_values(boxes, senders)
    pair_by_pair = received_values(Boxes(boxes.regions, boxes.lo, boxes.hi, boxed=False), senders)
    assert at_once == pair_by_pair


def test_a_pooled_vector_is_offered_whole_on_every_node_and_a_map_is_not(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    (c1, w1), (fc, w2) = conv("c1", "x", "a", 3, 4), conv("fc", "p", "y", 4, 4, kernel=1)
    model = build_model([c1, helper.make_node("GlobalAveragePool", ["a"], ["p"], name="pool"), fc], {"x": [1, 3, 12, 10]},
                        w1 | w2, ["y"], 13)
    graph = partitioned(model, 2, tmp_path)

    def on_every_node(name: str) -> int:
        layer = next(layer for layer in graph.layers if layer.name == name)
        whole = ShapeMap.full(graph.tensors[layer.outputs[0]].shape)
        offered, cuts = layer_candidates(graph, layer, graph.partitions[name], (1.0, 1.0), default_registry(), False)
        return sum(1 for p in offered[:cuts] if len(p.active_nodes()) == 2 and all(c == whole for c in p.computes))

    # band-pools made the pool a pool of two row bands (not a vector) and a global pool of those
    assert [on_every_node(name) for name in ("c1", "pool", "pool/bands", "fc")] == [0, 0, 1, 1]
    monkeypatch.setattr(network, "REPLICATE_MAX_ELEMENTS", 3)  # fc's 4 outputs are too many
    assert on_every_node("fc") == 0


def test_a_narrow_beam_says_it_is_not_exact(tmp_path) -> None:
    graph = partitioned(residual_model(), 3, tmp_path)
    cost = network_cost(graph, PROFILES["fast link"])
    full, narrow = plan_dp(cost), plan_dp(cost, max_states=1)
    assert full.exact and not narrow.exact
    assert narrow.synchronous >= full.synchronous
    assert all(0 <= c < k for c, k in zip(narrow.choice, cost.cuts))


def test_the_profile_decides(tmp_path) -> None:
    """With a fast link the DP cuts the heavy convolutions; with a slow one it keeps the network
    on one node, where nothing is sent."""
    graph = partitioned(branches_model(), 2, tmp_path)
    fast, slow = (plan_dp(network_cost(graph, PROFILES[k])) for k in ("fast link", "slow link"))
    cost = network_cost(graph, PROFILES["slow link"])
    active = {len(cost.candidates[i][c].active_nodes()) for i, c in enumerate(slow.choice)}
    assert active == {1}
    cost = network_cost(graph, PROFILES["fast link"])
    assert any(len(cost.candidates[i][c].active_nodes()) == 2 for i, c in enumerate(fast.choice))


def test_heft_runs_parallel_branches_on_different_nodes(tmp_path) -> None:
    """Branches too small to cut (one channel of one pixel), each a long computation on slow
    nodes: HEFT runs one on each node, where the DP's objective (and cutting) cannot help."""
    graph = partitioned(branches_model(size=1, channels=1), 2, tmp_path)
    slow = ClusterProfile((NodeProfile(conv_ops_per_s=1e4),), LinkProfile(latency_s=1e-5))
    cost = network_cost(graph, slow)
    heft, dp = plan_heft(cost), plan_dp(cost)
    names = [layer.name for layer in graph.layers]
    where = {names[i]: tuple(cost.candidates[i][c].active_nodes()) for i, c in enumerate(heft.choice)}
    assert {where["p0"], where["q0"]} == {(0,), (1,)}, where  # one branch per node, each whole
    assert heft.timeline < dp.timeline  # the synchronous objective cannot credit that


def test_ga_is_never_worse_than_its_seeds(tmp_path) -> None:
    graph = partitioned(residual_model(), 3, tmp_path)
    cost = network_cost(graph, PROFILES["mixed speeds"])
    seeds = [tuple(0 for _ in cost.candidates), plan_heft(cost).choice]
    ga = plan_ga(cost, seeds, generations=10, population=8)
    assert ga.timeline <= min(cost.timeline(x) for x in seeds)


def test_ga_is_deterministic(tmp_path) -> None:
    graph = partitioned(residual_model(), 2, tmp_path)
    cost = network_cost(graph, PROFILES["fast link"])
    a, b = (plan_network(cost, "ga", seed=3) for _ in range(2))
    assert a.choice == b.choice and a.timeline == b.timeline


def test_map_elites_is_never_worse_than_its_seeds_and_is_deterministic(tmp_path) -> None:
    graph = partitioned(residual_model(), 3, tmp_path)
    cost = network_cost(graph, PROFILES["mixed speeds"])
    seeds = [tuple(0 for _ in cost.candidates), plan_heft(cost).choice]
    a, b = (plan_map_elites(cost, seeds, evaluations=200, seed=5) for _ in range(2))
    assert a.timeline <= min(cost.timeline(x) for x in seeds)
    assert a.choice == b.choice and a.timeline == b.timeline and a.planner == "map-elites"
    assert a.timeline == pytest.approx(cost.timeline(a.choice), rel=1e-12)
    full = plan_network(cost, "map-elites")
    assert full.planner == "map-elites" and full.timeline <= plan_dp(cost).timeline


def test_map_elites_descriptor_bins_the_work_on_one_node_and_the_boundaries(tmp_path) -> None:
    """The whole network on node 0: all its work on one node, no boundary (the top share bin,
    boundary bin 0); the start (every layer cut) has no work alone and receives halos."""
    graph = partitioned(residual_model(), 2, tmp_path)
    cost = network_cost(graph, PROFILES["fast link"])
    work = [float(sum(cost.compute(i, 0))) for i in range(len(cost.candidates))]
    whole = on_node_0(cost)
    assert descriptor(cost, whole, work) == (WHOLE_BINS - 1, 0)
    start = tuple(0 for _ in cost.candidates)
    share, boundaries = descriptor(cost, start, work)
    assert all(len(cost.candidates[i][0].active_nodes()) == 2 for i in range(len(start)) if cost.cuts[i] > 1)
    assert share < WHOLE_BINS - 1 and 0 < boundaries < BOUNDARY_BINS


def test_map_elites_keeps_an_unlike_plan_the_fastest_cannot_reach(tmp_path) -> None:
    """Where placing two branches on different nodes wins (slow nodes, tiny branches), MAP-Elites
    seeded with only the start still finds a plan as fast as HEFT's, which runs them side by side."""
    graph = partitioned(branches_model(size=1, channels=1), 2, tmp_path)
    slow = ClusterProfile((NodeProfile(conv_ops_per_s=1e4),), LinkProfile(latency_s=1e-5))
    cost = network_cost(graph, slow)
    start = tuple(0 for _ in cost.candidates)
    me = plan_map_elites(cost, [start], evaluations=600)
    assert me.timeline <= plan_heft(cost).timeline * (1 + 1e-9) < cost.timeline(start)


def test_timeline_of_a_plan_on_one_node_is_its_compute(tmp_path) -> None:
    graph = partitioned(residual_model(), 2, tmp_path)
    cost = network_cost(graph, PROFILES["fast link"])
    whole = on_node_0(cost)
    assert all(cost.candidates[i][c].active_nodes() == [0] for i, c in enumerate(whole))
    compute = math.fsum(cost.compute(i, c)[0] for i, c in enumerate(whole))
    assert cost.timeline(whole) == pytest.approx(compute, rel=1e-9)
    assert cost.synchronous(whole) == pytest.approx(compute, rel=1e-9)


def test_unknown_planner() -> None:
    with pytest.raises(ValueError, match="unknown planner"):
        plan_network(NetworkCost.__new__(NetworkCost), "annealing")


def test_the_planner_prices_a_nodes_filter_reads_less_the_share_its_cache_keeps_of_the_whole_models_weights_and_outputs(tmp_path) -> None:
    """The planner judges each node's cache once, from the whole model (every weight, every layer's
    output: a cut along rows reads all the filters), and prices its convolutions as the simulator
    prices a node whose cache keeps that share of its working set."""
    from dataclasses import replace

    from bbgrap.cost import weight_bytes
    from bbgrap.simulate import working_set

    graph = partitioned(residual_model(), 2, tmp_path)
    whole = working_set((weight_bytes(layer, graph) for layer in graph.layers),
                        (math.prod(graph.tensors[layer.outputs[0]].shape) for layer in graph.layers))
    node = NodeProfile(conv_read_Bps=1e6, weight_Bps=1e15)  # filter reads slow enough to show
    held = network_cost(graph, ClusterProfile((replace(node, cache_bytes=whole),)))
    short = network_cost(graph, ClusterProfile((replace(node, cache_bytes=whole / 2),)))
    none = network_cost(graph, ClusterProfile((node,)))
    assert held.kept == (1.0, 1.0) and short.kept == pytest.approx((cache_hits(2.0),) * 2) and none.kept == (0.0, 0.0)
    convs = [i for i, layer in enumerate(graph.layers) if layer.op_type == "Conv"]
    assert convs and all(sum(held.compute(i, 0)) < sum(short.compute(i, 0)) < sum(none.compute(i, 0)) for i in convs)


def test_the_planner_prices_an_op_fused_into_a_convolution_as_the_simulator_does(tmp_path) -> None:
    """A ReLU and a residual Add fused into a blocked convolution cost the planner nothing (their
    kernel applies them as it writes each value), a Clip a pass over its values without an op's
    fixed cost; a ReLU after a pool, which runs alone, an op of its own."""
    (c1, w1), (c2, w2), (c3, w3) = conv("c1", "x", "a", 16, 16), conv("c2", "r", "b", 16, 16), conv("c3", "p", "d", 16, 16)
    nodes = [c1, helper.make_node("Relu", ["a"], ["r"], name="relu"), c2, helper.make_node("Add", ["b", "r"], ["s"], name="add"),
             helper.make_node("Clip", ["s", "lo", "hi"], ["k"], name="clip"),
             helper.make_node("MaxPool", ["k"], ["m"], name="pool", kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Relu", ["m"], ["p"], name="alone"), c3]
    consts = {**w1, **w2, **w3}
    consts.update({"lo": np.array(0, np.float32), "hi": np.array(6, np.float32)})
    graph = partitioned(build_model(nodes, {"x": [1, 16, 16, 16]}, consts, ["d"], 13), 2, tmp_path)
    node = NodeProfile(other_ops_per_s=1e9, other_op_s=1e-5)
    cost = network_cost(graph, ClusterProfile((node, node)))
    at = {layer.name: i for i, layer in enumerate(graph.layers)}
    assert sum(cost.compute(at["relu"], 0)) == 0.0 and sum(cost.compute(at["add"], 0)) == 0.0
    clip = cost.candidates[at["clip"]][0]
    assert cost.compute(at["clip"], 0) == pytest.approx(tuple(clip.emitted(n).volume / 1e9 for n in range(2)))
    assert all(t > node.other_op_s for t in cost.compute(at["alone"], 0) if t)  # its own kernel: an op's fixed cost and more
