"""naive-partition: cut every layer's output along its direction (thesis §3.3).

Even split (eq. 3.1, the remainder dealt to the two end nodes first: `spare_order`),
or proportional to the node speeds; per-layer custom partitions from the config
override both. Each node's needed input regions come from the op's region rule
(eq. 3.2–3.6). A layer that cannot be cut in the requested direction is cut along
channels if its rule allows, else computed whole on the fastest node (`fastest_node`: node 0
where speeds are equal); a layer narrower than the node count is split over fewer nodes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

from bbgrap.config import CustomPartition, Direction
from bbgrap.ir import BBGrapError, Graph, Interval, Layer, LayerPartition, ShapeMap
from bbgrap.pass_manager import Pass, PassError, PassResult
from bbgrap.rules.base import NCHWC_BLOCK
from bbgrap.rules.registry import RuleRegistry, default_registry

WHOLE_NODE = 0  # where layers that cannot be cut are computed where the nodes are equally fast
CHANNELS = 1  # the channel axis of an NCHW tensor


def spare_order(n: int) -> list[int]:
    """The order in which an even split's spare rows go to `n` nodes: the first node, the last,
    then the rest from the second on.

    The two end nodes of a cut have one neighbour, every other node two, so an interior node
    receives (or, after recompute-halos, computes) twice the halo rows of an end node. Eq. 3.1
    deals the remainder round-robin from the first node, which puts the spare rows on interior
    nodes too and leaves the last node the lightest of all on every map whose rows do not divide
    (7 rows on 4 nodes: 2, 2, 2, 1, its halos on top); dealt to the ends first they even out
    own rows plus halo rows (2, 2, 1, 2). On two nodes, both ends, nothing changes."""
    return [0, n - 1, *range(1, n - 1)] if n > 1 else [0]


def fastest_node(speeds: Sequence[float]) -> int:
    """Where a layer computed whole runs: the first of the fastest nodes (WHOLE_NODE where every
    node is as fast). Every other node waits for such a layer, so it runs where it ends soonest."""
    return max(range(len(speeds)), key=lambda n: (speeds[n], -n)) if speeds else WHOLE_NODE


def split_sizes(extent: int, speeds: Sequence[float], grain: int = 1) -> list[int]:
    """Sizes per node summing to `extent`: even for equal speeds (eq. 3.1), the remainder dealt
    in `spare_order` where every node gets a row and to the first nodes where some get none
    (those then form one contiguous run from node 0); else proportional to speed with the
    largest remainders rounded up, in whole grains of `grain` where the extent is made of them
    and every node still gets one (channels in whole blocks of the blocked layout, which runs a
    piece of them as if padded to whole blocks: `channel_grain`)."""
    n = len(speeds)
    if grain > 1 and len(set(speeds)) > 1 and extent % grain == 0:
        grains = split_sizes(extent // grain, speeds)
        if all(grains):
            return [g * grain for g in grains]
    if len(set(speeds)) == 1:
        base, rem = divmod(extent, n)
        spares = set(spare_order(n)[:rem]) if base > 0 else set(range(rem))
        return [base + (1 if i in spares else 0) for i in range(n)]
    total = sum(speeds)
    exact = [extent * s / total for s in speeds]
    sizes = [int(e) for e in exact]
    order = sorted(range(n), key=lambda i: (-(exact[i] - sizes[i]), i))
    for i in order[: extent - sum(sizes)]:
        sizes[i] += 1
    return sizes


def axis_sizes(shape: Sequence[int], axis: int, speeds: Sequence[float]) -> list[int]:
    """The speed-proportional (or even) sizes per node of a cut of `axis` of an output of `shape`,
    in the grain that axis takes (`split_sizes`, `channel_grain`)."""
    return split_sizes(shape[axis], speeds, channel_grain(shape, axis))


def channel_grain(shape: Sequence[int], axis: int | None) -> int:
    """The grain a cut of `axis` of an activation of `shape` takes (`split_sizes`): the blocked
    layout's block along the channels of an NCHW tensor, else 1. Every op's, not only a
    convolution's (`OpTraits.channel_block`, which prices a piece): the layers of a chain are cut
    alike, so the activations and additions between two convolutions move nothing."""
    return NCHWC_BLOCK if axis == CHANNELS and len(shape) == 4 else 1


def regions_from_sizes(shape: Sequence[int], axis: int, sizes: Sequence[int]) -> list[ShapeMap]:
    full = ShapeMap.full(shape)
    out, start = [], 0
    for s in sizes:
        out.append(full.with_axis(axis, Interval(start, start + s)))
        start += s
    return out


def on_grain(sizes: Sequence[int], grain: int) -> list[int]:
    """`sizes` with each cut between two of them moved to the nearest multiple of `grain` (the
    rule's `RegionRule.grain`; their sum kept): a piece may become empty."""
    if grain <= 1:
        return list(sizes)
    cuts = list(itertools.accumulate(sizes))
    moved = [min(cuts[-1], grain * round(c / grain)) for c in cuts[:-1]] + cuts[-1:]
    return [b - a for a, b in zip([0, *moved], moved)]


def partition_layer(graph: Graph, layer: Layer, axis: int | None, sizes: Sequence[int] | None, registry: RuleRegistry,
                    whole: int = WHOLE_NODE) -> LayerPartition:
    """The layer cut into `sizes` along `axis` (each cut on the rule's grain: `on_grain`), or
    whole on node `whole` when axis is None."""
    shape = graph.tensors[layer.outputs[0]].shape
    n_inputs = len(layer.inputs)
    if axis is None or sizes is None:
        outs = [ShapeMap.empty_like(len(shape))] * graph.nodes
        outs[whole] = ShapeMap.full(shape)
    else:
        outs = regions_from_sizes(shape, axis, on_grain(sizes, registry.grain(layer, graph, axis)))
    rule = registry.get(layer)
    needs: list[tuple[ShapeMap | None, ...]] = []
    computes: list[ShapeMap] = []
    attrs: list[Mapping[str, Any]] = []
    inputs: list[Mapping[int, np.ndarray]] = []
    emits: list[ShapeMap | None] = []
    for out in outs:
        if out.empty:
            needs.append((None,) * n_inputs)
            computes.append(out)
            attrs.append({})
            inputs.append({})
            emits.append(None)
        elif rule is None or axis is None:
            needs.append(tuple(ShapeMap.full(graph.tensors[t].shape) if t else None for t in layer.inputs))
            computes.append(out)
            attrs.append({})
            inputs.append({})
            emits.append(None)
        else:
            local = rule.local(layer, graph, out)
            if any(need is not None and need.empty for need in local.needs):
                # the node's rows read nothing of an input (windows wholly inside a huge
                # padding): a local op cannot read an empty region, so the layer is computed whole
                return partition_layer(graph, layer, None, None, registry, whole)
            needs.append(local.needs)
            computes.append(local.computes)
            attrs.append(dict(local.attrs))
            inputs.append(dict(local.inputs))
            emits.append(local.emits)
    return LayerPartition(axis if sizes is not None else None, tuple(outs), tuple(needs), tuple(computes), tuple(attrs),
                          tuple(inputs), LayerPartition.compact_emits(emits))


def channel_cut(graph: Graph, layer: Layer, speeds: Sequence[float], registry: RuleRegistry) -> LayerPartition | None:
    """The layer cut along its output channels in proportion to `speeds`, where its rule allows
    that and every node gets a channel; else None."""
    rule = registry.get(layer)
    shape = graph.tensors[layer.outputs[0]].shape
    if rule is None or len(shape) < 2 or CHANNELS not in rule.axes(layer, graph) or shape[CHANNELS] < graph.nodes:
        return None
    return partition_layer(graph, layer, CHANNELS, axis_sizes(shape, CHANNELS, speeds), registry)


def replicated(graph: Graph, layer: Layer, speeds: Sequence[float], registry: RuleRegistry) -> LayerPartition | None:
    """The layer computed whole on every node: each node's local op is the whole layer, while the
    regions the nodes own are still its speed-proportional cut along the first axis its rule cuts
    for every node (so they tile the output, and every node holds all of it). Between a gather
    and a broadcast — a squeeze-excite block's pool and its 1x1 convolutions, which every node's
    rows are then scaled by — this is one exchange of the pool's input among the nodes instead of
    one node gathering it and sending the result back: a round trip less on every node's path.
    None where the rule cuts no axis long enough for every node."""
    axes = shared_axes(graph, layer, registry)
    rule = registry.get(layer)
    if not axes or rule is None:
        return None
    shape = graph.tensors[layer.outputs[0]].shape
    whole = rule.local(layer, graph, ShapeMap.full(shape))
    n = graph.nodes
    return LayerPartition(axes[0], tuple(regions_from_sizes(shape, axes[0], axis_sizes(shape, axes[0], speeds))),
                          (whole.needs,) * n, (whole.computes,) * n, (dict(whole.attrs),) * n, (dict(whole.inputs),) * n,
                          LayerPartition.compact_emits([whole.emits] * n))


def shared_axes(graph: Graph, layer: Layer, registry: RuleRegistry) -> list[int]:
    """The output axes the layer's rule cuts that are long enough for every node, in order."""
    rule = registry.get(layer)
    if rule is None:
        return []
    shape = graph.tensors[layer.outputs[0]].shape
    return sorted(a for a in rule.axes(layer, graph) if a < len(shape) and shape[a] >= graph.nodes)


def aligned_axis(graph: Graph, layer: Layer, partitions: Mapping[str, LayerPartition], speeds: Sequence[float],
                 registry: RuleRegistry, skip: int | None) -> int | None:
    """An output axis other than `skip`, long enough for every node, along which the layer's
    even (or speed-proportional) cut reads on every node only what that node computed of each
    input whose producer is cut (a channel shuffle's Transpose after the Reshape cut by rows:
    rows again, not the group axis of 2): the cut that moves nothing. None where there is none."""
    rule = registry.get(layer)
    producers = graph.producers()
    cut = [(k, partitions[producers[t].name]) for k, t in enumerate(layer.inputs)
           if t in producers and producers[t].name in partitions and partitions[producers[t].name].axis is not None]
    if rule is None or not cut:
        return None
    for axis in shared_axes(graph, layer, registry):
        if axis == skip:
            continue
        shape = graph.tensors[layer.outputs[0]].shape
        part = partition_layer(graph, layer, axis, axis_sizes(shape, axis, speeds), registry)
        if part.axis is not None and all(
                need is not None and not need.empty and source.out[n].contains(need)
                for k, source in cut for n, need in enumerate(needs[k] for needs in part.needs)):
            return axis
    return None


def choose_axis(graph: Graph, layer: Layer, direction: Direction, registry: RuleRegistry,
                partitions: Mapping[str, LayerPartition] | None = None, speeds: Sequence[float] = ()) -> int | None:
    """The requested direction's axis if the layer can be cut there into a piece for every node;
    else, given its producers' `partitions`, an axis along which it reads only what each node
    computed (`aligned_axis`); else the requested direction's axis if longer than 1 (some nodes
    then get nothing), else channels, else the longest other axis its rule cuts (a token
    tensor's sequence, attention's heads, a channel shuffle's rows), preferring those long
    enough for every node; else None: a layer computed whole keeps every other node waiting
    for it."""
    rule = registry.get(layer)
    if rule is None:
        return None
    allowed = rule.axes(layer, graph)
    shape = graph.tensors[layer.outputs[0]].shape
    wanted = direction.axis(len(shape))
    usable = wanted is not None and wanted in allowed and shape[wanted] > 1
    if usable and wanted is not None and shape[wanted] >= graph.nodes:
        return wanted
    if partitions is not None:
        aligned = aligned_axis(graph, layer, partitions, speeds or (1.0,) * graph.nodes, registry, wanted)
        if aligned is not None:
            return aligned
    if usable:
        return wanted
    channels = Direction.C.axis(len(shape))
    others = sorted((a for a in allowed if a < len(shape) and a != channels), key=lambda a: (-shape[a], a))
    order = ([channels] if channels is not None and channels in allowed else []) + others
    for shortest in (max(2, graph.nodes), 2):
        for axis in order:
            if shape[axis] >= shortest:
                return axis
    return None


@dataclass(frozen=True)
class NaivePartition(Pass):
    name: ClassVar[str] = "naive-partition"
    nodes: int
    direction: Direction = Direction.H
    speeds: tuple[float, ...] = ()
    custom: tuple[CustomPartition, ...] = ()
    registry: RuleRegistry = field(default_factory=default_registry, compare=False)

    def requires(self, graph: Graph) -> None:
        if graph.partitions:
            raise PassError("graph is already partitioned")
        names = {layer.name for layer in graph.layers}
        for c in self.custom:
            if c.layer not in names:
                raise BBGrapError(f"custom partition names layer '{c.layer}', which the model does not have")

    def call(self, graph: Graph) -> PassResult:
        graph = graph.replace(nodes=self.nodes)
        speeds = self.speeds or (1.0,) * self.nodes
        whole = fastest_node(speeds)  # where a layer that is not cut runs
        custom = {c.layer: c for c in self.custom}
        partitions: dict[str, LayerPartition] = {}
        for layer in graph.layers:
            c = custom.get(layer.name)
            axis = choose_axis(graph, layer, c.direction if c else self.direction, self.registry,
                               None if c else partitions, speeds)
            shape = graph.tensors[layer.outputs[0]].shape
            sizes = None
            if c is not None and (axis is None or c.direction.axis(len(shape)) != axis):
                # the config asked for this cut of this layer: another one, or none, is not what it asked
                rule = self.registry.get(layer)
                cuts = sorted(rule.axes(layer, graph)) if rule is not None else []
                raise BBGrapError(
                    f"custom partition of '{layer.name}' (output {list(shape)}) along '{c.direction.value}': the layer cannot be "
                    f"cut there ({'its rule cuts output axes ' + ', '.join(map(str, cuts)) if cuts else 'it cannot be cut at all'}); "
                    "choose another direction for it or drop its [[custom]] table")
            if c is not None and c.sizes is not None:
                assert axis is not None
                if sum(c.sizes) != shape[axis]:
                    raise BBGrapError(
                        f"custom partition of '{layer.name}' (output {list(shape)}): sizes {list(c.sizes)} must sum to the "
                        f"extent along '{c.direction.value}' ({shape[axis]})"
                    )
                grain = self.registry.grain(layer, graph, axis)
                if (moved := on_grain(c.sizes, grain)) != list(c.sizes):
                    at = ", ".join(map(str, list(itertools.accumulate(c.sizes))[:-1]))
                    raise BBGrapError(
                        f"custom partition of '{layer.name}' (output {list(shape)}): sizes {list(c.sizes)} cut it at {at} "
                        f"along '{c.direction.value}', inside the blocks of {grain} that onnxruntime computes together (a cut "
                        f"there is not exact); use sizes {moved}")
                sizes = list(c.sizes)
            elif axis is not None:
                sizes = axis_sizes(shape, axis, speeds)
            partitions[layer.name] = partition_layer(graph, layer, axis, sizes, self.registry, whole)
        return PassResult(graph.replace(partitions=partitions), True)
