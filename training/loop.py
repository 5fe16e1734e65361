"""The operational training loop: devices, optimiser, evaluation, checkpoints, metrics.

The model (training.model) knows nothing of this; :class:`DINWithLoss` adds the loss.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from training.data import SplitTensors
from training.metrics import auc, gauc, logloss
from training.model import DIN, DINConfig
from training.samples import SampleSet
from training.settings import TrainSettings

log = logging.getLogger(__name__)


class DINWithLoss(nn.Module):
    """Train wrapper: the pure model plus binary cross-entropy on its logits."""

    def __init__(self, model: DIN) -> None:
        super().__init__()
        self.model = model

    def forward(self, hist_items, hist_cats, target_item, target_cat, label) -> torch.Tensor:
        logits = self.model(hist_items, hist_cats, target_item, target_cat)  # (B,)
        return F.binary_cross_entropy_with_logits(logits, label)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but no CUDA device is available")
    return torch.device(name)


def weights_sha256(model: nn.Module) -> str:
    """A hash of the weights (names, dtypes, shapes, bytes), so two runs can be compared."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.view(torch.int16).numpy().tobytes())
    return h.hexdigest()


@torch.no_grad()
def evaluate(model: DIN, split: SplitTensors, batch_size: int) -> dict[str, float]:
    if len(split) == 0:
        return {"auc": float("nan"), "gauc": float("nan"), "logloss": float("nan"), "n": 0}
    was_training = model.training
    model.eval()
    logits = torch.cat([model(*b.inputs()).float().cpu() for b in split.batches(batch_size)]).numpy()
    model.train(was_training)
    labels, users = split.label.cpu().numpy(), split.user.cpu().numpy()
    return {"auc": auc(labels, logits), "gauc": gauc(users, labels, logits),
            "logloss": logloss(labels, logits), "n": int(len(labels))}


@dataclass
class TrainResult:
    model: DIN
    metrics: dict[str, float] = field(default_factory=dict)


def model_config_for(samples: SampleSet, s: TrainSettings) -> DINConfig:
    return DINConfig(n_items=samples.vocab.n_items, n_categories=samples.vocab.n_categories,
                     item_dim=s.item_dim, cat_dim=s.cat_dim, mlp_hidden=tuple(s.mlp_hidden),
                     attention_hidden=tuple(s.attention_hidden))


def _save_epoch_checkpoint(folder: Path, epoch: int, model: DIN, opt: torch.optim.Optimizer, keep: int = 2) -> None:
    """Write to a temp dir, fsync, rename; keep the newest ``keep`` (exact resume is issue #3's)."""
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"epoch-{epoch:04d}"
    tmp = folder / f".tmp-epoch-{epoch:04d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    with (tmp / "state.pt").open("wb") as fh:
        torch.save({"epoch": epoch, "model": model.state_dict(), "optimizer": opt.state_dict()}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in sorted(folder.glob("epoch-*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def train(samples: SampleSet, s: TrainSettings, out: Path | None = None) -> TrainResult:
    torch.manual_seed(s.seed)
    np.random.seed(s.seed)
    if s.threads:
        torch.set_num_threads(s.threads)
    device = pick_device(s.device)
    model = DIN(model_config_for(samples, s)).to(device)
    step_fn = DINWithLoss(model)
    opt = torch.optim.Adam(model.parameters(), lr=s.lr)
    seq_len = min(s.seq_len, samples.seq_len)
    train_t = SplitTensors(samples, samples.train, seq_len, device)
    val_t = SplitTensors(samples, samples.val, seq_len, device)
    test_t = SplitTensors(samples, samples.test, seq_len, device)
    gen = torch.Generator().manual_seed(s.seed)

    metrics: dict[str, float] = {}
    seen, train_seconds = 0, 0.0
    for epoch in range(s.epochs):
        model.train()
        order = torch.randperm(len(train_t), generator=gen).to(device)
        n_batches = (len(train_t) + s.batch_size - 1) // s.batch_size
        bar = tqdm(train_t.batches(s.batch_size, order), total=n_batches, disable=not s.progress,
                   desc=f"epoch {epoch + 1}/{s.epochs}", unit="batch", leave=False)
        t0, running = time.perf_counter(), 0.0
        for i, batch in enumerate(bar):
            loss = step_fn(*batch.inputs(), batch.label)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            running += float(loss.detach())
            seen += len(batch)
            if i % 20 == 0:
                bar.set_postfix(loss=f"{running / (i + 1):.4f}")
        train_seconds += time.perf_counter() - t0
        val = evaluate(model, val_t, s.eval_batch_size)
        metrics.update({"epoch": epoch + 1, "train_loss": running / max(n_batches, 1),
                        **{f"val_{k}": v for k, v in val.items()}})
        log.info("epoch %d: %s", epoch + 1, json.dumps(metrics))
        if s.progress:
            tqdm.write(json.dumps({k: round(v, 5) if isinstance(v, float) else v for k, v in metrics.items()}))
        if out is not None:
            _save_epoch_checkpoint(out / "checkpoints", epoch + 1, model, opt)

    test = evaluate(model, test_t, s.eval_batch_size)
    metrics.update({f"test_{k}": v for k, v in test.items()})
    metrics.update({"samples_per_s": seen / train_seconds if train_seconds else 0.0, "train_samples": len(train_t),
                    "seq_len": seq_len, "device": str(device), "weights_sha256": weights_sha256(model)})
    return TrainResult(model=model, metrics=metrics)
