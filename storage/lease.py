"""A lease on the storage layer: one holder at a time across processes and machines, and none once its
holder dies.

The lease is one key holding ``{"holder", "expires", "since"}``. It is taken, renewed and released by
compare-and-swap (:meth:`storage.Storage.put_if`: S3's conditional writes, a lock beside the file in a
folder), so of two takers exactly one gets it. A holder renews it every ``ttl_s / 3`` from a
background thread while it works; a holder that dies (kill -9, a lost machine) stops renewing and the
lease is free ``ttl_s`` after its last renewal — no stale lock to clear by hand. A holder that fails to
renew (the key was taken over after a stall longer than the TTL, or storage was unreachable past it)
learns it from :meth:`Lease.check` before it acts on what the lease protects: ``check`` raises once the
last successful renewal is about to run out, whether or not anyone has taken the lease yet.

Each holder that takes the lease from another gets a **fencing token** one above the last
(``Lease.token``). A write the lease guards goes through :meth:`Lease.fenced_put_json`: the document
carries the writer's token and is written by compare-and-swap on the version read, refused
(:class:`LeaseLost`) if it already carries a higher one — so a holder that stalled past its lease and
wakes up cannot overwrite what its successor wrote, even between its last ``check`` and its write.

Expiry compares wall clocks of different machines: keep ``ttl_s`` well above their skew (NTP: ms).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

from dinrec.storage.aws import CloudError
from dinrec.storage.base import Storage, WriteConflict, json_bytes
from dinrec.storage.loops import every

log = logging.getLogger(__name__)


class LeaseHeld(RuntimeError):
    """Another holder has the lease; ``holder`` is what it wrote (holder, since, expires)."""

    def __init__(self, where: str, holder: dict) -> None:
        super().__init__(f"another holder has the lease {where}: {holder.get('holder', 'unknown')} "
                         f"(until {holder.get('expires', 0):.0f} unless renewed)")
        self.holder = holder


class LeaseLost(RuntimeError):
    """This holder's lease was taken over or could not be renewed in time: stop acting on it."""


def default_holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Lease:
    def __init__(self, storage: Storage, key: str, *, ttl_s: float = 60.0, holder: str | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        if ttl_s <= 0:
            raise ValueError("a lease's ttl_s must be > 0")
        self.storage, self.key, self.ttl_s = storage, key, ttl_s
        self.holder, self.clock = holder or default_holder(), clock
        self.where = storage.child_uri(key)
        self._version: str | None = None
        self._since = 0.0
        self._valid_until = 0.0  # the last successful take or renewal, plus ttl_s
        self.token = 0  # the fencing token: one above the previous holder's
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._lost: str | None = None

    def _doc(self, expires: float) -> bytes:
        return json.dumps({"holder": self.holder, "since": self._since, "expires": expires,
                           "token": self.token}).encode()

    def read(self) -> dict | None:
        """What the key holds now (None: never taken)."""
        found = self.storage.get_versioned(self.key)
        return json.loads(found.data) if found else None

    def acquire(self) -> Lease:
        """Take the lease if it is free (never taken, released, or expired) or already this holder's;
        raise :class:`LeaseHeld` otherwise."""
        found = self.storage.get_versioned(self.key)
        now = self.clock()
        current = json.loads(found.data) if found else {}
        if found and current.get("holder") != self.holder and float(current.get("expires", 0)) > now:
            raise LeaseHeld(self.where, current)
        self._since = now
        previous = int(current.get("token", 0))
        self.token = previous if current.get("holder") == self.holder else previous + 1
        try:
            self._version = self.storage.put_if(self.key, self._doc(now + self.ttl_s), found.version if found else None)
        except WriteConflict:
            raise LeaseHeld(self.where, self.read() or {}) from None  # another taker won the race
        self._valid_until = now + self.ttl_s
        self._lost = None
        return self

    def renew(self) -> None:
        """Extend the lease by ``ttl_s`` from now; raise :class:`LeaseLost` if it is no longer this holder's."""
        if self._version is None:
            raise LeaseLost(f"{self.where}: not held")
        now = self.clock()  # before the write: the lease runs from no later than this
        try:
            self._version = self.storage.put_if(self.key, self._doc(now + self.ttl_s), self._version)
            self._valid_until = now + self.ttl_s
        except WriteConflict:
            self._version = None
            raise LeaseLost(f"{self.where}: taken over by {(self.read() or {}).get('holder')}") from None

    def release(self) -> None:
        """Free the lease now (it is written expired, conditionally: a lease lost meanwhile is left alone)."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
            self._renewer = None
        if self._version is not None:
            try:
                self.storage.put_if(self.key, self._doc(0.0), self._version)
            except (WriteConflict, CloudError) as exc:  # taken over, or unreachable: it expires by itself
                log.warning("lease %s not released (it expires by itself): %s", self.where, exc)
            self._version = None

    @property
    def held(self) -> bool:
        """Taken by this holder and not released (it may still have been lost: :meth:`check` says)."""
        return self._version is not None

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the background renewal found the lease gone, or if the last
        successful renewal is about to run out (within half a renewal period: two renewals in a row
        failed) — another holder may take it then, whatever this one believes."""
        if self._lost is not None or self._version is None:
            raise LeaseLost(self._lost or f"{self.where}: not held")
        left = self._valid_until - self.clock()
        if left < self.ttl_s / 6:
            raise LeaseLost(f"{self.where}: not renewed in time ({max(left, 0):.1f}s of {self.ttl_s:g}s left): "
                            "another holder may have it")

    def fenced_put_json(self, storage: Storage, key: str, doc: dict) -> None:
        """Write ``doc`` (a JSON object) to ``key`` as this holder: after :meth:`check`, with ``"fence":
        token`` in it, by compare-and-swap on the version read; :class:`LeaseLost` (nothing written) if
        the key holds a higher token — a later holder's write."""
        self.check()
        for _ in range(5):  # a racing writer with a lower token (an older holder) may win a round
            found = storage.get_versioned(key)
            fence = int(json.loads(found.data).get("fence", 0)) if found else 0
            if fence > self.token:
                raise LeaseLost(f"{self.where}: {key} was written by a later holder (token {fence} > {self.token})")
            try:
                storage.put_if(key, json_bytes({**doc, "fence": self.token}), found.version if found else None)
                return
            except WriteConflict:
                continue
        raise LeaseLost(f"{self.where}: {key} kept changing under this holder's writes")

    def keep(self) -> Lease:
        """Renew from a background thread every ``ttl_s / 3`` until :meth:`release`. A renewal that fails
        for storage reasons is logged and retried at the next beat (storage.loops.every); one that finds
        the lease taken ends the thread and :meth:`check` raises from then on."""
        def beat() -> None:
            try:
                self.renew()
            except LeaseLost as exc:
                self._lost = str(exc)
                log.error("lease lost: %s", exc)
                self._stop.set()  # nothing left to renew

        self._stop.clear()
        self._renewer = every(self.ttl_s / 3, self._stop, beat, name=f"dinrec-lease {self.where}")
        return self

    def __enter__(self) -> Lease:
        return self.acquire().keep()

    def __exit__(self, *exc: object) -> None:
        self.release()
