"""Two towers for recall — pure: no I/O, no loss, no devices (training.towers_train trains them).

DIN ranks candidates it is given; these find them. Both towers end in unit vectors, so FAISS's inner
product is their cosine::

    item tower  v(i) = normalize(E_item[i] + E_cat[c(i)])                       (N, D)
    user tower  u(h) = normalize(p + MLP([p, h_newest])),  p = Σ_l w_l · h_l    (B, D)
                h_l  = X_item[i_l] + X_cat[c_l],  w = softmax over the filled positions of a
                       learned weight per recency slot (the newest behaviours count most)

Inputs follow DIN's: ``hist_items``/``hist_cats`` (B, L) int64, left-padded (newest at [:, -1]),
0 = padding or unknown. Behaviours (X) and candidates (E) have their own tables, as word2vec has
input and output vectors: "watched A" and "will watch A" are different things. An item the model has
never seen (index 0) but whose category it knows gets ``normalize(E_cat[c])``: new items are
recallable through their category, and unknown behaviours still say something through theirs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dinrec.models.din import table_rows


@dataclass(frozen=True)
class TowersConfig:
    n_items: int
    n_categories: int
    dim: int = 32
    seq_len: int = 50
    temperature: float = 0.07  # softmax temperature for training; cosine scores are in [-1, 1]

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> TowersConfig:
        return cls(**d)


TABLES = ("item_emb", "cat_emb", "hist_item_emb", "hist_cat_emb")


class Towers(nn.Module):
    def __init__(self, cfg: TowersConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.dim
        # As DIN's (models.din): the tables take no draws from the global generator — their rows come from
        # table_rows, seeded by ``table_seed`` — so the dense layers start the same whatever the tables'
        # size, and a sharded run (training.sharded_towers) starts where an unsharded one does.
        self.item_emb = _table(cfg.n_items, d)   # E: candidates
        self.cat_emb = _table(cfg.n_categories, d)
        self.hist_item_emb = _table(cfg.n_items, d)  # X: behaviours
        self.hist_cat_emb = _table(cfg.n_categories, d)
        self.recency = nn.Parameter(torch.zeros(cfg.seq_len))  # (L,) logit per slot, newest last
        self.mlp = nn.Sequential(nn.Linear(2 * d, 2 * d), nn.ReLU(), nn.Linear(2 * d, d))
        self.table_seed = int(torch.randint(0, 2**62, ()))  # one draw, after the dense layers'
        with torch.no_grad():
            for name in TABLES:
                table = getattr(self, name)
                table.weight.copy_(table_rows(self.table_seed, f"towers.{name}", 0, table.num_embeddings, d))

    def dense_parameters(self) -> list[nn.Parameter]:
        """Everything but the tables."""
        tables = {id(getattr(self, t).weight) for t in TABLES if getattr(self, t) is not None}
        return [p for p in self.parameters() if id(p) not in tables]

    def items(self, item_idx: torch.Tensor, cat_idx: torch.Tensor) -> torch.Tensor:
        """(N,), (N,) → (N, D) unit item vectors."""
        return F.normalize(self.item_emb(item_idx) + self.cat_emb(cat_idx), dim=-1)

    def users(self, hist_items: torch.Tensor, hist_cats: torch.Tensor) -> torch.Tensor:
        """(B, L), (B, L) → (B, D) unit query vectors. L may be shorter than the trained seq_len (the
        newest slots' weights are used)."""
        if hist_items.shape[1] > self.cfg.seq_len:
            hist_items, hist_cats = hist_items[:, -self.cfg.seq_len:], hist_cats[:, -self.cfg.seq_len:]
        h = self.hist_item_emb(hist_items) + self.hist_cat_emb(hist_cats)  # (B, L, D)
        return self.users_from(h, (hist_items != 0) | (hist_cats != 0))

    def users_from(self, h: torch.Tensor, filled: torch.Tensor) -> torch.Tensor:
        """The user tower past its lookups: behaviour vectors h (B, L, D), L ≤ seq_len, and which slots
        hold a behaviour (B, L) → (B, D) unit query vectors (a sharded run looks the rows up itself)."""
        length = h.shape[1]
        logits = self.recency[-length:].expand_as(filled).masked_fill(~filled, float("-inf"))  # (B, L)
        w = torch.softmax(logits, dim=1).nan_to_num(0.0)  # an empty row: all -inf → NaN → 0
        pooled = torch.einsum("bl,bld->bd", w, h)  # (B, D)
        newest = h[:, -1]  # (B, D); zero for an empty row
        return F.normalize(pooled + self.mlp(torch.cat([pooled, newest], dim=-1)), dim=-1)

    def item_table(self, item_category: torch.Tensor) -> torch.Tensor:
        """Every item's vector by item index: (n_items, D); row 0 (padding) is normalize(E_cat[0]) = 0."""
        return self.items(torch.arange(len(item_category), device=item_category.device), item_category)


def _table(rows: int, dim: int) -> nn.Embedding:
    return nn.Embedding(rows, dim, padding_idx=0, _weight=torch.zeros(rows, dim))
