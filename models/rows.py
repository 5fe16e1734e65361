"""Tables that grow by appending rows while readers hold earlier versions of them.

Serving extends its item tables as new catalog items arrive (the cold lane: models.ranking.ColdLane)
while requests score against them on other threads. Copying a table of a million items for each new
item would cost more than the item is worth, so a table keeps spare rows past its end: appending writes
the new rows there and returns a new, longer view of the same buffer; a reader holding the old view
sees exactly the rows it had (nobody writes below a published length). Only when the spare runs out
is the buffer copied, into one with proportionally more spare: amortised, a row is copied O(1) times.
"""

from __future__ import annotations

import threading

import torch


class _Buffer:
    """The storage behind every version of one table, and how many of its rows are written."""

    def __init__(self, parts: list[torch.Tensor], spare: int) -> None:
        n = sum(len(p) for p in parts)
        self.data = torch.empty((n + spare, *parts[0].shape[1:]), dtype=parts[0].dtype)  # (capacity, ...)
        at = 0
        for p in parts:
            self.data[at:at + len(p)] = p
            at += len(p)
        self.written = n
        self.lock = threading.Lock()


class AppendOnlyRows:
    """An immutable view of the first ``len(self)`` rows of a growable buffer; :meth:`appended` returns
    a longer one. ``min_spare`` rows of room are kept (and at least an eighth of the table when it
    grows), so small appends copy nothing."""

    def __init__(self, rows: torch.Tensor, min_spare: int = 1024) -> None:
        self._buf = _Buffer([rows], max(min_spare, len(rows) // 8))
        self._n = len(rows)
        self.min_spare = min_spare

    @classmethod
    def _view(cls, buf: _Buffer, n: int, min_spare: int) -> AppendOnlyRows:
        out = cls.__new__(cls)
        out._buf, out._n, out.min_spare = buf, n, min_spare
        return out

    def __len__(self) -> int:
        return self._n

    @property
    def rows(self) -> torch.Tensor:
        """(n, ...) the rows of this version: a view, no copy."""
        return self._buf.data[:self._n]

    @property
    def capacity(self) -> int:
        return len(self._buf.data)

    def appended(self, new: torch.Tensor) -> AppendOnlyRows:
        """This table with ``new`` (k, ...) after its rows. In place in the buffer when this is its
        latest version and the room suffices; otherwise (an older version extended, or the room full)
        into a new buffer, leaving every published view as it was."""
        new = new.to(self._buf.data.dtype)
        n, k = self._n, len(new)
        buf = self._buf
        with buf.lock:
            if buf.written == n and n + k <= len(buf.data):
                buf.data[n:n + k] = new
                buf.written = n + k
                return self._view(buf, n + k, self.min_spare)
        grown = _Buffer([self.rows, new], max(self.min_spare, (n + k) // 8))
        return self._view(grown, n + k, self.min_spare)
