"""Recall baselines and the measure they are compared by.

* :class:`Popularity` — the most popular items the user has not seen.
* :class:`ItemCF` — item-to-item co-visitation, the collaborative filtering recall DIN replaced in
  our origin story, built fairly: co-occurrences within a window of each training sequence
  (weighted by closeness), cosine-normalised with a popularity damping, and a user's score for an
  item is the recency-weighted sum of its similarity to the user's last behaviours.
* :func:`hit_rate` — HR@N: the share of held-out positives found among the N recalled items.

Item ids are integer indices (0 = padding, never recalled); histories are lists of them, oldest first.
Pure numpy/scipy: the benchmark runs these beside the FAISS stage on the same split.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import sparse

from dinrec.events.long_tail import long_tail_mask
from dinrec.retrieval.hits import hit_at, ranks

Recall = Callable[[Sequence[int], int], np.ndarray]  # (history, n) -> up to n item ids, best first


def _top_unseen(scores: np.ndarray, n: int, seen: Sequence[int]) -> np.ndarray:
    """The ``n`` best-scoring ids with positive score, not in ``seen`` (scores is modified)."""
    scores[0] = -np.inf
    scores[np.asarray(seen, dtype=np.int64)] = -np.inf
    n = min(n, len(scores) - 1)
    top = np.argpartition(-scores, n - 1)[:n] if n < len(scores) else np.arange(len(scores))
    top = top[np.argsort(-scores[top], kind="stable")]
    return top[np.isfinite(scores[top]) & (scores[top] > 0)]


class Popularity:
    def __init__(self, counts: np.ndarray) -> None:
        self.counts = np.asarray(counts, dtype=np.float64)  # (n_items,) by item index

    def recall(self, history: Sequence[int], n: int) -> np.ndarray:
        return _top_unseen(self.counts.copy(), n, history)


@dataclass(frozen=True)
class ItemCFConfig:
    window: int = 10          # positions either side that count as co-visited
    damping: float = 0.5      # sim = cooc / (n_i · n_j)^damping (0.5: cosine)
    last: int = 20            # the user's behaviours a query uses
    decay: float = 0.9        # weight of the r-th newest of them: decay^r


class ItemCF:
    def __init__(self, sim: sparse.csr_matrix, cfg: ItemCFConfig) -> None:
        self.sim, self.cfg = sim, cfg

    @classmethod
    def fit(cls, sequences: Sequence[np.ndarray], n_items: int, cfg: ItemCFConfig = ItemCFConfig()) -> ItemCF:
        """``sequences``: each user's training behaviours, oldest first (held-out targets removed)."""
        rows, cols, vals = [], [], []
        for seq in sequences:
            seq = np.asarray(seq, dtype=np.int64)
            for d in range(1, cfg.window + 1):  # pairs d apart, both directions, closer counts more
                if len(seq) <= d:
                    break
                a, b = seq[:-d], seq[d:]
                w = np.full(len(a), 1.0 / d)
                rows += [a, b]
                cols += [b, a]
                vals += [w, w]
        if not rows:
            return cls(sparse.csr_matrix((n_items, n_items)), cfg)
        cooc = sparse.coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                                 shape=(n_items, n_items)).tocsr()  # duplicates are summed
        cooc.setdiag(0)
        cooc.eliminate_zeros()
        counts = np.bincount(np.concatenate([np.asarray(s, dtype=np.int64) for s in sequences]), minlength=n_items)
        norm = np.power(np.maximum(counts, 1).astype(np.float64), -cfg.damping)
        sim = sparse.diags(norm) @ cooc @ sparse.diags(norm)
        return cls(sim.tocsr(), cfg)

    def recall(self, history: Sequence[int], n: int) -> np.ndarray:
        return self.recall_many([history], n)[0]

    def recall_many(self, histories: Sequence[Sequence[int]], n: int, chunk: int = 1024) -> list[np.ndarray]:
        """:meth:`recall` of each history, scored ``chunk`` at a time by one sparse product (the same
        sums as one at a time: each row adds its behaviours' rows in the same order)."""
        out: list[np.ndarray] = []
        for lo in range(0, len(histories), chunk):
            part = histories[lo:lo + chunk]
            recent = [np.asarray(h[-self.cfg.last:], dtype=np.int64)[::-1] for h in part]  # newest first
            rows = np.repeat(np.arange(len(part)), [len(r) for r in recent])
            weights = np.concatenate([self.cfg.decay ** np.arange(len(r)) for r in recent])
            query = sparse.csr_matrix((weights, (rows, np.concatenate(recent))),
                                      shape=(len(part), self.sim.shape[0]))  # (C, I), duplicates summed
            scores = (query @ self.sim).toarray()  # (C, I)
            out += [_top_unseen(scores[r], n, h) for r, h in enumerate(part)]
        return out


def tune_item_cf(sequences: Sequence[np.ndarray], n_items: int, cases: Sequence[tuple[Sequence[int], int]],
                 windows: Sequence[int] = (2, 5, 10, 20), decays: Sequence[float] = (0.7, 0.9, 1.0), k: int = 10,
                 last: int = 20) -> tuple[ItemCF, dict[str, float]]:
    """The ItemCF whose window and decay find the most of ``cases`` (history, held-out item) in the
    top ``k``, and the HR@k of each tried (``w{window}_d{decay}``, rounded; the choice is made unrounded)."""
    tried: dict[str, float] = {}
    best: tuple[float, ItemCF] | None = None
    for window in windows:
        fitted = ItemCF.fit(sequences, n_items, ItemCFConfig(window=window, last=last))
        for decay in decays:
            cf = ItemCF(fitted.sim, ItemCFConfig(window=window, decay=decay, last=last))
            found = cf.recall_many([h for h, _ in cases], k)  # one sparse product per chunk of cases
            hr = sum(bool(np.any(got == t)) for got, (_, t) in zip(found, cases, strict=True)) / max(len(cases), 1)
            tried[f"w{window}_d{decay}"] = round(hr, 4)
            if best is None or hr > best[0]:
                best = (hr, cf)
    assert best is not None, "give at least one window and one decay"
    return best[1], tried


def hit_rate(recall: Recall, cases: Sequence[tuple[Sequence[int], int]], ns: Sequence[int],
             ndigits: int | None = 4) -> dict[str, float]:
    """HR@N for each N: ``cases`` are (history, held-out item); the history is excluded from recall.
    Rounded to ``ndigits`` (None: not rounded, to compare close configurations)."""
    top = max(ns)
    rank = ranks((recall(history, top) for history, _ in cases), (target for _, target in cases))
    rates = {f"hr@{n}": float(hit_at(rank, n).sum()) / max(len(cases), 1) for n in ns}
    return rates if ndigits is None else {name: round(v, ndigits) for name, v in rates.items()}


def long_tail_share(recommended: Sequence[Sequence[int]], counts: np.ndarray) -> float:
    """The share of recommended items in the long tail (events.long_tail) by ``counts``."""
    tail = long_tail_mask(counts)
    flat = [i for rec in recommended for i in rec]
    return round(sum(bool(tail[i]) for i in flat) / max(len(flat), 1), 4)
