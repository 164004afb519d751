"""Ops that move elements around: Concat, Transpose, Flatten, Gemm, MatMul, Softmax, and
the whole-tensor ones (Reshape, Squeeze, Unsqueeze) that are computed whole on one node."""

from __future__ import annotations

import math

from bbgrap.ir import Graph, Interval, Layer, ShapeMap
from bbgrap.rules.base import Local, OpTraits, RegionRule, RuleRegistry, all_axes, broadcast_need, full, shape


def _axis(layer: Layer, rank: int, default: int) -> int:
    axis = int(layer.attrs.get("axis", default))
    return axis + rank if axis < 0 else axis


class ConcatRule(RegionRule):
    """Concat maps the output region through each input's offset; inputs that the
    region does not touch are dropped from the local op."""

    def axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        return all_axes(layer, graph)

    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        axis = _axis(layer, out.rank, 0)
        want = out.interval(axis)
        needs: list[ShapeMap | None] = []
        offset = 0
        for t in layer.inputs:
            size = shape(graph, t)[axis]
            part = want.intersect(Interval(offset, offset + size))
            needs.append(None if part.empty else out.with_axis(axis, part.shift(-offset)))
            offset += size
        return Local(tuple(needs), out)


class TransposeRule(RegionRule):
    def axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        return all_axes(layer, graph)

    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        perm = layer.attrs.get("perm") or list(reversed(range(out.rank)))
        axes: list[Interval] = [Interval(0, 0)] * out.rank
        for k, p in enumerate(perm):
            axes[int(p)] = out.interval(k)
        return Local((ShapeMap(tuple((a,) for a in axes)),), out)


class FlattenRule(RegionRule):
    """Flatten with axis 1 keeps the batch axis and lays the rest out channel by channel: a cut
    of the flattened axis reads the channels it covers (a classifier's Flatten after a channel-cut
    global pool stays cut, with no gather). Other axes read the input whole."""

    def axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        rank = len(shape(graph, layer.inputs[0]))
        return frozenset({0, 1}) if _axis(layer, rank, 1) == 1 else frozenset()

    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        need = full(graph, layer.inputs[0])
        rank = need.rank
        if _axis(layer, rank, 1) != 1:
            return Local((need,), out)
        # output axis 0 is the input's batch axis; output axis 1 walks channel-major, `inner` per channel
        need = need.with_axis(0, out.interval(0))
        inner = max(1, math.prod(need.shape[2:]))  # 1 for an empty map: the flattened axis is empty too
        flat = out.interval(1)
        first, last = flat.start // inner, -(-flat.stop // inner)
        if rank > 1:
            need = need.with_axis(1, Interval(first, last))
        return Local((need,), out.with_axis(1, Interval(first * inner, last * inner)))


class GemmRule(RegionRule):
    """Y = A'·B' + C: rows of Y read rows of A', columns read columns of B' (and C broadcast)."""

    def ops_per_element(self, layer: Layer, graph: Graph) -> float:
        """A multiply-add per element of the shared axis: 2·K."""
        a = shape(graph, layer.inputs[0])
        return 2.0 * (a[0] if int(layer.attrs.get("transA", 0)) else a[-1])

    def axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        return frozenset({0, 1})

    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        rows, cols = out.interval(0), out.interval(1)
        trans_a, trans_b = int(layer.attrs.get("transA", 0)), int(layer.attrs.get("transB", 0))
        a = full(graph, layer.inputs[0]).with_axis(1 if trans_a else 0, rows)
        b = full(graph, layer.inputs[1]).with_axis(0 if trans_b else 1, cols)
        needs: list[ShapeMap | None] = [a, b]
        if len(layer.inputs) > 2 and layer.inputs[2]:
            needs.append(broadcast_need(out, shape(graph, layer.inputs[2])))
        return Local(tuple(needs), out)


class MatMulRule(RegionRule):
    """Y = A·B over the last two axes, batched over the leading ones with numpy broadcasting
    (a Linear on tokens or pixels, attention's Q·Kᵀ and P·V): Y's rows read the same rows of A,
    its columns the same columns of B (a channel cut keeps only those weight columns), its batch
    entries the matching entries of A and B (all of an axis that broadcasts, of size 1); the
    shared axis K is read whole. 1-D operands (a vector product) are computed whole."""

    def ops_per_element(self, layer: Layer, graph: Graph) -> float:
        """A multiply-add per element of the shared axis: 2·K."""
        return 2.0 * shape(graph, layer.inputs[0])[-1]

    def axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        if min(len(shape(graph, t)) for t in layer.inputs[:2]) < 2:
            return frozenset()
        return all_axes(layer, graph)

    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        if min(len(shape(graph, t)) for t in layer.inputs[:2]) < 2:
            return Local(tuple(full(graph, t) for t in layer.inputs), out)
        needs: list[ShapeMap | None] = []
        for operand, t in enumerate(layer.inputs[:2]):
            dims = shape(graph, t)
            rank = len(dims)
            need = full(graph, t)
            for k in range(rank - 2):  # batch axes, aligned right with the output's
                if dims[k] != 1:
                    need = need.with_axis(k, out.interval(out.rank - rank + k))
            # A keeps Y's rows (its axis -2), B Y's columns (its axis -1)
            need = need.with_axis(rank - 2, out.interval(out.rank - 2)) if operand == 0 else \
                need.with_axis(rank - 1, out.interval(out.rank - 1))
            needs.append(need)
        return Local(tuple(needs), out)


class SoftmaxRule(RegionRule):
    """Softmax normalises over its axis (from opset 13) or over all axes from `axis`
    on (before 13): those axes are read whole, the others pass through."""

    def _reduced(self, layer: Layer, graph: Graph, rank: int) -> range:
        legacy = graph.opsets.get("", 13) < 13
        axis = _axis(layer, rank, 1 if legacy else -1)
        return range(axis, rank) if legacy else range(axis, axis + 1)

    def axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        rank = len(shape(graph, layer.outputs[0]))
        return all_axes(layer, graph) - frozenset(self._reduced(layer, graph, rank))

    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        need = out
        for a in self._reduced(layer, graph, out.rank):
            need = need.with_axis(a, Interval(0, shape(graph, layer.inputs[0])[a]))
        return Local((need,), out)


class WholeRule(RegionRule):
    """Ops computed whole on one node: every input is read whole."""

    def axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        return frozenset()

    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        return Local(tuple(full(graph, t) if t else None for t in layer.inputs), out)


def register(registry: RuleRegistry) -> None:
    moves = OpTraits(moves_data=True)
    registry.register(["Concat"], ConcatRule(), moves)
    registry.register(["Transpose"], TransposeRule())
    registry.register(["Flatten"], FlattenRule(), moves)
    registry.register(["Gemm"], GemmRule())
    registry.register(["MatMul"], MatMulRule())
    registry.register(["Softmax", "LogSoftmax"], SoftmaxRule())
    registry.register(["Reshape", "Squeeze", "Unsqueeze"], WholeRule(), moves)
