"""`dinrec bench e2e`: the list the service serves, against the simple things it must beat and the
library models a team would pick instead.

On a dataset's leave-last-out split (training.samples: each user's last behaviour on an item new to
them is the test target, the one before it validation; training sees only what came before), for each
seed the model is trained and exported exactly as ``dinrec train`` does with its defaults, the service
is built with ``create_app`` on the embedded store, every behaviour before each user's test target is
sent through ``POST /events``, and each test user's list is what ``GET /recommend`` answers — the same
code path as production (history from the store as ingested, every recall lane, DIN, the blend, the
re-ranker and its long-tail lane, the popularity fill, the seen-item policy). Beside it, on the same
split (a seed changes the models' initialisation, negatives and order, never the split):

* ``popularity`` — the most popular items (training behaviours) the user has not taken;
* ``item_cf`` — item-to-item co-visitation (retrieval.baselines.ItemCF), window and decay chosen on
  the validation split by HR@10;
* ``towers`` — the recall towers' own order (the FAISS stage alone, no DIN);
* library peers (benchmarks.peers, ``make peers``): ``sasrec_rectools`` and ``bert4rec_rectools``
  (RecTools, softmax loss, early-stopped on the validation loss; BERT4Rec on the first seed only: it is
  the slow one) and ``ease_rectools`` (its regularisation chosen on validation), each with its library,
  settings and budget;
* the ranking stage taken apart, each through the same stage (models.ranking: re-ranking, fill and
  seen-item policy as served): ``din_alone`` (DIN's score alone over the served candidates, the long-tail
  lane off), ``without_din`` / ``without_covisit`` / ``without_towers`` (the blend refitted on
  validation without that signal), ``din_catalog`` (DIN over every item), and ``ceiling`` (the share of
  targets among the served candidates: what any order of them can reach).

Every method excludes everything the user interacted with before the target. Per method: ``hr@10``,
``ndcg@10``, ``hr@50``, ``coverage`` (distinct items in the top 10s ÷ catalog items),
``long_tail_share`` (items of the top 10s in the long tail, as the serving lane defines it:
events.long_tail by training behaviours), ``seen_in_list`` (top-10 slots holding an item the user
already took) — means over the seeds it ran — and ``per_seed``. ``vs_dinrec`` (dinrec − method) and
``vs_item_cf`` (method − item-CF) are paired per user: each user's metric is first averaged over the
seeds, then the mean difference and its standard error are taken across users (the users are the
independent units, not user × seed). ``dinrec.gate`` holds the retrain gate's served HR@10 on the same
holdout (training.evaluation, in-process) beside what HTTP served: the two must be the same list.
"""

from __future__ import annotations

import json
import math
import secrets
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from dinrec.benchmarks.machine import machine
from dinrec.datasets import load_dataset
from dinrec.datasets.base import Interactions
from dinrec.retrieval.baselines import Popularity, tune_item_cf
from dinrec.retrieval.hits import hit_at, ndcg_at, ranks
from dinrec.training.samples import SampleSet, training_sequences

K = 10
DEEP = 50
PEERS = ("sasrec_rectools", "bert4rec_rectools", "ease_rectools")
ONE_SEED_PEERS = ("bert4rec_rectools",)  # slow: the first seed only (said in its JSON)
DETERMINISTIC = ("popularity", "item_cf", "ease_rectools")  # the same list whatever the seed: run once
ABLATIONS = ("without_din", "without_covisit", "without_towers")


@dataclass(frozen=True)
class Case:
    """One test user: their behaviours before the target (item indices, oldest first), the target."""

    user: str
    row: int  # the test split's row
    history: np.ndarray  # (H,) item indices, every behaviour before the target
    cats: np.ndarray  # (H,) category indices
    target: int
    ts: float  # the target's time: the service has seen everything before it


def _cases(samples: SampleSet, split) -> list[Case]:
    """Each positive of ``split`` with the user's *whole* history before it (the store keeps a capped
    window; the seen-item policy and item-CF look further back)."""
    out = []
    for r in np.flatnonzero(split.label == 1).tolist():
        span = samples.before(split, r)
        out.append(Case(samples.users[int(split.user[r])], r, samples.seq_items[span], samples.seq_cats[span],
                        int(split.target_item[r]), float(samples.seq_ts[span.stop])))
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
    from dinrec.feature_store.online.memory import MemoryStore
    from dinrec.feature_store.settings import FeatureStoreSettings
    from dinrec.serving.app import create_app
    from dinrec.serving.server import free_port, serve_in_thread
    from dinrec.serving.settings import ServingSettings

    token = secrets.token_urlsafe(32)  # the bench is the operator: its answers say which strategy served them
    settings = ServingSettings(bundle_dir=bundle, request_deadline_ms=60_000, catalog_poll_s=0, log_format="text",
                               score_precision="fp32", admin_token=token)
    fs = FeatureStoreSettings(store="memory", stream="inprocess")
    store = MemoryStore(history_cap=fs.history_len)  # held here to see when ingest has caught up
    app = create_app(settings, fs, store=store)
    lists: list[list[str]] = []
    strategies: dict[str, int] = {}  # answers by the strategy that served them
    degraded = 0
    t0 = time.perf_counter()
    port = free_port()
    with serve_in_thread(app, port, name="dinrec-bench-e2e"), \
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60,
                         headers={"authorization": f"Bearer {token}"}) as client:
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
        while store.applied_behaviours() < len(events):
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
                           seen=rec.seen_items(history, interacted))
        same += [x.item_id for x in ranking.items] == served
    return round(same / max(len(lists), 1), 4)


def _per_user(lists: Sequence[Sequence[int]], test: Sequence[Case]) -> dict[str, np.ndarray]:
    """Each user's HR@10, NDCG@10 and HR@50 of ``lists`` (item indices, best first; 0 = unknown)."""
    rank = ranks((lst[:DEEP] for lst in lists), (c.target for c in test))
    return {"hr@10": hit_at(rank, K).astype(float), "ndcg@10": ndcg_at(rank, K),
            "hr@50": hit_at(rank, DEEP).astype(float)}


def _list_shape(lists: Sequence[Sequence[int]], test: Sequence[Case], n_items: int, tail: np.ndarray) -> dict:
    """Coverage, long-tail share, seen items and length of the top 10s."""
    seen, tail_n, slots = 0, 0, 0
    served: set[int] = set()
    for lst, c in zip(lists, test, strict=True):
        top = list(lst[:K])
        taken = set(c.history.tolist())
        seen += sum(i in taken for i in top)
        tail_n += sum(bool(tail[i]) for i in top if i > 0)
        slots += len(top)
        served.update(i for i in top if i > 0)
    return {"coverage": len(served) / max(n_items - 1, 1), "long_tail_share": tail_n / max(slots, 1),
            "seen_in_list": seen, "mean_list_len": slots / max(len(test), 1)}


def _paired(a: np.ndarray, b: np.ndarray) -> dict:
    """a − b per user: the mean and its standard error across users."""
    d = a - b
    se = float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else float("nan")
    return {"diff": round(float(d.mean()), 4), "se": round(se, 4)}


class Runs:
    """Every method's lists, seed by seed, and what each says of itself."""

    def __init__(self, test: Sequence[Case], n_items: int, tail: np.ndarray) -> None:
        self.test, self.n_items, self.tail = test, n_items, tail
        self.per_user: dict[str, list[dict[str, np.ndarray]]] = {}
        self.shape: dict[str, list[dict]] = {}
        self.info: dict[str, dict] = {}

    def add(self, name: str, lists: Sequence[Sequence[int]]) -> None:
        self.per_user.setdefault(name, []).append(_per_user(lists, self.test))
        self.shape.setdefault(name, []).append(_list_shape(lists, self.test, self.n_items, self.tail))

    def pooled(self, name: str) -> dict[str, np.ndarray]:
        """Each user's metrics averaged over the seeds the method ran."""
        runs = self.per_user[name]
        return {m: np.mean([r[m] for r in runs], axis=0) for m in runs[0]}

    def summary(self) -> dict:
        out: dict = {}
        ours = self.pooled("dinrec")
        cf = self.pooled("item_cf")
        for name, runs in self.per_user.items():
            pooled = self.pooled(name)
            shapes = self.shape[name]
            m: dict = {metric: round(float(v.mean()), 4) for metric, v in pooled.items()}
            m.update({key: round(float(np.mean([s[key] for s in shapes])), 4) for key in ("coverage", "long_tail_share",
                                                                                         "mean_list_len")})
            m["seen_in_list"] = int(sum(s["seen_in_list"] for s in shapes))
            m["seeds_run"] = len(runs)
            m["per_seed"] = {metric: [round(float(r[metric].mean()), 4) for r in runs]
                             for metric in ("hr@10", "ndcg@10")}
            if name != "dinrec":
                m["vs_dinrec"] = {metric: _paired(ours[metric], pooled[metric]) for metric in ("hr@10", "ndcg@10")}
            if name != "item_cf":
                m["vs_item_cf"] = {metric: _paired(pooled[metric], cf[metric]) for metric in ("hr@10", "ndcg@10")}
            out[name] = {**m, **self.info.get(name, {})}
        return out


def _indices(lists: Sequence[Sequence[str]], index_of: dict[str, int]) -> list[list[int]]:
    return [[index_of.get(i, 0) for i in lst] for lst in lists]


def _towers_lists(rec, test: Sequence[Case]) -> list[list[int]]:
    out = []
    for c in test:
        query = rec.recall.query(c.history[-rec.seq_len:].tolist(), c.cats[-rec.seq_len:].tolist())
        ids, _ = rec.index.search(query, DEEP, exclude=[set(c.history.tolist())])
        out.append(ids[0][ids[0] >= 0].tolist())
    return out


def _catalog_lists(rec, samples: SampleSet, test: Sequence[Case]) -> list[list[int]]:
    """DIN scoring every item the user has not taken — with what it reads at serving time (models.context)
    — the ranking model on the recall-free footing of the sequential peers. The catalog is the items with a
    training behaviour: the rest of an offline split's vocabulary is mostly other users' held-out targets,
    which a model reading the training count would find by their count of 0 (taobao-sample's 0.254)."""
    import torch

    from dinrec.training.evaluation import served_history

    every = np.flatnonzero(rec._counts > 0)  # (I',) item indices, never 0 (padding)
    every = every[(every > 0) & (every < rec.scorer.n_items)]
    out = []
    for c in test:
        history, _ = served_history(samples, samples.test, c.row, rec.seq_len)
        items, cats = rec._encode(history)
        logits = rec.scorer.score(torch.as_tensor(items, dtype=torch.long), torch.as_tensor(cats, dtype=torch.long),
                                  torch.from_numpy(every), context=rec._context(history, items, every, rec.scorer)
                                  ).logits.clone()  # (I',)
        logits[torch.from_numpy(np.isin(every, c.history))] = -torch.inf
        out.append(every[logits.topk(DEEP).indices.numpy()].tolist())
    return out


def _stage_variants(bundle, samples: SampleSet, test: Sequence[Case]) -> tuple[dict[str, list[list[str]]], dict]:
    """The ranking stage taken apart (each variant through the same stage, in-process, fp32): the gate's
    list, DIN alone, the blend refitted without each signal, DIN over the catalog; and the ceiling."""
    from dinrec.models.blend import Blend
    from dinrec.models.ranking import Recommender
    from dinrec.models.ranking_settings import RankingSettings
    from dinrec.retrieval.index import FaissIndex
    from dinrec.training.evaluation import served_history, served_lists

    index = FaissIndex.load(bundle.item_index_path)
    rows = np.asarray([c.row for c in test])
    # One stage for every variant, its blend swapped between them: each history is recalled and scored by DIN
    # once (Recommender.memo), and a variant costs its blend, rerank and fill.
    served = Recommender(bundle, index, RankingSettings(), precision="fp32")
    served.memo = {}

    def stage(blend: Blend | None | Literal["bundle"] = "bundle") -> Recommender:
        served.blend = bundle.blend if isinstance(blend, str) else blend  # "bundle": the bundle's own
        return served

    out: dict[str, list[list[str]]] = {}
    stage()
    out["gate"] = served_lists(bundle, samples, samples.test, rows, K, rec=served)
    out["din_alone"] = served_lists(bundle, samples, samples.test, rows, DEEP, rec=stage(None), tail_share=0.0)
    ablations = ((bundle.metrics.get("ranking") or {}).get("blend") or {}).get("ablations", {})
    for name in ABLATIONS:
        if name in ablations and bundle.blend is not None:
            out[name] = served_lists(bundle, samples, samples.test, rows, DEEP,
                                     rec=stage(Blend(tuple(ablations[name]), bundle.blend.temperature)))
    stage()  # the served blend again, for what follows
    names = bundle.vocab.items
    out["din_catalog"] = [[names[i] for i in lst] for lst in _catalog_lists(served, samples, test)]
    found = 0
    for c in test:
        history, taken = served_history(samples, samples.test, c.row, served.seq_len)
        found += names[c.target] in served.recall_items(history, served.recall_candidates,
                                                        served.seen_items(history, taken))
    ceiling = {"hr": round(found / max(len(test), 1), 4), "candidates": served.recall_candidates,
               "covisit_candidates": served.covisit_candidates}
    return out, ceiling




def bench_e2e(data: Path, *, seeds: Sequence[int] = (0,), max_users: int | None = None,
              peers: Sequence[str] = PEERS, own_sasrec: bool = False, stage: bool = True,
              train_overrides: dict | None = None, peer_params: dict[str, dict] | None = None,
              progress: bool | None = None, partial: Path | None = None) -> dict:
    """``max_users``: serve only the first N test users (every user trains); ``peers``: the library peers
    to run (benchmarks.peers; missing ones are reported as skipped); ``own_sasrec``: also dinrec's own
    SASRec-style model (benchmarks.sasrec); ``stage``: the stage's variants (DIN alone, the ablations,
    DIN over the catalog, the ceiling); ``train_overrides``: TrainSettings fields to change (default: none
    — the defaults are what is measured); ``progress``: a line per stage on stderr (stdout is the JSON;
    default: when stderr is a terminal); ``partial``: after each seed but the last, the result so far is
    written there (``seeds_done`` says which), so a run stopped midway keeps what it measured."""
    from dinrec.benchmarks.peers import PeerUnavailable, run_library_peer
    from dinrec.models.bundle import load_bundle
    from dinrec.storage.files import write_atomically
    from dinrec.training.pipeline import samples_for, train_bundle
    from dinrec.training.progress import Stages, showing
    from dinrec.training.settings import TrainSettings

    seeds = list(seeds)
    if not seeds:
        raise ValueError("give at least one seed")
    t0 = time.perf_counter()
    _progress = Stages(showing(progress))
    interactions = load_dataset(data)
    base = TrainSettings(progress=False, **(train_overrides or {}))
    samples = samples_for(interactions, base.model_copy(update={"seed": seeds[0]}))
    test, val = _cases(samples, samples.test), _cases(samples, samples.val)
    if max_users is not None:
        test = test[:max_users]
    if not test:
        raise ValueError(f"{data}: no user has enough behaviours for a held-out target")
    n_items = samples.vocab.n_items
    result: dict = {"dataset": str(data), "source": samples.source, "users": len(test), "items": n_items - 1,
                    "seeds": seeds, "holdout": "each user's last behaviour on an item new to them (test), the one "
                    "before (val); the split is the same for every seed", "k": K,
                    "train_settings": {k: v for k, v in base.model_dump().items() if k in (train_overrides or {})}}
    from dinrec.events.long_tail import long_tail_mask
    from dinrec.training.export import item_counts

    tail = long_tail_mask(item_counts(samples))
    runs = Runs(test, n_items, tail)
    seqs = training_sequences(samples)  # what a baseline may learn from: behaviours before validation
    pop = Popularity(np.bincount(np.concatenate(seqs), minlength=n_items))
    runs.add("popularity", [pop.recall(c.history.tolist(), DEEP).tolist() for c in test])
    cf, tried = tune_item_cf(seqs, n_items, [(c.history.tolist(), c.target) for c in val], k=K)
    runs.add("item_cf", [cf.recall(c.history.tolist(), DEEP).tolist() for c in test])
    runs.info["item_cf"] = {"window": cf.cfg.window, "decay": cf.cfg.decay, "val_hr@10": tried}
    seconds: dict[str, float] = {"baselines": round(time.perf_counter() - t0, 1)}
    _progress(f"{len(test)} test users; popularity and item-CF done")
    dinrec_info: dict = {"serving": [], "gate": [], "model_version": [], "ranking_blend": [], "train_seconds": []}
    ceilings = []
    for n, seed in enumerate(seeds):
        settings = base.model_copy(update={"seed": seed})
        seed_samples = samples if n == 0 else samples_for(interactions, settings)
        with tempfile.TemporaryDirectory(prefix="dinrec-bench-e2e-") as tmp:
            ts = time.perf_counter()
            bundle_path = train_bundle(seed_samples, settings, Path(tmp) / "bundle", run_dir=Path(tmp)).bundle
            assert bundle_path is not None  # exported: None only on a torchrun rank but the first
            dinrec_info["train_seconds"].append(round(time.perf_counter() - ts, 1))
            _progress(f"seed {seed}: dinrec trained")
            bundle = load_bundle(bundle_path)
            served, serving_info = _served_lists(bundle_path, _ingested(interactions, test), test, DEEP)
            index_of = bundle.vocab.item_index()
            runs.add("dinrec", _indices(served, index_of))
            _progress(f"seed {seed}: dinrec served through HTTP")
            dinrec_info["serving"].append(serving_info)
            dinrec_info["model_version"].append(bundle.model_version)
            # What the ranking stage learned: each signal's validation HR@10 alone, the blend's, its weights.
            dinrec_info["ranking_blend"].append(bundle.metrics.get("ranking", {}).get("blend"))
            from dinrec.models.ranking import Recommender
            from dinrec.retrieval.index import FaissIndex

            rec = Recommender(bundle, FaissIndex.load(bundle.item_index_path), precision="fp32")
            runs.add("towers", _towers_lists(rec, test))
            if stage:
                variants, ceiling = _stage_variants(bundle, seed_samples, test)
                gate = variants.pop("gate")
                agrees = float(np.mean([g == h[:K] for g, h in zip(gate, served, strict=True)]))
                gate_hr = float(np.mean([bundle.vocab.items[c.target] in g for g, c in zip(gate, test, strict=True)]))
                dinrec_info["gate"].append({"served_hr@10": round(gate_hr, 4), "lists_equal_http": round(agrees, 4)})
                for name, lists in variants.items():
                    runs.add(name, _indices(lists, index_of))
                ceilings.append(ceiling)
                _progress(f"seed {seed}: the stage's variants done")
        for name in peers:
            if (name in DETERMINISTIC and n > 0) or (name in ONE_SEED_PEERS and n > 0):
                continue
            try:
                peer = run_library_peer(name, samples, np.asarray([c.row for c in test]), DEEP, seed,
                                        (peer_params or {}).get(name))
            except PeerUnavailable as exc:
                runs.info[name] = {"skipped": str(exc)}
                continue
            runs.add(name, [[i for i in lst.tolist() if i > 0] for lst in peer.lists])
            _progress(f"seed {seed}: {name} done")
            runs.info.setdefault(name, {"runs": []})["runs"].append(peer.info)
            if name in ONE_SEED_PEERS:
                runs.info[name]["note"] = "run on the first seed only (the slowest peer)"
        if own_sasrec:
            from dinrec.benchmarks.sasrec import train_sasrec

            sas, sas_info = train_sasrec(seqs, n_items, val, seed=seed)
            runs.add("sasrec_own", [sas.recommend(c.history, DEEP).tolist() for c in test])
            runs.info.setdefault("sasrec_own", {"runs": []})["runs"].append(sas_info)
        seconds[f"seed_{seed}"] = round(time.perf_counter() - t0 - sum(seconds.values()), 1)
        if partial is not None and n + 1 < len(seeds):  # what is measured so far survives a stopped run
            so_far = _finished({**result, "seeds_done": seeds[:n + 1]}, runs, dinrec_info, ceilings, dict(seconds), t0)
            write_atomically(partial, (json.dumps(so_far) + "\n").encode())
    return _finished(result, runs, dinrec_info, ceilings, seconds, t0)


def _finished(result: dict, runs: Runs, dinrec_info: dict, ceilings: list[dict], seconds: dict,
              t0: float) -> dict:
    """The JSON: every method pooled over the seeds it ran, the ceiling, the ratios, the time, the machine."""
    summary = runs.summary()
    for name, info in runs.info.items():
        if name not in summary:
            summary[name] = info  # skipped
    result.update(summary)
    result["dinrec"].update(dinrec_info)
    if ceilings:
        result["ceiling"] = {"hr": round(float(np.mean([c["hr"] for c in ceilings])), 4),
                             "per_seed": [c["hr"] for c in ceilings], "candidates": ceilings[0]["candidates"],
                             "covisit_candidates": ceilings[0]["covisit_candidates"],
                             "what": "share of test targets among the served candidates (every lane): the HR any "
                                     "order of them can reach"}
    base_methods = {name: result[name] for name in ("popularity", "item_cf")}
    result["ratios"] = {f"dinrec_vs_{name}_{metric}": (round(result["dinrec"][metric] / m[metric], 3)
                                                       if m[metric] else None)
                        for name, m in base_methods.items() for metric in ("hr@10", "ndcg@10")}
    seconds["total"] = round(time.perf_counter() - t0, 1)
    result["seconds"] = seconds
    result["machine"] = machine()  # the seconds are this machine's; the list metrics are not timing
    return result
