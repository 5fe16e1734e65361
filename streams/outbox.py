"""The outbox: events accepted by the API wait here, in a journal on local disk, until the stream
has them. The request path appends to the journal (a write() of a few hundred bytes, no network)
and returns; a background sender publishes from the journal and moves a cursor once the broker
has acknowledged. So a slow or stopped broker never holds a request, and nothing accepted is lost:
not when the broker is down for an hour, nor when this process is killed (the journal is in the
page cache once write() returns; ``fsync=True`` makes it survive a machine crash too). When the
journal reaches ``max_bytes`` the API refuses new events (503, Retry-After) instead of losing them.

Delivery to the stream is at least once (a crash between the broker's ack and the cursor write
resends a batch); events carry their event id, so the store applies each once.

Layout: ``{directory}/slot-{k}/`` per process (a flock on ``slot-k/lock`` is held for the process'
life, so several workers on one host never share a journal; a restarted worker takes the first
free slot and sends what its predecessor left), with segments ``{seq:012d}.log`` of entries
``u32 length | u32 crc32 | u16 key length | key | value`` and ``cursor`` = "seq offset" of the first
unsent entry, replaced atomically.
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import tempfile
import threading
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dinrec.storage import fsync_dir, write_atomically
from dinrec.storage.loops import worker
from dinrec.streams.base import EventStream, OutgoingRecord
from dinrec.streams.errors import StreamError, StreamUnavailable

if TYPE_CHECKING:
    from dinrec.streams.settings import StreamSettings

log = logging.getLogger(__name__)

_HEAD = struct.Struct("<II")
_KEYLEN = struct.Struct("<H")
_CHUNK = 1 << 20  # events are at most 16 KiB, so a chunk always holds a whole one
# With nothing to send, the sender sleeps until a put wakes it, or this long: a fallback that looks again at
# bytes pending but unreadable, without a spin.
_IDLE_S = 0.5


class OutboxFull(StreamError):
    """The journal holds ``max_bytes`` not yet sent: the stream is down or far behind."""


def _encode(r: OutgoingRecord) -> bytes:
    key = r.key or b""
    payload = _KEYLEN.pack(len(key)) + key + r.value
    return _HEAD.pack(len(payload), zlib.crc32(payload)) + payload


def _scan(path: Path, start: int, end: int | None = None,
          limit: int | None = None) -> tuple[list[OutgoingRecord], list[int]]:
    """Entries of one segment from byte ``start`` (up to ``end``, at most ``limit``), and the byte
    offset after each; stops at the first torn or corrupt entry (a crash mid-append)."""
    out: list[OutgoingRecord] = []
    ends: list[int] = []
    with path.open("rb") as fh:
        pos = start
        while limit is None or len(out) < limit:
            fh.seek(pos)
            want = _CHUNK if end is None else min(_CHUNK, end - pos)
            data = fh.read(want) if want > 0 else b""
            at = 0
            while at + _HEAD.size <= len(data) and (limit is None or len(out) < limit):
                length, crc = _HEAD.unpack_from(data, at)
                payload = data[at + _HEAD.size:at + _HEAD.size + length]
                if len(payload) < length:
                    break  # continues in the next chunk, or is torn
                if zlib.crc32(payload) != crc or length < _KEYLEN.size:
                    return out, ends
                (klen,) = _KEYLEN.unpack_from(payload)
                key = payload[_KEYLEN.size:_KEYLEN.size + klen]
                out.append(OutgoingRecord(payload[_KEYLEN.size + klen:], key=key or None))
                at += _HEAD.size + length
                ends.append(pos + at)
            if at == 0:  # nothing complete in a whole chunk: the end, or a torn entry
                return out, ends
            pos += at
    return out, ends


class Outbox:
    def __init__(self, stream: EventStream, directory: str | Path, *, max_bytes: int = 256 << 20,
                 segment_bytes: int = 16 << 20, fsync: bool = False, send_batch: int = 1000,
                 slot: Path | None = None) -> None:
        """``slot``: take that slot folder (raises BlockingIOError if a process holds it), not the first free."""
        self.stream = stream
        self.max_bytes, self.segment_bytes, self.fsync, self.send_batch = max_bytes, segment_bytes, fsync, send_batch
        self.dir, self._lock_fd = _lock_slot(slot) if slot is not None else _take_slot(Path(directory))
        self._lock = threading.Lock()           # appends and the positions below
        self._wake = threading.Event()          # set by a put: the sender looks at once
        self._stop = threading.Event()
        self._drained = threading.Event()       # set while nothing is pending
        self._thread: threading.Thread | None = None
        self.sent = 0
        self._cursor = self._read_cursor()      # (segment, offset) of the first unsent entry
        self._pending = self._recover()         # bytes accepted and not yet acknowledged
        self._seg = max([self._cursor[0], *self._segments()])  # appends go to the newest segment
        self._fd = self._open_segment(self._seg)
        self._seg_size = os.fstat(self._fd).st_size
        self._failing: str | None = None  # why the last put could not write (None: it could)

    # -------------------------------------------------------------- request path
    def put(self, records: Sequence[OutgoingRecord]) -> None:
        """Append ``records`` to the journal (raises OutboxFull, nothing appended, when it is full)."""
        blob = b"".join(_encode(r) for r in records)
        with self._lock:
            if self._pending + len(blob) > self.max_bytes:
                raise OutboxFull(f"the event outbox holds {self._pending} unsent bytes (limit {self.max_bytes})")
            try:
                if self._seg_size and self._seg_size + len(blob) > self.segment_bytes:
                    self._roll()
            except OSError as exc:  # no new segment (disk full, no descriptors): the journal is as it was
                self._failing = f"cannot start a new segment in {self.dir}: {exc.strerror or exc}"
                raise OutboxFull(f"the event outbox {self._failing}") from exc
            try:
                _write_all(self._fd, blob)
                if self.fsync:
                    os.fsync(self._fd)
            except OSError as exc:  # disk full, a size limit, EIO: nothing of this put may stay behind
                # A torn entry would end the sender's scan there, hiding every later append.
                os.ftruncate(self._fd, self._seg_size)
                self._failing = f"cannot write to {self.dir}: {exc.strerror or exc}"
                raise OutboxFull(f"the event outbox {self._failing}") from exc
            self._failing = None
            self._seg_size += len(blob)
            self._pending += len(blob)
            self._drained.clear()
        self._wake.set()

    @property
    def pending_bytes(self) -> int:
        with self._lock:  # read with the sent count's update (_advance), never between its halves
            return self._pending

    def journal_problem(self) -> str | None:
        """Why events cannot be accepted now (readiness reports it), or None. After a failed put, the
        journal counts as failing until a put succeeds or the journal could take one again (a descriptor
        to spare, the folder writable with room for a segment) — checked here, so a replica taken out of
        the load balancer comes back without needing a put."""
        with self._lock:
            failing = self._failing
        if failing is None:
            return None
        try:
            os.close(os.dup(self._fd))  # a descriptor to spare, for the next segment
            room = os.statvfs(self.dir)
            if os.access(self.dir, os.W_OK) and room.f_bavail * room.f_frsize >= self.segment_bytes:
                with self._lock:
                    self._failing = None
                return None
        except OSError:
            pass
        return failing

    @property
    def sender_alive(self) -> bool:
        """The sender thread runs (readiness and ``dinrec_thread_alive`` read it)."""
        return self._thread is not None and self._thread.is_alive()

    # -------------------------------------------------------------- sender
    def start(self) -> Outbox:
        """Start the sender: storage.loops.worker, woken by each put, retrying a stopped broker (or a full
        disk under the cursor, or a bug) with backoff, never ending before :meth:`close`."""
        self._thread = worker(self._send_once, self._stop, name="dinrec-outbox", wake=self._wake, idle_s=_IDLE_S,
                              outages=(StreamUnavailable,), context=lambda: f"{self._pending} bytes wait")
        return self

    def close(self, drain_timeout_s: float = 5.0) -> None:
        """Send what is pending for up to ``drain_timeout_s``, then stop; the rest stays journaled."""
        if self._thread is not None:
            self._drained.wait(drain_timeout_s)
            self._stop.set()
            self._wake.set()
            self._thread.join(timeout=30)
        os.close(self._fd)
        os.close(self._lock_fd)

    def _send_once(self) -> bool:
        """Publish the next batch and move the cursor past it; False when there is nothing to send (a
        StreamUnavailable, raised, is retried by the worker with backoff: the cursor has not moved)."""
        batch, after, size = self._next_batch()
        if not batch:
            with self._lock:  # as put() clears it: a put that lands after this check leaves it cleared
                if self._pending == 0:
                    self._drained.set()
            return False  # wait for the next put; never a spin while bytes are pending but unreadable
        self.stream.publish_raw(batch)
        self._advance(after, size, len(batch))
        return True

    def _next_batch(self) -> tuple[list[OutgoingRecord], tuple[int, int], int]:
        while True:
            with self._lock:
                seg, off = self._cursor
                write_seg, write_end = self._seg, self._seg_size
            end = write_end if seg == write_seg else None
            try:
                records, ends = _scan(self._seg_path(seg), off, end, limit=self.send_batch)
            except FileNotFoundError:  # a segment number with no file (left by an older roll): nothing in it
                if seg == write_seg:
                    raise
                records, ends = [], []
            if records:
                return records, (seg, ends[-1]), ends[-1] - off
            if seg == write_seg:
                return [], (seg, off), 0
            self._advance((seg + 1, 0), 0)  # this segment is done: go on to the next one

    def _advance(self, cursor: tuple[int, int], size: int, sent: int = 0) -> None:
        write_atomically(self.dir / "cursor", f"{cursor[0]} {cursor[1]}".encode(), durable=self.fsync)
        with self._lock:  # one step: a reader never sees the bytes gone and the records not yet counted as sent
            self._cursor = cursor
            self._pending -= size
            self.sent += sent
        for old in self._segments():
            if old < cursor[0]:
                self._seg_path(old).unlink(missing_ok=True)

    # -------------------------------------------------------------- files
    def _seg_path(self, seq: int) -> Path:
        return self.dir / f"{seq:012d}.log"

    def _segments(self) -> list[int]:
        return sorted(int(p.stem) for p in self.dir.glob("*.log"))

    def _roll(self) -> None:
        """The next segment opened first, then the old one closed: an open that fails (raises) leaves the
        journal writing where it was, never a closed descriptor or a segment number with no file."""
        fd = self._open_segment(self._seg + 1)
        old, self._fd = self._fd, fd
        self._seg += 1
        self._seg_size = 0
        try:
            os.close(old)
        except OSError as exc:  # its bytes were written (each put writes whole): nothing to undo
            log.warning("outbox: closing segment %d: %s", self._seg - 1, exc)

    def _open_segment(self, seq: int) -> int:
        fd = os.open(self._seg_path(seq), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            if self.fsync:  # the new segment's name too, or a crash keeps its fsynced entries nameless
                fsync_dir(self.dir)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _read_cursor(self) -> tuple[int, int]:
        try:
            seg, off = (self.dir / "cursor").read_text().split()
            return int(seg), int(off)
        except FileNotFoundError:
            pass
        except ValueError:  # empty or torn (a crash before it reached the disk): resend, never lose
            log.error("outbox: %s is unreadable; sending again from the oldest segment (the store's dedup "
                      "counts each event once)", self.dir / "cursor")
        segments = self._segments()
        return (segments[0] if segments else 0), 0

    def _recover(self) -> int:
        """Pending bytes from the cursor on; a torn entry at the end of the last segment (a crash
        mid-append, never acknowledged to a client) is cut off."""
        pending = 0
        for seg in self._segments():
            if seg < self._cursor[0]:  # sent; left by a crash between the cursor write and the unlink
                self._seg_path(seg).unlink()
                continue
            start = self._cursor[1] if seg == self._cursor[0] else 0
            _, ends = _scan(self._seg_path(seg), start)
            valid_end = ends[-1] if ends else start
            size = self._seg_path(seg).stat().st_size
            if valid_end < size:
                log.warning("outbox: cutting %d torn bytes off %s", size - valid_end, self._seg_path(seg))
                os.truncate(self._seg_path(seg), valid_end)
            pending += valid_end - start
        return pending


def _write_all(fd: int, blob: bytes) -> None:
    """``os.write`` until every byte is written (a write may take fewer; past the disk's end it raises)."""
    view = memoryview(blob)
    while view:
        view = view[os.write(fd, view):]


def _lock_slot(slot: Path) -> tuple[Path, int]:
    """``slot`` locked for this process' life (BlockingIOError if another process holds it)."""
    fd = os.open(slot / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise
    return slot, fd


def adopt_orphaned_slots(stream: EventStream, directory: Path, own: Path, *, drain_timeout_s: float = 3600) -> int:
    """Send what slots no process holds still journal — left by a worker that no longer runs (a host
    restarted with fewer workers) — each with its own sender until drained; returns the slots adopted."""
    adopted = 0
    for slot in sorted(p for p in directory.glob("slot-*") if p.is_dir() and p != own):
        if not any(f.stat().st_size for f in slot.glob("*.log")):
            continue
        try:
            orphan = Outbox(stream, directory, slot=slot)
        except BlockingIOError:  # a running worker's own slot
            continue
        if orphan.pending_bytes == 0:
            orphan.close(drain_timeout_s=0)
            continue
        log.warning("outbox: adopting %s (%d bytes left by a worker that no longer runs)", slot, orphan.pending_bytes)
        orphan.start()
        orphan.close(drain_timeout_s=drain_timeout_s)
        adopted += 1
    return adopted


def _take_slot(directory: Path) -> tuple[Path, int]:
    """The first ``slot-k`` folder no other process holds, locked for this process' life."""
    directory.mkdir(parents=True, exist_ok=True)
    k = 0
    while True:
        slot = directory / f"slot-{k}"
        if not slot.exists():
            slot.mkdir(exist_ok=True)
            fsync_dir(directory)  # once per new slot: its name survives a crash like its contents
        try:
            return _lock_slot(slot)
        except BlockingIOError:
            k += 1


def open_outbox(stream: EventStream, settings: StreamSettings) -> Outbox:
    """The configured outbox, its sender started. Kafka's journal lives in a state folder kept across
    restarts; the in-process stream's in a fresh temp folder (that stream dies with the process)."""
    directory = settings.outbox_dir
    if directory is None:
        if settings.stream == "inprocess":
            directory = Path(tempfile.mkdtemp(prefix="dinrec-outbox-"))
        else:
            state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
            directory = state / "dinrec" / "outbox" / settings.topic
    box = Outbox(stream, directory, max_bytes=settings.outbox_max_bytes, fsync=settings.outbox_fsync).start()

    def adopt() -> None:
        try:
            adopt_orphaned_slots(stream, Path(directory), box.dir)
        except Exception:  # noqa: BLE001 - the worker's own outbox is unaffected; say so loudly
            log.exception("outbox: adopting orphaned slots in %s failed; they stay journaled", directory)

    threading.Thread(target=adopt, name="dinrec-outbox-adopt", daemon=True).start()
    return box
