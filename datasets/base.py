"""Columnar behaviour logs: what every loader returns and what training consumes."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from dinrec.events.features import behaviour_mask
from dinrec.events.schema import BehaviourEvent


@dataclass(frozen=True)
class Interactions:
    """Behaviour events as parallel numpy columns (one row per event).

    ``user_id``/``item_id``/``category_id``/``event_type`` are string arrays of external ids;
    ``ts`` is float64 unix seconds; ``value`` is float64 with NaN where absent (ratings).
    """

    user_id: np.ndarray
    item_id: np.ndarray
    category_id: np.ndarray
    event_type: np.ndarray
    ts: np.ndarray
    value: np.ndarray
    source: str = "unknown"

    def __post_init__(self) -> None:
        n = len(self.user_id)
        for name in ("item_id", "category_id", "event_type", "ts", "value"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"column {name} has {len(getattr(self, name))} rows, expected {n}")

    def __len__(self) -> int:
        return len(self.user_id)

    @classmethod
    def from_columns(cls, user_id, item_id, category_id, ts, event_type="click", value=None,
                     source: str = "unknown") -> Interactions:
        n = len(user_id)
        et = np.full(n, event_type, dtype=object) if isinstance(event_type, str) else event_type
        val = np.full(n, np.nan) if value is None else np.asarray(value, dtype=np.float64)
        return cls(
            user_id=np.asarray(user_id).astype(str),
            item_id=np.asarray(item_id).astype(str),
            category_id=np.asarray(category_id).astype(str),
            event_type=np.asarray(et).astype(str),
            ts=np.asarray(ts, dtype=np.float64),
            value=val,
            source=source,
        )

    def take(self, idx: np.ndarray) -> Interactions:
        return Interactions(self.user_id[idx], self.item_id[idx], self.category_id[idx],
                            self.event_type[idx], self.ts[idx], self.value[idx], self.source)

    def behaviours(self) -> Interactions:
        """Only the rows that count as behaviours (see events.features.is_behaviour)."""
        return self.take(np.flatnonzero(behaviour_mask(self.event_type, self.value)))

    def fingerprint(self) -> str:
        """A content hash, so a checkpoint can refuse to resume on different data."""
        h = hashlib.sha256()
        for col in (self.user_id, self.item_id, self.category_id, self.event_type):
            h.update("\x1f".join(col.tolist()).encode())
        h.update(self.ts.tobytes())
        h.update(np.nan_to_num(self.value, nan=-1.0).tobytes())
        return h.hexdigest()[:16]

    def events(self, prefix: str = "") -> Iterator[BehaviourEvent]:
        """Row-by-row events (slow path: for seeding stores and streams, not for training). Event ids end in
        the zero-padded row number: a store orders a history by (ts, event id), so behaviours that share a
        timestamp keep the rows' order, the order training's samples give them."""
        for i in range(len(self)):
            v = self.value[i]
            yield BehaviourEvent(
                event_id=f"{prefix}{self.source}:{i:010d}", user_id=self.user_id[i], item_id=self.item_id[i],
                category_id=self.category_id[i], event_type=self.event_type[i], ts=float(self.ts[i]),
                value=None if np.isnan(v) else float(v),
            )

    @classmethod
    def from_events(cls, events: list[BehaviourEvent], source: str = "events") -> Interactions:
        return cls.from_columns(
            [e.user_id for e in events], [e.item_id for e in events], [e.category_id for e in events],
            [e.ts for e in events], np.array([e.event_type for e in events], dtype=object),
            [np.nan if e.value is None else e.value for e in events], source=source,
        )
