"""DIN, the Deep Interest Network (Zhou et al., KDD 2018) — pure: no I/O, no loss, no devices.

Inputs are index tensors (0 = padding / unknown item or category)::

    hist_items, hist_cats:   (B, L) int64, left-padded: the newest behaviour is at [:, -1]
    target_item, target_cat: (B,)   int64, the candidate to score

``forward`` returns one logit per row, shape (B,). A local activation unit weighs each behaviour
by its relevance to the candidate, from [q, h, q−h, q⊙h]; padded positions get weight 0, so
adding or removing padding changes nothing. Weights are *not* softmax-normalised (sum pooling,
as in the paper), which keeps the intensity of a user's interest in the representation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class DINConfig:
    n_items: int
    n_categories: int
    item_dim: int = 16
    cat_dim: int = 16
    attention_hidden: tuple[int, ...] = (80, 40)
    mlp_hidden: tuple[int, ...] = (200, 80)
    attention_activation: str = "prelu"  # per-position, so batch statistics cannot mix positions
    mlp_activation: str = "dice"
    dropout: float = 0.0
    sparse_embeddings: bool = False  # row-wise (sparse) embedding gradients: only touched rows move
    extra: dict = field(default_factory=dict)  # room for future options without a format bump

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> DINConfig:
        d = dict(d)
        d["attention_hidden"] = tuple(d["attention_hidden"])
        d["mlp_hidden"] = tuple(d["mlp_hidden"])
        return cls(**d)


class Dice(nn.Module):
    """Data-adaptive activation: p(x)·x + (1−p(x))·α·x with p = sigmoid(BN(x)) (DIN paper, eq. 9)."""

    def __init__(self, dim: int, eps: float = 1e-8) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(dim, affine=False, eps=eps)
        self.alpha = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])  # (N, D): BN over every row, whatever the leading dims
        p = torch.sigmoid(self.bn(flat)).reshape(x.shape)
        return x * (self.alpha + p * (1 - self.alpha))  # = p·x + (1−p)·α·x, in fewer passes


class PReLU(nn.Module):
    """PReLU over the *last* dimension (torch's nn.PReLU uses dim 1, which is L for (B, L, H))."""

    def __init__(self, dim: int, init: float = 0.25) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])  # (N, H): F.prelu's fused kernel puts channels on dim 1
        return F.prelu(flat, self.alpha).reshape(x.shape)


TABLE_INIT_STD = 0.05
_INIT_BLOCK = 4096  # rows per generator: any shard of a table is initialised alone, as in the whole


def table_rows(seed: int, table: str, start: int, stop: int, dim: int) -> torch.Tensor:
    """Rows [start, stop) of ``table``'s initial weights, (stop − start, dim): N(0, 0.05²), row 0
    (padding / unknown) zeros. Drawn per block of rows from generators seeded by (seed, table, block),
    so a shard of the table on one GPU gets exactly the rows the whole table would have."""
    out = torch.empty(stop - start, dim)
    salt = sum((i + 1) * ord(c) for i, c in enumerate(table))
    for block in range(start // _INIT_BLOCK, -(-stop // _INIT_BLOCK)):
        g = torch.Generator().manual_seed((seed * 1_000_003 + salt * 7919 + block) % (2**63))
        rows = torch.randn(_INIT_BLOCK, dim, generator=g) * TABLE_INIT_STD  # (block, dim)
        b0 = block * _INIT_BLOCK
        lo, hi = max(start, b0), min(stop, b0 + _INIT_BLOCK)
        out[lo - start:hi - start] = rows[lo - b0:hi - b0]
    if start == 0 and stop > 0:
        out[0] = 0
    return out


def _activation(name: str, dim: int) -> nn.Module:
    if name == "dice":
        return Dice(dim)
    if name == "prelu":
        return PReLU(dim)
    if name == "relu":
        return nn.ReLU()
    if name == "sigmoid":
        return nn.Sigmoid()
    raise ValueError(f"unknown activation {name!r}; use dice, prelu, relu or sigmoid")


def _mlp(sizes: list[int], activation: str, dropout: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for d_in, d_out in zip(sizes[:-1], sizes[1:], strict=True):
        layers += [nn.Linear(d_in, d_out), _activation(activation, d_out)]
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers)


class DIN(nn.Module):
    def __init__(self, cfg: DINConfig) -> None:
        super().__init__()
        if not cfg.attention_hidden or not cfg.mlp_hidden:
            raise ValueError("attention_hidden and mlp_hidden need at least one layer each")
        self.cfg = cfg
        # The tables take no draws from the global generator (their rows come from table_rows, seeded by
        # ``table_seed``), so the dense layers start the same whatever the tables' size: a sharded run,
        # which builds the dense part alone (training.sharded), starts where an unsharded one does.
        self.item_emb = nn.Embedding(cfg.n_items, cfg.item_dim, padding_idx=0, sparse=cfg.sparse_embeddings,
                                     _weight=torch.zeros(cfg.n_items, cfg.item_dim))
        self.cat_emb = nn.Embedding(cfg.n_categories, cfg.cat_dim, padding_idx=0, sparse=cfg.sparse_embeddings,
                                    _weight=torch.zeros(cfg.n_categories, cfg.cat_dim))
        d = self.dim = cfg.item_dim + cfg.cat_dim
        h1 = cfg.attention_hidden[0]
        # The activation unit's first layer sees [q, h, q−h, q⊙h]; see interest_jagged for how it is computed.
        self.att_in = nn.Linear(4 * d, h1)
        self.att_in_act = _activation(cfg.attention_activation, h1)
        self.att_hidden = _mlp(list(cfg.attention_hidden), cfg.attention_activation, 0.0)
        self.att_out = nn.Linear(cfg.attention_hidden[-1], 1)
        self.mlp = _mlp([2 * d, *cfg.mlp_hidden], cfg.mlp_activation, cfg.dropout)
        self.out = nn.Linear(cfg.mlp_hidden[-1], 1)
        # Set from outside (the trainer, from training.kernels): a fused implementation of
        # interest_jagged for training on CPU. The same function, so not part of the config or weights.
        self.fused_unit: Callable[..., torch.Tensor] | None = None
        self.table_seed = int(torch.randint(0, 2**62, ()))  # one draw, after the dense layers'
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            for name, emb in (("item_emb", self.item_emb), ("cat_emb", self.cat_emb)):
                emb.weight.copy_(table_rows(self.table_seed, name, 0, emb.num_embeddings, emb.embedding_dim))

    def embed(self, items: torch.Tensor, cats: torch.Tensor) -> torch.Tensor:
        """(…,) item and category indices → (…, item_dim + cat_dim)."""
        return torch.cat([self.item_emb(items), self.cat_emb(cats)], dim=-1)

    def _activation_weights(self, z: torch.Tensor) -> torch.Tensor:
        """First-layer pre-activations (…, H1) → one weight per behaviour (…,)."""
        return self.att_out(self.att_hidden(self.att_in_act(z))).squeeze(-1)

    def dice_unit_layers(self) -> tuple[list[Dice], list[nn.Linear], nn.Linear]:
        """The activation unit after its first layer, when every activation in it is Dice."""
        if self.cfg.attention_activation != "dice":
            raise ValueError("the activation unit does not use Dice")
        linears = [m for m in self.att_hidden if isinstance(m, nn.Linear)]
        dices = [self.att_in_act, *(m for m in self.att_hidden if isinstance(m, Dice))]
        return dices, linears, self.att_out

    def interest(self, query: torch.Tensor, hist: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Local activation unit + sum pooling, written as in the paper (the reference).

        query (B, D), hist (B, L, D), mask (B, L) bool → (B, D)
        """
        q = query.unsqueeze(1).expand_as(hist)  # (B, L, D)
        att_in = torch.cat([q, hist, q - hist, q * hist], dim=-1)  # (B, L, 4D)
        w = self._activation_weights(self.att_in(att_in))  # (B, L)
        w = w.masked_fill(~mask, 0.0)
        return torch.bmm(w.unsqueeze(1), hist).squeeze(1)  # (B, 1, L) @ (B, L, D) → (B, D)

    def interest_jagged(self, query: torch.Tensor, hist: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The same function, computed only where there is a behaviour.

        query (B, D); hist (M, D), the M real behaviours of the batch; rows (M,), the sample each
        belongs to → (B, D). Padding is never computed, so it cannot change anything. With
        W = [Wq | Wh | Wd | Wp]: W·[q, h, q−h, q⊙h] = (Wq+Wd)·q + (Wh−Wd)·h + Wp·(q⊙h); the q term
        is computed once per sample, not once per behaviour, halving the first layer's work.
        With ``fused_unit`` set (CPU training, Dice unit), everything after ``per_sample`` runs as one
        fused kernel (training.kernels); ``rows`` must then be sorted, as ``nonzero`` returns them.
        """
        w_q, w_h, w_d, w_p = self.att_in.weight.split(self.dim, dim=1)  # each (H1, D)
        per_sample = F.linear(query, w_q + w_d, self.att_in.bias)  # (B, H1)
        fused = self.fused_unit
        if (fused is not None and self.training and rows.numel() > 0 and hist.device.type == "cpu"
                and hist.dtype == query.dtype == per_sample.dtype == torch.float32):
            return fused(query, hist, rows, per_sample, torch.cat([w_h - w_d, w_p], dim=1), self)
        q_rows = query.index_select(0, rows)  # (M, D)
        z = torch.addmm(per_sample.index_select(0, rows), hist, (w_h - w_d).t())  # (M, H1)
        z = torch.addmm(z, q_rows * hist, w_p.t())  # (M, H1)
        w = self._activation_weights(z)  # (M,)
        pooled = torch.zeros_like(query)  # (B, D)
        return pooled.index_add_(0, rows, w.unsqueeze(1) * hist)  # sum pooling per sample

    def forward(self, hist_items: torch.Tensor, hist_cats: torch.Tensor,
                target_item: torch.Tensor, target_cat: torch.Tensor) -> torch.Tensor:
        rows, cols = (hist_items != 0).nonzero(as_tuple=True)  # (M,), (M,) the real behaviours
        # One lookup per table for behaviours and candidates: half the embedding backward passes.
        items = torch.cat([hist_items[rows, cols], target_item])  # (M + B,)
        cats = torch.cat([hist_cats[rows, cols], target_cat])  # (M + B,)
        hist, query = self.embed(items, cats).split([rows.numel(), target_item.numel()])  # (M, D), (B, D)
        return self.logits(query, hist, rows)

    def logits(self, query: torch.Tensor, hist: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Everything after the lookups: query (B, D), the batch's behaviours hist (M, D) and the
        sample each belongs to, rows (M,), sorted → (B,) logits."""
        user_interest = self.interest_jagged(query, hist, rows)  # (B, D)
        x = self.mlp(torch.cat([user_interest, query], dim=-1))  # (B, H)
        return self.out(x).squeeze(-1)  # (B,)
