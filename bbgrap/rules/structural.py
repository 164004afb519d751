"""Ops that move elements around: Concat, Transpose, Reshape (with Flatten, Squeeze and
Unsqueeze), Gemm, MatMul, Einsum, Softmax; the QOperator format's QLinearMatMul, and
com.microsoft's QGemm and QLinearConcat, cut as MatMul, Gemm and Concat (`base.QuantizedRule`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from bbgrap.ir import Graph, Interval, Layer, ShapeMap
from bbgrap.rules.base import (
    MS_DOMAIN,
    EightBit,
    Layout,
    Local,
    OpTraits,
    QuantizedRule,
    RegionRule,
    RuleRegistry,
    all_axes,
    broadcast_need,
    full,
    multiplies_unpacked,
    paired,
    quantized,
    shape,
)


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


@dataclass(frozen=True)
class _Group:
    """Consecutive input axes `ins` and output axes `outs` (sizes above 1) holding the same
    elements in the same row-major order: their sizes' products are equal."""

    ins: tuple[int, ...]
    outs: tuple[int, ...]


def _groups(in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> list[_Group]:
    """The finest grouping of a reshape's axes of size above 1 (axes of size 1 are in none)."""
    ins = [a for a, d in enumerate(in_shape) if d > 1]
    outs = [a for a, d in enumerate(out_shape) if d > 1]
    groups, i, j = [], 0, 0
    while i < len(ins) and j < len(outs):
        gi, go = [ins[i]], [outs[j]]
        pi, po = in_shape[ins[i]], out_shape[outs[j]]
        i, j = i + 1, j + 1
        while pi != po:
            if pi < po:
                gi.append(ins[i])
                pi *= in_shape[ins[i]]
                i += 1
            else:
                go.append(outs[j])
                po *= out_shape[outs[j]]
                j += 1
        groups.append(_Group(tuple(gi), tuple(go)))
    return groups


class ReshapeRule(RegionRule):
    """Reshape, Flatten, Squeeze and Unsqueeze keep the row-major order of the elements. Their
    axes fall into groups of input and output axes holding the same elements in order (NCHW →
    N, C, H·W: the group (H, W) ↔ (H·W); channel shuffle's C → (g, C/g): (C) ↔ (g, C/g)). The
    outermost output axis of a group can be cut: with S the product of the group's output axes
    inside it and T that of its input axes inside the outermost, an output interval [o0, o1)
    is the flat range [o0·S, o1·S), rounded out to multiples of L = lcm(S, T), which is a box
    on both sides: output [F0/S, F1/S) × the rest whole, input [F0/T, F1/T) × the rest whole.
    The node computes that (H·W cut off row boundaries computes whole rows of W; a cut of g
    reads its channels exactly; a classifier's Flatten after a channel-cut global pool stays
    cut, with no gather); the local op reshapes to the computed box's shape. A Squeeze
    that names no axes is not cut: it would squeeze a piece one element thick."""

    def axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        if layer.op_type == "Squeeze" and "axes" not in layer.attrs and not (len(layer.inputs) > 1 and layer.inputs[1]):
            return frozenset()
        groups = _groups(shape(graph, layer.inputs[0]), shape(graph, layer.outputs[0]))
        return frozenset(g.outs[0] for g in groups)

    def ops_per_element(self, layer: Layer, graph: Graph) -> float:
        """No operations: the output is the input's buffer under another shape (`OpTraits.view`)."""
        return 0.0

    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        in_shape, out_shape = shape(graph, layer.inputs[0]), shape(graph, layer.outputs[0])
        need, computes = full(graph, layer.inputs[0]), ShapeMap.full(out_shape)
        for g in _groups(in_shape, out_shape):
            inner_out = math.prod(out_shape[a] for a in g.outs[1:])
            inner_in = math.prod(in_shape[a] for a in g.ins[1:])
            unit = math.lcm(inner_out, inner_in)
            iv = out.interval(g.outs[0])
            lo, hi = iv.start * inner_out // unit * unit, -(-iv.stop * inner_out // unit) * unit
            computes = computes.with_axis(g.outs[0], Interval(lo // inner_out, hi // inner_out))
            need = need.with_axis(g.ins[0], Interval(lo // inner_in, hi // inner_in))
        needs = (need,) + tuple(full(graph, t) if t else None for t in layer.inputs[1:])
        if layer.op_type != "Reshape":
            return Local(needs, computes)  # Flatten, Squeeze, Unsqueeze: the same axes locally
        if graph.opsets.get("", 13) < 5:
            return Local(needs, computes, {"shape": list(computes.shape)})
        return Local((need, None), computes, inputs={1: np.array(computes.shape, np.int64)})


def single_column(layer: Layer, graph: Graph) -> bool:
    """A product of one output column (N = 1) by an unpacked B (`multiplies_unpacked`): onnxruntime
    sums each row of it along a path that depends on how many rows it multiplies at once, so no
    piece of its rows gives the whole product's bits, and it is not cut (`SINGLE_COLUMN`)."""
    return shape(graph, layer.outputs[0])[-1] == 1 and multiplies_unpacked(layer, graph, 1)


SINGLE_COLUMN = ("a product of one column by an operand onnxruntime does not pack sums each row along a path that depends on "
                 "how many rows it multiplies, so a piece is a last bit off the whole op, which the rounding after it would make a step")


class GemmRule(RegionRule):
    """Y = A'·B' + C: rows of Y read rows of A', columns read columns of B' (and C broadcast)."""

    def ops_per_element(self, layer: Layer, graph: Graph) -> float:
        """A multiply-add per element of the shared axis: 2·K."""
        a = shape(graph, layer.inputs[0])
        return 2.0 * (a[0] if int(layer.attrs.get("transA", 0)) else a[-1])

    def axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        """Rows and columns; none of a product of one column by an unpacked B (`multiplies_unpacked`)."""
        return frozenset() if single_column(layer, graph) else frozenset({0, 1})

    def uncut(self, layer: Layer, graph: Graph) -> str | None:
        return SINGLE_COLUMN if single_column(layer, graph) else None

    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        """A' rows and B' columns of the output's. A piece of a product by a B onnxruntime does not
        pack (`multiplies_unpacked`) computes a row beside a single one (`paired`), and its columns
        on whole groups of 4 under transB where the product has one row, else a column beside a
        single one; lowering crops them to its own (`Local.emits`)."""
        rows, cols = out.interval(0), out.interval(1)
        trans_a, trans_b = int(layer.attrs.get("transA", 0)), int(layer.attrs.get("transB", 0))
        emitted = out
        if multiplies_unpacked(layer, graph, 1):
            dims = shape(graph, layer.outputs[0])
            emitted = paired(out, [0], dims)
            emitted = emitted.with_axis(1, cols.aligned(4, dims[1])) if trans_b and dims[0] == 1 else paired(emitted, [1], dims)
            rows, cols = emitted.interval(0), emitted.interval(1)
        a = full(graph, layer.inputs[0]).with_axis(1 if trans_a else 0, rows)
        b = full(graph, layer.inputs[1]).with_axis(0 if trans_b else 1, cols)
        needs: list[ShapeMap | None] = [a, b]
        if len(layer.inputs) > 2 and layer.inputs[2]:
            needs.append(broadcast_need(emitted, shape(graph, layer.inputs[2])))
        return Local(tuple(needs), out, emits=None if emitted == out else emitted)


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
        """Every axis; none of a vector product, or of a product of one column by an unpacked B
        (`multiplies_unpacked`)."""
        if self._vector(layer, graph) or single_column(layer, graph):
            return frozenset()
        return all_axes(layer, graph)

    def uncut(self, layer: Layer, graph: Graph) -> str | None:
        if self._vector(layer, graph):
            return "a vector product (a 1-D operand) is computed whole"
        return SINGLE_COLUMN if single_column(layer, graph) else None

    @staticmethod
    def _vector(layer: Layer, graph: Graph) -> bool:
        """A vector product: an operand of one axis."""
        return min(len(shape(graph, t)) for t in layer.inputs[:2]) < 2

    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        """Y's batch entries, rows and columns of A and B. A piece of a product by a B onnxruntime does
        not pack (`multiplies_unpacked`) computes a row beside a single one (of M: A's rows, and its
        batch axes where B has none, which onnxruntime folds into them) and a column beside a single
        one (`paired`); lowering crops them to its own (`Local.emits`)."""
        if self._vector(layer, graph):
            return Local(tuple(full(graph, t) for t in layer.inputs), out)
        emitted = out
        if multiplies_unpacked(layer, graph, 1):
            dims = shape(graph, layer.outputs[0])
            folded = math.prod(shape(graph, layer.inputs[1])[:-2]) == 1
            m_axes = list(range(out.rank - 1)) if folded else [out.rank - 2]
            emitted = paired(paired(out, m_axes, dims), [out.rank - 1], dims)
        needs: list[ShapeMap | None] = []
        for operand, t in enumerate(layer.inputs[:2]):
            dims = shape(graph, t)
            rank = len(dims)
            need = full(graph, t)
            for k in range(rank - 2):  # batch axes, aligned right with the output's
                if dims[k] != 1:
                    need = need.with_axis(k, emitted.interval(emitted.rank - rank + k))
            # A keeps Y's rows (its axis -2), B Y's columns (its axis -1)
            need = need.with_axis(rank - 2, emitted.interval(emitted.rank - 2)) if operand == 0 else \
                need.with_axis(rank - 1, emitted.interval(emitted.rank - 1))
            needs.append(need)
        return Local(tuple(needs), out, emits=None if emitted == out else emitted)


class EinsumRule(RegionRule):
    """Einsum (a MatMul, attention's 'bhqd,bhkd->bhqk', a batched Linear): every output element
    sums products over the letters missing from the output, so an output interval along a letter
    reads the same interval of every input axis with that letter (all of it where the axis
    broadcasts, of size 1) and the summed letters whole: every output axis can be cut.
    An ellipsis stands for the same unnamed axes in every operand, aligned right."""

    def _letters(self, layer: Layer, graph: Graph) -> tuple[list[str], str]:
        """Each input's axes and the output's axes as letters (an ellipsis' axes as letters no
        equation uses: ONNX's are ASCII)."""
        equation = str(layer.attrs["equation"]).replace(" ", "")
        lhs, arrow, rhs = equation.partition("->")
        terms = lhs.split(",")
        ranks = [len(shape(graph, t)) for t in layer.inputs]
        spans = [rank - len(term.replace("...", "")) for term, rank in zip(terms, ranks)]
        width = max(spans, default=0)
        dots = "".join(chr(0x100 + k) for k in range(width))  # the ellipsis' axes, aligned right
        inputs = [term.replace("...", dots[width - n:]) for term, n in zip(terms, spans)]
        if not arrow:  # implicit output: the ellipsis, then the letters used once, sorted
            counts = "".join(terms).replace("...", "")
            rhs = "..." + "".join(sorted(c for c in set(counts) if counts.count(c) == 1))
        return inputs, rhs.replace("...", dots)

    def axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        return all_axes(layer, graph)

    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        inputs, output = self._letters(layer, graph)
        wanted = {letter: out.interval(k) for k, letter in enumerate(output)}
        needs: list[ShapeMap | None] = []
        for t, letters in zip(layer.inputs, inputs):
            need = full(graph, t)
            for a, letter in enumerate(letters):
                if letter in wanted and need.shape[a] != 1:  # an axis of size 1 broadcasts: read whole
                    need = need.with_axis(a, wanted[letter])
            needs.append(need)
        return Local(tuple(needs), out)

    def ops_per_element(self, layer: Layer, graph: Graph) -> float:
        """Multiply-adds (two operations) per product over the summed letters; one per summed
        element for a one-operand Einsum (a sum or a trace)."""
        inputs, output = self._letters(layer, graph)
        sizes: dict[str, int] = {}
        for t, letters in zip(layer.inputs, inputs):
            for letter, d in zip(letters, shape(graph, t)):
                sizes[letter] = max(d, sizes.get(letter, 1))
        summed = math.prod(d for letter, d in sizes.items() if letter not in output)
        return float(summed * (2 if len(inputs) > 1 else 1))


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


class QLinearConcatRule(QuantizedRule):
    """com.microsoft's QLinearConcat(Y_scale, Y_zero_point, X₀, scale₀, zero_point₀, X₁, ...), cut as
    Concat on its values: each X's scale and zero point go with it, dropped with it from a piece
    whose region does not touch it."""

    def __init__(self, base: RegionRule) -> None:
        super().__init__(base, "Concat", ())

    def operands(self, layer: Layer) -> tuple[tuple[int, ...], dict[int, tuple[int, int]]]:
        values = tuple(range(2, len(layer.inputs), 3))
        return values, {k + d: (j, 0) for j, k in enumerate(values) for d in (1, 2)}


class QGemmRule(QuantizedRule):
    """com.microsoft's QGemm(A, a_scale, a_zero_point, B, b_scale, b_zero_point, [C], [y_scale,
    y_zero_point]) (a quantized Linear, the QOperator format's Gemm), cut as Gemm on A, B and the
    int32 bias C: B's scale and zero point are per tensor or per column of Y, which is B's axis 0
    under transB, else its axis 1. Without y_scale the output is float, as the float Gemm's."""

    def __init__(self, base: RegionRule) -> None:
        super().__init__(base, "Gemm", (0, 3, 6))

    def operands(self, layer: Layer) -> tuple[tuple[int, ...], dict[int, tuple[int, int]]]:
        columns = 0 if int(layer.attrs.get("transB", 0)) else 1
        return self.values, {4: (1, columns), 5: (1, columns)}


class WholeRule(RegionRule):
    """Ops computed whole on one node: every input is read whole."""

    def axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        return frozenset()

    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        return Local(tuple(full(graph, t) if t else None for t in layer.inputs), out)


def register(registry: RuleRegistry) -> None:
    concat = ConcatRule()
    registry.register(["Concat"], concat, OpTraits(moves_data=True, layout=Layout.BLIND, eight_bit=EightBit(any_layout=True), transposes_pass=True))
    registry.register(["QLinearConcat"], QLinearConcatRule(concat), domain=MS_DOMAIN)  # it requantizes: it computes
    registry.register(["Transpose"], TransposeRule(), OpTraits(eight_bit=EightBit()))  # on the integers, as are Flatten, Reshape
    gemm = GemmRule()
    registry.register(["Gemm"], gemm)
    registry.register(["QGemm"], QGemmRule(gemm), domain=MS_DOMAIN)
    matmul = MatMulRule()
    registry.register(["MatMul"], matmul)
    # QLinearMatMul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point): MatMul's a and b, a's
    # scale and zero point per row (a's axis -2), b's per column (b's axis -1), or per tensor
    registry.register(["QLinearMatMul"], quantized(matmul, "MatMul", (0, 3), {1: (0, -2), 2: (0, -2), 4: (1, -1), 5: (1, -1)}))
    registry.register(["Einsum"], EinsumRule())
    softmax = SoftmaxRule()
    registry.register(["Softmax"], softmax, OpTraits(eight_bit=EightBit()))  # QLinearSoftmax
    registry.register(["LogSoftmax"], softmax)
    reshape, view = ReshapeRule(), OpTraits(moves_data=True, view=True)
    registry.register(["Reshape", "Flatten"], reshape, replace(view, eight_bit=EightBit()))
    registry.register(["Squeeze", "Unsqueeze"], reshape, view)
