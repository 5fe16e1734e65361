"""The one write-then-rename of files and of folders on a local disk."""

from __future__ import annotations

import hashlib
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes (read a MiB at a time: bundles and wheels are large)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fsync_dir(path: Path) -> None:
    """Make the folder's entries (files created, renamed or removed in it) survive a machine crash:
    fsync on a file covers its data, not its name."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes, durable: bool = False) -> None:
    """Replace ``path`` with ``data`` so that a reader sees the old file or the new one, never half of
    one (a temp file beside it, then a rename). ``durable``: fsync the file and its folder as well, so
    the write survives a machine crash, not only a process crash. The one write-then-rename of files."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # pid and a random part: containers on one shared volume all run as pid 1..n, and two of them
    # writing the same file must not share a temp file.
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}-{uuid.uuid4().hex[:12]}")
    with tmp.open("wb") as fh:
        fh.write(data)
        if durable:
            fh.flush()
            os.fsync(fh.fileno())
    os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)


@contextmanager
def folder_written_atomically(target: Path, replace: bool = True) -> Iterator[Path]:
    """An empty temp folder beside ``target`` to fill; when the block ends without an error it is
    renamed into place, so ``target`` is whole or absent, never half written. ``replace``: an existing
    ``target`` is removed first; otherwise one another writer renamed there first is kept (theirs is
    the same immutable thing). On an error the temp folder is removed. The one write-then-rename of
    folders (bundles, samples, cached and fetched versions)."""
    target = Path(target)
    tmp = target.parent / f".tmp-{target.name}-{os.getpid()}-{time.time_ns()}"
    tmp.mkdir(parents=True)
    try:
        yield tmp
        if replace and target.exists():
            shutil.rmtree(target)
        try:
            tmp.rename(target)
        except OSError:
            if replace or not target.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
