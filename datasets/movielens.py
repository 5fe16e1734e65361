"""MovieLens in its three published layouts; a rating >= 4 is a behaviour, the first genre is
the category.

* 100k: ``u.data`` (TAB: user item rating ts) + ``u.item`` (``|``: id|title|...|19 genre flags)
  + ``u.genre`` (name|index), latin-1.
* 1M / 10M: ``ratings.dat`` (``UserID::MovieID::Rating::Timestamp``) + ``movies.dat``
  (``MovieID::Title::Genre1|Genre2``).
* ml-latest(-small) / 20M / 25M / 32M: ``ratings.csv`` (userId,movieId,rating,timestamp) +
  ``movies.csv`` (movieId,title,genres), with a header and quoted titles.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from dinrec.datasets.base import Interactions
from dinrec.datasets.errors import DatasetError

UNKNOWN_GENRE = "(no genres listed)"


def _ratings_to_interactions(rows: np.ndarray, genre_of: dict[str, str], source: str) -> Interactions:
    # rows: (N, 4) str columns user, item, rating, ts
    try:
        rating = rows[:, 2].astype(np.float64)
        ts = rows[:, 3].astype(np.float64)
    except ValueError as exc:
        raise DatasetError(f"{source}: rating/timestamp column is not numeric: {exc}") from exc
    items = rows[:, 1]
    cats = np.array([genre_of.get(i, UNKNOWN_GENRE) for i in items.tolist()], dtype=object)
    return Interactions.from_columns(rows[:, 0], items, cats, ts, event_type="rate", value=rating,
                                     source=source)


def _split_lines(path: Path, sep: str, ncols: int, encoding: str) -> np.ndarray:
    rows = []
    with path.open(encoding=encoding) as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.rstrip("\r\n")
            if not line:
                continue
            parts = line.split(sep)
            if len(parts) != ncols:
                raise DatasetError(f"{path}:{lineno}: expected {ncols} fields separated by {sep!r}, "
                                   f"got {len(parts)}")
            rows.append(parts)
    if not rows:
        raise DatasetError(f"{path}: no rows")
    return np.array(rows, dtype=object)


def load_100k(folder: Path) -> Interactions:
    genres = {}
    genre_file = folder / "u.genre"
    if genre_file.exists():
        for line in genre_file.read_text(encoding="latin-1").splitlines():
            if "|" in line:
                name, idx = line.rsplit("|", 1)
                genres[int(idx)] = name
    genre_of: dict[str, str] = {}
    item_file = folder / "u.item"
    if item_file.exists():
        for line in item_file.read_text(encoding="latin-1").splitlines():
            parts = line.split("|")
            if len(parts) < 6:
                continue
            flags = parts[5:]
            first = next((i for i, f in enumerate(flags) if f == "1"), None)
            genre_of[parts[0]] = genres.get(first, str(first)) if first is not None else UNKNOWN_GENRE
    rows = _split_lines(folder / "u.data", "\t", 4, "latin-1")
    return _ratings_to_interactions(rows, genre_of, "movielens-100k")


def _first_genres(movies: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Each movie's first genre, from (movie id, "Genre|Genre|…") pairs (1M, 10M, 20M+ list several)."""
    return {movie: genres.split("|")[0] or UNKNOWN_GENRE for movie, genres in movies}


def load_dat(folder: Path) -> Interactions:
    """1M and 10M: '::'-separated. 1M is latin-1; 10M is UTF-8 (latin-1 reads both safely)."""
    movies = folder / "movies.dat"
    lines = movies.read_text(encoding="latin-1").splitlines() if movies.exists() else []
    genre_of = _first_genres((p[0], p[2]) for p in (line.split("::") for line in lines) if len(p) == 3)
    rows = _split_lines(folder / "ratings.dat", "::", 4, "latin-1")
    return _ratings_to_interactions(rows, genre_of, "movielens-dat")


def load_csv(folder: Path) -> Interactions:
    genre_of: dict[str, str] = {}
    movies = folder / "movies.csv"
    if movies.exists():
        with movies.open(encoding="utf-8", newline="") as fh:
            genre_of = _first_genres((rec["movieId"], rec.get("genres") or "") for rec in csv.DictReader(fh))
    with (folder / "ratings.csv").open(encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None or [h.strip() for h in header[:4]] != ["userId", "movieId", "rating", "timestamp"]:
            raise DatasetError(f"{folder / 'ratings.csv'}: expected header userId,movieId,rating,timestamp, "
                               f"got {header}")
        rows = np.array([r[:4] for r in reader if r], dtype=object)
    if rows.size == 0:
        raise DatasetError(f"{folder / 'ratings.csv'}: no rows")
    return _ratings_to_interactions(rows, genre_of, "movielens-csv")
