"""Warm-start a model from an earlier one trained on a different vocabulary.

Retraining adds items and categories the champion never saw, and its vocabulary is rebuilt from the
new window, so index i no longer means the same item. Rows of the embedding tables are therefore
copied **by external id**: an item or category both vocabularies know keeps what it learned; a new one
keeps its fresh initialisation. Every other parameter (attention unit, MLP, tower MLP, …) is copied
when its shape matches, and left fresh when it does not (a changed layer size).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from dinrec.models.vocab import Vocab

if TYPE_CHECKING:
    from dinrec.models.bundle import Bundle

Init = Callable[[nn.Module], dict]

# Which vocabulary indexes a table's rows, by the parameter's name (DIN's and the towers' tables).
_ITEM_TABLES = ("item_emb.weight", "hist_item_emb.weight")
_CATEGORY_TABLES = ("cat_emb.weight", "hist_cat_emb.weight")


def row_map(old_ids: list[str], new_ids: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(new rows, old rows) of the ids both vocabularies hold; padding (row 0) excluded."""
    old_index = {x: i for i, x in enumerate(old_ids) if i}
    pairs = [(i, old_index[x]) for i, x in enumerate(new_ids) if i and x in old_index]
    new_rows, old_rows = zip(*pairs, strict=True) if pairs else ((), ())
    return np.asarray(new_rows, dtype=np.int64), np.asarray(old_rows, dtype=np.int64)


@torch.no_grad()
def warm_start(new: nn.Module, old: nn.Module, old_vocab: Vocab, new_vocab: Vocab) -> dict:
    """Copy ``old``'s weights into ``new`` (see the module doc); returns what was carried over."""
    maps = {"item": row_map(old_vocab.items, new_vocab.items),
            "category": row_map(old_vocab.categories, new_vocab.categories)}
    old_state = old.state_dict()
    copied, fresh = 0, []
    for name, target in new.state_dict().items():  # tensors share storage with ``new``'s parameters
        source = old_state.get(name)
        kind = "item" if name.endswith(_ITEM_TABLES) else "category" if name.endswith(_CATEGORY_TABLES) else None
        if source is None:
            fresh.append(name)
        elif kind is not None and source.shape[1:] == target.shape[1:]:
            new_rows, old_rows = maps[kind]
            target[torch.from_numpy(new_rows)] = source[torch.from_numpy(old_rows)].to(target.dtype)
            copied += 1
        elif source.shape == target.shape:
            target.copy_(source)
            copied += 1
        else:
            fresh.append(name)
    return {"tensors_copied": copied, "tensors_fresh": fresh,
            "items_kept": int(len(maps["item"][0])), "items_new": new_vocab.n_items - 1 - len(maps["item"][0]),
            "categories_kept": int(len(maps["category"][0])),
            "categories_new": new_vocab.n_categories - 1 - len(maps["category"][0])}


def initializers(champion: Bundle | None, vocab: Vocab, towers: bool = True) -> tuple[Init | None, Init | None]:
    """The ``init`` hooks of DIN's trainer and the towers' that warm-start them from ``champion``'s
    models for a run on ``vocab`` — (None, None) without a champion; no towers hook if it has none or
    ``towers`` is False (the towers then train from scratch: see RetrainSettings.warm_start_towers)."""
    if champion is None:
        return None, None
    din = lambda model: warm_start(model, champion.model, champion.vocab, vocab)  # noqa: E731
    if champion.towers is None or not towers:
        return din, None
    return din, lambda towers: warm_start(towers, champion.towers, champion.vocab, vocab)
