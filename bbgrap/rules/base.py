"""What every op family's module builds on: a rule's interface, the op traits the
runtime cares about, and the region helpers the families share.

Everything BBGraP knows of an op lives in its family's module (`conv.py`, `pool.py`,
`elementwise.py`, `structural.py`, `reduce.py`): the region rule (output region → input
regions), the operations per output element the cost model counts, whether it passes a
region through unchanged (the search lets it follow its producer's cut), whether it has a
kernel window (explicit pads in the frontend, window slack in lowering), and, given when
the family registers it, what the runtime does with it (`OpTraits`). The registry
(`RuleRegistry`, here) is filled by `registry.default_registry`, which imports the families;
the families import only this module. `QuantizedRule` (here) is how a family cuts a QOperator op
(QLinearConv, com.microsoft's QLinearAdd) as the float op it stands for.
"""

from __future__ import annotations

import enum
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Iterable, Mapping, Sequence

import numpy as np

from bbgrap.ir import Graph, Interval, Layer, ShapeMap

DEFAULT_DOMAINS = ("", "ai.onnx")
MS_DOMAIN = "com.microsoft"  # onnxruntime's contrib ops: the QOperator format's QLinearAdd, QLinearConcat, ...
NCHWC_DOMAIN = "com.microsoft.nchwc"  # onnxruntime's blocked-layout (NCHWc) ops, in its optimised graphs


def is_default_domain(domain: str) -> bool:
    """The ONNX default domain, which a model may spell "" or "ai.onnx"."""
    return domain in DEFAULT_DOMAINS


@dataclass(frozen=True)
class Local:
    """What a node's local op needs to produce one output region.

    `needs[i]` is the region of input i it reads (None: input absent, or dropped
    from the local op, as Concat drops inputs outside the region); `computes` is
    what the local op produces (a superset of the requested region when the op
    cannot produce exactly that, e.g. LRN's channel halo); `attrs` overrides the
    layer's attributes for the local op; `inputs[i]` replaces the value of constant
    input i in the local op (for what newer opsets pass as inputs rather than
    attributes: Slice's starts and ends, Pad's pads, Gather's indices shifted to the
    local input's origin, Reshape's shape), or gives an optional input the layer omits (i past its
    last input: a Resize's sizes). Where `inputs` gives input i, `needs[i]` is None.
    `emits` (None: `computes`) is what the local op outputs where that is more than it computes
    exactly: a bilinear Resize's or LRN's rows at the edges of its input crop, which the local op
    clamps where the whole op reads on. Lowering crops the output to `computes` before the node
    holds it, so nothing reads those rows; the cost model counts them.
    """

    needs: tuple[ShapeMap | None, ...]
    computes: ShapeMap
    attrs: Mapping[str, Any] = field(default_factory=dict)
    inputs: Mapping[int, np.ndarray] = field(default_factory=dict)
    emits: ShapeMap | None = None

    @property
    def emitted(self) -> ShapeMap:
        """What the local op outputs: `emits`, or `computes` where that is all of it."""
        return self.computes if self.emits is None else self.emits


# onnxruntime's blocked layout holds channels in blocks of 16 on a CPU with AVX-512 and of 8 with
# AVX2; a plan is compiled before its nodes are known, and a multiple of 16 is one of 8 too
NCHWC_BLOCK = 16

# what each byte a piece of a convolution reads beyond its throughput costs it, in operations
# (`cost.extra_reads`): every piece reads the filters of its output channels from beyond the core's
# cache, so a cut along rows reads every filter again per piece, and a piece of channels reads the
# whole input (a 3 x 3 convolution of 256 channels on 14 x 14, one core at 190-215 Gop/s: 150-200 us
# more per piece of rows than its operations, about 100 us per piece of 64 channels;
# docs/benchmarks.md, session 19)
CONV_READ_OPS = 12.0


class Layout(enum.Enum):
    """How onnxruntime's CPU provider treats an op in its blocked NCHWc layout (what lowering
    must know to keep a crop between two such ops inside the layout)."""

    PLAIN = "plain"  # runs on plain NCHW: the layout is left before it
    KEEPS = "keeps"  # its output stays blocked when its input is (an activation, BatchNormalization)
    # reads and writes the blocked layout (Conv, the pools, Add, Sum, Mul); an op of several values
    # only where all are blocked and of its output's shape (simulate.layout_reorders)
    BLOCKED = "blocked"
    # moves values without computing (a Concat, a Slice): bbgrap-run's layout folding runs it on
    # blocked values where they are whole channel blocks (backends/nchwc.py), and onnxruntime
    # itself a Concat along channels; lowering keeps a crop next to it a Slice
    BLIND = "blind"

    @property
    def produces_blocked(self) -> bool:
        return self in (Layout.KEEPS, Layout.BLOCKED)

    @property
    def reads_blocked(self) -> bool:
        return self is Layout.BLOCKED


@dataclass(frozen=True)
class EightBit:
    """How onnxruntime's CPU provider runs an op of a quantized model on the 8-bit values of its QDQ
    pattern where the pattern is whole (`simulate.eight_bit_op`), the pattern dropped or the op in a
    QLinear kernel (QLinearAdd, QLinearMul, QLinearConcat, QLinearSoftmax, QLinearAveragePool,
    QLinearGlobalAveragePool); it prices as its float op. `unsigned_only`: only on uint8 values (on
    x86 onnxruntime runs an int8 one in float). `any_layout`: in the layout of the values it takes
    (channels-last after an integer convolution: `simulate.quantized_layouts`), else in NCHW.
    `generic_kernel`: in NCHW, on the op's own generic kernel (a MaxPool after a float op), many
    times slower than its float or channels-last one (`cluster.EIGHT_BIT_NCHW`)."""

    unsigned_only: bool = False
    any_layout: bool = False
    generic_kernel: bool = False


@dataclass(frozen=True)
class OpTraits:
    """What the backend does with an op, registered with its rule.

    `alias`: one output equal to the input, which lowering binds instead of emitting a node
    (Identity, inference Dropout). `moves_data`: computes nothing, only moves elements (a
    segment of such ops is folded into the segment before it). `layout`: see `Layout`.
    `fuses_into_conv`: onnxruntime folds it into the convolution that produces its input
    (Conv+BatchNormalization into the weights, Conv+activation, Conv+Add in the blocked
    layout), so it has no kernel of its own: no fixed cost, and with `folds_into_weights` (a
    BatchNormalization, whose scale and shift become the convolution's weights and bias) no
    time at all; with `in_kernel` (a ReLU; an Add, whose other input the kernel accumulates its
    output onto) none in a blocked convolution's kernel either, which applies it to each value as it
    writes it (`simulate.BLOCKED_KERNELS`); else the convolution's kernel spends one "other"
    operation per value on it, a pass over its output (the simulator's cost of a segment: a Clip
    after a depthwise convolution adds a third to its time).
    `channel_block`: its CPU kernel works its output channels in blocks of this many, padding
    the last (the blocked layout's convolution; docs/design.md, "Operations as run"), so a piece is priced by its
    channels rounded up to whole blocks and a cut of its channels prefers whole blocks
    (`cost.run_ops`); 0: in proportion to its channels. `read_ops`: operations' worth of time
    each byte a piece reads beyond what its kind's throughput holds costs it (`cost.extra_reads`:
    a convolution's filters of the piece's channels, and input beyond its share): a piece of few
    rows costs more per row than a large one, and one of few channels more per channel
    (`cost.run_ops`); 0: nothing beyond its operations. `fuses_in_chain`: an elementwise op that
    onnxruntime computes in one kernel with the ops after it where they all compute a function of
    one value (x·sigmoid(x) as its QuickGelu, erf's GELU as its Gelu: `simulate.chained_layers`),
    so such a chain costs one op's fixed cost and one pass over its values. `view`: its output is
    its input's buffer under another shape, which onnxruntime hands on (Reshape, Flatten, Squeeze,
    Unsqueeze): it writes no values (its rule counts no operations either). `eight_bit`: where a
    quantized model's QDQ pattern around it is whole, onnxruntime runs it on the 8-bit values
    (`EightBit`); None: in float. `transposes_pass`: onnxruntime moves a quantized model's
    channels-last transposes past it (DequantizeLinear, QuantizeLinear, a crop's Slice, Concat),
    so it runs in the layout of the values it takes (`simulate.quantized_layouts`)."""

    alias: bool = False
    moves_data: bool = False
    layout: Layout = Layout.PLAIN
    fuses_into_conv: bool = False
    folds_into_weights: bool = False
    in_kernel: bool = False
    channel_block: int = 0
    read_ops: float = 0.0
    fuses_in_chain: bool = False
    view: bool = False
    eight_bit: EightBit | None = None
    transposes_pass: bool = False


class RegionRule(ABC):
    """How one op family maps an output region to the input regions it reads, and what
    else the compiler knows of the family's ops.

    `passes_through`: every output element reads only the input elements at the same
    (broadcast) position, so a layer may take its producer's cut unchanged. `windowed`: the op
    slides a kernel over the spatial axes (attributes kernel_shape, strides, dilations, pads;
    `rules/window.py`)."""

    group: str = "others"
    passes_through: ClassVar[bool] = False
    windowed: ClassVar[bool] = False
    # the family's channel-local ops whose float CPU kernel sums in another order in onnxruntime's
    # blocked layout than in NCHW: their channels are cut in whole blocks where rounded (`grain`)
    blocked_sums: ClassVar[frozenset[str]] = frozenset()

    @abstractmethod
    def axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        """Output axes along which this layer can be cut (empty: whole only)."""

    @abstractmethod
    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        """Input regions and local attributes to compute the box `out`."""

    def ops_per_element(self, layer: Layer, graph: Graph) -> float:
        """Operations per output element, multiply-adds counted as two (the cost model's unit)."""
        return 1.0

    def uncut(self, layer: Layer, graph: Graph) -> str | None:
        """Why `axes` offers no axis for this layer where the family's ops can be cut (what
        `inspect` says of it); None: no such reason (see the rule's `axes`)."""
        return None

    def grain(self, layer: Layer, graph: Graph, axis: int) -> int:
        """Cuts along `axis` fall on multiples of this many positions, for the pieces to be the
        whole op's to the bit: `rounded_channel_grain` for an op of `blocked_sums`, else 1
        (anywhere). `partition_layer` moves every cut onto it, and `grained` leaves out an axis
        whose extent is not made of it."""
        return rounded_channel_grain(layer, graph, axis) if layer.op_type in self.blocked_sums else 1

    def grained(self, layer: Layer, graph: Graph, axes: frozenset[int]) -> frozenset[int]:
        """`axes` without those whose extent is not a whole number of the layer's grain along them."""
        dims = shape(graph, layer.outputs[0])
        return frozenset(a for a in axes if dims[a] % self.grain(layer, graph, a) == 0)


def rounded_channel_grain(layer: Layer, graph: Graph, axis: int) -> int:
    """The grain of a channel cut of a channel-local op whose float CPU kernel sums in another
    order in onnxruntime's blocked layout than in NCHW (an average pool, a depthwise or grouped
    convolution, a BatchNormalization it runs as a 1x1 one), where its result is rounded
    (`Graph.rounded_later`): NCHWC_BLOCK, else 1.
    onnxruntime runs a tensor of whole blocks of channels blocked and any other in NCHW, so a
    piece of some channels runs the whole op's kernel, and gives its bits, only where both are
    whole blocks (the last bit elsewhere differs, which a rounding after it can make a step)."""
    dims = shape(graph, layer.outputs[0])
    return NCHWC_BLOCK if axis == 1 and len(dims) == 4 and graph.rounded_later(layer) else 1


def integer_kernel(layer: Layer, graph: Graph) -> bool:
    """Whether onnxruntime's CPU provider fuses the layer's QDQ pattern (`Layer.fused`) into an
    8-bit integer kernel (DequantizeLinear-Conv-QuantizeLinear into QLinearConv, a Gemm into QGemm):
    its weights dequantized from 8-bit integers, its input dequantized from and its result quantized
    to 8-bit integers, for a convolution uint8 ones, the activations onnxruntime's QLinearConv takes
    on x86. An int8 value is uint8 by then where onnxruntime rewrites its pair
    (`frontends.quantized.unsigned_pairs`); where it does not (a value with several readers: a
    residual block's input) a convolution runs in float, as do 16-bit ones
    (tests/backends/test_quantized.py checks it against onnxruntime's optimised model)."""
    if len(layer.inputs) < 2 or not layer.rounds_output or not layer.dequantizes(0):
        return False
    data, weight, result = layer.inputs[0], layer.inputs[1], layer.outputs[0]
    if weight not in graph.dequantized or graph.itemsize(weight) != 1:
        return False
    activations = {graph.tensors[data].dtype, graph.tensors[result].dtype}
    if layer.op_type == "Conv":
        return activations == {"uint8"}
    return layer.op_type in ("Gemm", "MatMul") and activations <= {"uint8", "int8"}  # (a ConvTranspose: priced in float)


def multiplies_unpacked(layer: Layer, graph: Graph, k: int) -> bool:
    """Whether the layer is a float product (Conv, MatMul, Gemm) whose rounded result
    (`Graph.rounded_later`) onnxruntime computes with its input `k` as it comes, not packed once at
    load: an activation, or a weight a DequantizeLinear makes at run time (in the layer's QDQ pattern,
    `Fused.inputs`, or before it, `Graph.dequantized`), which onnxruntime does not fold, in a model it
    leaves in float (16-bit or unfused QDQ).
    MLAS multiplies by such an operand along other paths, whose sums round differently from the
    whole product's, for a single row (M = 1: a vector product), a single column (N = 1), a single
    row's columns under transB (in groups of 4), and any rows of a single column. So a piece of
    such a layer computes rows and columns that take the whole product's path (`paired`, and
    groups of 4 under transB), and a product of a single column is not cut; pieces of a packed
    operand take the whole product's path as they are."""
    operand = layer.inputs[k]
    return (graph.is_activation(operand) or operand in graph.dequantized or layer.dequantizes(k)) and graph.rounded_later(layer)


def paired(region: ShapeMap, axes: Sequence[int], dims: Sequence[int]) -> ShapeMap:
    """`region` of a tensor of `dims`, grown by one row beside it along the last of `axes` that
    has more than one, where it holds a single element of their product and the tensor more: the
    rows (or columns) a piece of a product by an unpacked operand computes so that its M (or N), the
    product of those axes, is not 1 where the whole product's is not (`multiplies_unpacked`)."""
    if math.prod(len(region.interval(a)) for a in axes) != 1 or math.prod(dims[a] for a in axes) == 1:
        return region
    a = max(a for a in axes if dims[a] > 1)
    return region.with_axis(a, region.interval(a).with_neighbour())


class RuleRegistry:
    """(Domain, op type) → rule and traits, with duplicate registration an error (as onnxslim's
    shape handlers do), so two families cannot silently disagree. An op is registered for ONNX's
    default domain unless a domain is named (onnxruntime's com.microsoft QLinearAdd); an op of
    any other domain has no rule and default traits, whatever its name."""

    def __init__(self) -> None:
        self._rules: dict[tuple[str, str], RegionRule] = {}
        self._traits: dict[tuple[str, str], OpTraits] = {}

    @staticmethod
    def _key(op_type: str, domain: str) -> tuple[str, str]:
        return ("" if is_default_domain(domain) else domain, op_type)

    def register(self, op_types: Iterable[str], rule: RegionRule, traits: OpTraits = OpTraits(), domain: str = "") -> None:
        for op in op_types:
            key = self._key(op, domain)
            if key in self._rules:
                raise ValueError(f"region rule for {'.'.join(k for k in key if k)} registered twice")
            self._rules[key] = rule
            self._traits[key] = traits

    def get(self, layer: Layer) -> RegionRule | None:
        """The layer's rule; None for an op without one, and for a layer whose shapes depend on the
        input's values (`Layer.shape_from_values`), which no rule may cut."""
        return None if layer.shape_from_values else self.rule_of(layer.op_type, layer.domain)

    def grain(self, layer: Layer, graph: Graph, axis: int) -> int:
        """Where cuts of the layer along `axis` may fall (`RegionRule.grain`); 1 (anywhere) for a
        layer without a rule, which is not cut."""
        rule = self.get(layer)
        return rule.grain(layer, graph, axis) if rule is not None else 1

    def rule_of(self, op_type: str, domain: str = "") -> RegionRule | None:
        return self._rules.get(self._key(op_type, domain))

    def traits(self, op_type: str, domain: str = "") -> OpTraits:
        """The op's runtime traits (the defaults for an op without a rule)."""
        return self._traits.get(self._key(op_type, domain), OpTraits())

    def __contains__(self, op_type: str) -> bool:
        """Whether an op of ONNX's default domain has a rule."""
        return self._key(op_type, "") in self._rules

    def op_types(self, domain: str = "") -> list[str]:
        """The ops of `domain` (ONNX's default: "") that have a rule."""
        wanted = self._key("", domain)[0]
        return sorted(op for d, op in self._rules if d == wanted)

# region helpers shared by the rule families ------------------------------------------


def shape(graph: Graph, tensor: str) -> tuple[int, ...]:
    return graph.tensors[tensor].shape


def full(graph: Graph, tensor: str) -> ShapeMap:
    return ShapeMap.full(shape(graph, tensor))


def broadcast_need(out: ShapeMap, in_shape: tuple[int, ...]) -> ShapeMap:
    """Region of a (numpy-)broadcast input that an output region reads."""
    offset = out.rank - len(in_shape)
    axes = []
    for k, dim in enumerate(in_shape):
        iv = out.interval(k + offset)
        axes.append(Interval(0, 1) if dim == 1 else iv)
    return ShapeMap(tuple((a,) for a in axes))


def whole(layer: Layer, graph: Graph, out: ShapeMap) -> Local:
    """The layer's op as it is, reading every input whole: the local op of a layer a rule cannot
    cut (its `axes` empty), which the planners still price whole on one node."""
    assert out == full(graph, layer.outputs[0]), f"{layer.op_type} '{layer.name}' cannot be cut, but a piece {out} was asked of it"
    return Local(tuple(full(graph, t) if t else None for t in layer.inputs), out)


def all_axes(layer: Layer, graph: Graph) -> frozenset[int]:
    return frozenset(range(len(shape(graph, layer.outputs[0]))))


# QOperator ops ------------------------------------------------------------------------


class QuantizedRule(RegionRule):
    """A QOperator op (what onnxruntime's quantize_static writes with QuantFormat.QOperator:
    QLinearConv, QLinearMatMul, com.microsoft's QLinearAdd, ...) cut exactly as the float op it
    stands for, by that op's rule (`base`).

    Its integer values sit where the float op has its inputs, among scales and zero points:
    `values[j]` is the position of the float op's input j among the layer's inputs. `base` maps a
    region on a view of the layer that has only those inputs and `float_op` as its type, and what it
    says holds for the quantized op as it is: each output value is the float op's on the input
    values, requantized on its own, so its regions, attributes and computed rows are the float op's;
    where a local op pads (a piece at a border keeps the border's pads), onnxruntime pads with the
    input's zero point, the value that stands for the float op's 0.

    Every other input is a scale or zero point. `follows[k] = (j, axis)`: input k belongs to value
    j, so it is dropped from the local op with it (QLinearConcat's triples), and where it has more
    than one element it is per index along the value's `axis` (QLinearConv's per-output-channel
    w_scale, along the weights' axis 0), so a piece reads the indices its value's region reads
    there. A scalar or one-element one is read whole, as is every input not in `follows`; where
    such an input has more than one element, or one in `follows` more than one axis, the rule
    cannot tell which of them a piece reads, and the layer is not cut."""

    def __init__(self, base: RegionRule, float_op: str, values: Sequence[int], follows: Mapping[int, tuple[int, int]] | None = None) -> None:
        self.base, self.float_op = base, float_op
        self.values = tuple(values)
        self.follows = dict(follows or {})
        self.group = base.group

    def operands(self, layer: Layer) -> tuple[tuple[int, ...], Mapping[int, tuple[int, int]]]:
        """`values` and `follows` for this layer (an op of variadic inputs works them out)."""
        return self.values, self.follows

    def view(self, layer: Layer) -> Layer:
        """The layer as its float op: the integer values as its inputs, the op type `float_op`."""
        values, _ = self.operands(layer)
        inputs = [layer.inputs[k] if k < len(layer.inputs) else "" for k in values]
        while inputs and not inputs[-1]:
            inputs.pop()
        return replace(layer, op_type=self.float_op, domain="", inputs=tuple(inputs), captured=())

    def axes(self, layer: Layer, graph: Graph) -> frozenset[int]:
        values, follows = self.operands(layer)
        for k, t in enumerate(layer.inputs):
            if not t or k in values:
                continue
            dims = shape(graph, t)
            if (len(dims) > 1 and k in follows) or (int(np.prod(dims)) > 1 and k not in follows):
                return frozenset()
        return self.base.axes(self.view(layer), graph)

    def local(self, layer: Layer, graph: Graph, out: ShapeMap) -> Local:
        values, follows = self.operands(layer)
        view = self.base.local(self.view(layer), graph, out)
        needs: list[ShapeMap | None] = [full(graph, t) if t else None for t in layer.inputs]
        for j, k in enumerate(values):
            if k < len(needs):
                needs[k] = view.needs[j] if j < len(view.needs) else None
        for k, (j, axis) in follows.items():
            if k >= len(needs) or not layer.inputs[k]:
                continue
            value = needs[values[j]]
            if value is None:
                needs[k] = None
            elif int(np.prod(shape(graph, layer.inputs[k]))) > 1:
                iv = value.interval(axis % value.rank)
                needs[k] = ShapeMap.box([iv.start], [iv.stop])
        inputs = {values[j]: v for j, v in view.inputs.items()}
        return Local(tuple(needs), view.computes, view.attrs, inputs, view.emits)

    def ops_per_element(self, layer: Layer, graph: Graph) -> float:
        """The float op's."""
        return self.base.ops_per_element(self.view(layer), graph)

    def uncut(self, layer: Layer, graph: Graph) -> str | None:
        """The float op's."""
        return self.base.uncut(self.view(layer), graph)


class QuantizedWindowRule(QuantizedRule):
    """A QOperator op of a windowed float op (QLinearConv, QLinearAveragePool): `RegionRule.windowed`."""

    windowed = True


class QuantizedElementwiseRule(QuantizedRule):
    """A QOperator op of an elementwise float op (QLinearAdd, QLinearSigmoid): `RegionRule.passes_through`."""

    passes_through = True


def quantized(base: RegionRule, float_op: str, values: Sequence[int], follows: Mapping[int, tuple[int, int]] | None = None) -> QuantizedRule:
    """The `QuantizedRule` of `base`, of the subclass that keeps its `windowed` or `passes_through`."""
    kind = QuantizedWindowRule if base.windowed else QuantizedElementwiseRule if base.passes_through else QuantizedRule
    return kind(base, float_op, values, follows)
