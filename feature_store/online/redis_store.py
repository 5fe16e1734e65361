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
* ``{prefix}:items:{user_id}`` — a sorted set of the items the user took, each scored by its newest
  behaviour's time, trimmed to the newest ``interacted_cap``: what the seen-item policy excludes,
  kept beyond the history cap.
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
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.exceptions import RedisError

from feature_store.errors import OffsetConflict, StoreUnavailable
from feature_store.features import DEFAULT_DEDUP_WINDOW_S, DEFAULT_INTERACTED_CAP, HistoryItem
from feature_store.long_tail import HEAD_SHARE
from feature_store.online.base import (
    OnlineStore,
    StoreRecord,
    StreamOffsets,
)

log = logging.getLogger(__name__)

SEP = "\x1f"

# KEYS: offsets hash, popularity, then (history, seen, items) per user.
# ARGV: now, dedup window (s), cap, prefix, interacted cap, n_partitions, (partition, expected, last)*,
#       then per user: user id, n_events, then one record per event, fields joined by \31:
#       kind (B/C/I, see online.base.StoreRecord), ts, event_id, item_id, category_id, request_id,
#       experiment, variant (one argument per event, not eight: packing arguments is most of the
#       client's cost per event).
# Returns {1, applied} or {0, partition, stored, partition, stored, ...} on an offset conflict.
# A raw string: Lua, not Python, reads the \31 escapes (decimal 31, the separator).
# Experiment keys are built here from the prefix (one Redis node, like every multi-user write):
#   {prefix}:att:{request}           hash item -> "experiment\31variant\31user" until clicked (expires with the
#                                    dedup window)
#   {prefix}:ab:{exp}:u:{user}       hash v (variant), n, c (the user's impressions and clicks)
#   {prefix}:ab:{exp}:v:{variant}    hash users, n, c, n2, c2, nc (sums over the variant's users), tail_c
#                                    (clicks on long-tail items by popularity at the time: feature_store.long_tail)
#   {prefix}:ab:{exp}:variants       set;  {prefix}:ab:experiments  set;  {prefix}:ab:unattributed  hash
#   {prefix}:catalog                 hash item -> category (first seen); {prefix}:catalog:order  list of items
_WRITE_SCRIPT = r"""
local now, window, cap, prefix = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local icap = tonumber(ARGV[5])
local nparts = tonumber(ARGV[6])
local i = 7
local conflicts = {0}
for _ = 1, nparts do
  local stored = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '-1')
  if stored ~= tonumber(ARGV[i + 1]) then
    table.insert(conflicts, ARGV[i]); table.insert(conflicts, stored)
  end
  i = i + 3
end
if #conflicts > 1 then return conflicts end
i = 7
for _ = 1, nparts do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 2])
  i = i + 3
end
local RECORD = '^([^\31]*)\31([^\31]*)\31([^\31]*)\31([^\31]*)\31([^\31]*)\31([^\31]*)\31([^\31]*)\31([^\31]*)$'
local function split(s)
  local out, start = {}, 1
  while true do
    local j = string.find(s, '\31', start, true)
    if not j then table.insert(out, string.sub(s, start)); return out end
    table.insert(out, string.sub(s, start, j - 1)); start = j + 1
  end
end
local function long_tail(item)
  -- Outside the head by behaviours so far (feature_store.long_tail; this batch's increments land at the end).
  local rank = redis.call('ZREVRANK', KEYS[2], item)
  return (not rank) or rank >= math.ceil(HEAD_SHARE * redis.call('ZCARD', KEYS[2]))
end
local function count(user, exp, var, click, item)
  local ukey = prefix .. ':ab:' .. exp .. ':u:' .. user
  local state = redis.call('HMGET', ukey, 'v', 'n', 'c')
  if state[1] and state[1] ~= var then
    redis.call('HINCRBY', prefix .. ':ab:unattributed', 'variant_conflicts', 1)
    return
  end
  local n, c = tonumber(state[2] or '0'), tonumber(state[3] or '0')
  local skey = prefix .. ':ab:' .. exp .. ':v:' .. var
  if n == 0 and c == 0 then
    redis.call('HINCRBY', skey, 'users', 1)
    redis.call('SADD', prefix .. ':ab:' .. exp .. ':variants', var)
    redis.call('SADD', prefix .. ':ab:experiments', exp)
  end
  if click then
    redis.call('HSET', ukey, 'v', var, 'c', c + 1)
    redis.call('HINCRBY', skey, 'c', 1); redis.call('HINCRBY', skey, 'c2', 2 * c + 1)
    redis.call('HINCRBY', skey, 'nc', n)
    if long_tail(item) then redis.call('HINCRBY', skey, 'tail_c', 1) end
  else
    redis.call('HSET', ukey, 'v', var, 'n', n + 1)
    redis.call('HINCRBY', skey, 'n', 1); redis.call('HINCRBY', skey, 'n2', 2 * n + 1)
    redis.call('HINCRBY', skey, 'nc', c)
  end
end
local applied = 0
local ttl = math.ceil(window)
local increments = {}  -- item -> new behaviours: one ZINCRBY per item, not per event (Zipf traffic)
local categories = {}  -- item -> its category in this batch: the catalog keeps the first ever seen
for u = 1, (#KEYS - 2) / 3 do
  local hist, seen, items = KEYS[3 * u], KEYS[3 * u + 1], KEYS[3 * u + 2]
  local user = ARGV[i]
  local n = tonumber(ARGV[i + 1]); i = i + 2
  local grew = false  -- did this user's history take a behaviour in this batch?
  redis.call('ZREMRANGEBYSCORE', seen, '-inf', now - window)
  for _ = 1, n do
    -- One pattern match, not a split loop: the eight fields of a record (Python joins them with SEP).
    local f = {string.match(ARGV[i], RECORD)}
    local kind, eid, item = f[1], f[3], f[4]
    if redis.call('ZADD', seen, 'NX', now, eid) == 1 then
      if kind == 'I' then
        local att = prefix .. ':att:' .. f[6]
        redis.call('HSET', att, item, f[7] .. '\31' .. f[8] .. '\31' .. user)
        redis.call('EXPIRE', att, ttl)
        count(user, f[7], f[8], false, item)
        applied = applied + 1
      -- ZADD answers 0 for a member still in the history whose seen-entry expired: applied before.
      elseif redis.call('ZADD', hist, f[2], eid .. '\31' .. item .. '\31' .. f[5]) == 1 then
        redis.call('ZADD', items, 'GT', f[2], item)
        grew = true
        if not increments[item] then categories[item] = f[5] end
        increments[item] = (increments[item] or 0) + 1
        applied = applied + 1
        if kind == 'C' then
          -- Counted once, for the user the item was shown to: a click naming another user's request, or
          -- clicking again, is counted apart (a client cannot add clicks to an arm it was not shown).
          local att = prefix .. ':att:' .. f[6]
          local ev = redis.call('HGET', att, item)
          local shown = ev and split(ev)
          if shown and shown[3] == user then
            redis.call('HDEL', att, item)
            count(user, shown[1], shown[2], true, item)
          else
            redis.call('HINCRBY', prefix .. ':ab:unattributed', 'orphan_clicks', 1)
          end
        end
      end
    end
    i = i + 1
  end
  -- Trimmed only where they grew (a batch of impressions or duplicates leaves both alone). Only the
  -- trim removes history members, so a history that lost none holds every behaviour the user ever
  -- had, at most cap: then the interacted items (at most one per behaviour) fit icap >= cap too.
  if grew then
    local dropped = redis.call('ZREMRANGEBYRANK', hist, 0, -(cap + 1))
    if dropped > 0 or icap < cap then
      redis.call('ZREMRANGEBYRANK', items, 0, -(icap + 1))
    end
  end
  redis.call('EXPIRE', seen, ttl)
end
for item, n in pairs(increments) do
  redis.call('ZINCRBY', KEYS[2], n, item)
  if redis.call('HSETNX', prefix .. ':catalog', item, categories[item]) == 1 then
    redis.call('RPUSH', prefix .. ':catalog:order', item)
  end
end
return {1, applied}
"""


def redacted(url: str) -> str:
    """``rediss://user:pw@host:6380/2`` as ``rediss://host:6380/2``: a URL fit for a log line."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class RedisStore(OnlineStore):
    backend = "redis"

    def __init__(self, url: str, *, prefix: str = "dinrec", history_cap: int = 50,
                 dedup_window_s: float = DEFAULT_DEDUP_WINDOW_S, socket_timeout_s: float = 2.0,
                 clock: Callable[[], float] | None = None, interacted_cap: int = DEFAULT_INTERACTED_CAP) -> None:
        super().__init__(history_cap, dedup_window_s, clock, interacted_cap)
        self.prefix = prefix
        self._r = redis.Redis.from_url(url, socket_timeout=socket_timeout_s,
                                       socket_connect_timeout=socket_timeout_s, decode_responses=True)
        self._url = redacted(url)  # what messages and logs name: never the password
        self._script = self._r.register_script(_WRITE_SCRIPT.replace("HEAD_SHARE", repr(HEAD_SHARE)))

    @property
    def client(self) -> redis.Redis:
        """The connection (experiments.state_redis reads the A/B counters this store's script keeps)."""
        return self._r

    def eviction_problem(self) -> str | None:
        """Why this Redis could lose data the store needs, or None. Stream offsets, dedup, A/B counters
        and decisions live here: under an ``allkeys-*`` policy an evicted offset rewinds ingestion and
        counts events twice, under ``volatile-*`` dedup and attribution go first. Only ``noeviction``
        (a full Redis refuses writes, which ingestion retries) keeps them. Managed Redis may hide CONFIG:
        then nothing is known and nothing is said."""
        try:
            policy = (self._r.config_get("maxmemory-policy") or {}).get("maxmemory-policy")
        except RedisError:
            return None
        if policy in (None, "noeviction"):
            return None
        return (f"redis {self._url} evicts keys (maxmemory-policy {policy}): offsets, dedup and A/B counters can be "
                "lost; set maxmemory-policy noeviction and size maxmemory for the data (docs/operations.md)")

    @property
    def url(self) -> str:
        """The server, as messages name it: scheme://host:port/db, without credentials."""
        return self._url

    def experiment_key(self, experiment: str) -> str:
        """Where ``experiment``'s keys start (the script's ``{prefix}:ab:{exp}``)."""
        return f"{self.prefix}:ab:{experiment}"

    def _hist_key(self, user_id: str) -> str:
        return f"{self.prefix}:hist:{user_id}"

    def _items_key(self, user_id: str) -> str:
        return f"{self.prefix}:items:{user_id}"

    @property
    def _pop_key(self) -> str:
        return f"{self.prefix}:pop"

    def _offsets_key(self, topic: str) -> str:
        return f"{self.prefix}:offsets:{topic}"

    def _write(self, items: list[tuple[str, StoreRecord]], offsets: StreamOffsets | None, now: float) -> int:
        by_user: dict[str, list[StoreRecord]] = {}
        for user, r in items:
            by_user.setdefault(user, []).append(r)
        keys = [self._offsets_key(offsets.topic if offsets else ""), self._pop_key]
        args: list[str | float | int] = [now, self.dedup_window_s, self.history_cap, self.prefix,
                                         self.interacted_cap]
        parts = sorted(offsets.last) if offsets else []
        args.append(len(parts))
        for p in parts:
            args += [p, offsets.expected[p], offsets.last[p]]  # type: ignore[union-attr]
        for user, rs in by_user.items():
            keys += [self._hist_key(user), f"{self.prefix}:seen:{user}", self._items_key(user)]
            args += [user, len(rs)]
            args += [SEP.join((r.kind, repr(r.item.ts), r.item.event_id, r.item.item_id, r.item.category_id,
                               r.request_id, r.experiment, r.variant)) for r in rs]
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

    def _read(self, queue: Callable[[redis.client.Pipeline], None]) -> list:
        try:
            pipe = self._r.pipeline(transaction=False)
            queue(pipe)
            return pipe.execute()
        except RedisError as exc:
            raise StoreUnavailable(f"redis read failed ({self._url}): {exc}") from exc

    def _parse_history(self, user: str, rows: list) -> list[HistoryItem]:
        hist = []
        for member, score in rows:
            parts = member.split(SEP)
            if len(parts) != 3:  # written before ids were validated: skip it, keep the rest
                log.warning("skipping an unreadable history member of user %r: %r", user, member[:200])
                continue
            hist.append(HistoryItem(float(score), *parts))
        return hist

    def histories(self, user_ids: Sequence[str], limit: int) -> dict[str, list[HistoryItem]]:
        if limit <= 0:
            return {u: [] for u in user_ids}
        results = self._read(lambda pipe: [pipe.zrange(self._hist_key(u), -limit, -1, withscores=True)
                                           for u in user_ids])
        return {u: self._parse_history(u, rows) for u, rows in zip(user_ids, results, strict=True)}

    def interacted(self, user_ids: Sequence[str]) -> dict[str, frozenset[str]]:
        results = self._read(lambda pipe: [pipe.zrange(self._items_key(u), 0, -1) for u in user_ids])
        return {u: frozenset(items) for u, items in zip(user_ids, results, strict=True)}

    def history_and_interacted(self, user_id: str, limit: int) -> tuple[list[HistoryItem], frozenset[str]]:
        def queue(pipe: redis.client.Pipeline) -> None:
            pipe.zrange(self._hist_key(user_id), -max(limit, 1), -1, withscores=True)
            pipe.zrange(self._items_key(user_id), 0, -1)

        rows, items = self._read(queue)
        return (self._parse_history(user_id, rows) if limit > 0 else []), frozenset(items)

    def popular(self, k: int) -> list[tuple[str, float]]:
        try:
            rows = self._r.zrange(self._pop_key, 0, k - 1, desc=True, withscores=True)
        except RedisError as exc:
            raise StoreUnavailable(f"redis read failed ({self._url}): {exc}") from exc
        # Redis breaks score ties by member descending under desc=True; re-sort to match memory.
        return sorted(((m, float(s)) for m, s in rows), key=lambda kv: (-kv[1], kv[0]))

    def catalog(self, since: int = 0, limit: int = 10_000) -> tuple[list[tuple[str, str]], int]:
        try:
            items = self._r.lrange(f"{self.prefix}:catalog:order", since, since + limit - 1)
            cats = self._r.hmget(f"{self.prefix}:catalog", items) if items else []
        except RedisError as exc:
            raise StoreUnavailable(f"redis read failed ({self._url}): {exc}") from exc
        return list(zip(items, cats, strict=True)), since + len(items)

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
