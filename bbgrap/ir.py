"""The ShapeMap IR: intervals, regions of tensors, layers and the graph between them.

A `ShapeMap` is the region of one tensor that one node holds or needs: per axis a
sorted tuple of disjoint half-open intervals (thesis fig. 3.3), the region being
their cartesian product. Partitioned plans only ever need *boxes* (one interval per
axis); the general form is kept for set algebra and for the invariant checks.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import networkx as nx
import numpy as np


class BBGrapError(Exception):
    """A user-facing error: one line that names the problem and how to fix it."""


@dataclass(frozen=True, order=True)
class Interval:
    """Half-open interval [start, stop) along one axis."""

    start: int
    stop: int

    def __post_init__(self) -> None:
        if self.stop < self.start:
            raise ValueError(f"interval stop {self.stop} < start {self.start}")

    def __len__(self) -> int:
        return self.stop - self.start

    @property
    def empty(self) -> bool:
        return self.stop == self.start

    def intersect(self, other: Interval) -> Interval:
        lo, hi = max(self.start, other.start), min(self.stop, other.stop)
        return Interval(lo, max(lo, hi))

    def contains(self, other: Interval) -> bool:
        return other.empty or (self.start <= other.start and other.stop <= self.stop)

    def shift(self, offset: int) -> Interval:
        return Interval(self.start + offset, self.stop + offset)

    def with_neighbour(self) -> Interval:
        """The interval and one row beside it: the row before it, or where it starts at row 0 the
        row after it (the caller knows the axis has that row)."""
        return Interval(self.start - 1, self.stop) if self.start > 0 else Interval(self.start, self.stop + 1)

    def aligned(self, grain: int, extent: int) -> Interval:
        """The smallest interval of [0, extent) that holds this one and whose ends are multiples of
        `grain` (its stop may be `extent`)."""
        return Interval(grain * (self.start // grain), min(extent, -(-self.stop // grain) * grain))

    def __str__(self) -> str:
        return f"{self.start}:{self.stop}"


def _normalise(intervals: Iterable[Interval]) -> tuple[Interval, ...]:
    """Sort, drop empties and merge touching intervals."""
    if type(intervals) is tuple and len(intervals) == 1 and not intervals[0].empty:
        return intervals  # one box axis, the common case: already normal
    out: list[Interval] = []
    for iv in sorted(i for i in intervals if not i.empty):
        if out and iv.start <= out[-1].stop:
            out[-1] = Interval(out[-1].start, max(out[-1].stop, iv.stop))
        else:
            out.append(iv)
    return tuple(out)


def _axis_len(ivs: tuple[Interval, ...]) -> int:
    return sum(len(i) for i in ivs)


def _box_of(axes: tuple[tuple[Interval, ...], ...]) -> tuple[Interval, ...] | None:
    """The intervals of `axes` where every axis is one non-empty interval (a box, already
    normal), else None."""
    if type(axes) is not tuple:
        return None
    box = []
    for a in axes:
        if type(a) is not tuple or len(a) != 1:
            return None
        iv = a[0]
        if iv.stop <= iv.start:
            return None
        box.append(iv)
    return tuple(box)


@dataclass(frozen=True)
class ShapeMap:
    """Region of a tensor: the product over axes of unions of intervals."""

    axes: tuple[tuple[Interval, ...], ...]
    # the empty region of a scalar (rank 0), which has no axis to be empty along
    void: bool = False

    # Derived once at construction and kept on the instance (it is immutable; fields, equality and
    # hashing are unaffected): the passes ask these millions of times on dense graphs.
    _box: tuple[Interval, ...] | None = field(init=False, repr=False, compare=False)  # the intervals, where a box
    empty: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        axes = self.axes
        box = _box_of(axes)
        if box is None:  # a box is already normal
            axes = tuple(_normalise(a) for a in axes)
            object.__setattr__(self, "axes", axes)
            if all(len(a) == 1 for a in axes):
                box = tuple(a[0] for a in axes)
        object.__setattr__(self, "_box", box)
        object.__setattr__(self, "empty", self.void or (box is None and any(len(a) == 0 for a in axes)))

    # construction -----------------------------------------------------------
    @classmethod
    def _of_box(cls, box: tuple[Interval, ...]) -> ShapeMap:
        """The box with these intervals, every one non-empty (the caller's promise, not checked):
        what the constructor builds from them, without re-deriving what the caller knows. The
        region algebra builds most of its results this way."""
        region = object.__new__(cls)
        object.__setattr__(region, "axes", tuple((iv,) for iv in box))
        object.__setattr__(region, "void", False)
        object.__setattr__(region, "_box", box)
        object.__setattr__(region, "empty", False)
        return region

    @staticmethod
    def full(shape: Sequence[int]) -> ShapeMap:
        box = tuple(Interval(0, int(d)) for d in shape)
        if all(iv.stop > 0 for iv in box):
            return ShapeMap._of_box(box)
        return ShapeMap(tuple((iv,) for iv in box))

    @staticmethod
    def box(starts: Sequence[int], stops: Sequence[int]) -> ShapeMap:
        return ShapeMap(tuple((Interval(int(a), int(b)),) for a, b in zip(starts, stops)))

    @staticmethod
    def empty_like(rank: int) -> ShapeMap:
        return ShapeMap(tuple(() for _ in range(rank)), void=rank == 0)

    # queries ----------------------------------------------------------------
    @property
    def rank(self) -> int:
        return len(self.axes)

    @property
    def volume(self) -> int:
        if self.empty:
            return 0
        if self._box is not None:
            return math.prod(i.stop - i.start for i in self._box)
        return math.prod(_axis_len(a) for a in self.axes)

    @property
    def is_box(self) -> bool:
        return self._box is not None

    def _box_axes(self) -> tuple[Interval, ...]:
        if self._box is None:
            raise ValueError(f"region {self} is not a box")
        return self._box

    @property
    def starts(self) -> tuple[int, ...]:
        return tuple(i.start for i in self._box_axes())

    @property
    def stops(self) -> tuple[int, ...]:
        return tuple(i.stop for i in self._box_axes())

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(i) for i in self._box_axes())

    def interval(self, axis: int) -> Interval:
        return self._box_axes()[axis]

    def contains(self, other: ShapeMap) -> bool:
        if other.empty:
            return True
        if self.void:
            return False
        if self._box is not None and other._box is not None:
            for a, b in zip(self._box, other._box):
                if b.start < a.start or a.stop < b.stop:
                    return False
            return True
        return all(
            all(any(mine.contains(o) for mine in a) for o in b) for a, b in zip(self.axes, other.axes)
        )

    def overlaps(self, other: ShapeMap) -> bool:
        """Whether the two regions share an element (`not intersect(other).empty`, without
        building the intersection: the passes ask it for every pair of nodes)."""
        if self._box is not None and other._box is not None:
            if self.void or other.void:
                return False
            for a, b in zip(self._box, other._box):  # intervals of a box are never empty
                if b.stop <= a.start or a.stop <= b.start:
                    return False
            return True
        return not self.intersect(other).empty

    # algebra ----------------------------------------------------------------
    def intersect(self, other: ShapeMap) -> ShapeMap:
        if self.void or other.void:
            return ShapeMap.empty_like(0)
        if self._box is not None and other._box is not None:
            if self.contains(other):  # the common case of a gather's parts: no new region at all
                return other
            bounds = [(max(a.start, b.start), min(a.stop, b.stop)) for a, b in zip(self._box, other._box)]
            if all(hi > lo for lo, hi in bounds):
                return ShapeMap._of_box(tuple(Interval(lo, hi) for lo, hi in bounds))
            return ShapeMap(tuple((Interval(lo, hi),) if hi > lo else () for lo, hi in bounds))
        axes = []
        for mine, theirs in zip(self.axes, other.axes):
            axes.append(tuple(x.intersect(y) for x in mine for y in theirs))
        return ShapeMap(tuple(axes))

    def union(self, other: ShapeMap) -> ShapeMap:
        """Exact union; defined when the two regions agree on all axes but one."""
        if self.empty:
            return other
        if other.empty:
            return self
        differing = [k for k, (a, b) in enumerate(zip(self.axes, other.axes)) if a != b]
        if len(differing) > 1:
            raise ValueError(f"union of {self} and {other} is not a product region; use hull()")
        if not differing:
            return self
        k = differing[0]
        axes = list(self.axes)
        axes[k] = self.axes[k] + other.axes[k]
        return ShapeMap(tuple(axes))

    def hull(self, other: ShapeMap) -> ShapeMap:
        """Smallest box containing both regions."""
        if self.empty:
            return other.bounding_box()
        if other.empty:
            return self.bounding_box()
        # each axis of a non-empty region has a non-empty interval, so the hull's are non-empty too
        return ShapeMap._of_box(tuple(Interval(min(a[0].start, b[0].start), max(a[-1].stop, b[-1].stop))
                                      for a, b in zip(self.axes, other.axes)))

    def bounding_box(self) -> ShapeMap:
        if self.empty:
            return self
        return ShapeMap._of_box(tuple(Interval(a[0].start, a[-1].stop) for a in self.axes))

    def difference(self, other: ShapeMap) -> list[ShapeMap]:
        """Disjoint boxes covering self minus other (both must be boxes)."""
        cut = self.intersect(other)
        if cut.empty:
            return [] if self.empty else [self]
        pieces: list[ShapeMap] = []
        rest = list(self._box_axes())
        for k, inner in enumerate(cut._box_axes()):
            outer = rest[k]
            for part in (Interval(outer.start, inner.start), Interval(inner.stop, outer.stop)):
                if not part.empty:
                    axes = rest.copy()
                    axes[k] = part
                    pieces.append(ShapeMap._of_box(tuple(axes)))
            rest[k] = inner
        return pieces

    def with_axis(self, axis: int, interval: Interval) -> ShapeMap:
        if self._box is not None and not self.void and not interval.empty:
            box = list(self._box)
            box[axis] = interval
            return ShapeMap._of_box(tuple(box))
        axes = list(self.axes)
        axes[axis] = (interval,)
        return ShapeMap(tuple(axes))

    def relative_to(self, outer: ShapeMap) -> ShapeMap:
        """This box in the coordinates of `outer`'s origin."""
        origin = outer.starts
        return ShapeMap.box([s - o for s, o in zip(self.starts, origin)], [e - o for e, o in zip(self.stops, origin)])

    def slices(self) -> tuple[slice, ...]:
        return tuple(slice(i.start, i.stop) for i in self._box_axes())

    def key(self) -> str:
        """Short stable text form, used in names of local values (kept on the instance once made:
        lowering and emit name every value by it, half a million times for maxvit_t on 16 nodes)."""
        text: str | None = self.__dict__.get("_key")
        if text is None:
            if self.empty:
                text = "empty"
            elif self._box is not None:
                text = ",".join([f"{i.start}:{i.stop}" for i in self._box])
            else:
                text = ",".join("+".join(str(i) for i in a) for a in self.axes)
            object.__setattr__(self, "_key", text)
        return text

    def __str__(self) -> str:
        return "[" + self.key() + "]"


# --------------------------------------------------------------------------------------
# Graph


GROUPS = ("convolutions", "pools", "arithmetic", "others", "opaque")


@dataclass(frozen=True)
class Tensor:
    """Static metadata of one tensor (torch.fx's TensorMetadata, immutable)."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # numpy dtype name

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class Attached:
    """A node of a quantized (QDQ) model kept beside a layer rather than cut on its own:
    `op_type` applied to one value, with constant `operands` after it (a DequantizeLinear's
    or QuantizeLinear's scale and zero point, a Clip's bounds; "" for an absent one).
    `axis` is the value's axis a 1-D operand runs along (a per-channel scale), which lowering
    cuts to the region it emits; None where every operand is whole (per tensor). `domain`:
    onnxruntime's com.microsoft for its own QuantizeLinear/DequantizeLinear (16-bit types)."""

    op_type: str
    attrs: Mapping[str, Any]
    operands: tuple[str, ...]
    axis: int | None = None
    domain: str = ""


@dataclass(frozen=True)
class Fused:
    """The QDQ pattern around one layer of a quantized model: a DequantizeLinear before
    explicit input k for each `(k, node)` of `inputs` (the layer reads the integer tensor),
    and after its one output the Relu/Clip and the QuantizeLinear of `outputs`, in order
    (the layer writes the integer tensor). onnxruntime fuses such a pattern into an integer
    kernel (DequantizeLinear–Conv–QuantizeLinear into QLinearConv) where it sees it whole;
    lowering emits it whole in one segment, so each piece runs the kernel the whole model
    runs, and the halos that move are the integer tensors."""

    inputs: tuple[tuple[int, Attached], ...] = ()
    outputs: tuple[Attached, ...] = ()


@dataclass(frozen=True)
class Dequantized:
    """A weight of a quantized model, `DequantizeLinear(source, ...)` of a constant integer
    tensor: the graph holds its float value (for the rules and the cost model), lowering emits
    the integer tensor and the node (cut like the weight), as the model has them, so that
    onnxruntime fuses the layer that reads it as it does in the whole model."""

    source: str
    node: Attached


@dataclass(frozen=True)
class Layer:
    """One ONNX node with static shapes; `group` follows thesis table 3.1.

    `captured` are the outer tensors that the node's subgraphs (If/Loop/Scan bodies)
    read by name rather than as inputs. They are also the last entries of `inputs`, so
    partitioning, gathers and liveness treat them like any input; lowering passes them
    to the node under their original names (see `backends/lower.py`). A layer with
    `shape_from_values` has no rule (`RuleRegistry.get`).
    """

    name: str
    op_type: str
    domain: str
    attrs: Mapping[str, Any]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    group: str = "opaque"
    captured: tuple[str, ...] = ()
    # a tensor it reads or writes has a shape that depends on the input's values (NonZero's count,
    # a Reshape's shape from the data): fixed at the sample input's, so computed whole, never cut
    shape_from_values: bool = False
    fused: Fused | None = None  # a quantized model's DequantizeLinear/QuantizeLinear around it (Fused)

    @property
    def explicit_inputs(self) -> tuple[str, ...]:
        """The node's own ONNX inputs (`inputs` without the captured tensors)."""
        return self.inputs[: len(self.inputs) - len(self.captured)]

    def dequantizes(self, k: int) -> bool:
        """Whether the layer's QDQ pattern dequantizes its explicit input k (`Fused.inputs`): the
        layer reads the integer tensor there."""
        return self.fused is not None and any(j == k for j, _ in self.fused.inputs)

    @property
    def rounds_output(self) -> bool:
        """Whether the layer's result is quantized inside its own pattern (a QuantizeLinear among its
        `Fused.outputs`): where onnxruntime runs such an op in float (an int8 model's pool, or a
        convolution it leaves unfused), a last-bit difference between a piece and the whole op can
        move the rounding by a whole quantization step."""
        return self.fused is not None and any(a.op_type == "QuantizeLinear" for a in self.fused.outputs)

    def describe(self, graph: Graph) -> str:
        ins = ", ".join(f"{t}{list(graph.tensors[t].shape)}" for t in self.inputs if t in graph.tensors)
        return f"{self.op_type} '{self.name}' ({ins})"


@dataclass(frozen=True)
class Part:
    """A piece of a gathered region, taken from node `src` (local when src == the gathering node)."""

    region: ShapeMap
    src: int


@dataclass(frozen=True)
class Gather:
    """How `node` assembles `region` of `tensor`: concatenation of parts along `axis`."""

    tensor: str
    node: int
    region: ShapeMap
    parts: tuple[Part, ...]
    axis: int

    @property
    def transfers(self) -> tuple[Transfer, ...]:
        return tuple(Transfer(self.tensor, p.region, p.src, self.node) for p in self.parts if p.src != self.node)


@dataclass(frozen=True)
class Transfer:
    tensor: str
    region: ShapeMap
    src: int
    dst: int


@dataclass(frozen=True)
class LayerPartition:
    """What each node computes of one layer, and the input regions it needs for that.

    `axis` is the cut axis (None: the layer is computed whole on `out`'s only
    non-empty node). `needs[n][i]` is the region of input i node n reads (None for
    an absent optional input or one the local op drops), `computes[n]` the region its
    local op produces (a superset of `out[n]`, e.g. whole groups of a group conv, or a
    neighbour's halo rows recomputed rather than received), which the node holds; the
    owned regions `out` tile the output and are what other nodes receive from; and
    `attrs[n]` the attribute overrides of its local op (pads, ceil_mode, group);
    `inputs[n]` the constant inputs its local op takes instead of the layer's, by input
    index (Slice's starts and ends; empty: none on any node); `emits[n]` what its local op
    outputs where that is more than `computes[n]` (rules/base.py `Local.emits`; None, or empty
    on every node: just `computes`), which lowering crops to `computes[n]`.
    """

    axis: int | None
    out: tuple[ShapeMap, ...]
    needs: tuple[tuple[ShapeMap | None, ...], ...]
    computes: tuple[ShapeMap, ...]
    attrs: tuple[Mapping[str, Any], ...]
    inputs: tuple[Mapping[int, np.ndarray], ...] = ()
    emits: tuple[ShapeMap | None, ...] = ()

    @staticmethod
    def compact_emits(emits: Sequence[ShapeMap | None]) -> tuple[ShapeMap | None, ...]:
        """`emits` from each node's local op (None: it emits what it computes): empty where no
        node emits more, so partitions that emit nothing extra compare equal however made."""
        return tuple(emits) if any(e is not None for e in emits) else ()

    def emitted(self, node: int) -> ShapeMap:
        """What node `node`'s local op outputs (⊇ `computes[node]`), whose operations it performs."""
        region = self.emits[node] if self.emits else None
        return self.computes[node] if region is None else region

    def active_nodes(self) -> list[int]:
        return [n for n, r in enumerate(self.out) if not r.empty]

    def local_inputs(self, node: int) -> Mapping[int, np.ndarray]:
        """The constant inputs node `node`'s local op takes instead of the layer's."""
        return self.inputs[node] if self.inputs else {}


class Movement(enum.Enum):
    """The data movement a graph's gathers implement: how far the pipeline has come."""

    NONE = "none"  # not partitioned yet: no gathers
    NAIVE = "naive"  # every reading node gathers the whole tensor (thesis fig. 3.6a; insert-crop-concat)
    OPTIMIZED = "optimized"  # only the hull of what it reads (fig. 3.6b–e; eliminate-transfers and after)


@dataclass(frozen=True)
class SearchStats:
    """What the search pass did: layers searched, candidates evaluated, the plan objective
    it reached and the naive plan's, and which of the two it kept."""

    strategy: str
    threshold: float
    layers: int
    evaluated: int
    cost_calls: int
    log10_total: float  # log10 of the candidates an exhaustive search would evaluate
    total: float
    seconds: float
    objective: float
    naive_objective: float
    kept: str  # "searched" or "naive"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class PlannerStats:
    """What the whole-network planner did (passes/plan_network.py): its name, the layers it could
    choose for and their candidates in all, the states or choices it scored, whether its result is
    its objective's exact minimum, the synchronous and timeline objectives (ms) of its choice and of
    the plan it started from, and its seconds."""

    planner: str
    layers: int
    candidates: int
    evaluated: int
    exact: bool
    synchronous_ms: float
    timeline_ms: float
    start_synchronous_ms: float
    start_timeline_ms: float
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def consumers_of(layers: Iterable[Layer]) -> dict[str, list[Layer]]:
    """Tensor name → the layers that read it, each once, in order."""
    out: dict[str, list[Layer]] = {}
    for layer in layers:
        for t in dict.fromkeys(layer.inputs):
            if t:
                out.setdefault(t, []).append(layer)
    return out


QUANTIZERS = frozenset({"QuantizeLinear", "DynamicQuantizeLinear"})  # ops that round float values to integers


@dataclass(frozen=True)
class Graph:
    """The whole model: layers in topological order, tensors, constants, and (once
    partitioned) the per-layer partitions and per-tensor gathers."""

    name: str
    layers: tuple[Layer, ...]
    tensors: Mapping[str, Tensor]
    constants: Mapping[str, np.ndarray] = field(repr=False)
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    opsets: Mapping[str, int]
    # the constants that are a quantized model's DequantizeLinear of an integer weight (Dequantized)
    dequantized: Mapping[str, Dequantized] = field(default_factory=dict)
    nodes: int = 1
    partitions: Mapping[str, LayerPartition] = field(default_factory=dict)
    gathers: Mapping[tuple[str, int], Gather] = field(default_factory=dict)
    movement: Movement = Movement.NONE
    search_stats: SearchStats | None = None
    planner_stats: PlannerStats | None = None
    prepack: bool = True  # onnxruntime keeps prepacked weight copies; fit-memory turns them off where memory needs it

    def replace(self, **changes: Any) -> Graph:
        return dataclasses.replace(self, **changes)

    def layer(self, name: str) -> Layer:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(name)

    @functools.cached_property
    def _producer_map(self) -> dict[str, Layer]:
        # Layers never change within one Graph (passes return new Graphs), so once per instance.
        return {t: layer for layer in self.layers for t in layer.outputs if t}

    def producers(self) -> Mapping[str, Layer]:
        """Tensor name → the layer that computes it."""
        return self._producer_map

    def consumers(self) -> dict[str, list[Layer]]:
        return consumers_of(self.layers)

    @functools.cached_property
    def _rounded_later(self) -> frozenset[str]:
        consumers = self.consumers()
        rounded: set[str] = set()
        for layer in reversed(self.layers):  # a layer's readers come after it
            readers = [c for t in layer.outputs if t for c in consumers.get(t, [])]
            if layer.rounds_output or any(c.op_type in QUANTIZERS or c.name in rounded for c in readers):
                rounded.add(layer.name)
        return frozenset(rounded)

    def rounded_later(self, layer: Layer) -> bool:
        """Whether the layer's result is rounded to integers: in its own pattern
        (`Layer.rounds_output`), or by a quantizer it reaches (a QuantizeLinear; a dynamically
        quantized model's DynamicQuantizeLinear before each ConvInteger, which rounds every float
        op's result on its way). A last-bit difference between a piece of such a layer and the
        whole op can then become a whole quantization step."""
        return layer.name in self._rounded_later

    def itemsize(self, tensor: str) -> int:
        """Bytes per element of `tensor` as a plan holds it: a quantized model's dequantized weight
        (`dequantized`) as its integer source, which lowering writes, not its float value."""
        weight = self.dequantized.get(tensor)
        return int(np.dtype(self.tensors[weight.source if weight is not None else tensor].dtype).itemsize)

    def is_activation(self, tensor: str) -> bool:
        return bool(tensor) and tensor not in self.constants

    def digraph(self) -> nx.DiGraph:
        g = nx.DiGraph()
        producers = self.producers()
        for layer in self.layers:
            g.add_node(layer.name)
            for t in layer.inputs:
                if t in producers:
                    g.add_edge(producers[t].name, layer.name, tensor=t)
        return g

    def transfers(self) -> list[Transfer]:
        return [t for g in self.gathers.values() for t in g.transfers]
