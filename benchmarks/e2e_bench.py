"""`dinrec bench e2e`: the list the service serves, against the simple things it must beat.

On a dataset's leave-last-out split (training.samples: each user's last behaviour on an item new to
them is the test target, the one before it validation; training sees only what came before), the
model is trained and exported exactly as ``dinrec train`` does with its defaults, the service is
built with ``create_app`` on the embedded store, every behaviour before each user's test target is
sent through ``POST /events``, and each test user's list is what ``GET /recommend`` answers — the
same code path as production (history from the store as ingested, every recall lane, DIN, the
re-ranker and its long-tail lane, the seen-item policy). Beside it, on the same split:

* ``popularity`` — the most popular items (training behaviours) the user has not taken;
* ``item_cf`` — item-to-item co-visitation (retrieval.baselines.ItemCF), window and decay chosen on
  the validation split by HR@10;
* ``towers`` — the recall towers' own order (the FAISS stage alone, no DIN);
* ``sequential`` — a SASRec-style causal self-attention model (benchmarks.sasrec) trained on the same
  training behaviours, early-stopped on validation HR@10.

Every method excludes everything the user interacted with before the target. Per method: ``hr@10``,
``ndcg@10``, ``hr@50``, ``coverage`` (distinct items in the top 10s ÷ catalog items),
``long_tail_share`` (items of the top 10s in the long tail, as the serving lane defines it:
feature_store.long_tail by training behaviours) and ``seen_in_list`` (top-10 slots holding an item the user
already took). ``vs_dinrec`` gives each baseline's per-user paired difference from dinrec (dinrec −
baseline) with its standard error, for HR@10 and NDCG@10.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.machine import machine
from feature_store.datasets import load_dataset
from feature_store.datasets.base import Interactions
from retrieval.baselines import Popularity, tune_item_cf
from training.samples import training_sequences

K = 10
DEEP = 50


@dataclass(frozen=True)
class Case:
    """One test user: their behaviours before the target (item indices, oldest first), the target."""

    user: str
    history: np.ndarray  # (H,) item indices, every behaviour before the target
    cats: np.ndarray  # (H,) category indices
    target: int
    ts: float  # the target's time: the service has seen everything before it


def _user_starts(data: Interactions) -> np.ndarray:
    """Where each user's behaviours start in a sample set's flat sequence (users in sorted order, as
    training.samples lays them out)."""
    _, counts = np.unique(data.behaviours().user_id, return_counts=True)
    return np.r_[0, np.cumsum(counts)[:-1]]


def _cases(samples, split, starts: np.ndarray) -> list[Case]:
    """Each positive of ``split`` with the user's *whole* history before it (the store keeps a capped
    window; the seen-item policy and item-CF look further back)."""
    out = []
    for r in np.flatnonzero(split.label == 1):
        u, end = int(split.user[r]), int(split.hist_end[r])
        out.append(Case(samples.users[u], samples.seq_items[starts[u]:end], samples.seq_cats[starts[u]:end],
                        int(split.target_item[r]), float(samples.seq_ts[end])))
    return out


def _ingested(data: Interactions, test: Sequence[Case]) -> Interactions:
    """The behaviours the service has seen when the test targets happen: for a test user everything
    strictly before their target, for the others everything."""
    b = data.behaviours()
    cutoff = {c.user: c.ts for c in test}
    ts_limit = np.array([cutoff.get(u, math.inf) for u in b.user_id.tolist()])
    keep = np.flatnonzero(b.ts < ts_limit)
    return b.take(keep[np.argsort(b.ts[keep], kind="stable")])


def _served_lists(bundle: Path, events: Interactions, test: Sequence[Case], n: int) -> tuple[list[list[str]], dict]:
    """The service over HTTP on loopback (uvicorn, the embedded store): histories in through POST
    /events, then ``GET /recommend?k=n`` per test user. Returns the lists (external item ids) and what was seen
    on the way (strategies, degraded answers, timings)."""
    import httpx

    # The deadline is a latency guard; a bench of quality on a busy 2-core box must not fall into it.
    from feature_store.online.memory import MemoryStore
    from feature_store.settings import FeatureStoreSettings
    from serving.app import create_app
    from serving.server import free_port, serve_in_thread
    from serving.settings import ServingSettings

    settings = ServingSettings(bundle_dir=bundle, request_deadline_ms=60_000, catalog_poll_s=0, log_format="text")
    fs = FeatureStoreSettings(store="memory", stream="inprocess")
    store = MemoryStore(history_cap=fs.history_len)  # held here to see when ingest has caught up
    app = create_app(settings, fs, store=store)
    lists, strategies, degraded = [], {}, 0
    t0 = time.perf_counter()
    port = free_port()
    with serve_in_thread(app, port, name="dinrec-bench-e2e"), \
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
        batch = []
        for e in events.events(prefix="bench:"):
            batch.append(e.model_dump(mode="json", exclude_none=True))
            if len(batch) == 1000:
                client.post("/events", json={"events": batch}).raise_for_status()
                batch = []
        if batch:
            client.post("/events", json={"events": batch}).raise_for_status()
        # Accepted events reach the store through the stream: wait until every behaviour is counted.
        deadline = time.monotonic() + 600
        while sum(n for _, n in store.popular(1 << 30)) < len(events):
            if time.monotonic() > deadline:
                raise RuntimeError("the service did not ingest every event within 600 s")
            time.sleep(0.05)
        t1 = time.perf_counter()
        for c in test:
            resp = client.get("/recommend", params={"user_id": c.user, "k": n})
            resp.raise_for_status()
            body = resp.json()
            lists.append([x["item_id"] for x in body["items"]])
            strategies[body["strategy"]] = strategies.get(body["strategy"], 0) + 1
            degraded += bool(body["degraded"])
        t2 = time.perf_counter()
        same = _in_process_agrees(app.state.dinrec, test[:CROSS_CHECK], lists[:CROSS_CHECK], n)
    return lists, {"strategies": strategies, "degraded": degraded, "events": len(events),
                   "http_matches_in_process": same,
                   "ingest_s": round(t1 - t0, 1), "recommend_ms_mean": round(1000 * (t2 - t1) / max(len(test), 1), 2)}


CROSS_CHECK = 200  # users whose HTTP list is compared with the in-process one


def _in_process_agrees(state, test: Sequence[Case], lists: Sequence[list[str]], n: int) -> float:
    """The share of ``lists`` (what HTTP answered) that the recommender gives in-process for the same
    users from the same store: 1.0 means the served figures are the model's, not the transport's."""
    rec = state.recommender
    same = 0
    for c, served in zip(test, lists, strict=True):
        history, interacted = state.store.history_and_interacted(c.user, rec.seq_len)
        ranking = rec.rank(history, n, lambda k: state.store.popular(k) or rec.bundle.popularity,
                           rerank=state.reranker, seen={h.item_id for h in history} | interacted)
        same += [x.item_id for x in ranking.items] == served
    return round(same / max(len(lists), 1), 4)


def _measure(lists: Sequence[Sequence[int]], test: Sequence[Case], n_items: int, tail: np.ndarray) -> dict:
    """The served-list measures of ``lists`` (item indices, best first; 0 = unknown to the model)."""
    hit10, ndcg10, hit50, seen, tail_n, slots = [], [], [], 0, 0, 0
    served: set[int] = set()
    for lst, c in zip(lists, test, strict=True):
        top = list(lst[:K])
        where = [j for j, i in enumerate(lst[:DEEP]) if i == c.target]
        hit50.append(float(bool(where)))
        hit10.append(float(bool(where) and where[0] < K))
        ndcg10.append(1.0 / math.log2(where[0] + 2) if where and where[0] < K else 0.0)
        taken = set(c.history.tolist())
        seen += sum(i in taken for i in top)
        tail_n += sum(bool(tail[i]) for i in top if i > 0)
        slots += len(top)
        served.update(i for i in top if i > 0)
    per_user = {"hr@10": np.asarray(hit10), "ndcg@10": np.asarray(ndcg10), "hr@50": np.asarray(hit50)}
    return {"per_user": per_user,
            **{name: round(float(v.mean()), 4) for name, v in per_user.items()},
            "coverage": round(len(served) / max(n_items - 1, 1), 4),
            "long_tail_share": round(tail_n / max(slots, 1), 4),
            "seen_in_list": seen, "mean_list_len": round(slots / max(len(test), 1), 2)}


def _paired(a: np.ndarray, b: np.ndarray) -> dict:
    d = a - b
    se = float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else float("nan")
    return {"diff": round(float(d.mean()), 4), "se": round(se, 4)}


def bench_e2e(data: Path, *, max_users: int | None = None, seed: int = 0, sequential: bool = True,
              train_overrides: dict | None = None) -> dict:
    """``max_users``: serve only the first N test users (every user trains); ``train_overrides``:
    TrainSettings fields to change (default: none — the defaults are what is measured)."""
    from models.bundle import load_bundle
    from serving.models import load_recommender
    from serving.settings import ServingSettings
    from training.pipeline import samples_for, train_bundle
    from training.settings import TrainSettings

    t0 = time.perf_counter()
    interactions = load_dataset(data)
    settings = TrainSettings(progress=False, seed=seed, **(train_overrides or {}))
    samples = samples_for(interactions, settings)
    starts = _user_starts(interactions)
    test, val = _cases(samples, samples.test, starts), _cases(samples, samples.val, starts)
    if max_users is not None:
        test = test[:max_users]
    if not test:
        raise ValueError(f"{data}: no user has enough behaviours for a held-out target")
    n_items = samples.vocab.n_items
    result: dict = {"dataset": str(data), "source": samples.source, "users": len(test), "items": n_items - 1,
                    "holdout": "each user's last behaviour on an item new to them (test), the one before (val)",
                    "k": K, "train_settings": {k: v for k, v in settings.model_dump().items()
                                               if k in (train_overrides or {})}}
    with tempfile.TemporaryDirectory(prefix="dinrec-bench-e2e-") as tmp:
        bundle_path = train_bundle(samples, settings, Path(tmp) / "bundle", run_dir=Path(tmp)).bundle
        t_train = time.perf_counter()
        bundle = load_bundle(bundle_path)
        events = _ingested(interactions, test)
        served, serving_info = _served_lists(bundle_path, events, test, DEEP)
        t_serve = time.perf_counter()

        index_of = bundle.vocab.item_index()
        tail = bundle.long_tail()
        assert tail is not None
        lists: dict[str, list[list[int]]] = {"dinrec": [[index_of.get(i, 0) for i in lst] for lst in served]}
        pop = Popularity(np.bincount(samples.train.target_item[samples.train.label == 1], minlength=n_items))
        lists["popularity"] = [pop.recall(c.history.tolist(), DEEP).tolist() for c in test]
        seqs = training_sequences(samples)  # the co-visitation lane's own: what the baseline may learn from
        cf, tried = tune_item_cf(seqs, n_items, [(c.history.tolist(), c.target) for c in val], k=K)
        cf_info = {"window": cf.cfg.window, "decay": cf.cfg.decay, "val_hr@10": tried}
        lists["item_cf"] = [cf.recall(c.history.tolist(), DEEP).tolist() for c in test]
        rec = load_recommender(ServingSettings(bundle_dir=bundle_path), bundle_path)  # the recall stage alone
        seq_len = bundle.seq_len
        towers_lists = []
        for c in test:
            query = rec.recall.query(c.history[-seq_len:].tolist(), c.cats[-seq_len:].tolist())
            ids, _ = rec.index.search(query, DEEP, exclude=[set(c.history.tolist())])
            towers_lists.append(ids[0][ids[0] >= 0].tolist())
        lists["towers"] = towers_lists
        seq_info = None
        if sequential:
            from benchmarks.sasrec import train_sasrec

            sas, seq_info = train_sasrec(seqs, n_items, val, seed=seed)
            lists["sequential"] = [sas.recommend(c.history, DEEP).tolist() for c in test]
    t_end = time.perf_counter()

    measured = {name: _measure(lst, test, n_items, tail) for name, lst in lists.items()}
    ours = measured["dinrec"]["per_user"]
    for name, m in measured.items():
        per_user = m.pop("per_user")
        if name != "dinrec":
            m["vs_dinrec"] = {metric: _paired(ours[metric], per_user[metric]) for metric in ("hr@10", "ndcg@10")}
        result[name] = m
    result["dinrec"]["serving"] = serving_info
    result["dinrec"]["model_version"] = bundle.model_version
    # What the ranking stage learned: each signal's validation HR@10 alone, the blend's, its weights.
    result["dinrec"]["ranking_blend"] = bundle.metrics.get("ranking", {}).get("blend")
    result["item_cf"].update(cf_info)
    if seq_info is not None:
        result["sequential"].update(seq_info)
    base = {name: result[name] for name in ("popularity", "item_cf")}
    result["ratios"] = {f"dinrec_vs_{name}_{metric}": (round(result["dinrec"][metric] / m[metric], 3)
                                                       if m[metric] else None)
                        for name, m in base.items() for metric in ("hr@10", "ndcg@10")}
    result["seconds"] = {"train": round(t_train - t0, 1), "serve": round(t_serve - t_train, 1),
                         "total": round(t_end - t0, 1)}
    result["machine"] = machine()  # the seconds are this machine's; the list metrics are not timing
    return result
