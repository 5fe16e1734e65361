"""Redis online store.

Layout (prefix ``dinrec`` by default; pinned by tests/golden/redis_layout.json):

* ``{prefix}:hist:{user_id}`` — a sorted set, one member per behaviour
  ``"{event_id}\\x1f{item_id}\\x1f{category_id}"`` scored by its timestamp, trimmed to the newest
  ``history_cap``. A sorted set (not a list) makes the newest event time win whatever the
  arrival order. Ids cannot contain control characters (the schema refuses them), so the
  separator cannot be forged.
* ``{prefix}:seen:{user_id}`` — a sorted set of the user's event ids scored by when they were first
  applied; entries older than the dedup window are dropped on the user's next write, and the key
  expires a window after the last one. It decides "new or redelivered" independently of the
  history cap, so a late duplicate of a trimmed event is not counted again.
* ``{prefix}:pop`` — a sorted set of item_id → behaviour count.
* ``{prefix}:offsets:{topic}`` — a hash partition → last applied offset, written by the same
  script as the events it covers.

A write is one Lua script (atomic in Redis: all of it or none of it, also in the AOF and on
replicas), so a crash of the writer, or of Redis with persistence, can never leave a history
updated without its popularity, or data without the offsets that say it is there.
Reads for many users go out in one pipeline.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import redis
from redis.exceptions import RedisError

from feature_store.errors import OffsetConflict, StoreUnavailable
from feature_store.features import HistoryItem
from feature_store.online.base import DEFAULT_DEDUP_WINDOW_S, OnlineStore, StreamOffsets

log = logging.getLogger(__name__)

SEP = "\x1f"

# KEYS: offsets hash, popularity, then (history, seen) per user.
# ARGV: now, dedup window (s), cap, n_partitions, (partition, expected, last)*,
#       then per user: n_events, then one "ts␟event_id␟item_id␟category_id" per event (one argument
#       per event, not four: packing arguments is most of the client's cost per event).
# Returns {1, applied} or {0, partition, stored, partition, stored, ...} on an offset conflict.
# A raw string: Lua, not Python, reads the \31 escapes (decimal 31, the separator).
_WRITE_SCRIPT = r"""
local now, window, cap = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local nparts = tonumber(ARGV[4])
local i = 5
local conflicts = {0}
for _ = 1, nparts do
  local stored = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '-1')
  if stored ~= tonumber(ARGV[i + 1]) then
    table.insert(conflicts, ARGV[i]); table.insert(conflicts, stored)
  end
  i = i + 3
end
if #conflicts > 1 then return conflicts end
i = 5
for _ = 1, nparts do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 2])
  i = i + 3
end
local applied = 0
local ttl = math.ceil(window)
local increments = {}  -- item -> new behaviours: one ZINCRBY per item, not per event (Zipf traffic)
for u = 1, (#KEYS - 2) / 2 do
  local hist, seen = KEYS[1 + 2 * u], KEYS[2 + 2 * u]
  local n = tonumber(ARGV[i]); i = i + 1
  redis.call('ZREMRANGEBYSCORE', seen, '-inf', now - window)
  for _ = 1, n do
    local arg = ARGV[i]
    local s1 = string.find(arg, '\31', 1, true)
    local member = string.sub(arg, s1 + 1)
    local s2 = string.find(member, '\31', 1, true)
    if redis.call('ZADD', seen, 'NX', now, string.sub(member, 1, s2 - 1)) == 1 then
      -- ZADD answers 0 for a member still in the history whose seen-entry expired: applied before.
      if redis.call('ZADD', hist, string.sub(arg, 1, s1 - 1), member) == 1 then
        local s3 = string.find(member, '\31', s2 + 1, true)
        local item = string.sub(member, s2 + 1, s3 - 1)
        increments[item] = (increments[item] or 0) + 1
        applied = applied + 1
      end
    end
    i = i + 1
  end
  redis.call('ZREMRANGEBYRANK', hist, 0, -(cap + 1))
  redis.call('EXPIRE', seen, ttl)
end
for item, n in pairs(increments) do
  redis.call('ZINCRBY', KEYS[2], n, item)
end
return {1, applied}
"""


class RedisStore(OnlineStore):
    def __init__(self, url: str, *, prefix: str = "dinrec", history_cap: int = 50,
                 dedup_window_s: float = DEFAULT_DEDUP_WINDOW_S, socket_timeout_s: float = 2.0,
                 clock: Callable[[], float] | None = None) -> None:
        super().__init__(history_cap, dedup_window_s, clock)
        self.prefix = prefix
        self._r = redis.Redis.from_url(url, socket_timeout=socket_timeout_s,
                                       socket_connect_timeout=socket_timeout_s, decode_responses=True)
        self._url = url
        self._script = self._r.register_script(_WRITE_SCRIPT)

    def _hist_key(self, user_id: str) -> str:
        return f"{self.prefix}:hist:{user_id}"

    @property
    def _pop_key(self) -> str:
        return f"{self.prefix}:pop"

    def _offsets_key(self, topic: str) -> str:
        return f"{self.prefix}:offsets:{topic}"

    def _write(self, items: list[tuple[str, HistoryItem]], offsets: StreamOffsets | None, now: float) -> int:
        by_user: dict[str, list[HistoryItem]] = {}
        for user, h in items:
            by_user.setdefault(user, []).append(h)
        keys = [self._offsets_key(offsets.topic if offsets else ""), self._pop_key]
        args: list[str | float | int] = [now, self.dedup_window_s, self.history_cap]
        parts = sorted(offsets.last) if offsets else []
        args.append(len(parts))
        for p in parts:
            args += [p, offsets.expected[p], offsets.last[p]]  # type: ignore[union-attr]
        for user, hs in by_user.items():
            keys += [self._hist_key(user), f"{self.prefix}:seen:{user}"]
            args.append(len(hs))
            args += [f"{h.ts!r}{SEP}{h.event_id}{SEP}{h.item_id}{SEP}{h.category_id}" for h in hs]
        try:
            result = self._script(keys=keys, args=args)
        except RedisError as exc:
            raise StoreUnavailable(f"redis write failed ({self._url}): {exc}") from exc
        if int(result[0]) == 0:
            flat = result[1:]
            raise OffsetConflict(offsets.topic, {int(flat[j]): int(flat[j + 1])  # type: ignore[union-attr]
                                                 for j in range(0, len(flat), 2)})
        return int(result[1])

    def stream_offsets(self, topic: str) -> dict[int, int]:
        try:
            raw = self._r.hgetall(self._offsets_key(topic))
        except RedisError as exc:
            raise StoreUnavailable(f"redis read failed ({self._url}): {exc}") from exc
        return {int(p): int(o) for p, o in raw.items()}

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
                parts = member.split(SEP)
                if len(parts) != 3:  # written before ids were validated: skip it, keep the rest
                    log.warning("skipping an unreadable history member of user %r: %r", u, member[:200])
                    continue
                hist.append(HistoryItem(float(score), *parts))
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
