"""Recognise a dataset folder's layout and load it.

``dinrec train --data DIR`` accepts any of these; the layout is decided by which files exist.
"""

from __future__ import annotations

from pathlib import Path

from dinrec.datasets import amazon, diginetica, movielens, taobao
from dinrec.datasets.base import Interactions
from dinrec.datasets.errors import DatasetError
from dinrec.events.schema import loads_many

EVENTS_FILE = "events.jsonl"  # dinrec's own event log (synthetic data, logged events)


def _taobao_csv(folder: Path) -> Path | None:
    for p in sorted(folder.glob("*.csv")):
        with p.open() as fh:
            first = fh.readline().strip().split(",")
        if len(first) == 5 and first[3] in taobao.BEHAVIOURS:
            return p
    return None


def _item_views_csv(folder: Path) -> Path | None:
    return next((p for p in sorted(folder.glob("*.csv")) if diginetica.is_item_views(p)), None)


def detect_layout(path: str | Path) -> str:
    folder = Path(path)
    if folder.is_file():
        folder = folder.parent
    if not folder.is_dir():
        raise DatasetError(f"{path}: no such dataset folder")
    has = lambda name: (folder / name).exists()  # noqa: E731
    if has(EVENTS_FILE):
        return "events"
    if has("u.data"):
        return "movielens-100k"
    if has("ratings.dat"):
        return "movielens-dat"
    if has("ratings.csv"):
        return "movielens-csv"
    if has("user_item.dat"):
        return "amazon-hin"
    if amazon.review_files(folder)[0]:
        return "amazon-reviews"
    if _taobao_csv(folder):
        return "taobao"
    if _item_views_csv(folder):
        return "diginetica"
    raise DatasetError(
        f"{folder}: layout not recognised; expected one of events.jsonl, u.data (MovieLens 100k), "
        "ratings.dat (MovieLens 1M/10M), ratings.csv (ml-latest), user_item.dat (amazon-hin), "
        "Amazon review JSON lines, a Taobao UserBehavior CSV, or DIGINETICA item views (CSV)"
    )


def load_dataset(path: str | Path, *, side: str = "brand") -> Interactions:
    """Load every event of a dataset folder (all event types; see Interactions.behaviours)."""
    folder = Path(path)
    layout = detect_layout(folder)
    folder = folder if folder.is_dir() else folder.parent
    if layout == "events":
        return Interactions.from_events(loads_many((folder / EVENTS_FILE).read_text()), source="events")
    if layout == "movielens-100k":
        return movielens.load_100k(folder)
    if layout == "movielens-dat":
        return movielens.load_dat(folder)
    if layout == "movielens-csv":
        return movielens.load_csv(folder)
    if layout == "amazon-hin":
        return amazon.load_hin(folder, side=side)
    if layout == "amazon-reviews":
        return amazon.load_mcauley(folder)
    if layout == "diginetica":
        found = _item_views_csv(folder)
        assert found is not None
        return diginetica.load_item_views(found)
    found = _taobao_csv(folder)
    assert found is not None
    return taobao.load_taobao(found)
