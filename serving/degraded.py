"""Degraded, never down: the feature store behind a circuit breaker.

A request that cannot read the store (down, slow past its timeout, or skipped while the breaker is
open) is still answered — from the request's own context or from popularity — and marked
``degraded``. After a failure the store is skipped for ``cooldown_s`` (so an outage costs each
request nothing, not a timeout), then one request probes it; the first success closes the breaker.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from dinrec.events.features import HistoryItem
from dinrec.feature_store.errors import StoreUnavailable
from dinrec.feature_store.online import OnlineStore

log = logging.getLogger(__name__)
T = TypeVar("T")


class Breaker:
    def __init__(self, cooldown_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._open_until = 0.0
        self._lock = threading.Lock()

    @property
    def open(self) -> bool:
        return self._clock() < self._open_until

    def allow(self) -> bool:
        """True when a call may go through: closed, or open past its cool-down (then only this one
        probe passes until it reports)."""
        with self._lock:
            now = self._clock()
            if now < self._open_until:
                return False
            if self._open_until:  # half-open: hold the others back while this call probes
                self._open_until = now + self.cooldown_s
            return True

    def record(self, ok: bool) -> None:
        with self._lock:
            self._open_until = 0.0 if ok else self._clock() + self.cooldown_s


class GuardedStore:
    """The online store's reads, through a breaker: None instead of an exception when unavailable."""

    def __init__(self, store: OnlineStore, cooldown_s: float = 1.0, *, popular_cache_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.breaker = Breaker(cooldown_s)
        # Popularity changes slowly and, on a sharded store, is merged from every shard on each read:
        # the longest list read within popular_cache_s answers every shorter request (a prefix of the
        # exact top n is the exact top of fewer).
        self._popular_cache_s, self._clock = popular_cache_s, clock
        self._popular: tuple[float, int, list[tuple[str, float]]] = (float("-inf"), 0, [])

    def _call(self, fn: Callable[[], T]) -> T | None:
        if not self.breaker.allow():
            return None
        try:
            value = fn()
        except StoreUnavailable as exc:
            if not self.breaker.open:
                log.warning("feature store unavailable, answering degraded for %.1fs: %s", self.breaker.cooldown_s, exc)
            self.breaker.record(False)
            return None
        self.breaker.record(True)
        return value

    def history(self, user_id: str, limit: int) -> list[HistoryItem] | None:
        return self._call(lambda: self.store.history(user_id, limit))

    def history_and_interacted(self, user_id: str, limit: int) -> tuple[list[HistoryItem], frozenset[str]] | None:
        return self._call(lambda: self.store.history_and_interacted(user_id, limit))

    def popular(self, n: int) -> list[tuple[str, float]] | None:
        read_at, have, items = self._popular
        now = self._clock()
        if now - read_at < self._popular_cache_s and (have >= n or len(items) < have):  # short: all there is
            return items[:n]
        fresh = self._call(lambda: self.store.popular(n))
        if fresh is not None:
            self._popular = (now, n, fresh)
        return fresh
