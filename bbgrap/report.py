"""Where the work is: one row per layer of a partitioned graph, for `bbgrap inspect --layers`.

For every layer: how it is cut (the axis, each node's range along it), the operations each
node performs for it (and those beyond its own outputs: recomputed halos, whole groups),
the bytes of its output that cross nodes, and — for a layer computed whole on one node —
which node and why (no region rule, or no axis its rule can cut along the requested
direction or channels).
"""

from __future__ import annotations

import numpy as np

from bbgrap.config import Direction
from bbgrap.cost import layer_ops
from bbgrap.ir import Graph, Layer
from bbgrap.passes.naive_partition import shared_axes
from bbgrap.plan_schema import LayerNodeRow, LayerRow, WholeLayer
from bbgrap.rules.base import is_default_domain
from bbgrap.rules.registry import RuleRegistry, default_registry

AXIS_NAMES_4D = ("n", "c", "h", "w")


def axis_name(axis: int | None, rank: int) -> str:
    """n/c/h/w for a 4-D tensor's axes, else `axis K`; `whole` for a layer that is not cut."""
    if axis is None:
        return "whole"
    return AXIS_NAMES_4D[axis] if rank == 4 else f"axis {axis}"


def whole_reason(graph: Graph, layer: Layer, registry: RuleRegistry) -> str:
    """Why a layer is computed whole on one node (see naive_partition.choose_axis)."""
    if layer.shape_from_values:
        return "its shapes depend on the input's values (held at the sample input's)"
    rule = registry.get(layer)
    if rule is None:
        if not is_default_domain(layer.domain):
            return f"no region rule: op of the custom domain '{layer.domain}'"
        return f"no region rule for {layer.op_type}"
    shape = graph.tensors[layer.outputs[0]].shape
    allowed = rule.axes(layer, graph)
    if not allowed:
        return rule.uncut(layer, graph) or f"its rule cannot cut this {layer.op_type} along any axis"
    names = ", ".join(axis_name(a, len(shape)) for a in sorted(allowed))
    return f"its output ({'x'.join(map(str, shape))}) is too short to share along every axis its rule cuts ({names})"


def layer_table(graph: Graph, direction: Direction, registry: RuleRegistry | None = None) -> tuple[LayerRow, ...]:
    """One row per layer, in the graph's order (see the module docstring)."""
    registry = registry or default_registry()
    crossing: dict[str, int] = {}  # bytes of each tensor that go from one node to another
    for t in graph.transfers():
        crossing[t.tensor] = crossing.get(t.tensor, 0) + t.region.volume * np.dtype(graph.tensors[t.tensor].dtype).itemsize
    rows = []
    for layer in graph.layers:
        part = graph.partitions[layer.name]
        rank = len(graph.tensors[layer.outputs[0]].shape)
        nodes = []
        for n in range(graph.nodes):
            out, computes = part.out[n], part.computes[n]
            extent = computed = None
            if part.axis is not None and not out.empty:
                iv, cv = out.interval(part.axis), computes.bounding_box().interval(part.axis)
                extent, computed = (iv.start, iv.stop), (cv.start, cv.stop)
            flops = layer_ops(layer, graph, part.emitted(n), registry)  # an empty region has no volume: 0
            nodes.append(LayerNodeRow(
                range=extent,  # the part it owns (what other nodes receive from)
                computes=computed,  # owned, plus recomputed halo rows or whole groups (not rows emitted and cropped)
                flops=flops,
                redundant_flops=flops - layer_ops(layer, graph, out, registry),
            ))
        whole = None
        active = part.active_nodes()
        placed = part.axis is not None and len(active) == 1 and graph.nodes > 1  # cut, all of it to one node
        if part.axis is None or placed:
            reason = whole_reason(graph, layer, registry) if graph.nodes > 1 else "one node"
            if graph.planner_stats is not None and (placed or shared_axes(graph, layer, registry)):
                reason = f"the {graph.planner_stats.planner} planner placed it there: predicted faster than cutting it"
            whole = WholeLayer(node=active[0] if active else 0, reason=reason, no_rule=registry.get(layer) is None)
        axis = None if placed else part.axis
        rows.append(LayerRow(
            name=layer.name, op_type=layer.op_type, cut=axis_name(axis, rank),
            output_shape=tuple(graph.tensors[layer.outputs[0]].shape),
            extent=graph.tensors[layer.outputs[0]].shape[axis] if axis is not None else None,
            flops=sum(n.flops for n in nodes), bytes_sent=sum(crossing.get(t, 0) for t in layer.outputs if t),
            per_node=tuple(nodes), whole=whole,
        ))
    return tuple(rows)
