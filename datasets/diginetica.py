"""DIGINETICA (CIKM Cup 2016) item views: ``session_id;user_id;item_id;timeframe;eventdate`` with a
header, semicolon-separated (``train-item-views.csv`` or a sample of it).

A session is the "user" (most sessions are anonymous: ``user_id`` is ``NA``), so a history is what
was viewed earlier in the session, as session-based recommenders read it. The time of a view is
its date (UTC midnight) plus ``timeframe`` milliseconds. The file has no categories: every item gets
the one category ``-``, so DIN and the towers learn from the items alone.
"""

from __future__ import annotations

import csv
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from dinrec.datasets.base import Interactions
from dinrec.datasets.errors import DatasetError

HEADER = ["session_id", "user_id", "item_id", "timeframe", "eventdate"]
NO_CATEGORY = "-"


def is_item_views(path: Path) -> bool:
    with path.open(newline="") as fh:
        return fh.readline().strip().split(";") == HEADER


def load_item_views(path: Path) -> Interactions:
    sessions, items, ts = [], [], []
    days: dict[str, float] = {}
    with path.open(newline="") as fh:
        reader = csv.reader(fh, delimiter=";")
        next(reader, None)
        for lineno, rec in enumerate(reader, 2):
            if not rec:
                continue
            if len(rec) != 5:
                raise DatasetError(f"{path}:{lineno}: expected {';'.join(HEADER)}, got {rec}")
            session, _, item, frame, date = rec
            try:
                day = days.get(date)
                if day is None:
                    day = days[date] = datetime.strptime(date, "%Y-%m-%d").replace(tzinfo=UTC).timestamp()
                ts.append(day + float(frame) / 1000.0)
            except ValueError as exc:
                raise DatasetError(f"{path}:{lineno}: bad timeframe or date: {exc}") from exc
            sessions.append(f"s{session}")
            items.append(item)
    if not sessions:
        raise DatasetError(f"{path}: no rows")
    return Interactions.from_columns(np.array(sessions, dtype=object), np.array(items, dtype=object),
                                     np.full(len(items), NO_CATEGORY, dtype=object), np.asarray(ts),
                                     event_type="view", source="diginetica")
