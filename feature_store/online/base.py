"""The online-store interface and the factory that picks a backend by its type string."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from feature_store.errors import MissingDependency
from feature_store.experiments.stats import VariantSums
from feature_store.features import HistoryItem, is_behaviour
from feature_store.schema import BehaviourEvent

if TYPE_CHECKING:
    from feature_store.settings import FeatureStoreSettings

DEFAULT_DEDUP_WINDOW_S = 24 * 3600.0
DEFAULT_INTERACTED_CAP = 1000


class Record(NamedTuple):
    """One event as a store applies it.

    ``kind``: "B" a behaviour (history and popularity); "C" a click carrying a request id — a
    behaviour, and an experiment click if that request's impression of the item was logged; "I" an
    experiment impression (counted, never history)."""

    kind: str
    item: HistoryItem
    request_id: str = ""
    experiment: str = ""
    variant: str = ""


def to_records(events: Sequence[BehaviourEvent]) -> list[tuple[str, Record]]:
    """(user, record) for the events a store applies; the rest (impressions outside experiments,
    low ratings) have no effect on it."""
    out = []
    for e in events:
        h = HistoryItem(e.ts, e.event_id, e.item_id, e.category_id)
        if e.event_type == "impression":
            if e.experiment and e.variant and e.request_id:
                out.append((e.user_id, Record("I", h, e.request_id, e.experiment, e.variant)))
        elif is_behaviour(e.event_type, e.value):
            out.append((e.user_id, Record("C" if e.event_type == "click" and e.request_id else "B", h,
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
    * ``write`` keeps only behaviours (impressions are not history) and orders by (ts, event_id)
      whatever the arrival order.
    * Exactly-once effect: an event id is applied once per user within ``dedup_window_s`` of its
      first application, however often it is redelivered and whether or not it is still inside the
      capped history; popularity counts it once.
    * With ``offsets``, the write and the topic offsets it covers are applied in one atomic step,
      or not at all (OffsetConflict): a consumer that resumes from the store's offsets never applies
      a record twice nor skips one, even if the store itself lost recent writes.
    * ``history`` returns the newest ``limit`` behaviours, oldest first.
    * ``interacted`` returns the items of the user's newest ``interacted_cap`` behaviours (one entry
      per item, however often taken), kept beyond the history cap and written in the same atomic
      step: what the seen-item policy keeps out of a served list.
    * Experiments: an impression (with experiment, variant, request id) adds to its variant's
      per-user counts; a click with a request id is attributed to the variant that request's
      impression of the item was logged under, else counted apart — never joined silently; both
      once per event id, in the same atomic step as everything else.
    """

    def __init__(self, history_cap: int, dedup_window_s: float = DEFAULT_DEDUP_WINDOW_S,
                 clock: Callable[[], float] | None = None, interacted_cap: int = DEFAULT_INTERACTED_CAP) -> None:
        if history_cap < 1:
            raise ValueError("history_cap must be >= 1")
        if interacted_cap < 1:
            raise ValueError("interacted_cap must be >= 1")
        self.interacted_cap = interacted_cap
        if dedup_window_s < 1:
            raise ValueError("dedup_window_s must be >= 1 second")
        self.history_cap = history_cap
        self.dedup_window_s = float(dedup_window_s)
        self._clock = clock or time.time  # injectable: tests move time past the dedup window

    def write(self, events: Sequence[BehaviourEvent], offsets: StreamOffsets | None = None) -> int:
        """Store the behaviours and experiment impressions/clicks among ``events`` (and ``offsets``,
        atomically); return how many were applied for the first time."""
        items = to_records(events)
        if not items and offsets is None:
            return 0
        return self._write(items, offsets, self._clock())

    @abstractmethod
    def _write(self, items: list[tuple[str, Record]], offsets: StreamOffsets | None, now: float) -> int: ...

    @abstractmethod
    def ab_sums(self, experiment: str) -> dict[str, VariantSums]:
        """Per variant of ``experiment``: users, and sums over them of impressions, clicks, their
        squares and products — counted once per event id, like the histories."""

    @abstractmethod
    def ab_stop(self, experiment: str, variant: str, decision: dict) -> bool:
        """Record that ``variant`` is stopped, unless it already is (then the first decision stands);
        True if this call recorded it. Every replica reads the same decisions."""

    @abstractmethod
    def ab_stopped(self, experiment: str) -> dict[str, dict]:
        """The stopped variants of ``experiment`` and the decision that stopped each."""

    @abstractmethod
    def ab_ramp(self, experiment: str, step: int, record: dict) -> bool:
        """Record that ``experiment``'s ramp reached ``step`` (first writer wins, like ``ab_stop``)."""

    @abstractmethod
    def ab_ramp_log(self, experiment: str) -> list[dict]:
        """The ramp steps ``experiment`` has reached, in order."""

    @abstractmethod
    def ab_conclude(self, experiment: str, decision: dict) -> bool:
        """Record ``experiment``'s winner (first writer wins); True if this call recorded it."""

    @abstractmethod
    def ab_conclusion(self, experiment: str) -> dict | None:
        """The winner recorded for ``experiment``, if any."""

    @abstractmethod
    def ab_snapshot(self, experiment: str, bucket: int, snapshot: dict) -> bool:
        """Keep ``snapshot`` (the experiment's counts at one time) under ``bucket`` unless one is
        there already; the timeline the dashboard draws."""

    @abstractmethod
    def ab_timeline(self, experiment: str) -> list[dict]:
        """The snapshots of ``experiment``, oldest first."""

    @abstractmethod
    def ab_unattributed(self) -> dict[str, int]:
        """Clicks whose request has no logged impression of the item (``orphan_clicks``), and
        experiment events of a user already counted under another variant (``variant_conflicts``)."""

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
        """The ``k`` items with the most behaviours, most popular first."""

    @abstractmethod
    def catalog(self, since: int = 0, limit: int = 10_000) -> tuple[list[tuple[str, str]], int]:
        """Items in the order they were first seen in a behaviour, from position ``since``: up to
        ``limit`` (item id, category id) pairs and the position after them (the next ``since``).
        How serving learns of items that arrived after its model was trained."""

    @abstractmethod
    def ping(self) -> None:
        """Raise StoreUnavailable if the store cannot serve."""

    def close(self) -> None:  # noqa: B027 - optional hook
        pass


def open_store(settings: FeatureStoreSettings) -> OnlineStore:
    """Build the configured store; backends are imported only when chosen."""
    if settings.store == "memory":
        from feature_store.online.memory import MemoryStore

        return MemoryStore(history_cap=settings.history_len, dedup_window_s=settings.dedup_window_s,
                           interacted_cap=settings.interacted_cap)
    if settings.store == "redis":
        try:
            from feature_store.online.redis_store import RedisStore
        except ImportError as exc:  # pragma: no cover - redis is a core dependency today
            raise MissingDependency("the redis store needs `pip install redis`") from exc
        return RedisStore(settings.redis_url, prefix=settings.redis_prefix, history_cap=settings.history_len,
                          dedup_window_s=settings.dedup_window_s, socket_timeout_s=settings.redis_timeout_ms / 1000,
                          interacted_cap=settings.interacted_cap)
    raise ValueError(f"unknown store type {settings.store!r}")  # pragma: no cover - Literal guards it
