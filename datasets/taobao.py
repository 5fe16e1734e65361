"""Taobao UserBehavior CSV: ``user_id,item_id,category_id,behavior_type,unix_timestamp`` with
behavior_type in {pv, buy, cart, fav}; no header. ``pv`` (page view) becomes ``view``."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from dinrec.datasets.base import Interactions
from dinrec.datasets.errors import DatasetError

BEHAVIOURS = {"pv": "view", "buy": "buy", "cart": "cart", "fav": "fav"}


def load_taobao(path: Path) -> Interactions:
    rows = []
    with path.open(newline="") as fh:
        for lineno, rec in enumerate(csv.reader(fh), 1):
            if not rec:
                continue
            if len(rec) != 5 or rec[3] not in BEHAVIOURS:
                raise DatasetError(f"{path}:{lineno}: expected user,item,category,pv|buy|cart|fav,ts; got {rec}")
            rows.append(rec)
    if not rows:
        raise DatasetError(f"{path}: no rows")
    arr = np.array(rows, dtype=object)
    types = np.array([BEHAVIOURS[b] for b in arr[:, 3].tolist()], dtype=object)
    return Interactions.from_columns(arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 4].astype(np.float64),
                                     event_type=types, source="taobao")
