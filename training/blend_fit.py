"""Fit the ranking stage's blend (models.blend) on the validation split, as serving uses it.

For each validation user (the history before their held-out behaviour), the candidates are what
serving recalls — the towers' best ``candidates`` and the co-visitation lane's best
``covisit_candidates``, everything in the history excluded — and each gets its signals
(models.blend.FEATURES). The weights minimise the softmax cross-entropy of the held-out item among
its user's candidates (users whose item recall missed cannot teach the order and are left out), with
a little L2: a handful of weights fitted on held-out behaviours of models trained without them, so
nothing the models memorised leaks into the blend. The validation HR@10 of each signal alone and of
the blend are reported, and whichever is best is served (``chosen``): the fitted blend, unless one
signal alone beats it.
"""

from __future__ import annotations

import numpy as np
import torch

from models.blend import FEATURES, Blend, candidate_signals
from models.din import DIN
from models.recall import RecallSpace
from models.scorer import Scorer
from models.towers import Towers
from retrieval.covisit import CoVisitation
from retrieval.index import FaissIndex
from training.data import split_histories
from training.samples import SampleSet


def candidate_features(scorer: Scorer, space: RecallSpace, index: FaissIndex, covisit: CoVisitation | None,
                       counts: np.ndarray, items: list[int], cats: list[int], n: int, n_covisit: int,
                       temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """One history's candidates (item indices: the towers' ``n`` best, then the co-visitation lane's
    ``n_covisit`` best that are new) and their (N, F) features; history items never."""
    known = [i for i in items if i]
    query = space.query(items, cats)  # (1, D)
    ids, _ = index.search(query, n, exclude=[set(known)])
    cand = ids[0][ids[0] >= 0]
    if covisit is not None and n_covisit:
        extra, _ = covisit.recall(known, n_covisit, excluded=set(known) | set(cand.tolist()))
        cand = np.concatenate([cand, extra])
    if len(cand) == 0:
        return cand, np.zeros((0, len(FEATURES)), dtype=np.float32)
    din = scorer.score(torch.as_tensor(items), torch.as_tensor(cats), torch.as_tensor(cand)).logits.numpy()
    cos = space.item_vectors[cand] @ query[0]  # (N,)
    return cand, candidate_signals(din, cos, covisit, items, cats, cand,
                                   scorer.item_category[torch.as_tensor(cand)].numpy(), counts[cand], temperature)


def _hr_at(xs: list[np.ndarray], targets: list[int], scores: list[np.ndarray], k: int = 10) -> float:
    """Validation HR@k; a target tied with others gets the chance a random order of the ties gives it
    (a coarse signal such as the recent-category share ties many candidates, which must not count as hits)."""
    hits = []
    for s, t in zip(scores, targets, strict=True):
        if t < 0:
            hits.append(0.0)
            continue
        above, tied = int((s > s[t]).sum()), int((s == s[t]).sum())  # tied counts the target itself
        hits.append(min(max((k - above) / tied, 0.0), 1.0))
    return round(float(np.mean(hits)) if hits else 0.0, 4)


def _fit_weights(data: list[tuple[torch.Tensor, int]], l2: float, use: list[bool] | None = None) -> tuple[float, ...]:
    """Weights minimising the mean softmax cross-entropy of each target among its candidates (+ L2);
    features outside ``use`` keep weight 0."""
    mask = torch.tensor(use if use is not None else [True] * len(FEATURES), dtype=torch.float64)
    w = torch.zeros(len(FEATURES), dtype=torch.float64)
    w[0] = w[1] = 1.0  # start from DIN + towers: a reasonable order before the first step
    w.requires_grad_(True)
    opt = torch.optim.LBFGS([w], lr=0.5, max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        wm = w * mask
        loss = sum(-torch.log_softmax(x @ wm, 0)[t] for x, t in data) / max(len(data), 1) + l2 * (wm ** 2).sum()
        loss.backward()
        return loss

    if data:
        opt.step(closure)
    return tuple(float(v) for v in (w * mask).detach())


def fit_blend(model: DIN, towers: Towers, covisit: CoVisitation | None, samples: SampleSet, counts: np.ndarray,
              index: FaissIndex, *, candidates: int = 200, covisit_candidates: int = 100, max_users: int = 3000,
              l2: float = 1e-3, seed: int = 0) -> tuple[Blend, dict]:
    split = samples.val
    rows = np.flatnonzero(split.label == 1)
    if len(rows) > max_users:
        rows = np.sort(np.random.default_rng(seed).choice(rows, max_users, replace=False))
    item_category = torch.as_tensor(samples.vocab.item_category, dtype=torch.long)
    space = RecallSpace(model, towers, samples.vocab.item_category)
    scorer = Scorer(model.eval(), item_category, "fp32")
    temperature = towers.cfg.temperature
    hist, cats = split_histories(samples, split, rows)  # (B, L) each
    xs, targets = [], []
    for r, h, c in zip(rows, hist.tolist(), cats.tolist(), strict=True):
        cand, x = candidate_features(scorer, space, index, covisit, counts, h, c, candidates, covisit_candidates,
                                     temperature)
        where = np.flatnonzero(cand == split.target_item[r])
        xs.append(x)
        targets.append(int(where[0]) if len(where) else -1)
    found = [i for i, t in enumerate(targets) if t >= 0]
    data = [(torch.from_numpy(xs[i]).double(), targets[i]) for i in found]
    scores = {"blend": Blend(_fit_weights(data, l2), temperature),
              # The same fit without DIN: what the ranking model adds to the lanes' own signals.
              "blend_without_din": Blend(_fit_weights(data, l2, use=[name != "din" for name in FEATURES]), temperature),
              **{name: Blend(tuple(float(j == i) for j in range(len(FEATURES))), temperature)
                 for i, name in enumerate(FEATURES)}}
    val_hr = {name: _hr_at(xs, targets, [b.combine(x) for x in xs]) for name, b in scores.items()}
    # The cross-entropy fit is a proxy for HR@10 and fitted on recalled users only: where it orders the
    # top 10 worse than a signal alone (a log whose lane finds most of what recall does), serve the best.
    chosen = max(val_hr, key=lambda name: (val_hr[name], name == "blend"))
    blend = scores[chosen]
    info = {"val_users": len(rows), "recalled": round(len(found) / max(len(rows), 1), 4),
            "candidates": candidates, "covisit_candidates": covisit_candidates,
            "val_hr@10": {name: val_hr[name] for name in (*FEATURES, "blend_without_din", "blend")},
            "chosen": chosen, "weights": dict(zip(FEATURES, (round(v, 4) for v in blend.weights), strict=True))}
    return blend, info
