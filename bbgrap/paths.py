"""Where bbgrap writes: every target checked before any work (one line naming the flag and the
fix), and every file written whole or not at all. Standard library only, so the commands can
check their arguments before importing anything heavy."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence


def file_target_problem(path: str, flag: str, example: str, keep: Sequence[tuple[str | None, str]] = ()) -> str | None:
    """Why the file `flag` names cannot be written at `path` (None: it can). `keep`: the files the
    command reads (and directories whose files it reads), each with what it is, as "the --input
    file": writing over one of them, or into one of those directories, would lose it."""
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return f"{flag} {path} is a directory; give a file name such as {os.path.join(path, example)}"
    if not os.path.isdir(parent):
        return f"{flag} {path}: the directory {parent} does not exist; create it first or write elsewhere"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{flag} {path}: the directory {parent} is not writable; write elsewhere"
    for other, what in keep:
        if other and same_file(path, other):
            return f"{flag} {path} is {what}, which it would overwrite; write it elsewhere, e.g. {flag} {example}"
        if other and inside(path, other):
            return f"{flag} {path} is inside {what}, whose files it could overwrite; write it elsewhere, e.g. {flag} {example}"
    return None


def inside(path: str, directory: str) -> bool:
    """Whether `path` lies in `directory` (links followed), at any depth; either may not exist yet."""
    return os.path.realpath(path).startswith(os.path.join(os.path.realpath(directory), ""))


def same_file(a: str, b: str) -> bool:
    """Whether two paths name one file (where both exist; else whether they are the same path)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.normpath(os.path.abspath(a)) == os.path.normpath(os.path.abspath(b))


def new_dir_problem(path: str, flag: str, shown: str) -> str | None:
    """Why directory `path`, which does not exist yet, could not be made: its nearest existing
    ancestor is a file or is not writable (None: it can be). `shown` is the path as the user gave it."""
    ancestor = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        return f"{flag} {shown}: '{ancestor}' is a file, not a directory; choose another {flag} DIR"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"{flag} {shown}: cannot create it, '{ancestor}' is not writable; choose another {flag} DIR"
    return None


@contextlib.contextmanager
def written_whole(path: str) -> Iterator[str]:
    """A temporary path beside `path` to write the file into: renamed over `path` when the
    block ends, removed when it fails, so `path` holds the old file or the whole new one."""
    full = os.path.abspath(path)
    tmp = os.path.join(os.path.dirname(full), f".{os.path.basename(full)}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, full)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
