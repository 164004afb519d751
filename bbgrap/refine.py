"""A cluster profile corrected by a measured run of a plan compiled with it (`bbgrap calibrate --refine`).

calibrate measures each node with small probes (one op kind at a time, or each layer of the model run
whole). A plan's pieces run otherwise: smaller, after other segments, beside the node's neighbours on a
shared core or memory bus. Where a node's pieces take longer than the simulator predicted, the planner
cut it too large a share. A run of the plan measures exactly that: each rank's time in its segments and
sends (`bbgrap-run --json`'s `profile_ms`, the mean per inference; for a node under a CPU quota its
thread's CPU time over its share: `MeasuredRun.checks`), against the time compile predicted for it (the
plan's `prediction`). Refining divides every figure of that rank's node by their ratio

    f_n = measured_n / predicted_n,     node_n' = node_n.faster(1 / f_n)

(throughputs over f_n, fixed costs and measured layer times times f_n), so that the simulator would
have predicted the measured time for this plan's mix of work; compiling again with the refined profile
cuts each layer in the proportions the nodes showed. A node the run says nothing of (a rank that computed
nothing, a node of the profile the plan did not use) is taken to be off as the measured ones are, by the
median of their ratios: an idle node kept as it was would come out faster than every measured one only
because it was not measured. Waiting is not a node's speed and is left out on both sides.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from bbgrap.cluster import ClusterProfile
from bbgrap.ir import BBGrapError
from bbgrap.paths import same_file
from bbgrap.plan_schema import PlanSchemaError, PredictionRecord


@dataclass(frozen=True)
class RankCheck:
    """One rank of a measured run: its node in the profile, its measured and predicted ms per inference
    in its segments and sends, and their ratio (1 where it computed nothing); `share`: the node's CPU
    quota share where its measured time is its thread's CPU time over it (1: the wall clock's)."""

    rank: int
    node: int
    measured_ms: float
    predicted_ms: float
    share: float = 1.0

    @property
    def measured(self) -> bool:
        """Whether the rank computed anything (an idle rank says nothing of its node's speed)."""
        return self.predicted_ms > 0 and self.measured_ms > 0

    @property
    def factor(self) -> float:
        return self.measured_ms / self.predicted_ms if self.measured else 1.0


@dataclass(frozen=True)
class MeasuredRun:
    """What refining needs of a `bbgrap-run --json` result: each rank's ms per inference in its
    segments and sends on the wall clock and, where the run was traced, its thread's CPU time in them
    (None where not), and compile's prediction for the plan."""

    source: str
    wall_ms: tuple[float, ...]
    cpu_ms: tuple[float, ...] | None
    prediction: PredictionRecord

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
            predicted = self.prediction.ranks[r].compute
            if share >= 1:
                checks.append(RankCheck(r, node, wall, predicted))
            elif self.cpu_ms is None:
                raise BBGrapError(f"--refine {self.source}: node {node} is under a CPU quota ({share:g} of its threads' time in "
                                  f"{profile.source}), whose stops fall where its rank waits; run the plan with --trace FILE "
                                  "too, so that each rank's CPU time is measured")
            else:
                checks.append(RankCheck(r, node, self.cpu_ms[r] / share, predicted, share))
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
    return MeasuredRun(path, tuple(float(t["compute"]) + float(t["send"]) for t in times), cpu, prediction)


def refine(profile: ClusterProfile, run: MeasuredRun) -> tuple[ClusterProfile, list[RankCheck]]:
    """`profile` with each node the run used divided by its rank's `RankCheck.factor` (module
    docstring), and the checks. Refused (one line) where the run's plan was compiled with another
    profile (where the path it was compiled with names a file here)."""
    pred = run.prediction
    if os.path.exists(pred.profile) and not same_file(pred.profile, profile.source):
        raise BBGrapError(f"--refine {run.source}: its plan was compiled with the profile {pred.profile}, not "
                          f"{profile.source}; give --profile {pred.profile}")
    checks = run.checks(profile)
    # a profile listing fewer nodes than the plan's stands for its last node on the rest (`ClusterProfile.node`):
    # each gets a table of its own, refined by its own rank
    nodes = [profile.node(n) for n in range(max(len(profile.nodes), max(pred.profile_nodes, default=0) + 1))]
    measured = {c.node: c.factor for c in checks if c.measured}
    if not measured:
        raise BBGrapError(f"--refine {run.source}: no rank computed anything in the run; nothing to refine by")
    rest = statistics.median(measured.values())
    return replace(profile, nodes=tuple(node.faster(1.0 / measured.get(n, rest)) for n, node in enumerate(nodes))), checks


def describe(checks: Sequence[RankCheck]) -> list[str]:
    """A line per rank: measured against predicted, and what its node's figures were divided by."""
    return [f"rank {c.rank} (node {c.node}): {c.measured_ms:.2f} ms per inference in its segments and sends"
            + (f" (its CPU time over its quota's share {c.share:g})" if c.share < 1 else "") + ", "
            f"{c.predicted_ms:.2f} predicted: " + (f"its node's figures slowed {c.factor:.3f}x" if c.factor >= 1
                                                   else f"its node's figures sped up {1 / c.factor:.3f}x")
            if c.measured else f"rank {c.rank} (node {c.node}): computed nothing; taken to be off as the measured ranks, in their median"
            for c in checks]
