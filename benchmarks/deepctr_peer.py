"""DeepCTR-Torch's DIN, fed the very same samples as dinrec (the optional `bench` extra).

DeepCTR takes padded histories with a length column and right-padding (its attention masks the
first `seq_length` positions), so dinrec's left-padded histories are re-aligned here; the items,
categories, targets, labels, split and negatives are identical.

DeepCTR's DIN is pointwise: it learns from labelled rows. Against dinrec's listwise objective it gets
the lists dinrec trained on — each training positive with the negatives dinrec drew for it at that step
— as one row per candidate (label 1 for the positive), epoch by epoch in dinrec's order
(:func:`list_rows`).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterable

import numpy as np
import torch

from dinrec.training.data import SplitTensors
from dinrec.training.samples import SampleSet, Split

# One epoch's training rows, in chunks: (DeepCTR's inputs, labels) each.
Rows = tuple[dict[str, np.ndarray], np.ndarray]
EpochRows = Callable[[int], Iterable[Rows]]


def _right_padded(hist_items: torch.Tensor, hist_cats: torch.Tensor) -> dict[str, np.ndarray]:
    """(N, L) left-padded histories → DeepCTR's right-padded ones and their lengths."""
    seq_len = hist_items.shape[1]
    lengths = (hist_items != 0).sum(1)  # (N,)
    # roll each row left by its padding
    shift = seq_len - lengths  # (N,)
    idx = (torch.arange(seq_len).unsqueeze(0) + shift.unsqueeze(1)) % seq_len  # (N, L)
    return {"hist_item_id": torch.gather(hist_items, 1, idx).numpy(),
            "hist_cate_id": torch.gather(hist_cats, 1, idx).numpy(), "seq_length": lengths.numpy()}


def _inputs(samples: SampleSet, split: Split, seq_len: int) -> dict[str, np.ndarray]:
    t = SplitTensors(samples, split, seq_len)
    b = t.batch(torch.arange(len(t)))
    return {"item_id": b.target_item.numpy(), "cate_id": b.target_cat.numpy(),
            **_right_padded(b.hist_items, b.hist_cats)}


def list_rows(samples: SampleSet, seq_len: int, lists: list[tuple[np.ndarray, torch.Tensor, torch.Tensor]]) -> Rows:
    """dinrec's training lists as DeepCTR's rows. ``lists``: per step, the training rows of its positives (B,),
    their candidates (B, N) — the positive first, then its negatives — and which of them the loss counted
    (B, N) bool; each counted candidate becomes a row with its list's history, label 1 for the positive."""
    rows = np.concatenate([r for r, _, _ in lists])
    cand = torch.cat([c for _, c, _ in lists])  # (S, N)
    valid = torch.cat([v for _, _, v in lists])  # (S, N)
    t = SplitTensors(samples, samples.train, seq_len)
    b = t.batch(torch.from_numpy(rows))
    which, slot = valid.nonzero(as_tuple=True)  # (R,) each: its list, its place in the list
    items = cand[which, slot]  # (R,)
    cats = torch.as_tensor(samples.vocab.item_category, dtype=torch.long)[items]
    x = {"item_id": items.numpy(), "cate_id": cats.numpy(),
         **_right_padded(b.hist_items[which], b.hist_cats[which])}
    return x, (slot == 0).double().numpy()


def build_deepctr_din(n_items: int, n_cats: int, *, seq_len: int, item_dim: int, cat_dim: int,
                      attention_hidden: tuple[int, ...], mlp_hidden: tuple[int, ...], attention_activation: str,
                      mlp_activation: str, seed: int = 0):
    """DeepCTR-Torch's DIN over item + category, histories of ``seq_len`` (right-padded, with a length)."""
    from deepctr_torch.inputs import SparseFeat, VarLenSparseFeat
    from deepctr_torch.models import DIN as DeepCTRDIN

    features = [
        SparseFeat("item_id", n_items, embedding_dim=item_dim),
        SparseFeat("cate_id", n_cats, embedding_dim=cat_dim),
        VarLenSparseFeat(SparseFeat("hist_item_id", n_items, embedding_dim=item_dim, embedding_name="item_id"),
                         maxlen=seq_len, length_name="seq_length"),
        VarLenSparseFeat(SparseFeat("hist_cate_id", n_cats, embedding_dim=cat_dim, embedding_name="cate_id"),
                         maxlen=seq_len, length_name="seq_length"),
    ]
    with contextlib.redirect_stdout(sys.stderr):
        return DeepCTRDIN(features, ["item_id", "cate_id"], dnn_hidden_units=mlp_hidden,
                          att_hidden_size=attention_hidden, att_activation=attention_activation,
                          dnn_activation=mlp_activation, l2_reg_embedding=0.0, seed=seed, device="cpu")


def run_deepctr(*args, **kwargs) -> dict:
    """DeepCTR prints progress and version notices to stdout; keep stdout for our JSON."""
    with contextlib.redirect_stdout(sys.stderr):
        return _run_deepctr(*args, **kwargs)


def _run_deepctr(samples: SampleSet, *, seq_len: int, epochs: int, batch_size: int, item_dim: int, cat_dim: int,
                attention_hidden: tuple[int, ...], mlp_hidden: tuple[int, ...], attention_activation: str,
                mlp_activation: str, seed: int, lr: float = 1e-3, epoch_rows: EpochRows | None = None) -> dict:
    """Train and score the held-out splits. ``epoch_rows``: each epoch's training rows (default: the
    training split's own rows, a positive and its sampled negative, the same every epoch)."""
    torch.manual_seed(seed)
    if mlp_activation == "dice":
        raise ValueError("DeepCTR-Torch's DIN cannot use Dice in its MLP (its DNN builds Dice for 3-D inputs)")
    model = build_deepctr_din(samples.vocab.n_items, samples.vocab.n_categories, seq_len=seq_len, item_dim=item_dim,
                              cat_dim=cat_dim, attention_hidden=attention_hidden, mlp_hidden=mlp_hidden,
                              attention_activation=attention_activation, mlp_activation=mlp_activation, seed=seed)
    model.compile(torch.optim.Adam(model.parameters(), lr=lr), "binary_crossentropy")
    if epoch_rows is None:
        split_rows = (_inputs(samples, samples.train, seq_len), samples.train.label.astype(np.float64))
        epoch_rows = lambda epoch: [split_rows]  # noqa: E731
    seconds, n_rows = 0.0, 0
    for epoch in range(epochs):
        for x, y in epoch_rows(epoch):  # fit shuffles within the chunk; the optimiser carries on across calls
            t0 = time.perf_counter()
            model.fit(x, y, batch_size=batch_size, epochs=1, verbose=0, shuffle=True)
            seconds += time.perf_counter() - t0
            n_rows += len(y)
    out = {"rows_per_s": n_rows / seconds, "rows": n_rows, "train_seconds": seconds}
    for name in ("val", "test"):
        split = samples.split(name)
        p = model.predict(_inputs(samples, split, seq_len), batch_size=8192).reshape(-1)
        p = np.clip(p, 1e-7, 1 - 1e-7)
        out[f"{name}_scores"] = np.log(p / (1 - p))  # logits, so both sides share the metric code
    return out
