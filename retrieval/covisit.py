"""The co-visitation lane: item-to-item CF (retrieval.baselines.ItemCF) kept as each item's ``M``
nearest neighbours, so serving can recall with it and score candidates by it in microseconds.

A user's score for item j is Σ_r decay^r · sim(h_r, j) over their ``last`` newest behaviours h_r
(r = 0 the newest) — ItemCF's own formula, with each row of the similarity matrix cut to its ``M``
largest entries::

    neighbours: (I, M) int64 item indices (0 = none), best first
    weights:    (I, M) float32 similarities (0 where there is no neighbour)
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from dinrec.retrieval.baselines import ItemCF


@dataclass(frozen=True)
class CoVisitConfig:
    neighbours: int = 100  # M: per item
    last: int = 20  # the user's newest behaviours a query reads
    decay: float = 0.9  # weight of the r-th newest: decay^r
    window: int = 10  # co-visitation window it was fitted with (for the record)

    def to_json(self) -> dict:
        return asdict(self)


class CoVisitation:
    def __init__(self, neighbours: np.ndarray, weights: np.ndarray, cfg: CoVisitConfig) -> None:
        if neighbours.shape != weights.shape or neighbours.ndim != 2:
            raise ValueError(f"neighbours {neighbours.shape} and weights {weights.shape} must be one (I, M) shape")
        self.neighbours = neighbours.astype(np.int64, copy=False)
        self.weights = weights.astype(np.float32, copy=False)
        self.cfg = cfg

    @classmethod
    def from_item_cf(cls, cf: ItemCF, neighbours: int = 100) -> CoVisitation:
        sim = cf.sim.tocsr()
        n = sim.shape[0]
        ids = np.zeros((n, neighbours), dtype=np.int64)
        w = np.zeros((n, neighbours), dtype=np.float32)
        for i in range(n):
            lo, hi = sim.indptr[i], sim.indptr[i + 1]
            cols, vals = sim.indices[lo:hi], sim.data[lo:hi]
            if len(cols) > neighbours:
                top = np.argpartition(-vals, neighbours - 1)[:neighbours]
                cols, vals = cols[top], vals[top]
            order = np.argsort(-vals, kind="stable")
            ids[i, :len(order)], w[i, :len(order)] = cols[order], vals[order]
        return cls(ids, w, CoVisitConfig(neighbours=neighbours, last=cf.cfg.last, decay=cf.cfg.decay,
                                         window=cf.cfg.window))

    @property
    def n_items(self) -> int:
        return self.neighbours.shape[0]

    def _scores(self, history: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(ids, scores) of every item some recent behaviour co-visits, any order."""
        recent = np.asarray([i for i in history if 0 < i < self.n_items][-self.cfg.last:], dtype=np.int64)[::-1]
        if len(recent) == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        decay = (self.cfg.decay ** np.arange(len(recent))).astype(np.float32)  # (R,)
        ids = self.neighbours[recent].ravel()  # (R·M,)
        w = (self.weights[recent] * decay[:, None]).ravel()  # (R·M,)
        keep = w > 0
        uniq, inverse = np.unique(ids[keep], return_inverse=True)
        return uniq, np.bincount(inverse, weights=w[keep]).astype(np.float32)

    def recall(self, history: Sequence[int], n: int, excluded: Collection[int] = ()) -> tuple[np.ndarray, np.ndarray]:
        """The ``n`` best items for ``history`` (item indices, oldest first), ``excluded`` never:
        (ids, scores), best first."""
        ids, scores = self._scores(history)
        if len(excluded):
            keep = ~np.isin(ids, np.fromiter(excluded, dtype=np.int64, count=len(excluded)))
            ids, scores = ids[keep], scores[keep]
        top = np.argsort(-scores, kind="stable")[:n]
        return ids[top], scores[top]

    def score(self, history: Sequence[int], candidates: np.ndarray) -> np.ndarray:
        """(N,) candidate item indices → (N,) their co-visitation scores (0 for none; ids past the
        table — items it never saw — score 0)."""
        ids, scores = self._scores(history)
        out = np.zeros(len(candidates), dtype=np.float32)
        if len(ids):
            pos = np.searchsorted(ids, candidates)
            pos = np.minimum(pos, len(ids) - 1)
            hit = ids[pos] == candidates
            out[hit] = scores[pos[hit]]
        return out

    def scores_from_pairs(self, sims: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """What :meth:`score` gives for a history and from its newest behaviour alone, read off the
        similarities already looked up for it (PairTable.lookup: (N, L) sim(h_l, c) over the history's
        known behaviours, oldest first) → (N,) and (N,): the same sums, without searching the rows again."""
        recent = sims[:, -self.cfg.last:] if sims.shape[1] else sims  # (N, R) newest last
        r = recent.shape[1]
        decay = (self.cfg.decay ** np.arange(r - 1, -1, -1)).astype(np.float32)  # (R,) 1 for the newest
        newest = recent[:, -1].astype(np.float32) if r else np.zeros(len(sims), dtype=np.float32)
        return (recent @ decay).astype(np.float32), newest

    def save(self, path: str | Path) -> None:
        with open(path, "wb") as fh:
            np.savez(fh, neighbours=self.neighbours, weights=self.weights,
                     config=np.array([self.cfg.neighbours, self.cfg.last, self.cfg.window], dtype=np.int64),
                     decay=np.array([self.cfg.decay], dtype=np.float64))

    @classmethod
    def load(cls, path: str | Path) -> CoVisitation:
        with np.load(path, allow_pickle=False) as f:
            m, last, window = (int(x) for x in f["config"])
            return cls(f["neighbours"], f["weights"], CoVisitConfig(neighbours=m, last=last,
                                                                   decay=float(f["decay"][0]), window=window))


class PairTable:
    """sim(h, c) — the lane's similarity of a behaviour's item h to a candidate c (0 where c is not among
    h's neighbours) — for every (candidate, behaviour) of a batch at once, from one lane or one per fold
    (training reads each user's from the lane fitted without them). Each lane's neighbour rows are kept
    sorted by item: a short list of candidates (training's) is binary-searched in each behaviour's row;
    a long one (a served request's hundreds) is put in a per-thread item → position map, and each
    behaviour's neighbours are read from it. Nothing grows with the catalog but the tables (and one map
    per thread). With ``dense_max_entries`` ≥ F·I², the lanes are also spread into one dense (F, I, I)
    table and a lookup is a gather (training, where a step looks up B·N·L pairs: a third of the step's
    time went to the binary search); the values are the same every way."""

    def __init__(self, lanes: Sequence[CoVisitation], dense_max_entries: int = 0) -> None:
        if not lanes or len({lane.neighbours.shape for lane in lanes}) != 1:
            raise ValueError("a pair table needs lanes of one shape")
        ids = np.stack([np.where(lane.weights > 0, lane.neighbours, -1) for lane in lanes])  # (F, I, M); -1: none
        weights = np.stack([lane.weights for lane in lanes])
        order = np.argsort(ids, axis=2, kind="stable")
        ids = np.take_along_axis(ids, order, axis=2)
        if ((ids[..., 1:] == ids[..., :-1]) & (ids[..., 1:] >= 0)).any():  # a hand-made or damaged lane file
            raise ValueError("a co-visitation lane lists an item twice among one item's neighbours")
        self.ids = torch.from_numpy(ids)  # (F, I, M) ascending per row
        self.weights = torch.from_numpy(np.take_along_axis(weights, order, axis=2).astype(np.float32))
        self.n_items = lanes[0].n_items
        self._local = threading.local()  # each thread's item → candidate position map (:meth:`_positions`)
        self.dense: torch.Tensor | None = None  # (F·I·I,) sim(h, c) of lane f at (f·I + h)·I + c
        f, i, _ = self.ids.shape
        if f * i * i <= dense_max_entries:
            dense = torch.zeros(f, i, i)
            rows = (torch.arange(f).view(f, 1, 1) * i + torch.arange(i).view(1, i, 1)).expand_as(self.ids)
            has = self.ids >= 0
            dense.view(f * i, i)[rows[has], self.ids[has]] = self.weights[has]
            self.dense = dense.view(-1)

    def _positions(self) -> torch.Tensor:
        """This thread's (I,) int64 map from item to a candidate position, -1 everywhere between lookups
        (a lookup sets its candidates' entries and resets them): allocated once per thread, not per call."""
        at = getattr(self._local, "positions", None)
        if at is None:
            with torch.inference_mode(False):  # a normal tensor: updated in place in and out of inference mode
                at = self._local.positions = torch.full((self.n_items,), -1, dtype=torch.int64)
        return at

    def history_scores(self, hist: torch.Tensor, fold: torch.Tensor, cfg: CoVisitConfig, n_items: int) -> torch.Tensor:
        """Left-padded histories hist (B, L), newest last, fold (B,) the lane each reads → (B, n_items) every
        item's co-visitation score Σ_r decay^r · sim(h_r, ·) over the ``cfg.last`` newest behaviours: what
        :meth:`CoVisitation.recall` ranks by, for a batch at once."""
        recent = hist[:, -cfg.last:]  # (B, R) newest last
        rank = torch.arange(recent.shape[1] - 1, -1, -1)  # slots' rank from the newest (no gaps: left-padded)
        decay = (cfg.decay ** rank.double()).float() * (recent != 0)  # (B, R)
        ids = self.ids[fold.unsqueeze(1), recent]  # (B, R, M); -1: none
        w = self.weights[fold.unsqueeze(1), recent] * decay.unsqueeze(2)
        scores = torch.zeros(len(hist), n_items)
        scores.scatter_add_(1, ids.clamp_min(0).flatten(1), (w * (ids >= 0)).flatten(1))
        return scores

    def lookup(self, hist: torch.Tensor, cand: torch.Tensor, fold: torch.Tensor | None = None) -> torch.Tensor:
        """hist (B, L) and cand (B, N) item indices (0: padding or unknown; past the lanes' items: cold,
        never similar), fold (B,) the lane each row reads (default: the first) → (B, N, L) float32."""
        b, length = hist.shape
        f = torch.zeros(b, dtype=torch.long) if fold is None else fold
        known = (hist > 0) & (hist < self.n_items)
        if self.dense is not None:
            i = self.n_items
            warm = cand < i  # (B, N); cold candidates are never similar
            at = (f.view(b, 1, 1) * i + (hist * known).unsqueeze(1)) * i + (cand * warm).unsqueeze(2)  # (B, N, L)
            return torch.where(known.unsqueeze(1) & warm.unsqueeze(2), self.dense[at], 0.0)
        n = cand.shape[1]
        if n == 0:
            return torch.zeros(b, 0, length)
        rows = self.ids[f.unsqueeze(1), hist * known]  # (B, L, M) ascending; -1: none
        m = rows.shape[2]
        if n <= m:  # few candidates (training's lists): each looked up in each behaviour's row, N·L searches
            values = cand.unsqueeze(1).expand(b, length, n).contiguous()  # (B, L, N)
            pos = torch.searchsorted(rows, values).clamp_max(m - 1)  # (B, L, N)
            hit = (rows.gather(2, pos) == values) & known.unsqueeze(2)
            sims = torch.where(hit, self.weights[f.unsqueeze(1), hist * known].gather(2, pos), 0.0)  # (B, L, N)
            return sims.transpose(1, 2).contiguous()  # (B, N, L)
        # Many (a served request's hundreds): each behaviour's M neighbours looked up among the candidates
        # through a map from item to candidate position — L·M reads, where looking each candidate up in
        # each behaviour's row would be N·L binary searches scattered over the table.
        out = torch.zeros(b, n, length)
        at = self._positions()  # (I,) -1 everywhere between calls
        for r in range(b):
            behaviours = hist[r] * known[r]  # (L,) the unknown read item 0's row, and are masked below
            ids = self.ids[f[r]].index_select(0, behaviours).view(-1)  # (L·M,) neighbour ids, -1: none
            warm = torch.nonzero(cand[r] < self.n_items).squeeze(1)  # (W,) positions of candidates the lane knows
            items = cand[r].index_select(0, warm)
            try:
                at[items] = warm  # an item listed twice: one of its positions (read back below)
                kept = at.index_select(0, items)  # (W,) the position each warm candidate's item maps to
                found = at.index_select(0, ids.clamp_min(0))  # (L·M,) each neighbour's candidate position, -1: none
            finally:
                at[items] = -1
            hits = torch.nonzero((found >= 0) & (ids > 0) & known[r].repeat_interleave(m)).squeeze(1)  # (K,) in L·M
            sims = self.weights[f[r]].index_select(0, behaviours).view(-1).index_select(0, hits)  # (K,)
            at_pair = found.index_select(0, hits) * length + torch.div(hits, m, rounding_mode="floor")  # n·L + l
            out[r].view(-1).index_put_((at_pair,), sims)
            out[r, warm] = out[r].index_select(0, kept)  # repeats read the row of the position their item mapped to
        return out
