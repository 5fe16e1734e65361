"""What the worker processes of one replica share: a folder (``DINREC_REPLICA_DIR``; `dinrec serve`
makes one for its workers) holding their merged metrics (serving.metrics) and which of them leads.

A lead is an ``flock`` on a file in that folder, tried without waiting: one worker holds it, the
others see it held, and the kernel frees it when its holder dies (kill -9 included), so another worker
takes it at its next try. Without a folder — one process — that process always leads."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class ReplicaLead:
    def __init__(self, folder: str | Path | None, name: str) -> None:
        self.path = Path(folder) / f"{name}.lead" if folder else None
        self._fd: int | None = None

    def holds(self) -> bool:
        """Whether this process leads: it holds the lock, or takes it now because nobody does."""
        if self.path is None or self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the lock
            self._fd = None
