"""DIN, the Deep Interest Network (Zhou et al., KDD 2018) — pure: no I/O, no loss, no devices.

Inputs are index tensors (0 = padding / unknown item or category)::

    hist_items, hist_cats:   (B, L) int64, left-padded: the newest behaviour is at [:, -1]
    target_item, target_cat: (B,)   int64, the candidate to score            (forward: one per history)
    cand_items, cand_cats:   (B, N) int64, candidates sharing each history   (score_lists: a list each)

``forward`` returns one logit per row, shape (B,); ``score_lists`` one per candidate, (B, N). A local
activation unit weighs each behaviour by its relevance to the candidate, from [q, h, q−h, q⊙h]; padded
positions get weight 0, so adding or removing padding changes nothing. Weights are *not*
softmax-normalised (sum pooling, as in the paper), which keeps the intensity of a user's interest in the
representation.

**Context** (a config with ``positions``, ``time_buckets``, ``pair_inputs`` or ``candidate_inputs``:
what the ranking stage knows besides ids, models.context builds it). The unit also reads, per behaviour,
its position from the newest and the time gap to the newest (learned terms of its first layer: DIN
itself is otherwise blind to order and time), and per (candidate, behaviour) P similarity channels —
co-visitation's sim(h_l, c) — so a behaviour co-visited with the candidate can weigh more. The MLP also
reads per candidate F features and, per channel, the similarity summed over the history (learned
recency weights), from the newest behaviour alone, and pooled by the unit's weights; ``cross`` adds
interest ⊙ candidate (an MLP learns a dot product poorly). A linear term on those features is added
to the logit, so the model starts from what a blend of them would say.
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
    # Context (see the module doc); all off: the paper's DIN, and every bundle written before them.
    positions: int = 0  # history slots with a learned position-from-newest term
    time_buckets: int = 0  # log time-gap buckets (models.context.gap_buckets); 0: no time
    pair_inputs: int = 0  # similarity channels per (candidate, behaviour)
    candidate_inputs: int = 0  # features per candidate
    cross: bool = False  # interest ⊙ candidate into the MLP

    @property
    def has_context(self) -> bool:
        return bool(self.positions or self.time_buckets or self.pair_inputs or self.candidate_inputs)

    @property
    def scores_lists(self) -> bool:
        """Whether the model is scored through ``score_lists`` (context or the cross term): serving's
        factorised fast paths (models.scorer) are written for the plain unit."""
        return self.has_context or self.cross

    @property
    def context_width(self) -> int:
        """The MLP's (and the linear term's) context features: F per candidate, 3 per pair channel."""
        return self.candidate_inputs + 3 * self.pair_inputs

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


@dataclass(frozen=True)
class ListContext:
    """What ``score_lists`` reads besides ids (models.context builds it; None where the config has none)."""

    gaps: torch.Tensor | None = None  # (B, L) int64 time-gap bucket of each behaviour, 0 = padding
    pairs: torch.Tensor | None = None  # (B, N, L, P) float similarity of candidate n and behaviour l
    candidates: torch.Tensor | None = None  # (B, N, F) float features of each candidate


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
    calibration: torch.Tensor | None  # a buffer (register_buffer): (2,) scale, bias; None for a pointwise model

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
        # Context terms (zero at start: a context model begins as the plain one plus its linear term).
        self.position_bias = nn.Parameter(torch.zeros(cfg.positions, h1)) if cfg.positions else None
        self.gap_bias = nn.Embedding(cfg.time_buckets + 1, h1, padding_idx=0, _weight=torch.zeros(
            cfg.time_buckets + 1, h1)) if cfg.time_buckets else None
        self.pair_weight = nn.Parameter(torch.zeros(2 * cfg.pair_inputs, h1)) if cfg.pair_inputs else None
        self.recency = nn.Parameter(torch.zeros(max(cfg.positions, 1))) if cfg.pair_inputs else None
        # (scale, bias) applied to a listwise model's logits: (1, 0) while training (a softmax is blind to both),
        # fitted at export on validation (training.lists.calibrate) so sigmoid(logit) is a probability again.
        self.register_buffer("calibration", torch.tensor([1.0, 0.0]) if cfg.scores_lists else None)
        width = cfg.context_width
        self.mlp = _mlp([(3 if cfg.cross else 2) * d + width, *cfg.mlp_hidden], cfg.mlp_activation, cfg.dropout)
        self.out = nn.Linear(cfg.mlp_hidden[-1], 1)
        self.linear = nn.Linear(width, 1) if width else None
        # Set from outside (the trainer, from training.kernels): a fused implementation of
        # interest_jagged for training on CPU. The same function, so not part of the config or weights.
        self.fused_unit: Callable[..., torch.Tensor] | None = None
        # The same for lists (models.kernels.list_unit), set by the trainer and the serving scorer.
        self.list_unit: Callable[..., torch.Tensor] | None = None
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
        dices = [m for m in (self.att_in_act, *self.att_hidden) if isinstance(m, Dice)]  # all of them, in order
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

    # ------------------------------------------------------------------ lists of candidates
    def score_lists(self, hist_items: torch.Tensor, hist_cats: torch.Tensor, cand_items: torch.Tensor,
                    cand_cats: torch.Tensor, context: ListContext | None = None) -> torch.Tensor:
        """(B, L) histories, (B, N) candidates each → (B, N) logits (see the module doc)."""
        h = self.embed(hist_items, hist_cats)  # (B, L, D)
        q = self.embed(cand_items, cand_cats)  # (B, N, D)
        return self.lists_from(h, hist_items != 0, q, context)[0]

    def lists_from(self, h: torch.Tensor, filled: torch.Tensor, q: torch.Tensor, context: ListContext | None = None,
                   head: Callable[[torch.Tensor], torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Everything after the lookups: behaviours h (B, L, D) with ``filled`` (B, L) marking real ones,
        candidates q (B, N, D) → ((B, N) logits, (B, N, L) the unit's weights). ``head``: the MLP and
        output layer as one function of the (R, W) rows (the serving scorer's, with eval-mode Dice folded;
        default: the modules).

        Padded layout: the unit's first layer is W·[q, h, q−h, q⊙h] = (Wq+Wd)·q + (Wh−Wd)·h + Wp·(q⊙h);
        the q term is computed once per candidate, the h term once per behaviour, and only Wp·(q⊙h) per
        pair, as one batched product Q (N, D) @ G (D, L·H1) with G[:, l] = h_l ⊙ Wp per history."""
        cfg = self.cfg
        if cfg.attention_activation == "dice":
            raise ValueError("lists of candidates need a unit without batch statistics over padded slots "
                             "(attention_activation prelu, relu or sigmoid)")
        context = context or ListContext()
        b, length, d = h.shape
        n, h1 = q.shape[1], self.att_in.out_features
        w_q, w_h, w_d, w_p = self.att_in.weight.split(d, dim=1)  # each (H1, D)
        per_cand = F.linear(q, w_q + w_d, self.att_in.bias)  # (B, N, H1)
        per_behaviour = F.linear(h, w_h - w_d)  # (B, L, H1)
        if self.position_bias is not None:  # slot j of L holds the (L − 1 − j)-th newest behaviour
            newest_first = torch.arange(length - 1, -1, -1, device=h.device).clamp_max(cfg.positions - 1)
            per_behaviour = per_behaviour + self.position_bias[newest_first]  # (L, H1) broadcast
        if self.gap_bias is not None:
            if context.gaps is None:
                raise ValueError("this model reads time gaps: give ListContext.gaps")
            per_behaviour = per_behaviour + self.gap_bias(context.gaps)  # (B, L, H1)
        pairs = context.pairs
        if self.pair_weight is not None and pairs is None:
            raise ValueError("this model reads pair similarities: give ListContext.pairs")
        if self._fusable(q):
            pf = q.new_zeros(b, n, length, 0) if pairs is None or self.pair_weight is None else pair_features(pairs)
            wpair = self.pair_weight if self.pair_weight is not None else q.new_zeros(0, h1)
            assert self.list_unit is not None  # _fusable checks it
            w = self.list_unit(q, h, per_cand, per_behaviour.expand(b, length, h1), pf, filled, w_p.t(), wpair,
                               self.att_in_act.alpha, self.att_out.weight.reshape(-1), self.att_out.bias)
        else:
            g = (h.unsqueeze(-1) * w_p.t()).transpose(1, 2).reshape(b, d, length * h1)  # (B, D, L·H1)
            z = torch.bmm(q, g).view(b, n, length, h1)  # (B, N, L, H1): Wp·(q_n ⊙ h_l)
            z = z + per_cand.unsqueeze(2) + per_behaviour.unsqueeze(1)
            if self.pair_weight is not None and pairs is not None:  # pairs given where it is (checked above)
                z = z + pair_features(pairs) @ self.pair_weight  # (B, N, L, 2P) @ (2P, H1)
            w = self._activation_weights(z) * filled.unsqueeze(1)  # (B, N, L)
        interest = torch.bmm(w, h)  # (B, N, D): sum pooling with the unit's weights
        parts = [interest, q] + ([interest * q] if cfg.cross else [])
        extra = self._context_features(w, pairs, context.candidates, length)
        if extra is not None:
            parts.append(extra)
        x = torch.cat(parts, dim=-1)  # (B, N, W)
        logits = (self.out(self.mlp(x)).squeeze(-1) if head is None  # (B, N)
                  else head(x.view(b * n, -1)).view(b, n))
        if self.linear is not None and extra is not None:
            logits = logits + self.linear(extra).squeeze(-1)
        if self.calibration is not None:
            logits = logits * self.calibration[0] + self.calibration[1]
        return logits, w

    @property
    def fuses_lists(self) -> bool:
        """Whether ``list_unit`` (models.kernels: the fused C++ unit) is set and computes this unit: one
        hidden layer with PReLU — the same function as the ops it replaces (on fp32 CPU tensors)."""
        return self.list_unit is not None and isinstance(self.att_in_act, PReLU) and len(self.att_hidden) == 0

    def _fusable(self, q: torch.Tensor) -> bool:
        """Whether ``list_unit`` computes the unit for these candidates: :attr:`fuses_lists`, fp32 on CPU."""
        return (self.fuses_lists and q.device.type == "cpu" and q.dtype == torch.float32
                and not torch.is_autocast_enabled("cpu"))

    def _context_features(self, w: torch.Tensor, pairs: torch.Tensor | None, candidates: torch.Tensor | None,
                          length: int) -> torch.Tensor | None:
        """(B, N, F + 3P): the candidate features, then per channel log(1 + 100·s) of the similarity
        summed over the history (learned recency weights per position, their mean 1), from the newest
        behaviour, and pooled by the unit's weights w (B, N, L)."""
        parts = []
        if self.cfg.candidate_inputs:
            if candidates is None:
                raise ValueError("this model reads candidate features: give ListContext.candidates")
            parts.append(candidates)
        if self.recency is not None and pairs is not None:
            slots = torch.arange(length - 1, -1, -1, device=pairs.device).clamp_max(len(self.recency) - 1)
            # A weight per position from the newest (normalised over the positions, not the slots: padding
            # on the left changes nothing); slots past the last position share its weight.
            recency = (torch.softmax(self.recency, dim=0) * len(self.recency))[slots]  # (L,) newest last
            summed = torch.einsum("bnlp,l->bnp", pairs, recency.to(pairs.dtype))  # (B, N, P)
            pooled = torch.einsum("bnl,bnlp->bnp", w.to(pairs.dtype), pairs)  # (B, N, P)
            parts += [torch.log1p(100 * summed), torch.log1p(100 * pairs[:, :, -1]), pooled]
        return torch.cat(parts, dim=-1) if parts else None


def pair_features(pairs: torch.Tensor) -> torch.Tensor:
    """(…, P) similarities → (…, 2P): log(1 + 100·s) and whether there is any (most pairs have none)."""
    return torch.cat([torch.log1p(100 * pairs), (pairs > 0).to(pairs.dtype)], dim=-1)
