"""`dinrec bench train`: dinrec's trainer, alone or side by side with DeepCTR-Torch's DIN.

Both sides get the same samples (same split, same held-out negatives), the same embedding and layer
sizes and activations, the same learning rate and epochs, in one process, one after the other, each with
all CPU threads. Metrics come from the same code (training.metrics). A *sample* is one training positive
with its negatives, as the listwise objective defines it: a positive and ``list_negatives`` mined and
popular ones, redrawn every step. DeepCTR's DIN, pointwise, trains on the very lists dinrec trained on —
each counted candidate a labelled row, step by step in dinrec's order (deepctr_peer.list_rows) — so
``samples_per_s`` (samples per second of training time, evaluation excluded) compares the same work;
``candidates_per_s`` counts the items scored. DeepCTR reads item + category; dinrec as it ships also
reads its context inputs (models.context). dinrec's test GAUC is probed after every epoch, for the
training time it takes to reach the peer's final test GAUC (the recall towers it mines its negatives
from are trained first and timed apart). With ``objective="pointwise"`` both sides train on a positive
and one uniform negative, the objective before the listwise one; ``also_pointwise`` adds that run of
dinrec to a listwise bench. The peer is measured in the same run, never remembered from an earlier one.

With several training seeds (``seeds``), both sides train once per seed, interleaved, on the same
samples; each side reports the mean over seeds and every run. One seed is not enough to compare
quality: on MovieLens 100k DeepCTR's test GAUC moves by ±0.015 between seeds.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import torch

from dinrec.datasets import load_dataset
from dinrec.training.lists import ListBatch, ListData
from dinrec.training.metrics import auc, gauc, logloss
from dinrec.training.progress import Stages, showing
from dinrec.training.run import train
from dinrec.training.samples import SampleSet, build_samples
from dinrec.training.settings import TrainSettings
from dinrec.training.telemetry import peak_rss_mb


class _Common(TypedDict):
    """The TrainSettings both sides share (validated there: device and activation against its choices)."""
    epochs: int
    seq_len: int
    batch_size: int
    item_dim: int
    cat_dim: int
    attention_hidden: tuple[int, ...]
    mlp_hidden: tuple[int, ...]
    mlp_activation: str
    seed: int
    device: str
    progress: bool
    patience: int


_REPORTED = ("samples_per_s", "candidates_per_s", "test_auc", "test_gauc", "test_logloss", "val_gauc")


class _RecordedLists(ListData):
    """The listwise data, keeping each step's lists by epoch — (the positives' training rows, their
    candidates, which the loss counted) — for the peer to train on the same samples."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.steps: dict[int, list[tuple[np.ndarray, torch.Tensor, torch.Tensor]]] = {}

    def batch(self, idx: np.ndarray, epoch: int, step: int) -> ListBatch:
        lists = super().batch(idx, epoch, step)
        self.steps.setdefault(epoch, []).append((self.positives[idx], lists.cand_items, lists.valid))
        return lists


def _dinrec_once(samples: SampleSet, settings: TrainSettings,
                 record: bool = False) -> tuple[dict, _RecordedLists | None]:
    """One training run's figures, and (listwise, ``record``: a peer trains on them next) the lists it trained on."""
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    probes: list[dict] = []
    lists, towers_s = None, 0.0
    if settings.objective == "listwise":
        from dinrec.training.export import fit_covisitation
        from dinrec.training.pipeline import list_settings
        from dinrec.training.run import train_towers
        from dinrec.training.towers_train import towers_settings

        t0 = time.perf_counter()
        towers = train_towers(samples, towers_settings(settings)).model
        lists = (_RecordedLists if record else ListData)(samples, list_settings(settings), towers,
                                                         fit_covisitation(samples)[0],
                                                         min(settings.seq_len, samples.seq_len))
        towers_s = time.perf_counter() - t0

    def probe(trainer) -> None:  # the test split after each epoch: when the peer's GAUC is reached
        from dinrec.training.loop import evaluate_lists

        test = evaluate_lists(trainer.model, trainer.lists, trainer.test_t, "test", trainer.precision)
        probes.append({"epoch": trainer.progress.epoch, "train_seconds": round(trainer.progress.train_seconds, 2),
                       "test_gauc": round(test["gauc"], 5)})

    m = train(samples, settings, lists=lists, on_epoch=probe if lists is not None else None).metrics
    run = {k: m[k] for k in _REPORTED if k in m}
    per_sample = 1 + (settings.list_negatives if lists is not None else samples.negatives)
    run.update(peak_rss_mb=peak_rss_mb(), device=m["device"], precision=m.get("precision", "fp32"),
               fused_kernel=m["fused_kernel"], objective=settings.objective,
               candidates_per_s=m["samples_per_s"] * per_sample)
    if lists is None:  # pointwise: the trainer counts rows; a sample is a positive with its negatives
        run["samples_per_s"] = m["samples_per_s"] / per_sample
        run["candidates_per_s"] = m["samples_per_s"]
    else:
        run.update(towers_seconds=round(towers_s, 1), epochs=probes, train_lists=m["train_samples"])
    for key in ("gpu_name", "gpu_peak_mem_mb", "gpu_sm_util", "gpu_mem_bw_util"):
        if key in m:
            run[key] = m[key]
    return run, lists if isinstance(lists, _RecordedLists) else None


def _time_to(run: dict, peer_gauc: float) -> None:
    """The training time dinrec's listwise run took to reach the peer's final test GAUC (None: never)."""
    reached = [p for p in run["epochs"] if p["test_gauc"] >= peer_gauc]
    run["seconds_to_peer_gauc"] = reached[0]["train_seconds"] if reached else None


# The peer fits this many of dinrec's steps at a time (DeepCTR holds a chunk's rows in memory).
_STEPS_PER_FIT = 64


def _deepctr_once(samples: SampleSet, settings: TrainSettings, lists: _RecordedLists | None) -> dict:
    """DeepCTR on the lists dinrec trained on (``lists``), or on the pointwise samples (None)."""
    from dinrec.benchmarks.deepctr_peer import list_rows, run_deepctr

    s = settings
    assert s.epochs is not None  # filled by TrainSettings' validation
    epoch_rows = None
    if lists is not None:
        steps = lists.steps

        def epoch_rows(epoch: int):
            for lo in range(0, len(steps[epoch]), _STEPS_PER_FIT):
                yield list_rows(samples, s.seq_len, steps[epoch][lo:lo + _STEPS_PER_FIT])

    p = run_deepctr(samples, seq_len=s.seq_len, epochs=s.epochs, batch_size=s.batch_size, item_dim=s.item_dim,
                    cat_dim=s.cat_dim, attention_hidden=s.attention_hidden, mlp_hidden=s.mlp_hidden,
                    attention_activation=s.attention_activation, mlp_activation=s.mlp_activation, seed=s.seed,
                    lr=s.lr, epoch_rows=epoch_rows)
    t, v = samples.test, samples.val
    # DeepCTR counts rows: a sample is a positive and its negatives
    n_samples = (sum(len(r) for step in lists.steps.values() for r, _, _ in step) if lists is not None
                 else s.epochs * len(samples.train.label) / (1 + samples.negatives))
    return {"samples_per_s": n_samples / p["train_seconds"], "candidates_per_s": p["rows_per_s"],
            "samples": n_samples, "rows": p["rows"], "train_seconds": round(p["train_seconds"], 2),
            "test_auc": auc(t.label, p["test_scores"]),
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
                device: str = "auto", eval_negatives: int = 20, objective: str = "listwise",
                also_pointwise: bool = False, progress: bool | None = None) -> dict:
    """``progress``: a line per stage on stderr (default: when stderr is a terminal)."""
    if vs not in (None, "deepctr"):
        raise ValueError(f"unknown peer {vs!r}; the only one is 'deepctr'")
    if not seeds:
        raise ValueError("give at least one seed")
    say = Stages(showing(progress))
    t0 = time.perf_counter()
    # The samples (split, negatives) are fixed by the first seed; the others vary only training.
    samples = build_samples(load_dataset(data), seq_len=seq_len, negatives=1, eval_negatives=eval_negatives,
                            seed=seeds[0])
    prep_s = time.perf_counter() - t0
    say(f"{len(samples.train)} training samples built")
    mine: list[dict] = []
    peer: list[dict] = []
    pointwise: list[dict] = []
    for seed in seeds:
        common: _Common = {"epochs": epochs, "seq_len": seq_len, "batch_size": batch_size, "item_dim": item_dim,
                           "cat_dim": cat_dim, "attention_hidden": attention_hidden, "mlp_hidden": mlp_hidden,
                           "mlp_activation": mlp_activation, "seed": seed, "device": device, "progress": False,
                           "patience": 0}
        # DeepCTR (and dinrec's pointwise objective) with the paper's activation unit; listwise lists need
        # a unit without batch statistics (models.din), PReLU in its place.
        peer_settings = TrainSettings(objective="pointwise", attention_activation=attention_activation, **common)
        if objective == "pointwise":
            settings = peer_settings
        else:  # dinrec as it ships: its listwise unit (one narrow PReLU layer, run per candidate) and batch
            shipped = TrainSettings()
            listwise: _Common = {**common, "attention_hidden": shipped.attention_hidden,
                                 "batch_size": shipped.batch_size}
            settings = TrainSettings(objective="listwise", **listwise)
        run, lists = _dinrec_once(samples, settings, record=vs == "deepctr")
        mine.append(run)
        say(f"seed {seed}: dinrec {objective} trained (test gauc {run['test_gauc']:.4f})")
        if vs == "deepctr":
            peer.append(_deepctr_once(samples, peer_settings, lists))
            say(f"seed {seed}: deepctr trained on the same samples (test gauc {peer[-1]['test_gauc']:.4f})")
            if lists is not None:
                _time_to(run, peer[-1]["test_gauc"])
        del lists  # an epoch's lists for the peer: not kept past the seed
        if also_pointwise and objective != "pointwise":
            pointwise.append(_dinrec_once(samples, peer_settings)[0])
            say(f"seed {seed}: dinrec pointwise trained (test gauc {pointwise[-1]['test_gauc']:.4f})")
    out: dict[str, Any] = {  # JSON-shaped: the figures, the settings, each side's summary
        "dataset": str(data), "train_samples": len(samples.train), "test_samples": len(samples.test),
        "n_items": samples.vocab.n_items, "n_categories": samples.vocab.n_categories,
        "sample_build_s": prep_s, "threads": torch.get_num_threads(),
        "config": {"epochs": epochs, "seq_len": seq_len, "batch_size": batch_size, "item_dim": item_dim,
                   "cat_dim": cat_dim, "attention_hidden": list(attention_hidden), "mlp_hidden": list(mlp_hidden),
                   "attention_activation": attention_activation, "mlp_activation": mlp_activation,
                   "lr": settings.lr, "negatives": 1, "list_negatives": settings.list_negatives,
                   # what the peer trained on: the listwise lists dinrec drew, or a positive and one uniform negative
                   "peer_samples": "dinrec_lists" if objective == "listwise" else "one_uniform_negative",
                   "eval_negatives": eval_negatives, "seeds": list(seeds),
                   "dinrec_listwise": {k: v for k, v in settings.model_dump().items() if k in (
                       "attention_hidden", "attention_activation", "batch_size", "list_negatives",
                       "hard_negative_share", "din_context")} if objective == "listwise" else None},
        "objective": objective, "dinrec": _summary(mine, list(seeds)),
    }
    if pointwise:
        out["dinrec_pointwise"] = _summary(pointwise, list(seeds))
        out["listwise_vs_pointwise_samples_per_s"] = out["dinrec"]["samples_per_s"] / out["dinrec_pointwise"][
            "samples_per_s"]
    if peer:
        out["deepctr"] = _summary(peer, list(seeds))
        out["speedup"] = out["dinrec"]["samples_per_s"] / out["deepctr"]["samples_per_s"]
        out["test_gauc_delta"] = out["dinrec"]["test_gauc"] - out["deepctr"]["test_gauc"]
    return out
