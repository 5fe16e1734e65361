"""Redis online store.

Layout (prefix ``dinrec`` by default; pinned by tests/golden/redis_layout.json):

* ``{prefix}:hist:{user_id}`` — a sorted set, one member per behaviour
  ``"{event_id}\\x1f{item_id}\\x1f{category_id}"`` scored by its timestamp, trimmed to the newest
  ``history_cap``. A sorted set (not a list) makes the newest event time win whatever the
  arrival order, and makes redelivery idempotent (same member, same score).
* ``{prefix}:pop`` — a sorted set of item_id → behaviour count.

Reads for many users go out in one pipeline.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis
from redis.exceptions import RedisError

from feature_store.errors import StoreUnavailable
from feature_store.features import HistoryItem
from feature_store.online.base import OnlineStore

SEP = "\x1f"


class RedisStore(OnlineStore):
    def __init__(self, url: str, *, prefix: str = "dinrec", history_cap: int = 50,
                 socket_timeout_s: float = 2.0) -> None:
        super().__init__(history_cap)
        self.prefix = prefix
        self._r = redis.Redis.from_url(url, socket_timeout=socket_timeout_s,
                                       socket_connect_timeout=socket_timeout_s, decode_responses=True)
        self._url = url

    def _hist_key(self, user_id: str) -> str:
        return f"{self.prefix}:hist:{user_id}"

    @property
    def _pop_key(self) -> str:
        return f"{self.prefix}:pop"

    def _write(self, items: list[tuple[str, HistoryItem]]) -> int:
        try:
            pipe = self._r.pipeline(transaction=False)
            for user, h in items:
                pipe.zadd(self._hist_key(user), {SEP.join((h.event_id, h.item_id, h.category_id)): h.ts})
            added = pipe.execute()
            pipe = self._r.pipeline(transaction=False)
            for (_, h), was_new in zip(items, added, strict=True):
                if was_new:
                    pipe.zincrby(self._pop_key, 1, h.item_id)
            for user in {u for u, _ in items}:
                pipe.zremrangebyrank(self._hist_key(user), 0, -(self.history_cap + 1))
            pipe.execute()
        except RedisError as exc:
            raise StoreUnavailable(f"redis write failed ({self._url}): {exc}") from exc
        return int(sum(added))

    def histories(self, user_ids: Sequence[str], limit: int) -> dict[str, list[HistoryItem]]:
        if limit <= 0:
            return {u: [] for u in user_ids}
        try:
            pipe = self._r.pipeline(transaction=False)
            for u in user_ids:
                pipe.zrange(self._hist_key(u), -limit, -1, withscores=True)
            results = pipe.execute()
        except RedisError as exc:
            raise StoreUnavailable(f"redis read failed ({self._url}): {exc}") from exc
        out: dict[str, list[HistoryItem]] = {}
        for u, rows in zip(user_ids, results, strict=True):
            hist = []
            for member, score in rows:
                event_id, item_id, category_id = member.split(SEP)
                hist.append(HistoryItem(float(score), event_id, item_id, category_id))
            out[u] = hist
        return out

    def popular(self, k: int) -> list[tuple[str, float]]:
        try:
            rows = self._r.zrange(self._pop_key, 0, k - 1, desc=True, withscores=True)
        except RedisError as exc:
            raise StoreUnavailable(f"redis read failed ({self._url}): {exc}") from exc
        # Redis breaks score ties by member descending under desc=True; re-sort to match memory.
        return sorted(((m, float(s)) for m, s in rows), key=lambda kv: (-kv[1], kv[0]))

    def ping(self) -> None:
        try:
            self._r.ping()
        except RedisError as exc:
            raise StoreUnavailable(f"redis not reachable ({self._url}): {exc}") from exc

    def close(self) -> None:
        self._r.close()

    def flush_prefix(self) -> None:
        """Delete every key under this store's prefix (tests, demo resets)."""
        try:
            keys = list(self._r.scan_iter(f"{self.prefix}:*", count=1000))
            if keys:
                self._r.delete(*keys)
        except RedisError as exc:
            raise StoreUnavailable(f"redis delete failed ({self._url}): {exc}") from exc
