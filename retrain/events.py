"""Training data of record: the archived events of a data window, as the columns training reads.

The archive (streams.archive) holds every record the stream carried, exactly once per offset.
A retrain reads those whose event time falls in ``[start, end)``; a record that does not parse is
counted and skipped (it never reached the online store either: ingestion dead-letters it), and an
event id seen twice (a client's retry published twice) counts once.

Only the window's hours are read (the archive's files are partitioned by produce time, which is at
or after an event's time): from ``start`` less ``skew_s`` (producers' clocks) to ``end`` plus
``late_s`` (events produced that long after they happened still count), file by file, keeping the
window's rows only — the cost follows the window, not the topic's history.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dinrec.datasets.base import Interactions
from dinrec.events.errors import InvalidEvent
from dinrec.events.schema import BehaviourEvent
from dinrec.storage import Storage
from dinrec.streams.archive import read_hours


@dataclass
class WindowEvents:
    data: Interactions  # every event in the window (impressions included: they are logged for CTR)
    stats: dict = field(default_factory=dict)
    # (user, item, ts) of behaviours on a served recommendation (the event names its request): the
    # serving model chose what could be clicked, so these favour it as a holdout (exposure bias)
    attributed: list[tuple[str, str, float]] = field(default_factory=list)


def read_window(archive_dir: str | Path | Storage, topic: str, start: float, end: float, *, late_s: float = 6 * 3600,
                skew_s: float = 300.0) -> WindowEvents:
    """The archived events of ``topic`` with ``start <= ts < end``, oldest first."""
    return window_of(read_hours(archive_dir, topic, start - skew_s, end + late_s), topic, start, end)


def window_of(records: Iterable[bytes], topic: str, start: float, end: float) -> WindowEvents:
    """The events of ``records`` (archived records of ``topic``) with ``start <= ts < end``, oldest first;
    the records are consumed one at a time."""
    rows: list[tuple] = []
    seen: set[str] = set()
    attributed: list[tuple[str, str, float]] = []
    invalid = duplicates = outside = 0
    for raw in records:
        try:
            e = BehaviourEvent.from_bytes(raw)
        except InvalidEvent:
            invalid += 1
            continue
        if not start <= e.ts < end:
            outside += 1
            continue
        if e.event_id in seen:
            duplicates += 1
            continue
        seen.add(e.event_id)
        if e.request_id is not None and e.event_type != "impression":
            attributed.append((e.user_id, e.item_id, e.ts))
        rows.append((e.user_id, e.item_id, e.category_id, e.event_type, e.ts,
                     np.nan if e.value is None else e.value))
    rows.sort(key=lambda r: r[4])
    cols: list[tuple] = list(zip(*rows, strict=True)) if rows else [()] * 6
    data = Interactions.from_columns(cols[0], cols[1], cols[2], np.asarray(cols[4], dtype=np.float64),
                                     event_type=np.asarray(cols[3], dtype=object), value=cols[5],
                                     source=f"archive:{topic}")
    stats = {"events": len(data), "behaviours": int(len(data.behaviours())), "invalid": invalid,
             "duplicates": duplicates, "outside_window": outside, "attributed": len(attributed)}
    return WindowEvents(data, stats, attributed)
