"""DIN's tables sharded by TorchRec over two gloo ranks train like one unsharded process (the same
samples, seed and row-wise Adagrad), for each sharding type TorchRec runs on CPU, and resume exactly
after a SIGTERM. (Data-parallel tables — the fourth type — keep no shards: TorchRec refuses them with
the fused optimizer; they are the replicated trainer.)"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import torch

from dinrec.models.bundle import load_bundle
from dinrec.training.sharded import torchrec_missing
from tests.conftest import dinrec_train, shared_dataset, synthetic_dataset_dir

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(torchrec_missing() is not None, reason=str(torchrec_missing()))]

# No BatchNorm (Dice): ranks would normalise over their own half-batch, one process over the whole.
# The pointwise objective (sharded tables train only it), with the paper's [80, 40] unit the tolerances below
# were measured with: with the listwise default's one 16-wide layer the runs drift apart faster (4 steps:
# 61 % of weights within 1e-5, the largest 0.03; test GAUC still within 0.005) — not yet explained.
ENV = {"DINREC_TRAIN_OBJECTIVE": "pointwise", "DINREC_TRAIN_ATTENTION_HIDDEN": "[80,40]",
       "DINREC_TRAIN_ATTENTION_ACTIVATION": "prelu", "DINREC_TRAIN_MLP_ACTIVATION": "relu",
       "DINREC_TRAIN_THREADS": "1", "DINREC_TRAIN_RECALL_EPOCHS": "0", "DINREC_TRAIN_RANKING_BLEND": "false",
       "DINREC_TRAIN_EMBEDDING_OPTIMIZER": "rowwise_adagrad", "DINREC_TRAIN_EMBEDDING_LR": "0.05"}


def _train(data: Path, out: Path, *args: str, ranks: int = 1, sharding: str | None = None,
           wait: bool = True, env: dict | None = None):
    extra = {"DINREC_TRAIN_EMBEDDINGS": "sharded", "DINREC_TRAIN_EMBEDDING_SHARDING": sharding} if sharding else {}
    return dinrec_train(data, out, *args, env={**ENV, **extra, **(env or {})}, ranks=ranks, torchrun=True, wait=wait)


def _compare(one: Path, two: Path) -> tuple[float, float]:
    """Two bundles' DIN weights (every table row and dense weight): the largest difference, and the
    share of weights within 1e-5 of each other."""
    a, b = load_bundle(one).model.state_dict(), load_bundle(two).model.state_dict()
    assert a.keys() == b.keys()
    diffs = torch.cat([(a[k].float() - b[k].float()).abs().reshape(-1) for k in a])
    return float(diffs.max()), float((diffs < 1e-5).float().mean())


def test_sharded_din_on_two_ranks_matches_one_unsharded_process_on_movielens(tmp_path):
    data = shared_dataset("ml-100k")
    args = ("--epochs", "1", "--batch-size", "512")
    one = _train(data, tmp_path / "one", *args)
    samples = tmp_path / "one" / "samples"
    two = _train(samples, tmp_path / "two", *args, ranks=2, sharding="row_wise")
    assert one["world_size"] == 1 and two["world_size"] == 2 and two["embeddings"] == "sharded"
    assert one["global_step"] == two["global_step"] > 150
    assert two["test_gauc"] > 0.6  # it learned something
    assert abs(one["test_gauc"] - two["test_gauc"]) < 0.002, (one["test_gauc"], two["test_gauc"])
    # Every weight, table rows included, after 4 steps. Equal within rounding, but for a few rows whose
    # gradient is a near-cancelling sum: the two runs add it up in another order (per rank, then over the
    # ranks), and Adagrad's first step (g / |g|) carries the relative difference whole into the row. From
    # then on the runs drift (on this data 1.5e-7 after step 6, 3e-3 after step 8) while their test GAUC
    # stays within 0.002. A sharding bug moves most rows: gradients scaled twice by the world size left
    # every touched row ~1e-3 apart after one step.
    steps = ("--max-steps", "4")
    _train(samples, tmp_path / "one4", *args, *steps)
    _train(samples, tmp_path / "two4", *args, *steps, ranks=2, sharding="row_wise")
    largest, same = _compare(tmp_path / "one4" / "bundle", tmp_path / "two4" / "bundle")
    assert same > 0.99 and largest < 1e-3, (same, largest)


@pytest.mark.parametrize("sharding", ["table_wise", "column_wise", "row_wise"])
def test_each_cpu_sharding_type_trains_like_one_process(tmp_path, sharding):
    data = synthetic_dataset_dir(tmp_path / "data", n_users=200, n_items=150, n_categories=8,
                                 mean_events_per_user=20, seed=5)
    args = ("--epochs", "2", "--batch-size", "256")
    one = _train(data, tmp_path / "one", *args)
    two = _train(tmp_path / "one" / "samples", tmp_path / "two", *args, ranks=2, sharding=sharding)
    assert abs(one["test_gauc"] - two["test_gauc"]) < 0.005
    assert _compare(tmp_path / "one" / "bundle", tmp_path / "two" / "bundle")[0] < 1e-3


def test_a_sigterm_mid_run_resumes_to_the_same_weights(tmp_path):
    data = synthetic_dataset_dir(tmp_path / "data", n_users=300, n_items=150, n_categories=8,
                                 mean_events_per_user=30, seed=6)
    args = ("--epochs", "3", "--batch-size", "128", "--checkpoint-every", "5")
    whole = _train(data, tmp_path / "A", *args, ranks=2, sharding="row_wise")
    samples = tmp_path / "A" / "samples"
    b = _train(samples, tmp_path / "B", *args, ranks=2, sharding="row_wise", wait=False)
    deadline = time.monotonic() + 600
    while not (tmp_path / "B" / "checkpoints" / "latest").exists():  # training has started
        assert b.poll() is None and time.monotonic() < deadline, "training ended before it could be stopped"
        time.sleep(0.05)
    b.send_signal(signal.SIGTERM)  # torchrun passes it to both ranks; they stop at the same step
    b.communicate(timeout=300)
    ckpts = sorted(p.name for p in (tmp_path / "B" / "checkpoints").glob("step-*"))
    assert ckpts and all((tmp_path / "B" / "checkpoints" / c / "shard-00001.pt").exists() for c in ckpts)
    assert not (tmp_path / "B" / "bundle").exists()  # it stopped before the end
    resumed = _train(samples, tmp_path / "B", *args, "--resume", "auto", ranks=2, sharding="row_wise")
    assert resumed["weights_sha256"] == whole["weights_sha256"]
    a, b_ = load_bundle(tmp_path / "A" / "bundle").model, load_bundle(tmp_path / "B" / "bundle").model
    assert torch.equal(a.item_emb.weight, b_.item_emb.weight)
