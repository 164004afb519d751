"""The plan directory: a versioned manifest, each node's ONNX segments, and a
sample input with the original model's output on it.

```
plan.json            manifest: a Plan (bbgrap/plan_schema.py) as JSON
sample.npz           inputs (`input:NAME`) and reference outputs (`output:NAME`)
node<N>/seg<K>.onnx  node N's segments, holding only the weights node N uses
```

Identity: every compile gets a fresh `plan_id`, and the manifest holds the sha256 of
every other file of the plan (`files`), so a rank refuses a segment that is damaged
or was copied from another compile (`verify_files`), naming the file.

Writing never loses a user's file and never leaves a half-written plan:
* the plan is staged in a hidden directory inside the target (`.bbgrap-plan-*`),
  locked (`flock`) by its writer for as long as it lives;
* it is committed under a lock on the target directory: the old plan's files (those
  its manifest lists, nothing else) are replaced, `plan.json` is moved in last, so a
  reader sees the old plan, no plan, or the whole new one, and every file it then
  reads is checked against the manifest it read;
* a commit in progress is recorded in `.bbgrap-replacing` (the files it owns), so
  a commit killed half-way (SIGKILL: SIGINT and SIGTERM wait for it to end) is finished by
  the next compile to that directory;
* staging directories whose writer died (no lock held; marked `.bbgrap-staging` as bbgrap's)
  are swept by the next write to that directory, and nothing outside it is ever swept.
A directory that is neither empty nor a plan is refused, never emptied.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import signal
import tempfile
import threading
import uuid
import zipfile
from dataclasses import replace
from typing import Any, Iterable, Iterator, Mapping

import numpy as np

from bbgrap.ir import BBGrapError
from bbgrap.paths import new_dir_problem
from bbgrap.plan_schema import PLAN_FORMAT, PLAN_VERSION, Plan, PlanSchemaError, PlanVersionError, safe_relative

MANIFEST = "plan.json"
SAMPLE = "sample.npz"
STAGING_PREFIX = ".bbgrap-plan-"
STAGING_MARK = ".bbgrap-staging"  # in every staging directory: what a sweep may remove
REPLACING = ".bbgrap-replacing"


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ---------------------------------------------------------------- writing


def check_output_dir(directory: str) -> str:
    """Where a plan for `-o directory` goes (links followed), checked before compiling so
    that every problem is one line and nothing is written; raises BBGrapError."""
    if os.path.islink(directory) and not os.path.exists(directory):
        raise BBGrapError(f"-o {directory} is a symbolic link to '{os.readlink(directory)}', which does not exist; "
                          f"create that directory or remove the link")
    target = os.path.realpath(directory)
    if os.path.exists(target):
        if not os.path.isdir(target):
            raise BBGrapError(f"-o {directory} is a file, not a directory; choose a directory for the plan")
        if not os.access(target, os.W_OK | os.X_OK):
            raise BBGrapError(f"-o {directory}: permission denied (the directory is not writable); choose another -o DIR")
        if plan_files(target) is None:
            raise BBGrapError(f"-o {directory} is not empty and holds no bbgrap plan; bbgrap never deletes files it did not "
                              f"write: choose a new or empty directory")
        return target
    problem = new_dir_problem(target, "-o", directory)
    if problem:
        raise BBGrapError(problem)
    return target


def plan_files(target: str) -> set[str] | None:
    """The paths (relative to `target`) that bbgrap wrote there: an earlier plan's files,
    or those of a commit that was interrupted; the empty set for an empty directory
    (staging directories aside); None where `target` holds anything else."""
    for _ in range(100):  # another writer may be committing: look again if a file went while reading it
        try:
            return _scan_plan_files(target)
        except FileNotFoundError:
            continue
    return None


def _scan_plan_files(target: str) -> set[str] | None:
    entries = [e for e in os.listdir(target) if not e.startswith(STAGING_PREFIX)]
    if not entries:
        return set()
    owned: set[str] = set()
    if REPLACING in entries:
        listed = _read_json(os.path.join(target, REPLACING))
        if not isinstance(listed, list) or not all(isinstance(p, str) and safe_relative(p) for p in listed):
            return None
        owned |= set(listed) | {REPLACING}
    if MANIFEST in entries:
        manifest = _read_json(os.path.join(target, MANIFEST))
        if not isinstance(manifest, dict) or manifest.get("format") != PLAN_FORMAT:
            return owned or None
        owned |= {MANIFEST, SAMPLE} | _manifest_paths(manifest)
    if not owned:
        return None
    return {p for p in owned if os.path.lexists(os.path.join(target, p))}


def _read_json(path: str) -> Any:
    """The JSON value in `path`, or None where it is not JSON (FileNotFoundError passes)."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        raise
    except (OSError, ValueError):
        return None


def _manifest_paths(manifest: Mapping[str, Any]) -> set[str]:
    """Files a manifest of any version says belong to its plan."""
    paths = set(manifest["files"]) if isinstance(manifest.get("files"), dict) else set()
    for prog in manifest.get("programs", []) if isinstance(manifest.get("programs"), list) else []:
        for seg in prog.get("segments", []) if isinstance(prog, dict) else []:
            if isinstance(seg, dict) and isinstance(seg.get("file"), str):
                paths.add(seg["file"])
    return {p for p in paths if safe_relative(p)}


@contextlib.contextmanager
def _flock(path: str, blocking: bool = True) -> Iterator[bool]:
    """Hold an exclusive flock on directory `path`; yields False where `blocking` is off
    and another process holds it."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # releases the lock


def sweep_stale(target: str) -> list[str]:
    """Remove the staging directories in the plan directory `target` whose writer is gone
    (nobody holds their lock): those that hold STAGING_MARK, or nothing (a writer killed before
    it wrote the mark). A directory of that name the user made, anywhere, is not bbgrap's to
    remove. Returns what it removed."""
    removed = []
    for entry in os.listdir(target):
        path = os.path.join(target, entry)
        if not entry.startswith(STAGING_PREFIX) or os.path.islink(path) or not os.path.isdir(path):
            continue
        try:
            with _flock(path, blocking=False) as free:
                if not free:
                    continue
                if os.path.isfile(os.path.join(path, STAGING_MARK)):
                    shutil.rmtree(path, ignore_errors=True)
                    removed.append(path)
                elif not os.listdir(path):
                    os.rmdir(path)
                    removed.append(path)
        except OSError:
            continue  # removed by another sweeper meanwhile
    return removed


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held off for the block and delivered after it, so that a commit, once
    begun, ends with the whole new plan in place (a commit stopped half-way had removed the old
    plan's manifest: no plan until the next compile finished it). Only the main thread can set
    handlers; elsewhere the block runs as it is (SIGKILL cannot be held anywhere: the REPLACING
    record covers it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    before = {sig: signal.signal(sig, lambda signum, frame: caught.append(signum)) for sig in held}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        if caught:
            signal.raise_signal(caught[0])


def write_plan(directory: str, plan: Plan, files: Mapping[str, bytes],
               inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]) -> Plan:
    """Write the plan into `directory` (see the module docstring); returns the plan as written
    (with its new plan_id and the sha256 of every file)."""
    target = check_output_dir(directory)
    created = not os.path.exists(target)
    try:
        os.makedirs(target, exist_ok=True)
        with contextlib.ExitStack() as alive:
            with _flock(target):
                sweep_stale(target)
                staging = tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=target)
                alive.enter_context(_flock(staging))  # locked before any other sweeper can look at it
                open(os.path.join(staging, STAGING_MARK), "w").close()
            try:
                written = _stage(staging, plan, files, inputs, outputs)
                with _flock(target), signals_held():
                    _commit(staging, target, directory)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    except BaseException as exc:
        if created:
            with contextlib.suppress(OSError):
                os.rmdir(target)  # only if still empty
        if not isinstance(exc, OSError):
            raise
        what = "no space left on the device" if exc.errno == errno.ENOSPC else (exc.strerror or type(exc).__name__)
        raise BBGrapError(f"cannot write the plan to '{directory}': {what}; free space or choose another -o DIR") from None
    return written


def _stage(staging: str, plan: Plan, files: Mapping[str, bytes],
           inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]) -> Plan:
    sums: dict[str, str] = {}
    for rel, data in files.items():
        path = os.path.join(staging, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(data)
        sums[rel] = hashlib.sha256(data).hexdigest()
    arrays = {f"input:{k}": v for k, v in inputs.items()} | {f"output:{k}": v for k, v in outputs.items()}
    np.savez(os.path.join(staging, SAMPLE), **arrays)  # type: ignore[arg-type]  # numpy's stub types **kwds as allow_pickle
    sums[SAMPLE] = file_sha256(os.path.join(staging, SAMPLE))
    written = replace(plan, plan_id=uuid.uuid4().hex, files=dict(sorted(sums.items())))
    with open(os.path.join(staging, MANIFEST), "w") as fh:
        fh.write(manifest_text(written.to_json()))
    return written


def manifest_text(manifest: Mapping[str, Any]) -> str:
    """The manifest as JSON text: one top-level key a line, each value compact. json's C
    encoder writes only compact JSON, an indented dump is pure Python (3 of vit_b_16's 27 s
    compile on 16 nodes, for its 25 MB manifest)."""
    keys = [f"{json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}" for k, v in manifest.items()]
    return "{\n" + ",\n".join(keys) + "\n}\n"


def _commit(staging: str, target: str, directory: str) -> None:
    """Replace the plan in `target` by the staged one; the caller holds the target's lock."""
    old = plan_files(target)
    if old is None:
        raise BBGrapError(f"-o {directory} is not empty and holds no bbgrap plan (files appeared while compiling); "
                          f"bbgrap never deletes files it did not write: choose a new or empty directory")
    new = {os.path.relpath(os.path.join(root, f), staging) for root, _, fs in os.walk(staging) for f in fs} - {STAGING_MARK}
    with open(os.path.join(staging, REPLACING), "w") as fh:  # staged, so the target never holds a half-written marker
        json.dump(sorted((old | new) - {REPLACING}), fh)
    os.replace(os.path.join(staging, REPLACING), os.path.join(target, REPLACING))
    for rel in [MANIFEST] + sorted(old - new - {REPLACING}):  # the old plan is gone before any new file arrives
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(target, rel))
    for rel in sorted(new - {MANIFEST}) + [MANIFEST]:  # the manifest last: it commits the plan
        os.makedirs(os.path.dirname(os.path.join(target, rel)), exist_ok=True)
        os.replace(os.path.join(staging, rel), os.path.join(target, rel))
    for rel in sorted({os.path.dirname(p) for p in old - new} - {""}, reverse=True):
        with contextlib.suppress(OSError):
            os.rmdir(os.path.join(target, rel))  # node directories the new plan no longer has, if empty
    os.remove(os.path.join(target, REPLACING))


# ---------------------------------------------------------------- reading


def read_manifest(directory: str) -> Plan:
    """The plan's manifest, checked against the schema (bbgrap/plan_schema.py)."""
    path = os.path.join(directory, MANIFEST)
    if os.path.isfile(directory):
        raise BBGrapError(f"'{directory}' is a file, not a bbgrap plan directory; give the directory 'bbgrap compile -o' wrote")
    if not os.path.isfile(path):
        raise BBGrapError(f"'{directory}' is not a bbgrap plan (no {MANIFEST}); run 'bbgrap compile MODEL -o {directory}' first")
    try:
        with open(path, encoding="utf-8") as fh:
            manifest = json.load(fh)
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not valid JSON"
        raise BBGrapError(f"{path} is unreadable ({reason}); compile the plan again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != PLAN_FORMAT:
        raise BBGrapError(f"{path} is not a bbgrap plan manifest; compile the plan again")
    try:
        return Plan.from_json(manifest)
    except PlanVersionError as exc:
        raise BBGrapError(f"plan '{directory}' has format version {exc.found}, this bbgrap reads version {PLAN_VERSION}; "
                          f"compile it again with this bbgrap") from None
    except PlanSchemaError as exc:
        raise BBGrapError(f"{path} is damaged ({exc}); compile the plan again") from None


def verify_files(directory: str, plan: Plan, nodes: Iterable[int]) -> None:
    """Check the segment files of `nodes` against the manifest's checksums: a damaged file,
    or one copied from another compile, is named in one line."""
    for rel in plan.files_read_by(nodes):
        _verify(directory, plan, rel)


def _verify(directory: str, plan: Plan, rel: str) -> None:
    path = os.path.join(directory, rel)
    try:
        digest = file_sha256(path)
    except OSError as exc:
        raise BBGrapError(f"cannot read {path} ({exc.strerror or type(exc).__name__}); copy the whole plan directory "
                          f"or compile the plan again") from None
    if digest != plan.files.get(rel):
        raise BBGrapError(f"{path} does not match the plan's manifest (damaged, or from another compile); "
                          f"copy the whole plan directory or compile the plan again")


def read_sample(directory: str, plan: Plan | None = None) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The sample inputs and the original model's outputs on them (checked against the
    manifest's checksum where it is given)."""
    path = os.path.join(directory, SAMPLE)
    if plan is not None:
        _verify(directory, plan, SAMPLE)
    try:
        with np.load(path, allow_pickle=False) as data:
            inputs = {k[6:]: data[k] for k in data.files if k.startswith("input:")}
            outputs = {k[7:]: data[k] for k in data.files if k.startswith("output:")}
    except FileNotFoundError:
        raise BBGrapError(f"{path} is missing; copy the whole plan directory or compile the plan again") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise BBGrapError(f"{path} is unreadable ({type(exc).__name__}); compile the plan again") from None
    if plan is not None:
        missing = [s.name for s in plan.inputs if s.name not in inputs]
        missing += [s.name for s in plan.outputs if s.name not in outputs]
        if missing:
            raise BBGrapError(f"{path} lacks '{missing[0]}'; compile the plan again")
    return inputs, outputs
