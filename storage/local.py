"""A local folder as storage."""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dinrec.storage.base import Storage, Versioned, WriteConflict
from dinrec.storage.files import write_atomically


def _version(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


class LocalStorage(Storage):
    """A folder. ``durable``: fsync each file and its folder before and after the rename, so a written
    key survives a machine crash, not only a process crash (checkpoints ask for it)."""

    def __init__(self, root: str | Path, durable: bool = False) -> None:
        self.root, self.durable = Path(root), durable
        self.uri = str(self.root)

    def put_bytes(self, key: str, data: bytes) -> None:
        write_atomically(self.root / key, data, self.durable)

    def get_bytes(self, key: str) -> bytes | None:
        try:
            return (self.root / key).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def get_versioned(self, key: str) -> Versioned | None:
        data = self.get_bytes(key)
        return None if data is None else Versioned(data, _version(data))

    @contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        """An exclusive flock on a hidden file beside ``key``: conditional writers of one key, in any process
        on this machine, take turns (keys() skips hidden names). flock is not reliable over NFS: a folder
        shared between machines needs S3 (or a Kubernetes Lease) for compare-and-swap."""
        path = self.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def put_if(self, key: str, data: bytes, version: str | None) -> str:
        with self._locked(key):
            current = self.get_versioned(key)
            if (current.version if current else None) != version:
                have = f"at version {current.version}" if current else "absent"
                raise WriteConflict(f"{self.child_uri(key)} is {have}, not {version or 'absent'} as read")
            write_atomically(self.root / key, data, self.durable)
        return _version(data)

    def keys(self, prefix: str) -> list[str]:
        folder = self.root / prefix.rpartition("/")[0]  # the deepest folder the prefix names whole
        if not folder.is_dir():
            return []
        return sorted(k for k in (p.relative_to(self.root).as_posix() for p in folder.rglob("*")
                                  if p.is_file() and not p.name.startswith("."))
                      if k.startswith(prefix))

    def delete(self, key: str) -> None:
        path = self.root / key
        path.unlink(missing_ok=True)
        parent = path.parent
        while parent != self.root and parent.is_dir() and not any(parent.iterdir()):  # no empty folders left
            parent.rmdir()
            parent = parent.parent
