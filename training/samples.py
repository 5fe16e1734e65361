"""Point-in-time training samples, stored jagged.

For each user, events are ordered by time. Every behaviour is a positive *target*; its history is
the user's behaviours **strictly before** the target's timestamp (so an event at the same second
or later can never leak in), newest ``seq_len`` kept. Each positive gets ``negatives`` sampled
items that share its history. Leave-one-out by time per user: the last eligible positive is the
test target, the second last the validation target, the rest are training targets. Where a log
has repeats, the held-out targets are the user's last two behaviours on items new to them, and
the user trains only on what came before the validation target.

Histories are not copied per sample. The user's time-ordered behaviours are concatenated into
``seq_items``/``seq_cats`` and a sample stores where its history *ends* and how long it is::

    seq_items: [u0e0 u0e1 u0e2 u0e3 | u1e0 u1e1 ...]     (one flat array, users back to back)
    sample (user 0, target u0e3): hist_end=3, hist_len=3 -> history = seq_items[0:3]

and :func:`training.data.gather_history` turns (hist_end, hist_len) into a left-padded (B, L) block
with one fancy-index per batch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dinrec.datasets.base import Interactions
from dinrec.models.vocab import Vocab

SAMPLES_FORMAT_VERSION = 2  # 2: user_offsets


@dataclass(frozen=True)
class Split:
    """One split's samples (parallel arrays, one row per sample)."""

    user: np.ndarray  # (N,) int64 user index
    hist_end: np.ndarray  # (N,) int64 exclusive end of the history in seq_items
    hist_len: np.ndarray  # (N,) int64 in [0, seq_len]
    target_item: np.ndarray  # (N,) int64
    target_cat: np.ndarray  # (N,) int64
    label: np.ndarray  # (N,) float32, 1 = the behaviour happened, 0 = a sampled negative

    FIELDS = ("user", "hist_end", "hist_len", "target_item", "target_cat", "label")

    def __len__(self) -> int:
        return len(self.label)


@dataclass(frozen=True)
class SampleSet:
    vocab: Vocab
    users: list[str]
    seq_items: np.ndarray  # (E,) int64
    seq_cats: np.ndarray  # (E,) int64
    seq_ts: np.ndarray  # (E,) float64: behaviour times (leakage checks, time gaps, the served history's ts)
    user_offsets: np.ndarray  # (U + 1,) int64: user u's behaviours are seq_*[user_offsets[u]:user_offsets[u + 1]]
    train: Split
    val: Split
    test: Split
    seq_len: int
    negatives: int
    source: str
    fingerprint: str

    def split(self, name: str) -> Split:
        return {"train": self.train, "val": self.val, "test": self.test}[name]

    def before(self, split: Split, row: int) -> slice:
        """Where every behaviour of ``split``'s ``row``'s user before its target lies in seq_* (the whole
        history, not only the ``seq_len`` newest its sample reads)."""
        return slice(int(self.user_offsets[split.user[row]]), int(split.hist_end[row]))

    # ------------------------------------------------------------------ on disk
    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for name in ("seq_items", "seq_cats", "seq_ts", "user_offsets"):
            np.save(folder / f"{name}.npy", getattr(self, name))
        for split in ("train", "val", "test"):
            for f in Split.FIELDS:
                np.save(folder / f"{split}.{f}.npy", getattr(self.split(split), f))
        (folder / "vocab.json").write_text(json.dumps(self.vocab.to_json()))
        (folder / "users.json").write_text(json.dumps(self.users))
        meta = {"format": "dinrec-samples", "format_version": SAMPLES_FORMAT_VERSION, "seq_len": self.seq_len,
                "negatives": self.negatives, "source": self.source, "fingerprint": self.fingerprint,
                "sizes": {s: len(self.split(s)) for s in ("train", "val", "test")}}
        (folder / "samples.json").write_text(json.dumps(meta, indent=1))
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> SampleSet:
        folder = Path(folder)
        meta = json.loads((folder / "samples.json").read_text())
        if meta.get("format") != "dinrec-samples" or meta.get("format_version") != SAMPLES_FORMAT_VERSION:
            raise ValueError(f"{folder}: not a dinrec sample set of format version {SAMPLES_FORMAT_VERSION}")
        splits = {s: Split(**{f: np.load(folder / f"{s}.{f}.npy") for f in Split.FIELDS})
                  for s in ("train", "val", "test")}
        return cls(vocab=Vocab.from_json(json.loads((folder / "vocab.json").read_text())),
                   users=json.loads((folder / "users.json").read_text()),
                   seq_items=np.load(folder / "seq_items.npy"), seq_cats=np.load(folder / "seq_cats.npy"),
                   seq_ts=np.load(folder / "seq_ts.npy"), user_offsets=np.load(folder / "user_offsets.npy"),
                   **splits, seq_len=meta["seq_len"],
                   negatives=meta["negatives"], source=meta["source"], fingerprint=meta["fingerprint"])


def training_sequences(samples: SampleSet) -> list[np.ndarray]:
    """Each user's behaviours strictly before their validation target (all of them for users without
    one), oldest first: what may be learned from — the sequences item-to-item co-visitation is fitted on,
    the counts popularity and the long tail are read from. A user's first behaviours (those at the first
    timestamp) are no training *target* — they have no history — but are behaviours like any other here:
    sequences of training targets alone would drop every session's first click, the pair short-session
    logs (DIGINETICA) learn most from."""
    return [samples.seq_items[a:b] for a, b in zip(samples.user_offsets[:-1].tolist(), training_ends(samples).tolist(),
                                                   strict=True) if b > a]


def training_ends(samples: SampleSet) -> np.ndarray:
    """(U,) where each user's training behaviours end in seq_*: at their validation target's timestamp, or
    after their last behaviour."""
    val = samples.val
    rows = np.flatnonzero(val.label == 1)
    ends = samples.user_offsets[1:].copy()
    ends[val.user[rows]] = val.hist_end[rows]
    return ends


def is_sample_dir(path: str | Path) -> bool:
    return (Path(path) / "samples.json").is_file()


def build_samples(data: Interactions, *, seq_len: int = 50, negatives: int = 1, eval_negatives: int | None = None,
                  seed: int = 0, negative_power: float = 0.0) -> SampleSet:
    """``eval_negatives`` (default: ``negatives``) per validation/test positive: more of them make
    AUC and GAUC far less noisy, since each user holds out a single positive.

    Training negatives are drawn with probability ∝ count^``negative_power`` over the training
    behaviours (0: uniform; 0.75: word2vec's). Against uniform negatives a model gets far by learning
    popularity alone; against popular ones it must learn who likes what. Validation and test
    negatives stay uniform, so AUC means the same whatever the training draw."""
    eval_negatives = negatives if eval_negatives is None else eval_negatives
    if eval_negatives < 1:
        raise ValueError("eval_negatives must be >= 1")
    if seq_len < 1:
        raise ValueError("seq_len must be >= 1")
    if negatives < 1:
        raise ValueError("negatives must be >= 1")
    b = data.behaviours()
    if len(b) == 0:
        raise ValueError(f"{data.source}: no behaviours to learn from")

    items, item_idx = np.unique(b.item_id, return_inverse=True)
    cats, cat_idx = np.unique(b.category_id, return_inverse=True)
    users, user_idx = np.unique(b.user_id, return_inverse=True)
    item_idx, cat_idx = item_idx + 1, cat_idx + 1  # 0 is padding
    item_category = np.zeros(len(items) + 1, dtype=np.int64)
    item_category[item_idx] = cat_idx

    order = np.lexsort((b.ts, user_idx))  # by user, then time (stable: ties keep file order)
    u, ts = user_idx[order], b.ts[order]
    seq_items, seq_cats = item_idx[order].astype(np.int64), cat_idx[order].astype(np.int64)
    n = len(order)
    pos = np.arange(n)

    user_start = np.flatnonzero(np.r_[True, u[1:] != u[:-1]])  # first position of each user
    start_of = np.repeat(user_start, np.diff(np.r_[user_start, n]))  # (n,) user start per position
    # A history ends at the first event of the target's (user, ts) group: strictly earlier events only.
    group_start = np.flatnonzero(np.r_[True, (u[1:] != u[:-1]) | (ts[1:] != ts[:-1])])
    hist_end = np.repeat(group_start, np.diff(np.r_[group_start, n]))
    n_before = hist_end - start_of
    hist_len = np.minimum(n_before, seq_len)

    # Leave-one-out by time among targets that have at least one earlier behaviour and, where the log
    # has repeats, whose item is new to the user: a served list never repeats what the user already
    # took (the seen-item policy), so a repeat could never be found and would only blur the measure.
    eligible = n_before >= 1
    first_time = np.zeros(n, dtype=bool)
    by_user_item = np.lexsort((pos, seq_items, u))
    first_time[by_user_item[np.r_[True, (u[by_user_item][1:] != u[by_user_item][:-1])
                                  | (seq_items[by_user_item][1:] != seq_items[by_user_item][:-1])]]] = True
    holdout = eligible & first_time
    held_pos, held_user = pos[holdout], u[holdout]
    last_of_user = np.r_[held_user[1:] != held_user[:-1], True]
    group_id = np.cumsum(np.r_[True, held_user[1:] != held_user[:-1]]) - 1
    ends = np.flatnonzero(last_of_user)
    rank_from_end = ends[group_id] - np.arange(len(held_pos))  # 0 = the user's last new item
    # Users with fewer than 3 eligible targets (new items or repeats) train only.
    eligible_per_user = np.bincount(u[eligible], minlength=len(users))
    enough = (np.bincount(group_id)[group_id] >= 2) & (eligible_per_user[held_user] >= 3)
    test_pos = held_pos[enough & (rank_from_end == 0)]
    val_pos = held_pos[enough & (rank_from_end == 1)]
    # Training targets: the rest, strictly before the user's validation target (a repeat after it
    # is the future); users without a holdout train on everything.
    val_of_user = np.full(len(users), n, dtype=np.int64)
    val_of_user[u[val_pos]] = val_pos
    train_pos = pos[eligible & (pos < val_of_user[u])]
    rng = np.random.default_rng(seed)
    n_items = len(items) + 1
    weights = np.bincount(seq_items[train_pos], minlength=n_items).astype(np.float64) ** negative_power
    weights[0] = 0.0
    cdf = np.cumsum(weights) / weights.sum() if negative_power and weights.sum() > 0 else None

    def draw(n: int, popular: bool) -> np.ndarray:
        if popular and cdf is not None:
            return np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), n_items - 1)
        return rng.integers(1, n_items, size=n)

    def make(split_pos: np.ndarray, k: int, popular: bool = False) -> Split:
        rep = np.repeat(split_pos, 1 + k)  # each positive then its k negatives
        target = seq_items[rep].copy()
        is_neg = np.tile(np.r_[False, np.ones(k, dtype=bool)], len(split_pos))
        neg = draw(int(is_neg.sum()), popular)
        clash = neg == target[is_neg]
        while clash.any():  # never label the true target as a negative
            neg[clash] = draw(int(clash.sum()), popular)
            clash = neg == target[is_neg]
        target[is_neg] = neg
        return Split(user=u[rep].astype(np.int64), hist_end=hist_end[rep].astype(np.int64),
                     hist_len=hist_len[rep].astype(np.int64), target_item=target.astype(np.int64),
                     target_cat=item_category[target], label=(~is_neg).astype(np.float32))

    return SampleSet(vocab=Vocab(["<pad>", *items.tolist()], ["<pad>", *cats.tolist()], item_category),
                     users=users.tolist(), seq_items=seq_items, seq_cats=seq_cats, seq_ts=ts,
                     user_offsets=np.r_[user_start, n].astype(np.int64),
                     train=make(train_pos, negatives, popular=True), val=make(val_pos, eval_negatives),
                     test=make(test_pos, eval_negatives), seq_len=seq_len,
                     negatives=negatives, source=data.source, fingerprint=data.fingerprint())
