"""`dinrec bench recall`: does recall find what the user does next, and does the long tail get shown?

On a dataset's own leave-one-out test split (each user's last behaviour held out; the history is the
L behaviours before it, as serving reads them, and those items are never recalled), HR@N — the held-
out item among the N recalled — for:

* ``faiss`` — the recall stage as it serves: the recall towers' query against the exported FAISS index;
* ``din_mean`` — the stage before the towers (the mean of DIN's item embeddings), for contrast;
* ``item_cf`` — item-to-item co-visitation (retrieval.baselines.ItemCF), its window chosen on the
  validation split from (5, 10, 20): the collaborative filtering DIN replaced, given its best shot;
* ``popularity`` — the most popular unseen items.

``long_tail_share`` is the share of final recommendations (DIN's top ``k`` of the FAISS stage's 200
candidates with the service's long-tail lane at its default share) in the long tail
(events.long_tail); ``final`` gives, with and without the lane, that share and HR@k (the held-out item in
the final list: what the lane costs). Each baseline's own top-``k`` share is reported beside it.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from dinrec.datasets import load_dataset
from dinrec.models.ranking_settings import RankingSettings
from dinrec.models.recall import RecallSpace
from dinrec.models.rerank import Reranker
from dinrec.models.scorer import Scorer
from dinrec.retrieval.baselines import ItemCF, ItemCFConfig, Popularity, hit_rate, long_tail_mask, long_tail_share
from dinrec.retrieval.index import FaissIndex
from dinrec.training.export import build_item_index, item_counts
from dinrec.training.progress import Stages, showing
from dinrec.training.run import train, train_towers
from dinrec.training.samples import SampleSet, Split, build_samples, training_sequences
from dinrec.training.settings import TrainSettings
from dinrec.training.towers_train import towers_settings

NS = (50, 200, 1000)


def _cases(samples: SampleSet, split: Split) -> list[tuple[list[int], list[int], int]]:
    """(history items, history categories, held-out item) per positive of ``split``, oldest first."""
    out = []
    for r in np.flatnonzero(split.label == 1):
        end, length = int(split.hist_end[r]), int(split.hist_len[r])
        out.append((samples.seq_items[end - length:end].tolist(), samples.seq_cats[end - length:end].tolist(),
                    int(split.target_item[r])))
    return out


def _faiss_recall(space: RecallSpace, index: FaissIndex, cases, n: int) -> list[np.ndarray]:
    out = []
    for items, cats, _ in cases:
        ids, _ = index.search(space.query(items, cats), n, exclude=[set(items)])
        out.append(ids[0][ids[0] >= 0])
    return out


def _hr(recalled: list[np.ndarray], cases, ns=NS) -> dict[str, float]:
    it = iter(recalled)
    return hit_rate(lambda history, n: next(it), [(c[0], c[2]) for c in cases], ns)


def bench_recall(data: Path, *, epochs: int = 3, recall_epochs: int = 20, seq_len: int = 50, k: int = 10,
                 seed: int = 0, progress: bool | None = None) -> dict:
    """``progress``: a line per stage on stderr (default: when stderr is a terminal)."""
    say = Stages(showing(progress))
    t0 = time.perf_counter()
    samples = build_samples(load_dataset(data), seq_len=seq_len, eval_negatives=20, seed=seed)
    say(f"{len(samples.train)} training samples built")
    # DIN here only lends its item embeddings to a recall space (din_mean): the pointwise objective, which
    # needs no lanes (the listwise one trains on what the towers and co-visitation recall: dinrec train).
    settings = TrainSettings(epochs=epochs, seq_len=seq_len, seed=seed, progress=False, recall_epochs=recall_epochs,
                             objective="pointwise")
    with tempfile.TemporaryDirectory(prefix="dinrec-bench-recall-") as tmp:
        model = train(samples, settings, Path(tmp)).model
        assert model is not None  # None only on a sharded run's other ranks; this one trains alone
        din = model.eval()
    t_din = time.perf_counter()
    say("din trained")
    towers = train_towers(samples, towers_settings(settings))
    t_towers = time.perf_counter()
    say(f"recall towers trained (val hr@{towers.metrics['eval_n']} {towers.metrics['val_hr']})")
    test, val = _cases(samples, samples.test), _cases(samples, samples.val)
    counts = item_counts(samples)  # what the bundle keeps: the long tail as serving defines it
    result: dict = {"dataset": str(data), "test_users": len(test), "items": samples.vocab.n_items - 1,
                    "seq_len": seq_len, "k": k}

    spaces = {"faiss": RecallSpace(din, towers.model, samples.vocab.item_category),
              "din_mean": RecallSpace(din, None, samples.vocab.item_category)}
    recalled = {}
    for name, space in spaces.items():
        index, info = build_item_index(space)
        recalled[name] = _faiss_recall(space, index, test, max(NS))
        result[name] = {**_hr(recalled[name], test), "index": info["kind"], "dim": space.dim}
        say(f"{name}: {len(test)} test users recalled (hr@200 {result[name]['hr@200']})")

    seqs = training_sequences(samples)
    tuned = {w: ItemCF.fit(seqs, samples.vocab.n_items, ItemCFConfig(window=w)) for w in (5, 10, 20)}
    val_hr = {w: hit_rate(cf.recall, [(c[0], c[2]) for c in val], [200])["hr@200"] for w, cf in tuned.items()}
    best = max(val_hr, key=val_hr.__getitem__)
    # Popularity from the training behaviours only: a deployed popularity recall knows only the past.
    cf = tuned[best]
    pop = Popularity(np.bincount(samples.train.target_item[samples.train.label == 1], minlength=len(counts)))
    cf_lists = [cf.recall(c[0], max(NS)) for c in test]
    pop_lists = [pop.recall(c[0], max(NS)) for c in test]
    result["item_cf"] = {**_hr(cf_lists, test), "window": best, "val_hr@200_by_window": val_hr,
                         "long_tail_share": long_tail_share([x[:k].tolist() for x in cf_lists], counts)}
    result["popularity"] = {**_hr(pop_lists, test),
                            "long_tail_share": long_tail_share([x[:k].tolist() for x in pop_lists], counts)}
    say(f"item-cf (window {best}) and popularity recalled")

    # The final lists as the service ranks them: DIN's scores over the 200 candidates, then the
    # reranker with and without the long-tail lane (its default share).
    scorer = Scorer(din, torch.as_tensor(samples.vocab.item_category, dtype=torch.long), "fp32")
    lane = Reranker(tail_share=RankingSettings.model_fields["tail_share"].default)
    tail = long_tail_mask(counts)
    finals: dict[str, list[list[int]]] = {"lane": [], "no_lane": []}
    for (items, cats, _), cand in zip(test, recalled["faiss"], strict=True):
        cand = cand[:200]
        logits = scorer.score(torch.tensor(items), torch.tensor(cats), torch.as_tensor(cand)).logits.tolist()
        scored = [(str(c), "", s) for c, s in zip(cand.tolist(), logits, strict=True)]
        flags = [bool(tail[c]) for c in cand.tolist()]
        finals["lane"].append([int(cand[j]) for j, _ in lane.select(scored, k, (), flags)])
        finals["no_lane"].append([int(cand[j]) for j, _ in Reranker().select(scored, k)])
    say("final lists ranked, with and without the long-tail lane")
    result["long_tail_share"] = long_tail_share(finals["lane"], counts)
    result["final"] = {name: {f"hr@{k}": round(float(np.mean([c[2] in f for c, f in zip(test, lists, strict=True)])),
                                                 4),
                              "long_tail_share": long_tail_share(lists, counts)}
                       for name, lists in finals.items()}
    result["final"]["lane"]["tail_share_setting"] = lane.tail_share
    result["faiss"]["recall_metrics"] = {kk: towers.metrics[kk] for kk in ("val_hr", "best_epoch", "softmax")}
    result["ratios"] = {"faiss_vs_item_cf_hr@200": round(result["faiss"]["hr@200"] / max(result["item_cf"]["hr@200"],
                                                                                          1e-9), 3),
                        "faiss_vs_popularity_hr@200": round(result["faiss"]["hr@200"]
                                                            / max(result["popularity"]["hr@200"], 1e-9), 3)}
    result["seconds"] = {"din": round(t_din - t0, 1), "towers": round(t_towers - t_din, 1),
                         "total": round(time.perf_counter() - t0, 1)}
    return result


def bench_recall_scale(items: int = 1_000_000, dim: int = 64, categories: int = 1000, queries: int = 300,
                       k: int = 200, seed: int = 0, progress: bool | None = None) -> dict:
    """The recall stage on a synthetic catalog of ``items`` unit vectors (clustered by category, as the
    item tower's are): the index ``IndexSpec`` picks for that size, its build time and size, query
    p50/p99 (one thread, top ``k`` with 50 seen items excluded) and recall@``k`` against exact search.
    The build uses every core. ``progress``: a line per stage on stderr (default: when stderr is a terminal)."""
    import faiss

    from dinrec.retrieval.index import IndexSpec, recall_at_k, tune_ef_search

    say = Stages(showing(progress))
    rng = np.random.default_rng(seed)
    centroids = rng.normal(size=(categories, dim)).astype(np.float32)  # (C, D)
    cat = rng.integers(0, categories, items)
    vectors = centroids[cat] + rng.normal(scale=0.7, size=(items, dim)).astype(np.float32)  # (I, D)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = np.arange(1, items + 1, dtype=np.int64)
    # Queries like a user's: 10 behaviours from one to three categories, pooled and normalised.
    by_cat = np.argsort(cat, kind="stable")
    starts = np.searchsorted(cat[by_cat], np.arange(categories + 1))
    q = np.empty((queries, dim), dtype=np.float32)
    for r in range(queries):
        cs = rng.integers(0, categories, rng.integers(1, 4))
        members = np.concatenate([by_cat[starts[c]:starts[c + 1]] for c in cs])
        q[r] = vectors[rng.choice(members, 10)].mean(axis=0)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    say(f"{items} item vectors and {queries} queries made")
    spec = IndexSpec()
    t0 = time.perf_counter()
    index = FaissIndex.build(vectors, ids, spec)  # every core: it is an offline step
    build_s = time.perf_counter() - t0
    say(f"{index.kind} index built ({build_s:.1f} s)")
    with tempfile.TemporaryDirectory() as tmp:
        index.save(Path(tmp) / "index.faiss")
        size = (Path(tmp) / "index.faiss").stat().st_size
    exact = FaissIndex.build(vectors, ids, IndexSpec(kind="flat"))
    say("exact index built")
    tuning: dict = {}
    if index.kind == "hnsw":  # as export does: efSearch measured on half the queries, timed on the other half
        ef, recall, tried = tune_ef_search(index, exact, q[:queries // 2], k)
        tuning = {"ef_search": ef, "ef_search_tried": tried}
        say(f"ef_search tuned: {ef}")
    faiss.omp_set_num_threads(1)  # queries as a serving worker runs them
    held_out = q[queries // 2:]
    exclude = [set(rng.integers(1, items + 1, 50).tolist()) for _ in range(len(held_out))]
    times = []
    for r in range(len(held_out)):
        t = time.perf_counter()
        index.search(held_out[r:r + 1], k, exclude=[exclude[r]])
        times.append(time.perf_counter() - t)
    say(f"{len(held_out)} queries timed (p99 {1000 * float(np.percentile(times, 99)):.3f} ms)")
    return {"items": items, "dim": dim, "index": index.kind, "spec": spec.to_json(),
            "build_s": round(build_s, 1), "index_mb": round(size / 2**20, 1),
            "vectors_mb": round(vectors.nbytes / 2**20, 1),
            "query_ms": {"p50": round(1000 * float(np.percentile(times, 50)), 3),
                         "p99": round(1000 * float(np.percentile(times, 99)), 3)},
            f"recall_at_{k}_vs_exact": round(recall_at_k(index, exact, held_out, k), 4), **tuning,
            "query_threads": 1}
