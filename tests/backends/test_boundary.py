"""A segment boundary measured through the executor (backends/boundary.py): the chains compute
what they say, under the executor with the in-process transport and under real mpirun; the
measured costs are the chains' differences. (calibrate writing them: test_calibrate.py, test_mpi.py.)"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
from bbgrap.backends.boundary import (
    CHAIN,
    COLD_CHANNELS,
    COLD_SIDE,
    Boundary,
    Cold,
    Ring,
    busy_seconds,
    chain_inputs,
    chain_runner,
    cold_chain,
    cold_line,
    lockstep_of,
    lockstep_runner,
    measure_boundary,
    measure_cold,
    turn,
)
from bbgrap.backends.engine import CPU_TARGET, DeviceValues, Target
from bbgrap.backends.executor import Profile, run_node
from bbgrap.backends.transports import Mailbox

from bbgrap.plan_schema import MessageSpec, RunStep, SendStep, WaitStep

# device values on the CPU: the IOBinding path a GPU's Target takes (calibrate --provider cuda), testable without one
BOUND_CPU = Target(("CPUExecutionProvider",), DeviceValues("cpu", 0))


@pytest.mark.parametrize("target", [CPU_TARGET, BOUND_CPU], ids=["host", "bound"])
@pytest.mark.parametrize("width", [1, 3])
def test_a_chain_adds_each_segments_constant_to_every_value(width: int, target: Target) -> None:
    runner = chain_runner(1, width, length=5, target=target)
    assert runner.values is target.values
    assert [type(s) for s in runner.steps] == [RunStep] * 5
    assert all(len(i) == width and len(o) == width for i, o in zip(runner.seg_inputs, runner.seg_outputs))
    profile = Profile()
    out = run_node(runner, Mailbox(), chain_inputs(width), profile)
    np.testing.assert_array_equal(out["y"], np.array([1 + 2 + 3 + 4 + 5], np.float32))
    assert profile.compute > 0 and profile.wait == 0.0


def test_a_sending_chain_sends_each_segments_value_and_waits_for_the_peers_at_the_end() -> None:
    runner = chain_runner(1, ring=Ring(node=1, dst=2, src=0), length=3)
    ops = [type(s) for s in runner.steps]
    assert ops == [RunStep, SendStep] * 3 + [WaitStep] * 3
    sent = [runner.messages[s.message] for s in runner.steps if isinstance(s, SendStep)]
    got = [runner.messages[s.message] for s in runner.steps if isinstance(s, WaitStep)]
    assert [(m.id, m.src, m.dst) for m in sent] == [(3, 1, 2), (4, 1, 2), (5, 1, 2)]  # ids: sender * length + segment
    assert [(m.id, m.src, m.dst) for m in got] == [(0, 0, 1), (1, 0, 1), (2, 0, 1)]


class Answering(Mailbox):
    """A peer that has always sent: every receive gets a one-element value at once."""

    def receive(self, msg: MessageSpec) -> np.ndarray | None:
        return np.zeros((1, 1), np.float32)


@pytest.mark.parametrize("target", [CPU_TARGET, BOUND_CPU], ids=["host", "bound"])
def test_a_lockstep_chain_computes_sends_and_waits_round_by_round(target: Target) -> None:
    runner = lockstep_runner(1, Ring(node=1, dst=2, src=0), rows=3, width=4, rounds=3, target=target)
    assert [type(s) for s in runner.steps] == [RunStep, SendStep, WaitStep] * 3
    sent = [runner.messages[s.message] for s in runner.steps if isinstance(s, SendStep)]
    got = [runner.messages[s.message] for s in runner.steps if isinstance(s, WaitStep)]
    assert [(m.id, m.src, m.dst, m.shape) for m in sent] == [(3, 1, 2, (1, 1)), (4, 1, 2, (1, 1)), (5, 1, 2, (1, 1))]
    assert [(m.id, m.src, m.dst) for m in got] == [(0, 0, 1), (1, 0, 1), (2, 0, 1)]  # round i waits for the peer's round i
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    out = run_node(runner, Answering(), {"x": x})
    w = (np.random.default_rng(0).standard_normal((4, 4)) / np.sqrt(4)).astype(np.float32)
    np.testing.assert_allclose(out["y"], np.tanh(np.tanh(np.tanh(x @ w) @ w) @ w), rtol=1e-5)


def test_a_lockstep_shape_is_the_median_run_per_round_so_an_interrupted_run_does_not_count() -> None:
    # 15 runs of 32 rounds: 400 us busy and 8 us of waits a round, but in one run the other rank
    # lost its core for 50 ms; the mean of the waits would be 13 times the usual wait
    runs = [(32 * 400e-6, 32 * 8e-6)] * 14 + [(32 * 400e-6, 32 * 8e-6 + 0.05)]
    got = lockstep_of(runs, rounds=32)
    assert math.isclose(got.busy_s, 400e-6) and math.isclose(got.wait_s, 8e-6)
    assert np.mean([w for _, w in runs]) / 32 > 13 * 8e-6


def test_busy_time_leaves_out_waiting() -> None:
    runner = chain_runner(1, length=4)
    assert 0 < busy_seconds(runner, Mailbox(), repeat=3) < 1.0


def test_the_cold_chain_computes_each_segment_from_its_own_values_and_weights() -> None:
    import onnxruntime as ort

    chain = cold_chain(1, length=3, values=2)
    runner = chain.runner
    assert [type(s) for s in runner.steps] == [RunStep] * 3 and runner.seg_inputs[1] == ["x1_0", "x1_1"]
    assert chain.objects == 5 + 2 + 1 and chain.weight_bytes == 4 * (64 * 2 * COLD_CHANNELS + COLD_CHANNELS * 64 * 9)
    out = run_node(runner, Mailbox(), dict(chain.inputs))
    assert out["y"].shape == (1, COLD_CHANNELS, COLD_SIDE, COLD_SIDE)
    # the last segment's output, recomputed from its two inputs by onnxruntime on the session's own model
    again = runner.sessions[2].run(None, {x: chain.inputs[x] for x in runner.seg_inputs[2]})[0]
    np.testing.assert_array_equal(out["y"], again)
    assert np.isfinite(out["y"]).all() and 1e-3 < float(np.abs(out["y"]).max()) < 1e3  # He-initialised: of order one
    assert isinstance(runner.sessions[0], ort.InferenceSession)


def test_the_cold_costs_are_what_is_left_after_the_weights_read_at_the_given_speed() -> None:
    many, few = cold_chain(1, length=24, values=8), cold_chain(1, length=24, values=2)
    got = measure_cold(1, 3e10, many, few)
    assert isinstance(got, Cold) and math.isfinite(got.segment_s) and math.isfinite(got.per_object_s)
    assert got.segment_s >= 0.0 and got.per_object_s >= 0.0
    # weights read at one byte per second explain any difference: nothing is left
    assert measure_cold(1, 1.0, many, few) == Cold(0.0, 0.0)


def test_the_cold_line_runs_through_the_two_chains_and_is_never_negative() -> None:
    # 8 ops and values: 3 us more, 22: 6.5 us more -> 0.25 us each, 1 us for the segment
    got = cold_line((8, 3e-6), (22, 6.5e-6))
    assert math.isclose(got.per_object_s, 0.25e-6) and math.isclose(got.segment_s, 1e-6)
    # the chain of more ops and values costing less (noise): nothing per op, the fewer's extra per segment
    assert cold_line((8, 3e-6), (22, 2e-6)) == Cold(3e-6, 0.0)
    # a slope steeper than the fewer chain's extra allows: nothing per segment
    assert cold_line((8, 1e-6), (22, 8e-6)).segment_s == 0.0


def test_one_process_measures_segment_and_value_costs_and_no_send() -> None:
    got = measure_boundary(1)
    assert isinstance(got, Boundary) and got.messages == () and got.lockstep == ()
    assert got.segment_s > 0 and got.value_s > 0
    assert CHAIN >= 16  # enough segments that the chain's own start and end are a small part of it


def test_under_mpirun_every_rank_measures_what_sending_and_receiving_cost(tmp_path) -> None:
    from tests.helpers import MPIRUN

    assert MPIRUN, "mpirun not found"
    script = tmp_path / "ring.py"
    script.write_text(
        "import math\n"
        "from mpi4py import MPI\n"
        "from bbgrap.backends.boundary import LOCKSTEP_SIZES, MESSAGE_ELEMENTS, measure_boundary\n"
        "from bbgrap.backends.calibrate import wait_share\n"
        "comm = MPI.COMM_WORLD\n"
        "r = comm.Get_rank()\n"
        "b = measure_boundary(1, comm)\n"
        "m = b.messages\n"
        "got = comm.gather((b.segment_s > 0, b.value_s > 0, [x.nbytes for x in m] == [4 * e for e in MESSAGE_ELEMENTS],\n"
        "                   all(x.send_s >= 0 and x.recv_s > 0 for x in m), m[-1].recv_s > m[0].recv_s,\n"
        "                   len(b.lockstep) == len(LOCKSTEP_SIZES) and math.isfinite(wait_share(b.lockstep))\n"
        "                   and wait_share(b.lockstep) >= 0 and b.lockstep[-1].busy_s > b.lockstep[0].busy_s), root=0)\n"
        "if r == 0:\n"
        "    print(got)\n")
    proc = subprocess.run([MPIRUN, "-n", "2", sys.executable, str(script)], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[(True, True, True, True, True, True), (True, True, True, True, True, True)]", proc.stdout


@pytest.mark.parametrize("size", range(2, 8))
def test_a_rank_and_the_one_it_sends_to_never_send_in_the_same_turn(size: int) -> None:
    turns = [turn(r, size) for r in range(size)]
    assert all(turns[r] != turns[(r + 1) % size] for r in range(size))
    assert set(turns) == ({0, 1} if size % 2 == 0 else {0, 1, 2})
