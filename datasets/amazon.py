"""Amazon reviews: McAuley's JSON lines, and the amazon-hin (HIN-Datasets) layout.

A review is a purchase, so every review is a behaviour (``buy``; the rating is kept as
``value``), as in the DIN paper's Amazon experiments.

* McAuley JSON lines (2014 and 2018 releases): reviews ``*.json`` / ``*.json.gz`` with
  ``reviewerID, asin, overall, unixReviewTime``; optional ``meta_*.json(.gz)`` with ``asin`` and
  ``categories`` (2014: list of paths) or ``category`` (2018: one path). The 2014 meta files are
  Python literals, not JSON, so both are accepted. Category: the most specific (last) entry of
  the first path.
* amazon-hin: ``user_item.dat`` (TAB: user item rating ts), ``item_brand.dat`` and
  ``item_category.dat`` (``item,id``). Its categories are nearly constant (one id on 99% of
  items), so the *brand* is used as the category feature by default (``side="category"`` picks
  each item's rarest category instead).
"""

from __future__ import annotations

import ast
import gzip
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from dinrec.datasets.base import Interactions
from dinrec.datasets.errors import DatasetError


def _open_text(path: Path):
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open(encoding="utf-8")


def _records(path: Path) -> Iterator[dict]:
    with _open_text(path) as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                try:
                    yield ast.literal_eval(line)
                except (ValueError, SyntaxError) as exc:
                    raise DatasetError(f"{path}:{lineno}: neither JSON nor a Python literal") from exc


def _category_of_meta(rec: dict) -> str | None:
    cats = rec.get("categories")
    if cats and isinstance(cats, list) and cats[0]:
        path = cats[0] if isinstance(cats[0], list) else cats
        return str(path[-1])
    cat = rec.get("category")
    if cat and isinstance(cat, list):
        return str(cat[-1])
    return None


def review_files(folder: Path) -> tuple[list[Path], list[Path]]:
    files = sorted(p for p in folder.iterdir() if p.name.endswith((".json", ".json.gz", ".jsonl", ".jsonl.gz")))
    meta = [p for p in files if p.name.startswith("meta")]
    return [p for p in files if p not in meta], meta


def load_mcauley(folder: Path) -> Interactions:
    reviews, metas = review_files(folder)
    cat_of: dict[str, str] = {}
    for m in metas:
        for rec in _records(m):
            c = _category_of_meta(rec)
            if "asin" in rec and c:
                cat_of[str(rec["asin"])] = c
    users, items, ts, rating = [], [], [], []
    for path in reviews:
        for rec in _records(path):
            try:
                users.append(str(rec["reviewerID"]))
                items.append(str(rec["asin"]))
                ts.append(float(rec["unixReviewTime"]))
                rating.append(float(rec.get("overall", np.nan)))
            except (KeyError, TypeError, ValueError) as exc:
                raise DatasetError(f"{path}: a review lacks reviewerID/asin/unixReviewTime: {rec}") from exc
    if not users:
        raise DatasetError(f"{folder}: no reviews found")
    cats = [cat_of.get(i, "unknown") for i in items]
    return Interactions.from_columns(users, items, cats, ts, event_type="buy", value=rating,
                                     source="amazon-reviews")


def load_hin(folder: Path, side: str = "brand") -> Interactions:
    if side not in ("brand", "category"):
        raise DatasetError(f"side must be 'brand' or 'category', got {side!r}")
    pairs: list[tuple[str, str]] = []
    side_file = folder / ("item_brand.dat" if side == "brand" else "item_category.dat")
    if side_file.exists():
        for line in side_file.read_text().splitlines():
            if "," in line:
                item, sid = line.split(",", 1)
                pairs.append((item.strip(), sid.strip()))
    if side == "brand":
        cat_of = dict(pairs)
    else:  # the rarest of an item's categories is its most specific one
        freq = Counter(c for _, c in pairs)
        cat_of = {}
        for item, c in pairs:
            if item not in cat_of or freq[c] < freq[cat_of[item]]:
                cat_of[item] = c
    rows = []
    with (folder / "user_item.dat").open() as fh:
        for lineno, line in enumerate(fh, 1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 4:
                raise DatasetError(f"{folder / 'user_item.dat'}:{lineno}: expected 4 TAB-separated fields")
            rows.append(parts)
    arr = np.array(rows, dtype=object)
    cats = [f"{side}:{cat_of.get(i, 'unknown')}" for i in arr[:, 1].tolist()]
    return Interactions.from_columns(arr[:, 0], arr[:, 1], cats, arr[:, 3].astype(np.float64),
                                     event_type="buy", value=arr[:, 2].astype(np.float64),
                                     source="amazon-hin")
