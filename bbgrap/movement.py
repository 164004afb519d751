"""Data movement: how every node assembles the regions of a tensor it reads.

A tensor is held in pieces — what each node computed of it (graph inputs are held
whole by every node). Each node *owns* its output region of the layer (the owned
regions tile the tensor) and *holds* what its local op computed, which can be more:
whole groups of a group conv, or a neighbour's halo it recomputed rather than
receive. A node that reads the tensor assembles one box of it (a *gather*): the
concatenation of what it holds of the box and the rest received from the nodes
that own it, cropped afterwards for each consumer. The
naive plan (thesis fig. 3.6a) gathers the whole tensor on every reading node; the
optimized plan gathers just the hull of what the node's consumers read (fig.
3.6b–e), which is no transfer and no concat at all when the node holds exactly that.
"""

from __future__ import annotations

from bbgrap.ir import Gather, Graph, Movement, Part, ShapeMap

OUTPUT_NODE = 0  # the node that collects the model's outputs


def pieces(graph: Graph, tensor: str, owned: bool = False) -> list[tuple[int, ShapeMap]] | None:
    """(node, region) each node holds of `tensor` (with `owned`: owns, disjoint);
    None for a graph input (held whole everywhere)."""
    if tensor in graph.inputs:
        return None
    layer = graph.producers()[tensor]
    part = graph.partitions[layer.name]
    idx = list(layer.outputs).index(tensor)
    if idx > 0:  # extra outputs exist only for layers computed whole
        (node,) = part.active_nodes()
        return [(node, ShapeMap.full(graph.tensors[tensor].shape))]
    regions = part.out if owned else part.computes
    return [(n, regions[n]) for n in part.active_nodes()]


def needs_by_node(graph: Graph) -> dict[tuple[str, int], list[ShapeMap]]:
    """Every region of an activation that some consumer (or the output) reads, per node."""
    out: dict[tuple[str, int], list[ShapeMap]] = {}
    for layer in graph.layers:
        part = graph.partitions[layer.name]
        for n in part.active_nodes():
            for t, need in zip(layer.inputs, part.needs[n]):
                if need is not None and graph.is_activation(t):
                    out.setdefault((t, n), []).append(need)
    for t in graph.outputs:
        out.setdefault((t, OUTPUT_NODE), []).append(ShapeMap.full(graph.tensors[t].shape))
    return out


def hull_of(regions: list[ShapeMap]) -> ShapeMap:
    hull = regions[0]
    for r in regions[1:]:
        hull = hull.hull(r)
    return hull


def derive_gathers(graph: Graph, mode: Movement) -> dict[tuple[str, int], Gather]:
    """Every (tensor, node) gather the graph's reads need, for `mode`'s movement."""
    gathers: dict[tuple[str, int], Gather] = {}
    # per tensor, what the nodes hold and own and its cut axis: the same for every node reading it
    sources: dict[str, tuple[dict[int, ShapeMap], list[tuple[int, ShapeMap]], int] | None] = {}
    for (t, n), needs in needs_by_node(graph).items():
        if mode is Movement.NAIVE:
            region = ShapeMap.full(graph.tensors[t].shape)
        else:
            region = hull_of(needs)
        if t not in sources:
            held = pieces(graph, t)
            sources[t] = None if held is None else (
                dict(held), pieces(graph, t, owned=True) or [], graph.partitions[graph.producers()[t].name].axis or 0)
        source = sources[t]
        if source is None:
            gathers[(t, n)] = Gather(t, n, region, (Part(region, n),), 0)
            continue
        held_by, owned, axis = source
        gathers[(t, n)] = Gather(t, n, region, tuple(assemble(region, n, held_by, owned, axis)), axis)
    return gathers


def assemble(region: ShapeMap, node: int, held: dict[int, ShapeMap], owned: list[tuple[int, ShapeMap]], axis: int) -> list[Part]:
    """The parts of `region` on `node`: all it holds itself, the rest from the nodes that own it,
    in order along the cut axis."""
    mine = held.get(node)
    if mine is not None and mine.contains(region):  # the common case: the node holds all it reads
        return [Part(region, node)]
    parts, rest = [], [region]
    if mine is not None and region.overlaps(mine):
        parts.append(Part(region.intersect(mine), node))
        rest = region.difference(mine)
    for box in rest:
        parts += [Part(box.intersect(r), p) for p, r in owned if p != node and box.overlaps(r)]
    parts.sort(key=lambda part: part.region.starts[axis] if part.region.rank > axis else 0)  # a scalar has no axis
    return parts
