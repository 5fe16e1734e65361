"""The recall towers: what the model promises (padding, unit vectors, cold items through their
category), that training finds more than popularity does, and that a bundle keeps them."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dinrec.datasets.synthetic import SyntheticConfig, generate
from dinrec.events.long_tail import head_size
from dinrec.models.bundle import load_bundle
from dinrec.models.din import DIN, DINConfig
from dinrec.models.recall import RecallSpace
from dinrec.models.towers import Towers, TowersConfig
from dinrec.retrieval.baselines import Popularity, hit_rate
from dinrec.training.export import export_bundle
from dinrec.training.run import train_towers
from dinrec.training.samples import build_samples, training_sequences
from dinrec.training.towers_train import TowersSettings


@pytest.fixture(scope="module")
def towers() -> Towers:
    torch.manual_seed(0)
    return Towers(TowersConfig(n_items=30, n_categories=5, dim=8, seq_len=6)).eval()


def test_left_padding_changes_nothing_and_vectors_are_unit(towers):
    short = towers.users(torch.tensor([[3, 4, 5]]), torch.tensor([[1, 2, 2]]))
    padded = towers.users(torch.tensor([[0, 0, 0, 3, 4, 5]]), torch.tensor([[0, 0, 0, 1, 2, 2]]))
    assert torch.allclose(short, padded, atol=1e-6)
    assert torch.allclose(short.norm(dim=1), torch.ones(1))
    other = towers.users(torch.tensor([[5, 4, 3]]), torch.tensor([[2, 2, 1]]))
    assert not torch.allclose(short, other)  # order matters: newer behaviours weigh differently


def test_an_item_the_model_never_saw_is_placed_by_its_category(towers):
    cold = towers.items(torch.tensor([0, 0]), torch.tensor([3, 4]))  # (2, D)
    expected = torch.nn.functional.normalize(towers.cat_emb.weight[3:5], dim=1)
    assert torch.allclose(cold, expected, atol=1e-6) and not torch.allclose(cold[0], cold[1])


@pytest.fixture(scope="module")
def samples():
    data = generate(SyntheticConfig(n_users=400, n_items=300, n_categories=10, mean_events_per_user=25, seed=3))
    return build_samples(data, seq_len=20)


def test_trained_towers_find_the_next_item_better_than_popularity(samples):
    result = train_towers(samples, TowersSettings(dim=16, epochs=6, eval_n=50))
    rows = np.flatnonzero(samples.test.label == 1)
    cases = [(samples.seq_items[e - n:e].tolist(), int(t)) for e, n, t in
             zip(samples.test.hist_end[rows], samples.test.hist_len[rows], samples.test.target_item[rows], strict=True)]
    counts = np.bincount(samples.train.target_item[samples.train.label == 1], minlength=samples.vocab.n_items)
    popular = hit_rate(Popularity(counts).recall, cases, [50])["hr@50"]
    assert result.metrics["test_hr"] > 1.2 * popular, (result.metrics, popular)
    assert result.metrics["softmax"] == "full" and 0 <= result.metrics["best_epoch"] < 6


def test_sampled_softmax_trains_too(samples):
    result = train_towers(samples, TowersSettings(dim=16, epochs=2, eval_n=50, full_softmax_items=10,
                                                  sampled_negatives=64))
    assert result.metrics["softmax"] == "sampled" and result.metrics["test_hr"] > 0.1


def test_a_bundle_keeps_its_towers_and_recalls_with_them(samples, tmp_path):
    din = DIN(DINConfig(n_items=samples.vocab.n_items, n_categories=len(samples.vocab.categories), item_dim=8,
                        cat_dim=8)).eval()
    towers = train_towers(samples, TowersSettings(dim=16, epochs=1)).model
    assert towers is not None
    with_towers = load_bundle(export_bundle(tmp_path / "a", din, samples, {"seq_len": 20}, towers=towers))
    without = load_bundle(export_bundle(tmp_path / "b", din, samples, {"seq_len": 20}))
    hist, cats = torch.tensor([[5, 6, 7]]), torch.tensor([[1, 1, 2]])
    space = RecallSpace(with_towers.model, with_towers.towers, with_towers.vocab.item_category)
    assert space.kind == "towers" and space.dim == 16
    assert np.allclose(space.queries(hist, cats), towers.users(hist, cats).detach().numpy(), atol=1e-6)
    assert with_towers.item_index_info["space"] == "towers"
    # Counts are the training behaviours' (before each user's validation target): no held-out one counts.
    counts = with_towers.item_counts
    assert counts is not None
    assert counts.sum() == sum(len(s) for s in training_sequences(samples)) < len(samples.seq_items)
    tail = with_towers.long_tail()  # what the serving lane treats as long tail: all but the top fifth
    assert tail is not None
    seen = int((counts > 0).sum())
    assert not tail[0] and int((~tail[1:]).sum()) == head_size(seen) == math.ceil(0.2 * seen)
    assert not tail[int(np.argmax(counts))]
    legacy = RecallSpace(without.model, without.towers, without.vocab.item_category)
    assert legacy.kind == "din_mean" and legacy.cold_item_vectors(torch.tensor([1])) is None
    mean = din.item_emb.weight[[5, 6, 7]].mean(dim=0).detach().numpy()
    assert np.allclose(legacy.queries(hist, cats)[0], mean, atol=1e-6)


def test_stopped_towers_resume_to_the_weights_of_an_uninterrupted_run(samples, tmp_path):
    from dinrec.training.checkpoint import open_checkpoint_store
    from dinrec.training.loop import TrainingInterrupted
    from tests.training.test_resume import StopAfter

    settings = TowersSettings(dim=16, epochs=3, eval_n=50, batch_size=128, full_softmax_items=10,
                              sampled_negatives=64, checkpoint_every=4)  # sampled: the negatives' generator too
    whole = train_towers(samples, settings)
    store = open_checkpoint_store(tmp_path)
    with pytest.raises(TrainingInterrupted) as stopped:
        train_towers(samples, settings, checkpoints=store, stop=StopAfter(17))  # mid-epoch, between checkpoints
    assert stopped.value.checkpoint == "step-000000018" and store.part("towers").latest() == "step-000000018"
    assert store.latest() is None  # DIN's checkpoints are elsewhere in the store
    resumed = train_towers(samples, settings, checkpoints=store, resume="auto")
    assert resumed.metrics["global_step"] == whole.metrics["global_step"]
    assert whole.model is not None and resumed.model is not None
    for (name, a), (_, b) in zip(whole.model.state_dict().items(), resumed.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert resumed.metrics["epochs"] == whole.metrics["epochs"] and resumed.metrics["seconds"] > 0


def test_every_towers_setting_is_reachable_from_the_training_settings(monkeypatch):
    """`dinrec train` reaches each of the towers' settings (a DINREC_TRAIN_RECALL_* variable or one DIN shares),
    and its defaults are the towers' own."""
    import dataclasses

    from dinrec.training.settings import TrainSettings
    from dinrec.training.towers_train import towers_settings

    assert towers_settings(TrainSettings(device="cpu")) == TowersSettings()
    monkeypatch.setenv("DINREC_TRAIN_RECALL_TEMPERATURE", "0.2")
    assert towers_settings(TrainSettings(device="cpu")).temperature == 0.2
    moved = towers_settings(TrainSettings(
        device="cpu", recall_dim=16, recall_epochs=3, recall_batch_size=64, recall_lr=0.01, recall_weight_decay=0.1,
        recall_full_softmax_items=10, recall_sampled_negatives=100, recall_eval_n=50, recall_patience=5,
        checkpoint_every=7, seed=3, embedding_lr=0.1, embeddings="sharded",
        embedding_sharding="row_wise", objective="pointwise"))
    unmoved = [f.name for f in dataclasses.fields(TowersSettings)
               if f.name != "device" and getattr(moved, f.name) == getattr(TowersSettings(), f.name)]
    assert unmoved == []
