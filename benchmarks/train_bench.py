"""`dinrec bench train`: dinrec's trainer, alone or side by side with DeepCTR-Torch's DIN.

Both sides get the same samples (same split, same negatives), the same features (item + category),
the same embedding and layer sizes and activations, the same batch size, learning rate and
epochs, in one process, one after the other, each with all CPU threads. Metrics come from the same
code (training.metrics). Throughput is training samples per second of training time (evaluation
excluded) — the peer is measured in the same run, never remembered from an earlier one.
"""

from __future__ import annotations

import platform
import time
from pathlib import Path

import torch

from feature_store.datasets import load_dataset
from training.loop import train
from training.metrics import auc, gauc, logloss
from training.samples import build_samples
from training.settings import TrainSettings
from training.telemetry import peak_rss_mb


def bench_train(data: Path, *, vs: str | None, epochs: int, seq_len: int, batch_size: int, item_dim: int,
                cat_dim: int, attention_hidden: tuple[int, ...], mlp_hidden: tuple[int, ...],
                attention_activation: str, mlp_activation: str, seed: int = 0, device: str = "auto",
                eval_negatives: int = 20) -> dict:
    t0 = time.perf_counter()
    samples = build_samples(load_dataset(data), seq_len=seq_len, negatives=1, eval_negatives=eval_negatives, seed=seed)
    prep_s = time.perf_counter() - t0
    settings = TrainSettings(epochs=epochs, seq_len=seq_len, batch_size=batch_size, item_dim=item_dim,
                             cat_dim=cat_dim, attention_hidden=attention_hidden, mlp_hidden=mlp_hidden,
                             attention_activation=attention_activation, mlp_activation=mlp_activation,
                             seed=seed, device=device, progress=False)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    m = train(samples, settings).metrics
    mine = {"samples_per_s": m["samples_per_s"], "test_auc": m["test_auc"], "test_gauc": m["test_gauc"],
            "test_logloss": m["test_logloss"], "val_gauc": m["val_gauc"], "peak_rss_mb": peak_rss_mb(),
            "device": m["device"], "precision": m.get("precision", "fp32")}
    for key in ("gpu_peak_mem_mb", "gpu_sm_util", "gpu_mem_bw_util"):
        if key in m:
            mine[key] = m[key]
    out = {
        "dataset": str(data), "train_samples": len(samples.train), "test_samples": len(samples.test),
        "sample_build_s": prep_s, "threads": torch.get_num_threads(), "cpu": platform.processor() or platform.machine(),
        "config": {"epochs": epochs, "seq_len": seq_len, "batch_size": batch_size, "item_dim": item_dim,
                   "cat_dim": cat_dim, "attention_hidden": list(attention_hidden), "mlp_hidden": list(mlp_hidden),
                   "attention_activation": attention_activation, "mlp_activation": mlp_activation, "lr": settings.lr,
                   "negatives": 1, "eval_negatives": eval_negatives},
        "dinrec": mine,
    }
    if vs == "deepctr":
        from benchmarks.deepctr_peer import run_deepctr

        p = run_deepctr(samples, seq_len=seq_len, epochs=epochs, batch_size=batch_size, item_dim=item_dim,
                        cat_dim=cat_dim, attention_hidden=attention_hidden, mlp_hidden=mlp_hidden,
                        attention_activation=attention_activation, mlp_activation=mlp_activation, seed=seed,
                        lr=settings.lr)
        t = samples.test
        out["deepctr"] = {"samples_per_s": p["samples_per_s"], "test_auc": auc(t.label, p["test_scores"]),
                          "test_gauc": gauc(t.user, t.label, p["test_scores"]),
                          "test_logloss": logloss(t.label, p["test_scores"]),
                          "val_gauc": gauc(samples.val.user, samples.val.label, p["val_scores"])}
        out["speedup"] = mine["samples_per_s"] / out["deepctr"]["samples_per_s"]
        out["test_gauc_delta"] = mine["test_gauc"] - out["deepctr"]["test_gauc"]
    elif vs is not None:
        raise ValueError(f"unknown peer {vs!r}; the only one is 'deepctr'")
    return out
