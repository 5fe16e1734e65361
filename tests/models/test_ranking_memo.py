"""Recommender.memo: ranking the same histories again under another blend or tail share reuses each history's
candidates, DIN's logits and the blend's signals — and serves exactly the lists fresh stages serve."""

from __future__ import annotations

import numpy as np

from dinrec.models.blend import Blend
from dinrec.models.bundle import load_bundle
from dinrec.models.ranking import Recommender
from dinrec.models.ranking_settings import RankingSettings
from dinrec.retrieval.index import FaissIndex
from dinrec.training.evaluation import served_lists


def test_a_memo_serves_the_lists_fresh_stages_serve(tiny_run):
    _, samples, bundle_dir, _ = tiny_run
    bundle = load_bundle(bundle_dir)
    assert bundle.blend is not None
    split = samples.test
    rows = np.flatnonzero(split.label == 1)[:60]
    settings = RankingSettings()
    other = Blend(tuple(float(w) * (j % 3) for j, w in enumerate(bundle.blend.weights)), bundle.blend.temperature)
    variants = [("bundle", None), (None, 0.0), (other, None), ("bundle", 0.5)]

    def fresh(blend):
        rec = Recommender(bundle, FaissIndex.load(bundle.item_index_path), settings, precision="fp32")
        rec.blend = bundle.blend if blend == "bundle" else blend
        return rec

    expected = [served_lists(bundle, samples, split, rows, 20, rec=fresh(b), tail_share=t) for b, t in variants]
    shared = fresh("bundle")
    shared.memo = {}
    scored, score = [], shared.scorer.score

    def counted(*a, **kw):  # count DIN's passes
        scored.append(1)
        return score(*a, **kw)

    shared.scorer.score = counted
    got = []
    for b, t in variants:
        shared.blend = bundle.blend if b == "bundle" else b
        got.append(served_lists(bundle, samples, split, rows, 20, rec=shared, tail_share=t))
    assert got == expected
    assert expected[0] != expected[2]  # the blends differ, so this could have caught a stale signal
    # Each history was recalled and scored once, not once per variant.
    assert 0 < len(scored) == len(shared.memo) <= len(rows)
