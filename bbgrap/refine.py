"""A cluster profile corrected by a measured run of a plan compiled with it (`bbgrap calibrate --refine`).

calibrate measures each node with small probes (one op kind at a time, or each layer of the model run
whole). A plan's pieces run otherwise: smaller, after other segments and waits, beside the node's
neighbours on a shared core or memory bus. Where a node's pieces take longer than the simulator
predicted, the planner cut it too large a share; where a short segment costs more than its ops, it put
too many boundaries in. A run of the plan measures both: each segment's median time on each rank
(`bbgrap-run --json`'s `profile_ms`; for a node under a CPU quota its thread's CPU time over its share:
`MeasuredRun.checks`), against the time compile predicted for it (the plan's `prediction`). Per node, the
line through its segments' (predicted, measured) times (least squares)

    measured_k = a · predicted_k + b,     node' = node.faster(1 / a),  segment_s' = max(0, a · segment_s + b)

scales every figure of the node by a (throughputs over a, fixed costs and measured layer times times a)
and adds b to each segment's fixed cost, so that the simulator would have predicted the measured times
for this plan's segments; compiling again with the refined profile cuts each layer in the proportions the
nodes showed and weighs a boundary at what it cost. Where a rank ran fewer than MIN_FIT_SEGMENTS
segments, their predictions do not differ, the line's slope is not positive, or the run's segments do
not match the plan's (a run without its segments' times), the node is scaled by its total measured over predicted time alone (a = that
ratio, b = 0). A node the run says nothing of (a rank that computed nothing, a node of the profile the plan
did not use) takes the median a and b of the measured ones: an idle node kept as it was would come out
faster than every measured one only because it was not measured. Waiting is not a node's speed and is left
out on both sides.

Several runs (plans of several models, or directions, all compiled with the one profile) refine it together:
each node's line goes through the segments of every run it took part in, so that it rests on more segments,
and of more sizes, than one plan runs on a node. Runs of plans compiled with different profiles are refused:
their predictions are on different scales.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from bbgrap.cluster import ClusterProfile, NodeProfile, fit_line
from bbgrap.ir import BBGrapError
from bbgrap.paths import same_file
from bbgrap.plan_schema import PlanSchemaError, PredictionRecord

MIN_FIT_SEGMENTS = 3  # segments a rank must have run for a line through them (else its total's ratio alone)


@dataclass(frozen=True)
class Correction:
    """How a node's figures change: every one scaled by `scale`, then `extra_s` added to each segment's
    fixed cost (`segment_s`, at least 0 after it); `fitted`: from a line through its rank's segments
    (else its total's ratio)."""

    scale: float
    extra_s: float = 0.0
    fitted: bool = False

    def apply(self, node: NodeProfile) -> NodeProfile:
        scaled = node.faster(1.0 / self.scale)
        return replace(scaled, segment_s=max(0.0, scaled.segment_s + self.extra_s))


@dataclass(frozen=True)
class RankCheck:
    """One rank of a measured run: its node in the profile, its measured and predicted ms per inference
    in its segments and sends, and each segment's (measured: median; empty where the run or the plan
    did not record them); `share`: the node's CPU quota share where its measured times are its thread's
    CPU time over it (1: the wall clock's); `run`: the file of the run it is of."""

    rank: int
    node: int
    measured_ms: float
    predicted_ms: float
    share: float = 1.0
    measured_segments: tuple[float, ...] = ()
    predicted_segments: tuple[float, ...] = ()
    run: str = ""  # the run's file

    @property
    def measured(self) -> bool:
        """Whether the rank computed anything (an idle rank says nothing of its node's speed)."""
        return self.predicted_ms > 0 and self.measured_ms > 0

    @property
    def factor(self) -> float:
        """Measured over predicted, in all (1 where it computed nothing)."""
        return self.measured_ms / self.predicted_ms if self.measured else 1.0

    @property
    def segments(self) -> tuple[tuple[float, float], ...]:
        """Its segments' (predicted, measured) times in ms, where the run and the plan recorded them alike."""
        m, p = self.measured_segments, self.predicted_segments
        return tuple(zip(p, m)) if len(m) == len(p) else ()

    def correction(self) -> Correction:
        """Its node's correction from this run alone (`correction`)."""
        return correction([self])


def correction(checks: Sequence[RankCheck]) -> Correction:
    """A node's correction from the ranks that ran on it (one per run): the line through all their segments'
    (predicted, measured) times, least squares, where they give one (module docstring: every rank has its
    segments, at least MIN_FIT_SEGMENTS in all, of different predictions, on a line of positive slope), else
    their totals' measured over predicted time."""
    ran = [c for c in checks if c.measured]
    if not ran:
        return Correction(1.0)
    points = [point for c in ran for point in c.segments]
    if all(c.segments for c in ran) and len(points) >= MIN_FIT_SEGMENTS and len({p for p, _ in points}) > 1:
        intercept, slope = fit_line([p for p, _ in points], [m for _, m in points])
        if slope > 0:
            return Correction(slope, intercept / 1e3, fitted=True)
    return Correction(math.fsum(c.measured_ms for c in ran) / math.fsum(c.predicted_ms for c in ran))


@dataclass(frozen=True)
class MeasuredRun:
    """What refining needs of a `bbgrap-run --json` result: each rank's ms per inference in its
    segments and sends on the wall clock and, where the run was traced, its thread's CPU time in them
    (None where not); each segment's median on both clocks (empty where not recorded); and compile's
    prediction for the plan."""

    source: str
    wall_ms: tuple[float, ...]
    cpu_ms: tuple[float, ...] | None
    prediction: PredictionRecord
    wall_segments: tuple[tuple[float, ...], ...] = ()
    cpu_segments: tuple[tuple[float, ...], ...] = ()

    def checks(self, profile: ClusterProfile) -> list[RankCheck]:
        """Each rank against its prediction. A node under a CPU quota (`NodeProfile.cpu_share` < 1) is
        stopped whenever its quota runs out, and a rank that waits much spends little of it: its
        segments then run at full speed and the stops fall in its waits, where the simulator spreads
        them over all its time. For such a node the rank's CPU time over its share is the time its work
        takes (one thread per rank, as bbgrap-run gives a quota of less than a core); a run without it
        (not traced) is refused."""
        checks = []
        for r, wall in enumerate(self.wall_ms):
            node = self.prediction.profile_nodes[r]
            share = profile.node(node).cpu_share
            predicted = self.prediction.ranks[r]
            if share >= 1:
                segments = self.wall_segments[r] if self.wall_segments else ()
                checks.append(RankCheck(r, node, wall, predicted.compute, 1.0, segments, predicted.segments, self.source))
            elif self.cpu_ms is None:
                raise BBGrapError(f"--refine {self.source}: node {node} is under a CPU quota ({share:g} of its threads' time in "
                                  f"{profile.source}), whose stops fall where its rank waits; run the plan with --trace FILE "
                                  "too, so that each rank's CPU time is measured")
            else:
                segments = tuple(t / share for t in self.cpu_segments[r]) if self.cpu_segments else ()
                checks.append(RankCheck(r, node, self.cpu_ms[r] / share, predicted.compute, share, segments, predicted.segments,
                                        self.source))
        return checks


def read_run(path: str) -> MeasuredRun:
    """The run in `path` (`mpirun -n N bbgrap-run PLAN --json > path`); every problem is one BBGrapError
    line naming the file and how to make a good one."""
    remake = "run the plan as `mpirun -n N bbgrap-run PLAN --json > RUN.json`, one rank per node"
    try:
        with open(path, encoding="utf-8") as fh:
            data: Any = json.load(fh)
    except OSError as exc:
        raise BBGrapError(f"--refine {path}: cannot read it ({exc.strerror or type(exc).__name__})") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BBGrapError(f"--refine {path}: not bbgrap-run's JSON; {remake}") from None
    if not isinstance(data, dict) or "latency_ms" not in data or "nodes" not in data:
        raise BBGrapError(f"--refine {path}: not bbgrap-run's JSON; {remake}")
    if data.get("mode") != "mpi":
        raise BBGrapError(f"--refine {path}: the plan ran with all its nodes in one process, which measures no node of "
                          f"the cluster; {remake}")
    if data.get("prediction") is None:
        raise BBGrapError(f"--refine {path}: the plan was compiled without --profile, so there is no prediction to "
                          "correct; compile it with --profile FILE, run it, then refine FILE")
    try:
        prediction = PredictionRecord.from_json(data["prediction"], "prediction")
    except PlanSchemaError as exc:
        raise BBGrapError(f"--refine {path}: {exc}; {remake}") from None
    times = data.get("profile_ms")
    ranks = prediction.nodes

    def has(keys: tuple[str, ...]) -> bool:
        return isinstance(times, list) and all(isinstance(t, dict) and all(
            isinstance(t.get(k), (int, float)) and math.isfinite(t[k]) and t[k] >= 0 for k in keys) for t in times)

    if not isinstance(times, list) or len(times) != ranks or len(prediction.ranks) != ranks or not has(("compute", "send")):
        raise BBGrapError(f"--refine {path}: 'profile_ms' does not hold each of the {ranks} ranks' compute and send times; {remake}")
    cpu = tuple(float(t["compute_cpu"]) + float(t["send_cpu"]) for t in times) if has(("compute_cpu", "send_cpu")) else None

    def segments(key: str) -> tuple[tuple[float, ...], ...]:
        """Each rank's segments' medians under `key` (empty where a rank lacks them: `segments_cpu` of a run without --trace)."""
        got = [t.get(key) for t in times]
        if not all(isinstance(g, list) and all(isinstance(x, (int, float)) and math.isfinite(x) and x >= 0 for x in g) for g in got):
            return ()
        return tuple(tuple(float(x) for x in g) for g in got)

    return MeasuredRun(path, tuple(float(t["compute"]) + float(t["send"]) for t in times), cpu, prediction,
                       segments("segments"), segments("segments_cpu"))


def refine(profile: ClusterProfile, runs: Sequence[MeasuredRun]) -> tuple[ClusterProfile, list[RankCheck]]:
    """`profile` with each node the runs used corrected by the ranks that ran on it (`correction`, module
    docstring), and the checks. Refused (one line) where a run's plan was compiled with another profile
    (where the path it was compiled with names a file here)."""
    checks: list[RankCheck] = []
    used = 0
    for run in runs:
        compiled_with = run.prediction.profile
        if os.path.exists(compiled_with) and not same_file(compiled_with, profile.source):
            raise BBGrapError(f"--refine {run.source}: its plan was compiled with the profile {compiled_with}, not "
                              f"{profile.source}; refine that profile by it, or give only runs of plans compiled with "
                              f"{profile.source}")
        checks += run.checks(profile)
        used = max(used, max(run.prediction.profile_nodes, default=0) + 1)
    # a profile listing fewer nodes than the plans' stands for its last node on the rest (`ClusterProfile.node`):
    # each gets a table of its own, refined by its own ranks
    nodes = [profile.node(n) for n in range(max(len(profile.nodes), used))]
    measured = {n: correction([c for c in checks if c.node == n]) for n in sorted({c.node for c in checks if c.measured})}
    if not measured:
        raise BBGrapError(f"--refine {', '.join(r.source for r in runs)}: no rank computed anything in the "
                          f"run{'s' if len(runs) > 1 else ''}; nothing to refine by")
    rest = Correction(statistics.median(c.scale for c in measured.values()), statistics.median(c.extra_s for c in measured.values()))
    return replace(profile, nodes=tuple(measured.get(n, rest).apply(node) for n, node in enumerate(nodes))), checks


def how(fix: Correction, segments: int) -> str:
    """What a correction does to a node, in words."""
    if fix.fitted:
        return f"its {segments} segments on a line: its node's times x{fix.scale:.3f}, {fix.extra_s * 1e6:+.1f} us per segment"
    return f"its node's times x{fix.scale:.3f}"


def describe(checks: Sequence[RankCheck]) -> list[str]:
    """A line per rank: measured against predicted, and (of one run) how its node's figures change; of
    several runs, their file before each rank's line and then a line per node: how the line through all
    its segments changes it."""
    lines = []
    several = len({c.run for c in checks}) > 1
    for c in checks:
        head = (f"{c.run}: " if several else "") + f"rank {c.rank} (node {c.node}): "
        if not c.measured:
            lines.append(head + "computed nothing" + ("" if several else "; taken to be off as the measured ranks, in their median"))
            continue
        clock = f" (its CPU time over its quota's share {c.share:g})" if c.share < 1 else ""
        fix = "" if several else ": " + how(c.correction(), len(c.measured_segments))
        lines.append(head + f"{c.measured_ms:.2f} ms per inference in its segments and sends{clock}, {c.predicted_ms:.2f} predicted{fix}")
    if several:
        measured = sorted({c.node for c in checks if c.measured})
        for n in measured:
            ran = [c for c in checks if c.node == n and c.measured]
            lines.append(f"node {n}, over {len(ran)} run{'s' if len(ran) > 1 else ''}: " + how(correction(ran), sum(len(c.segments) for c in ran)))
        for n in sorted({c.node for c in checks} - set(measured)):
            lines.append(f"node {n}: computed nothing in any run; taken to be off as the measured nodes, in their median")
    return lines
