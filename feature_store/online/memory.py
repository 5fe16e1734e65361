"""The embedded default: an in-process store with the same semantics as Redis."""

from __future__ import annotations

import math
import threading
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Callable, Sequence
from typing import Any

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
    HistoryItem,
    merge_history,
    segment_of,
)
from dinrec.events.long_tail import head_of
from dinrec.feature_store.errors import OffsetConflict
from dinrec.feature_store.online.base import (
    UNATTRIBUTED,
    CatalogCursor,
    OnlineStore,
    StoreRecord,
    StreamOffsets,
)


def _drop_oldest(table: dict, expired: Callable[[Any], bool]) -> None:
    """Drop ``table``'s first (oldest) entries while their value has ``expired`` (O(1) each in an OrderedDict;
    in a plain dict only for the small per-user tables)."""
    while table and expired(next(iter(table.values()))):
        del table[next(iter(table))]


class MemoryStore(OnlineStore):
    backend = "memory"

    def __init__(self, history_cap: int = 50, dedup_window_s: float = DEFAULT_DEDUP_WINDOW_S,
                 clock: Callable[[], float] | None = None, interacted_cap: int = DEFAULT_INTERACTED_CAP,
                 user_ttl_s: float = DEFAULT_USER_TTL_S, seen_cap: int = DEFAULT_SEEN_CAP,
                 popularity_window_s: float = DEFAULT_POPULARITY_WINDOW_S,
                 catalog_min_users: int = DEFAULT_CATALOG_MIN_USERS, ab_user_cap: int = DEFAULT_AB_USER_CAP,
                 attribution_window_s: float = DEFAULT_ATTRIBUTION_WINDOW_S,
                 ab_value_cap: float = DEFAULT_AB_VALUE_CAP) -> None:
        super().__init__(history_cap, dedup_window_s, clock, interacted_cap, user_ttl_s, seen_cap,
                         popularity_window_s, catalog_min_users, ab_user_cap, attribution_window_s, ab_value_cap)
        # The store-wide tables that expire from their oldest entry are OrderedDicts: a plain dict's first entry is
        # found by scanning the holes its deletions left at the front, which made a long-running store slower
        # by the minute (`dinrec bench soak`); an OrderedDict's is at hand.
        self._written: OrderedDict[str, float] = OrderedDict()  # user -> last write, oldest first (as Redis TTLs)
        self._user_experiments: dict[str, set[str]] = defaultdict(set)  # to expire a user's A/B state too
        self._hist: dict[str, list[HistoryItem]] = defaultdict(list)
        self._items: dict[str, dict[str, float]] = defaultdict(dict)  # user -> item -> newest behaviour time
        self._pop: Counter[str] = Counter()
        # user -> item -> when its popularity was last counted; insertion order is that order (a recount
        # moves it to the end), so expiry pops from the front
        self._counted: dict[str, dict[str, float]] = defaultdict(dict)
        self._applied = 0  # behaviours applied to histories, ever
        # item -> [popularity, expires at] of an item not admitted yet; insertion order is the order of last
        # counts, so expiry pops from the front (as the Redis store's adm keys expire)
        self._admitting: OrderedDict[str, list[float]] = OrderedDict()
        self._catalog: dict[str, str] = {}  # item -> category of the items admitted (OnlineStore: the catalog)
        self._catalog_order: list[str] = []
        # user -> {event_id: first applied at}; insertion order is application order, so expiry pops
        # from the front (like the Redis store's ZREMRANGEBYSCORE).
        self._seen: dict[str, dict[str, float]] = defaultdict(dict)
        self._offsets: dict[str, dict[int, int]] = defaultdict(dict)
        # Experiments: (request, item) -> (experiment, variant); (experiment, user) -> {v, n, c, b, k, val, x};
        # (experiment, variant) -> the sums of AB_SUM_FIELDS per segment ("n@new"). Attribution entries expire with the
        # dedup window, as in Redis.
        self._att: OrderedDict[tuple[str, str], tuple[str, str, float, str]] = OrderedDict()  # (exp, variant, at, user)
        self._pending: OrderedDict[tuple[str, str], tuple[str, float]] = OrderedDict()  # clicks before their impression
        self._ab_user: dict[tuple[str, str], dict[str, Any]] = {}
        self._ab_sums: dict[str, dict[str, defaultdict[str, float]]] = defaultdict(dict)
        self._unattributed: Counter[str] = Counter()
        self._lock = threading.Lock()  # the ingest thread writes while requests read
        self._head: set[str] | None = None  # the head by popularity (events.long_tail), when first needed

    def _long_tail(self, item: str) -> bool:
        """Outside the head by behaviours so far (events.long_tail, as the Redis store's script
        decides). Popularity changes only after a write's batch, so the head is ranked once per write
        that needs it, not once per click."""
        if item not in self._pop:
            return True
        if self._head is None:
            self._head = head_of(self._pop)
        return item not in self._head

    def _count(self, user: str, experiment: str, variant: str, what: str, item: str = "", pre: int = 0) -> None:
        """One impression (``what`` "n") or click ("c") of ``user`` in ``variant``; ``pre``: the user's
        behaviours so far (their covariate, if this is their first exposure). Every sum is kept per segment
        of the user (``field@segment``, as the Redis script keeps them; summed on read)."""
        self._user_experiments[user].add(experiment)
        state = self._ab_user.setdefault((experiment, user), {"v": variant, "n": 0, "c": 0, "b": 0, "k": 0,
                                                              "val": 0.0, "x": None})
        if state["v"] != variant:
            self._unattributed["variant_conflicts"] += 1
            return
        if state[what] >= self.ab_user_cap:  # what one user adds is capped: the rest counted apart
            self._unattributed["capped"] += 1
            return
        sums = self._ab_sums[experiment].setdefault(variant, defaultdict(float))
        first = state["x"] is None
        if first:  # first exposure: one more user, and what they did before it
            state["x"] = min(pre, self.history_cap)
        x, at = state["x"], "@" + segment_of(state["x"])
        if first:
            sums["users" + at] += 1
            sums["x" + at] += x
            sums["x2" + at] += x * x
        if what == "c":
            sums["c2" + at] += 2 * state["c"] + 1
            sums["nc" + at] += state["n"]
            sums["tail_c" + at] += self._long_tail(item)
        else:
            sums["n2" + at] += 2 * state["n"] + 1
            sums["nc" + at] += state["c"]
            sums["nb" + at] += state["b"]
        sums[what + at] += 1
        sums["x" + what + at] += x
        state[what] += 1

    def _convert(self, user: str, kind: str, value: float) -> None:
        """A buy ("P", worth ``value``) or cart ("K") of ``user``: a conversion in every experiment they were
        exposed to, under their variant there."""
        what = "b" if kind == "P" else "k"
        for experiment in self._user_experiments.get(user, ()):
            state = self._ab_user.get((experiment, user))
            if state is None or state["x"] is None:
                continue
            if state[what] >= self.ab_user_cap:
                self._unattributed["capped"] += 1
                continue
            sums = self._ab_sums[experiment][state["v"]]
            x, at = state["x"], "@" + segment_of(state["x"])
            sums[what + "2" + at] += 2 * state[what] + 1
            sums[what + at] += 1
            sums["x" + what + at] += x
            if what == "b":
                sums["nb" + at] += state["n"]
                if value > 0:
                    room = self.ab_value_cap - state["val"]
                    if value > room:  # past the cap: the rest of its value counted apart
                        self._unattributed["capped"] += 1
                        value = max(room, 0.0)
                    sums["val2" + at] += 2 * state["val"] * value + value * value
                    sums["val" + at] += value
                    sums["xval" + at] += x * value
                    state["val"] += value
            state[what] += 1

    def _write(self, items: list[tuple[str, StoreRecord]], offsets: StreamOffsets | None, now: float) -> int:
        by_user: dict[str, list[StoreRecord]] = defaultdict(list)
        for user, r in items:
            by_user[user].append(r)
        added = 0
        increments: Counter[str] = Counter()  # applied after the batch, as the Redis script does
        categories: dict[str, str] = {}  # item -> its category in this batch (the first met)
        with self._lock:
            self._head = None  # popularity moved since the last write
            # Attribution entries were inserted in time order: drop the expired ones from the front,
            # as Redis lets them expire, so a long-running embedded service does not grow without end.
            _drop_oldest(self._att, lambda v: v[2] <= now - self.attribution_window_s)
            _drop_oldest(self._pending, lambda v: v[1] <= now - self.attribution_window_s)
            if offsets is not None:
                held = self._offsets[offsets.topic]
                stale = {p: held.get(p, -1) for p, want in offsets.expected.items() if held.get(p, -1) != want}
                if stale:
                    raise OffsetConflict(offsets.topic, stale)
                held.update(offsets.last)
            self._expire_users(now)
            for user, new in by_user.items():
                self._written[user] = now
                self._written.move_to_end(user)  # the order is the order of last writes
                seen = self._seen[user]
                _drop_oldest(seen, lambda at: at <= now - self.dedup_window_s)
                counted = self._counted[user]
                _drop_oldest(counted, lambda at: at <= now - self.popularity_window_s)
                kept = {h.event_id for h in self._hist[user]}
                fresh: list[HistoryItem] = []
                for r in new:
                    h = r.item
                    if h.event_id in seen:
                        continue
                    seen[h.event_id] = now
                    if r.kind == "I":
                        self._count(user, r.experiment, r.variant, "n", h.item_id,
                                    len(self._hist[user]) + len(fresh))
                        key = (r.request_id, h.item_id)
                        if self._pending.get(key, ("", 0.0))[0] == user:  # its click came first: joined now
                            del self._pending[key]
                            self._unattributed["orphan_clicks"] -= 1
                            self._count(user, r.experiment, r.variant, "c", h.item_id)
                        else:
                            self._att[key] = (r.experiment, r.variant, now, user)
                        added += 1
                        continue
                    if h.event_id in kept:  # applied before, and its seen-entry has expired since
                        continue
                    kept.add(h.event_id)
                    if h.item_id not in counted:  # a (user, item) once per popularity window
                        counted[h.item_id] = now
                        increments[h.item_id] += 1
                        categories.setdefault(h.item_id, h.category_id)
                    fresh.append(h)
                    if r.kind == "C":
                        key = (r.request_id, h.item_id)
                        att = self._att.get(key)
                        shown = att if att is not None and att[2] > now - self.attribution_window_s else None
                        if shown is None or shown[3] != user:
                            self._unattributed["orphan_clicks"] += 1  # never shown to this user, or clicked
                            if shown is None:  # its impression may follow
                                self._pending.setdefault(key, (user, now))
                        else:
                            del self._att[key]  # counted once
                            self._count(user, shown[0], shown[1], "c", h.item_id)
                    elif r.kind in ("P", "K"):
                        self._convert(user, r.kind, r.value)
                while len(seen) > self.seen_cap:  # the oldest ids go first, as ZREMRANGEBYRANK in Redis
                    del seen[next(iter(seen))]
                while len(counted) > self.seen_cap:
                    del counted[next(iter(counted))]
                added += len(fresh)
                self._applied += len(fresh)
                if fresh:
                    self._hist[user] = merge_history(self._hist[user], fresh, self.history_cap)
                    self._remember(user, fresh)
            _drop_oldest(self._admitting, lambda v: v[1] <= now)
            for item, n in increments.items():
                if item in self._catalog:
                    self._pop[item] += n
                    continue
                count = self._admitting.pop(item, [0, 0.0])[0] + n
                if count >= self.catalog_min_users:  # popular enough: admitted
                    self._pop[item] += int(count)
                    self._list(item, categories[item])
                else:
                    self._admitting[item] = [count, now + self.popularity_window_s]
        return added

    def _list(self, item: str, category: str) -> bool:
        if item in self._catalog:
            return False
        self._catalog[item] = category
        self._catalog_order.append(item)
        return True

    def admit(self, items: Sequence[tuple[str, str]]) -> int:
        with self._lock:
            return sum(self._list(item, category) for item, category in items)

    def applied_behaviours(self) -> int:
        with self._lock:
            return self._applied

    def _expire_users(self, now: float) -> None:
        """Forget users not written for ``user_ttl_s`` (their history, items, dedup ids and A/B state), as
        their keys expire in Redis: invented user ids do not stay forever."""
        while self.user_ttl_s and self._written and next(iter(self._written.values())) <= now - self.user_ttl_s:
            user, _ = self._written.popitem(last=False)
            for table in (self._hist, self._items, self._seen, self._counted):
                table.pop(user, None)
            for experiment in self._user_experiments.pop(user, ()):
                self._ab_user.pop((experiment, user), None)

    def _remember(self, user: str, fresh: list[HistoryItem]) -> None:
        """The user's interacted items, each at its newest time, trimmed to the newest
        ``interacted_cap`` (ties: the greater item id kept, as Redis ranks a sorted set)."""
        items = self._items[user]
        for h in fresh:
            if h.ts > items.get(h.item_id, -math.inf):
                items[h.item_id] = h.ts
        if len(items) > self.interacted_cap:
            kept = sorted(items.items(), key=lambda kv: (kv[1], kv[0]))[-self.interacted_cap:]
            self._items[user] = dict(kept)

    def interacted(self, user_ids: Sequence[str]) -> dict[str, frozenset[str]]:
        with self._lock:
            return {u: frozenset(self._items.get(u, ())) for u in user_ids}

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

    def experiment_counts(self, experiment: str) -> dict[str, dict[str, float]]:
        """Per variant, the sums of online.base.AB_SUM_FIELDS, each per segment (``field@segment``:
        experiments.state reads them)."""
        with self._lock:
            return {v: dict(sums) for v, sums in self._ab_sums.get(experiment, {}).items()}

    def unattributed_counts(self) -> dict[str, int]:
        with self._lock:
            return {k: self._unattributed[k] for k in UNATTRIBUTED}

    def catalog(self, cursor: CatalogCursor = (), limit: int = 10_000) -> tuple[list[tuple[str, str]], CatalogCursor]:
        since = cursor[0] if cursor else 0
        with self._lock:
            items = self._catalog_order[since:since + limit]
            return [(i, self._catalog[i]) for i in items], (since + len(items),)

    def ping(self) -> None:
        return None
