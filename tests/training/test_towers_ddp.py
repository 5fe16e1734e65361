"""The recall towers under torchrun: two gloo ranks train them like one process (DDP, the same global
batches and negatives), and a SIGTERM while they train is resumed exactly by `--resume auto`."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable

import pytest
import torch

from dinrec.models.bundle import load_bundle
from tests.conftest import dinrec_train, synthetic_dataset_dir

pytestmark = pytest.mark.slow

ENV = {"DINREC_TRAIN_ATTENTION_ACTIVATION": "prelu", "DINREC_TRAIN_MLP_ACTIVATION": "relu",
       "DINREC_TRAIN_ITEM_DIM": "8", "DINREC_TRAIN_CAT_DIM": "8", "DINREC_TRAIN_THREADS": "1",
       "DINREC_TRAIN_RECALL_EPOCHS": "3", "DINREC_TRAIN_RECALL_DIM": "16", "DINREC_TRAIN_RANKING_BLEND": "false"}


def _train(data, out, *args: str, ranks: int = 1, wait: bool = True):
    return dinrec_train(data, out, "--epochs", "1", "--batch-size", "256", *args, env=ENV, ranks=ranks,
                        torchrun=True, wait=wait)


def _named(name: str) -> Callable[[str], str]:
    """assert_close's message, led by the tensor's name."""
    return lambda m: f"{name}: {m}"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return synthetic_dataset_dir(tmp_path_factory.mktemp("towers") / "data", n_users=200, n_items=150,
                                 n_categories=8, mean_events_per_user=20, seed=5)


def test_two_gloo_ranks_train_the_towers_like_one_process(data, tmp_path):
    one = _train(data, tmp_path / "one")
    two = _train(tmp_path / "one" / "samples", tmp_path / "two", ranks=2)
    assert one["recall"]["world_size"] == 1 and two["recall"]["world_size"] == 2
    assert one["recall"]["global_step"] == two["recall"]["global_step"] > 0
    assert two["recall"]["seconds"] > 0  # the towers' time is in the training JSON
    a, b = load_bundle(tmp_path / "one" / "bundle").towers, load_bundle(tmp_path / "two" / "bundle").towers
    assert a is not None and b is not None
    for (name, x), (_, y) in zip(sorted(a.state_dict().items()), sorted(b.state_dict().items()), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-3, atol=1e-4, msg=_named(name))
    assert abs(one["recall"]["test_hr"] - two["recall"]["test_hr"]) < 0.01


def test_a_sigterm_while_the_towers_train_resumes_to_the_same_towers(data, tmp_path):
    whole = _train(data, tmp_path / "A")
    samples = tmp_path / "A" / "samples"
    b = _train(samples, tmp_path / "B", "--checkpoint-every", "3", wait=False)
    deadline = time.monotonic() + 600
    while not (tmp_path / "B" / "checkpoints" / "towers" / "latest").exists():  # the towers are training
        assert b.poll() is None and time.monotonic() < deadline, "training ended before the towers could be stopped"
        time.sleep(0.02)
    b.send_signal(signal.SIGTERM)
    out_b, err_b = b.communicate(timeout=300)
    assert b.returncode == 75, err_b[-3000:]
    assert json.loads(out_b.strip().splitlines()[-1])["interrupted"] is True
    resumed = _train(samples, tmp_path / "B", "--checkpoint-every", "3", "--resume", "auto")
    assert resumed["weights_sha256"] == whole["weights_sha256"]  # DIN: its last checkpoint, unchanged
    assert resumed["recall"]["epochs"] == whole["recall"]["epochs"]
    a, c = load_bundle(tmp_path / "A" / "bundle").towers, load_bundle(tmp_path / "B" / "bundle").towers
    assert a is not None and c is not None
    for (name, x), (_, y) in zip(sorted(a.state_dict().items()), sorted(c.state_dict().items()), strict=True):
        assert torch.equal(x, y), name
