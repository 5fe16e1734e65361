"""Train the recall towers (models.towers) on the same samples as DIN.

Each training positive (a behaviour and the history before it) is a softmax over items: the
target against every item while the catalog is small enough to score whole (``full_softmax_items``),
else against ``sampled_negatives`` items drawn uniformly and shared by the batch (uniform draws
need no log-Q correction; accidental hits of the target are masked). The best epoch by validation
HR@``eval_n`` is kept — measured as serving recalls: history items excluded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from models.recall import target_found, top_unseen
from models.towers import Towers, TowersConfig
from training.data import split_histories
from training.samples import SampleSet, Split
from training.settings import TrainSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TowersSettings:
    dim: int = 32
    epochs: int = 20
    batch_size: int = 512
    lr: float = 3e-3
    weight_decay: float = 0.0
    temperature: float = 0.07
    full_softmax_items: int = 200_000
    sampled_negatives: int = 8192
    eval_n: int = 200
    patience: int = 3  # epochs without a better validation HR before stopping

    seed: int = 0


def towers_settings(train: TrainSettings) -> TowersSettings:
    """The recall towers' settings from ``dinrec train``'s."""
    return TowersSettings(dim=train.recall_dim, epochs=train.recall_epochs, lr=train.recall_lr, seed=train.seed)


@dataclass
class TowersResult:
    model: Towers
    metrics: dict


def _positives(split: Split) -> np.ndarray:
    return np.flatnonzero(split.label == 1)


@torch.no_grad()
def hit_rate_at(model: Towers, samples: SampleSet, split: Split, n: int, item_category: torch.Tensor,
                batch: int = 1024) -> float:
    """HR@n over ``split``'s positives: the target among the n best items, history items excluded."""
    model.eval()
    table = model.item_table(item_category)  # (I, D)
    rows = _positives(split)
    found = 0
    for s in range(0, len(rows), batch):
        r = rows[s:s + batch]
        hist, cats = split_histories(samples, split, r)
        top = top_unseen(model.users(hist, cats) @ table.T, hist, n)  # (B, I) scores → (B, n)
        found += int(target_found(top, torch.from_numpy(split.target_item[r])).sum())
    return found / max(len(rows), 1)


def train_towers(samples: SampleSet, settings: TowersSettings = TowersSettings(),
                 init: Callable[[Towers], dict] | None = None) -> TowersResult:
    """``init``: called on the fresh towers before training (a warm start: training.warm_start)."""
    torch.manual_seed(settings.seed)
    rng = np.random.default_rng(settings.seed)
    vocab = samples.vocab
    cfg = TowersConfig(n_items=vocab.n_items, n_categories=len(vocab.categories), dim=settings.dim,
                       seq_len=samples.seq_len, temperature=settings.temperature)
    model = Towers(cfg)
    init_info = init(model) if init is not None else None
    item_category = torch.as_tensor(vocab.item_category, dtype=torch.long)  # (I,)
    opt = torch.optim.Adam(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    train_rows = _positives(samples.train)
    full = vocab.n_items <= settings.full_softmax_items
    best, best_state, best_epoch, history = -1.0, None, -1, []
    t0 = time.perf_counter()
    for epoch in range(settings.epochs):
        model.train()
        order = rng.permutation(train_rows)
        total = 0.0
        for s in range(0, len(order), settings.batch_size):
            r = order[s:s + settings.batch_size]
            hist, cats = split_histories(samples, samples.train, r)
            target = torch.from_numpy(samples.train.target_item[r])  # (B,)
            users = model.users(hist, cats)  # (B, D)
            if full:
                logits = users @ model.item_table(item_category).T / cfg.temperature  # (B, I)
                logits[:, 0] = -torch.inf
                loss = F.cross_entropy(logits, target)
            else:
                neg = torch.randint(1, vocab.n_items, (settings.sampled_negatives,))  # (M,)
                pos_v = model.items(target, item_category[target])  # (B, D)
                neg_v = model.items(neg, item_category[neg])  # (M, D)
                pos_logit = (users * pos_v).sum(-1, keepdim=True)  # (B, 1)
                neg_logit = (users @ neg_v.T).masked_fill(neg.unsqueeze(0) == target.unsqueeze(1), -torch.inf)
                logits = torch.cat([pos_logit, neg_logit], dim=1) / cfg.temperature  # (B, 1 + M)
                loss = F.cross_entropy(logits, torch.zeros(len(r), dtype=torch.long))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(r)
        hr = hit_rate_at(model, samples, samples.val, settings.eval_n, item_category)
        history.append({"epoch": epoch, "loss": round(total / max(len(order), 1), 4),
                        f"val_hr@{settings.eval_n}": round(hr, 4)})
        log.info("towers epoch %d: loss %.4f, val HR@%d %.4f", epoch, total / max(len(order), 1), settings.eval_n, hr)
        if hr > best:
            best, best_epoch = hr, epoch
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        elif epoch - best_epoch >= settings.patience:
            break
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    test_hr = hit_rate_at(model, samples, samples.test, settings.eval_n, item_category)
    metrics = {"val_hr": round(best, 4), "test_hr": round(test_hr, 4), "eval_n": settings.eval_n,
               "best_epoch": best_epoch, "epochs": history, "softmax": "full" if full else "sampled",
               "seconds": round(time.perf_counter() - t0, 1), "warm_start": init_info}
    return TowersResult(model, metrics)
