"""DeepCTR-Torch's DIN, fed the very same samples as dinrec (the optional `bench` extra).

DeepCTR takes padded histories with a length column and right-padding (its attention masks the
first `seq_length` positions), so dinrec's left-padded histories are re-aligned here; the items,
categories, targets, labels, split and negatives are identical.
"""

from __future__ import annotations

import contextlib
import sys
import time

import numpy as np
import torch

from dinrec.training.data import SplitTensors
from dinrec.training.samples import SampleSet, Split


def _inputs(samples: SampleSet, split: Split, seq_len: int) -> dict[str, np.ndarray]:
    t = SplitTensors(samples, split, seq_len)
    b = t.batch(torch.arange(len(t)))
    lengths = (b.hist_items != 0).sum(1)  # (N,)
    # left-padded → right-padded: roll each row left by its padding
    shift = seq_len - lengths  # (N,)
    idx = (torch.arange(seq_len).unsqueeze(0) + shift.unsqueeze(1)) % seq_len  # (N, L)
    hist_items = torch.gather(b.hist_items, 1, idx)
    hist_cats = torch.gather(b.hist_cats, 1, idx)
    return {"item_id": b.target_item.numpy(), "cate_id": b.target_cat.numpy(),
            "hist_item_id": hist_items.numpy(), "hist_cate_id": hist_cats.numpy(), "seq_length": lengths.numpy()}


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
                mlp_activation: str, seed: int,
                lr: float = 1e-3) -> dict:
    torch.manual_seed(seed)
    if mlp_activation == "dice":
        raise ValueError("DeepCTR-Torch's DIN cannot use Dice in its MLP (its DNN builds Dice for 3-D inputs)")
    model = build_deepctr_din(samples.vocab.n_items, samples.vocab.n_categories, seq_len=seq_len, item_dim=item_dim,
                              cat_dim=cat_dim, attention_hidden=attention_hidden, mlp_hidden=mlp_hidden,
                              attention_activation=attention_activation, mlp_activation=mlp_activation, seed=seed)
    model.compile(torch.optim.Adam(model.parameters(), lr=lr), "binary_crossentropy")
    x_train, y_train = _inputs(samples, samples.train, seq_len), samples.train.label.astype(np.float64)
    t0 = time.perf_counter()
    model.fit(x_train, y_train, batch_size=batch_size, epochs=epochs, verbose=0, shuffle=True)
    seconds = time.perf_counter() - t0
    out = {"samples_per_s": len(y_train) * epochs / seconds, "train_seconds": seconds}
    for name in ("val", "test"):
        split = samples.split(name)
        p = model.predict(_inputs(samples, split, seq_len), batch_size=8192).reshape(-1)
        p = np.clip(p, 1e-7, 1 - 1e-7)
        out[f"{name}_scores"] = np.log(p / (1 - p))  # logits, so both sides share the metric code
    return out
