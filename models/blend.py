"""The ranking stage's final score: DIN's logit blended with what the recall lanes know — pure.

DIN alone ranks the recall candidates worse than the recall towers' own order and than item-CF
(``dinrec bench e2e``): trained on sampled negatives it learns popularity, and it has no notion of
recency. The candidates it ranks come with more signals, and the served score is a linear blend of
them all, its weights fitted on the validation split as serving uses them (training.blend_fit: a
softmax over each validation user's candidate set, the held-out item the one to find)::

    score(c) = w_din · DIN(h, c) + w_towers · cos(u(h), v(c)) / T
               + w_covisit · cf(h, c) / max_c' cf(h, c') + w_last · cf(h_newest, c) / max_c' cf(h_newest, c')
               + w_category · share of the last RECENT behaviours in c's category + w_pop · log(1 + count(c))

``cf`` is the co-visitation lane's score (retrieval.covisit) over the recent history, ``cf(h_newest, ·)``
the same from the newest behaviour alone (what the user is doing now, which the decayed sum blurs),
each normalised per request so its scale does not depend on how many behaviours the user has;
``count`` the item's training behaviours (0 for items the model never saw).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from dinrec.retrieval.covisit import CoVisitation

FEATURES = ("din", "towers", "covisit", "covisit_newest", "recent_category", "popularity")
RECENT = 10  # behaviours the recent-category share reads


@dataclass(frozen=True)
class Blend:
    weights: tuple[float, ...]  # one per FEATURES
    temperature: float = 0.07  # the towers' softmax temperature: cosines as the logits they trained as

    def __post_init__(self) -> None:
        if len(self.weights) != len(FEATURES) or not all(np.isfinite(self.weights)):
            raise ValueError(f"a blend needs {len(FEATURES)} finite weights ({FEATURES}), got {self.weights}")

    def to_json(self) -> dict:
        return {"features": list(FEATURES), "weights": list(self.weights), "temperature": self.temperature}

    @classmethod
    def from_json(cls, d: dict) -> Blend:
        if list(d.get("features", [])) != list(FEATURES):
            raise ValueError(f"blend features {d.get('features')} are not {list(FEATURES)}")
        return cls(tuple(float(w) for w in d["weights"]), float(d.get("temperature", 0.07)))

    def combine(self, x: np.ndarray) -> np.ndarray:
        """(N, F) features (see :func:`features`) → (N,) blended logits."""
        return x @ np.asarray(self.weights, dtype=np.float32)


def _by_peak(x: np.ndarray) -> np.ndarray:
    peak = float(x.max()) if len(x) else 0.0
    return x / peak if peak > 0 else np.zeros_like(x)


def category_share(history_categories: list[int], candidate_categories: np.ndarray) -> np.ndarray:
    """(N,) the share of the ``RECENT`` newest behaviours (category indices, oldest first, 0 = padding)
    in each candidate's category."""
    recent = np.asarray([c for c in history_categories if c][-RECENT:], dtype=np.int64)
    if len(recent) == 0:
        return np.zeros(len(candidate_categories), dtype=np.float32)
    per_category = np.bincount(recent, minlength=int(max(recent.max(), candidate_categories.max(initial=0))) + 1)
    return (per_category[candidate_categories] / len(recent)).astype(np.float32)


def features(din_logits: np.ndarray, cosines: np.ndarray, covisit: np.ndarray, covisit_newest: np.ndarray,
             recent_category: np.ndarray, counts: np.ndarray, temperature: float) -> np.ndarray:
    """Per candidate (each (N,)): DIN logit, towers cosine / T, co-visitation score over the recent
    history and from the newest behaviour (each / its max over the candidates), the recent-category
    share (:func:`category_share`), log(1 + training count) → (N, 6) float32, in FEATURES order."""
    return np.stack([din_logits, cosines / temperature, _by_peak(covisit), _by_peak(covisit_newest),
                     recent_category, np.log1p(counts)], axis=1).astype(np.float32)


def candidate_signals(din_logits: np.ndarray, cosines: np.ndarray, covisit: CoVisitation | None,
                      history_items: list[int], history_categories: list[int], candidates: np.ndarray,
                      candidate_categories: np.ndarray, counts: np.ndarray, temperature: float,
                      pairs: np.ndarray | None = None) -> np.ndarray:
    """One request's (N, F) features from what the ranking stage has at hand — DIN's logits and the
    towers' cosines (N,), the co-visitation lane (None: its signals are 0), the history (item and
    category indices, oldest first, 0 = padding), the (N,) candidates with their categories and
    training counts, and ``pairs``: the lane's (N, L') similarities of each candidate to the history's
    known behaviours where DIN read them (its context), so the lane's scores are read off them — the one
    place serving and the blend's fit both build them."""
    known = [i for i in history_items if i]
    none = np.zeros(len(candidates), dtype=np.float32)
    if covisit is None:
        cf = cf_newest = none
    elif pairs is not None:
        cf, cf_newest = covisit.scores_from_pairs(pairs)
    else:
        cf, cf_newest = covisit.score(known, candidates), covisit.score(known[-1:], candidates)
    return features(din_logits, cosines, cf, cf_newest, category_share(history_categories, candidate_categories),
                    counts, temperature)
