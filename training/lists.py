"""DIN's listwise training data: each training positive against negatives like the candidates it will
rank at serving time, with the context DIN reads (models.context) — guarded so no sample sees itself.

Per positive (a behaviour and everything before it), K negatives, redrawn every step:

* ``hard_share`` of them from what recall returns for that history — the recall towers' best
  ``recall_candidates`` and co-visitation's best ``covisit_candidates`` new ones (the served lanes'
  sizes, models.ranking_settings), everything the user took before excluded as the seen-item policy
  excludes it — drawn uniformly from that pool;
* the rest from the catalog ∝ training count^``popular_power``, their logits corrected by −log(K_p·q(j))
  (sampled softmax's log-Q correction: what the loss sees approaches the softmax over every item).

The positive and the user's earlier items are never negatives. A step's negatives come from a generator
seeded by (seed, epoch, step): the same on every rank, the same after a resume — nothing to checkpoint.

**Guards.** Co-visitation counts each user's own pairs: a training positive's similarity to its history
would include the very co-occurrence being predicted, and a model trained on that learns to trust the
lane blindly (on ml-100k, DIN alone fell from 0.18 to 0.12 validation HR@10 with it). So a user's pair
similarities — and the co-visitation half of their mined pool — come from a lane fitted on the other
users' folds (``guard_folds`` lanes, each without one fold of users), and their candidates' counts are
the training counts less their own. At serving, the lane and the counts hold every training behaviour,
and the user's own never touch a candidate (the seen-item policy keeps those out): the same features.
Validation reads the served lane and counts, as serving does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dinrec.models.context import candidate_features, gap_buckets
from dinrec.models.din import ListContext
from dinrec.models.towers import Towers
from dinrec.retrieval.baselines import ItemCF, ItemCFConfig
from dinrec.retrieval.covisit import CoVisitation, PairTable
from dinrec.training.data import gather_history
from dinrec.training.samples import SampleSet, Split, training_ends

_DENSE_CELLS = 1 << 24  # rows × items scored at once when mining (64 MB of float32)
_POOL_CELLS = 1 << 28  # hard-negative pools kept for every training positive up to this many entries (1 GB)
# The co-visitation pair inputs as one dense (lanes, items, items) table up to this many entries (256 MB of
# float32: the guard's 6 lanes up to ~3,300 items); past it, a binary search over the neighbour rows.
DENSE_PAIRS_MAX = 1 << 26


@dataclass(frozen=True)
class ListSettings:
    negatives: int = 32  # K per positive
    hard_share: float = 0.5  # of them mined from the recall lanes' candidates
    popular_power: float = 0.75  # the rest ∝ count^power
    guard_folds: int = 5  # co-visitation lanes each fitted without one fold of users
    recall_candidates: int = 200  # the served lanes' sizes (models.ranking_settings)
    covisit_candidates: int = 100
    seed: int = 0
    context: tuple[str, ...] = ("position", "time", "covisit", "candidate")

    @property
    def hard(self) -> int:
        return int(round(self.negatives * self.hard_share))


@dataclass
class ListBatch:
    """One step's lists: B histories, N = 1 + K candidates each (the positive first)."""

    user: torch.Tensor  # (B,)
    hist_items: torch.Tensor  # (B, L)
    hist_cats: torch.Tensor  # (B, L)
    cand_items: torch.Tensor  # (B, N)
    cand_cats: torch.Tensor  # (B, N)
    context: ListContext
    valid: torch.Tensor  # (B, N) bool: a candidate the loss counts (the positive always)
    log_q: torch.Tensor  # (B, N) float32 the sampled-softmax correction, subtracted from the logits

    def take(self, rows: torch.Tensor) -> ListBatch:
        """These rows only (a rank's share of the global batch)."""
        c = self.context
        ctx = ListContext(*(t[rows] if t is not None else None for t in (c.gaps, c.pairs, c.candidates)))
        return ListBatch(self.user[rows], self.hist_items[rows], self.hist_cats[rows], self.cand_items[rows],
                         self.cand_cats[rows], ctx, self.valid[rows], self.log_q[rows])


def _item_keys(items: torch.Tensor, salt: int) -> torch.Tensor:
    """A pseudo-random key in [0, 1) per item, fixed by ``salt`` (a 32-bit multiplicative hash)."""
    x = (items.clamp_min(0) * 0x9E3779B1 + salt) & 0xFFFFFFFF
    x = ((x ^ (x >> 16)) * 0x85EBCA6B) & 0xFFFFFFFF
    x = ((x ^ (x >> 13)) * 0xC2B2AE35) & 0xFFFFFFFF
    return (x ^ (x >> 16)).double().div(2.0**32).float()


def _user_folds(n_users: int, folds: int) -> np.ndarray:
    """(U,) each user's fold: a fixed hash of the user index, so runs and ranks agree."""
    return (np.arange(n_users, dtype=np.uint64) * np.uint64(2654435761) % np.uint64(1 << 32) % np.uint64(folds)
            ).astype(np.int64)


class ListData:
    """Everything the listwise objective draws from, built once per run (the towers and the served lane
    trained first): the mining tables, the guarded context, the validation lists."""

    def __init__(self, samples: SampleSet, settings: ListSettings, towers: Towers | None, lane: CoVisitation,
                 seq_len: int) -> None:
        if settings.hard and towers is None and lane is None:
            raise ValueError("mining hard negatives needs the recall towers or the co-visitation lane")
        self.samples, self.s, self.seq_len = samples, settings, seq_len
        self.n_items = samples.vocab.n_items
        self.item_category = torch.as_tensor(samples.vocab.item_category, dtype=torch.long)
        self.seq_items = torch.from_numpy(samples.seq_items)
        self.seq_cats = torch.from_numpy(samples.seq_cats)
        self.seq_ts = torch.from_numpy(samples.seq_ts)
        self.user_offsets = torch.from_numpy(samples.user_offsets)
        train = samples.train
        self.positives = np.flatnonzero(train.label == 1)  # rows of the train split
        # The recall towers' item vectors and user tower, for mining (the served index holds these vectors).
        self.towers = towers.eval() if towers is not None else None
        self.tower_items = (towers.item_table(self.item_category).detach().float() if towers is not None
                            else None)  # (I, D)
        # Co-visitation: the served lane, and one per fold without that fold's users (the guard).
        self.lane = lane
        self.folds = _user_folds(len(samples.users), settings.guard_folds)
        ends = training_ends(samples)
        seqs = [samples.seq_items[a:b] for a, b in zip(samples.user_offsets[:-1].tolist(), ends.tolist(), strict=True)]
        cfg = ItemCFConfig(window=lane.cfg.window, decay=lane.cfg.decay, last=lane.cfg.last)
        guarded = []
        for f in range(settings.guard_folds):
            others = [seq for u, seq in enumerate(seqs) if self.folds[u] != f and len(seq)]
            guarded.append(CoVisitation.from_item_cf(ItemCF.fit(others, self.n_items, cfg), lane.cfg.neighbours))
        self.fold_lanes = guarded
        self.pairs = PairTable([*guarded, lane], DENSE_PAIRS_MAX)  # lane index F: the served one
        self.served_lane = settings.guard_folds
        # Training counts, and each user's own (the guard subtracts them).
        flat = np.concatenate(seqs) if seqs else np.zeros(0, dtype=np.int64)
        counts = np.bincount(flat, minlength=self.n_items).astype(np.float64)
        counts[0] = 0
        self.counts = torch.from_numpy(counts.astype(np.float32))
        user_of = np.repeat(np.arange(len(seqs)), [len(x) for x in seqs])
        keys, own = np.unique(user_of * self.n_items + flat, return_counts=True)
        self.own_keys, self.own_counts = torch.from_numpy(keys), torch.from_numpy(own.astype(np.float32))
        q = counts ** settings.popular_power
        q[0] = 0.0
        self.popular_p = torch.from_numpy(q / q.sum() if q.sum() > 0 else np.full_like(q, 1.0 / max(len(q) - 1, 1)))
        self.popular_cdf = torch.cumsum(self.popular_p, 0)
        self._pool_width = min(settings.recall_candidates, self.n_items - 1) + min(settings.covisit_candidates,
                                                                                     self.n_items - 1)
        self._pools: torch.Tensor | None = None

    # ------------------------------------------------------------------ histories and context
    def _histories(self, split: Split, rows: np.ndarray) -> tuple[torch.Tensor, ...]:
        end = torch.from_numpy(split.hist_end[rows])
        length = torch.from_numpy(np.minimum(split.hist_len[rows], self.seq_len))
        items = gather_history(self.seq_items, end, length, self.seq_len)  # (B, L)
        cats = gather_history(self.seq_cats, end, length, self.seq_len)
        ts = gather_history(self.seq_ts, end, length, self.seq_len)
        return items, cats, gap_buckets(ts, items != 0)

    def _seen(self, split: Split, rows: np.ndarray, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(row in [0, hi − lo), item) of everything rows[lo:hi]'s users took before their targets."""
        users = split.user[rows[lo:hi]]
        starts, ends = self.samples.user_offsets[users], split.hist_end[rows[lo:hi]]
        lengths = torch.from_numpy(ends - starts)
        which = torch.repeat_interleave(torch.arange(hi - lo), lengths)
        offsets = torch.arange(int(lengths.sum())) - torch.repeat_interleave(torch.cumsum(lengths, 0) - lengths,
                                                                            lengths)
        return which, self.seq_items[torch.repeat_interleave(torch.from_numpy(starts), lengths) + offsets]

    def context(self, user: torch.Tensor, hist_items: torch.Tensor, hist_cats: torch.Tensor, gaps: torch.Tensor,
                cand: torch.Tensor, guarded: bool) -> ListContext:
        """The context of (B, N) candidates: pairs and counts from the guarded lanes and counts (training)
        or the served ones (validation, as serving)."""
        s = self.s.context
        fold = (torch.from_numpy(self.folds[user.numpy()]) if guarded
                else torch.full((len(user),), self.served_lane, dtype=torch.long))
        pairs = self.pairs.lookup(hist_items, cand, fold).unsqueeze(-1) if "covisit" in s else None  # (B, N, L, 1)
        features = None
        if "candidate" in s:
            counts = self.counts[cand.clamp_min(0)]
            if guarded:
                counts = counts - self._own(user, cand)
            features = candidate_features(counts, self.item_category[cand.clamp_min(0)], hist_cats)
        return ListContext(gaps if "time" in s else None, pairs, features)

    def _own(self, user: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        keys = user.unsqueeze(1) * self.n_items + cand  # (B, N)
        pos = torch.searchsorted(self.own_keys, keys).clamp_max(max(len(self.own_keys) - 1, 0))
        return torch.where(self.own_keys[pos] == keys, self.own_counts[pos], 0.0) if len(self.own_keys) else \
            torch.zeros(keys.shape)

    # ------------------------------------------------------------------ candidates (the served lanes)
    def pool(self, split: Split, rows: np.ndarray, hist_items: torch.Tensor, hist_cats: torch.Tensor,
             guarded: bool) -> torch.Tensor:
        """(B, R + C) the served lanes' candidates for ``rows``' histories, -1 where fewer: the towers'
        best R, then co-visitation's best C not among them (the user's own fold lane when ``guarded``),
        never an item the user took before."""
        s, b = self.s, len(rows)
        r, c = min(s.recall_candidates, self.n_items - 1), min(s.covisit_candidates, self.n_items - 1)
        out = torch.full((b, r + c), -1, dtype=torch.long)
        chunk = max(1, _DENSE_CELLS // self.n_items)
        users = split.user[rows]
        with torch.no_grad():
            queries = (self.towers.users(hist_items, hist_cats).float() if self.towers is not None else None)
            for lo in range(0, b, chunk):
                hi = min(b, lo + chunk)
                which, taken = self._seen(split, rows, lo, hi)
                blocked = torch.zeros(hi - lo, self.n_items, dtype=torch.bool)
                blocked[:, 0] = True
                blocked[which, taken] = True
                if queries is not None:
                    assert self.tower_items is not None  # set with the towers, as queries are
                    scores = queries[lo:hi] @ self.tower_items.T  # (b, I)
                    scores.masked_fill_(blocked, -torch.inf)
                    top = scores.topk(r, dim=1)
                    out[lo:hi, :r] = torch.where(torch.isfinite(top.values), top.indices, -1)
                    blocked.scatter_(1, top.indices, True)
                lanes = (self.folds[users[lo:hi]] if guarded else np.full(hi - lo, self.served_lane))
                co = self.pairs.history_scores(hist_items[lo:hi], torch.from_numpy(lanes), self.lane.cfg, self.n_items)
                co.masked_fill_(blocked, 0.0)
                top = co.topk(c, dim=1)
                out[lo:hi, r:] = torch.where(top.values > 0, top.indices, -1)
        return out

    # ------------------------------------------------------------------ a training step
    def pools(self) -> torch.Tensor | None:
        """Every training positive's hard-negative pool (the guarded lanes' candidates for its history: they
        do not change while DIN trains), mined once and kept while they fit in ``_POOL_CELLS``; None:
        mine them at each step."""
        if self._pools is None and self.s.hard and len(self.positives) * self._pool_width <= _POOL_CELLS:
            split, parts = self.samples.train, []
            for lo in range(0, len(self.positives), 1024):
                rows = self.positives[lo:lo + 1024]
                hist_items, hist_cats, _ = self._histories(split, rows)
                parts.append(self.pool(split, rows, hist_items, hist_cats, guarded=True).int())
            self._pools = torch.cat(parts) if parts else torch.zeros(0, self._pool_width, dtype=torch.int32)
        return self._pools

    def batch(self, idx: np.ndarray, epoch: int, step: int) -> ListBatch:
        """The lists of training positives ``idx`` (indices into :attr:`positives`) for step ``step`` of
        ``epoch``."""
        s = self.s
        split = self.samples.train
        positives = self.positives[idx]
        g = torch.Generator().manual_seed((s.seed * 1_000_003 + epoch * 100_003 + step) % (2**63))
        user = torch.from_numpy(split.user[positives])
        target = torch.from_numpy(split.target_item[positives])  # (B,)
        hist_items, hist_cats, gaps = self._histories(split, positives)
        b = len(positives)
        parts, valid, log_q = [target.unsqueeze(1)], [torch.ones(b, 1, dtype=torch.bool)], [torch.zeros(b, 1)]
        if s.hard:
            pools = self.pools()
            pool = (pools[torch.from_numpy(np.asarray(idx))].long() if pools is not None
                    else self.pool(split, positives, hist_items, hist_cats, guarded=True))  # (B, P)
            usable = (pool >= 0) & (pool != target.unsqueeze(1))
            # A uniform draw from each pool, keyed by item (not by its place in the pool): an item the towers
            # rank 200th in one run and 201st in another (float order, DDP) changes one pick, not the rest.
            keys = _item_keys(pool, int(torch.randint(0, 2**31 - 1, (1,), generator=g))).masked_fill(~usable, -1.0)
            pick = keys.topk(min(s.hard, pool.shape[1]), dim=1)
            parts.append(pool.gather(1, pick.indices).clamp_min(0))
            valid.append(pick.values >= 0)
            log_q.append(torch.zeros(pick.values.shape))
        popular = s.negatives - s.hard
        if popular:
            draws = torch.searchsorted(self.popular_cdf, torch.rand(b, popular, generator=g, dtype=torch.float64))
            draws = draws.clamp(1, self.n_items - 1)
            parts.append(draws)
            valid.append(draws != target.unsqueeze(1))
            log_q.append(torch.log(popular * self.popular_p[draws]).float())
        cand = torch.cat(parts, dim=1)  # (B, N)
        ok = torch.cat(valid, dim=1)
        which, taken = self._seen(split, positives, 0, b)  # what the user took: never a negative
        taken_mask = torch.zeros(b, self.n_items, dtype=torch.bool) if b * self.n_items <= _DENSE_CELLS else None
        if taken_mask is not None:
            taken_mask[which, taken] = True
            ok[:, 1:] &= ~taken_mask.gather(1, cand[:, 1:])
        else:  # a very large catalog: the window the model reads (the pool already excludes the rest)
            ok[:, 1:] &= ~(cand[:, 1:].unsqueeze(2) == hist_items.unsqueeze(1)).any(dim=2)
        context = self.context(user, hist_items, hist_cats, gaps, cand, guarded=True)
        return ListBatch(user, hist_items, hist_cats, cand, self.item_category[cand], context, ok,
                         torch.cat(log_q, dim=1))

    # ------------------------------------------------------------------ validation
    def candidate_lists(self, split: Split, rows: np.ndarray, batch: int = 256):
        """Per chunk of ``rows`` (positives of a held-out split): (rows, the served lanes' candidates
        (b, R + C) with -1 where fewer, where the target is among them (b,) or -1, and the inputs DIN
        reads) — what DIN alone is measured on, as it will rank at serving time."""
        for lo in range(0, len(rows), batch):
            part = rows[lo:lo + batch]
            hist_items, hist_cats, gaps = self._histories(split, part)
            cand = self.pool(split, part, hist_items, hist_cats, guarded=False)
            target = torch.from_numpy(split.target_item[part])
            hit = cand == target.unsqueeze(1)
            where = torch.where(hit.any(dim=1), hit.float().argmax(dim=1), -1)
            user = torch.from_numpy(split.user[part])
            safe = cand.clamp_min(0)
            context = self.context(user, hist_items, hist_cats, gaps, safe, guarded=False)
            yield part, cand, where, (hist_items, hist_cats, safe, self.item_category[safe], context)

    def split_groups(self, split: Split, batch: int = 256):
        """A held-out split's rows as lists — each positive with its sampled negatives, which share its
        history — for AUC/GAUC: (row indices (b, 1 + E), inputs DIN reads)."""
        starts = np.flatnonzero(split.label == 1)
        width = int(np.diff(np.r_[starts, len(split.label)]).max()) if len(starts) else 1
        if len(starts) and not np.all(np.diff(np.r_[starts, len(split.label)]) == width):
            raise ValueError("a held-out split's positives must each have the same number of negatives")
        for lo in range(0, len(starts), batch):
            part = starts[lo:lo + batch]
            group = part[:, None] + np.arange(width)  # (b, 1 + E)
            hist_items, hist_cats, gaps = self._histories(split, part)
            cand = torch.from_numpy(split.target_item[group])
            user = torch.from_numpy(split.user[part])
            context = self.context(user, hist_items, hist_cats, gaps, cand, guarded=False)
            yield group, (hist_items, hist_cats, cand, self.item_category[cand], context)


def calibrate(model, lists: ListData, batch: int = 256) -> dict:
    """Fit the listwise model's (scale, bias) (models.din: DIN.calibration) on the validation split's
    positives against their sampled negatives — Platt scaling: a softmax-trained logit has no absolute
    level, and the gate compares probabilities (log loss, calibration) — and set it; returns the fit."""
    split = lists.samples.val
    model.eval()
    logits, labels = [], []
    with torch.no_grad():
        model.calibration.copy_(torch.tensor([1.0, 0.0]))
        for group, (hist_items, hist_cats, cand, cand_cats, context) in lists.split_groups(split, batch):
            logits.append(model.score_lists(hist_items, hist_cats, cand, cand_cats, context).float().reshape(-1))
            labels.append(torch.from_numpy(split.label[group].reshape(-1)))
    if not logits:
        return {"scale": 1.0, "bias": 0.0, "rows": 0}
    z, y = torch.cat(logits).double(), torch.cat(labels).double()
    ab = torch.tensor([1.0, 0.0], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([ab], lr=0.5, max_iter=100, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(z * ab[0] + ab[1], y)
        loss.backward()
        return loss

    opt.step(closure)
    scale, bias = (float(v) for v in ab.detach())
    with torch.no_grad():
        model.calibration.copy_(torch.tensor([scale, bias]))
    before = float(torch.nn.functional.binary_cross_entropy_with_logits(z, y))
    after = float(torch.nn.functional.binary_cross_entropy_with_logits(z * scale + bias, y))
    negatives = int(round(float((1 - y).sum() / y.sum()))) if y.sum() > 0 else 0
    return {"scale": round(scale, 5), "bias": round(bias, 5), "rows": int(len(y)), "negatives_per_positive": negatives,
            "val_logloss_before": round(before, 5), "val_logloss_after": round(after, 5)}
