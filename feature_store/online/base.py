"""The online-store interface: what every behaviour store backend does (the factory: feature_store.online)."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

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
    is_behaviour,
)
from dinrec.events.schema import BehaviourEvent

# What the A/B counters keep apart: clicks never shown to the clicking user (or clicked again, or still
# waiting for their impression), a user met in two variants, and what a user added past ab_user_cap (or,
# of a buy's value, past ab_value_cap).
UNATTRIBUTED = ("orphan_clicks", "variant_conflicts", "capped")

# The per-variant sums both stores keep (experiments.stats.VariantSums reads them), over the variant's
# users: the user count; impressions n, clicks c, buys b, carts k, the buys' value val, each with its
# square and the cross products the ratio metrics need; clicks on long-tail items; and x, the user's
# behaviours before their first exposure (their history then, at most the history cap), with its
# square and its products with every metric — CUPED's pre-exposure covariate.
AB_SUM_FIELDS = ("users", "n", "c", "n2", "c2", "nc", "tail_c", "b", "b2", "nb", "k", "k2", "val", "val2",
                 "x", "x2", "xn", "xc", "xb", "xk", "xval")
# The conversions an exposed user's behaviours count as, by record kind (see StoreRecord).
CONVERSION_KINDS = {"buy": "P", "cart": "K"}
CatalogCursor = tuple[int, ...]  # where a catalog read stopped; opaque to callers: () is the beginning


class StoreRecord(NamedTuple):
    """One event as a store applies it.

    ``kind``: "B" a behaviour (history and popularity); "C" a click carrying a request id — a
    behaviour, and an experiment click if that request's impression of the item was logged; "P" a buy
    and "K" a cart — behaviours, and conversions in every experiment the user was exposed to before (a
    buy's ``value``, if positive, its value); "I" an experiment impression (counted, never history)."""

    kind: str
    item: HistoryItem
    request_id: str = ""
    experiment: str = ""
    variant: str = ""
    value: float = 0.0


def to_records(events: Sequence[BehaviourEvent]) -> list[tuple[str, StoreRecord]]:
    """(user, record) for the events a store applies; the rest (impressions outside experiments,
    low ratings) have no effect on it."""
    out = []
    for e in events:
        h = HistoryItem(e.ts, e.event_id, e.item_id, e.category_id)
        if e.event_type == "impression":
            if e.experiment and e.variant and e.request_id:
                out.append((e.user_id, StoreRecord("I", h, e.request_id, e.experiment, e.variant)))
        elif e.event_type in CONVERSION_KINDS:
            value = e.value if e.event_type == "buy" and e.value is not None and e.value > 0 else 0.0
            out.append((e.user_id, StoreRecord(CONVERSION_KINDS[e.event_type], h, value=value)))
        elif is_behaviour(e.event_type, e.value):
            out.append((e.user_id, StoreRecord("C" if e.event_type == "click" and e.request_id else "B", h,
                                          e.request_id or "")))
    return out


@dataclass(frozen=True)
class StreamOffsets:
    """Where in a topic a write comes from, so the store can keep its own consumer offsets.

    ``expected``: per partition, the last offset the writer believes the store has applied (-1:
    none). ``last``: per partition, the last offset this write covers (records that failed
    validation included). The store applies the write only if every ``expected`` matches what it
    holds, and records ``last`` in the same atomic step; otherwise it raises OffsetConflict.
    """

    topic: str
    expected: Mapping[int, int]
    last: Mapping[int, int]

    def __post_init__(self) -> None:
        if set(self.expected) != set(self.last):
            raise ValueError("expected and last must name the same partitions")
        for p, off in self.last.items():
            if off <= self.expected[p]:
                raise ValueError(f"partition {p}: last offset {off} is not after expected {self.expected[p]}")


class OnlineStore(ABC):
    """Per-user capped behaviour histories plus item popularity.

    Contract (tests/feature_store/test_store_conformance.py runs it on every backend):
    * Atomic steps are per shard (``partitions``; one shard per stream partition): a write's users and
      the offsets of their partition change together, and the shards of one write independently.
    * ``write`` keeps only behaviours (impressions are not history) and orders by (ts, event_id)
      whatever the arrival order.
    * Exactly-once effect: an event id is applied once per user within ``dedup_window_s`` of its
      first application, however often it is redelivered and whether or not it is still inside the
      capped history.
    * Popularity counts a (user, item) once per ``popularity_window_s`` (by the store's clock): one
      client repeating a behaviour cannot lift an item into everybody's list.
    * The catalog admits an item clients name once its popularity reaches ``catalog_min_users`` (in
      one shard), or when a trusted feed names it (:meth:`admit`): invented item ids do not reach serving.
      Popularity lists admitted items only; an item's count until then is kept apart and forgotten a
      popularity window after its last count, so what invented ids make the store hold goes away.
    * With ``offsets``, the write and the topic offsets it covers are applied in one atomic step,
      or not at all (OffsetConflict): a consumer that resumes from the store's offsets never applies
      a record twice nor skips one, even if the store itself lost recent writes.
    * ``history`` returns the newest ``limit`` behaviours, oldest first.
    * ``interacted`` returns the items of the user's newest ``interacted_cap`` behaviours (one entry
      per item, however often taken), kept beyond the history cap and written in the same atomic
      step: what the seen-item policy keeps out of a served list.
    * Experiments: the write also keeps the A/B counters (experiments.state reads them) in the
      same atomic step as everything else, so they are exactly once like the histories. A user adds
      at most ``ab_user_cap`` impressions, and as many clicks, buys and carts, and at most
      ``ab_value_cap`` of buys' value, to an experiment's counts; beyond that they are counted apart
      (``capped``): a bot cannot outweigh the people in an arm.
    * A buy or cart is a conversion in every experiment its user was exposed to (had an impression
      counted in) before it arrived, under the user's variant there: attribution by exposure, as
      GrowthBook's. A user's first exposure also keeps the behaviours they had then (``x``, their
      history's length) as CUPED's pre-exposure covariate.
    * A click joins its impression if the two arrive within ``attribution_window_s`` of each other, in
      either order; what each impression and each early click leaves for the join expires with the window
      (not with the dedup window: an experiment's per-request state must not outlive its use).
    """

    # Shards of the store's data, one per stream partition (events.partitioning); a write is
    # atomic within a shard. 1: one atomic step for everything, whatever the topic's partition count.
    partitions: int = 1
    # The backend's type string (DINREC_STORE's values: memory, redis, redis-cluster): what picks the parts
    # kept beside the store's data, such as an experiment's state (experiments.open_state).
    backend: str

    def __init__(self, history_cap: int, dedup_window_s: float = DEFAULT_DEDUP_WINDOW_S,
                 clock: Callable[[], float] | None = None, interacted_cap: int = DEFAULT_INTERACTED_CAP,
                 user_ttl_s: float = DEFAULT_USER_TTL_S, seen_cap: int = DEFAULT_SEEN_CAP,
                 popularity_window_s: float = DEFAULT_POPULARITY_WINDOW_S,
                 catalog_min_users: int = DEFAULT_CATALOG_MIN_USERS, ab_user_cap: int = DEFAULT_AB_USER_CAP,
                 attribution_window_s: float = DEFAULT_ATTRIBUTION_WINDOW_S,
                 ab_value_cap: float = DEFAULT_AB_VALUE_CAP) -> None:
        """``user_ttl_s``: a user's keys (history, items taken, dedup ids, A/B state) expire this long after
        their last write, so invented user ids cannot fill the store (0: never); ``seen_cap``: event ids a
        user's dedup set keeps (the oldest go first: past it, a redelivery of an old one would apply again),
        and items whose popularity it counted within the window; the rest: see the class's contract."""
        if popularity_window_s < 1:
            raise ValueError("popularity_window_s must be >= 1 second")
        if catalog_min_users < 1:
            raise ValueError("catalog_min_users must be >= 1")
        if ab_user_cap < 1:
            raise ValueError("ab_user_cap must be >= 1")
        self.popularity_window_s, self.catalog_min_users = float(popularity_window_s), catalog_min_users
        self.ab_user_cap = ab_user_cap
        if not ab_value_cap > 0:
            raise ValueError("ab_value_cap must be > 0")
        self.ab_value_cap = float(ab_value_cap)
        if history_cap < 1:
            raise ValueError("history_cap must be >= 1")
        if user_ttl_s < 0 or (0 < user_ttl_s < dedup_window_s):
            raise ValueError("user_ttl_s must be 0 (never) or at least the dedup window")
        if seen_cap < 1:
            raise ValueError("seen_cap must be >= 1")
        self.user_ttl_s, self.seen_cap = float(user_ttl_s), seen_cap
        if interacted_cap < 1:
            raise ValueError("interacted_cap must be >= 1")
        self.interacted_cap = interacted_cap
        if dedup_window_s < 1:
            raise ValueError("dedup_window_s must be >= 1 second")
        self.history_cap = history_cap
        self.dedup_window_s = float(dedup_window_s)
        if attribution_window_s < 1:  # longer than the dedup window is fine: the join keeps its own keys
            raise ValueError("attribution_window_s must be >= 1 second")
        self.attribution_window_s = float(attribution_window_s)
        self._clock = clock or time.time  # injectable: tests move time past the dedup window

    def write(self, events: Sequence[BehaviourEvent], offsets: StreamOffsets | None = None) -> int:
        """Store the behaviours and experiment impressions/clicks among ``events`` (and ``offsets``,
        atomically); return how many were applied for the first time."""
        items = to_records(events)
        if not items and offsets is None:
            return 0
        return self._write(items, offsets, self._clock())

    @abstractmethod
    def _write(self, items: list[tuple[str, StoreRecord]], offsets: StreamOffsets | None, now: float) -> int: ...

    @abstractmethod
    def stream_offsets(self, topic: str) -> dict[int, int]:
        """The last applied offset per partition of ``topic`` (partitions never written: absent)."""

    @abstractmethod
    def histories(self, user_ids: Sequence[str], limit: int) -> dict[str, list[HistoryItem]]:
        """Newest ``limit`` behaviours per user (oldest first); one round trip for all users."""

    def history(self, user_id: str, limit: int) -> list[HistoryItem]:
        return self.histories([user_id], limit)[user_id]

    @abstractmethod
    def interacted(self, user_ids: Sequence[str]) -> dict[str, frozenset[str]]:
        """Per user, the items of their newest ``interacted_cap`` behaviours; one round trip."""

    def history_and_interacted(self, user_id: str, limit: int) -> tuple[list[HistoryItem], frozenset[str]]:
        """Both reads a request makes (backends may do them in one round trip)."""
        return self.history(user_id, limit), self.interacted([user_id])[user_id]

    @abstractmethod
    def popular(self, k: int) -> list[tuple[str, float]]:
        """The ``k`` most popular items (a (user, item) counts once per window), most popular first."""

    @abstractmethod
    def applied_behaviours(self) -> int:
        """How many behaviours were applied to histories, ever: what a loader waits on to know its
        events are in (popularity is no count of events)."""

    @abstractmethod
    def admit(self, items: Sequence[tuple[str, str]]) -> int:
        """Put (item id, category id) pairs from a trusted feed in the catalog at once (those not in it
        yet, with this category); returns how many joined."""

    @abstractmethod
    def catalog(self, cursor: CatalogCursor = (), limit: int = 10_000) -> tuple[list[tuple[str, str]], CatalogCursor]:
        """Items in the order they were first seen in a behaviour, from ``cursor`` (``()``: the
        beginning): up to ``limit`` (item id, category id) pairs per shard, each once, and the cursor
        after them. An item first seen in two shards may come again in a later page (readers keep the
        first). How serving learns of items that arrived after its model was trained."""

    @abstractmethod
    def ping(self) -> None:
        """Raise StoreUnavailable if the store cannot serve."""

    def check_layout(self) -> None:  # noqa: B027 - optional hook
        """Raise StoreLayoutError if the store holds data in a layout this version does not read."""

    def eviction_problem(self) -> str | None:
        """Why this store could lose what it must keep (a server that evicts keys), or None."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        pass

