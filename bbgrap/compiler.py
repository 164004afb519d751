"""`bbgrap compile`: frontend → pass pipeline → backend → plan directory."""

from __future__ import annotations

import contextlib
import gc
import math
import os
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Iterator, Mapping, Sequence

from bbgrap.cluster import DEFAULT_PROFILE, ClusterProfile, with_speeds
from bbgrap.config import Config, Direction
from bbgrap.cost import CPU_MEMORY, CPU_MEMORY_UNPACKED, CPU_RECEIVE, kind_weights, plan_flops, receive_cost
from bbgrap.forked import Forked
from bbgrap.ir import BBGrapError, Graph
from bbgrap.pass_manager import Pass, PassManager
from bbgrap.plan import check_output_dir, file_sha256, write_plan
from bbgrap.plan_schema import (
    FASTEST_PLAN,
    WHOLE_SHARE,
    BalanceRecord,
    CompileRecord,
    MemoryRecord,
    Plan,
    PlannerRecord,
    PredictionRecord,
    RankPrediction,
    RecomputeRecord,
    Source,
)
from bbgrap.report import layer_table
from bbgrap.rules.registry import RuleRegistry, default_registry
from bbgrap.simulate import Prediction, SegmentWork, predict, profile_speeds, program_steps

if TYPE_CHECKING:
    from bbgrap.backends.lower import Message, NodeProgram


# A planner's plan replaces the per-layer search's, a plan receiving every halo replaces
# recompute-halos' plan, and a plan for more nodes one for fewer, only where it is predicted at
# least this much faster: smaller predicted gains are within the simulator's error
# (docs/benchmarks.md: resnet18 on 2 nodes, predicted 2 % faster, measured 17 % slower;
# mobilenet_v3_small on 2 nodes, predicted 2 % faster than one, measured 7 % slower).
PLANNER_MARGIN = 0.03

# Nodes of different speeds: the cut's proportions are the profile's speeds on the model, then up
# to BALANCE_ROUNDS times moved by the ranks' predicted compute (`balanced_speeds`) where it differs
# by more than BALANCE_TOLERANCE: a segment's and a message's fixed costs do not shrink with a node's
# share, so a slow node given its speed's share of the operations finishes last (docs/design.md,
# "Nodes of different speeds from the profile").
BALANCE_ROUNDS = 2
BALANCE_TOLERANCE = 0.05

# Seconds the compile waits for the per-layer plan's prediction from its forked child beyond four
# times what the planner's branch took here (the child's branch does less): a child stuck past that
# is stopped and its work redone in this process.
CHILD_WAIT_S = 60.0


def planner_profile(cfg: Config, profile: ClusterProfile | None) -> ClusterProfile:
    """The profile the whole-network planner and the plans' comparison use: the given one, else
    the default profile with the config's node speeds."""
    return profile if profile is not None else with_speeds(DEFAULT_PROFILE, cfg.node_speeds())


def pipeline(cfg: Config, optimize: bool = True, search: bool = True,
             progress: Callable[[str, int, int], None] | None = None, recompute: bool = True,
             registry: RuleRegistry | None = None, profile: ClusterProfile | None = None) -> list[Pass]:
    """The default pipeline `[band-pools] → naive-partition → insert-crop-concat → eliminate-transfers
    → search → [plan-network] → fit-memory → recompute-halos`, or part of it (`--no-search`,
    `--no-recompute`, `--no-optimize`; band-pools for more than one node of equal speeds, unless
    `--no-optimize`; plan-network with a planner other than greedy, costed with `profile`
    (planner_profile); fit-memory where the config gives the nodes' memory), with the rules of
    `registry` (default: every family shipped)."""
    from bbgrap.passes.band_pools import BandPools
    from bbgrap.passes.eliminate_transfers import EliminateTransfers
    from bbgrap.passes.insert_crop_concat import InsertCropConcat
    from bbgrap.passes.naive_partition import NaivePartition

    registry = registry or default_registry()
    passes: list[Pass] = []
    if optimize and cfg.nodes > 1 and len(set(cfg.node_speeds())) == 1:
        passes.append(BandPools(cfg.nodes, frozenset(c.layer for c in cfg.custom)))
    passes += [NaivePartition(cfg.nodes, cfg.direction, cfg.node_speeds(), cfg.custom, registry=registry), InsertCropConcat()]
    if optimize:
        passes.append(EliminateTransfers())
        if search and cfg.nodes > 1:
            from bbgrap.passes.search import SearchPartitions

            passes.append(SearchPartitions(cfg, progress=progress, registry=registry))
        if cfg.planner != "greedy" and cfg.nodes > 1:
            from bbgrap.passes.plan_network import PlanNetwork

            passes.append(PlanNetwork(cfg.planner, planner_profile(cfg, profile), cfg.node_speeds(),
                                      frozenset(c.layer for c in cfg.custom), registry=registry))
    if cfg.memory_mb:
        from bbgrap.passes.fit_memory import FitMemory

        passes.append(FitMemory(cfg.node_memory(), cfg.node_speeds(), registry=registry))
    if optimize:
        if recompute and cfg.nodes > 1:
            from bbgrap.passes.recompute_halos import RecomputeHalos

            # with a measured profile a receive and each op kind's operation cost what it measured;
            # else the CPU provider's constants, every kind alike
            receive = receive_cost(profile) if profile is not None else CPU_RECEIVE
            weights = kind_weights(profile) if profile is not None else ()
            passes.append(RecomputeHalos(receive=receive, speeds=cfg.node_speeds(), kind_weights=weights, progress=progress,
                                         registry=registry))
    return passes


def check_node_count(graph: Graph, nodes: int, direction: Direction) -> None:
    """Refuse a node count that leaves nodes without work: more nodes than the longest
    extent any tensor has along the cut direction, or along channels (the fallback cut)."""
    def longest(d: Direction) -> int:
        extents = [t.shape[axis] for t in graph.tensors.values() if (axis := d.axis(len(t.shape))) is not None]
        return max(extents, default=1)

    useful = max(longest(direction), longest(Direction.C))
    if nodes > useful:
        raise BBGrapError(f"--nodes {nodes}: no tensor of '{graph.name}' is longer than {useful} along direction {direction.value} "
                          f"or channels, so {nodes - useful} nodes would get no work; use at most {useful} nodes")


def flops_spread(graph: Graph, speeds: Sequence[float], registry: RuleRegistry | None = None) -> float:
    """How far apart a plan's nodes' work is: max/min over the nodes of each one's FLOPs (recomputed
    halos included) over its speed; infinite where a node computes nothing."""
    per_speed = [flops / speed for flops, speed in zip(plan_flops(graph, registry=registry), speeds)]
    return max(per_speed) / min(per_speed) if min(per_speed) > 0 else math.inf


def largest_whole(graph: Graph, direction: Direction, registry: RuleRegistry | None = None) -> float:
    """The share of the model's work of its largest layer computed whole on one node (no rule,
    too short to cut, or placed there by a planner); 0 where none is."""
    rows = layer_table(graph, direction, registry or default_registry())
    total = sum(r.flops for r in rows)
    return max((r.flops for r in rows if r.whole is not None), default=0.0) / total if total > 0 else 0.0


def dump_ir(directory: str) -> Callable[[str, Graph], None]:
    from bbgrap.ir_text import format_graph

    def dump(pass_name: str, graph: Graph) -> None:
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, f"{pass_name}.txt"), "w") as fh:
            fh.write(format_graph(graph))

    return dump


@dataclass(frozen=True)
class Partitioned:
    """The pass pipeline's result for one node count, lowered; `prediction` where a profile was given."""

    graph: Graph
    manager: PassManager
    programs: list[NodeProgram]
    messages: list[Message]
    prediction: Prediction | None
    planner: PlannerRecord | None = None
    recompute: RecomputeRecord | None = None

    @property
    def latency(self) -> float:
        """The predicted latency (only asked for where a profile was given)."""
        assert self.prediction is not None, "no profile, no prediction"
        return self.prediction.latency


def one_node_work(graph: Graph, registry: RuleRegistry | None = None) -> tuple[Graph, list[SegmentWork]]:
    """The imported model `graph` as this pipeline plans it for one node, and that plan's segments
    as the simulator prices them (`program_steps`)."""
    from bbgrap.backends.lower import lower

    registry = registry or default_registry()
    one = PassManager(pipeline(Config(nodes=1), registry=registry)).run(graph)
    programs, _ = lower(one, registry)
    return one, [s.work for s in program_steps(one, programs, registry)[0] if s.work is not None]


def model_speeds(graph: Graph, profile: ClusterProfile, nodes: int, registry: RuleRegistry | None = None) -> tuple[float, ...]:
    """Each of the first `nodes` nodes of `profile` relative speed on the imported model `graph`
    (`simulate.profile_speeds`): its one-node plan (`one_node_work`), priced on every node as the
    simulator prices a plan."""
    return profile_speeds(one_node_work(graph, registry)[1], profile, nodes)


def balanced_speeds(speeds: Sequence[float], prediction: Prediction) -> tuple[float, ...] | None:
    """The cut's speeds that would give every rank of a plan cut by `speeds` the same predicted
    compute: each speed times the ranks' mean compute over its rank's (a rank predicted to compute
    longer than the others gets a smaller share), relative to the slowest and to two decimals as
    `simulate.profile_speeds` gives them; None where the ranks' compute is within BALANCE_TOLERANCE
    of each other, or the new speeds round to the old."""
    compute = [r.compute for r in prediction.ranks]
    if len(compute) != len(speeds) or min(compute) <= 0 or max(compute) <= (1 + BALANCE_TOLERANCE) * min(compute):
        return None
    mean = sum(compute) / len(compute)
    moved = [s * mean / c for s, c in zip(speeds, compute)]
    new = tuple(round(m / min(moved), 2) for m in moved)
    return None if new == tuple(speeds) else new


def fastest_nodes(speeds: Sequence[float], count: int) -> tuple[int, ...]:
    """The `count` fastest of the nodes of these speeds, in node order (of equal speeds the first):
    the nodes a plan for fewer nodes than the cluster's runs on, leaving out the slowest, which
    every other node would wait for."""
    return tuple(sorted(sorted(range(len(speeds)), key=lambda n: (-speeds[n], n))[:count]))


def for_nodes(cfg: Config, nodes: tuple[int, ...]) -> Config:
    """`cfg` for these of its nodes (their speeds and memory; custom per-node sizes dropped), for
    comparing the plan with plans for fewer nodes."""
    return replace(cfg, nodes=len(nodes), speeds=tuple(cfg.speeds[n] for n in nodes) if cfg.speeds else (),
                   memory_mb=tuple(cfg.node_memory()[n] for n in nodes) if cfg.memory_mb else (),
                   custom=tuple(c for c in cfg.custom if c.sizes is None))


def choose_nodes(latencies: Mapping[int, float], margin: float = PLANNER_MARGIN) -> int:
    """The node count with the lowest predicted latency, where a count replaces a smaller one only if
    predicted at least `margin` faster than it (more nodes add waits and copies the simulator
    under-prices: docs/benchmarks.md)."""
    best = min(latencies)
    for n in sorted(latencies):
        if latencies[n] <= (1 - margin) * latencies[best]:
            best = n
    return best


def prediction_record(profile: ClusterProfile, requested: int, chosen: tuple[int, ...], plans: Mapping[int, Partitioned]) -> PredictionRecord:
    """What compile --profile predicted, for the plan's manifest; `chosen`: the profile's nodes the plan runs on."""
    pred, one = plans[len(chosen)].prediction, plans[1].prediction
    assert pred is not None and one is not None
    return PredictionRecord(
        profile=profile.source,
        layer_times=any(n.layer_s for n in profile.nodes),
        requested_nodes=requested,
        nodes=len(chosen),
        latency_ms=round(pred.latency * 1e3, 4),
        ranks=tuple(RankPrediction(round(r.compute * 1e3, 4), round(r.wait * 1e3, 4), round(r.total * 1e3, 4),
                                   tuple(round(t * 1e3, 5) for t in r.segments)) for r in pred.ranks),
        one_node_ms=round(one.latency * 1e3, 4),
        speedup=one.latency / pred.latency if pred.latency > 0 else 1.0,
        candidates_ms={n: round(p.prediction.latency * 1e3, 4) for n, p in sorted(plans.items()) if p.prediction},
        profile_nodes=chosen,
        hosts=tuple(profile.node(n).host for n in chosen),
    )


def memory_record(graph: Graph, limits: Sequence[float]) -> MemoryRecord:
    """The plan's memory per node by fit-memory's estimate, with the copies of the weights
    onnxruntime keeps where the plan prepacks them and where it does not."""
    from bbgrap.passes.fit_memory import MB, node_memory

    cost = CPU_MEMORY if graph.prepack else CPU_MEMORY_UNPACKED
    usage = node_memory(graph, dict(graph.partitions))
    return MemoryRecord(prepack=graph.prepack, limit_mb=tuple(limits), weights_mb=tuple(round(m.weights / MB, 3) for m in usage),
                        activations_mb=tuple(round(m.activations / MB, 3) for m in usage),
                        estimate_mb=tuple(round(cost.of(m) / MB, 3) for m in usage))


GC_THRESHOLD0 = 100_000  # allocations between the cyclic garbage collector's young collections while compiling


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """Python's cyclic collector with its young generation raised to GC_THRESHOLD0 (from 700)
    while compiling, restored after. A compile allocates millions of small immutable regions
    and few cycles: at the default the collector walked the growing IR again and again (maxvit_t
    on 16 nodes: 29-33 s, 25 s raised, 22 s without the collector, the same peak memory)."""
    old = gc.get_threshold()
    gc.set_threshold(GC_THRESHOLD0, *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


@fewer_collections()
def compile_model(
    model: str,
    cfg: Config,
    out_dir: str,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    optimize: bool = True,
    search: bool = True,
    dump_after: Sequence[str] = (),
    dump_dir: str = "bbgrap-ir",
    progress: Callable[[str, int, int], None] | None = None,
    log: Callable[[str], None] = lambda s: None,
    recompute: bool = True,
    registry: RuleRegistry | None = None,
    profile: ClusterProfile | None = None,
    force_nodes: bool = False,
    judge: bool = True,
) -> Plan:
    """Compile `model` for `cfg.nodes` nodes into `out_dir` with the rules of `registry`
    (default: every family shipped); returns the plan as written.

    With a cluster `profile` of nodes of different speeds and no speeds in `cfg`, the cuts take
    their proportions from the profile (`model_speeds`): the speeds come from calibrate's
    measurement, not a flag; where the plan cut so leaves its ranks' predicted compute more than
    BALANCE_TOLERANCE apart, the speeds are moved by it (`balanced_speeds`) and the plan kept where
    predicted faster, up to BALANCE_ROUNDS times. With a `profile`, the plan is simulated (bbgrap/simulate.py) beside the plan for one
    node, and the plan's compile record holds the prediction. Where the plan is not predicted at
    least PLANNER_MARGIN faster than one node, the counts in between are simulated too and the plan
    is compiled for the fastest predicted count, a count replacing a smaller one only where
    PLANNER_MARGIN faster (`choose_nodes`), unless `force_nodes`: a plan for more nodes than pay
    off only adds waiting and copies.

    With a whole-network planner (`cfg.planner`), the planner's plan is kept where it is predicted
    at least PLANNER_MARGIN faster than the per-layer search's, else the search's; without `judge`
    the planner's (benchmarks and tests comparing the planners themselves)."""
    from bbgrap.backends.emit import emit
    from bbgrap.backends.lower import lower
    from bbgrap.frontends.onnx import import_model

    t0 = time.perf_counter()
    check_output_dir(out_dir)
    if profile is not None and profile.model_sha256:
        mine = profile.for_model(file_sha256(model))
        if mine is not profile:
            log(f"profile {profile.source}: its layer times are of another model ({profile.model_path}); "
                "this one's layers are priced by their kind (bbgrap calibrate --model with this file measures them)")
        profile = mine
    step = progress or (lambda label, done, total: None)
    step("import", 0, 1)
    registry = registry or default_registry()
    front = import_model(model, input_shapes, registry=registry)
    step("import", 1, 1)
    check_node_count(front.graph, cfg.nodes, cfg.direction)
    speeds_from_profile = False
    if profile is not None and not cfg.speeds and cfg.nodes > 1:
        speeds = model_speeds(front.graph, profile, cfg.nodes, registry)
        if len(set(speeds)) > 1:
            cfg = replace(cfg, speeds=speeds)
            speeds_from_profile = True
            log(f"node speeds from {profile.source}: {','.join(f'{s:g}' for s in speeds)} (each node's time for this model's "
                "layers; --speeds sets them instead)")
    requested = cfg.nodes
    log(f"imported {model}: {len(front.graph.layers)} layers ({time.perf_counter() - t0:.1f}s)")
    if sized := [layer for layer in front.graph.layers if layer.shape_from_values]:
        log(f"{len(sized)} layer(s) have shapes that depend on the input's values (first: {sized[0].describe(front.graph)}): the plan "
            "holds them at the sample input's shapes and computes them whole; bbgrap-run refuses an input that changes them")

    def finish(graph: Graph, manager: PassManager, profile: ClusterProfile | None) -> Partitioned:
        step("lower", 0, 1)
        programs, messages = lower(graph, registry)
        step("lower", 1, 1)
        return Partitioned(graph, manager, programs, messages, predict(graph, programs, profile, registry) if profile else None)

    def run(passes: Sequence[Pass], graph: Graph, dump: Sequence[str]) -> Graph:
        names = {p.name for p in passes}
        return PassManager(passes, dump_after=[d for d in dump if d in names], dump=dump_ir(dump_dir)).run(graph)

    def partitioned(c: Config, profile: ClusterProfile | None, dump: Sequence[str] = (), searched: bool | None = None) -> Partitioned:
        """The plan for `c` on the nodes of `profile` (None: no prediction). With a whole-network planner the passes before it run once, and the
        rest twice, with and without it (without it in a forked child where there is a second
        core: bbgrap/forked.py; only its prediction comes back, and the plan is made again here
        where it is kept). With a measured `profile`, where the pipeline ends with recompute-halos
        (and `judge`), each of the two plans is first judged on its own (recompute_judged): the
        pass's plan under either pricing, or the plan without that pass where the simulator
        predicts it at least PLANNER_MARGIN faster. Then the planner's plan is kept where it is
        predicted at least PLANNER_MARGIN faster than the per-layer search's, else the search's (or
        without `judge` the planner's); both predictions are recorded. Without a profile the pass's
        own weighing stands: on the default profile the simulator judged resnet18's 2-node plan
        faster without the pass, which measured slower (docs/benchmarks.md, session 9)."""
        passes = pipeline(c, optimize, search if searched is None else searched, progress, recompute, registry, profile)
        PassManager(passes, dump_after=dump, dump=dump_ir(dump_dir))  # checks the names in `dump`
        names = [p.name for p in passes]
        grows = names[-1] == "recompute-halos"
        core = passes[:-1] if grows else passes  # every pass but recompute-halos
        costs = planner_profile(c, profile)

        def latency(p: Partitioned) -> float:
            return p.prediction.latency if p.prediction is not None else predict(p.graph, p.programs, costs, registry).latency

        def grown(before: Graph, done: Sequence[Pass], dump: Sequence[str]) -> Partitioned:
            """`before` (the graph after the passes `done`) through recompute-halos where the pipeline has it, lowered."""
            if not grows:
                return finish(before, PassManager(done), profile)
            return finish(run(passes[-1:], before, dump), PassManager([*done, passes[-1]]), profile)

        def recompute_judged(kept: Partitioned, before: Graph, done: Sequence[Pass]) -> Partitioned:
            """`kept` (recompute-halos' plan of `before`, each operation priced by its kind and a
            receive by its whole segment boundary), the pass's plan with every operation priced
            alike and a receive by its latency and segment alone (the pricing before kinds), or
            `before` lowered as it is, receiving every halo. The pass weighs one halo at a time by
            its operations and a receive's cost, which can load the middle nodes of a cut (two
            halos each) past the others and does not see the waits; neither pricing predicts
            better on every model (docs/benchmarks.md, session 10). The simulator prices the
            plans: the faster pricing's plan is kept, unless receiving every halo is predicted at
            least PLANNER_MARGIN faster still."""
            if not grows or not judge or profile is None:
                return kept
            from bbgrap.passes.recompute_halos import RecomputeHalos

            # where a pass recomputed nothing its graph is `before` itself: that plan is lowered once
            plain = kept if kept.graph is before else finish(before, PassManager(done), profile)
            by_kind = passes[-1]
            assert isinstance(by_kind, RecomputeHalos)
            assert profile is not None  # (checked above; mypy does not narrow a closure's variable)
            alike_pass = replace(by_kind, kind_weights=(), receive=receive_cost(profile, boundary=False))
            alike_graph = run([alike_pass], before, ())
            alike = plain if alike_graph is before else finish(alike_graph, PassManager([*done, alike_pass]), profile)
            t_kind, t_alike, t_without = latency(kept), latency(alike), latency(plain)
            pricing = "by kind" if t_kind <= t_alike else "alike"
            grown_plan, t_with = (kept, t_kind) if pricing == "by kind" else (alike, t_alike)
            keep = not t_without <= (1 - PLANNER_MARGIN) * t_with
            record = RecomputeRecord(keep, costs.source, pricing, round(t_kind * 1e3, 4), round(t_alike * 1e3, 4),
                                     round(t_without * 1e3, 4))
            return replace(grown_plan if keep else plain, recompute=record)

        def logged(p: Partitioned) -> Partitioned:
            if p.recompute is not None:
                log(p.recompute.summary())
            return p

        if "plan-network" not in names:
            before = run(core, front.graph, dump)
            return logged(recompute_judged(grown(before, core, dump), before, core))
        k = names.index("plan-network")
        head = run(passes[:k], front.graph, dump)
        rest = core[:k] + core[k + 1:]  # without plan-network

        def greedy_judged() -> Partitioned:
            """The per-layer search's plan, recompute-halos judged on it as on the planner's."""
            before = run(rest[k:], head, ())
            return recompute_judged(grown(before, rest, ()), before, rest)

        # The planner's plan and the search's are each judged with and without recompute-halos, under
        # both pricings, before they are compared: which cut pays depends on whether its halos are
        # received or recomputed.
        with Forked(lambda: latency(greedy_judged())) as greedy_latency:  # on a second core, beside the planner's
            started = time.perf_counter()
            planned_before = run(core[k:], head, dump)
            planned = recompute_judged(grown(planned_before, core, dump), planned_before, core)
            times = {c.planner: latency(planned)}
            # the child does less than this branch did: one stuck far longer is stopped, its work done here
            times["greedy"] = greedy_latency.result(timeout=CHILD_WAIT_S + 4 * (time.perf_counter() - started))
        kept = c.planner if times[c.planner] <= (1 - PLANNER_MARGIN) * times["greedy"] or not judge else "greedy"
        stats = planned.graph.planner_stats
        assert stats is not None, "the pipeline with a planner ran plan-network"
        record = PlannerRecord(c.planner, kept, costs.source, round(times[c.planner] * 1e3, 4), round(times["greedy"] * 1e3, 4), stats)
        log(f"planner {c.planner}: predicted {times[c.planner] * 1e3:.3f} ms, per-layer search alone {times['greedy'] * 1e3:.3f} ms; "
            f"kept {kept}")
        return replace(logged(planned if kept == c.planner else greedy_judged()), planner=record)

    plans = {cfg.nodes: partitioned(cfg, profile, dump_after)}
    chosen = tuple(range(cfg.nodes))  # the profile's nodes the plan runs on
    cut = cfg  # the config the plan for all the nodes was cut by (speeds balanced by its prediction)
    for _ in range(BALANCE_ROUNDS if speeds_from_profile else 0):
        prediction = plans[cfg.nodes].prediction
        assert prediction is not None and profile is not None  # speeds from the profile: the plan was predicted
        new = balanced_speeds(cut.node_speeds(), prediction)
        if new is None:
            break
        candidate = partitioned(replace(cut, speeds=new), profile, dump_after)
        if candidate.latency >= plans[cfg.nodes].latency:
            if dump_after:  # the IR dumped is the plan's that is kept
                partitioned(cut, profile, dump_after)
            break
        log(f"node speeds balanced by the ranks' predicted compute ({' / '.join(f'{r.compute * 1e3:.2f}' for r in prediction.ranks)} ms): "
            f"{','.join(f'{s:g}' for s in new)}, predicted {candidate.latency * 1e3:.3f} ms against {plans[cfg.nodes].latency * 1e3:.3f}")
        cut, plans[cfg.nodes] = replace(cut, speeds=new), candidate

    def evened(c: Config, p: Partitioned, prof: ClusterProfile | None) -> tuple[Config, Partitioned, BalanceRecord]:
        """`p` (cut by `c`), or where its nodes' work is more than `c.balance` apart (`flops_spread`)
        or a layer of more than WHOLE_SHARE of it is computed whole on one node, the fastest
        predicted of the plans that are even so: the per-layer search's (along `c.direction` where a
        planner made `p`, and along the other directions), then the even cut along h, w and c (the
        cuts a short map or a planner's placements leave uneven); an error naming the most even one
        where none is. The user asked for the bound, so a plan within it wins over a faster one
        beyond it. The record says which was kept and why."""
        costs = planner_profile(c, prof)

        def latency(q: Partitioned) -> float:
            return q.prediction.latency if q.prediction is not None else predict(q.graph, q.programs, costs, registry).latency

        def even(q: Partitioned, alt: Config) -> tuple[float, float]:
            return flops_spread(q.graph, c.node_speeds(), registry), largest_whole(q.graph, alt.direction, registry)

        def within(spread: float, whole: float) -> bool:
            return spread <= c.balance and whole <= WHOLE_SHARE

        spread, whole = even(p, c)
        t_fastest = round(latency(p) * 1e3, 4)
        if within(spread, whole):
            return c, p, BalanceRecord(c.balance, spread, whole, FASTEST_PLAN, spread, whole, t_fastest, t_fastest)
        planned = p.planner is not None and p.planner.kept != "greedy"  # a whole-network planner's plan, not the search's
        cuts = (Direction.H, Direction.W, Direction.C)
        tries = [("the per-layer search's plan", replace(c, planner="greedy"), search)] if planned else []
        tries += [(f"the per-layer search's plan along {d.value}", replace(c, planner="greedy", direction=d), True)
                  for d in cuts if search and d is not c.direction]
        tries += [(f"the even cut along {d.value}", replace(c, planner="greedy", direction=d), False) for d in cuts]
        kept: list[tuple[float, str, Config, Partitioned, float, float]] = []
        evenest = (spread, whole, FASTEST_PLAN)
        for label, alt, searched in tries:
            try:
                check_node_count(front.graph, alt.nodes, alt.direction)
                q = partitioned(alt, prof, searched=searched)
            except BBGrapError:  # a direction this model cannot be cut along for these nodes
                continue
            q_spread, q_whole = even(q, alt)
            evenest = min(evenest, (q_spread, q_whole, label), key=lambda e: (e[1] > WHOLE_SHARE, e[0]))
            if within(q_spread, q_whole):
                kept.append((latency(q), label, alt, q, q_spread, q_whole))
        if not kept:
            raise BBGrapError(f"--balance {c.balance:g}: no plan found is that even (the most even, {evenest[2]}, "
                              f"{BalanceRecord.said(evenest[0], evenest[1])}); raise --balance to {evenest[0]:.2f} or more, "
                              "or compile for fewer nodes")
        t, label, alt, q, q_spread, q_whole = min(kept, key=lambda k: k[0])
        record = BalanceRecord(c.balance, spread, whole, label, q_spread, q_whole, t_fastest, round(t * 1e3, 4))
        log(record.summary())
        return alt, q, record

    def fewer(n: int) -> Partitioned:
        """The plan for the `n` fastest nodes (`fastest_nodes`)."""
        assert profile is not None
        which = fastest_nodes(cfg.node_speeds(), n)
        return partitioned(for_nodes(cfg, which), profile.subset(which))

    if profile is not None:
        if 1 not in plans:
            plans[1] = fewer(1)
        if not force_nodes and choose_nodes({1: plans[1].latency, cfg.nodes: plans[cfg.nodes].latency}) != cfg.nodes:
            for n in range(2, cfg.nodes):
                plans[n] = fewer(n)
            chosen = fastest_nodes(cfg.node_speeds(), choose_nodes({n: p.latency for n, p in plans.items()}))
        if len(chosen) != cfg.nodes:
            cfg = for_nodes(cfg, chosen)
    if len(chosen) == cut.nodes:
        cfg = cut
    balance = None
    if cfg.balance and len(chosen) > 1:
        cfg, plans[len(chosen)], balance = evened(cfg, plans[len(chosen)], profile if profile is None or len(chosen) == requested
                                                  else profile.subset(chosen))
    kept = plans[len(chosen)]
    graph, manager, programs, messages = kept.graph, kept.manager, kept.programs, kept.messages
    compiled = CompileRecord(
        direction=cfg.direction,
        threshold=cfg.threshold,
        speeds=tuple(cfg.node_speeds()),
        passes=tuple(p.name for p in manager.passes),
        search=graph.search_stats,
        layer_table=layer_table(graph, cfg.direction, registry),
        compile_seconds=round(time.perf_counter() - t0, 3),
        # the model compiled, for `bbgrap-run --check` (which refuses another file at that path)
        source=Source(os.path.abspath(model), file_sha256(model)),
        prediction=prediction_record(profile, requested, chosen, plans) if profile is not None else None,
        planner=kept.planner,
        memory=memory_record(graph, cfg.node_memory()),
        recompute=kept.recompute,
        shapes_from_values=tuple(layer.name for layer in graph.layers if layer.shape_from_values),
        balance=balance,
    )
    plan, files = emit(graph, programs, messages, compiled, registry)
    writing = f"write {sum(map(len, files.values())) / 1e6:.0f} MB"
    step(writing, 0, 1)
    written = write_plan(out_dir, plan, files, front.sample_inputs, front.reference_outputs)
    step(writing, 1, 1)
    return written
