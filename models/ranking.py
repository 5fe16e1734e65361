"""The ranking stage — the one place the served list is made: history → recall lanes (models.recall:
the towers' user tower and FAISS; co-visitation; the cold, popular and fresh lanes) → DIN scores
(models.scorer) → blend → re-rank (business rules, the long-tail lane) → fill → the seen-item policy.

``GET /recommend`` serves through it, and everything that measures the served list calls it with the
served configuration (models.ranking_settings): the retrain gate, the blend's fit and ``dinrec bench e2e``.
Built once per bundle (the service swaps the whole Recommender when a new bundle loads).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Hashable
from dataclasses import dataclass, field

import numpy as np
import torch

from dinrec.events.features import HistoryItem
from dinrec.models.blend import FEATURES, candidate_signals
from dinrec.models.bundle import Bundle
from dinrec.models.context import probe_context, served_context
from dinrec.models.din import ListContext
from dinrec.models.ranking_settings import RankingSettings
from dinrec.models.recall import RecallSpace
from dinrec.models.rows import AppendOnlyRows
from dinrec.models.scorer import Probe, Scorer, Scores, choose_scorer
from dinrec.retrieval.index import FaissIndex, choose_search_index, exact_search


@dataclass(frozen=True)
class Because:
    """One of the user's behaviours that drew an item, and its weight in DIN's activation unit."""

    item_id: str
    category_id: str
    weight: float


@dataclass(frozen=True)
class Scored:
    item_id: str
    category_id: str
    score: float
    because: list[Because] | None = None  # with explain: the behaviours with the largest weights


@dataclass
class _Kept:
    """What :attr:`Recommender.memo` keeps of one history: recall's candidates (N,) and query (1, D), DIN's
    scores and the context it read, and the blend's (N, F) signals by the temperature they were read at."""

    recall: tuple[np.ndarray, np.ndarray]
    scored: Scores
    context: ListContext | None
    signals: dict[float, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class ColdLane:
    """Items that arrived after the model was trained (the store's catalog knows them, the bundle
    does not), recallable through their category: candidate ids ``base + j``. One version of the lane:
    more new items make a longer one (their rows appended, models.rows; nothing copied), swapped in
    with one assignment; a request holding this version sees its ``size`` items and no others."""

    vectors: AppendOnlyRows      # (C, D) float32 their item-tower vectors (category only), by j
    names: list[str]             # item id by j; shared by the versions that extend the latest, append-only:
                                 # the first ``size`` are this one's (extending an older version forks them)
    categories: list[str]        # category id by j; the same
    ids: dict[str, int]          # item id -> candidate id; shared, append-only (see :meth:`id_of`)
    scorer: Scorer               # the serving scorer, extended with their rows
    base: int                    # the bundle's item count: the first cold candidate id

    @property
    def size(self) -> int:
        return len(self.vectors)

    def id_of(self, item_id: str) -> int | None:
        """The candidate id of ``item_id`` if it is in this version of the lane."""
        c = self.ids.get(item_id)
        return c if c is not None and c < self.base + self.size else None

    def search(self, query: np.ndarray, n: int, excluded: set[int]) -> tuple[np.ndarray, np.ndarray]:
        """The exact top ``n`` of the lane for ``query`` (1, D): candidate ids (n,) and scores (n,)."""
        ids, scores = exact_search(self.vectors.rows.numpy(), query, n, [excluded], first_id=self.base)
        return ids[0], scores[0]

    def with_items(self, picked: list[tuple[str, str]], cats: torch.Tensor, vectors: torch.Tensor) -> ColdLane:
        """This lane and the (item id, category id) pairs ``picked`` after its items: ``cats`` (C,) their
        category indices, ``vectors`` (C, D) their tower vectors."""
        names, categories, ids = self.names, self.categories, self.ids
        if len(names) != self.size:  # a newer version already appended to the shared lists: this one forks
            end = self.base + self.size
            names, categories = names[:self.size], categories[:self.size]
            ids = {item: c for item, c in ids.items() if c < end}
        for j, (item, cat) in enumerate(picked):
            names.append(item)
            categories.append(cat)
            ids[item] = self.base + self.size + j
        return ColdLane(self.vectors.appended(vectors), names, categories, ids,
                        self.scorer.with_cold_items(cats), self.base)


@dataclass(frozen=True)
class Ranking:
    items: list[Scored]
    strategy: str  # "din" (recall + rank) or "popular" (no usable history)
    known_history: int  # behaviours the model recognised
    seconds: dict[str, float] = field(default_factory=dict)  # per stage: recall, rank (wall time)
    # The thread's CPU in recall and in scoring (DIN); the request runs inline on the worker's loop, so
    # this is the worker's cost of the stage (the rest of ranking is what the caller counts as select).
    cpu_seconds: dict[str, float] = field(default_factory=dict)


class Recommender:
    def __init__(self, bundle: Bundle, index: FaissIndex, settings: RankingSettings | None = None,
                 precision: str = "auto") -> None:
        """``settings``: the served list's configuration (default: read from the environment, as the
        service reads it)."""
        settings = settings if settings is not None else RankingSettings()
        self.settings = settings
        self.reranker = settings.reranker()
        self.bundle = bundle
        self.model = bundle.model.eval()
        self.index = index
        self.recall_candidates = settings.recall_candidates
        self.explain_top = 3  # behaviours named per item with explain
        self.seq_len = bundle.seq_len
        self._item_idx = bundle.vocab.item_index()
        self._cat_idx = {c: i for i, c in enumerate(bundle.vocab.categories) if i != 0}
        self._item_cat = torch.as_tensor(bundle.vocab.item_category, dtype=torch.long)
        # Category name by item index, as a list: indexing it per candidate is ~20x cheaper than numpy.
        self._item_cat_name = [bundle.vocab.categories[c] for c in bundle.vocab.item_category.tolist()]
        self.recall = RecallSpace(self.model, bundle.towers, bundle.vocab.item_category)
        long_tail = bundle.long_tail()
        self._tail = long_tail.tolist() if long_tail is not None else None  # by item index; a list: cheap lookups
        if index.dim != self.recall.dim:
            raise ValueError(f"bundle {bundle.path}: its index has {index.dim}-d vectors, its {self.recall.kind} "
                             f"recall space {self.recall.dim}-d")
        probes = self._probes(16)
        # the fastest implementation on this CPU whose scores stay within 1e-3 of fp32, timed now
        self.scorer, self.scorer_choice = choose_scorer(self.model, self._item_cat, precision, probes[:4])
        # and the faster of the exact scan and its half-precision copy (the same top items), timed now
        queries = np.concatenate([self.recall.query(h.tolist(), c.tolist()) for h, c, *_ in probes])
        self.index, self.index_choice = choose_search_index(index, queries, self.recall_candidates + self.seq_len)
        self.fresh_candidates = settings.fresh_candidates  # cold items every recall includes, however they score
        self.popular_candidates = settings.popular_candidates  # the most popular unseen items, in every recall
        self._popular_idx = [i for i in (self._item_idx.get(item) for item, _ in bundle.popularity) if i]
        self.cold: ColdLane | None = None
        # The co-visitation lane's best unseen items join every recall (0: off), and with a blend
        # the served score is DIN's blended with the lanes' (models.blend).
        self.covisit = bundle.covisit
        self.covisit_candidates = settings.covisit_candidates if bundle.covisit is not None else 0
        self.blend = bundle.blend
        # What a DIN with context reads (models.context): co-visitation per (candidate, behaviour), counts.
        self._pairs, self._counts_t = bundle.context_sources()
        self._counts = self._counts_t.numpy()  # (I,) float32, the blend's popularity signal too
        # Set to {} by a caller that ranks the same histories again under another blend or tail share (bench
        # e2e's variants, between which only ``blend`` changes): each history's candidates, DIN's logits and
        # the blend's signals are kept here and reused, so a variant costs its blend and rerank, not recall
        # and DIN again. None (serving): nothing kept.
        self.memo: dict[Hashable, _Kept] | None = None

    def set_cold_items(self, items: list[tuple[str, str]]) -> int:
        """Make the cold lane the (item id, category id) pairs of ``items`` this model does not know, whose
        category it knows (with recall towers only: their vector comes from the category); returns how many
        joined. Appends while the lane holds nothing ``items`` lacks (nothing copied; the same items again
        do nothing); once the catalog dropped some (serving.catalog caps each category), a new lane."""
        cold = self.cold
        if cold is not None and not {name for name, _ in items} >= set(cold.names[:cold.size]):
            cold = None  # some were dropped: the lane is built again (requests holding the old one keep it)
        picked = list({i: c for i, c in items if i not in self._item_idx and c in self._cat_idx
                       and (cold is None or cold.id_of(i) is None)}.items())
        if not picked:
            if cold is None:
                self.cold = None
            return 0
        cats = torch.tensor([self._cat_idx[c] for _, c in picked], dtype=torch.long)  # (C,)
        vectors = self.recall.cold_item_vectors(cats)  # (C, D); None without towers
        if vectors is None:
            return 0
        if not np.isfinite(vectors).all():
            raise ValueError("cold item vectors contain NaN or infinity")
        if cold is None:
            base = len(self.bundle.vocab.items)
            cold = ColdLane(AppendOnlyRows(torch.empty(0, vectors.shape[1])), [], [], {}, self.scorer, base)
        self.cold = cold.with_items(picked, cats, torch.from_numpy(vectors))
        return len(picked)

    def _excluded(self, seen: Collection[str], cold: ColdLane | None) -> set[int]:
        """Candidate ids (bundle items, then cold ones) of the item ids in ``seen``."""
        out = {i for i in (self._item_idx.get(item) for item in seen) if i}
        if cold is not None:
            out.update(c for c in (cold.id_of(item) for item in seen) if c is not None)
        return out

    def _recall(self, query: np.ndarray, n: int, excluded: set[int], cold: ColdLane | None) -> np.ndarray:
        """The n best candidates for ``query`` (item indices; cold items past n_items), ``excluded`` ones
        never: the catalog's index merged by score with the cold lane's, plus ``fresh_candidates`` cold
        ones, plus ``popular_candidates`` of the most popular items not already among them."""
        out = self._by_score(query, n, excluded, cold)
        if self.popular_candidates:  # the popularity lane: what everybody takes, whatever the query says
            have = excluded | set(out.tolist())
            extra = [i for i in self._popular_idx if i not in have][:self.popular_candidates]
            out = np.concatenate([out, np.asarray(extra, dtype=np.int64)])
        return out

    def _candidates(self, items: list[int], cats: list[int], n: int, excluded: set[int],
                    cold: ColdLane | None) -> tuple[np.ndarray, np.ndarray]:
        """Every lane's candidates for one history: (N,) candidate ids and the (1, D) recall query."""
        query = self.recall.query(items, cats)  # (1, D)
        cand = self._recall(query, n, excluded, cold)  # (N,)
        if self.covisit is not None and self.covisit_candidates:
            extra, _ = self.covisit.recall([i for i in items if i], self.covisit_candidates,
                                           excluded=excluded | set(cand.tolist()))
            cand = np.concatenate([cand, extra])
        return cand, query

    def _context(self, window: list[HistoryItem], items: list[int], cand: np.ndarray,
                 scorer: Scorer) -> ListContext | None:
        """What a DIN with context reads for these candidates (N,) (models.context), over the history's
        known behaviours as one list — the scorer's L' — with their ``ts``."""
        if not self.model.cfg.has_context:
            return None
        known = [j for j, i in enumerate(items) if i]
        hist = torch.tensor([[items[j] for j in known]], dtype=torch.long)  # (1, L')
        cats = torch.tensor([[self._cat_idx.get(window[j].category_id, 0) for j in known]], dtype=torch.long)
        ts = torch.tensor([[window[j].ts for j in known]], dtype=torch.float64)
        c = torch.from_numpy(cand).unsqueeze(0)  # (1, N)
        return served_context(self.model.cfg, self._pairs, self._counts_t, hist, cats, ts, c, scorer.item_category[c])

    def _signals(self, logits: torch.Tensor, cand: np.ndarray, items: list[int], cats: list[int],
                 query: np.ndarray, cold: ColdLane | None, scorer: Scorer, context: ListContext | None) -> np.ndarray:
        """The blend's (N, F) features (models.blend) of the candidates ``cand`` (N,): DIN's logits, the
        towers' cosines, co-visitation's scores (read off DIN's ``context`` where it holds the lane's
        similarities), the recent category's share and popularity."""
        base = len(self.bundle.vocab.items)
        known = cand < base
        vectors = np.empty((len(cand), self.recall.dim), dtype=np.float32)  # (N, D)
        vectors[known] = self.recall.item_vectors[cand[known]]
        if not known.all():
            assert cold is not None
            vectors[~known] = cold.vectors.rows.numpy()[cand[~known] - base]
        counts = np.zeros(len(cand), dtype=np.float32)
        counts[known] = self._counts[cand[known]]
        temperature = self.blend.temperature if self.blend is not None else (
            self.bundle.towers.cfg.temperature if self.bundle.towers is not None else 1.0)
        pairs = context.pairs[0, :, :, 0].numpy() if context is not None and context.pairs is not None else None
        return candidate_signals(logits.numpy(), vectors @ query[0], self.covisit, items, cats, cand,
                                 scorer.item_category[torch.from_numpy(cand)].numpy(), counts, temperature, pairs)

    @torch.inference_mode()
    def signals(self, history: list[HistoryItem], seen: Collection[str]) -> tuple[np.ndarray, np.ndarray]:
        """What the ranking stage has for ``history``, before it blends: the candidates every lane recalls
        (N,) (item indices; ``seen`` never) and their (N, F) signals — what the blend is fitted on."""
        window = history[-self.seq_len:]
        items, cats = self._encode(window)
        cold = self.cold
        cand, query = self._candidates(items, cats, self.recall_candidates, self._excluded(seen, cold), cold)
        if len(cand) == 0:
            return cand, np.zeros((0, len(FEATURES)), dtype=np.float32)
        scorer = cold.scorer if cold is not None else self.scorer
        context = self._context(window, items, cand, scorer)
        logits = scorer.score(torch.as_tensor(items, dtype=torch.long), torch.as_tensor(cats, dtype=torch.long),
                              torch.as_tensor(cand, dtype=torch.long), context=context).logits
        return cand, self._signals(logits, cand, items, cats, query, cold, scorer, context)

    def _by_score(self, query: np.ndarray, n: int, excluded: set[int], cold: ColdLane | None) -> np.ndarray:
        base = len(self.bundle.vocab.items)
        ids, scores = self.index.search(query, n, exclude=[{i for i in excluded if i < base}])
        ids, scores = ids[0], scores[0]
        if cold is None:
            return ids[ids >= 0]
        c_ids, c_scores = cold.search(query, n, {i for i in excluded if i >= base})
        fresh = c_ids[:self.fresh_candidates]
        fresh = fresh[fresh >= 0]
        merged_ids, merged_scores = np.concatenate([ids, c_ids[len(fresh):]]), np.concatenate(
            [scores, c_scores[len(fresh):]])
        order = np.argsort(-merged_scores, kind="stable")[:max(n - len(fresh), 0)]
        out = np.concatenate([fresh, merged_ids[order]])
        return out[out >= 0]

    def _probes(self, n: int = 4) -> list[Probe]:
        """A few made-up requests of the served shape over this bundle's vocabulary (with a made-up context
        for a DIN that reads one): to time the scorer's implementations and check the faster ones against fp32."""
        g = torch.Generator().manual_seed(0)
        n_items = len(self.bundle.vocab.items)
        lanes = self.settings.covisit_candidates if self.bundle.covisit is not None else 0
        served = self.recall_candidates + lanes + self.settings.popular_candidates  # candidates a request scores
        out: list[Probe] = []
        for _ in range(n):
            hist = torch.randint(1, n_items, (self.seq_len,), generator=g)  # (L,)
            cand = torch.randint(1, n_items, (min(served, n_items - 1),), generator=g)  # (N,)
            context = probe_context(self.model.cfg, len(cand), len(hist), g)
            out.append((hist, self._item_cat[hist], cand) if context is None else
                       (hist, self._item_cat[hist], cand, context))
        return out

    @property
    def precision(self) -> str:
        return self.scorer.precision

    @property
    def model_version(self) -> str:
        return self.bundle.model_version

    def _encode(self, history: list[HistoryItem]) -> tuple[list[int], list[int]]:
        hist = history[-self.seq_len:]
        return ([self._item_idx.get(h.item_id, 0) for h in hist], [self._cat_idx.get(h.category_id, 0) for h in hist])

    @torch.inference_mode()
    def rank(self, history: list[HistoryItem], k: int, popular: Callable[[int], list[tuple[str, float]]], *,
             shown: Collection[str] = (), explain: bool = False, candidates: int | None = None,
             tail_share: float | None = None, seen: Collection[str] | None = None) -> Ranking:
        """``popular(n)``: the n most popular (item, count), for users with no usable behaviour and to
        fill a list recall could not. ``seen``: the items never to recommend (:meth:`seen_items`;
        default: the history's). The stage's re-ranker applies the business rules (``shown``: items
        recently shown to the user) and the long-tail lane (``tail_share`` overrides its share: an
        experiment variant's); with ``explain`` each item says which behaviours drew it (DIN's attention
        weights, largest first). The list has ``k`` items whenever the catalog has that many the rules allow."""
        rerank = self.reranker
        seen = {h.item_id for h in history} if seen is None else seen
        window = history[-self.seq_len:]
        items, cats = self._encode(window)
        known = [i for i in items if i]
        if not known:
            return self.rank_by_popularity(history, k, popular, shown=shown, seen=seen)

        t0, c0 = time.perf_counter(), time.thread_time()
        cold = self.cold  # read once: a catalog update swaps it whole
        n, excluded = candidates or self.recall_candidates, self._excluded(seen, cold)
        memo = None if explain else self.memo
        key: Hashable = None
        kept = None
        if memo is not None:
            key = (tuple((h.item_id, h.category_id, h.ts) for h in window), frozenset(excluded), n, id(cold))
            kept = memo.get(key)
        if kept is not None:
            cand, query = kept.recall  # (N,), (1, D)
        else:
            cand, query = self._candidates(items, cats, n, excluded, cold)
        t1, c1 = time.perf_counter(), time.thread_time()
        if len(cand) == 0:
            return self._filled(Ranking([], "din", len(known), {"recall": t1 - t0}, {"recall": c1 - c0}), k, popular,
                                shown, seen)
        scorer = cold.scorer if cold is not None else self.scorer
        if kept is not None:
            scored, context = kept.scored, kept.context
        else:
            context = self._context(window, items, cand, scorer)
            scored = scorer.score(torch.as_tensor(items, dtype=torch.long), torch.as_tensor(cats, dtype=torch.long),
                                  torch.as_tensor(cand, dtype=torch.long), with_attention=explain, context=context)
            if memo is not None:
                kept = memo[key] = _Kept((cand, query), scored, context)
        if self.blend is None:
            logits = scored.logits
        else:
            # The signals read the blend's temperature (models.blend): kept per temperature.
            signals = kept.signals.get(self.blend.temperature) if kept is not None else None
            if signals is None:
                signals = self._signals(scored.logits, cand, items, cats, query, cold, scorer, context)
                if kept is not None:
                    kept.signals[self.blend.temperature] = signals
            logits = torch.from_numpy(self.blend.combine(signals))
        scores = torch.sigmoid(logits).tolist()  # (N,)
        c2 = time.thread_time()
        cand_list = cand.tolist()
        pool = [(item, cat, s) for (item, cat), s in zip(self._describe(cand_list, cold), scores, strict=True)]
        base = len(self.bundle.vocab.items)
        behaviours = [h for h, i in zip(window, items, strict=True) if i]  # the scorer's L (known ones), in order
        out = []
        # Cold items have no training count: they are long tail by definition.
        tail = [self._tail[c] if c < base else True for c in cand_list] if self._tail is not None else None
        for j, score in rerank.select(pool, k, shown, tail, tail_share):
            because = None
            if explain and scored.attention is not None:
                weights = scored.attention[j]  # (L,)
                top = torch.argsort(weights, descending=True, stable=True)[:self.explain_top].tolist()
                because = [Because(item_id=behaviours[t].item_id, category_id=behaviours[t].category_id,
                                   weight=float(weights[t])) for t in top]
            out.append(Scored(pool[j][0], pool[j][1], score, because))
        ranking = Ranking(out, "din", len(known), {"recall": t1 - t0, "rank": time.perf_counter() - t1},
                          {"recall": c1 - c0, "score": c2 - c1})
        return self._filled(ranking, k, popular, shown, seen)

    def _filled(self, ranking: Ranking, k: int, popular: Callable[[int], list[tuple[str, float]]],
                shown: Collection[str], seen: Collection[str]) -> Ranking:
        """``ranking`` with popular items after its own when it has fewer than ``k`` (recall found too
        few it may show); they score below every item the model chose."""
        if len(ranking.items) >= k:
            return ranking
        taken = {x.item_id for x in ranking.items}
        more = self.rank_by_popularity([], k - len(ranking.items), popular, shown=shown,
                                       seen=taken | set(seen), listed=[x.category_id for x in ranking.items]).items
        floor = min((x.score for x in ranking.items), default=1.0)
        tail = [Scored(x.item_id, x.category_id, floor * x.score) for x in more]
        return Ranking(ranking.items + tail, ranking.strategy, ranking.known_history, ranking.seconds,
                       ranking.cpu_seconds)

    def rank_by_popularity(self, history: list[HistoryItem], k: int,
                           popular: Callable[[int], list[tuple[str, float]]], *, shown: Collection[str] = (),
                           seen: Collection[str] | None = None, listed: Collection[str] = ()) -> Ranking:
        """The ``k`` most popular items not in ``seen`` (default: the history's items), after the
        business rules (``listed``: categories already in the list this fills, counted by the category
        cap); score relative to the top item."""
        rerank = self.reranker
        seen = {h.item_id for h in history} if seen is None else seen
        ranked = popular(5 * k + len(seen))  # headroom for blocklists and category caps
        peak = max((s for _, s in ranked), default=1.0) or 1.0
        candidates = [(i, self.category_of(i), s / peak) for i, s in ranked if i not in seen]
        chosen = rerank.select(candidates, k, shown, listed=listed)
        return Ranking([Scored(candidates[j][0], candidates[j][1], s) for j, s in chosen], "popular", 0)

    def seen_items(self, history: list[HistoryItem], interacted: Collection[str] = ()) -> set[str]:
        """The items the seen-item policy keeps out of ``history``'s list: everything the user took
        (``all``: the history and ``interacted``, what the store keeps beyond it), the history alone
        (``recent``), or nothing (``none``)."""
        policy = self.settings.seen_policy
        if policy == "none":
            return set()
        return {h.item_id for h in history} | (set(interacted) if policy == "all" else set())

    def recall_items(self, history: list[HistoryItem], n: int, seen: Collection[str] | None = None) -> list[str]:
        """The ids of the n candidates recall finds for ``history`` (before DIN), ``seen`` (default: the
        history's items) excluded: to inspect recall."""
        items, cats = self._encode(history[-self.seq_len:])
        cold = self.cold
        seen = {h.item_id for h in history} if seen is None else seen
        ids = self._candidates(items, cats, n, self._excluded(seen, cold), cold)[0].tolist()
        return [item for item, _ in self._describe(ids, cold)]

    def _describe(self, ids: list[int], cold: ColdLane | None) -> list[tuple[str, str]]:
        """(item id, category id) of candidate ids: the bundle's items, then the cold lane's past them."""
        names, cat_names = self.bundle.vocab.items, self._item_cat_name
        if cold is None:
            return [(names[c], cat_names[c]) for c in ids]
        base = len(names)
        return [(names[c], cat_names[c]) if c < base else (cold.names[c - base], cold.categories[c - base])
                for c in ids]

    def knows(self, item_id: str) -> bool:
        return item_id in self._item_idx

    def long_tail(self, item_id: str) -> bool:
        """Whether ``item_id`` is in the long tail of this model's popularity (an item it does not know —
        a cold one — is; a bundle without tail flags: nothing is)."""
        if self._tail is None:
            return False
        idx = self._item_idx.get(item_id)
        return bool(self._tail[idx]) if idx is not None else True

    def category_of(self, item_id: str) -> str:
        idx = self._item_idx.get(item_id)
        if idx:
            return self._item_cat_name[idx]
        cold = self.cold
        c = cold.id_of(item_id) if cold is not None else None
        if c is not None:
            return self._describe([c], cold)[0][1]
        return "unknown"
