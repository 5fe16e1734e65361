"""The embedded default: an in-process store with the same semantics as Redis."""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence

from feature_store.errors import OffsetConflict
from feature_store.features import HistoryItem, merge_history
from feature_store.online.base import DEFAULT_DEDUP_WINDOW_S, OnlineStore, StreamOffsets


class MemoryStore(OnlineStore):
    def __init__(self, history_cap: int = 50, dedup_window_s: float = DEFAULT_DEDUP_WINDOW_S,
                 clock: Callable[[], float] | None = None) -> None:
        super().__init__(history_cap, dedup_window_s, clock)
        self._hist: dict[str, list[HistoryItem]] = defaultdict(list)
        self._pop: Counter[str] = Counter()
        # user -> {event_id: first applied at}; insertion order is application order, so expiry pops
        # from the front (like the Redis store's ZREMRANGEBYSCORE).
        self._seen: dict[str, dict[str, float]] = defaultdict(dict)
        self._offsets: dict[str, dict[int, int]] = defaultdict(dict)
        self._lock = threading.Lock()  # the ingest thread writes while requests read

    def _write(self, items: list[tuple[str, HistoryItem]], offsets: StreamOffsets | None, now: float) -> int:
        by_user: dict[str, list[HistoryItem]] = defaultdict(list)
        for user, h in items:
            by_user[user].append(h)
        added = 0
        with self._lock:
            if offsets is not None:
                held = self._offsets[offsets.topic]
                stale = {p: held.get(p, -1) for p, want in offsets.expected.items() if held.get(p, -1) != want}
                if stale:
                    raise OffsetConflict(offsets.topic, stale)
                held.update(offsets.last)
            for user, new in by_user.items():
                seen = self._seen[user]
                while seen and next(iter(seen.values())) <= now - self.dedup_window_s:
                    del seen[next(iter(seen))]
                kept = {h.event_id for h in self._hist[user]}
                fresh = []
                for h in new:
                    if h.event_id in seen:
                        continue
                    seen[h.event_id] = now
                    if h.event_id in kept:  # applied before, and its seen-entry has expired since
                        continue
                    kept.add(h.event_id)
                    self._pop[h.item_id] += 1
                    fresh.append(h)
                added += len(fresh)
                if fresh:
                    self._hist[user] = merge_history(self._hist[user], fresh, self.history_cap)
        return added

    def stream_offsets(self, topic: str) -> dict[int, int]:
        with self._lock:
            return dict(self._offsets.get(topic, {}))

    def histories(self, user_ids: Sequence[str], limit: int) -> dict[str, list[HistoryItem]]:
        with self._lock:
            return {u: list(self._hist.get(u, [])[-limit:]) if limit > 0 else [] for u in user_ids}

    def popular(self, k: int) -> list[tuple[str, float]]:
        with self._lock:
            ranked = sorted(self._pop.items(), key=lambda kv: (-kv[1], kv[0]))
        return [(item, float(n)) for item, n in ranked[:k]]

    def ping(self) -> None:
        return None
