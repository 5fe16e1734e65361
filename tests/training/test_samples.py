"""The sample builder never lets the future into a history, and splits leave-one-out by time."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
import torch

from dinrec.datasets.base import Interactions
from dinrec.datasets.synthetic import SyntheticConfig, generate
from dinrec.training.data import SplitTensors
from dinrec.training.samples import SampleSet, build_samples, training_sequences


def _histories(s: SampleSet, split: str) -> list[list[str]]:
    t = SplitTensors(s, s.split(split), s.seq_len)
    b = t.batch(torch.arange(len(t)))
    return [[s.vocab.items[i] for i in row if i] for row in b.hist_items.tolist()]


def test_hand_made_log_with_a_timestamp_tie():
    data = Interactions.from_columns(["a"] * 5 + ["b"] * 2, ["i1", "i2", "i3", "i4", "i5", "i1", "i2"],
                                     ["c"] * 7, [1, 2, 2, 3, 4, 10, 11])
    s = build_samples(data, seq_len=3, negatives=1, seed=0)
    pos = lambda split: [(s.vocab.items[t], h) for t, h, y in  # noqa: E731
                         zip(s.split(split).target_item, _histories(s, split), s.split(split).label, strict=True) if y]
    # i2 and i3 share ts=2: neither sees the other. i1 has no history, so it is no target.
    assert pos("train") == [("i2", ["i1"]), ("i3", ["i1"]), ("i2", ["i1"])]  # user b has < 3 targets: train only
    assert pos("val") == [("i4", ["i1", "i2", "i3"])]
    assert pos("test") == [("i5", ["i2", "i3", "i4"])]  # capped to L=3, newest kept


def _reference(data: Interactions, seq_len: int) -> dict[str, list[tuple[str, tuple[str, ...]]]]:
    """Slow, obvious re-implementation: per user, per event, the events with a smaller ts; the last two
    targets on items new to the user are held out, and training stops before the first of them."""
    by_user = defaultdict(list)
    for u, i, t in zip(data.user_id, data.item_id, data.ts, strict=True):
        by_user[u].append((t, i))
    out: dict[str, list] = {"train": [], "val": [], "test": []}
    for u in sorted(by_user):
        events = sorted(by_user[u], key=lambda e: e[0])  # stable: ties keep file order
        per_event = [(i, tuple(x for tt, x in events if tt < t)[-seq_len:], i not in [x for _, x in events[:n]])
                     for n, (t, i) in enumerate(events)]
        targets = [(u, i, h, new) for i, h, new in per_event if h]
        new = [j for j, t in enumerate(targets) if t[3]]
        if len(targets) >= 3 and len(new) >= 2:
            out["train"] += [t[:3] for t in targets[:new[-2]]]
            out["val"].append(targets[new[-2]][:3])
            out["test"].append(targets[new[-1]][:3])
        else:
            out["train"] += [t[:3] for t in targets]
    return out


def test_vectorised_builder_matches_the_obvious_reference_with_many_ties():
    d = generate(SyntheticConfig(n_users=60, n_items=80, n_categories=6, mean_events_per_user=15, seed=5))
    d = Interactions.from_columns(d.user_id, d.item_id, d.category_id, np.floor(d.ts / 86_400) * 86_400)  # days
    s = build_samples(d, seq_len=7, negatives=2, seed=1)
    ref = _reference(d, 7)
    for split in ("train", "val", "test"):
        sp = s.split(split)
        got = [(s.users[u], s.vocab.items[t], tuple(h)) for u, t, h, y in
               zip(sp.user, sp.target_item, _histories(s, split), sp.label, strict=True) if y]
        assert sorted(got) == sorted(ref[split]), split


def test_negatives_share_the_history_and_never_equal_the_target():
    s = build_samples(generate(SyntheticConfig(n_users=50, n_items=30, n_categories=4, seed=2)), negatives=3)
    sp = s.train
    assert (sp.label.reshape(-1, 4) == [1, 0, 0, 0]).all()
    groups = sp.target_item.reshape(-1, 4)
    assert (groups[:, 1:] != groups[:, :1]).all()
    assert (sp.hist_end.reshape(-1, 4) == sp.hist_end.reshape(-1, 4)[:, :1]).all()
    assert (sp.target_cat == s.vocab.item_category[sp.target_item]).all()


def test_popularity_drawn_negatives_follow_the_counts_and_evaluation_stays_uniform():
    data = generate(SyntheticConfig(n_users=200, n_items=300, n_categories=6, zipf_s=1.3, seed=5))
    uniform, popular = build_samples(data, negatives=4), build_samples(data, negatives=4, negative_power=1.0)
    counts = np.bincount(popular.seq_items, minlength=popular.vocab.n_items)

    def mean_count(split):
        return counts[split.target_item[split.label == 0]].mean()

    assert mean_count(popular.train) > 2 * mean_count(uniform.train)  # negatives as popular as they are
    assert mean_count(popular.test) < 1.3 * mean_count(uniform.test)  # evaluation: uniform either way
    groups = popular.train.target_item.reshape(-1, 5)
    assert (groups[:, 1:] != groups[:, :1]).all() and (groups > 0).all()  # never the target, never padding


def test_test_targets_are_never_earlier_than_train_targets_of_the_same_user():
    s = build_samples(generate(SyntheticConfig(n_users=80, n_items=100, seed=4)))
    # a positive's history ends where its own (user, ts) group starts, so seq_ts[hist_end] is its time
    first_train: defaultdict[int, float] = defaultdict(lambda: -np.inf)
    for u, e, y in zip(s.train.user, s.train.hist_end, s.train.label, strict=True):
        if y:
            first_train[u] = max(first_train[u], s.seq_ts[e])
    for split in (s.val, s.test):
        for u, e, y in zip(split.user, split.hist_end, split.label, strict=True):
            if y:
                assert s.seq_ts[e] >= first_train[u]


def test_save_load_round_trip(tmp_path):
    s = build_samples(generate(SyntheticConfig(n_users=30, n_items=40, seed=9)), seq_len=20)
    back = SampleSet.load(s.save(tmp_path / "samples"))
    assert back.seq_len == 20 and back.fingerprint == s.fingerprint and back.vocab.items == s.vocab.items
    for split in ("train", "val", "test"):
        for f in ("user", "hist_end", "hist_len", "target_item", "target_cat", "label"):
            assert np.array_equal(getattr(back.split(split), f), getattr(s.split(split), f))


def test_bad_arguments_are_refused():
    d = generate(SyntheticConfig(n_users=5, n_items=5, seed=0))
    with pytest.raises(ValueError, match="seq_len"):
        build_samples(d, seq_len=0)
    with pytest.raises(ValueError, match="no behaviours"):
        build_samples(Interactions.from_columns(["u"], ["i"], ["c"], [1.0], event_type="impression"))


def test_held_out_targets_are_items_new_to_the_user_and_training_stops_before_them():
    """A log with repeats: the test target is the user's last behaviour on a new item, the validation
    target the one before; repeats after the validation target are the future and never train."""
    rows = [("u", "a", 1), ("u", "b", 2), ("u", "c", 3), ("u", "d", 4), ("u", "b", 5), ("u", "e", 6),
            ("u", "a", 7), ("u", "e", 8),  # the newest two are repeats
            ("v", "x", 1), ("v", "y", 2)]
    data = Interactions.from_columns([r[0] for r in rows], [r[1] for r in rows], ["c"] * len(rows),
                                     [float(r[2]) for r in rows], event_type="click")
    s = build_samples(data, seq_len=10, negatives=1, eval_negatives=1)
    item = lambda split: [s.vocab.items[i] for i in s.split(split).target_item[s.split(split).label == 1]]  # noqa: E731
    assert item("test") == ["e"] and item("val") == ["d"]
    assert sorted(item("train")) == ["b", "c", "y"]  # u before d; v (too few targets) trains only


def test_co_visitation_sequences_hold_each_users_behaviours_before_validation_first_ones_included():
    data = Interactions.from_columns(["a"] * 5 + ["b"] * 3, ["i1", "i2", "i3", "i4", "i5", "x", "y", "z"],
                                     ["c"] * 8, [1, 2, 2, 3, 4, 10, 11, 11])
    s = build_samples(data, seq_len=3, negatives=1, seed=0)
    seqs = [[s.vocab.items[i] for i in seq] for seq in training_sequences(s)]
    # a: validation target i4 (ts 3), so i1..i3 (i1 is no target, but a behaviour); b: no holdout, all of it.
    assert seqs == [["i1", "i2", "i3"], ["x", "y", "z"]]


def test_co_visitation_sequences_match_the_obvious_reference_with_many_ties():
    d = generate(SyntheticConfig(n_users=60, n_items=80, n_categories=6, mean_events_per_user=15, seed=5))
    d = Interactions.from_columns(d.user_id, d.item_id, d.category_id, np.floor(d.ts / 86_400) * 86_400)  # days
    s = build_samples(d, seq_len=50, negatives=1, seed=1)
    val_ts = {s.users[u]: s.seq_ts[e] for u, e in zip(s.val.user, s.val.hist_end, strict=True)}
    by_user = defaultdict(list)
    for u, i, t in zip(d.user_id, d.item_id, d.ts, strict=True):
        by_user[u].append((t, i))
    expected = []
    for u in sorted(by_user):
        events = sorted(by_user[u], key=lambda e: e[0])
        if len({t for t, _ in events}) < 2:
            continue  # no training target at all
        expected.append([i for t, i in events if t < val_ts.get(u, np.inf)])
    assert [[s.vocab.items[i] for i in seq] for seq in training_sequences(s)] == expected
