"""The IR's invariants (DESIGN.md), checked by the pass manager after every pass.

* the layer graph is acyclic;
* the output regions of all nodes of a layer are disjoint and cover the output, and each
  node's local op computes (and emits) at least the region it owns (emitted regions, where
  given, one per node);
* every region a node reads is present there: inside a gather of that node, whose
  parts tile it and come from what their source node computed;
* no transfer sends data that its receiver never reads.
"""

from __future__ import annotations

import networkx as nx

from bbgrap.ir import Graph, Movement, ShapeMap
from bbgrap.movement import hull_of, needs_by_node, pieces


def check_invariants(graph: Graph) -> list[str]:
    """Human-readable violations; empty when the IR is sound."""
    problems: list[str] = []
    if not nx.is_directed_acyclic_graph(graph.digraph()):
        problems.append("the layer graph has a cycle")
    for layer in graph.layers:
        part = graph.partitions.get(layer.name)
        if part is None:
            if graph.partitions:
                problems.append(f"layer '{layer.name}' has no partition")
            continue
        full = ShapeMap.full(graph.tensors[layer.outputs[0]].shape)
        regions = [part.out[n] for n in part.active_nodes()]
        if sum(r.volume for r in regions) != full.volume or not all(full.contains(r) for r in regions):
            problems.append(f"layer '{layer.name}': node outputs {[str(r) for r in part.out]} do not tile {full}")
        for i, a in enumerate(regions):
            for b in regions[i + 1 :]:
                if a.overlaps(b):
                    problems.append(f"layer '{layer.name}': node outputs {a} and {b} overlap")
        if part.emits and len(part.emits) != len(part.out):
            problems.append(f"layer '{layer.name}': {len(part.emits)} emitted regions for {len(part.out)} nodes")
            continue
        for n in part.active_nodes():
            if not (part.computes[n].contains(part.out[n]) and part.emitted(n).contains(part.computes[n])):
                problems.append(f"layer '{layer.name}': node {n} owns {part.out[n]}, computes {part.computes[n]} "
                                f"and emits {part.emitted(n)}: each must contain the one before")
    if graph.gathers:
        problems += _check_gathers(graph)
    return problems


def _check_gathers(graph: Graph) -> list[str]:
    problems: list[str] = []
    needs = needs_by_node(graph)
    for (t, n), regions in needs.items():
        gather = graph.gathers.get((t, n))
        if gather is None:
            problems.append(f"node {n} reads {t} but never gathers it")
            continue
        for r in regions:
            if not gather.region.contains(r):
                problems.append(f"node {n} reads {t}{r} but gathers only {gather.region}")
    held_of: dict[str, dict[int, ShapeMap]] = {}  # what each node holds, per tensor: the same for every gather of it
    for (t, n), gather in graph.gathers.items():
        if (t, n) not in needs:
            problems.append(f"node {n} gathers {t} but nothing there reads it")
            continue
        if sum(p.region.volume for p in gather.parts) != gather.region.volume:
            problems.append(f"gather of {t} on node {n}: parts do not tile {gather.region}")
        if t not in held_of:
            held_of[t] = dict(pieces(graph, t) or [])
        held = held_of[t]
        for p in gather.parts:
            source = held.get(p.src) if held else ShapeMap.full(graph.tensors[t].shape)
            if source is None or not source.contains(p.region) or not gather.region.contains(p.region):
                problems.append(f"gather of {t} on node {n}: part {p.region} is not held by node {p.src}")
        if graph.movement is Movement.OPTIMIZED:
            hull = hull_of(needs[(t, n)])
            for tr in gather.transfers:
                if not hull.contains(tr.region):
                    problems.append(f"transfer of {t}{tr.region} {tr.src}→{n} sends data node {n} never reads")
    return problems

