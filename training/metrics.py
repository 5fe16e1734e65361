"""AUC, GAUC (per-user AUC weighted by impressions, as the DIN paper reports) and logloss."""

from __future__ import annotations

import numpy as np


def _rank_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Mann-Whitney AUC with average ranks for ties; NaN when one class is absent."""
    pos = labels > 0.5
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    ranks = np.empty(len(s), dtype=np.float64)
    # average rank within runs of equal scores
    boundaries = np.flatnonzero(np.r_[True, s[1:] != s[:-1], True])
    for a, b in zip(boundaries[:-1], boundaries[1:], strict=True):
        ranks[a:b] = (a + b + 1) / 2.0  # mean of 1-based ranks a+1..b
    r = np.empty_like(ranks)
    r[order] = ranks
    return float((r[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    return _rank_auc(np.asarray(labels), np.asarray(scores, dtype=np.float64))


def user_aucs(users: np.ndarray, labels: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(AUC_u, n_u) per user, in sorted user order; AUC_u is NaN when a user's samples hold one class."""
    users, labels, scores = np.asarray(users), np.asarray(labels), np.asarray(scores, dtype=np.float64)
    order = np.argsort(users, kind="stable")
    users, labels, scores = users[order], labels[order], scores[order]
    cuts = np.flatnonzero(np.r_[True, users[1:] != users[:-1], True])
    aucs = np.array([_rank_auc(labels[a:b], scores[a:b]) for a, b in zip(cuts[:-1], cuts[1:], strict=True)])
    return aucs, np.diff(cuts)


def gauc(users: np.ndarray, labels: np.ndarray, scores: np.ndarray) -> float:
    """Σ_u n_u·AUC_u / Σ_u n_u over users whose samples hold both classes."""
    aucs, n = user_aucs(users, labels, scores)
    ok = ~np.isnan(aucs)
    return float((n[ok] * aucs[ok]).sum() / n[ok].sum()) if ok.any() else float("nan")


def paired_difference(a: np.ndarray, b: np.ndarray, weights: np.ndarray | None = None) -> tuple[float, float]:
    """(mean of a − b, its standard error) over units both were measured on (a weighted mean when
    ``weights``): two models on the same holdout, so the difference is paired, unit by unit."""
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    w = np.ones(len(d)) if weights is None else np.asarray(weights, dtype=np.float64)
    ok = ~np.isnan(d)
    d, w = d[ok], w[ok]
    if len(d) < 2:
        return float("nan"), float("nan")
    mean = float((w * d).sum() / w.sum())
    # Linearised SE of a ratio of sums (the unweighted case gives std/√n, up to n/(n−1)).
    se = float(np.sqrt((w ** 2 * (d - mean) ** 2).sum() * len(d) / (len(d) - 1)) / w.sum())
    return mean, se


def row_logloss(labels: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """(N,) binary cross-entropy of each row, from logits (numerically stable)."""
    y, z = np.asarray(labels, dtype=np.float64), np.asarray(logits, dtype=np.float64)
    return np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z)))


def logloss(labels: np.ndarray, logits: np.ndarray) -> float:
    """Mean binary cross-entropy from logits."""
    return float(np.mean(row_logloss(labels, logits)))
