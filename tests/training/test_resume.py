"""Exact resume: a run stopped at any step and resumed ends with bitwise the same weights."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from dinrec.datasets.synthetic import SyntheticConfig, generate
from dinrec.models.kernels import kernels_enabled
from dinrec.training.checkpoint import CheckpointError, open_checkpoint_store
from dinrec.training.loop import Trainer, TrainingInterrupted
from dinrec.training.run import train
from dinrec.training.samples import build_samples
from dinrec.training.settings import TrainSettings
from tests.conftest import REPO, synthetic_dataset_dir


class StopAfter(threading.Event):
    """An Event that reads as set from the n-th check on: a SIGTERM landing at a chosen step."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def is_set(self) -> bool:
        self.n -= 1
        return self.n < 0 or super().is_set()


@pytest.fixture(scope="module")
def samples():
    return build_samples(generate(SyntheticConfig(n_users=150, n_items=120, n_categories=8, seed=21)), seq_len=15)


def settings(**kw) -> TrainSettings:
    base = dict(epochs=3, batch_size=256, item_dim=8, cat_dim=4, progress=False, patience=2, mba_l2=1e-4,
                warmup_steps=5, attention_activation="dice", mlp_activation="dice", objective="pointwise")
    return TrainSettings(**{**base, **kw})


def test_interrupted_and_resumed_equals_uninterrupted_bitwise(samples, tmp_path):
    full = train(samples, settings(), checkpoints=open_checkpoint_store(tmp_path / "a"))
    n_steps = full.metrics["global_step"]
    rng = random.Random(7)
    for stop_at in sorted({rng.randrange(1, n_steps), rng.randrange(1, n_steps)}):
        store = open_checkpoint_store(tmp_path / f"b{stop_at}", keep=2)
        with pytest.raises(TrainingInterrupted) as info:
            train(samples, settings(), checkpoints=store, stop=StopAfter(stop_at))
        assert info.value.checkpoint == store.latest() == f"step-{stop_at + 1:09d}"  # it finishes the step
        resumed = train(samples, settings(), checkpoints=store, resume="auto")
        assert resumed.metrics["weights_sha256"] == full.metrics["weights_sha256"], f"stopped at step {stop_at}"
        assert resumed.metrics["test_gauc"] == full.metrics["test_gauc"]
        assert len(store.names()) <= 2  # rotation keeps the newest N


def test_resume_refuses_other_data_or_settings(samples, tmp_path):
    store = open_checkpoint_store(tmp_path)
    train(samples, settings(epochs=1), checkpoints=store)
    with pytest.raises(CheckpointError, match="lr: 0.001 -> 0.01"):
        Trainer(samples, settings(lr=0.01), checkpoints=store).resume("auto")
    other = build_samples(generate(SyntheticConfig(n_users=150, n_items=120, n_categories=8, seed=22)), seq_len=15)
    with pytest.raises(CheckpointError, match="different data"):
        Trainer(other, settings(), checkpoints=store).resume("auto")
    # more epochs is fine: training continues from where it ended
    longer = Trainer(samples, settings(epochs=2), checkpoints=store)
    assert longer.resume("auto") is not None and longer.progress.epoch == 1


def test_incomplete_and_foreign_checkpoints_are_never_used(samples, tmp_path):
    store = open_checkpoint_store(tmp_path)
    train(samples, settings(epochs=1), checkpoints=store)
    good = store.latest()
    assert good is not None
    (tmp_path / "step-999999999").mkdir()  # a crash mid-write leaves a folder without meta.json
    (tmp_path / "step-999999999" / "state.pt").write_bytes(b"partial")
    assert store.latest() == good
    # a state.pt that would run code when unpickled is refused (weights_only loading)
    import pickle

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    (tmp_path / good / "state.pt").write_bytes(pickle.dumps({"model": Evil()}))
    with pytest.raises(CheckpointError, match="cannot be loaded safely"):
        store.load(good)
    meta = json.loads((tmp_path / good / "meta.json").read_text())
    (tmp_path / good / "meta.json").write_text(json.dumps({**meta, "format_version": 7}))
    with pytest.raises(CheckpointError, match="version 7"):
        store.load(good)


def test_with_a_key_only_checkpoints_it_signed_are_resumed(tmp_path):
    """A spot job's checkpoints are signed with its key: another job's instance (which may write here) can
    neither plant a checkpoint nor change one, whole or a shard of it."""
    mine = open_checkpoint_store(tmp_path, key="a" * 64)
    state = {"model": {"w": torch.arange(4.0)}, "step": 3}
    mine.save("step-000000003", state, {"seed": 1})
    mine.save_shard("step-000000003", 1, b"rank one's tables")
    assert mine.load("step-000000003")[0]["step"] == 3
    theirs = open_checkpoint_store(tmp_path, key="b" * 64)
    with pytest.raises(CheckpointError, match="not signed with this job's key"):
        theirs.load("step-000000003")
    open_checkpoint_store(tmp_path).save("step-000000009", {"model": {"w": torch.zeros(4)}}, {"seed": 1})  # unsigned
    assert mine.latest() == "step-000000009"  # the pointer moved: resuming from it is refused
    with pytest.raises(CheckpointError, match="not signed"):
        mine.load("step-000000009")
    (tmp_path / "step-000000003" / "shard-00001.pt").write_bytes(b"planted tables")
    with pytest.raises(CheckpointError, match="shard-00001: not signed"):
        mine.load_shard("step-000000003", 1)
    import io

    buf = io.BytesIO()
    torch.save({"model": {"w": torch.ones(4)}, "step": 3}, buf)
    (tmp_path / "step-000000003" / "state.pt").write_bytes(buf.getvalue())  # loads fine, but was changed
    with pytest.raises(CheckpointError, match="not signed"):
        mine.load("step-000000003")
    assert open_checkpoint_store(tmp_path).load("step-000000003")[0]["step"] == 3  # without a key: not checked


def _cli_train(out, data, *extra, env=None):
    return subprocess.Popen([sys.executable, "-m", "dinrec.cli.main", "train", "--data", str(data), "--out", str(out),
                             "--epochs", "2", "--batch-size", "128", "--recall-epochs", "3", "--no-progress", *extra],
                            cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.slow
def test_sigterm_then_resume_auto_from_the_command_line(tmp_path):
    data = synthetic_dataset_dir(tmp_path / "data", n_users=400, n_items=300, n_categories=12,
                                 mean_events_per_user=30, seed=3)

    a = _cli_train(tmp_path / "A", data)
    out_a, err_a = a.communicate(timeout=600)
    assert a.returncode == 0, err_a[-2000:]
    sha_a = json.loads(out_a.strip().splitlines()[-1])["weights_sha256"]

    b = _cli_train(tmp_path / "B", data, "--checkpoint-every", "10")
    ckpts = tmp_path / "B" / "checkpoints"
    deadline = time.monotonic() + 300
    while not (ckpts / "latest").exists():  # training has started once the first checkpoint lands
        assert b.poll() is None and time.monotonic() < deadline, "training ended before it could be stopped"
        time.sleep(0.05)
    time.sleep(random.uniform(0.0, 1.0))  # then stop it at an arbitrary step
    b.send_signal(signal.SIGTERM)
    out_b, err_b = b.communicate(timeout=300)
    assert b.returncode == 75, err_b[-2000:]
    assert json.loads(out_b.strip().splitlines()[-1])["interrupted"] is True

    c = _cli_train(tmp_path / "B", tmp_path / "B" / "samples", "--resume", "auto")
    out_c, err_c = c.communicate(timeout=600)
    assert c.returncode == 0, err_c[-2000:]
    assert json.loads(out_c.strip().splitlines()[-1])["weights_sha256"] == sha_a


def test_weights_hash_is_stable_for_identical_runs(samples):
    a = train(samples, settings(epochs=1))
    b = train(samples, settings(epochs=1))
    assert a.metrics["weights_sha256"] == b.metrics["weights_sha256"]
    assert a.model is not None and b.model is not None
    assert torch.equal(a.model.item_emb.weight, b.model.item_emb.weight)


def test_sparse_embeddings_train_and_resume_exactly(samples, tmp_path):
    kw = dict(sparse_embeddings=True, epochs=2)
    full = train(samples, settings(**kw))
    assert full.model is not None and full.model.item_emb.sparse and full.metrics["test_auc"] > 0.5
    store = open_checkpoint_store(tmp_path)
    with pytest.raises(TrainingInterrupted):
        train(samples, settings(**kw), checkpoints=store, stop=StopAfter(30))
    resumed = train(samples, settings(**kw), checkpoints=store, resume="auto")
    assert resumed.metrics["weights_sha256"] == full.metrics["weights_sha256"]


def test_listwise_interrupted_mid_epoch_and_resumed_equals_uninterrupted_bitwise(samples, tmp_path):
    """The listwise objective (the default): towers, lanes and DIN through the pipeline, stopped at a step
    of DIN's second epoch (the negatives a step draws come from (seed, epoch, step); the MLP's dropout draws
    from torch's generator, which the checkpoint keeps)."""
    from dinrec.training.pipeline import train_bundle

    def listwise() -> TrainSettings:
        return TrainSettings(epochs=3, batch_size=64, item_dim=8, cat_dim=4, progress=False, patience=0,
                             recall_epochs=2, recall_dim=8, list_negatives=8, guard_folds=2, attention_hidden=(8,),
                             mlp_hidden=(16,), dropout=0.2)

    full = train_bundle(samples, listwise(), tmp_path / "x", run_dir=tmp_path / "a", export=False)
    # The default path: the fused listwise unit, or PyTorch's ops in the kernels-off tier (DINREC_KERNELS=off)
    assert full.result.metrics["objective"] == "listwise"
    assert full.result.metrics["fused_kernel"] == kernels_enabled()
    steps = full.result.metrics["global_step"]
    towers_checks = 2 * (len(samples.train.label) // 2 // 512 + 1)  # is_set() calls the towers make first (≥)
    store = open_checkpoint_store(tmp_path / "b" / "checkpoints")
    with pytest.raises(TrainingInterrupted):
        train_bundle(samples, listwise(), tmp_path / "y", checkpoints=store, export=False,
                     stop=StopAfter(towers_checks + steps // 2))
    resumed = train_bundle(samples, listwise(), tmp_path / "y", checkpoints=store, resume="auto",
                           export=False)
    assert resumed.result.metrics["resumed_from"] is not None
    assert resumed.result.metrics["weights_sha256"] == full.result.metrics["weights_sha256"]
