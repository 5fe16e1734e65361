"""Export a trained model as a bundle, with the FAISS index of its recall space (models.recall:
the recall towers' item vectors when they were trained, else DIN's item embeddings).

The index is exact while a scan is cheaper (below 5M items × dims) and HNSW above
(retrieval.index.IndexSpec); its kind, its parameters and, for HNSW, its measured recall@200 against
exact search go to ``item_index.json``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from dinrec.models.bundle import (
    BLEND_FILE,
    COVISIT_FILE,
    ITEM_COUNTS_FILE,
    ITEM_INDEX_FILE,
    ITEM_INDEX_INFO_FILE,
    write_bundle,
)
from dinrec.models.din import DIN
from dinrec.models.recall import RecallSpace
from dinrec.models.towers import Towers
from dinrec.retrieval.baselines import tune_item_cf
from dinrec.retrieval.covisit import CoVisitation
from dinrec.retrieval.index import FaissIndex, IndexSpec, tune_ef_search
from dinrec.training.data import split_histories
from dinrec.training.samples import SampleSet, training_sequences


def item_counts(samples: SampleSet) -> np.ndarray:
    """(n_items,) int64 training behaviours per item index (training.samples.training_sequences: before each
    user's validation target, so no held-out behaviour counts); padding (0) counts none."""
    seqs = training_sequences(samples)
    flat = np.concatenate(seqs) if seqs else np.zeros(0, dtype=np.int64)
    counts = np.bincount(flat, minlength=samples.vocab.n_items).astype(np.int64)
    counts[0] = 0
    return counts


def popularity(samples: SampleSet, top: int = 1000, counts: np.ndarray | None = None) -> list[tuple[str, float]]:
    return most_counted(samples.vocab.items, item_counts(samples) if counts is None else counts, top)


def most_counted(items: Sequence[str], counts: np.ndarray, top: int = 1000) -> list[tuple[str, float]]:
    """The bundle's popularity list: the ``top`` items (ids, by index) with the most ``counts`` (by index),
    most first (ties in index order), those never counted left out."""
    order = np.argsort(-counts, kind="stable")[:top]
    return [(items[i], float(counts[i])) for i in order if counts[i] > 0]


def build_item_index(space: RecallSpace, spec: IndexSpec | None = None, probes: np.ndarray | None = None,
                     k: int = 200) -> tuple[FaissIndex, dict]:
    """The recall index and what to record about it. For HNSW, efSearch is chosen by measurement:
    the smallest that finds 95 % of the exact top ``k`` for the ``probes`` (queries, (P, D); default:
    the queries of 200 random 10-item histories), recorded with that recall."""
    spec = spec or IndexSpec()
    table = space.item_vectors  # (n_items, D), row = item index
    ids = np.arange(1, len(table), dtype=np.int64)
    vectors = table[1:]
    index = FaissIndex.build(vectors, ids, spec)
    info: dict = {"kind": index.kind, "items": len(ids), "space": space.kind, "spec": spec.to_json()}
    if index.kind != "flat":
        if probes is None:
            hist = np.random.default_rng(0).integers(1, len(table), (200, 10))  # (P, 10)
            probes = space.queries(torch.from_numpy(hist), space.item_category[hist])
        exact = FaissIndex.build(vectors, ids, IndexSpec(kind="flat"))
        ef, recall, tried = tune_ef_search(index, exact, probes, k)
        info["spec"] = {**info["spec"], "ef_search": ef}
        info[f"recall_at_{k}"] = recall
        info["ef_search_tried"] = tried
    return index, info


def _probe_queries(space: RecallSpace, samples: SampleSet, n: int = 200) -> np.ndarray:
    """Recall queries of ``n`` real test histories: what the index will be asked (P, D)."""
    split = samples.test
    rows = np.flatnonzero(split.label == 1)
    rows = np.random.default_rng(0).choice(rows, min(n, len(rows)), replace=False) if len(rows) else rows
    return space.queries(*split_histories(samples, split, rows))


def fit_covisitation(samples: SampleSet, max_users: int = 3000, seed: int = 0) -> tuple[CoVisitation, dict]:
    """The co-visitation lane, fitted on the training behaviours, its window and decay chosen by
    validation HR@10 (history items excluded, as serving does)."""
    rows = np.flatnonzero(samples.val.label == 1)
    if len(rows) > max_users:
        rows = np.sort(np.random.default_rng(seed).choice(rows, max_users, replace=False))
    hist, _ = split_histories(samples, samples.val, rows)
    cases = [([i for i in h if i], int(t)) for h, t in zip(hist.tolist(), samples.val.target_item[rows], strict=True)]
    cf, tried = tune_item_cf(training_sequences(samples), samples.vocab.n_items, cases)
    lane = CoVisitation.from_item_cf(cf)
    return lane, {**lane.cfg.to_json(), "val_hr@10_by_config": tried}


def export_bundle(out: str | Path, model: DIN, samples: SampleSet, metrics: dict,
                  index_spec: IndexSpec | None = None, towers: Towers | None = None,
                  lineage: dict | None = None, blend: bool = True,
                  lane: tuple[CoVisitation, dict] | None = None) -> Path:
    """``towers``: the recall towers trained beside DIN (None: recall from DIN's item embeddings).
    With towers, the co-visitation lane (``lane``: already fitted, with what its fit said; else fitted
    here when ``blend``) goes into the bundle, and with ``blend`` the ranking blend (models.blend) is fitted
    on the validation split too (``metrics["ranking"]`` says what each gave). A DIN that reads
    co-visitation (models.din: pair inputs) needs the lane."""
    space = RecallSpace(model, towers, samples.vocab.item_category)
    resolved = (index_spec or IndexSpec()).resolve(samples.vocab.n_items - 1, space.dim)
    probes = _probe_queries(space, samples) if resolved != "flat" and len(samples.test) else None
    index, info = build_item_index(space, index_spec, probes)
    # The input contract belongs to the model's config: how long a history it was trained on.
    model.cfg = dataclasses.replace(model.cfg, extra={**model.cfg.extra, "seq_len": int(metrics["seq_len"])})
    counts = item_counts(samples)
    # The negatives per positive it was trained against: what its probabilities are relative to
    # (training.evaluation corrects for it before comparing calibration).
    metrics.setdefault("train_negatives", samples.negatives)
    extra: dict = {ITEM_INDEX_FILE: index.save,
                   ITEM_INDEX_INFO_FILE: lambda p: p.write_text(json.dumps(info, indent=1)),
                   ITEM_COUNTS_FILE: lambda p: np.save(p, counts)}
    if model.cfg.pair_inputs and lane is None:
        raise ValueError("this DIN reads co-visitation similarities: export it with the lane it was trained with")
    if lane is not None and towers is not None and not blend:
        metrics["ranking"] = {"covisit": lane[1]}
        extra[COVISIT_FILE] = lane[0].save
    if blend and towers is not None and int((samples.val.label == 1).sum()) > 0:
        from dinrec.models.bundle import Bundle
        from dinrec.models.ranking import Recommender
        from dinrec.training.blend_fit import fit_blend

        covisit, lane_info = lane if lane is not None else fit_covisitation(samples)
        # The ranking stage over what this bundle will hold, before it is written: the blend is fitted on
        # the candidates and signals the stage itself has, with the served configuration.
        unexported = Bundle(path=Path(out), manifest={"model_version": "unexported"}, config=model.cfg,
                            vocab=samples.vocab, metrics=metrics, popularity=popularity(samples, counts=counts),
                            model=model, towers=towers, item_counts=counts, covisit=covisit)
        fitted, blend_info = fit_blend(Recommender(unexported, index, precision="fp32"), samples)
        metrics["ranking"] = {"covisit": lane_info, "blend": blend_info}
        extra[COVISIT_FILE] = covisit.save
        extra[BLEND_FILE] = lambda p: p.write_text(json.dumps(fitted.to_json(), indent=1))
    return write_bundle(out, model, samples.vocab, metrics, popularity(samples, counts=counts), towers=towers,
                        lineage=lineage, extra_files=extra)
