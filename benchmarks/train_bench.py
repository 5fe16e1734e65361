"""`dinrec bench train`: dinrec's trainer, alone or side by side with DeepCTR-Torch's DIN.

Both sides get the same samples (same split, same negatives), the same features (item + category),
the same embedding and layer sizes and activations, the same batch size, learning rate and
epochs, in one process, one after the other, each with all CPU threads. Metrics come from the same
code (training.metrics). Throughput is training samples per second of training time (evaluation
excluded) — the peer is measured in the same run, never remembered from an earlier one.

With several training seeds (``seeds``), both sides train once per seed, interleaved, on the same
samples; each side reports the mean over seeds and every run. One seed is not enough to compare
quality: on MovieLens 100k DeepCTR's test GAUC moves by ±0.015 between seeds.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from feature_store.datasets import load_dataset
from training.loop import train
from training.metrics import auc, gauc, logloss
from training.samples import SampleSet, build_samples
from training.settings import TrainSettings
from training.telemetry import peak_rss_mb

_REPORTED = ("samples_per_s", "test_auc", "test_gauc", "test_logloss", "val_gauc")


def _dinrec_once(samples: SampleSet, settings: TrainSettings) -> dict:
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    m = train(samples, settings).metrics
    run = {k: m[k] for k in _REPORTED}
    run.update(peak_rss_mb=peak_rss_mb(), device=m["device"], precision=m.get("precision", "fp32"),
               fused_kernel=m["fused_kernel"])
    for key in ("gpu_name", "gpu_peak_mem_mb", "gpu_sm_util", "gpu_mem_bw_util"):
        if key in m:
            run[key] = m[key]
    return run


def _deepctr_once(samples: SampleSet, settings: TrainSettings) -> dict:
    from benchmarks.deepctr_peer import run_deepctr

    s = settings
    p = run_deepctr(samples, seq_len=s.seq_len, epochs=s.epochs, batch_size=s.batch_size, item_dim=s.item_dim,
                    cat_dim=s.cat_dim, attention_hidden=s.attention_hidden, mlp_hidden=s.mlp_hidden,
                    attention_activation=s.attention_activation, mlp_activation=s.mlp_activation, seed=s.seed,
                    lr=s.lr)
    t, v = samples.test, samples.val
    return {"samples_per_s": p["samples_per_s"], "test_auc": auc(t.label, p["test_scores"]),
            "test_gauc": gauc(t.user, t.label, p["test_scores"]), "test_logloss": logloss(t.label, p["test_scores"]),
            "val_gauc": gauc(v.user, v.label, p["val_scores"])}


def _summary(runs: list[dict], seeds: list[int]) -> dict:
    """Means over seeds at the top level (the README's figures), the spread, and every run."""
    out: dict = {k: statistics.fmean(r[k] for r in runs) for k in _REPORTED}
    out["test_gauc_std"] = statistics.stdev(r["test_gauc"] for r in runs) if len(runs) > 1 else 0.0
    out.update({k: v for k, v in runs[-1].items() if k not in _REPORTED})  # device, precision, memory
    out["runs"] = [{"seed": s, **{k: r[k] for k in _REPORTED}} for s, r in zip(seeds, runs, strict=True)]
    return out


def bench_train(data: Path, *, vs: str | None, epochs: int, seq_len: int, batch_size: int, item_dim: int,
                cat_dim: int, attention_hidden: tuple[int, ...], mlp_hidden: tuple[int, ...],
                attention_activation: str, mlp_activation: str, seeds: tuple[int, ...] = (0,),
                device: str = "auto", eval_negatives: int = 20) -> dict:
    if vs not in (None, "deepctr"):
        raise ValueError(f"unknown peer {vs!r}; the only one is 'deepctr'")
    if not seeds:
        raise ValueError("give at least one seed")
    t0 = time.perf_counter()
    # The samples (split, negatives) are fixed by the first seed; the others vary only training.
    samples = build_samples(load_dataset(data), seq_len=seq_len, negatives=1, eval_negatives=eval_negatives,
                            seed=seeds[0])
    prep_s = time.perf_counter() - t0
    mine: list[dict] = []
    peer: list[dict] = []
    for seed in seeds:
        settings = TrainSettings(epochs=epochs, seq_len=seq_len, batch_size=batch_size, item_dim=item_dim,
                                 cat_dim=cat_dim, attention_hidden=attention_hidden, mlp_hidden=mlp_hidden,
                                 attention_activation=attention_activation, mlp_activation=mlp_activation,
                                 seed=seed, device=device, progress=False)
        mine.append(_dinrec_once(samples, settings))
        if vs == "deepctr":
            peer.append(_deepctr_once(samples, settings))
    out = {
        "dataset": str(data), "train_samples": len(samples.train), "test_samples": len(samples.test),
        "n_items": samples.vocab.n_items, "n_categories": samples.vocab.n_categories,
        "sample_build_s": prep_s, "threads": torch.get_num_threads(),
        "config": {"epochs": epochs, "seq_len": seq_len, "batch_size": batch_size, "item_dim": item_dim,
                   "cat_dim": cat_dim, "attention_hidden": list(attention_hidden), "mlp_hidden": list(mlp_hidden),
                   "attention_activation": attention_activation, "mlp_activation": mlp_activation,
                   "lr": settings.lr, "negatives": 1, "eval_negatives": eval_negatives, "seeds": list(seeds)},
        "dinrec": _summary(mine, list(seeds)),
    }
    if peer:
        out["deepctr"] = _summary(peer, list(seeds))
        out["speedup"] = out["dinrec"]["samples_per_s"] / out["deepctr"]["samples_per_s"]
        out["test_gauc_delta"] = out["dinrec"]["test_gauc"] - out["deepctr"]["test_gauc"]
    return out
