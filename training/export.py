"""Export a trained model as a bundle, with the FAISS index of its item embeddings for recall."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from retrieval.index import FaissIndex
from training.bundle import ITEM_INDEX_FILE, write_bundle
from training.model import DIN
from training.samples import SampleSet


def item_vectors(model: DIN) -> tuple[np.ndarray, np.ndarray]:
    """The recall space: item embeddings (rows 1..n; row 0 is padding) and their indices."""
    weights = model.item_emb.weight.detach().float().cpu().numpy()  # (n_items, item_dim)
    ids = np.arange(1, weights.shape[0], dtype=np.int64)
    return weights[1:], ids


def popularity(samples: SampleSet, top: int = 1000) -> list[tuple[str, float]]:
    counts = np.bincount(samples.seq_items, minlength=samples.vocab.n_items)
    counts[0] = 0
    order = np.argsort(-counts, kind="stable")[:top]
    return [(samples.vocab.items[i], float(counts[i])) for i in order if counts[i] > 0]


def export_bundle(out: str | Path, model: DIN, samples: SampleSet, metrics: dict) -> Path:
    vectors, ids = item_vectors(model)
    index = FaissIndex.build(vectors, ids)
    return write_bundle(out, model, samples.vocab, metrics, popularity(samples),
                        extra_files={ITEM_INDEX_FILE: index.save})
