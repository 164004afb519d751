"""The plan's manifest (`plan.json`) as typed records: what the compiler writes and every
reader (bbgrap-run, `bbgrap inspect`, the picture, the benchmarks) reads.

Every record is a frozen dataclass with `to_json()` (the JSON value written, keys in a
fixed order) and `from_json(value, where)` (which checks the structure and raises one
`PlanSchemaError` naming the field, e.g. `'messages[3].dst' is not a node (0 to 1)`), so
no reader indexes a raw dictionary and a damaged manifest is refused where it is read,
not half-way through a run. Steps are read by `step_from_json`; the search pass's record is
the IR's own `bbgrap.ir.SearchStats` (read by `search_stats_from_json`), and the movement
the IR's `Movement`. `Plan.from_json` also checks what crosses records: one program per
node, every step's segment and message, every segment's file, one stats entry per node.

A plan of another format version is refused (`PlanVersionError`): compile it again.
Version 3 is the typed schema (version 2 wrote the same keys, checked less); version 4 adds each
segment's `cpu_only` (a plan of version 3 does not say which segments a GPU computes wrong); version 5
records the prediction's profile as its path and `layer_times` apart (version 4 appended a note to the
path, which a reader had to strip).

Steps, in JSON tagged lists, are one type each: `["run", segment]` (RunStep),
`["send", message, local value]` (SendStep), `["wait", message]` (WaitStep).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterable, Mapping, TypeVar, Union

import numpy as np

from bbgrap.config import DIRECTIONS, Direction
from bbgrap.ir import BBGrapError, Movement, PlannerStats, SearchStats

PLAN_FORMAT = "bbgrap-plan"
PLAN_VERSION = 5

Json = dict[str, Any]
T = TypeVar("T")


class PlanSchemaError(BBGrapError):
    """A manifest that does not follow this schema; the message names the field, in one line."""


class PlanVersionError(PlanSchemaError):
    """A manifest of another format version (`found`): compiled by another bbgrap."""

    def __init__(self, found: Any) -> None:
        self.found = found
        super().__init__(f"format version {found}, this bbgrap reads version {PLAN_VERSION}")


def safe_relative(path: str) -> bool:
    """A plain relative path that stays inside the plan directory."""
    return bool(path) and not os.path.isabs(path) and ".." not in path.split("/") and "\\" not in path


# ---------------------------------------------------------------- reading JSON, field by field


def _path(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise PlanSchemaError(f"'{where}' is not an object")
    return value


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _take(rec: Mapping[str, Any], where: str, key: str, ok: Callable[[Any], bool], what: str) -> Any:
    """`rec[key]`, which must pass `ok`; else one error naming the field and what it must be."""
    if key not in rec:
        raise PlanSchemaError(f"'{_path(where, key)}' is missing")
    if not ok(rec[key]):
        raise PlanSchemaError(f"'{_path(where, key)}' is not {what}")
    return rec[key]


def _str(rec: Mapping[str, Any], where: str, key: str) -> str:
    value: str = _take(rec, where, key, lambda v: isinstance(v, str), "a string")
    return value


def _bool(rec: Mapping[str, Any], where: str, key: str) -> bool:
    value: bool = _take(rec, where, key, lambda v: isinstance(v, bool), "true or false")
    return value


def _int(rec: Mapping[str, Any], where: str, key: str, positive: bool = False) -> int:
    low = 1 if positive else 0
    value: int = _take(rec, where, key, lambda v: _is_int(v) and v >= low, "a positive integer" if positive else "an integer >= 0")
    return value


def _number(rec: Mapping[str, Any], where: str, key: str) -> float:
    """A number as written (an integer stays one, so a plan reads back and writes the same JSON)."""
    value: float = _take(rec, where, key, _is_number, "a number")
    return value


def _shape(rec: Mapping[str, Any], where: str, key: str) -> tuple[int, ...]:
    return tuple(_take(rec, where, key, lambda v: isinstance(v, list) and all(_is_int(d) and d >= 0 for d in v),
                       "a list of integers >= 0"))


def _strs(rec: Mapping[str, Any], where: str, key: str) -> tuple[str, ...]:
    return tuple(_take(rec, where, key, lambda v: isinstance(v, list) and all(isinstance(s, str) for s in v), "a list of strings"))


def _str_map(rec: Mapping[str, Any], where: str, key: str) -> dict[str, str]:
    return dict(_take(rec, where, key, lambda v: isinstance(v, dict) and all(isinstance(s, str) for s in v.values()),
                      "an object of strings"))


def _range(rec: Mapping[str, Any], where: str, key: str) -> tuple[int, int] | None:
    """A [start, stop] pair, or null."""
    value = _take(rec, where, key, lambda v: v is None or (isinstance(v, list) and len(v) == 2 and all(_is_int(d) for d in v)),
                  "a [start, stop] pair or null")
    return None if value is None else (value[0], value[1])


def _record(rec: Mapping[str, Any], where: str, key: str, parse: Callable[[Any, str], T]) -> T:
    """A record, read by `parse(value, 'key')`."""
    return parse(_take(rec, where, key, lambda v: True, ""), _path(where, key))


def _optional_record(rec: Mapping[str, Any], where: str, key: str, parse: Callable[[Any, str], T]) -> T | None:
    """A record, or None where `key` is null (the compile made none)."""
    if _take(rec, where, key, lambda v: v is None or isinstance(v, dict), "an object or null") is None:
        return None
    return _record(rec, where, key, parse)


def _movement(rec: Mapping[str, Any], where: str) -> Movement:
    names = [m.value for m in Movement]
    return Movement(_take(rec, where, "movement", lambda v: v in names, f"one of {', '.join(names)}"))


def _records(rec: Mapping[str, Any], where: str, key: str, parse: Callable[[Any, str], T]) -> tuple[T, ...]:
    """A list of records, each read by `parse(value, 'key[k]')`."""
    items = _take(rec, where, key, lambda v: isinstance(v, list), "a list")
    return tuple(parse(item, f"{_path(where, key)}[{k}]") for k, item in enumerate(items))


# ---------------------------------------------------------------- the records


@dataclass(frozen=True)
class TensorSpec:
    """A model output: its name, shape and element type."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def to_json(self) -> Json:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_json(cls, value: Any, where: str) -> TensorSpec:
        rec = _object(value, where)
        return cls(_str(rec, where, "name"), _shape(rec, where, "shape"), _str(rec, where, "dtype"))


@dataclass(frozen=True)
class InputSpec(TensorSpec):
    """A model input, and the local value that holds it on every node."""

    value: str

    def to_json(self) -> Json:
        return {**super().to_json(), "value": self.value}

    @classmethod
    def from_json(cls, value: Any, where: str) -> InputSpec:
        spec = TensorSpec.from_json(value, where)
        return cls(spec.name, spec.shape, spec.dtype, _str(_object(value, where), where, "value"))


@dataclass(frozen=True)
class MessageSpec:
    """One transfer: the region of `tensor` that node `src` sends to node `dst`, held in the
    local value `value` on both sides."""

    id: int
    src: int
    dst: int
    tensor: str
    region: tuple[tuple[int, int], ...]  # per axis [start, stop)
    shape: tuple[int, ...]
    dtype: str
    value: str

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize

    def to_json(self) -> Json:
        return {"id": self.id, "src": self.src, "dst": self.dst, "tensor": self.tensor, "region": [list(r) for r in self.region],
                "shape": list(self.shape), "dtype": self.dtype, "value": self.value}

    @classmethod
    def from_json(cls, value: Any, where: str) -> MessageSpec:
        rec = _object(value, where)
        region = _take(rec, where, "region", lambda v: isinstance(v, list) and all(
            isinstance(r, list) and len(r) == 2 and all(_is_int(d) for d in r) for r in v), "a list of [start, stop] pairs")
        return cls(_int(rec, where, "id"), _int(rec, where, "src"), _int(rec, where, "dst"), _str(rec, where, "tensor"),
                   tuple((a, b) for a, b in region), _shape(rec, where, "shape"), _str(rec, where, "dtype"), _str(rec, where, "value"))


@dataclass(frozen=True)
class SegmentSpec:
    """One ONNX segment of a node's program: its file in the plan, the local values it reads and makes;
    `cpu_only`: why only the CPU provider computes it exactly ("" where any does: backends/emit.py's
    `cpu_only`), which keeps its node off a GPU (backends/engine.py's `load_runner`)."""

    file: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    cpu_only: str = ""

    def to_json(self) -> Json:
        return {"file": self.file, "inputs": list(self.inputs), "outputs": list(self.outputs), "cpu_only": self.cpu_only}

    @classmethod
    def from_json(cls, value: Any, where: str) -> SegmentSpec:
        rec = _object(value, where)
        return cls(_str(rec, where, "file"), _strs(rec, where, "inputs"), _strs(rec, where, "outputs"), _str(rec, where, "cpu_only"))


@dataclass(frozen=True)
class RunStep:
    """Run the program's segment `segment`."""

    segment: int
    op: ClassVar[str] = "run"

    def to_json(self) -> list[Any]:
        return ["run", self.segment]


@dataclass(frozen=True)
class SendStep:
    """Send message `message`, whose data is this node's local value `value` (aliases resolved)."""

    message: int
    value: str
    op: ClassVar[str] = "send"

    def to_json(self) -> list[Any]:
        return ["send", self.message, self.value]


@dataclass(frozen=True)
class WaitStep:
    """Wait for message `message` (the segments after it read it)."""

    message: int
    op: ClassVar[str] = "wait"

    def to_json(self) -> list[Any]:
        return ["wait", self.message]


Step = Union[RunStep, SendStep, WaitStep]


def _is_dtype(name: str) -> bool:
    try:
        np.dtype(name)
    except TypeError:
        return False
    return True


def step_from_json(value: Any, where: str) -> Step:
    """A step from its tagged list (see the module docstring)."""
    if isinstance(value, list) and value and all(_is_int(v) and v >= 0 for v in value[1:2]):
        tag, args = value[0], value[1:]
        if tag == "run" and len(args) == 1:
            return RunStep(args[0])
        if tag == "send" and len(args) == 2 and isinstance(args[1], str):
            return SendStep(args[0], args[1])
        if tag == "wait" and len(args) == 1:
            return WaitStep(args[0])
    raise PlanSchemaError(f"'{where}' is not a step ([\"run\", segment], [\"send\", message, value] or [\"wait\", message])")


@dataclass(frozen=True)
class Program:
    """What one node does: its segments, the steps that run them and move messages, and the
    local values holding the model's outputs (on the node that gathers them)."""

    node: int
    segments: tuple[SegmentSpec, ...]
    steps: tuple[Step, ...]
    outputs: Mapping[str, str]  # model output name -> local value

    @property
    def cpu_only(self) -> str:
        """Why the node must run on the CPU: its first segment only the CPU provider computes exactly, or ""."""
        return next((f"segment {k} ({seg.file}) {seg.cpu_only}" for k, seg in enumerate(self.segments) if seg.cpu_only), "")

    def to_json(self) -> Json:
        return {"node": self.node, "segments": [s.to_json() for s in self.segments], "steps": [s.to_json() for s in self.steps],
                "outputs": dict(self.outputs)}

    @classmethod
    def from_json(cls, value: Any, where: str) -> Program:
        rec = _object(value, where)
        return cls(_int(rec, where, "node"), _records(rec, where, "segments", SegmentSpec.from_json),
                   _records(rec, where, "steps", step_from_json), _str_map(rec, where, "outputs"))


@dataclass(frozen=True)
class NodeStats:
    """One node's share: operations (and those beyond its own outputs), bytes it sends and receives per
    inference, bytes of weights its segments hold."""

    flops: float
    redundant_flops: float
    bytes_sent: int
    bytes_received: int
    weight_bytes: int

    def to_json(self) -> Json:
        return {"flops": self.flops, "redundant_flops": self.redundant_flops, "bytes_sent": self.bytes_sent,
                "bytes_received": self.bytes_received, "weight_bytes": self.weight_bytes}

    @classmethod
    def from_json(cls, value: Any, where: str) -> NodeStats:
        rec = _object(value, where)
        return cls(_number(rec, where, "flops"), _number(rec, where, "redundant_flops"), _int(rec, where, "bytes_sent"),
                   _int(rec, where, "bytes_received"), _int(rec, where, "weight_bytes"))


@dataclass(frozen=True)
class Stats:
    """The plan's data movement per inference (a synchronisation point: a layer whose output
    crosses nodes), its number of segments, and each node's share."""

    bytes_transferred: int
    messages: int
    sync_points: int
    segments: int
    per_node: tuple[NodeStats, ...]

    def to_json(self) -> Json:
        return {"bytes_transferred": self.bytes_transferred, "messages": self.messages, "sync_points": self.sync_points,
                "segments": self.segments, "per_node": [n.to_json() for n in self.per_node]}

    @classmethod
    def from_json(cls, value: Any, where: str) -> Stats:
        rec = _object(value, where)
        return cls(_int(rec, where, "bytes_transferred"), _int(rec, where, "messages"), _int(rec, where, "sync_points"),
                   _int(rec, where, "segments"), _records(rec, where, "per_node", NodeStats.from_json))


@dataclass(frozen=True)
class OpaqueLayer:
    """A layer whose op has no region rule (computed whole on one node)."""

    name: str
    op_type: str

    def to_json(self) -> Json:
        return {"name": self.name, "op_type": self.op_type}

    @classmethod
    def from_json(cls, value: Any, where: str) -> OpaqueLayer:
        rec = _object(value, where)
        return cls(_str(rec, where, "name"), _str(rec, where, "op_type"))


@dataclass(frozen=True)
class LayerNodeRow:
    """One node's part of a layer: the range it owns along the cut (what others receive from),
    the range it computes (owned plus recomputed halo), its operations and those beyond its own."""

    range: tuple[int, int] | None
    computes: tuple[int, int] | None
    flops: float
    redundant_flops: float

    def to_json(self) -> Json:
        return {"range": _pair_json(self.range), "computes": _pair_json(self.computes), "flops": self.flops,
                "redundant_flops": self.redundant_flops}

    @classmethod
    def from_json(cls, value: Any, where: str) -> LayerNodeRow:
        rec = _object(value, where)
        return cls(_range(rec, where, "range"), _range(rec, where, "computes"), _number(rec, where, "flops"),
                   _number(rec, where, "redundant_flops"))


def _pair_json(pair: tuple[int, int] | None) -> list[int] | None:
    return None if pair is None else list(pair)


@dataclass(frozen=True)
class WholeLayer:
    """Why a layer is computed whole: on which node, the reason in words, and whether its op has no
    region rule at all (else no axis its rule can cut is usable)."""

    node: int
    reason: str
    no_rule: bool


@dataclass(frozen=True)
class LayerRow:
    """One row of the layer table (bbgrap/report.py): how a layer is cut and where its work is."""

    name: str
    op_type: str
    cut: str  # n/c/h/w, "axis K", or "whole"
    output_shape: tuple[int, ...]
    extent: int | None  # the output's length along the cut
    flops: float
    bytes_sent: int  # bytes of its output that cross nodes
    per_node: tuple[LayerNodeRow, ...]
    whole: WholeLayer | None = None  # a layer computed whole on one node (cut "whole")

    def on_every_node(self) -> bool:
        """Every one of several nodes computes the whole layer (naive_partition.replicated, or
        halos recomputed until they cover every row)."""
        return (self.extent is not None and len(self.per_node) > 1
                and all(n.computes == (0, self.extent) for n in self.per_node))

    def to_json(self) -> Json:
        row = {"name": self.name, "op_type": self.op_type, "cut": self.cut, "output_shape": list(self.output_shape),
               "extent": self.extent, "flops": self.flops, "bytes_sent": self.bytes_sent, "per_node": [n.to_json() for n in self.per_node]}
        if self.whole is not None:
            row |= {"whole_on": self.whole.node, "reason": self.whole.reason, "no_rule": self.whole.no_rule}
        return row

    @classmethod
    def from_json(cls, value: Any, where: str) -> LayerRow:
        rec = _object(value, where)
        cut = _str(rec, where, "cut")
        whole = None
        if cut == "whole":
            whole = WholeLayer(_int(rec, where, "whole_on"), _str(rec, where, "reason"),
                               _bool(rec, where, "no_rule"))
        extent = _take(rec, where, "extent", lambda v: v is None or (_is_int(v) and v >= 0), "an integer >= 0 or null")
        return cls(_str(rec, where, "name"), _str(rec, where, "op_type"), cut, _shape(rec, where, "output_shape"), extent,
                   _number(rec, where, "flops"), _int(rec, where, "bytes_sent"), _records(rec, where, "per_node", LayerNodeRow.from_json),
                   whole)


def search_stats_from_json(value: Any, where: str) -> SearchStats:
    """The search pass's statistics (bbgrap.ir.SearchStats, which writes itself with to_json)."""
    rec = _object(value, where)
    return SearchStats(_str(rec, where, "strategy"), _number(rec, where, "threshold"), _int(rec, where, "layers"),
                       _int(rec, where, "evaluated"), _int(rec, where, "cost_calls"), _number(rec, where, "log10_total"),
                       _number(rec, where, "total"), _number(rec, where, "seconds"), _number(rec, where, "objective"),
                       _number(rec, where, "naive_objective"), _str(rec, where, "kept"))


@dataclass(frozen=True)
class Source:
    """The model file compiled, for `bbgrap-run --check` (which refuses another file at that path)."""

    path: str
    sha256: str

    def to_json(self) -> Json:
        return {"path": self.path, "sha256": self.sha256}

    @classmethod
    def from_json(cls, value: Any, where: str) -> Source:
        rec = _object(value, where)
        return cls(_str(rec, where, "path"), _str(rec, where, "sha256"))


@dataclass(frozen=True)
class RankPrediction:
    """One rank's predicted time per inference, in ms: in its segments, waiting, and its end; and each of
    its segments' in program order (what `calibrate --refine` fits a run's segments to)."""

    compute: float
    wait: float
    total: float
    segments: tuple[float, ...] = ()

    def to_json(self) -> Json:
        return {"compute": self.compute, "wait": self.wait, "total": self.total, "segments": list(self.segments)}

    @classmethod
    def from_json(cls, value: Any, where: str) -> RankPrediction:
        rec = _object(value, where)
        return cls(_number(rec, where, "compute"), _number(rec, where, "wait"), _number(rec, where, "total"),
                   _numbers(rec, where, "segments"))


# what `PredictionRecord.label` adds to the profile's path where it priced the model's layers by their measured times
LAYER_TIMES_NOTE = ", with this model's layer times"


@dataclass(frozen=True)
class PredictionRecord:
    """What `compile --profile` predicted (bbgrap/simulate.py): the profile's path and whether it
    priced this model's layers by their measured times (`layer_times`), the node count asked for and
    the one compiled, the plan's latency and each rank's time, one node's latency, the
    speed-up, the latency of every node count it simulated, and which of the profile's nodes the
    plan's are (the fastest where it has fewer: `compiler.fastest_nodes`), with their host names
    where calibrate recorded them ("" where not)."""

    profile: str
    layer_times: bool
    requested_nodes: int
    nodes: int
    latency_ms: float
    ranks: tuple[RankPrediction, ...]
    one_node_ms: float
    speedup: float
    candidates_ms: Mapping[int, float]
    profile_nodes: tuple[int, ...]
    hosts: tuple[str, ...]

    @property
    def label(self) -> str:
        """The profile as compile, bbgrap-run and inspect name it: its path, and LAYER_TIMES_NOTE where
        it priced the model's layers by their measured times."""
        return self.profile + (LAYER_TIMES_NOTE if self.layer_times else "")

    @property
    def on_picked_nodes(self) -> bool:
        """Whether the plan runs on other nodes of the profile than its first ones, in order (its fastest,
        where it has fewer nodes than the profile: `compiler.fastest_nodes`)."""
        return self.profile_nodes != tuple(range(self.nodes))

    def to_json(self) -> Json:
        return {"profile": self.profile, "layer_times": self.layer_times, "requested_nodes": self.requested_nodes, "nodes": self.nodes,
                "plan": {"nodes": self.nodes, "latency_ms": self.latency_ms, "ranks": [r.to_json() for r in self.ranks]},
                "one_node_ms": self.one_node_ms, "speedup": self.speedup,
                "candidates_ms": {str(n): ms for n, ms in sorted(self.candidates_ms.items())},
                "profile_nodes": list(self.profile_nodes), "hosts": list(self.hosts)}

    @classmethod
    def from_json(cls, value: Any, where: str) -> PredictionRecord:
        rec = _object(value, where)
        plan = _object(_take(rec, where, "plan", lambda v: isinstance(v, dict), "an object"), _path(where, "plan"))
        candidates = _take(rec, where, "candidates_ms", lambda v: isinstance(v, dict) and all(
            k.isdigit() and _is_number(ms) for k, ms in v.items()), "an object of node counts and latencies")
        nodes = _int(rec, where, "nodes", positive=True)
        profile_nodes = tuple(_take(rec, where, "profile_nodes", lambda v: isinstance(v, list) and len(v) == nodes and all(
            _is_int(n) and n >= 0 for n in v), f"a list of {nodes} node numbers"))
        hosts = _strs(rec, where, "hosts")
        if len(hosts) != nodes:
            raise PlanSchemaError(f"'{_path(where, 'hosts')}' does not hold one host name for each of the {nodes} nodes")
        return cls(_str(rec, where, "profile"), _bool(rec, where, "layer_times"), _int(rec, where, "requested_nodes", positive=True), nodes,
                   _number(plan, _path(where, "plan"), "latency_ms"), _records(plan, _path(where, "plan"), "ranks", RankPrediction.from_json),
                   _number(rec, where, "one_node_ms"), _number(rec, where, "speedup"), {int(k): float(ms) for k, ms in candidates.items()},
                   profile_nodes, hosts)


def planner_stats_from_json(value: Any, where: str) -> PlannerStats:
    """The plan-network pass's statistics (bbgrap.ir.PlannerStats, which writes itself with to_json)."""
    rec = _object(value, where)
    exact = _bool(rec, where, "exact")
    return PlannerStats(_str(rec, where, "planner"), _int(rec, where, "layers"), _int(rec, where, "candidates"),
                        _int(rec, where, "evaluated"), exact, *(_number(rec, where, k) for k in (
                            "synchronous_ms", "timeline_ms", "start_synchronous_ms", "start_timeline_ms", "seconds")))


@dataclass(frozen=True)
class PlannerRecord:
    """What a whole-network planner (compile --planner) did: its name, which plan was kept (its own
    or the per-layer search's: its own where the simulator predicted it clearly faster with `profile`), both
    predicted latencies, and the plan-network pass's statistics."""

    planner: str
    kept: str
    profile: str
    planner_ms: float
    greedy_ms: float
    stats: PlannerStats

    def to_json(self) -> Json:
        return {"planner": self.planner, "kept": self.kept, "profile": self.profile, "planner_ms": self.planner_ms,
                "greedy_ms": self.greedy_ms, "stats": self.stats.to_json()}

    @classmethod
    def from_json(cls, value: Any, where: str) -> PlannerRecord:
        rec = _object(value, where)
        return cls(_str(rec, where, "planner"), _str(rec, where, "kept"), _str(rec, where, "profile"), _number(rec, where, "planner_ms"),
                   _number(rec, where, "greedy_ms"), _record(rec, where, "stats", planner_stats_from_json))


@dataclass(frozen=True)
class RecomputeRecord:
    """Whether recompute-halos' plan was kept (`kept`) or the same plan receiving every halo, as the
    simulator judged them on `profile`, and which pricing of the pass's halos made the plan judged
    (`pricing`, one of RECOMPUTE_PRICINGS): the predicted latencies, in ms, of the pass's plan
    with each operation priced by its kind's measured cost (and a receive by its whole segment
    boundary), with every operation alike (and a receive by its latency and segment alone), and
    of the plan receiving every halo."""

    kept: bool
    profile: str
    pricing: str
    by_kind_ms: float
    alike_ms: float
    without_ms: float

    @property
    def with_ms(self) -> float:
        """The predicted latency of the pass's plan as judged: its chosen pricing's."""
        return self.by_kind_ms if self.pricing == "by kind" else self.alike_ms

    def summary(self) -> str:
        """One line: the three predictions and what was kept (compile's log, `inspect`)."""
        return (f"recompute-halos: predicted {self.by_kind_ms:.3f} ms with operations priced by kind, {self.alike_ms:.3f} ms "
                f"alike, {self.without_ms:.3f} ms receiving every halo ({self.profile}): "
                f"{'kept, priced ' + self.pricing if self.kept else 'left out, every halo received'}")

    def to_json(self) -> Json:
        return {"kept": self.kept, "profile": self.profile, "pricing": self.pricing, "by_kind_ms": self.by_kind_ms,
                "alike_ms": self.alike_ms, "without_ms": self.without_ms}

    @classmethod
    def from_json(cls, value: Any, where: str) -> RecomputeRecord:
        rec = _object(value, where)
        kept = _bool(rec, where, "kept")
        pricing = _take(rec, where, "pricing", lambda v: v in RECOMPUTE_PRICINGS, " or ".join(map(repr, RECOMPUTE_PRICINGS)))
        return cls(kept, _str(rec, where, "profile"), pricing, _number(rec, where, "by_kind_ms"), _number(rec, where, "alike_ms"),
                   _number(rec, where, "without_ms"))


RECOMPUTE_PRICINGS = ("by kind", "alike")  # how recompute-halos priced a halo's extra operations (RecomputeRecord)


WHOLE_SHARE = 0.01  # under compile --balance, no layer of more than this share of the model's work whole on one node


@dataclass(frozen=True)
class BalanceRecord:
    """What compile --balance did: the bound (max/min of the nodes' work over their speeds), the
    fastest predicted plan's spread and largest share of the work computed whole on one node, the
    plan kept (`kept`: "the fastest predicted plan" where it was within the bound, else which one)
    with its spread and share, and both predicted latencies in ms (equal where nothing changed)."""

    bound: float
    fastest_spread: float
    fastest_whole: float
    kept: str
    spread: float
    whole: float
    fastest_ms: float
    kept_ms: float

    @staticmethod
    def said(spread: float, whole: float) -> str:
        """How even a plan is, in words (compile's log, inspect)."""
        share = f" and computes a layer of {100 * whole:.2f} % of the work whole on one node" if whole > WHOLE_SHARE else ""
        return f"leaves the nodes' work {spread:.2f} apart{share}"

    def summary(self) -> str:
        """One line (compile's log, `inspect`)."""
        if self.kept == FASTEST_PLAN:
            return f"balance: at most {self.bound:g} asked; the fastest predicted plan {self.said(self.spread, self.whole)}"
        return (f"balance: at most {self.bound:g} asked; the fastest predicted plan {self.said(self.fastest_spread, self.fastest_whole)}, "
                f"so {self.kept} was kept, which {self.said(self.spread, self.whole)}: predicted {self.kept_ms:.3f} ms against "
                f"{self.fastest_ms:.3f}")

    def to_json(self) -> Json:
        return {"bound": self.bound, "fastest_spread": self.fastest_spread, "fastest_whole": self.fastest_whole, "kept": self.kept,
                "spread": self.spread, "whole": self.whole, "fastest_ms": self.fastest_ms, "kept_ms": self.kept_ms}

    @classmethod
    def from_json(cls, value: Any, where: str) -> BalanceRecord:
        rec = _object(value, where)
        return cls(_number(rec, where, "bound"), _number(rec, where, "fastest_spread"), _number(rec, where, "fastest_whole"),
                   _str(rec, where, "kept"), _number(rec, where, "spread"), _number(rec, where, "whole"),
                   _number(rec, where, "fastest_ms"), _number(rec, where, "kept_ms"))


FASTEST_PLAN = "the fastest predicted plan"  # BalanceRecord.kept where the bound changed nothing


def _numbers(rec: Mapping[str, Any], where: str, key: str) -> tuple[float, ...]:
    value = _take(rec, where, key, lambda v: isinstance(v, list) and all(_is_number(x) and x >= 0 for x in v),
                  "a list of numbers >= 0")
    return tuple(float(x) for x in value)


@dataclass(frozen=True)
class MemoryRecord:
    """The plan's memory per node as compile estimated it (fit-memory's model, bbgrap/cost.py), in
    MB: the weights the node reads, its live activations, and the estimate counting onnxruntime's
    copies of the weights; the limit it was fitted to (cluster.memory_mb, empty: none; bbgrap-run
    keeps such a plan's activations in NCHW between segments, as the estimate assumes); and whether
    onnxruntime prepacks the weights (false where the plan fits only without its prepacked copies:
    bbgrap-run then turns prepacking off)."""

    prepack: bool
    limit_mb: tuple[float, ...]
    weights_mb: tuple[float, ...]
    activations_mb: tuple[float, ...]
    estimate_mb: tuple[float, ...]

    def to_json(self) -> Json:
        return {"prepack": self.prepack, "limit_mb": list(self.limit_mb), "weights_mb": list(self.weights_mb),
                "activations_mb": list(self.activations_mb), "estimate_mb": list(self.estimate_mb)}

    @classmethod
    def from_json(cls, value: Any, where: str) -> MemoryRecord:
        rec = _object(value, where)
        prepack = _bool(rec, where, "prepack")
        return cls(prepack, *(_numbers(rec, where, k) for k in ("limit_mb", "weights_mb", "activations_mb", "estimate_mb")))


@dataclass(frozen=True)
class CompileRecord:
    """How the plan was compiled: the cut direction, the search threshold and node speeds, the passes
    run, the search's statistics (None without a search), the layer table, the seconds it took
    (import to lowering), and the model file (None for a plan built from a model in memory)."""

    direction: Direction
    threshold: float
    speeds: tuple[float, ...]
    passes: tuple[str, ...]
    search: SearchStats | None
    layer_table: tuple[LayerRow, ...]
    compile_seconds: float
    source: Source | None = None
    prediction: PredictionRecord | None = None  # with a cluster profile (compile --profile)
    planner: PlannerRecord | None = None  # with a whole-network planner (compile --planner)
    memory: MemoryRecord | None = None  # None in plans written before it was recorded: prepacked weights
    recompute: RecomputeRecord | None = None  # where recompute-halos ran and was judged (None in older plans)
    # the layers whose shapes depend on the input's values (Layer.shape_from_values), held at the
    # sample input's: an input that changes them cannot run (empty in older plans)
    shapes_from_values: tuple[str, ...] = ()
    balance: BalanceRecord | None = None  # with compile --balance (None without, and in older plans)

    @property
    def prepack(self) -> bool:
        """Whether onnxruntime may prepack the plan's weights (fit-memory's choice)."""
        return self.memory is None or self.memory.prepack

    @property
    def fitted_to_memory(self) -> bool:
        """Whether the plan was fitted to its nodes' memory (cluster.memory_mb)."""
        return self.memory is not None and bool(self.memory.limit_mb)

    def to_json(self) -> Json:
        out = {"direction": self.direction.value, "threshold": self.threshold, "speeds": list(self.speeds), "passes": list(self.passes),
               "search": self.search.to_json() if self.search is not None else None,
               "layer_table": [r.to_json() for r in self.layer_table], "compile_seconds": self.compile_seconds,
               "prediction": self.prediction.to_json() if self.prediction is not None else None,
               "planner": self.planner.to_json() if self.planner is not None else None,
               "memory": self.memory.to_json() if self.memory is not None else None,
               "recompute": self.recompute.to_json() if self.recompute is not None else None,
               "shapes_from_values": list(self.shapes_from_values),
               "balance": self.balance.to_json() if self.balance is not None else None}
        return out if self.source is None else out | {"source": self.source.to_json()}

    @classmethod
    def from_json(cls, value: Any, where: str) -> CompileRecord:
        """Read from the manifest's top level, where these keys sit beside the plan's."""
        rec = _object(value, where)
        speeds = _take(rec, where, "speeds", lambda v: isinstance(v, list) and all(_is_number(s) and s > 0 for s in v),
                       "a list of positive numbers")
        search = _optional_record(rec, where, "search", search_stats_from_json)
        source = _record(rec, where, "source", Source.from_json) if "source" in rec else None  # absent: a model in memory
        prediction = _optional_record(rec, where, "prediction", PredictionRecord.from_json)
        planner = _optional_record(rec, where, "planner", PlannerRecord.from_json)
        memory = _optional_record(rec, where, "memory", MemoryRecord.from_json)
        recompute = _optional_record(rec, where, "recompute", RecomputeRecord.from_json)
        balance = _optional_record(rec, where, "balance", BalanceRecord.from_json) if "balance" in rec else None
        direction = Direction(_take(rec, where, "direction", lambda v: v in DIRECTIONS, f"one of {', '.join(DIRECTIONS)}"))
        return cls(direction, _number(rec, where, "threshold"), tuple(speeds), _strs(rec, where, "passes"),
                   search, _records(rec, where, "layer_table", LayerRow.from_json), _number(rec, where, "compile_seconds"), source,
                   prediction, planner, memory, recompute,
                   _strs(rec, where, "shapes_from_values") if "shapes_from_values" in rec else (), balance)


@dataclass(frozen=True)
class Plan:
    """The manifest: the plan's identity (`plan_id`, the sha256 of every other file; empty until
    bbgrap.plan.write_plan writes it), the model's name, node count, data movement (naive or
    optimized), layer count and opaque layers, inputs and outputs, messages, one program per node,
    the statistics, and how it was compiled."""

    model: str
    nodes: int
    movement: Movement
    layers: int
    opaque: tuple[OpaqueLayer, ...]
    inputs: tuple[InputSpec, ...]
    outputs: tuple[TensorSpec, ...]
    messages: tuple[MessageSpec, ...]
    programs: tuple[Program, ...]
    stats: Stats
    compiled: CompileRecord
    plan_id: str = ""
    files: Mapping[str, str] = field(default_factory=dict)  # path in the plan -> sha256
    # the file every segment's large weights are in (ONNX external data, relative to the plan
    # directory), one copy of each whatever the number of nodes that use it; None: all inline
    weights: str | None = None

    def node_files(self, nodes: Iterable[int]) -> list[str]:
        """The segment files of these nodes, in program order."""
        return [seg.file for n in nodes for seg in self.programs[n].segments]

    def files_read_by(self, nodes: Iterable[int]) -> list[str]:
        """Every file these nodes read: the shared weights, then their segments in program order."""
        return ([self.weights] if self.weights is not None else []) + self.node_files(nodes)

    def to_json(self) -> Json:
        return {"format": PLAN_FORMAT, "version": PLAN_VERSION, "plan_id": self.plan_id, "files": dict(self.files),
                "model": self.model, "nodes": self.nodes, "movement": self.movement.value, "layers": self.layers,
                "opaque": [o.to_json() for o in self.opaque], "inputs": [i.to_json() for i in self.inputs],
                "outputs": [o.to_json() for o in self.outputs], "messages": [m.to_json() for m in self.messages],
                "programs": [p.to_json() for p in self.programs], "weights": self.weights, "stats": self.stats.to_json(),
                **self.compiled.to_json()}

    @classmethod
    def from_json(cls, value: Any, where: str = "") -> Plan:
        """The plan in a manifest; raises PlanVersionError for another format version and
        PlanSchemaError, naming the field, for anything else this schema does not hold."""
        if not isinstance(value, dict) or value.get("format") != PLAN_FORMAT:
            raise PlanSchemaError(f"not a bbgrap plan manifest (no \"format\": \"{PLAN_FORMAT}\")")
        if value.get("version") != PLAN_VERSION:
            raise PlanVersionError(value.get("version"))
        rec = value
        nodes = _int(rec, where, "nodes", positive=True)
        files = _take(rec, where, "files", lambda v: isinstance(v, dict) and all(isinstance(s, str) for s in v.values()),
                      "an object of plan files and their sha256")
        outside = [p for p in files if not safe_relative(p)]
        if outside:
            raise PlanSchemaError(f"'files' names '{outside[0]}', which is not a path inside the plan directory")
        inputs = _records(rec, where, "inputs", InputSpec.from_json)
        outputs = _records(rec, where, "outputs", TensorSpec.from_json)
        for key, specs in (("inputs", inputs), ("outputs", outputs)):
            if not specs:
                raise PlanSchemaError(f"'{key}' is empty")
        plan = cls(model=_str(rec, where, "model"), nodes=nodes, movement=_movement(rec, where), layers=_int(rec, where, "layers"),
                   opaque=_records(rec, where, "opaque", OpaqueLayer.from_json), inputs=inputs, outputs=outputs,
                   messages=_records(rec, where, "messages", MessageSpec.from_json),
                   programs=_records(rec, where, "programs", Program.from_json), stats=_record(rec, where, "stats", Stats.from_json),
                   compiled=CompileRecord.from_json(rec, where), plan_id=_str(rec, where, "plan_id"), files=dict(files),
                   weights=_take(rec, where, "weights", lambda v: v is None or isinstance(v, str), "a file name or null"))
        plan.check()
        return plan

    def _check_values(self, n: int, prog: Program, messages: Mapping[int, MessageSpec]) -> None:
        """Program `n` reads only values it has by then: the model's inputs, what its segments made
        and the messages it waited for, in step order (the runtime looks each one up by name)."""
        have = {spec.value for spec in self.inputs}
        for k, step in enumerate(prog.steps):
            where = f"'programs[{n}].steps[{k}]'"
            if isinstance(step, RunStep):
                seg = prog.segments[step.segment]
                missing = [v for v in seg.inputs if v not in have]
                if missing:
                    raise PlanSchemaError(f"{where} runs segment {step.segment}, which reads '{missing[0]}', a value program {n} "
                                          "does not have by then")
                have.update(seg.outputs)
            elif isinstance(step, SendStep):
                if step.value not in have:
                    raise PlanSchemaError(f"{where} sends '{step.value}', a value program {n} does not have by then")
            else:
                have.add(messages[step.message].value)
        missing = [v for v in prog.outputs.values() if v not in have]
        if missing:
            raise PlanSchemaError(f"'programs[{n}].outputs' names '{missing[0]}', a value program {n} never has")

    def check(self) -> None:
        """What crosses records: messages between existing nodes, of a shape their region has, one
        program per node whose steps name its own segments and messages and read only values it
        has by then, segment files the plan lists, one stats entry per node."""
        for k, m in enumerate(self.messages):
            for key in ("src", "dst"):
                if getattr(m, key) >= self.nodes:
                    raise PlanSchemaError(f"'messages[{k}].{key}' is not a node (0 to {self.nodes - 1})")
        if len(self.programs) != self.nodes:
            raise PlanSchemaError(f"'programs' does not hold one program for each of the {self.nodes} nodes")
        if self.weights is not None and self.weights not in self.files:
            raise PlanSchemaError(f"'weights' ({self.weights}) is not one of the plan's 'files'")
        messages = {m.id: m for m in self.messages}
        for n, prog in enumerate(self.programs):
            if prog.node != n:
                raise PlanSchemaError(f"'programs[{n}].node' is {prog.node}, not {n}")
            for k, seg in enumerate(prog.segments):
                if seg.file not in self.files:
                    raise PlanSchemaError(f"'programs[{n}].segments[{k}].file' ({seg.file}) is not one of the plan's 'files'")
            for k, step in enumerate(prog.steps):
                where = f"'programs[{n}].steps[{k}]'"
                if isinstance(step, RunStep):
                    if step.segment >= len(prog.segments):
                        raise PlanSchemaError(f"{where} runs segment {step.segment}; program {n} has {len(prog.segments)}")
                    continue
                msg = messages.get(step.message)
                if msg is None:
                    raise PlanSchemaError(f"{where} names message {step.message}, which 'messages' lacks")
                if (msg.src if isinstance(step, SendStep) else msg.dst) != n:
                    raise PlanSchemaError(f"{where} {step.op}s message {step.message}, which goes from node {msg.src} to node {msg.dst}")
            self._check_values(n, prog, messages)
        for k, m in enumerate(self.messages):
            if m.shape != tuple(b - a for a, b in m.region):
                raise PlanSchemaError(f"'messages[{k}].shape' {list(m.shape)} is not the size of its region {[list(r) for r in m.region]}")
            if not _is_dtype(m.dtype):
                raise PlanSchemaError(f"'messages[{k}].dtype' ({m.dtype}) is not a numpy element type")
        if len(self.stats.per_node) != self.nodes:
            raise PlanSchemaError(f"'stats.per_node' does not hold one entry for each of the {self.nodes} nodes")
