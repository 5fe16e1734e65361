"""Fit the ranking stage's blend (models.blend) on the validation split, as serving uses it.

For each validation user (everything they did before their held-out behaviour), the candidates and their
signals (models.blend.FEATURES) are what the ranking stage itself has before it blends
(models.ranking.Recommender.signals: every lane with the served configuration, the seen-item policy).
The weights minimise the softmax cross-entropy of the held-out item among its user's candidates (users
whose item recall missed cannot teach the order and are left out), with a little L2: a handful of
weights fitted on held-out behaviours of models trained without them, so nothing the models memorised
leaks into the blend. The validation HR@10 of each signal alone and of the blend are reported, and
whichever is best is served (``chosen``): the fitted blend, unless one signal alone beats it.
"""

from __future__ import annotations

import numpy as np
import torch

from dinrec.models.blend import FEATURES, Blend
from dinrec.models.ranking import Recommender
from dinrec.training.evaluation import served_history
from dinrec.training.samples import SampleSet

# The signals each ablation leaves out of the refitted blend.
ABLATIONS = {"din": ("din",), "covisit": ("covisit", "covisit_newest"), "towers": ("towers",)}


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
    features outside ``use`` keep weight 0. The users' candidate lists are padded into one (U, N, F) block,
    so each evaluation is a few tensor operations, not one graph node per user."""
    mask = torch.tensor(use if use is not None else [True] * len(FEATURES), dtype=torch.float64)
    w = torch.zeros(len(FEATURES), dtype=torch.float64)
    w[0] = w[1] = 1.0  # start from DIN + towers: a reasonable order before the first step
    if not data:
        return tuple(float(v) for v in w * mask)
    width = max(len(x) for x, _ in data)
    block = torch.zeros(len(data), width, len(FEATURES), dtype=torch.float64)  # (U, N, F)
    present = torch.zeros(len(data), width, dtype=torch.bool)
    for u, (x, _) in enumerate(data):
        block[u, :len(x)] = x
        present[u, :len(x)] = True
    targets = torch.tensor([t for _, t in data])
    w.requires_grad_(True)
    opt = torch.optim.LBFGS([w], lr=0.5, max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        wm = w * mask
        logits = (block @ wm).masked_fill(~present, -torch.inf)  # (U, N)
        loss = torch.nn.functional.cross_entropy(logits, targets) + l2 * (wm ** 2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return tuple(float(v) for v in (w * mask).detach())


def fit_blend(rec: Recommender, samples: SampleSet, *, max_users: int = 3000, l2: float = 1e-3,
              seed: int = 0) -> tuple[Blend, dict]:
    """``rec``: the ranking stage over the bundle being exported (its samples' vocabulary)."""
    split = samples.val
    rows = np.flatnonzero(split.label == 1)
    if len(rows) > max_users:
        rows = np.sort(np.random.default_rng(seed).choice(rows, max_users, replace=False))
    temperature = rec.bundle.towers.cfg.temperature if rec.bundle.towers is not None else 1.0
    xs, targets = [], []
    for r in rows.tolist():
        history, taken = served_history(samples, split, r, rec.seq_len)
        cand, x = rec.signals(history, rec.seen_items(history, taken))
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
    # The blend refitted without each other signal as well: what each adds (dinrec bench e2e serves them).
    ablations = {f"without_{group}": _fit_weights(data, l2, use=[name not in names for name in FEATURES])
                 for group, names in ABLATIONS.items()}
    val_hr = {name: _hr_at(xs, targets, [b.combine(x) for x in xs]) for name, b in scores.items()}
    # The cross-entropy fit is a proxy for HR@10 and fitted on recalled users only: where it orders the
    # top 10 worse than a signal alone (a log whose lane finds most of what recall does), serve the best.
    chosen = max(val_hr, key=lambda name: (val_hr[name], name == "blend"))
    blend = scores[chosen]
    info = {"val_users": len(rows), "recalled": round(len(found) / max(len(rows), 1), 4),
            "candidates": rec.recall_candidates, "covisit_candidates": rec.covisit_candidates,
            "val_hr@10": {name: val_hr[name] for name in (*FEATURES, "blend_without_din", "blend")},
            "chosen": chosen, "weights": dict(zip(FEATURES, (round(v, 4) for v in blend.weights), strict=True)),
            "ablations": {name: [round(v, 6) for v in w] for name, w in ablations.items()}}
    return blend, info
