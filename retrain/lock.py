"""One retrain at a time per work folder: an exclusive ``flock`` the kernel drops when the holder
dies (kill -9 included), so a crashed run never leaves a stale lock behind.

It covers runs on one host or one shared volume (a Kubernetes CronJob's PVC, with
``concurrencyPolicy: Forbid`` in front of it); it is not a lock across machines with separate disks.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path


class Locked(RuntimeError):
    """Another run holds the lock; ``holder`` is what it wrote (pid, host, since)."""

    def __init__(self, path: Path, holder: dict) -> None:
        super().__init__(f"another retrain holds {path}: {holder or 'unknown holder'}")
        self.path, self.holder = path, holder


class RunLock:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    def __enter__(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
            except ValueError:
                holder = {}
            os.close(fd)
            raise Locked(self.path, holder) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}).encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
