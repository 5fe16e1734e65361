"""Champion and candidate, measured on the same recent holdout.

The holdout is the candidate's test split (each user's latest behaviour against uniformly sampled
items, training.samples) restricted to behaviours **after the champion's data window**: neither model
trained on them. By default it also leaves out clicks on served recommendations: the serving model
chose what those users could click, so they favour it (exposure bias) — on simulated users the
champion recalled 99 % of the items clicked in its own lists, a retrained model 93 %.

Both models are bundles and are measured the same way, through external ids — a
history or target the champion never saw maps to its index 0 (unknown), as serving would feed it —
on:

* ranking (DIN): AUC, GAUC, logloss, and calibration: mean predicted CTR / observed CTR
  (``calibration_error`` = |log of that|; 0 is perfect). A model trained against ``n`` negatives per
  positive predicts odds ``k/n`` times too high on a holdout with ``k``; logloss and calibration are
  taken after the standard correction for negative sampling, ``logit − log(k/n)`` (He et al., 2014),
  so they measure the model, not the sampling rates it and the holdout happen to use;
* recall (the bundle's recall space: towers, or DIN's item embeddings): HR@k of the held-out
  behaviour, history items excluded as serving excludes them; the same HR on the behaviours whose item
  is in the long tail (events.long_tail, by behaviours in the window); and the long-tail
  share of the recalled items.

* the served list: ``served_hr`` — HR@10 of the top 10 the ranking stage (models.ranking) serves with
  the served configuration (models.ranking_settings): every lane, DIN, the blend, re-ranking and the
  long-tail lane, the popularity fill and the seen-item policy — the list ``GET /recommend`` answers;
  and, on the same held-out behaviours, what popularity and item-CF serve (:func:`baselines`): a
  candidate that loses to them must not ship, however it compares with the champion.

``units`` collects what each metric averages, unit by unit (a user's AUC and weight, a row's loss, a
positive's hit), so :func:`paired_differences` can put a standard error on candidate − champion:
both models are measured on the same units, so the difference is paired.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import torch

from dinrec.events.features import HistoryItem
from dinrec.events.long_tail import long_tail_mask
from dinrec.models.bundle import Bundle
from dinrec.models.ranking_settings import RankingSettings
from dinrec.models.recall import RecallSpace, target_found, top_unseen
from dinrec.retrieval.covisit import CoVisitation
from dinrec.retrieval.hits import ranks
from dinrec.training.data import gather_history
from dinrec.training.export import item_counts
from dinrec.training.metrics import auc, gauc, logloss, paired_difference, row_logloss, user_aucs
from dinrec.training.samples import SampleSet, Split

SERVED_K = 10


def holdout_rows(samples: SampleSet, since: float | None,
                 exclude: Iterable[tuple[str, str, float]] = ()) -> np.ndarray:
    """Test-split rows whose behaviour happened at or after ``since`` (all of them when None), less
    those whose behaviour is in ``exclude`` ((user, item, ts): clicks on served recommendations)."""
    split = samples.test
    target_ts = samples.seq_ts[split.hist_end]  # a sample's history ends where its behaviour's (user, ts) starts
    keep = target_ts >= since if since is not None else np.ones(len(split), dtype=bool)
    excluded = set(exclude)
    if excluded and len(split):
        # Rows come in groups: a positive, then its negatives (same user and history); drop whole groups.
        group = np.cumsum(split.label == 1) - 1  # (N,) the group's index, by its positive
        positives = np.flatnonzero(split.label == 1)
        users, items = np.asarray(samples.users), np.asarray(samples.vocab.items)
        drop = np.fromiter(((users[split.user[r]], items[split.target_item[r]], float(target_ts[r])) in excluded
                            for r in positives), dtype=bool, count=len(positives))
        keep &= ~drop[group]
    return np.flatnonzero(keep)


def _to_bundle(ids: list[str], known: dict[str, int]) -> np.ndarray:
    """(n,) sample-set index → the bundle's index of the same external id (0: unknown to it)."""
    return np.asarray([0] + [known.get(x, 0) for x in ids[1:]], dtype=np.int64)


@torch.no_grad()
def measure(bundle: Bundle, samples: SampleSet, rows: np.ndarray, recall_k: int = 200,
            batch: int = 4096, units: dict | None = None) -> dict:
    """Ranking and recall metrics of ``bundle`` on ``samples.test[rows]`` (see the module doc); fills
    ``units`` (when given) with the per-unit values behind them."""
    split = samples.test
    item_map = torch.from_numpy(_to_bundle(samples.vocab.items, bundle.vocab.item_index()))
    cat_map = torch.from_numpy(_to_bundle(samples.vocab.categories,
                                          {c: i for i, c in enumerate(bundle.vocab.categories) if i}))
    seq_items, seq_cats = item_map[torch.from_numpy(samples.seq_items)], cat_map[torch.from_numpy(samples.seq_cats)]
    length = bundle.seq_len

    def histories(r: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:  # (B, L) each, in the bundle's indices
        end, n = torch.from_numpy(split.hist_end[r]), torch.from_numpy(split.hist_len[r]).clamp_max(length)
        return gather_history(seq_items, end, n, length), gather_history(seq_cats, end, n, length)

    model = bundle.model.eval()
    if model.cfg.scores_lists:
        z = _list_logits(bundle, samples, rows, histories, item_map, cat_map)
    else:
        logits = []
        for s in range(0, len(rows), batch):
            r = rows[s:s + batch]
            hist, cats = histories(r)
            target = item_map[torch.from_numpy(split.target_item[r])]
            target_cat = cat_map[torch.from_numpy(split.target_cat[r])]
            logits.append(model(hist, cats, target, target_cat).float())
        z = torch.cat(logits).numpy() if logits else np.zeros(0)
    labels, users = split.label[rows], split.user[rows]
    k = (len(labels) - labels.sum()) / max(labels.sum(), 1)  # negatives per positive in the holdout
    n = bundle.metrics.get("train_negatives") or 1  # older bundles: dinrec train's default
    zc = z - math.log(k / n) if k > 0 else z  # corrected for the sampling rates (ranking unchanged)
    p = 1.0 / (1.0 + np.exp(-zc))
    ratio = float(p.mean() / labels.mean()) if len(rows) and labels.mean() > 0 else float("nan")
    out = {"rows": int(len(rows)), "users": int(len(np.unique(users))), "auc": auc(labels, z),
           "gauc": gauc(users, labels, z), "logloss": logloss(labels, zc) if len(rows) else float("nan"),
           "calibration": ratio, "calibration_error": abs(math.log(ratio)) if ratio > 0 else float("nan")}
    if units is not None:
        units["gauc"] = user_aucs(users, labels, z)  # (AUC_u, n_u): the same users, in the same order
        units["logloss"] = (row_logloss(labels, zc), None)
    out.update(_recall(bundle, samples, rows[labels == 1], histories, item_map, recall_k, units))
    out.update(_served(bundle, samples, rows[labels == 1], units))
    return {k: round(v, 5) if isinstance(v, float) else v for k, v in out.items()}


def _list_logits(bundle: Bundle, samples: SampleSet, rows: np.ndarray, histories, item_map: torch.Tensor,
                 cat_map: torch.Tensor, batch: int = 256) -> np.ndarray:
    """A DIN with context scores each holdout positive with its sampled negatives as one list, with the
    context serving would give it (models.context.served_context: the bundle's lane and counts)."""
    from dinrec.models.context import known_last, served_context

    split, cfg = samples.test, bundle.model.cfg
    pairs, counts = bundle.context_sources()
    ts_seq = torch.from_numpy(samples.seq_ts)
    z = np.zeros(len(rows), dtype=np.float32)
    starts = np.flatnonzero(split.label[rows] == 1)  # positions in ``rows`` of each group's positive
    ends = np.r_[starts[1:], len(rows)]
    for lo in range(0, len(starts), batch):
        part, stop = starts[lo:lo + batch], ends[lo:lo + batch]
        width = int((stop - part).max())
        group = np.minimum(part[:, None] + np.arange(width), stop[:, None] - 1)  # (b, W) positions in rows
        r = rows[part]
        hist, cats = histories(r)
        end = torch.from_numpy(split.hist_end[r])
        length = torch.from_numpy(split.hist_len[r]).clamp_max(hist.shape[1])
        ts = gather_history(ts_seq, end, length, hist.shape[1])
        hist, cats, ts = known_last(hist, cats, ts)
        cand = item_map[torch.from_numpy(split.target_item[rows[group]])]  # (b, W)
        cand_cats = cat_map[torch.from_numpy(split.target_cat[rows[group]])]
        context = served_context(cfg, pairs, counts, hist, cats, ts, cand, cand_cats)
        logits = bundle.model.score_lists(hist, cats, cand, cand_cats, context).float().numpy()
        z[group] = logits  # a short group repeats its last row, which writes the same value
    return z


def _served(bundle: Bundle, samples: SampleSet, positives: np.ndarray, units: dict | None = None,
            k: int = SERVED_K) -> dict:
    """HR@k of the list the ranking stage serves (models.ranking, with the served configuration:
    models.ranking_settings) to each held-out positive's user, from everything they did before it: the
    same lanes, scores, re-ranking, fill and seen-item policy as ``GET /recommend``."""
    hit = ranks(served_lists(bundle, samples, samples.test, positives, k),
                (samples.vocab.items[t] for t in samples.test.target_item[positives])) >= 0
    if units is not None:
        units["served_hr"] = (hit, None)
    return {"served_hr": int(hit.sum()) / max(len(hit), 1), "served_k": k}


def served_history(samples: SampleSet, split: Split, row: int, seq_len: int) -> tuple[list[HistoryItem], list[str]]:
    """What the online store holds for ``split``'s ``row``'s user when their target happens: the newest
    ``seq_len`` behaviours before it (with their times) and every item they took before it."""
    items, cats = samples.vocab.items, samples.vocab.categories
    span = samples.before(split, row)
    history = [HistoryItem(float(samples.seq_ts[p]), f"sample-{p}", items[samples.seq_items[p]],
                           cats[samples.seq_cats[p]]) for p in range(max(span.start, span.stop - seq_len), span.stop)]
    return history, [items[i] for i in samples.seq_items[span].tolist()]


def served_lists(bundle: Bundle, samples: SampleSet, split: Split, rows: np.ndarray, k: int,
                 settings: RankingSettings | None = None, *, rec=None, tail_share: float | None = None
                 ) -> list[list[str]]:
    """The top ``k`` (item ids) the ranking stage serves ``bundle``'s users for ``split``'s ``rows``, from
    what the store would hold (:func:`served_history`), the fill from the bundle's popularity. ``rec``: a
    ranking stage over ``bundle`` to use (default: one with ``settings``, in fp32); ``tail_share``
    overrides the long-tail lane's share (as an experiment variant may)."""
    from dinrec.models.ranking import Recommender
    from dinrec.retrieval.index import FaissIndex

    rec = rec or Recommender(bundle, FaissIndex.load(bundle.item_index_path), settings, precision="fp32")
    out = []
    for r in rows.tolist():
        history, taken = served_history(samples, split, r, rec.seq_len)
        ranking = rec.rank(history, k, lambda n: bundle.popularity, seen=rec.seen_items(history, taken),
                           tail_share=tail_share)
        out.append([x.item_id for x in ranking.items])
    return out


def baselines(samples: SampleSet, rows: np.ndarray, k: int = SERVED_K,
              lane: CoVisitation | None = None) -> tuple[dict, dict]:
    """HR@k of what popularity (training counts) and item-CF (the co-visitation lane fitted on the
    training behaviours, tuned on validation; ``lane``: that one, already fitted) serve on the holdout
    rows' behaviours, history excluded: ({name: {"served_hr"}}, {name: per-behaviour hits})."""
    from dinrec.retrieval.baselines import Popularity
    from dinrec.training.export import fit_covisitation

    split = samples.test
    positives = rows[split.label[rows] == 1]
    hist = gather_history(torch.from_numpy(samples.seq_items), torch.from_numpy(split.hist_end[positives]),
                          torch.from_numpy(split.hist_len[positives]), samples.seq_len).tolist()
    pop = Popularity(np.bincount(samples.train.target_item[samples.train.label == 1], minlength=samples.vocab.n_items))
    if lane is None:
        lane, _ = fit_covisitation(samples)
    recall = {"popularity": lambda h: pop.recall(h, k),
              "item_cf": lambda h: lane.recall(h, k, excluded=set(h))[0]}
    out, hits = {}, {}
    for name, fn in recall.items():
        hit = ranks((fn([i for i in h if i]) for h in hist), split.target_item[positives].tolist()) >= 0
        hits[name] = hit
        out[name] = {"served_hr": round(int(hit.sum()) / max(len(hit), 1), 5), "users": len(hit)}
    return out, hits


def served_comparison(bundle: Bundle, samples: SampleSet) -> dict:
    """The served list's HR@10 on the whole test split beside popularity's and item-CF's, each
    baseline's paired difference from it: what ``dinrec train`` prints at the end, the gate's
    comparison without a champion."""
    rows = np.arange(len(samples.test))
    units: dict = {}
    served = measure(bundle, samples, rows, units=units)["served_hr"]
    # A bundle exported from these samples carries the very lane item-CF is (fitted and tuned on them).
    same = bundle.covisit is not None and list(bundle.vocab.items) == list(samples.vocab.items)
    found, hits = baselines(samples, rows, lane=bundle.covisit if same else None)
    out: dict = {"split": "test", "k": SERVED_K, "served_hr": round(served, 5), "baselines": found}
    differences = baseline_differences(units["served_hr"], hits)
    for name in hits:
        out["baselines"][name]["dinrec_minus_baseline"] = differences.get(name)  # None: too few for an SE
    return out


def baseline_differences(served: tuple, baseline_hits: dict[str, np.ndarray]) -> dict[str, dict]:
    """{baseline: {"difference", "se"}}: the served list's per-behaviour hits (``units["served_hr"]``
    from :func:`measure`) minus each baseline's, paired over the same behaviours."""
    out = {}
    for name, hits in baseline_hits.items():
        d = paired_differences({"served_hr": served}, {"served_hr": (hits, None)}).get("served_hr")
        if d is not None:
            out[name] = d
    return out


def _recall(bundle: Bundle, samples: SampleSet, positives: np.ndarray, histories, item_map: torch.Tensor,
            k: int, units: dict | None = None, batch: int = 1024) -> dict:
    space = RecallSpace(bundle.model, bundle.towers, bundle.vocab.item_category)
    table = torch.from_numpy(space.item_vectors)  # (I, D), row = the bundle's item index
    # Long tail by this window's behaviours, carried to the bundle's indices by id (unseen: tail).
    window_tail = long_tail_mask(item_counts(samples))
    by_id = dict(zip(samples.vocab.items[1:], window_tail[1:], strict=True))
    tail = torch.tensor([False] + [bool(by_id.get(x, True)) for x in bundle.vocab.items[1:]])
    k = min(k, len(table) - 1)
    recalled_tail = recalled = 0
    found, tails = [np.zeros(0, dtype=bool)], [np.zeros(0, dtype=bool)]  # per positive: recalled? a tail item?
    for s in range(0, len(positives), batch):
        r = positives[s:s + batch]
        hist, cats = histories(r)
        top = top_unseen(torch.from_numpy(space.queries(hist, cats)) @ table.T, hist, k)  # (B, I) → (B, k)
        target = item_map[torch.from_numpy(samples.test.target_item[r])]  # 0: the bundle cannot recall it
        found.append(target_found(top, target))  # (B,)
        tails.append(window_tail[samples.test.target_item[r]])  # (B,) a long-tail behaviour
        recalled_tail += int(tail[top].sum())
        recalled += top.numel()
    hit, is_tail = np.concatenate(found), np.concatenate(tails)
    if units is not None:
        units["recall_hr"], units["recall_tail_hr"] = (hit, None), (hit[is_tail], None)
    return {"recall_hr": int(hit.sum()) / max(len(hit), 1), "recall_tail_share": recalled_tail / max(recalled, 1),
            "recall_tail_hr": int(hit[is_tail].sum()) / max(int(is_tail.sum()), 1),
            "tail_positives": int(is_tail.sum()), "recall_k": k}


def paired_differences(candidate: dict, champion: dict) -> dict[str, dict]:
    """{metric: {"difference": candidate − champion, "se": its standard error}} from two models'
    ``units`` on the same holdout. Rows of one user are treated as independent for logloss (a slight
    underestimate of its SE); AUC and calibration get none."""
    out = {}
    for metric, (values, weights) in candidate.items():
        if metric in champion:
            d, se = paired_difference(values, champion[metric][0], weights)
            if not math.isnan(se):  # fewer than two units: nothing to say
                out[metric] = {"difference": round(d, 5), "se": round(se, 5)}
    return out

