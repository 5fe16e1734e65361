"""Feature logic shared by online ingestion and offline training-data building.

Both sides ask the same two questions, answered here once so they cannot drift:

* which events are *behaviours* (enter a user's history and count as positives)?
* what is a user's history at a time t? The events strictly before t, ordered by
  (ts, event_id), the newest ``L`` kept; a redelivered event (same event_id) counts once and an
  out-of-order one lands in its time slot, so the newest event time always wins.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

POSITIVE_RATING = 4.0
DEFAULT_HISTORY_LEN = 50
DEFAULT_DEDUP_WINDOW_S = 24 * 3600.0  # an event id applied once per user within this window
DEFAULT_INTERACTED_CAP = 1000  # items per user the seen-item policy remembers, beyond the history
DEFAULT_USER_TTL_S = 180 * 24 * 3600.0  # a user's keys expire this long after their last write
DEFAULT_SEEN_CAP = 10_000  # event ids per user the dedup set keeps within its window (a person sends far fewer)
DEFAULT_POPULARITY_WINDOW_S = 24 * 3600.0  # popularity counts a (user, item) once within this window
DEFAULT_CATALOG_MIN_USERS = 3  # popularity an item clients name needs before it joins the catalog
DEFAULT_AB_USER_CAP = 1000  # impressions, clicks, buys and carts: each, what one user adds to an experiment's counts
DEFAULT_AB_VALUE_CAP = 1_000_000.0  # the value (of buys) one user adds to an experiment's counts
DEFAULT_ATTRIBUTION_WINDOW_S = 3600.0  # a click joins its impression within this window (either may come first)
BEHAVIOUR_TYPES = frozenset({"view", "click", "cart", "fav", "buy"})
# The segments an experiment's counts are kept by (its results' breakdown): the behaviours a user had before
# their first exposure — none (a new user), a few, many. (name, the fewest behaviours it takes), ascending.
SEGMENTS = (("new", 0), ("light", 1), ("heavy", 10))


def segment_of(behaviours: int) -> str:
    """The segment of a user who had ``behaviours`` before their first exposure."""
    return next(name for name, least in reversed(SEGMENTS) if behaviours >= least)


def is_behaviour(event_type: str, value: float | None = None) -> bool:
    """True for events that express interest: any non-impression action, or a rating >= 4."""
    if event_type == "rate":
        return value is not None and value >= POSITIVE_RATING
    return event_type in BEHAVIOUR_TYPES


def behaviour_mask(event_types: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Vectorised :func:`is_behaviour` over columns (values: NaN where absent)."""
    is_rate = event_types == "rate"
    with np.errstate(invalid="ignore"):
        good_rating = np.nan_to_num(values, nan=-np.inf) >= POSITIVE_RATING
    return np.where(is_rate, good_rating, np.isin(event_types, list(BEHAVIOUR_TYPES)))


class HistoryItem(NamedTuple):
    """One behaviour in a user's history, as the online stores return it (oldest first)."""

    ts: float
    event_id: str
    item_id: str
    category_id: str


def merge_history(existing: list[HistoryItem], new: Iterable[HistoryItem], cap: int) -> list[HistoryItem]:
    """Merge, dedupe by event_id, order by (ts, event_id), keep the newest ``cap``."""
    by_id = {h.event_id: h for h in existing}
    for h in new:
        by_id[h.event_id] = h
    merged = sorted(by_id.values(), key=lambda h: (h.ts, h.event_id))
    return merged[-cap:] if cap > 0 else []
