"""Redis online store: one Redis server or a Redis Cluster (redis-py's cluster client).

Layout 2 (prefix ``dinrec`` by default; pinned by tests/golden/redis_layout.json). Every key that
one ingest batch of one stream partition changes carries that partition's hash tag, so it is one
hash slot — one atomic Lua script on one node, in a cluster too. A user's partition is
:func:`events.partitioning.partition_of` (the Kafka producer's own rule), so serving finds the
user's keys from the id alone. With ``partitions=1`` every key is in the one slot ``{0}``; with
``partitions=N`` (the topic's partition count) the data spreads over N slots. ``{s}`` below is the
shard (the partition) in braces, e.g. ``dinrec:{3}:hist:u42``:

* ``{prefix}:{s}:hist:{user_id}`` — a sorted set, one member per behaviour
  ``"{event_id}\\x1f{item_id}\\x1f{category_id}"`` scored by its timestamp, trimmed to the newest
  ``history_cap``. A sorted set (not a list) makes the newest event time win whatever the
  arrival order. Ids cannot contain control characters (the schema refuses them), so the
  separator cannot be forged.
* ``{prefix}:{s}:seen:{user_id}`` — a sorted set of the user's event ids scored by when they were
  first applied; entries older than the dedup window are dropped on the user's next write, and the
  key expires a window after the last one. It decides "new or redelivered" independently of the
  history cap, so a late duplicate of a trimmed event is not counted again; at most ``seen_cap`` ids
  (the newest) per user.
* ``{prefix}:{s}:items:{user_id}`` — a sorted set of the items the user took, each scored by its
  newest behaviour's time, trimmed to the newest ``interacted_cap``: what the seen-item policy
  excludes, kept beyond the history cap.
* A user's keys (``hist``, ``items``, ``ab:{exp}:u:{user}``) expire ``user_ttl_s`` after the user's last
  write: user ids clients invent do not stay.
* ``{prefix}:{s}:pop`` — a sorted set of item_id → popularity among the shard's users (a (user, item)
  once per popularity window: ``{prefix}:{s}:pc:{user}`` holds when each of the user's items was last
  counted) of the items admitted to the catalog; until admitted an item's count is
  ``{prefix}:{s}:adm:{item}``, expiring. The store's :meth:`RedisStore.popular` sums the shards (no hot
  key takes every write).
* ``{prefix}:{s}:applied`` — behaviours applied to the shard's histories, ever.
* ``{prefix}:{s}:offsets:{topic}`` — a hash partition → last applied offset, written by the same
  script as the events it covers (so a failover that loses acknowledged writes loses their offsets
  with them, and the consumer re-reads them).
* ``{prefix}:{s}:catalog`` / ``{prefix}:{s}:catalog:order`` — item → category as admitted in the
  shard (popular enough there, or named by a trusted feed), and the order they were:
  :meth:`RedisStore.catalog` merges the shards.
* A/B counters, per shard (summed on read): see the script's comment below.
* ``{prefix}:layout`` — a hash ``version``, ``partitions``, written by the first store to open the
  prefix; a store with another partition count, or a prefix holding layout 1's keys, is refused
  (StoreLayoutError) instead of reading and writing where the data is not.
* ``{prefix}:ab:{exp}:{table}`` — the experiment ledger (experiments.state_redis), single keys.

A write is one Lua script per shard it touches (atomic in Redis: all of it or none of it, also in
the AOF and on replicas), so a crash of the writer, or of Redis with persistence, can never leave a
history updated without its popularity, or data without the offsets that say it is there.
Reads for many users go out in one pipeline (per node, in a cluster).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.cluster import ClusterPipeline, RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from dinrec.events.features import (
    DEFAULT_AB_USER_CAP,
    DEFAULT_AB_VALUE_CAP,
    DEFAULT_ATTRIBUTION_WINDOW_S,
    DEFAULT_CATALOG_MIN_USERS,
    DEFAULT_DEDUP_WINDOW_S,
    DEFAULT_INTERACTED_CAP,
    DEFAULT_POPULARITY_WINDOW_S,
    DEFAULT_SEEN_CAP,
    DEFAULT_USER_TTL_S,
    SEGMENTS,
    HistoryItem,
)
from dinrec.events.long_tail import HEAD_SHARE
from dinrec.events.partitioning import partition_of
from dinrec.feature_store.errors import OffsetConflict, StoreLayoutError, StoreUnavailable
from dinrec.feature_store.online.base import UNATTRIBUTED, CatalogCursor, OnlineStore, StoreRecord, StreamOffsets

log = logging.getLogger(__name__)

SEP = "\x1f"
LAYOUT_VERSION = "2"
# What a redis-py client raises: its cluster client's own errors are not RedisErrors.
REDIS_ERRORS = (RedisError, RedisClusterException)
# What the client's pipeline() makes: a server's, or a cluster's (per node).
Pipe = redis.client.Pipeline | ClusterPipeline

# KEYS: the shard's offsets hash, its popularity, then (history, seen, items) per user of the shard.
# ARGV: now, dedup window (s), cap, the shard's key base ("{prefix}:{s}"), interacted cap, n_partitions,
#       user TTL (s, 0: none), seen cap, popularity window (s), catalog min users, A/B user cap,
#       attribution window (s), A/B value cap, (partition, expected, last)*, then per user: user id, n_events,
#       then one record per event, fields joined by \31: kind (B/C/P/K/I, see online.base.StoreRecord), ts,
#       event_id, item_id, category_id, request_id, experiment, variant, value (one argument per event, not nine:
#       packing arguments is most of the client's cost per event).
# Returns {1, applied} or {0, partition, stored, partition, stored, ...} on an offset conflict.
# A raw string: Lua, not Python, reads the \31 escapes (decimal 31, the separator).
# Experiment and catalog keys are built here from the shard's base, so they share the slot of KEYS:
#   {base}:att:{request}           hash item -> "experiment\31variant\31user\31landed" until clicked (expires with the
#                                  attribution window); a click is the clicking user's, so it is in their shard
#   {base}:pend:{request}          hash item -> "user\31arrived": a click that came before its impression, joined
#                                  when the impression lands within the attribution window (until then an orphan)
#   {base}:ab:{exp}:u:{user}       hash v (variant), n, c, b, k, val (the user's impressions, clicks, buys, carts
#                                  and the buys' value), x (their behaviours before their first exposure)
#   {base}:ab:ue:{user}            set: the experiments the user was exposed to (their buys and carts count there)
#   {base}:ab:{exp}:v:{variant}    hash: the sums of online.base.AB_SUM_FIELDS over the shard's users of the
#                                  variant, per segment of user ("n@new": events.features.SEGMENTS;
#                                  tail_c: clicks on long-tail items by the shard's popularity at the time,
#                                  events.long_tail)
#   {base}:ab:{exp}:variants       set;  {base}:ab:experiments  set;  {base}:ab:unattributed  hash
#   {base}:catalog                 hash item -> category (as admitted); {base}:catalog:order  list of items
#   {base}:pc:{user}               sorted set item -> when its popularity was counted for the user (store clock)
#   {base}:adm:{item}              the popularity of an item not admitted yet (expires a popularity window after
#                                  its last count); at catalog_min it moves to pop and the item to the catalog
#   {base}:applied                 behaviours applied to the shard's histories, ever
_WRITE_SCRIPT = r"""
local now, window, cap, prefix = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local icap = tonumber(ARGV[5])
local nparts = tonumber(ARGV[6])
local user_ttl, seen_cap = tonumber(ARGV[7]), tonumber(ARGV[8])
local pop_window, catalog_min, ab_cap = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
local att_window, ab_value_cap = tonumber(ARGV[12]), tonumber(ARGV[13])
local FIRST_PART = 14  -- the partitions' (partition, expected, last) triples start here
local i = FIRST_PART
local conflicts = {0}
for _ = 1, nparts do
  local stored = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '-1')
  if stored ~= tonumber(ARGV[i + 1]) then
    table.insert(conflicts, ARGV[i]); table.insert(conflicts, stored)
  end
  i = i + 3
end
if #conflicts > 1 then return conflicts end
i = FIRST_PART
for _ = 1, nparts do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 2])
  i = i + 3
end
local RECORD = '^' .. string.rep('([^\31]*)\31', 8) .. '([^\31]*)$'  -- nine fields
local function split(s)
  local out, start = {}, 1
  while true do
    local j = string.find(s, '\31', start, true)
    if not j then table.insert(out, string.sub(s, start)); return out end
    table.insert(out, string.sub(s, start, j - 1)); start = j + 1
  end
end
local function long_tail(item)
  -- Outside the head by behaviours so far (events.long_tail; this batch's increments land at the end).
  local rank = redis.call('ZREVRANK', KEYS[2], item)
  return (not rank) or rank >= math.ceil(HEAD_SHARE * redis.call('ZCARD', KEYS[2]))
end
SEGMENT_FUNCTION
local function count(user, exp, var, what, item, hist)
  -- One impression (what = 'n') or click ('c') of the user in the variant.
  local ukey = prefix .. ':ab:' .. exp .. ':u:' .. user
  local state = redis.call('HMGET', ukey, 'v', 'n', 'c', 'b', 'x')
  if state[1] and state[1] ~= var then
    redis.call('HINCRBY', prefix .. ':ab:unattributed', 'variant_conflicts', 1)
    return
  end
  local n, c, b = tonumber(state[2] or '0'), tonumber(state[3] or '0'), tonumber(state[4] or '0')
  if (what == 'c' and c or n) >= ab_cap then  -- what one user adds is capped: the rest counted apart
    redis.call('HINCRBY', prefix .. ':ab:unattributed', 'capped', 1)
    return
  end
  local skey = prefix .. ':ab:' .. exp .. ':v:' .. var
  local x = tonumber(state[5] or '0')
  if n == 0 and c == 0 then  -- first exposure: one more user, and what they did before it (the covariate)
    x = math.min(redis.call('ZCARD', hist), cap)
    redis.call('HSET', ukey, 'x', x)
  end
  local at = '@' .. segment(x)  -- the user's segment: every sum is kept per segment (summed on read)
  if n == 0 and c == 0 then
    redis.call('HINCRBY', skey, 'users' .. at, 1)
    redis.call('HINCRBY', skey, 'x' .. at, x); redis.call('HINCRBY', skey, 'x2' .. at, x * x)
    redis.call('SADD', prefix .. ':ab:' .. exp .. ':variants', var)
    redis.call('SADD', prefix .. ':ab:experiments', exp)
  end
  local exposed = prefix .. ':ab:ue:' .. user  -- the experiments the user's conversions count in
  redis.call('SADD', exposed, exp)
  if what == 'c' then
    redis.call('HSET', ukey, 'v', var, 'c', c + 1)
    redis.call('HINCRBY', skey, 'c2' .. at, 2 * c + 1)
    redis.call('HINCRBY', skey, 'nc' .. at, n)
    if long_tail(item) then redis.call('HINCRBY', skey, 'tail_c' .. at, 1) end
  else
    redis.call('HSET', ukey, 'v', var, 'n', n + 1)
    redis.call('HINCRBY', skey, 'n2' .. at, 2 * n + 1)
    redis.call('HINCRBY', skey, 'nc' .. at, c); redis.call('HINCRBY', skey, 'nb' .. at, b)
  end
  redis.call('HINCRBY', skey, what .. at, 1); redis.call('HINCRBY', skey, 'x' .. what .. at, x)
  if user_ttl > 0 then redis.call('EXPIRE', ukey, user_ttl); redis.call('EXPIRE', exposed, user_ttl) end
end
local function float(v) return string.format('%.17g', v) end  -- tostring keeps 14 digits only
local function convert(user, kind, value)
  -- A buy ('P', worth value) or cart ('K'): a conversion in every experiment the user was exposed to.
  local what = kind == 'P' and 'b' or 'k'
  for _, exp in ipairs(redis.call('SMEMBERS', prefix .. ':ab:ue:' .. user)) do
    local ukey = prefix .. ':ab:' .. exp .. ':u:' .. user
    local state = redis.call('HMGET', ukey, 'v', 'n', what, 'val', 'x')
    local done = tonumber(state[3] or '0')
    if not state[1] then  -- the user's state expired: nothing to attribute to
    elseif done >= ab_cap then
      redis.call('HINCRBY', prefix .. ':ab:unattributed', 'capped', 1)
    else
      local skey = prefix .. ':ab:' .. exp .. ':v:' .. state[1]
      local x = tonumber(state[5] or '0')
      local at = '@' .. segment(x)
      redis.call('HSET', ukey, what, done + 1)
      redis.call('HINCRBY', skey, what .. at, 1); redis.call('HINCRBY', skey, what .. '2' .. at, 2 * done + 1)
      redis.call('HINCRBY', skey, 'x' .. what .. at, x)
      if what == 'b' then
        redis.call('HINCRBY', skey, 'nb' .. at, tonumber(state[2] or '0'))
        if value > 0 then
          local val = tonumber(state[4] or '0')
          local room = ab_value_cap - val
          if value > room then  -- past the cap: the rest of its value counted apart
            redis.call('HINCRBY', prefix .. ':ab:unattributed', 'capped', 1)
            value = math.max(room, 0)
          end
          redis.call('HSET', ukey, 'val', float(val + value))
          redis.call('HINCRBYFLOAT', skey, 'val' .. at, float(value))
          redis.call('HINCRBYFLOAT', skey, 'val2' .. at, float(2 * val * value + value * value))
          redis.call('HINCRBYFLOAT', skey, 'xval' .. at, float(x * value))
        end
      end
    end
  end
end
local applied, behaviours = 0, 0
local ttl, pop_ttl, att_ttl = math.ceil(window), math.ceil(pop_window), math.ceil(att_window)
local increments = {}  -- item -> new behaviours: one ZINCRBY per item, not per event (Zipf traffic)
local categories = {}  -- item -> its category in this batch: the catalog keeps the first ever seen
for u = 1, (#KEYS - 2) / 3 do
  local hist, seen, items = KEYS[3 * u], KEYS[3 * u + 1], KEYS[3 * u + 2]
  local user = ARGV[i]
  local n = tonumber(ARGV[i + 1]); i = i + 2
  local grew = false  -- did this user's history take a behaviour in this batch?
  local counted = prefix .. ':pc:' .. user
  redis.call('ZREMRANGEBYSCORE', seen, '-inf', now - window)
  redis.call('ZREMRANGEBYSCORE', counted, '-inf', now - pop_window)
  for _ = 1, n do
    -- One pattern match, not a split loop: the eight fields of a record (Python joins them with SEP).
    local f = {string.match(ARGV[i], RECORD)}
    local kind, eid, item = f[1], f[3], f[4]
    if redis.call('ZADD', seen, 'NX', now, eid) == 1 then
      if kind == 'I' then
        count(user, f[7], f[8], 'n', item, hist)
        local pend = prefix .. ':pend:' .. f[6]
        local waiting = redis.call('HGET', pend, item)
        waiting = waiting and split(waiting)  -- {user, when it arrived}: the window by the store's clock
        if waiting and waiting[1] == user and tonumber(waiting[2]) > now - att_window then
          -- Its click arrived first (impressions are logged off the request path): joined now, once.
          redis.call('HDEL', pend, item)
          redis.call('HINCRBY', prefix .. ':ab:unattributed', 'orphan_clicks', -1)
          count(user, f[7], f[8], 'c', item, hist)
        else
          local att = prefix .. ':att:' .. f[6]
          redis.call('HSET', att, item, f[7] .. '\31' .. f[8] .. '\31' .. user .. '\31' .. now)
          redis.call('EXPIRE', att, att_ttl)
        end
        applied = applied + 1
      -- ZADD answers 0 for a member still in the history whose seen-entry expired: applied before.
      elseif redis.call('ZADD', hist, f[2], eid .. '\31' .. item .. '\31' .. f[5]) == 1 then
        redis.call('ZADD', items, 'GT', f[2], item)
        grew = true
        if redis.call('ZADD', counted, 'NX', now, item) == 1 then  -- a (user, item) once per popularity window
          if not increments[item] then categories[item] = f[5] end
          increments[item] = (increments[item] or 0) + 1
        end
        applied = applied + 1
        behaviours = behaviours + 1
        if kind == 'C' then
          -- Counted once, for the user the item was shown to: a click naming another user's request, or
          -- clicking again, is counted apart (a client cannot add clicks to an arm it was not shown).
          local att = prefix .. ':att:' .. f[6]
          local ev = redis.call('HGET', att, item)
          local shown = ev and split(ev)
          -- {experiment, variant, user, when it landed}: the window by the store's clock, as the pending side
          if shown and tonumber(shown[4] or now) <= now - att_window then shown = nil end
          if shown and shown[3] == user then
            redis.call('HDEL', att, item)
            count(user, shown[1], shown[2], 'c', item, hist)
          else
            -- Counted apart; one whose impression is not logged yet waits for it (the attribution window)
            -- and is joined when it lands: a click may outrun its impression.
            redis.call('HINCRBY', prefix .. ':ab:unattributed', 'orphan_clicks', 1)
            if not shown then
              local pend = prefix .. ':pend:' .. f[6]
              if redis.call('HSETNX', pend, item, user .. '\31' .. now) == 1 then
                redis.call('EXPIRE', pend, att_ttl)
              end
            end
          end
        elseif kind == 'P' or kind == 'K' then
          convert(user, kind, tonumber(f[9]))
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
  if redis.call('ZCARD', seen) > seen_cap then redis.call('ZREMRANGEBYRANK', seen, 0, -(seen_cap + 1)) end
  redis.call('EXPIRE', seen, ttl)
  if redis.call('ZCARD', counted) > seen_cap then redis.call('ZREMRANGEBYRANK', counted, 0, -(seen_cap + 1)) end
  if grew then redis.call('EXPIRE', counted, pop_ttl) end
  if user_ttl > 0 then  -- invented users do not stay forever: every key of the user, from its last write
    redis.call('EXPIRE', hist, user_ttl); redis.call('EXPIRE', items, user_ttl)
  end
end
for item, n in pairs(increments) do
  if redis.call('HEXISTS', prefix .. ':catalog', item) == 1 then
    redis.call('ZINCRBY', KEYS[2], n, item)
  else
    -- Counted apart, expiring, until popular enough: then admitted to the catalog and to popularity. An item
    -- id one client invents never reaches serving, and what invented ids make Redis hold expires.
    local adm = prefix .. ':adm:' .. item
    local total = redis.call('INCRBY', adm, n)
    if total >= catalog_min then
      redis.call('DEL', adm)
      redis.call('ZINCRBY', KEYS[2], total, item)
      redis.call('HSET', prefix .. ':catalog', item, categories[item])
      redis.call('RPUSH', prefix .. ':catalog:order', item)
    else
      redis.call('EXPIRE', adm, pop_ttl)
    end
  end
end
if behaviours > 0 then redis.call('INCRBY', prefix .. ':applied', behaviours) end
return {1, applied}
"""

def _segment_function() -> str:
    """Lua's ``segment(x)``: events.features.segment_of, written out from the same bounds."""
    lines = [f"  if x >= {least} then return '{name}' end" for name, least in reversed(SEGMENTS)]
    return "local function segment(x)\n" + "\n".join(lines) + "\nend"


# KEYS: a shard's catalog hash and order list; ARGV: item, category, item, category, ... (a trusted feed's items)
_ADMIT_SCRIPT = r"""
local joined = 0
for j = 1, #ARGV, 2 do
  if redis.call('HSETNX', KEYS[1], ARGV[j], ARGV[j + 1]) == 1 then
    redis.call('RPUSH', KEYS[2], ARGV[j]); joined = joined + 1
  end
end
return joined
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
    """The online store on one Redis server (``cluster=False``) or a Redis Cluster (``url`` names any
    of its nodes). ``partitions``: the stream topic's partition count (or 1: everything in one slot,
    whatever the topic has), the same for every process sharing ``prefix``."""

    backend = "redis"

    def __init__(self, url: str, *, prefix: str = "dinrec", history_cap: int = 50,
                 dedup_window_s: float = DEFAULT_DEDUP_WINDOW_S, socket_timeout_s: float = 2.0,
                 clock: Callable[[], float] | None = None, interacted_cap: int = DEFAULT_INTERACTED_CAP,
                 partitions: int = 1, cluster: bool = False, user_ttl_s: float = DEFAULT_USER_TTL_S,
                 seen_cap: int = DEFAULT_SEEN_CAP, popularity_window_s: float = DEFAULT_POPULARITY_WINDOW_S,
                 catalog_min_users: int = DEFAULT_CATALOG_MIN_USERS, ab_user_cap: int = DEFAULT_AB_USER_CAP,
                 attribution_window_s: float = DEFAULT_ATTRIBUTION_WINDOW_S,
                 ab_value_cap: float = DEFAULT_AB_VALUE_CAP) -> None:
        super().__init__(history_cap, dedup_window_s, clock, interacted_cap, user_ttl_s, seen_cap,
                         popularity_window_s, catalog_min_users, ab_user_cap, attribution_window_s, ab_value_cap)
        if not prefix or any(c in prefix for c in "{}*?[]"):
            raise ValueError(f"redis key prefix {prefix!r}: empty, or a brace or glob character (braces are hash tags)")
        if partitions < 1:
            raise ValueError("partitions must be >= 1")
        self.prefix, self.partitions, self.cluster = prefix, partitions, cluster
        if cluster:
            self.backend = "redis-cluster"
        self._url = redacted(url)  # what messages and logs name: never the password
        self._connect_url, self._timeout_s = url, socket_timeout_s
        self._r_client: redis.Redis | RedisCluster | None = None
        self._connect_lock = threading.Lock()
        self._layout_checked = False

    # -------------------------------------------------------------- connection and layout
    def _client(self) -> redis.Redis | RedisCluster:
        """The client, made on first use: a cluster client asks a node for the slot map as it is made,
        and a service must be able to start (degraded) while Redis is down."""
        if self._r_client is None:
            with self._connect_lock:
                if self._r_client is None:
                    kind = RedisCluster if self.cluster else redis.Redis
                    try:
                        self._r_client = kind.from_url(self._connect_url, socket_timeout=self._timeout_s,
                                                       socket_connect_timeout=self._timeout_s,
                                                       decode_responses=True)
                    except REDIS_ERRORS as exc:
                        raise StoreUnavailable(f"redis not reachable ({self._url}): {exc}") from exc
                    self._script = self._r_client.register_script(
                        _WRITE_SCRIPT.replace("HEAD_SHARE", repr(HEAD_SHARE))
                        .replace("SEGMENT_FUNCTION", _segment_function()))
                    self._admit_script = self._r_client.register_script(_ADMIT_SCRIPT)
        return self._r_client

    @property
    def _r(self) -> redis.Redis | RedisCluster:
        client = self._client()
        if not self._layout_checked:
            self._check_layout(client)
        return client

    @property
    def client(self) -> redis.Redis | RedisCluster:
        """The connection (experiments.state_redis keeps the experiment ledger on it)."""
        return self._r

    def _check_layout(self, client: redis.Redis | RedisCluster) -> None:
        key = f"{self.prefix}:layout"
        want = {"version": LAYOUT_VERSION, "partitions": str(self.partitions)}
        try:
            have = client.hgetall(key)
            if not have:
                if client.exists(f"{self.prefix}:pop"):
                    raise StoreLayoutError(
                        f"redis {self._url} prefix {self.prefix!r} holds layout 1 (dinrec before hash-tagged keys); "
                        "this version reads and writes layout 2: ingest the topic again into a new prefix "
                        "(DINREC_REDIS_PREFIX, `dinrec ingest` from the earliest offset) and switch serving to it "
                        "(docs/operations.md)")
                for field, value in want.items():  # the first store to open the prefix decides
                    client.hsetnx(key, field, value)
                have = client.hgetall(key)
        except REDIS_ERRORS as exc:
            raise StoreUnavailable(f"redis read failed ({self._url}): {exc}") from exc
        if have != want:  # !s below: the client decodes replies to str, which redis-py's types cannot tell
            raise StoreLayoutError(
                f"redis {self._url} prefix {self.prefix!r} has layout {have.get('version')!s} with "
                f"{have.get('partitions')!s} partitions; this store is configured for layout {LAYOUT_VERSION} with "
                f"{self.partitions} (DINREC_STORE_PARTITIONS must be the same in every process of a prefix)")
        self._layout_checked = True

    def check_layout(self) -> None:
        """Raise StoreLayoutError if the prefix's data is not in this store's layout (StoreUnavailable if
        Redis cannot say); a service calls it at start."""
        self._r  # noqa: B018 - the property checks

    def eviction_problem(self) -> str | None:
        """Why this Redis could lose data the store needs, or None. Stream offsets, dedup, A/B counters
        and decisions live here: under an ``allkeys-*`` policy an evicted offset rewinds ingestion and
        counts events twice, under ``volatile-*`` dedup and attribution go first. Only ``noeviction``
        (a full Redis refuses writes, which ingestion retries) keeps them. Managed Redis may hide CONFIG:
        then nothing is known and nothing is said."""
        try:
            client = self._client()
            if self.cluster:
                # Each primary's reply by node name, but the reply alone from a cluster of one primary
                # (redis-py's types know only the second shape).
                answers: dict[Any, Any] = client.config_get("maxmemory-policy", target_nodes=RedisCluster.PRIMARIES)
                replies = [answers] if "maxmemory-policy" in answers else answers.values()
                policies = {a.get("maxmemory-policy") for a in replies}
            else:
                policies = {(client.config_get("maxmemory-policy") or {}).get("maxmemory-policy")}
        except (*REDIS_ERRORS, StoreUnavailable):
            return None
        bad = sorted(p for p in policies if p not in (None, "noeviction"))
        if not bad:
            return None
        return (f"redis {self._url} evicts keys (maxmemory-policy {', '.join(bad)}): offsets, dedup and A/B counters "
                "can be lost; set maxmemory-policy noeviction and size maxmemory for the data (docs/operations.md)")

    @property
    def url(self) -> str:
        """The server, as messages name it: scheme://host:port/db, without credentials."""
        return self._url

    # -------------------------------------------------------------- keys
    def shard_of(self, user_id: str) -> int:
        return partition_of(user_id, self.partitions) if self.partitions > 1 else 0

    def _base(self, shard: int) -> str:
        return f"{self.prefix}:{{{shard}}}"

    def _user_key(self, kind: str, user_id: str) -> str:
        return f"{self._base(self.shard_of(user_id))}:{kind}:{user_id}"

    def experiment_key(self, experiment: str) -> str:
        """Where ``experiment``'s ledger keys start (experiments.state_redis: single keys, no shard)."""
        return f"{self.prefix}:ab:{experiment}"

    def _offsets_key(self, shard: int, topic: str) -> str:
        return f"{self._base(shard)}:offsets:{topic}"

    def _shards(self) -> range:
        return range(self.partitions)

    # -------------------------------------------------------------- writes
    def _write(self, items: list[tuple[str, StoreRecord]], offsets: StreamOffsets | None, now: float) -> int:
        """One script per shard the batch touches. Each is atomic with its partitions' offsets; of a
        batch spanning partitions, the shards that agree are applied and the others refused together
        (OffsetConflict names them), which a consumer resolves from the store's offsets as always."""
        by_shard: dict[int, dict[str, list[StoreRecord]]] = {}
        for user, r in items:
            by_shard.setdefault(self.shard_of(user), {}).setdefault(user, []).append(r)
        parts_of: dict[int, list[int]] = {}
        topic = offsets.topic if offsets else ""
        for p in sorted(offsets.last) if offsets else []:
            if self.partitions > 1 and not 0 <= p < self.partitions:
                raise ValueError(f"partition {p} of {topic!r} is outside this store's "
                                 f"{self.partitions} partitions: the topic must have as many as the store")
            parts_of.setdefault(p if self.partitions > 1 else 0, []).append(p)
        applied, conflicts = 0, {}
        for shard in sorted(set(by_shard) | set(parts_of)):
            result = self._write_shard(shard, by_shard.get(shard, {}), offsets, parts_of.get(shard, []), now)
            if int(result[0]) == 0:
                flat = result[1:]
                conflicts.update({int(flat[j]): int(flat[j + 1]) for j in range(0, len(flat), 2)})
            else:
                applied += int(result[1])
        if conflicts:
            raise OffsetConflict(topic, conflicts)  # conflicts come only from partitions' offsets: there are some
        return applied

    def _write_shard(self, shard: int, by_user: dict[str, list[StoreRecord]], offsets: StreamOffsets | None,
                     parts: list[int], now: float) -> list:
        base = self._base(shard)
        keys = [self._offsets_key(shard, offsets.topic if offsets else ""), f"{base}:pop"]
        args: list[str | float | int] = [now, self.dedup_window_s, self.history_cap, base, self.interacted_cap,
                                         len(parts), int(self.user_ttl_s), self.seen_cap, self.popularity_window_s,
                                         self.catalog_min_users, self.ab_user_cap, self.attribution_window_s,
                                         repr(self.ab_value_cap)]
        for p in parts:  # parts come from offsets (none without them)
            assert offsets is not None
            args += [p, offsets.expected[p], offsets.last[p]]
        for user, rs in by_user.items():
            keys += [f"{base}:hist:{user}", f"{base}:seen:{user}", f"{base}:items:{user}"]
            args += [user, len(rs)]
            args += [SEP.join((r.kind, repr(r.item.ts), r.item.event_id, r.item.item_id, r.item.category_id,
                               r.request_id, r.experiment, r.variant, repr(r.value))) for r in rs]
        try:
            self._r  # noqa: B018 - connects and checks the layout first
            return self._script(keys=keys, args=args)
        except REDIS_ERRORS as exc:
            raise StoreUnavailable(f"redis write failed ({self._url}): {exc}") from exc

    def admit(self, items: Sequence[tuple[str, str]]) -> int:
        """Each item into its own shard's catalog (by its id, as a user's keys by theirs), unless a shard
        lists it already: readers keep an item's first listing, so one admitted twice is served once."""
        by_shard: dict[int, list[str]] = {}
        for item, category in dict(items).items():
            by_shard.setdefault(partition_of(item, self.partitions) if self.partitions > 1 else 0, []).extend(
                (item, category))
        joined = 0
        try:
            self._r  # noqa: B018 - connects and checks the layout first
            for shard, args in sorted(by_shard.items()):
                base = self._base(shard)
                joined += int(self._admit_script(keys=[f"{base}:catalog", f"{base}:catalog:order"], args=args))
        except REDIS_ERRORS as exc:
            raise StoreUnavailable(f"redis write failed ({self._url}): {exc}") from exc
        return joined

    # -------------------------------------------------------------- reads
    def _read(self, queue: Callable[[Pipe], object]) -> list[Any]:
        """The replies to the commands ``queue`` puts on a pipeline, in order. What ``queue`` returns is
        ignored (a lambda's list of the queued commands, which in a pipeline return the pipeline)."""
        try:
            pipe = self._r.pipeline(transaction=False)
            queue(pipe)
            return pipe.execute()
        except REDIS_ERRORS as exc:
            raise StoreUnavailable(f"redis read failed ({self._url}): {exc}") from exc

    def stream_offsets(self, topic: str) -> dict[int, int]:
        rows = self._read(lambda pipe: [pipe.hgetall(self._offsets_key(s, topic)) for s in self._shards()])
        return {int(p): int(o) for raw in rows for p, o in raw.items()}

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
        results = self._read(lambda pipe: [pipe.zrange(self._user_key("hist", u), -limit, -1, withscores=True)
                                           for u in user_ids])
        return {u: self._parse_history(u, rows) for u, rows in zip(user_ids, results, strict=True)}

    def interacted(self, user_ids: Sequence[str]) -> dict[str, frozenset[str]]:
        results = self._read(lambda pipe: [pipe.zrange(self._user_key("items", u), 0, -1) for u in user_ids])
        return {u: frozenset(items) for u, items in zip(user_ids, results, strict=True)}

    def history_and_interacted(self, user_id: str, limit: int) -> tuple[list[HistoryItem], frozenset[str]]:
        def queue(pipe: Pipe) -> None:  # one slot: one node, one round trip
            pipe.zrange(self._user_key("hist", user_id), -max(limit, 1), -1, withscores=True)
            pipe.zrange(self._user_key("items", user_id), 0, -1)

        rows, items = self._read(queue)
        return (self._parse_history(user_id, rows) if limit > 0 else []), frozenset(items)

    def popular(self, k: int) -> list[tuple[str, float]]:
        """The exact top ``k`` of the shards' summed counts, by the threshold algorithm (Fagin et al.):
        read each shard's ranking a page at a time, total every item met over all shards, and stop once
        the k-th total beats what any item not met yet could reach (the sum of each shard's last score
        read). Ties by item id, as the embedded store."""
        if k <= 0:
            return []
        keys = [f"{self._base(s)}:pop" for s in self._shards()]
        step = max(k, 64)
        totals: dict[str, float] = {}
        pos = 0
        while True:
            def page(pipe: Pipe, at: int = pos) -> None:
                for key in keys:
                    pipe.zrange(key, at, at + step - 1, desc=True, withscores=True)

            pages = self._read(page)
            if len(keys) == 1:
                totals.update((m, float(s)) for m, s in pages[0])
            else:
                met = sorted({m for page in pages for m, _ in page} - totals.keys())
                if met:
                    def score(pipe: Pipe, names: list[str] = met) -> None:
                        for key in keys:
                            pipe.zmscore(key, names)

                    scores = self._read(score)
                    totals.update((m, sum(float(col[j] or 0) for col in scores)) for j, m in enumerate(met))
            ranked = sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))
            bound = sum(float(page[-1][1]) for page in pages if len(page) == step)  # 0 where a shard ran out
            if all(len(page) < step for page in pages) or (len(ranked) >= k and ranked[k - 1][1] > bound):
                return ranked[:k]
            pos += step

    def applied_behaviours(self) -> int:
        return sum(int(n or 0) for n in self._read(lambda pipe: [pipe.get(f"{self._base(s)}:applied")
                                                                 for s in self._shards()]))

    def catalog(self, cursor: CatalogCursor = (), limit: int = 10_000) -> tuple[list[tuple[str, str]], CatalogCursor]:
        """Up to ``limit`` items per shard; an item first seen in several shards is listed by each (with the
        category that shard saw first) and once per call: readers keep the first (serving.catalog)."""
        pos = list(cursor) or [0] * self.partitions
        if len(pos) != self.partitions:
            raise ValueError(f"a catalog cursor of {len(pos)} shards, for a store of {self.partitions}")
        orders = self._read(lambda pipe: [pipe.lrange(f"{self._base(s)}:catalog:order", pos[s], pos[s] + limit - 1)
                                          for s in self._shards()])
        cats = self._read(lambda pipe: [pipe.hmget(f"{self._base(s)}:catalog", order)
                                        for s, order in enumerate(orders) if order])
        out: dict[str, str] = {}
        for s, order in enumerate(o for o in orders if o):
            for item, cat in zip(order, cats[s], strict=True):
                out.setdefault(item, cat)
        return list(out.items()), tuple(p + len(o) for p, o in zip(pos, orders, strict=True))

    # -------------------------------------------------------------- experiment counters (experiments.state_redis)
    def experiment_sums(self, experiment: str) -> dict[str, dict[str, float]]:
        """Per variant, the script's counters summed over the shards (online.base.AB_SUM_FIELDS, each per
        segment: ``field@segment``)."""
        sets = self._read(lambda pipe: [pipe.smembers(f"{self._base(s)}:ab:{experiment}:variants")
                                        for s in self._shards()])
        pairs = sorted((s, v) for s, vs in enumerate(sets) for v in vs)
        rows = self._read(lambda pipe: [pipe.hgetall(f"{self._base(s)}:ab:{experiment}:v:{v}") for s, v in pairs])
        out: dict[str, dict[str, float]] = {}
        for (_, v), row in zip(pairs, rows, strict=True):
            sums = out.setdefault(v, {})
            for field, value in row.items():
                sums[field] = sums.get(field, 0.0) + float(value)
        return out

    def unattributed_counts(self) -> dict[str, int]:
        rows = self._read(lambda pipe: [pipe.hgetall(f"{self._base(s)}:ab:unattributed") for s in self._shards()])
        return {k: sum(int(r.get(k, 0)) for r in rows) for k in UNATTRIBUTED}

    # -------------------------------------------------------------- lifecycle
    def ping(self) -> None:
        try:
            self._client().ping()
        except REDIS_ERRORS as exc:
            raise StoreUnavailable(f"redis not reachable ({self._url}): {exc}") from exc

    def close(self) -> None:
        if self._r_client is not None:
            self._r_client.close()

    def flush_prefix(self) -> None:
        """Delete every key under this store's prefix, on every node (tests, demo resets)."""
        try:
            client = self._client()
            keys = list(client.scan_iter(f"{self.prefix}:*", count=1000))
            for i in range(0, len(keys), 1000):
                client.delete(*keys[i:i + 1000])
        except REDIS_ERRORS as exc:
            raise StoreUnavailable(f"redis delete failed ({self._url}): {exc}") from exc
        self._layout_checked = False
