"""A SASRec-style sequential recommender (Kang & McAuley, ICDM 2018), the peer ``bench e2e`` holds
the served list against: learned item + position embeddings, causal self-attention blocks, and the
next item scored against every item (full softmax; the benchmarks' catalogs are small enough).

Trained on each user's behaviours before their validation target (every position predicts the
next), early-stopped on validation HR@10; recommends from the last ``max_len`` behaviours, excluding
everything the user took. Kept in ``benchmarks``: it is a yardstick, not part of what serves.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dinrec.retrieval.hits import row_ranks


@dataclass(frozen=True)
class SASRecConfig:
    dim: int = 64
    max_len: int = 50
    blocks: int = 2
    heads: int = 1
    dropout: float = 0.2
    lr: float = 1e-3
    batch_size: int = 128
    epochs: int = 60
    eval_every: int = 2
    patience: int = 3  # evaluations without a better validation HR@10


class SASRec(nn.Module):
    causal: torch.Tensor  # a buffer (register_buffer), which nn.Module's attribute lookup types as Tensor | Module

    def __init__(self, n_items: int, cfg: SASRecConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.item = nn.Embedding(n_items, cfg.dim, padding_idx=0)
        # N(0, 1/D): scaled by √D on the way in (as the Transformer does) the inputs are unit-variance,
        # and the output logits (state · item) start near 1 instead of √D — with nn.Embedding's N(0, 1)
        # the softmax starts saturated and training settles on popularity (val HR@10 ≈ most-popular's).
        nn.init.normal_(self.item.weight, std=cfg.dim ** -0.5)
        with torch.no_grad():
            self.item.weight[0].zero_()
        self.pos = nn.Embedding(cfg.max_len, cfg.dim)
        layer = nn.TransformerEncoderLayer(cfg.dim, cfg.heads, dim_feedforward=cfg.dim, dropout=cfg.dropout,
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, cfg.blocks, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(cfg.dim)
        self.drop = nn.Dropout(cfg.dropout)
        mask = torch.triu(torch.ones(cfg.max_len, cfg.max_len, dtype=torch.bool), diagonal=1)
        self.register_buffer("causal", mask, persistent=False)  # (L, L) True = may not attend

    def forward(self, seq: torch.Tensor) -> torch.Tensor:
        """(B, L) left-padded item indices → (B, L, D): position t's state, having read seq[:, :t+1]."""
        length = seq.shape[1]
        x = self.item(seq) * math.sqrt(self.cfg.dim) + self.pos.weight[-length:]  # (B, L, D)
        x = self.drop(x) * (seq != 0).unsqueeze(-1)  # padding carries nothing but is attended (as SASRec)
        return self.norm(self.encoder(x, mask=self.causal[:length, :length]))

    @torch.no_grad()
    def scores(self, histories: Sequence[np.ndarray]) -> torch.Tensor:
        """Each history's next-item scores over every item: (B, I)."""
        seq = _left_pad([h[-self.cfg.max_len:] for h in histories], self.cfg.max_len)
        return self(seq)[:, -1] @ self.item.weight.T

    def recommend(self, history: np.ndarray, n: int) -> np.ndarray:
        s = self.scores([history])[0]
        s[0] = -torch.inf
        s[torch.as_tensor(history, dtype=torch.long)] = -torch.inf
        return s.topk(min(n, len(s) - 1)).indices.numpy()


def _left_pad(seqs: Sequence[np.ndarray], length: int) -> torch.Tensor:
    out = torch.zeros(len(seqs), length, dtype=torch.long)
    for r, s in enumerate(seqs):
        if len(s):
            out[r, -len(s):] = torch.as_tensor(np.asarray(s[-length:]), dtype=torch.long)
    return out


def _windows(sequences: Sequence[np.ndarray], max_len: int) -> list[np.ndarray]:
    """Each sequence cut into windows of max_len + 1 (input + shifted target), newest first."""
    out = []
    for s in sequences:
        for end in range(len(s), 1, -max_len):
            out.append(s[max(0, end - max_len - 1):end])
    return out


def _hit_rate(model: SASRec, cases, k: int = 10, batch: int = 256) -> float:
    model.eval()
    hits = 0
    for s in range(0, len(cases), batch):
        chunk = cases[s:s + batch]
        scores = model.scores([c.history for c in chunk])
        scores[:, 0] = -torch.inf
        for r, c in enumerate(chunk):
            scores[r, torch.as_tensor(c.history, dtype=torch.long)] = -torch.inf
        top = scores.topk(k, dim=1).indices
        hits += int((row_ranks(top.numpy(), np.asarray([c.target for c in chunk])) >= 0).sum())
    return hits / max(len(cases), 1)


def train_sasrec(sequences: Sequence[np.ndarray], n_items: int, val_cases, cfg: SASRecConfig = SASRecConfig(),
                 seed: int = 0) -> tuple[SASRec, dict]:
    """``sequences``: each user's training behaviours, oldest first; ``val_cases``: objects with
    ``history`` and ``target`` (the early-stopping measure)."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = SASRec(n_items, cfg)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98))
    windows = _windows(sequences, cfg.max_len)
    best, best_state, best_epoch, evals_since = -1.0, None, -1, 0
    t0 = time.perf_counter()
    for epoch in range(cfg.epochs):
        model.train()
        order = rng.permutation(len(windows))
        for s in range(0, len(windows), cfg.batch_size):
            chunk = [windows[i] for i in order[s:s + cfg.batch_size]]
            seq = _left_pad([w[:-1] for w in chunk], cfg.max_len)  # (B, L)
            target = _left_pad([w[1:] for w in chunk], cfg.max_len)  # (B, L)
            logits = model(seq) @ model.item.weight.T  # (B, L, I)
            logits[..., 0] = -torch.inf
            loss = F.cross_entropy(logits[target != 0], target[target != 0])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if (epoch + 1) % cfg.eval_every == 0:
            hr = _hit_rate(model, val_cases)
            if hr > best:
                best, best_epoch, evals_since = hr, epoch, 0
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            else:
                evals_since += 1
                if evals_since >= cfg.patience:
                    break
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    return model, {"model": "SASRec (causal self-attention, full softmax)", "dim": cfg.dim, "blocks": cfg.blocks,
                   "max_len": cfg.max_len, "val_hr@10": round(best, 4), "best_epoch": best_epoch,
                   "seconds": round(time.perf_counter() - t0, 1)}

