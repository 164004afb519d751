"""bbgrap/refine.py: a profile corrected by a measured run (`bbgrap calibrate --refine`): the scaling of
each node, idle ranks and unused nodes, and every bad run or flag as one line (exit 2, nothing written).
The whole loop under real mpirun (run, refine, compile again, run exactly): tests/backends/test_mpi.py."""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace

import pytest
from helpers import bbgrap, one_error_line

from bbgrap.cluster import ClusterProfile, NodeProfile, read_profile, write_profile
from bbgrap.ir import BBGrapError
from bbgrap.plan_schema import PredictionRecord, RankPrediction
from bbgrap.refine import MeasuredRun, describe, read_run, refine

PLAIN = NodeProfile(conv_ops_per_s=1e11, segment_s=1e-5)
NODE = replace(PLAIN, layer_s={"conv1": 2e-3})  # with a measured layer (a profile file would need its [model] too)


def prediction(profile: str, computes: list[float], nodes: tuple[int, ...] | None = None) -> PredictionRecord:
    ranks = tuple(RankPrediction(c, 0.1, c + 0.1) for c in computes)
    n = len(computes)
    return PredictionRecord(profile, False, n, n, max(computes) + 0.1, ranks, 10.0, 1.0, {n: 1.0}, nodes or tuple(range(n)), ("",) * n)


def run_json(path: str, pred: PredictionRecord | None, measured: list[tuple[float, float]], mode: str = "mpi",
             cpu: list[float] | None = None, segments_cpu: list[list[float]] | None = None) -> str:
    """A bbgrap-run --json result as it writes one (the fields refining reads, and some it does not);
    with `cpu`, each rank's CPU time in its segments, as a traced run records it (and each segment's)."""
    data = {"plan": "p", "nodes": len(measured), "ranks": len(measured), "mode": mode, "latency_ms": 1.0, "ok": True,
            "profile_ms": [{"compute": c, "wait": 0.2, "send": s, **({"compute_cpu": cpu[k], "send_cpu": 0.0} if cpu else {}),
                            **({"segments": [c], "segments_cpu": segments_cpu[k]} if segments_cpu else {})}
                           for k, (c, s) in enumerate(measured)],
            "predicted_ms": pred.latency_ms if pred else None, "prediction": pred.to_json() if pred else None}
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
    return path


def test_each_node_is_scaled_by_its_ranks_measured_over_predicted_time(tmp_path) -> None:
    profile = ClusterProfile((NODE, NODE.faster(3.0)), source=str(tmp_path / "cluster.toml"))
    # rank 0 took twice its prediction (segments 1.9 + sends 0.1 against 1.0), rank 1 half of it
    run = read_run(run_json(str(tmp_path / "run.json"), prediction(profile.source, [1.0, 2.0]), [(1.9, 0.1), (0.9, 0.1)]))
    refined, checks = refine(profile, [run])
    assert [c.factor for c in checks] == pytest.approx([2.0, 0.5])
    slow, fast = refined.nodes
    assert slow.conv_ops_per_s == pytest.approx(NODE.conv_ops_per_s / 2) and slow.segment_s == pytest.approx(NODE.segment_s * 2)
    assert slow.layer_s["conv1"] == pytest.approx(4e-3)  # a measured layer's time too
    assert fast.conv_ops_per_s == pytest.approx(3 * NODE.conv_ops_per_s * 2)
    assert refined.link == profile.link and refined.source == profile.source


def test_a_ranks_segments_give_a_line_its_slope_scales_the_node_and_its_intercept_adds_to_each_segment(tmp_path) -> None:
    # rank 0's segments each took 0.9 x their prediction and 40 us more (a short segment's fixed cost
    # under-priced); rank 1 ran two segments only: its total's ratio alone
    profile = ClusterProfile((NODE, NODE), source=str(tmp_path / "cluster.toml"))
    predicted = [2.0, 0.5, 0.02, 1.0]
    pred = PredictionRecord(profile.source, False, 2, 2, 4.0, (RankPrediction(3.52, 0.1, 3.62, tuple(predicted)), RankPrediction(2.0, 0.1, 2.1, (1.0, 1.0))),
                            10.0, 1.0, {2: 4.0}, (0, 1), ("", ""))
    measured = [0.9 * p + 0.04 for p in predicted]
    run = MeasuredRun("run.json", (sum(measured), 3.0), None, pred, (tuple(measured), (1.5, 1.5)))
    refined, checks = refine(profile, [run])
    assert checks[0].correction().fitted and not checks[1].correction().fitted
    assert checks[0].correction().scale == pytest.approx(0.9) and checks[0].correction().extra_s == pytest.approx(40e-6)
    assert refined.nodes[0].conv_ops_per_s == pytest.approx(NODE.conv_ops_per_s / 0.9)
    assert refined.nodes[0].segment_s == pytest.approx(0.9 * NODE.segment_s + 40e-6)
    assert refined.nodes[1].conv_ops_per_s == pytest.approx(NODE.conv_ops_per_s / 1.5) and refined.nodes[1].segment_s == pytest.approx(1.5 * NODE.segment_s)
    # a line whose intercept would make the fixed cost negative stops at 0
    cheap = replace(run, wall_segments=(tuple(p - 0.05 for p in predicted), (1.5, 1.5)))
    assert refine(profile, [cheap])[0].nodes[0].segment_s == 0.0


def test_a_node_the_run_says_nothing_of_takes_the_median_of_the_measured_ones(tmp_path) -> None:
    # a one-node profile stands for every node of a 3-node plan; rank 2 computed nothing
    profile = ClusterProfile((NODE,), source=str(tmp_path / "one.toml"))
    run = read_run(run_json(str(tmp_path / "run.json"), prediction(profile.source, [1.0, 1.0, 0.0]), [(1.2, 0.0), (1.6, 0.0), (0.0, 0.0)]))
    refined, checks = refine(profile, [run])
    assert len(refined.nodes) == 3
    assert [n.conv_ops_per_s for n in refined.nodes] == pytest.approx([NODE.conv_ops_per_s / f for f in (1.2, 1.6, 1.4)])
    assert not checks[2].measured and checks[2].factor == 1.0


def test_a_node_under_a_cpu_quota_is_refined_by_its_cpu_time_over_its_share(tmp_path) -> None:
    # node 0 has 0.3 of a core: its segments ran 4 ms on the wall clock (the quota's stops fell in its
    # waits) but took 3 ms of CPU, 10 ms of its node's time; node 1 has a core of its own
    profile = ClusterProfile((NODE.slowed(0.3), NODE), source=str(tmp_path / "cluster.toml"))
    pred = prediction(profile.source, [5.0, 5.0])
    refined, checks = refine(profile, [read_run(run_json(str(tmp_path / "run.json"), pred, [(4.0, 0.0), (5.0, 0.0)], cpu=[3.0, 4.5]))])
    assert [c.factor for c in checks] == pytest.approx([2.0, 1.0])  # node 1 by its wall clock
    assert refined.nodes[0].conv_ops_per_s == pytest.approx(0.3 * NODE.conv_ops_per_s / 2)
    assert refined.nodes[0].cpu_share == pytest.approx(0.3)
    with pytest.raises(BBGrapError, match="under a CPU quota .*--trace"):  # an untraced run has no CPU time
        refine(profile, [read_run(run_json(str(tmp_path / "wall.json"), pred, [(4.0, 0.0), (5.0, 0.0)]))])
    # segment by segment: node 0's from their CPU time over its share too
    segs = replace(pred, ranks=tuple(replace(r, segments=(3.0, 1.0, 0.5, 0.5)) for r in pred.ranks))
    run = read_run(run_json(str(tmp_path / "segs.json"), segs, [(4.0, 0.0), (5.0, 0.0)], cpu=[3.0, 4.5],
                            segments_cpu=[[1.8, 0.6, 0.3, 0.3], [3.0, 1.0, 0.5, 0.5]]))
    refined, checks = refine(profile, [run])
    assert checks[0].correction().fitted and checks[0].correction().scale == pytest.approx(2.0) and checks[0].correction().extra_s == pytest.approx(0.0, abs=1e-9)


def test_a_plan_on_other_nodes_of_the_profile_refines_those(tmp_path) -> None:
    # a plan for 2 of 3 nodes ran on nodes 2 and 0 (the fastest): rank 0 is node 2
    profile = ClusterProfile((NODE, NODE, NODE), source=str(tmp_path / "cluster.toml"))
    run = read_run(run_json(str(tmp_path / "run.json"), prediction(profile.source, [1.0, 1.0], (2, 0)), [(2.0, 0.0), (1.0, 0.0)]))
    refined, _ = refine(profile, [run])
    assert [n.conv_ops_per_s / NODE.conv_ops_per_s for n in refined.nodes] == pytest.approx([1.0, 1 / 1.5, 0.5])


def test_a_run_of_a_plan_compiled_with_another_profile_is_refused(tmp_path) -> None:
    other = tmp_path / "other.toml"
    write_profile(str(other), ClusterProfile((PLAIN,)))
    mine = tmp_path / "mine.toml"
    write_profile(str(mine), ClusterProfile((PLAIN,)))
    run = read_run(run_json(str(tmp_path / "run.json"), prediction(str(other), [1.0]), [(1.0, 0.0)]))
    with pytest.raises(BBGrapError, match="compiled with the profile .*other.toml"):
        refine(read_profile(str(mine)), [run])
    assert refine(read_profile(str(other)), [run])[0].nodes[0] == read_profile(str(other)).nodes[0]  # measured as predicted


@pytest.mark.parametrize(("content", "words"), [
    (None, ["cannot read it"]),
    ("not json", ["not bbgrap-run's JSON", "--json"]),
    ('{"a": 1}', ["not bbgrap-run's JSON"]),
    ("embedded", ["in one process", "mpirun -n N"]),
    ("unpredicted", ["compiled without --profile"]),
    ("short", ["'profile_ms' does not hold each of the 2 ranks'"]),
    ("bad prediction", ["prediction"]),
])
def test_a_bad_run_is_one_line(tmp_path, content: str | None, words: list[str]) -> None:
    path = str(tmp_path / "run.json")
    pred = prediction("p.toml", [1.0, 1.0])
    if content == "embedded":
        run_json(path, pred, [(1.0, 0.0), (1.0, 0.0)], mode="embedded")
    elif content == "unpredicted":
        run_json(path, None, [(1.0, 0.0), (1.0, 0.0)])
    elif content == "short":
        run_json(path, pred, [(1.0, 0.0)])
    elif content == "bad prediction":
        run_json(path, pred, [(1.0, 0.0), (1.0, 0.0)])
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        del data["prediction"]["plan"]
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(data, fh)
    elif content is not None:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(content)
    with pytest.raises(BBGrapError) as err:
        read_run(path)
    assert "\n" not in str(err.value)
    for w in words:
        assert w in str(err.value)


def test_several_runs_put_each_nodes_segments_of_all_of_them_on_one_line(tmp_path) -> None:
    # node 0 ran two segments in each run (too few for a line alone); together they lie on 0.8 x + 30 us.
    # node 1 computed in the first run only: its total's ratio there
    profile = ClusterProfile((NODE, NODE), source=str(tmp_path / "cluster.toml"))

    def run(name: str, node0: tuple[float, ...], node1: float) -> MeasuredRun:
        pred = PredictionRecord(profile.source, False, 2, 2, 4.0, (RankPrediction(sum(node0), 0.1, 4.0, node0), RankPrediction(node1, 0.1, 4.0, ())),
                                10.0, 1.0, {2: 4.0}, (0, 1), ("", ""))
        measured = tuple(0.8 * p + 0.03 for p in node0)
        return MeasuredRun(name, (sum(measured), 1.2 * node1), None, pred, (measured, ()))

    first, second = run("a.json", (2.0, 1.0), 1.0), run("b.json", (0.5, 0.1), 0.0)
    alone, _ = refine(profile, [first])
    assert alone.nodes[0].segment_s == pytest.approx(NODE.segment_s * (0.8 * 3.0 + 0.06) / 3.0)  # its total's ratio alone
    refined, checks = refine(profile, [first, second])
    assert [(c.run, c.rank) for c in checks] == [("a.json", 0), ("a.json", 1), ("b.json", 0), ("b.json", 1)]
    assert refined.nodes[0].conv_ops_per_s == pytest.approx(NODE.conv_ops_per_s / 0.8)
    assert refined.nodes[0].segment_s == pytest.approx(0.8 * NODE.segment_s + 30e-6)
    assert refined.nodes[1].conv_ops_per_s == pytest.approx(NODE.conv_ops_per_s / 1.2)
    lines = describe(checks)
    assert lines[0].startswith("a.json: rank 0 (node 0)") and "computed nothing" in lines[3]
    assert "node 0, over 2 runs: its 4 segments on a line: its node's times x0.800, +30.0 us per segment" in lines
    assert "node 1, over 1 run: its node's times x1.200" in lines
    assert not any("in any run" in line for line in lines)  # node 1 computed in the first run
    idle = replace(first, source="idle.json", wall_ms=(first.wall_ms[0], 0.0))
    assert "node 1: computed nothing in any run; taken to be off as the measured nodes, in their median" in describe(refine(profile, [idle, second])[1])
    # a run of a plan compiled with another profile is refused, named, whichever place it has
    other = tmp_path / "other.toml"
    write_profile(str(other), ClusterProfile((PLAIN,)))
    stray = replace(second, source="c.json", prediction=replace(second.prediction, profile=str(other)))
    with pytest.raises(BBGrapError, match="--refine c.json: its plan was compiled with the profile .*other.toml"):
        refine(profile, [first, stray])


def test_no_rank_computing_anything_is_refused(tmp_path) -> None:
    run = MeasuredRun("run.json", (0.0, 0.0), None, prediction("p.toml", [0.0, 0.0]))
    with pytest.raises(BBGrapError, match="no rank computed anything"):
        refine(ClusterProfile((NODE,), source="p.toml"), [run])


def test_calibrate_refine_writes_the_refined_profile(tmp_path) -> None:
    profile = str(tmp_path / "cluster.toml")
    write_profile(profile, ClusterProfile((PLAIN, PLAIN)))
    run = run_json(str(tmp_path / "run.json"), prediction(profile, [1.0, 1.0]), [(1.25, 0.0), (0.8, 0.0)])
    out = str(tmp_path / "refined.toml")
    proc = bbgrap("calibrate", "--refine", run, "--profile", profile, "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert "times x1.250" in proc.stdout and "times x0.800" in proc.stdout and "wrote" in proc.stdout
    refined = read_profile(out)
    assert [n.conv_ops_per_s for n in refined.nodes] == pytest.approx([NODE.conv_ops_per_s / 1.25, NODE.conv_ops_per_s / 0.8])
    assert math.isclose(read_profile(profile).nodes[0].conv_ops_per_s, NODE.conv_ops_per_s)  # the given profile untouched
    with open(out, encoding="utf-8") as fh:
        assert fh.readline().startswith("# bbgrap calibrate --refine")


def test_calibrate_refine_by_several_runs_pools_them(tmp_path) -> None:
    profile = str(tmp_path / "cluster.toml")
    write_profile(profile, ClusterProfile((PLAIN, PLAIN)))
    runs = [run_json(str(tmp_path / f"run{k}.json"), prediction(profile, [1.0, 1.0]), measured)
            for k, measured in enumerate([[(1.25, 0.0), (0.8, 0.0)], [(1.75, 0.0), (1.2, 0.0)]])]
    out = str(tmp_path / "refined.toml")
    proc = bbgrap("calibrate", "--refine", *runs, "--profile", profile, "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert "node 0, over 2 runs: its node's times x1.500" in proc.stdout and "node 1, over 2 runs: its node's times x1.000" in proc.stdout
    assert [n.conv_ops_per_s for n in read_profile(out).nodes] == pytest.approx([NODE.conv_ops_per_s / 1.5, NODE.conv_ops_per_s])
    with open(out, encoding="utf-8") as fh:
        assert fh.readline().startswith(f"# bbgrap calibrate --refine {runs[0]} {runs[1]} --profile")


@pytest.mark.parametrize(("flags", "words"), [
    (["--refine", "RUN"], ["needs --profile"]),
    (["--profile", "PROFILE"], ["--profile only matters with --refine"]),
    (["--refine", "RUN", "--profile", "PROFILE", "--threads", "2"], ["measures nothing"]),
    (["--refine", "RUN", "--profile", "PROFILE", "-o", "PROFILE"], ["would be lost", "-o refined.toml"]),
    (["--refine", "PROFILE", "--profile", "PROFILE", "-o", "OUT"], ["not bbgrap-run's JSON"]),
])
def test_calibrate_refine_bad_flags_are_one_line_and_write_nothing(tmp_path, flags: list[str], words: list[str]) -> None:
    profile = str(tmp_path / "cluster.toml")
    write_profile(profile, ClusterProfile((PLAIN,)))
    run = run_json(str(tmp_path / "run.json"), prediction(profile, [1.0]), [(1.0, 0.0)])
    before = sorted(os.listdir(tmp_path))
    with open(profile, encoding="utf-8") as fh:
        text = fh.read()
    out = str(tmp_path / "refined.toml")
    proc = bbgrap("calibrate", *[{"RUN": run, "PROFILE": profile, "OUT": out}.get(f, f) for f in flags], cwd=str(tmp_path))
    one_error_line(proc, *words)
    assert sorted(os.listdir(tmp_path)) == before
    with open(profile, encoding="utf-8") as fh:
        assert fh.read() == text
