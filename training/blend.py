"""The ranking stage's final score: DIN's logit blended with what the recall lanes know — pure.

DIN alone ranks the recall candidates worse than the recall towers' own order and than item-CF
(``dinrec bench e2e``): trained on sampled negatives it learns popularity, and it has no notion of
recency. The candidates it ranks come with three more signals, and the served score is a linear
blend of all four, its weights fitted on the validation split as serving uses them (training.blend_fit:
a softmax over each validation user's candidate set, the held-out item the one to find)::

    score(c) = w_din · DIN(h, c) + w_towers · cos(u(h), v(c)) / T + w_covisit · cf(h, c) / max_c' cf(h, c')
               + w_pop · log(1 + count(c))

``cf`` is the co-visitation lane's score (retrieval.covisit), normalised per request so its scale does
not depend on how many behaviours the user has; ``count`` the item's training behaviours (0 for items
the model never saw).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FEATURES = ("din", "towers", "covisit", "popularity")


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


def features(din_logits: np.ndarray, cosines: np.ndarray, covisit: np.ndarray, counts: np.ndarray,
             temperature: float) -> np.ndarray:
    """Per candidate: DIN logit, towers cosine / T, co-visitation score / its max over the candidates,
    log(1 + training count) → (N, 4) float32."""
    peak = float(covisit.max()) if len(covisit) else 0.0
    cf = covisit / peak if peak > 0 else np.zeros_like(covisit)
    return np.stack([din_logits, cosines / temperature, cf, np.log1p(counts)], axis=1).astype(np.float32)
