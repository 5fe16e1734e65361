"""The embedded default: an in-process store with the same semantics as Redis."""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from collections.abc import Sequence

from feature_store.features import HistoryItem, merge_history
from feature_store.online.base import OnlineStore


class MemoryStore(OnlineStore):
    def __init__(self, history_cap: int = 50) -> None:
        super().__init__(history_cap)
        self._hist: dict[str, list[HistoryItem]] = defaultdict(list)
        self._pop: Counter[str] = Counter()
        self._lock = threading.Lock()  # the ingest thread writes while requests read

    def _write(self, items: list[tuple[str, HistoryItem]]) -> int:
        by_user: dict[str, list[HistoryItem]] = defaultdict(list)
        for user, h in items:
            by_user[user].append(h)
        added = 0
        with self._lock:
            for user, new in by_user.items():
                current = self._hist[user]
                seen = {h.event_id for h in current}
                for h in {h.event_id: h for h in new}.values():
                    if h.event_id not in seen:
                        self._pop[h.item_id] += 1
                        added += 1
                self._hist[user] = merge_history(current, new, self.history_cap)
        return added

    def histories(self, user_ids: Sequence[str], limit: int) -> dict[str, list[HistoryItem]]:
        with self._lock:
            return {u: list(self._hist.get(u, [])[-limit:]) if limit > 0 else [] for u in user_ids}

    def popular(self, k: int) -> list[tuple[str, float]]:
        with self._lock:
            ranked = sorted(self._pop.items(), key=lambda kv: (-kv[1], kv[0]))
        return [(item, float(n)) for item, n in ranked[:k]]

    def ping(self) -> None:
        return None
