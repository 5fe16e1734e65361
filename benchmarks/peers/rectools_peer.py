"""Run one RecTools model on a leave-last-out split and write each test user's top items: the peer
``dinrec bench e2e`` holds the served list against (benchmarks.peers drives it).

Runs in the peers' own environment (``make peers``: RecTools with its torch extra, which pins numpy
below 2), so it imports nothing of dinrec: everything arrives in one ``.npz`` and leaves in another.

Input arrays (item and user ids are the benchmark's integer indices, 0 never used):
    fit_user, fit_item, fit_ts      the training behaviours, then each validation target
    fit_is_val                      True on the validation targets (RecTools' validation mask: excluded
                                    from training, scored for early stopping)
    ask_user, ask_item, ask_ts      every behaviour before each test user's target (what the model
                                    reads to recommend; the same id maps as fitting)
    test_user                       the users to recommend for, one list each
    val_user, val_target            each validation user and target (EASE's regularisation is chosen on them)
and ``config`` (JSON): {"model": "sasrec"|"bert4rec"|"ease", "k": int, "seed": int, "threads": int,
"params": {...}} (params override the defaults below; "ease_grid" lists EASE's regularisations).

Output: ``lists`` (n_test, k) int64 item ids best first (-1 where fewer), and ``info`` (JSON bytes):
the library and its version, the settings used, epochs run, the best epoch, seconds.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time

import numpy as np
import pandas as pd

# SASRec and BERT4Rec as RecTools ships them (its defaults: 2 blocks, 4 heads, 256 factors, dropout 0.2,
# lr 1e-3, batch 128, softmax loss over the whole catalog), trained until the validation loss has not
# improved for ``patience`` epochs (RecTools' advanced training guide: a validation mask, Lightning's
# EarlyStopping and ModelCheckpoint on val_loss), the best epoch's weights kept. session_max_len is the
# benchmark's history length. A patience of 3, not the guide's 10: on amazon-hin (2026-12-06) each run went on
# for 10 epochs past its best, and those epochs were a third of the three-seed run (bench e2e's budget is an
# hour per dataset); the best epoch's weights are kept either way, and the JSON says the patience.
TRANSFORMER_DEFAULTS = {"session_max_len": 50, "epochs": 200, "patience": 3}
EASE_GRID = (10.0, 50.0, 200.0, 500.0, 1000.0, 3000.0)


def _frame(user: np.ndarray, item: np.ndarray, ts: np.ndarray):
    from rectools import Columns

    return pd.DataFrame({Columns.User: user, Columns.Item: item, Columns.Weight: 1.0,
                         Columns.Datetime: pd.to_datetime(ts, unit="s")})


def _datasets(arrays: dict):
    """(fit, ask): two Datasets with the same id maps: ``fit`` holds the fitting interactions (the
    validation targets included, masked out of training by the transformers), ``ask`` every behaviour
    before each test target."""
    from rectools.dataset import Dataset, Interactions

    fit_df = _frame(arrays["fit_user"], arrays["fit_item"], arrays["fit_ts"])
    ask_df = _frame(arrays["ask_user"], arrays["ask_item"], arrays["ask_ts"])
    whole = Dataset.construct(pd.concat([fit_df, ask_df], ignore_index=True))
    users, items = whole.user_id_map, whole.item_id_map

    def on_maps(df: pd.DataFrame) -> Dataset:
        return Dataset(users, items, Interactions.from_raw(df, users, items))

    return on_maps(fit_df), on_maps(ask_df), fit_df


def _lists(reco: pd.DataFrame, test_user: np.ndarray, k: int) -> np.ndarray:
    from rectools import Columns

    out = np.full((len(test_user), k), -1, dtype=np.int64)
    row = {u: r for r, u in enumerate(test_user.tolist())}
    reco = reco.sort_values([Columns.User, Columns.Rank])
    for user, group in reco.groupby(Columns.User, sort=False):
        items = group[Columns.Item].to_numpy()[:k]
        out[row[int(user)], :len(items)] = items
    return out


def _transformer(name: str, arrays: dict, cfg: dict) -> tuple[np.ndarray, dict]:
    import torch
    from pytorch_lightning import Trainer
    from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint
    from rectools import Columns
    from rectools.models import BERT4RecModel, SASRecModel

    params = {**TRANSFORMER_DEFAULTS, **cfg.get("params", {})}
    epochs, patience = params.pop("epochs"), params.pop("patience")
    fit, ask, fit_df = _datasets(arrays)
    val_pairs = set(zip(arrays["fit_user"][arrays["fit_is_val"]].tolist(),
                        arrays["fit_item"][arrays["fit_is_val"]].tolist(), strict=True))
    workdir = tempfile.mkdtemp(prefix="dinrec-peer-")
    checkpoint = ModelCheckpoint(dirpath=workdir, monitor="val_loss", mode="min", save_top_k=1)
    stopping = EarlyStopping(monitor="val_loss", mode="min", patience=patience)

    def trainer() -> Trainer:
        return Trainer(max_epochs=epochs, accelerator="cpu", devices=1, deterministic=True,
                       enable_progress_bar=False, enable_model_summary=False, logger=False,
                       callbacks=[checkpoint, stopping])

    def val_mask(interactions: pd.DataFrame) -> np.ndarray:
        pairs = zip(interactions[Columns.User].tolist(), interactions[Columns.Item].tolist(), strict=True)
        return np.fromiter((p in val_pairs for p in pairs), dtype=bool, count=len(interactions))

    torch.manual_seed(cfg["seed"])
    model_type = SASRecModel if name == "sasrec" else BERT4RecModel
    model = model_type(get_val_mask_func=val_mask, get_trainer_func=trainer, verbose=0,
                       recommend_torch_device="cpu", **params)
    t0 = time.perf_counter()
    model.fit(fit)
    # RecTools trains a copy of the trainer get_trainer_func made: read its own callbacks.
    fitted = model.fit_trainer
    kept = fitted.checkpoint_callback
    model.load_weights_from_checkpoint(kept.best_model_path)
    best = kept.best_model_path.rsplit("epoch=", 1)[-1].split("-")[0] if "epoch=" in kept.best_model_path else None
    seconds = time.perf_counter() - t0
    # RecTools' transformers refuse users their data preparation drops (no usable history, e.g. one-click
    # sessions): told to warn, it leaves them out, and they get an empty list — a miss, as for any method
    # that cannot answer them — counted in the JSON.
    reco = model.recommend(users=arrays["test_user"], dataset=ask, k=cfg["k"], filter_viewed=True,
                           on_unsupported_targets="warn")
    answered = set(reco[Columns.User].unique().tolist())
    settings = {**params, "epochs_max": epochs, "patience": patience, "loss": getattr(model, "loss", None),
                "n_factors": getattr(model, "n_factors", None), "n_blocks": getattr(model, "n_blocks", None),
                "n_heads": getattr(model, "n_heads", None), "dropout_rate": getattr(model, "dropout_rate", None),
                "lr": getattr(model, "lr", None), "batch_size": getattr(model, "batch_size", None),
                "early_stopping": "validation loss (RecTools' validation mask: each user's validation target)"}
    return _lists(reco, arrays["test_user"], cfg["k"]), {
        "settings": settings, "epochs_run": int(fitted.current_epoch), "best_epoch": int(best) if best else None,
        "best_val_loss": float(kept.best_model_score) if kept.best_model_score is not None else None,
        "train_seconds": round(seconds, 1),
        "users_without_a_list": int(sum(u not in answered for u in arrays["test_user"].tolist()))}


def _ease(arrays: dict, cfg: dict) -> tuple[np.ndarray, dict]:
    """EASE as RecTools evaluates a non-sequential model: its regularisation chosen by validation HR@10
    (fitted on the training behaviours), then refitted on everything before each test target — RecTools
    recommends to the users of the matrix it was fitted on — and asked for those users' lists."""
    from rectools import Columns
    from rectools.dataset import Dataset
    from rectools.models import EASEModel

    fit_df = _frame(arrays["fit_user"], arrays["fit_item"], arrays["fit_ts"])
    train_only = Dataset.construct(fit_df[~arrays["fit_is_val"]])
    val_user, val_target = arrays["val_user"], arrays["val_target"]
    known = np.isin(val_user, train_only.user_id_map.external_ids)
    grid = cfg.get("params", {}).get("ease_grid", EASE_GRID)
    tried, best = {}, None
    t0 = time.perf_counter()
    for reg in grid:  # EASE has one knob; its paper tunes it on held-out data, so do we (validation HR@10)
        model = EASEModel(regularization=float(reg), num_threads=cfg.get("threads", 1))
        model.fit(train_only)
        reco = model.recommend(users=val_user[known], dataset=train_only, k=10, filter_viewed=True)
        got = set(zip(reco[Columns.User].tolist(), reco[Columns.Item].tolist(), strict=True))
        hr = float(np.mean([(u, t) in got for u, t in zip(val_user.tolist(), val_target.tolist(), strict=True)]))
        tried[str(reg)] = round(hr, 4)
        if best is None or hr > best[0]:
            best = (hr, reg)
    assert best is not None
    test_user = arrays["test_user"]
    ask_df = _frame(arrays["ask_user"], arrays["ask_item"], arrays["ask_ts"])
    final = Dataset.construct(pd.concat([fit_df[~np.isin(arrays["fit_user"], test_user)], ask_df], ignore_index=True))
    model = EASEModel(regularization=float(best[1]), num_threads=cfg.get("threads", 1))
    model.fit(final)
    reco = model.recommend(users=test_user, dataset=final, k=cfg["k"], filter_viewed=True)
    return _lists(reco, test_user, cfg["k"]), {
        "settings": {"regularization": best[1], "chosen_by": "validation HR@10", "val_hr@10_by_regularization": tried,
                     "final_fit": "every behaviour before each test target (RecTools recommends to fitted users)"},
        "train_seconds": round(time.perf_counter() - t0, 1)}


def main(inp: str, out: str) -> None:
    import rectools
    import torch

    with np.load(inp, allow_pickle=False) as f:
        arrays = {k: f[k] for k in f.files if k != "config"}
        cfg = json.loads(bytes(f["config"]).decode())
    torch.set_num_threads(max(1, int(cfg.get("threads", 1))))
    name = cfg["model"]
    if name in ("sasrec", "bert4rec"):
        lists, info = _transformer(name, arrays, cfg)
    elif name == "ease":
        lists, info = _ease(arrays, cfg)
    else:
        raise SystemExit(f"unknown peer model {name!r}")
    info = {"library": f"rectools {rectools.__version__}", "model": name, "seed": cfg["seed"], **info}
    np.savez(out, lists=lists, info=np.frombuffer(json.dumps(info).encode(), dtype=np.uint8))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: rectools_peer.py IN.npz OUT.npz")
    main(sys.argv[1], sys.argv[2])
