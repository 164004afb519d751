"""The cost model: operations of a layer's local op, and the plan's traffic.

Operations count multiply-adds as two: a convolution output element costs
2·(C_in/group)·∏kernel, a Gemm/MatMul element 2·K, a window pool element ∏kernel, a
reduction element the elements it reduces, anything else one per output element. The search's objective (thesis eq. 3.7–3.12)
and `bbgrap inspect` both use these numbers.
"""

from __future__ import annotations

import math

from bbgrap.ir import Graph, Layer, ShapeMap
from bbgrap.rules.reduce import REDUCE_OPS, reduced_elements


def ops_per_element(layer: Layer, graph: Graph) -> float:
    op = layer.op_type
    if op == "Conv":
        w = graph.tensors[layer.inputs[1]].shape
        return 2.0 * w[1] * math.prod(w[2:])
    if op in ("Gemm", "MatMul"):
        a = graph.tensors[layer.inputs[0]].shape
        k = a[0] if op == "Gemm" and int(layer.attrs.get("transA", 0)) else a[-1]
        return 2.0 * k
    if op in ("MaxPool", "AveragePool", "LpPool"):
        return float(math.prod(layer.attrs.get("kernel_shape", [1])))
    if op in ("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"):
        return float(math.prod(graph.tensors[layer.inputs[0]].shape[2:]))
    if op == "LRN":
        return float(layer.attrs.get("size", 1))
    if op in REDUCE_OPS:
        return float(reduced_elements(layer, graph))
    return 1.0


def layer_ops(layer: Layer, graph: Graph, region: ShapeMap) -> float:
    """Operations to compute `region` of the layer's output."""
    return ops_per_element(layer, graph) * region.volume


def plan_flops(graph: Graph, owned: bool = False) -> list[float]:
    """Operations each node performs per inference (with `owned`: only for the outputs it owns,
    leaving out what it computes beyond them, such as recomputed halos)."""
    flops = [0.0] * graph.nodes
    for layer in graph.layers:
        part = graph.partitions[layer.name]
        for n in part.active_nodes():
            flops[n] += layer_ops(layer, graph, part.out[n] if owned else part.computes[n])
    return flops
