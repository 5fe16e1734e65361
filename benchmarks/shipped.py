"""The model `dinrec train` ships by default, with random weights, over a made-up catalog of any size:
what `dinrec bench score` and `dinrec bench serve` measure. The default DIN reads context (position, time
gap, co-visitation per (candidate, behaviour), per-candidate count and category share: models.context),
so it comes with what serving computes that context from — a co-visitation lane and training counts —
and with the ranking blend the default bundle holds. Its shape is training's own (training.loop.din_config
over TrainSettings, so DINREC_TRAIN_* settings reshape it as they reshape `dinrec train`'s); only the
values are made up: latency does not depend on them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dinrec.models.blend import FEATURES, Blend
from dinrec.models.din import DIN, DINConfig
from dinrec.retrieval.covisit import CoVisitation, CoVisitConfig

# A blend of the size the default bundle holds (one weight per models.blend.FEATURES); its values are
# ml-100k's fit in spirit, not in figure: the stage's cost does not depend on them.
BLEND_WEIGHTS = (0.7, 0.3, 0.6, 0.3, 0.2, 0.1)


@dataclass(frozen=True)
class ShippedModel:
    model: DIN  # eval mode, the shipped shape, initial weights
    item_category: torch.Tensor  # (I,) int64 category index by item index; 0 for padding
    lane: CoVisitation | None  # with pair inputs: ``neighbours`` random neighbours per item
    counts: np.ndarray  # (I,) int64 made-up training counts (Zipf-like; 0 for padding)
    blend: Blend


def shipped_config(items: int, categories: int, seq_len: int) -> DINConfig:
    """The shipped DIN over ``items`` and ``categories`` (padding not counted) and histories of ``seq_len``."""
    from dinrec.training.loop import din_config
    from dinrec.training.settings import TrainSettings

    return din_config(items + 1, categories + 1, seq_len, TrainSettings())


def shipped_model(items: int, categories: int, seq_len: int, seed: int = 0, neighbours: int = 100) -> ShippedModel:
    """The shipped model over ``items`` items in ``categories`` categories (indices from 1; 0 is padding)."""
    torch.manual_seed(seed)
    cfg = shipped_config(items, categories, seq_len)
    model = DIN(cfg).eval()
    rng = np.random.default_rng(seed)
    item_category = torch.from_numpy(np.concatenate([[0], rng.integers(1, categories + 1, items)]).astype(np.int64))
    lane = None
    if cfg.pair_inputs:
        m = min(neighbours, max(items - 1, 1))
        ids = np.zeros((items + 1, m), dtype=np.int64)
        # m distinct neighbours per item, none itself (as a fitted lane's): the same m offsets from each item
        offsets = rng.choice(np.arange(1, items), min(m, items - 1), replace=False)
        ids[1:, :len(offsets)] = (np.arange(items)[:, None] + offsets[None, :]) % items + 1
        weights = np.zeros((items + 1, m), dtype=np.float32)
        weights[1:] = -np.sort(-rng.random((items, m), dtype=np.float32), axis=1)  # strongest first, as fitted
        lane = CoVisitation(ids, weights, CoVisitConfig(neighbours=m))
    counts = np.zeros(items + 1, dtype=np.int64)
    counts[1:] = (1000 / rng.permutation(np.arange(1, items + 1))).astype(np.int64)  # a few heads, a long tail
    assert len(BLEND_WEIGHTS) == len(FEATURES)
    return ShippedModel(model, item_category, lane, counts, Blend(BLEND_WEIGHTS))
