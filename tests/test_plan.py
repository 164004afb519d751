"""The plan directory (bbgrap/plan.py): writing never deletes a file bbgrap did not
write, never leaves a half-written plan, survives concurrent and killed writers, keeps
the umask's permissions; reading checks the manifest's structure and every file's
checksum."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest
from helpers import compile_plan, run_plan, save

from bbgrap import zoo
from bbgrap.config import Direction
from bbgrap.ir import BBGrapError, Movement
from bbgrap.plan import (
    MANIFEST,
    REPLACING,
    STAGING_MARK,
    STAGING_PREFIX,
    check_output_dir,
    plan_files,
    read_manifest,
    read_sample,
    verify_files,
    write_plan,
)
from bbgrap.plan_schema import CompileRecord, InputSpec, NodeStats, Plan, Program, RunStep, SegmentSpec, Source, Stats, TensorSpec

BIN = os.path.dirname(sys.executable)


def tiny_plan(nodes: int = 1) -> Plan:
    """The smallest plan the readers accept (one segment per node, no messages)."""
    return Plan(
        model="m", nodes=nodes, movement=Movement.OPTIMIZED, layers=1, opaque=(),
        inputs=(InputSpec("x", (1,), "float32", "x"),), outputs=(TensorSpec("y", (1,), "float32"),), messages=(),
        programs=tuple(Program(n, (SegmentSpec(f"node{n}/seg000.onnx", ("x",), ("y",)),), (RunStep(0),), {"y": "y"})
                       for n in range(nodes)),
        stats=Stats(0, 0, 0, nodes, (NodeStats(0, 0, 0, 0, 0),) * nodes),
        compiled=CompileRecord(Direction.H, 20.0, (1.0,) * nodes, (), None, (), 0.0, Source("/m.onnx", "0")),
    )


def write_tiny(directory: str, nodes: int = 1, payload: bytes = b"segment") -> str:
    """Write the tiny plan; returns its plan_id."""
    files = {f"node{n}/seg000.onnx": payload + bytes([n]) for n in range(nodes)}
    return write_plan(directory, tiny_plan(nodes), files, {"x": np.zeros(1, np.float32)}, {"y": np.ones(1, np.float32)}).plan_id


def test_written_plan_reads_back_with_identity_and_checksums(tmp_path) -> None:
    plan = str(tmp_path / "plan")
    plan_id = write_tiny(plan, nodes=2)
    manifest = read_manifest(plan)
    assert manifest.plan_id == plan_id and len(plan_id) == 32
    assert set(manifest.files) == {"node0/seg000.onnx", "node1/seg000.onnx", "sample.npz"}
    verify_files(plan, manifest, [0, 1])
    inputs, outputs = read_sample(plan, manifest)
    assert set(inputs) == {"x"} and set(outputs) == {"y"}
    assert write_tiny(plan, nodes=2) != plan_id  # every compile is a new plan


def test_recompiling_keeps_the_users_files(tmp_path) -> None:
    # defect 2: the earlier plan directory also holds the user's model and notes
    plan = tmp_path / "P"
    write_tiny(str(plan), nodes=3)
    (plan / "m.onnx").write_bytes(b"the user's model")
    (plan / "notes").mkdir()
    (plan / "notes" / "a.txt").write_text("mine")
    (plan / "node2" / "mine.txt").write_text("mine too")
    write_tiny(str(plan), nodes=2)
    assert (plan / "m.onnx").read_bytes() == b"the user's model"
    assert (plan / "notes" / "a.txt").read_text() == "mine"
    assert (plan / "node2" / "mine.txt").read_text() == "mine too"
    assert not (plan / "node2" / "seg000.onnx").exists(), "the old plan's third node stayed"
    assert read_manifest(str(plan)).nodes == 2
    assert sorted(os.listdir(plan)) == ["m.onnx", "node0", "node1", "node2", "notes", "plan.json", "sample.npz"]


def test_old_nodes_directories_go_when_empty(tmp_path) -> None:
    plan = tmp_path / "P"
    write_tiny(str(plan), nodes=3)
    write_tiny(str(plan), nodes=1)
    assert sorted(os.listdir(plan)) == ["node0", "plan.json", "sample.npz"]


@pytest.mark.parametrize("where", [".", "work"])
def test_a_directory_that_is_no_plan_is_refused_and_untouched(tmp_path, monkeypatch, where: str) -> None:
    # defect 2: `-o .` in a directory holding the user's model
    work = tmp_path / "work"
    work.mkdir()
    (work / "model.onnx").write_bytes(b"model")
    monkeypatch.chdir(work if where == "." else tmp_path)
    with pytest.raises(BBGrapError, match="holds no bbgrap plan.*never deletes"):
        write_tiny(where)
    assert os.listdir(work) == ["model.onnx"]


def test_output_problems_are_found_before_compiling(tmp_path) -> None:
    # defects 6 and 7: a file, a dangling link, a file as parent
    (tmp_path / "afile").write_text("x")
    with pytest.raises(BBGrapError, match="is a file, not a directory"):
        check_output_dir(str(tmp_path / "afile"))
    os.symlink(str(tmp_path / "nowhere"), str(tmp_path / "dangling"))
    with pytest.raises(BBGrapError, match="symbolic link.*does not exist"):
        check_output_dir(str(tmp_path / "dangling"))
    with pytest.raises(BBGrapError, match="is a file, not a directory"):
        check_output_dir(str(tmp_path / "afile" / "plan"))
    assert check_output_dir(str(tmp_path / "new" / "deeper")) == str(tmp_path / "new" / "deeper")


def test_unwritable_parent_is_one_line(tmp_path, monkeypatch) -> None:
    # tests run as root, which may write anywhere: emulate a user without write permission
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(tmp_path) else real_access(p, mode))
    with pytest.raises(BBGrapError, match="is not writable"):
        check_output_dir(str(tmp_path / "plan"))


def test_a_symlinked_output_is_followed(tmp_path) -> None:
    # defect 7: the link stays a link and its target holds the new plan
    real = tmp_path / "shared" / "plan"
    write_tiny(str(real), payload=b"old")
    os.symlink(str(real), str(tmp_path / "link"))
    plan_id = write_tiny(str(tmp_path / "link"), payload=b"new")
    assert os.path.islink(tmp_path / "link")
    assert read_manifest(str(real)).plan_id == plan_id
    assert (real / "node0" / "seg000.onnx").read_bytes() == b"new\x00"


def test_a_failed_write_keeps_the_old_plan_and_leaves_nothing(tmp_path) -> None:
    # defect 6 (a full disk): a write that fails half-way is one line, the earlier plan stays whole
    plan = tmp_path / "P"
    old_id = write_tiny(str(plan))
    code = ("import sys, numpy as np; sys.path.insert(0, %r); from test_plan import write_tiny\n"
            "from bbgrap.ir import BBGrapError\n"
            "try:\n    write_tiny(%r, payload=b'x' * 200_000)\nexcept BBGrapError as e:\n    print(e); sys.exit(2)\n"
            ) % (os.path.dirname(__file__), str(plan))

    def small_files() -> None:  # writes past 100 kB fail with EFBIG, as they would on a full disk
        import resource
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=small_files, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "cannot write the plan" in proc.stdout and "Traceback" not in proc.stderr
    assert read_manifest(str(plan)).plan_id == old_id
    assert not [e for e in os.listdir(plan) if e.startswith(".bbgrap")], os.listdir(plan)
    # a new directory that could not be written is not left behind either
    proc = subprocess.run([sys.executable, "-c", code.replace(str(plan), str(tmp_path / "fresh"))], capture_output=True,
                          text=True, preexec_fn=small_files, timeout=120)
    assert proc.returncode == 2 and not (tmp_path / "fresh").exists()


def test_stale_staging_directories_are_swept_live_ones_kept(tmp_path) -> None:
    # defect 8: a compile killed while writing left its staging directory behind
    from bbgrap.plan import _flock

    plan = tmp_path / "P"
    write_tiny(str(plan))
    dead = plan / f"{STAGING_PREFIX}dead"
    live = plan / f"{STAGING_PREFIX}live"
    empty = plan / f"{STAGING_PREFIX}empty"  # its writer was killed before it marked it
    for d in (dead, live, empty):
        d.mkdir()
    for d in (dead, live):
        (d / STAGING_MARK).touch()
        (d / "big").write_bytes(b"0" * 1000)
    # 2026-11-24's audit: directories of those names that bbgrap did not make, beside the plan
    # (a plan the user named so, with their notes) and inside it, were deleted
    users = [tmp_path / f"{STAGING_PREFIX}mine", tmp_path / ".bbgrap-old-backup", plan / f"{STAGING_PREFIX}notes"]
    for d in users:
        d.mkdir()
        (d / "NOTES.txt").write_text("mine")
    with _flock(str(live)):  # its writer is alive
        write_tiny(str(plan))
        assert live.exists() and not dead.exists() and not empty.exists()
    write_tiny(str(plan))
    assert not live.exists()
    assert all((d / "NOTES.txt").read_text() == "mine" for d in users)
    assert not (plan / STAGING_MARK).exists()


def test_a_signal_during_a_commit_waits_for_its_end(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """2026-11-24's audit: SIGINT in the middle of a commit (after the old manifest was removed)
    left no plan. Now the commit ends first, the new plan whole, and then the signal is delivered."""
    from bbgrap import plan as plan_module

    plan = tmp_path / "P"
    write_tiny(str(plan), nodes=2)
    real_replace = os.replace
    sent: list[str] = []

    def replace_then_interrupt(src: str, dst: str) -> None:
        if dst.endswith("seg000.onnx") and not sent:  # the old plan's manifest is gone by now
            sent.append(dst)
            os.kill(os.getpid(), signal.SIGINT)
        real_replace(src, dst)

    monkeypatch.setattr(plan_module.os, "replace", replace_then_interrupt)
    # SIGINT as an interactive shell leaves it (a job started in the background with `&` inherits it ignored)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            write_tiny(str(plan), nodes=1)
    finally:
        signal.signal(signal.SIGINT, before)
    monkeypatch.undo()
    assert sent and read_manifest(str(plan)).nodes == 1  # the new plan, whole
    assert sorted(os.listdir(plan)) == ["node0", "plan.json", "sample.npz"]


def test_an_interrupted_commit_is_finished_by_the_next_compile(tmp_path) -> None:
    # a writer killed between removing the old manifest and moving the new one in
    plan = tmp_path / "P"
    write_tiny(str(plan), nodes=2)
    (plan / "user.txt").write_text("mine")
    (plan / REPLACING).write_text(json.dumps(["plan.json", "sample.npz", "node0/seg000.onnx", "node1/seg000.onnx"]))
    (plan / MANIFEST).unlink()
    assert plan_files(str(plan)) == {REPLACING, "sample.npz", "node0/seg000.onnx", "node1/seg000.onnx"}
    write_tiny(str(plan), nodes=1)
    assert sorted(os.listdir(plan)) == ["node0", "plan.json", "sample.npz", "user.txt"]


def test_concurrent_writers_leave_one_whole_plan(tmp_path) -> None:
    # defect 8: several compiles to one -o at once
    plan = str(tmp_path / "P")
    errors: list[BaseException] = []

    def writer(k: int) -> None:
        try:
            for _ in range(5):
                write_tiny(plan, nodes=1 + k % 3, payload=bytes([65 + k]) * 50_000)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    manifest = read_manifest(plan)
    verify_files(plan, manifest, range(manifest.nodes))
    assert sorted(os.listdir(plan)) == sorted(["plan.json", "sample.npz"] + [f"node{n}" for n in range(manifest.nodes)])


def test_plan_directories_follow_the_umask(tmp_path) -> None:
    # defect 13: readable by the other hosts' ranks where the umask says so
    code = ("import os, sys; sys.path.insert(0, %r); os.umask(0o022); from test_plan import write_tiny; write_tiny(%r, 2)"
            % (os.path.dirname(__file__), str(tmp_path / "P")))
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    for d in ("P", "P/node0", "P/node1"):
        assert (tmp_path / d).stat().st_mode & 0o777 == 0o755, d
    assert (tmp_path / "P" / "plan.json").stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize(("edit", "words"), [
    (lambda m: [1, 2], "not a bbgrap plan manifest"),
    (lambda m: {k: v for k, v in m.items() if k != "programs"}, "'programs'"),
    (lambda m: {**m, "nodes": 3}, "'programs' does not hold one program"),
    (lambda m: {**m, "nodes": "2"}, "'nodes'"),
    (lambda m: {**m, "files": {"../../etc/passwd": "0"}}, "'files'"),
    (lambda m: {**m, "messages": [{"id": 0, "src": 0, "dst": 5, "tensor": "t", "region": [[0, 1]], "shape": [1], "dtype": "float32",
                                   "value": "v"}]}, "messages[0].dst"),
    (lambda m: {**m, "programs": [{**m["programs"][0], "steps": [["run", 7]]}, m["programs"][1]]}, "programs[0].steps[0]"),
    (lambda m: {**m, "programs": [{**m["programs"][0], "steps": [["wait", 3]]}, m["programs"][1]]}, "programs[0].steps[0]"),
    (lambda m: {**m, "source": {"path": 3}}, "'source.path'"),
])
def test_damaged_manifests_are_one_line(tmp_path, edit, words: str) -> None:
    # defect 10: plan.json not an object, without programs, with the wrong node count, ...
    plan = tmp_path / "P"
    write_tiny(str(plan), nodes=2)
    (plan / MANIFEST).write_text(json.dumps(edit(json.loads((plan / MANIFEST).read_text()))))
    with pytest.raises(BBGrapError) as err:
        read_manifest(str(plan))
    assert words in str(err.value) and "compile the plan again" in str(err.value)


def test_truncated_manifest_and_sample(tmp_path) -> None:
    plan = tmp_path / "P"
    write_tiny(str(plan))
    manifest = read_manifest(str(plan))
    (plan / "sample.npz").write_bytes(b"PK\x03\x04broken")
    with pytest.raises(BBGrapError, match="sample.npz is unreadable"):
        read_sample(str(plan))
    with pytest.raises(BBGrapError, match="sample.npz does not match"):
        read_sample(str(plan), manifest)
    (plan / "sample.npz").unlink()
    with pytest.raises(BBGrapError, match="sample.npz is missing"):
        read_sample(str(plan))
    (plan / MANIFEST).write_text((plan / MANIFEST).read_text()[:40])
    with pytest.raises(BBGrapError, match="unreadable.*compile the plan again"):
        read_manifest(str(plan))


def test_a_node_directory_from_another_compile_is_refused(tmp_path) -> None:
    # defect 14: plan A gets node 1 of plan B, compiled from the same architecture with other weights
    a, b = str(tmp_path / "A"), str(tmp_path / "B")
    for plan, seed in ((a, 0), (b, 1)):
        model = save(zoo.build("resnet18", resolution=32, width=0.125, seed=seed), str(tmp_path), f"m{seed}")
        compile_plan(model, plan, nodes=2, direction="h")
    shutil.rmtree(os.path.join(a, "node1"))
    shutil.copytree(os.path.join(b, "node1"), os.path.join(a, "node1"))
    manifest = read_manifest(a)
    verify_files(a, manifest, [0])
    with pytest.raises(BBGrapError, match=r"node1/seg000.onnx does not match the plan's manifest"):
        verify_files(a, manifest, [1])
    # a plan that was not tampered with runs exactly
    assert run_plan(b)[1] <= 1e-4
