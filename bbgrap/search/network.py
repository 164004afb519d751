"""Whole-network planning: every layer's cut chosen jointly, against the cluster profile.

The per-layer search (passes/search.py) is optimal layer by layer and greedy across layers.
The planners here choose one *candidate* per layer for the whole network at once.

**Candidates** of a layer (`layer_candidates`): the cut it already has (the per-layer
search's, or the naive one), the speed-proportional cut along every axis its rule allows
that is long enough for every node, the layer whole on each node, and for a layer whose
output is a small vector per image (`pooled_vector`) the layer whole on every node
(`naive_partition.replicated`: a squeeze-excite block's pool and 1x1 convolutions computed by
every node from one exchange of the pool's input, instead of a round trip through one node;
offered for these alone, so that the candidates stay few where the extra operations could not
pay). A layer without a rule, with more than one output, or with a custom partition keeps the
one it has; a layer too short to cut still has its placements.

**Costs** (`NetworkCost`, from a `ClusterProfile`): node n computing candidate c of layer L
takes `ops_n / throughput_kind(n) + op_s_kind(n)` (bbgrap/cost.py's operations of what it
computes, the profile's throughput for the op's kind; a depthwise convolution's output values
at the node's `depthwise_elements_per_s` too, an "other" op's beyond the cache at its
`stream_ops_per_s`; an op of a fused activation, `simulate.chained_layers`, its operations only;
an op onnxruntime fuses into the convolution or Gemm before it, `simulate.fused_into`, nothing or a
pass over its output as the simulator prices it where the two share a cut, `simulate.fused_pass`),
or where the profile measured L on n
(`calibrate --model`) the kind's fixed cost plus the rest of L's measured time scaled to the
piece by L's measured rows and channels slopes, else in proportion to `ops_n`
(`NodeProfile.layer_time`). Reading an input whose producer chose
candidate d, node n receives from every other node s the part of its need that s owns and n
does not hold; each message costs its sender `send_s + bytes x send_byte_s` and arrives
`latency + bytes / bandwidth` after that, and its receiver takes it as the simulator has it
(`NodeProfile.taken`: `recv_s + bytes x recv_byte_s` from when it asks, and no sooner than
`recv_s` after the arrival), one message after another; a node that receives anything for the layer pays one segment
boundary with a piece per sender (`NodeProfile.boundary_s`) and the concat of what it received
(one operation per element at a Concat's speed, `NodeProfile.op_rate`). The model's outputs are gathered on node 0.

Two evaluations of a whole choice `x` (one candidate per layer):

* **synchronous** (the planners' exact objective): every layer starts when the slowest node
  of the one before it is done,

      S(x) = sum over layers L of  max over nodes n of (compute(L, x_L, n) + receive(L, x_L, x_P, n))
             + output gather,

  a sum of terms each of which couples a layer only with its producers, so it can be
  minimised exactly by dynamic programming over the layers (`plan_dp`);
* **timeline** (`NetworkCost.timeline`): each node keeps its own clock and a layer starts on
  node n when n is free and every message it needs has arrived (sent when its sender
  finished the producer). It credits what the synchronous sum cannot: parallel branches
  placed on different nodes. HEFT, the genetic algorithm and MAP-Elites minimise it.

Neither replaces the simulator of the lowered plan (bbgrap/simulate.py), which judges the
planners' results against the per-layer search's (bbgrap/compiler.py).

**Planners**

* `plan_dp`: the exact minimum of S over all candidate choices (proof in its docstring),
  unless the frontier of live layers holds more than `max_states` assignments, when the
  cheapest are kept (a beam; `NetworkResult.exact` says whether that happened);
* `plan_heft`: list scheduling in order of upward rank (Topcuoglu et al.'s HEFT), each
  layer taking the candidate with the earliest finish on the timeline so far;
* `plan_ga`: a genetic algorithm over whole choices, seeded with the current plan, the DP's
  and HEFT's, minimising the timeline (seeded random generator: the same input gives the same
  plan);
* `plan_map_elites`: MAP-Elites over the same choices, seeds and timeline, keeping the fastest
  choice of each kind (share of work on one node, number of boundaries) as stepping stones.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from bbgrap.cluster import ClusterProfile
from bbgrap.config import PLANNERS
from bbgrap.cost import weight_bytes
from bbgrap.ir import Graph, Layer, LayerPartition, ShapeMap
from bbgrap.movement import OUTPUT_NODE
from bbgrap.passes.naive_partition import axis_sizes, fastest_node, partition_layer, replicated, shared_axes
from bbgrap.rules.registry import RuleRegistry
from bbgrap.simulate import chained_layers, fused_into, fused_pass, layer_work, op_kind, whole_ops, work_seconds, working_set

Choice = tuple[int, ...]  # one candidate index per layer, in the graph's layer order
REPLICATE_MAX_ELEMENTS = 1 << 14  # largest output (elements) of a layer offered whole on every node


def pooled_vector(shape: Sequence[int]) -> bool:
    """The output is a small vector per image — every axis after the channels of extent 1, at most
    REPLICATE_MAX_ELEMENTS elements — as after a global pool: the layers offered whole on every node."""
    return all(d == 1 for d in shape[2:]) and math.prod(shape) <= REPLICATE_MAX_ELEMENTS


def layer_candidates(graph: Graph, layer: Layer, current: LayerPartition, speeds: Sequence[float],
                     registry: RuleRegistry, fixed: bool, placements: bool = True) -> tuple[list[LayerPartition], int]:
    """The cuts a planner may choose for `layer` (module docstring), the current one first, the
    layer whole on the fastest node (`fastest_node`: node 0 where speeds are equal) and, for a
    `pooled_vector`, whole on every node, then, with `placements`, the layer whole on each other
    node; and how many come before those placements (the DP chooses among these only: a layer
    placed away from the fastest node pays off where branches run side by side, which its
    objective does not credit, so it is not offered them: on 16 nodes making them was half the
    plan-network pass)."""
    out = [current]
    rule = registry.get(layer)
    if fixed or rule is None or len(layer.outputs) > 1:
        return out, 1
    shape = graph.tensors[layer.outputs[0]].shape
    axes = sorted(a for a in rule.axes(layer, graph) if a < len(shape))
    for axis in shared_axes(graph, layer, registry):
        out.append(partition_layer(graph, layer, axis, axis_sizes(shape, axis, speeds), registry))
    fastest = fastest_node(speeds)
    out.append(partition_layer(graph, layer, None, None, registry, fastest))
    # after the layer whole on one node, which it ties with where no other node reads the layer:
    # the planners keep the first of equal choices, and this one does more work in all
    if pooled_vector(shape) and (every := replicated(graph, layer, speeds, registry)) is not None:
        out.append(every)
    cuts = len(out)
    if placements and axes and graph.nodes > 1:  # whole on node k: every row along a cut axis to k
        for k in (k for k in range(graph.nodes) if k != fastest):
            sizes = [0] * graph.nodes
            sizes[k] = shape[axes[0]]
            out.append(partition_layer(graph, layer, axes[0], sizes, registry))
    unique: list[LayerPartition] = []
    before_placements = 0  # of `unique`, those from the first `cuts` of `out` (which come first)
    for k, part in enumerate(out):
        if all(part.out != seen.out or part.computes != seen.computes or part.emits != seen.emits for seen in unique):
            unique.append(part)
            before_placements += k < cuts
    return unique, before_placements


Box = tuple[tuple[int, int], ...]  # (start, stop) per axis


def box(region: ShapeMap) -> Box | None:
    """The region as (start, stop) per axis where it is one box (an empty region: the empty box
    `()` of no volume), else None."""
    if region.rank == 0 or not region.is_box and not region.empty:  # a scalar has no axis to be empty along
        return None
    if region.empty:
        return ()
    return tuple((iv.start, iv.stop) for iv in (region.interval(a) for a in range(region.rank)))


@dataclass(frozen=True)
class Receives:
    """What each node receives for one input of a layer: per node the (sender, bytes) messages,
    what receiving anything costs it besides the messages (the segment boundary, the concat), and
    its seconds in all (the messages' arrivals, one after another from the layer's start, and
    their takes, `NodeProfile.taken`, and that)."""

    messages: tuple[tuple[tuple[int, int], ...], ...]
    extra: tuple[float, ...]
    seconds: tuple[float, ...]


@dataclass(frozen=True)
class Boxes:
    """One region per node (None: none), and each as a box, `lo` and `hi` (nodes x rank; a node
    without a region gets an empty box), for the volumes of all pairs' intersections at once;
    `boxed` says whether every region was one box (else the regions must be intersected)."""

    regions: tuple[ShapeMap | None, ...]
    lo: np.ndarray
    hi: np.ndarray
    boxed: bool

    @staticmethod
    def of(regions: Sequence[ShapeMap | None], rank: int) -> Boxes:
        lo = np.zeros((len(regions), rank), np.int64)
        hi = np.zeros((len(regions), rank), np.int64)
        boxed = rank > 0
        for n, region in enumerate(regions):
            if region is None or region.empty:
                continue
            b = box(region)
            if not b:
                boxed = False
                continue
            lo[n], hi[n] = [x for x, _ in b], [x for _, x in b]
        return Boxes(tuple(regions), lo, hi, boxed)


@dataclass(frozen=True)
class Senders:
    """What each node owns of a producer's output (what others receive from it) and holds of it
    (what it need not receive: None where it owns nothing)."""

    owned: Boxes
    held: Boxes

    @staticmethod
    def of(owned: Sequence[ShapeMap], computes: Sequence[ShapeMap]) -> Senders:
        holds = [computes[n] if not owned[n].empty else None for n in range(len(owned))]
        rank = owned[0].rank
        return Senders(Boxes.of(owned, rank), Boxes.of(holds, rank))


def received_values(needs: Boxes, senders: Senders) -> list[tuple[int, int, int]]:
    """(node, sender, values) for every node that must receive values from another: what it
    needs of what the sender owns, less what it holds itself. All pairs at once where every
    region is a box (need ∩ own, then that ∩ held), else region by region."""
    own, held = senders.owned, senders.held
    if needs.boxed and own.boxed and held.boxed:
        lo = np.maximum(needs.lo[:, None], own.lo[None])
        hi = np.minimum(needs.hi[:, None], own.hi[None])
        common = np.maximum(hi - lo, 0).prod(axis=2)
        kept = np.maximum(np.minimum(hi, held.hi[:, None]) - np.maximum(lo, held.lo[:, None]), 0).prod(axis=2)
        values = common - kept
        np.fill_diagonal(values, 0)
        return [(n, s, int(values[n, s])) for n, s in np.argwhere(values > 0).tolist()]
    out = []
    for n, need in enumerate(needs.regions):
        if need is None or need.empty:
            continue
        held_n = held.regions[n]
        for s, owned in enumerate(own.regions):
            if s == n or owned is None or owned.empty:
                continue
            common_map = need.intersect(owned)
            values = common_map.volume - (common_map.intersect(held_n).volume if held_n is not None else 0)
            if values > 0:
                out.append((n, s, values))
    return out


@dataclass
class NetworkCost:
    """The cost tables of every layer's candidates (module docstring), filled as they are asked for."""

    graph: Graph
    candidates: list[list[LayerPartition]]
    cuts: list[int]  # per layer, how many candidates come before the placements on nodes other than 0
    profile: ClusterProfile
    registry: RuleRegistry
    _compute: dict[tuple[int, int], tuple[float, ...]] = field(default_factory=dict)
    _receives: dict[tuple[int, int, int, int], Receives] = field(default_factory=dict)
    _senders: dict[tuple[int, int, str], Senders] = field(default_factory=dict)
    _needs: dict[tuple[int, int, int], Boxes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        graph = self.graph
        self.nodes = graph.nodes
        self.index = {layer.name: i for i, layer in enumerate(graph.layers)}
        producers = graph.producers()
        # per layer: (input position, producer's layer index) of each activation input another layer makes
        self.edges: list[tuple[tuple[int, int], ...]] = []
        for layer in graph.layers:
            self.edges.append(tuple((k, self.index[producers[t].name]) for k, t in enumerate(layer.inputs)
                                    if t and t in producers and graph.is_activation(t)))
        self.outputs = [tuple(t for t in layer.outputs if t in graph.outputs) for layer in graph.layers]
        self.kinds = [op_kind(layer, graph) for layer in graph.layers]
        self.whole = [whole_ops(layer, graph, self.registry) for layer in graph.layers]
        self.chained = chained_layers(graph, self.registry)
        # per layer fused into the convolution or Gemm before it: whether it takes a pass over the output
        # there (`simulate.fused_pass`); None: a kernel of its own
        self.fused: list[bool | None] = []
        for layer in graph.layers:
            anchor_kind = fused_into(layer, graph, self.registry)
            self.fused.append(None if anchor_kind is None else fused_pass(self.registry.traits(layer.op_type, layer.domain), anchor_kind))
        # a node may read all of the model's weights (a cut along rows does) and write every layer's output:
        # its convolutions read from its cache the share of their filters it keeps (`simulate.working_set`)
        whole_set = working_set((weight_bytes(layer, graph) for layer in graph.layers),
                                (math.prod(graph.tensors[layer.outputs[0]].shape) for layer in graph.layers))
        self.kept = tuple(self.profile.node(n).kept(whole_set) for n in range(self.nodes))

    # tables -----------------------------------------------------------------------------------
    def compute(self, i: int, c: int) -> tuple[float, ...]:
        """Seconds each node computes candidate c of layer i (0 where it computes nothing)."""
        key = (i, c)
        got = self._compute.get(key)
        if got is None:
            layer, part = self.graph.layers[i], self.candidates[i][c]
            times = [0.0] * self.nodes
            for n in part.active_nodes():
                if self.fused[i] is not None:  # in the convolution's kernel, as the simulator has it where they share a cut
                    times[n] = part.emitted(n).volume / self.profile.node(n).other_ops_per_s if self.fused[i] else 0.0
                    continue
                work = layer_work(layer, self.graph, part, n, self.kinds[i], self.whole[i], self.registry, self.chained, layer.name in self.chained)
                times[n] = work_seconds(self.profile.node(n), work, self.kept[n])
            got = self._compute[key] = tuple(times)
        return got

    def receives(self, i: int, k: int, j: int, d: int, c: int) -> Receives:
        """What the nodes computing candidate c of layer i receive for its input k, whose producer
        (layer j) chose candidate d."""
        key = (i, k, d, c)
        got = self._receives.get(key)
        if got is not None:
            return got
        graph = self.graph
        tensor = graph.layers[i].inputs[k]
        itemsize = np.dtype(graph.tensors[tensor].dtype).itemsize
        per_node: list[list[tuple[int, int]]] = [[] for _ in range(self.nodes)]
        for n, s, values in received_values(self.need_boxes(i, c, k), self.senders(j, d, tensor)):
            per_node[n].append((s, values * itemsize))
        messages = tuple(tuple(got_n) for got_n in per_node)
        extra: list[float] = []
        seconds: list[float] = []
        for n, got_n in enumerate(per_node):
            if got_n:
                p = self.profile.node(n)
                extra.append(p.boundary_s(len(got_n)) + sum(b for _, b in got_n) / itemsize / p.op_rate("other", "Concat"))
                ready = arrival = 0.0
                for s, b in got_n:
                    arrival += self.message_seconds(s, b)
                    ready = p.taken(ready, arrival, b)
                seconds.append(ready + extra[-1])
            else:
                extra.append(0.0)
                seconds.append(0.0)
        got = self._receives[key] = Receives(messages, tuple(extra), tuple(seconds))
        return got

    def message_seconds(self, sender: int, nbytes: int) -> float:
        """From the sender posting a message of `nbytes` to its arrival."""
        return self.profile.node(sender).send_time(nbytes) + self.profile.link.message_s(nbytes)

    def senders(self, j: int, d: int, tensor: str) -> Senders:
        """Who owns what of `tensor`, an output of layer j computed as its candidate d (a further
        output than the first: only a layer computed whole has them, its node owns all of it)."""
        key = (j, d, tensor)
        got = self._senders.get(key)
        if got is None:
            source = self.candidates[j][d]
            owned, holds = source.out, source.computes
            if self.graph.layers[j].outputs[0] != tensor:
                whole = ShapeMap.full(self.graph.tensors[tensor].shape)
                owned = holds = tuple(whole if not r.empty else ShapeMap.empty_like(len(whole.axes)) for r in source.out)
            got = self._senders[key] = Senders.of(owned, holds)
        return got

    def need_boxes(self, i: int, c: int, k: int) -> Boxes:
        """What each node computing candidate c of layer i reads of its input k, as boxes."""
        key = (i, c, k)
        got = self._needs.get(key)
        if got is None:
            part = self.candidates[i][c]
            tensor = self.graph.layers[i].inputs[k]
            regions = [part.needs[n][k] if not part.out[n].empty else None for n in range(self.nodes)]
            got = self._needs[key] = Boxes.of(regions, len(self.graph.tensors[tensor].shape))
        return got

    def output_seconds(self, i: int, c: int) -> float:
        """Gathering layer i's model outputs on node 0 (messages from the nodes that own them)."""
        if not self.outputs[i]:
            return 0.0
        part = self.candidates[i][c]
        total = 0.0
        for t in self.outputs[i]:
            itemsize = np.dtype(self.graph.tensors[t].dtype).itemsize
            for s in part.active_nodes():
                if s != OUTPUT_NODE:
                    total += self.message_seconds(s, part.out[s].volume * itemsize)
        return total

    # evaluations ------------------------------------------------------------------------------
    def step(self, i: int, c: int, chosen: Mapping[int, int]) -> float:
        """Layer i's term of the synchronous objective: its slowest node (computing and
        receiving), given its producers' candidates in `chosen` (layer index → candidate)."""
        times = list(self.compute(i, c))
        for k, j in self.edges[i]:
            rec = self.receives(i, k, j, chosen[j], c)
            for n, s in enumerate(rec.seconds):
                times[n] += s
        return max(times) + self.output_seconds(i, c)

    def synchronous(self, x: Choice) -> float:
        """S(x) of the module docstring."""
        return math.fsum(self.step(i, c, dict(enumerate(x))) for i, c in enumerate(x))

    def finish(self, i: int, c: int, x: Mapping[int, int], clock: list[float], done: Mapping[int, tuple[float, ...]]) -> tuple[float, ...]:
        """When each node finishes candidate c of layer i on the timeline: `clock` holds when
        each node is free, `done` when each node finished each earlier layer. Advances `clock`."""
        compute = self.compute(i, c)
        out = [0.0] * self.nodes
        for n in self.candidates[i][c].active_nodes():
            ready, extra, p = clock[n], 0.0, self.profile.node(n)
            for k, j in self.edges[i]:
                rec = self.receives(i, k, j, x[j], c)
                for s, nbytes in rec.messages[n]:
                    ready = p.taken(ready, done[j][s] + self.message_seconds(s, nbytes), nbytes)
                extra += rec.extra[n]
            out[n] = clock[n] = ready + extra + compute[n]
        return tuple(out)

    def timeline(self, x: Choice) -> float:
        """The timeline latency of choice x (module docstring), layers in the graph's order."""
        clock = [0.0] * self.nodes
        done: dict[int, tuple[float, ...]] = {}
        chosen = dict(enumerate(x))
        end = 0.0
        for i, c in enumerate(x):
            done[i] = self.finish(i, c, chosen, clock, done)
            if self.outputs[i]:
                end = max(end, max(done[i]) + self.output_seconds(i, c))
        return max(end, max(clock))


@dataclass(frozen=True)
class NetworkResult:
    """A planner's choice, its objective values, and what it took to find it."""

    planner: str
    choice: Choice
    synchronous: float
    timeline: float
    evaluated: int  # states (DP), candidate placements (HEFT) or whole choices (GA, MAP-Elites) scored
    exact: bool  # the DP's result is S's minimum over all candidate choices
    seconds: float


def last_uses(cost: NetworkCost) -> list[int]:
    """Per layer, the index of the last layer that reads its outputs (itself where none does)."""
    last = list(range(len(cost.edges)))
    for i, edges in enumerate(cost.edges):
        for _, j in edges:
            last[j] = max(last[j], i)
    return last


def plan_dp(cost: NetworkCost, max_states: int = 256) -> NetworkResult:
    """The choice minimising the synchronous objective S, by dynamic programming over the layers,
    among each layer's cuts and the layer whole on node 0 (`NetworkCost.cuts`; placements on other
    nodes pay off where branches run side by side, which S does not credit: they are left to the
    timeline's planners).

    Proof. Write S(x) = Σ_i f_i(x_i, x_{P(i)}), P(i) the producers of layer i. After layer i,
    the *frontier* F_i is the set of layers j ≤ i read by some layer after i. Let V_i(a) be the
    least Σ_{i' ≤ i} f_{i'} over choices of layers 0..i that agree with the assignment a of F_i.
    Every producer of layer i+1 is in F_i, so f_{i+1} depends only on x_{i+1} and a; and no later
    term depends on a layer once it has left the frontier. Hence
    V_{i+1}(b) = min over (a, x_{i+1}) restricting to b of V_i(a) + f_{i+1}(x_{i+1}, a), and
    min S = V_last(∅) (the frontier after the last layer is empty). The recursion below computes
    exactly this, keeping one predecessor per state to recover the choice. It enumerates
    Π_{j ∈ F_i} K_j states per layer: a chain has one layer in its frontier, a residual block two.
    Where a frontier holds more than `max_states` assignments, only the cheapest `max_states`
    are kept and the result is marked not exact.
    """
    t0 = time.perf_counter()
    last = last_uses(cost)
    frontier: tuple[int, ...] = ()
    states: dict[tuple[int, ...], float] = {(): 0.0}
    back: list[dict[tuple[int, ...], tuple[tuple[int, ...], int]]] = []
    exact, evaluated = True, 0
    for i in range(len(cost.candidates)):
        widened = frontier + (i,)
        new_frontier = tuple(j for j in widened if last[j] > i)
        keep = [widened.index(j) for j in new_frontier]
        new_states: dict[tuple[int, ...], float] = {}
        links: dict[tuple[int, ...], tuple[tuple[int, ...], int]] = {}
        for a, value in states.items():
            chosen = dict(zip(frontier, a))
            for c in range(cost.cuts[i]):
                evaluated += 1
                total = value + cost.step(i, c, chosen)
                full = a + (c,)
                b = tuple(full[p] for p in keep)
                if total < new_states.get(b, math.inf):
                    new_states[b] = total
                    links[b] = (a, c)
        if len(new_states) > max_states:
            exact = False
            best = heapq.nsmallest(max_states, new_states.items(), key=lambda kv: (kv[1], kv[0]))
            new_states = dict(best)
            links = {b: links[b] for b in new_states}
        back.append(links)
        frontier, states = new_frontier, new_states
    # walk back from the empty frontier: each layer's choice and its predecessor state
    choice = [0] * len(cost.candidates)
    (state, value), = states.items()
    for i in range(len(cost.candidates) - 1, -1, -1):
        prev, c = back[i][state]
        choice[i] = c
        state = prev
    x = tuple(choice)
    return NetworkResult("dp", x, value, cost.timeline(x), evaluated, exact, time.perf_counter() - t0)


def upward_ranks(cost: NetworkCost) -> list[float]:
    """HEFT's upward rank: a layer's mean compute over its candidates (its slowest node) plus the
    longest such path from it to the network's end."""
    n = len(cost.candidates)
    mean = [sum(max(cost.compute(i, c)) for c in range(len(cost.candidates[i]))) / len(cost.candidates[i]) for i in range(n)]
    rank = mean[:]
    for i in range(n - 1, -1, -1):
        for _, j in cost.edges[i]:
            rank[j] = max(rank[j], mean[j] + rank[i])
    return rank


def plan_heft(cost: NetworkCost) -> NetworkResult:
    """HEFT list scheduling: among the layers whose producers are placed, the one of highest
    upward rank goes next, with the candidate whose slowest node finishes first on the timeline
    so far (the current cut on a tie)."""
    t0 = time.perf_counter()
    n = len(cost.candidates)
    rank = upward_ranks(cost)
    waiting = [len({j for _, j in cost.edges[i]}) for i in range(n)]
    readers: list[set[int]] = [set() for _ in range(n)]
    for i in range(n):
        for _, j in cost.edges[i]:
            readers[j].add(i)
    ready = [(-rank[i], i) for i in range(n) if waiting[i] == 0]
    heapq.heapify(ready)
    clock = [0.0] * cost.nodes
    done: dict[int, tuple[float, ...]] = {}
    chosen: dict[int, int] = {}
    evaluated = 0
    while ready:
        _, i = heapq.heappop(ready)
        best: tuple[float, int, list[float], tuple[float, ...]] | None = None
        for c in range(len(cost.candidates[i])):
            evaluated += 1
            trial = clock[:]
            finish = cost.finish(i, c, chosen | {i: c}, trial, done)
            end = max(finish) + cost.output_seconds(i, c)
            if best is None or end < best[0]:
                best = (end, c, trial, finish)
        assert best is not None
        _, chosen[i], clock, done[i] = best
        for r in readers[i]:
            waiting[r] -= 1
            if waiting[r] == 0:
                heapq.heappush(ready, (-rank[r], r))
    x = tuple(chosen[i] for i in range(n))
    return NetworkResult("heft", x, cost.synchronous(x), cost.timeline(x), evaluated, False, time.perf_counter() - t0)


@dataclass
class Variation:
    """How the evolutionary planners make new choices from old ones (a seeded generator: the same
    input gives the same plans): `mutate` changes a few layers (one layer, or a run of consecutive
    layers set to one axis' cut), `cross` takes each layer's candidate from either parent; and
    `score`, the timeline of a choice, remembered."""

    cost: NetworkCost
    rng: random.Random
    scores: dict[Choice, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.choosable = [i for i, cands in enumerate(self.cost.candidates) if len(cands) > 1]

    def score(self, x: Choice) -> float:
        got = self.scores.get(x)
        if got is None:
            got = self.scores[x] = self.cost.timeline(x)
        return got

    def rank(self, x: Choice) -> tuple[float, Choice]:
        """The order of choices: faster first, ties by the choice itself (so the result never
        depends on the order they were found in)."""
        return self.score(x), x

    def mutate(self, x: Choice) -> Choice:
        rng, candidates = self.rng, self.cost.candidates
        if not self.choosable:
            return x
        y = list(x)
        if rng.random() < 0.5:
            i = rng.choice(self.choosable)
            y[i] = rng.randrange(len(candidates[i]))
        else:  # a run of layers to the same candidate position (the same axis where the sets match)
            start = rng.randrange(len(self.choosable))
            run = self.choosable[start:start + rng.randint(2, 8)]
            c = rng.randrange(max(len(candidates[i]) for i in run))
            for i in run:
                y[i] = min(c, len(candidates[i]) - 1)
        return tuple(y)

    def cross(self, a: Choice, b: Choice) -> Choice:
        return tuple(a[i] if self.rng.random() < 0.5 else b[i] for i in range(len(a)))


def plan_ga(cost: NetworkCost, seeds: Sequence[Choice], generations: int = 60, population: int = 24,
            seed: int = 0) -> NetworkResult:
    """A genetic algorithm over whole choices minimising the timeline: the seeds and their
    mutations start it; each generation keeps the best quarter, and fills the rest with
    mutated children of two tournament winners (`Variation`)."""
    t0 = time.perf_counter()
    rng = random.Random(seed)
    vary = Variation(cost, rng)
    rank = vary.rank
    starts = list(dict.fromkeys(seeds))
    pool = starts[:]
    while len(pool) < population:
        pool.append(vary.mutate(rng.choice(starts)))
    for _ in range(generations):
        pool.sort(key=rank)
        elite = pool[: max(2, population // 4)]
        children: list[Choice] = []
        while len(elite) + len(children) < population:
            a, b = (min(rng.sample(pool, 3), key=rank) for _ in range(2))
            children.append(vary.mutate(vary.cross(a, b)))
        pool = elite + children
    best = min(pool, key=rank)
    return NetworkResult("ga", best, cost.synchronous(best), vary.score(best), len(vary.scores), False, time.perf_counter() - t0)


WHOLE_BINS = 5  # MAP-Elites' first descriptor: the share of the work computed on one node, in fifths
BOUNDARY_BINS = 8  # its second: how many layer inputs any node receives, by powers of two (0, 1, 2-3, ..., 64+)


def descriptor(cost: NetworkCost, x: Choice, work: Sequence[float]) -> tuple[int, int]:
    """Where choice x sits in MAP-Elites' archive: the share of the network's work (`work`, per
    layer) in layers computed by one node, and the number of layer inputs for which some node
    receives a message (each a segment boundary at run time), both binned."""
    alone = math.fsum(w for i, (w, c) in enumerate(zip(work, x)) if len(cost.candidates[i][c].active_nodes()) <= 1)
    share = alone / max(math.fsum(work), 1e-300)
    received = sum(1 for i, c in enumerate(x) for k, j in cost.edges[i] if any(cost.receives(i, k, j, x[j], c).messages))
    return min(int(share * WHOLE_BINS), WHOLE_BINS - 1), min(received.bit_length(), BOUNDARY_BINS - 1)


def plan_map_elites(cost: NetworkCost, seeds: Sequence[Choice], evaluations: int = 1500, seed: int = 0) -> NetworkResult:
    """MAP-Elites (Mouret and Clune) over whole choices minimising the timeline: an archive keeps
    the fastest choice found in each cell of two descriptors (`descriptor`: how much work runs
    on one node, how many boundaries the plan has), so that plans unlike the best so far, which a
    GA's population loses, survive as stepping stones. It starts with the seeds; each evaluation
    mutates an elite drawn at random (crossed with another one time in three) and keeps the child
    where its cell is empty or holds a slower choice. The result is the fastest elite."""
    t0 = time.perf_counter()
    rng = random.Random(seed)
    vary = Variation(cost, rng)
    work = [float(sum(cost.compute(i, 0))) for i in range(len(cost.candidates))]
    archive: dict[tuple[int, int], Choice] = {}

    def place(x: Choice) -> None:
        cell = descriptor(cost, x, work)
        held = archive.get(cell)
        if held is None or vary.rank(x) < vary.rank(held):
            archive[cell] = x

    for x in dict.fromkeys(seeds):
        place(x)
    for _ in range(evaluations):
        elites = sorted(archive.values())
        child = rng.choice(elites)
        if len(elites) > 1 and rng.random() < 1 / 3:
            child = vary.cross(child, rng.choice(elites))
        place(vary.mutate(child))
    best = min(archive.values(), key=vary.rank)
    return NetworkResult("map-elites", best, cost.synchronous(best), vary.score(best), len(vary.scores), False,
                         time.perf_counter() - t0)


def plan_network(cost: NetworkCost, planner: str, seed: int = 0) -> NetworkResult:
    """The named planner's choice (dp, heft, ga or map-elites; the last two are seeded with the
    current plan, dp's and heft's, and their figures include finding those)."""
    if planner == "dp":
        return plan_dp(cost)
    if planner == "heft":
        return plan_heft(cost)
    if planner in ("ga", "map-elites"):
        current = tuple(0 for _ in cost.candidates)
        dp, heft = plan_dp(cost), plan_heft(cost)
        seeds = [current, dp.choice, heft.choice]
        got = plan_ga(cost, seeds, seed=seed) if planner == "ga" else plan_map_elites(cost, seeds, seed=seed)
        return NetworkResult(planner, got.choice, got.synchronous, got.timeline, got.evaluated + dp.evaluated + heft.evaluated,
                             False, got.seconds + dp.seconds + heft.seconds)
    raise ValueError(f"unknown planner '{planner}' (known: {', '.join(PLANNERS[1:])})")
