"""Export a trained model as a bundle, with the FAISS index of its item embeddings for recall.

The index is exact while a scan is cheaper (below 5M items × dims) and HNSW above
(retrieval.index.IndexSpec); its kind, its parameters and, for HNSW, its measured recall@200 against
exact search go to ``item_index.json``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from retrieval.index import ExactIndex, FaissIndex, IndexSpec, recall_at_k
from training.bundle import ITEM_INDEX_FILE, ITEM_INDEX_INFO_FILE, write_bundle
from training.model import DIN
from training.samples import SampleSet
from training.scorer import recall_query, recall_space


def popularity(samples: SampleSet, top: int = 1000) -> list[tuple[str, float]]:
    counts = np.bincount(samples.seq_items, minlength=samples.vocab.n_items)
    counts[0] = 0
    order = np.argsort(-counts, kind="stable")[:top]
    return [(samples.vocab.items[i], float(counts[i])) for i in order if counts[i] > 0]


def build_item_index(model: DIN, spec: IndexSpec | None = None, probes: int = 200,
                     k: int = 200) -> tuple[FaissIndex, dict]:
    """The recall index and what to record about it (recall@k vs exact on user-like queries: the
    mean of 10 random items, as serving queries are means of a history)."""
    spec = spec or IndexSpec()
    table = recall_space(model)  # (n_items, D), row = item index
    ids = np.arange(1, len(table), dtype=np.int64)
    vectors = table[1:]
    index = FaissIndex.build(vectors, ids, spec)
    info: dict = {"kind": index.kind, "items": len(ids), "spec": spec.to_json()}
    if index.kind != "flat":
        rng = np.random.default_rng(0)
        queries = np.vstack([recall_query(table, rng.integers(1, len(table), 10).tolist()) for _ in range(probes)])
        info[f"recall_at_{k}"] = round(recall_at_k(index, ExactIndex(vectors, ids), queries, k), 4)
    return index, info


def export_bundle(out: str | Path, model: DIN, samples: SampleSet, metrics: dict,
                  index_spec: IndexSpec | None = None) -> Path:
    index, info = build_item_index(model, index_spec)
    # The input contract belongs to the model's config: how long a history it was trained on.
    model.cfg = dataclasses.replace(model.cfg, extra={**model.cfg.extra, "seq_len": int(metrics["seq_len"])})
    return write_bundle(out, model, samples.vocab, metrics, popularity(samples),
                        extra_files={ITEM_INDEX_FILE: index.save,
                                     ITEM_INDEX_INFO_FILE: lambda p: p.write_text(json.dumps(info, indent=1))})
