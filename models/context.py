"""What DIN reads besides ids (models.din.ListContext), defined once for training and serving — pure.

* **time gaps**: each behaviour's gap to the user's newest one, in log buckets (serving passes the
  store's ``ts``; the gap to the newest, not to the request, so a replayed or late request reads the same);
* **pair similarities**: co-visitation's sim(h_l, c) for every (candidate, behaviour), from the lane's
  neighbour table (retrieval.covisit.PairTable);
* **candidate features**: log(1 + the candidate's training count) and the share of the recent
  behaviours in its category.

Training computes them with guards, so a sample never sees its own behaviour (training.lists: each
user's similarities from a lane fitted without them, counts less their own); serving from the bundle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from dinrec.models.din import ListContext

GAP_BUCKETS = 24  # 1: the same second as the newest; 2…: log₂ of 1 + the gap in minutes (2²² min ≈ 8 years)
CANDIDATE_FEATURES = ("log_count", "recent_category")
RECENT = 10  # behaviours the recent-category share reads (models.blend's)


def gap_buckets(ts: torch.Tensor, filled: torch.Tensor) -> torch.Tensor:
    """(B, L) behaviour times (seconds, left-padded, newest at [:, -1]) and which slots hold one →
    (B, L) int64 buckets in [1, GAP_BUCKETS], 0 for padding."""
    gap = (ts[:, -1:] - ts).clamp_min(0).double()  # (B, L) seconds before the newest
    bucket = 2 + torch.floor(torch.log2(1 + gap / 60)).clamp_max(GAP_BUCKETS - 2)
    bucket = torch.where(gap < 1, torch.ones_like(bucket), bucket).long()
    return bucket * filled


def candidate_features(counts: torch.Tensor, cand_cats: torch.Tensor, hist_cats: torch.Tensor) -> torch.Tensor:
    """(B, N) candidate training counts, (B, N) their categories, (B, L) the history's (left-padded) →
    (B, N, 2): log(1 + count) and the share of the RECENT newest behaviours in the candidate's category."""
    recent = hist_cats[:, -RECENT:]  # (B, R)
    n = (recent != 0).sum(dim=1, keepdim=True).clamp_min(1)  # (B, 1)
    same = (cand_cats.unsqueeze(2) == recent.unsqueeze(1)) & (recent != 0).unsqueeze(1)  # (B, N, R)
    share = same.sum(dim=2).float() / n  # (B, N)
    return torch.stack([torch.log1p(counts.float()), share], dim=-1)


def known_last(hist_items: torch.Tensor, *others: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Rows re-packed so their known behaviours (item ≠ 0) are the newest slots, in their order, and the
    unknown ones (items the model never saw, as padding) before them: the left-padded list DIN's
    positions and gaps count in, whatever unknown items a history holds (serving drops them too)."""
    order = torch.argsort((hist_items != 0).int(), dim=1, stable=True)  # unknowns first, order kept
    return tuple(t.gather(1, order) for t in (hist_items, *others))


def served_context(cfg, pairs, counts: torch.Tensor, hist_items: torch.Tensor, hist_cats: torch.Tensor,
                   ts: torch.Tensor, cand: torch.Tensor, cand_cats: torch.Tensor):
    """The ListContext a DIN with context (``cfg``: models.din.DINConfig) reads at serving time, for
    (B, L) histories (known behaviours last: :func:`known_last`) with their times and (B, N) candidates
    with their categories: co-visitation from ``pairs`` (retrieval.covisit.PairTable of the served lane),
    training ``counts`` (I,) (a candidate past them — a cold item — counts 0)."""
    from dinrec.models.din import ListContext

    gaps = gap_buckets(ts, hist_items != 0) if cfg.time_buckets else None
    pair = pairs.lookup(hist_items, cand).unsqueeze(-1) if cfg.pair_inputs else None  # (B, N, L, 1)
    features = None
    if cfg.candidate_inputs:
        inside = cand < len(counts)
        count = torch.where(inside, counts[cand.clamp_max(len(counts) - 1)], 0.0)
        features = candidate_features(count, cand_cats, hist_cats)
    return ListContext(gaps, pair, features)


def probe_context(cfg, candidates: int, length: int, generator: torch.Generator) -> ListContext | None:
    """A made-up context of the served shape for one request of ``candidates`` against ``length`` known
    behaviours, for a DIN with context (``cfg``: models.din.DINConfig; None without): gaps growing towards
    the oldest, about one pair in twenty co-visited, counts and category shares in their ranges. What the
    scorer's implementations are timed and compared on (models.scorer.choose_scorer, ``dinrec bench score``)."""
    from dinrec.models.din import ListContext

    if not cfg.has_context:
        return None
    gaps = None
    if cfg.time_buckets:  # behaviours up to ~10 weeks apart, newest last
        ts = torch.rand(1, length, generator=generator, dtype=torch.float64).mul(6e6).sort(dim=1).values
        gaps = gap_buckets(ts, torch.ones(1, length, dtype=torch.bool))  # (1, L)
    pairs = None
    if cfg.pair_inputs:
        shape = (1, candidates, length, cfg.pair_inputs)
        pairs = torch.rand(shape, generator=generator) * (torch.rand(shape, generator=generator) < 0.05)
    features = None
    if cfg.candidate_inputs:
        features = torch.rand(1, candidates, cfg.candidate_inputs, generator=generator)
        features[..., 0] *= 8  # log(1 + count)
    return ListContext(gaps, pairs, features)
