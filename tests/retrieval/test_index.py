import numpy as np
import pytest

from dinrec.retrieval.errors import IndexFormatError
from dinrec.retrieval.index import ExactIndex, FaissIndex


@pytest.fixture
def vectors():
    rng = np.random.default_rng(0)
    return rng.normal(size=(500, 16)).astype(np.float32), np.arange(10, 510, dtype=np.int64)


def test_faiss_agrees_with_exact_search(vectors):
    v, ids = vectors
    q = np.random.default_rng(1).normal(size=(20, 16)).astype(np.float32)
    fi, fs = FaissIndex.build(v, ids).search(q, 10)
    ei, es = ExactIndex(v, ids).search(q, 10)
    assert (fi == ei).all()
    np.testing.assert_allclose(fs, es, rtol=1e-4)


def test_exclusion_removes_seen_items_and_still_fills_k(vectors):
    v, ids = vectors
    q = v[:2]
    first, _ = FaissIndex.build(v, ids).search(q, 5)
    got, _ = FaissIndex.build(v, ids).search(q, 5, exclude=[set(first[0]), set()])
    assert not set(got[0]) & set(first[0]) and (got[0] >= 0).all()
    assert (got[1] == first[1]).all()


def test_save_load_and_short_indexes(tmp_path, vectors):
    v, ids = vectors
    idx = FaissIndex.build(v[:3], ids[:3])
    idx.save(tmp_path / "i.faiss")
    back = FaissIndex.load(tmp_path / "i.faiss")
    got, scores = back.search(v[:1], 5)
    assert len(back) == 3 and list(got[0][3:]) == [-1, -1] and np.isinf(scores[0][3:]).all()


def test_bad_input_is_reported(tmp_path, vectors):
    v, ids = vectors
    with pytest.raises(IndexFormatError, match="dimension"):
        FaissIndex.build(v, ids).search(np.zeros((1, 3)), 2)
    with pytest.raises(IndexFormatError, match="NaN"):
        FaissIndex.build(np.full((2, 2), np.nan), np.arange(2))
    (tmp_path / "junk.faiss").write_bytes(b"junk")
    with pytest.raises(IndexFormatError, match="cannot read"):
        FaissIndex.load(tmp_path / "junk.faiss")


def test_auto_is_exact_below_the_threshold_and_hnsw_from_it():
    from dinrec.retrieval.index import IndexSpec

    assert IndexSpec().resolve(156_249, 32) == "flat" and IndexSpec().resolve(156_250, 32) == "hnsw"
    assert IndexSpec().resolve(100_000, 32) == "flat" and IndexSpec().resolve(100_000, 64) == "hnsw"  # items × dims
    assert IndexSpec(kind="flat").resolve(10**7, 32) == "flat" and IndexSpec(kind="hnsw").resolve(10, 32) == "hnsw"


@pytest.mark.slow
def test_hnsw_finds_95_percent_of_the_exact_top_200_on_100k_items(tmp_path):
    from dinrec.retrieval.index import IndexSpec, recall_at_k

    rng = np.random.default_rng(0)
    # Item vectors with varied norms (as trained embeddings have) and user-like queries: means of 10 items.
    v = (rng.normal(size=(100_000, 32)) * rng.uniform(0.5, 1.5, size=(100_000, 1))).astype(np.float32)
    ids = np.arange(1, 100_001, dtype=np.int64)
    queries = np.stack([v[rng.integers(0, 100_000, 10)].mean(0) for _ in range(200)]).astype(np.float32)
    index = FaissIndex.build(v, ids, IndexSpec(kind="hnsw"))
    assert index.kind == "hnsw"
    recall = recall_at_k(index, ExactIndex(v, ids), queries, 200)
    assert recall >= 0.95, recall
    index.save(tmp_path / "i.faiss")
    loaded = FaissIndex.load(tmp_path / "i.faiss")
    assert loaded.kind == "hnsw" and (loaded.search(queries[:5], 50)[0] == index.search(queries[:5], 50)[0]).all()
    assert recall_at_k(FaissIndex.build(v, ids, IndexSpec(kind="flat")), ExactIndex(v, ids), queries[:20], 200) == 1.0


def test_ef_search_is_the_smallest_step_that_reaches_the_recall_target():
    from dinrec.retrieval.index import IndexSpec, recall_at_k, tune_ef_search

    rng = np.random.default_rng(1)
    v = rng.normal(size=(20_000, 16)).astype(np.float32)
    ids = np.arange(1, 20_001, dtype=np.int64)
    queries = np.stack([v[rng.integers(0, 20_000, 10)].mean(0) for _ in range(60)]).astype(np.float32)
    index = FaissIndex.build(v, ids, IndexSpec(kind="hnsw", hnsw_m=8, ef_construction=40))
    exact = FaissIndex.build(v, ids, IndexSpec(kind="flat"))
    ef, recall, tried = tune_ef_search(index, exact, queries, k=100, target=0.9, steps=(100, 400, 1600))
    assert list(tried)[-1] == ef == index.ef_search and recall == tried[ef] >= 0.9
    assert all(r < 0.9 for step, r in tried.items() if step < ef)  # no smaller step reached the target
    assert recall == round(recall_at_k(index, exact, queries, 100), 4)
    ef, recall, tried = tune_ef_search(index, exact, queries, k=100, target=1.01, steps=(100, 400))
    assert ef == 400 and list(tried) == [100, 400]  # unreachable: the largest step


def test_the_half_precision_scan_returns_the_same_top_items_and_is_kept_only_if_faster():
    from dinrec.retrieval.index import choose_search_index, recall_at_k

    rng = np.random.default_rng(3)
    x = rng.standard_normal((20_000, 32)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    ids = np.arange(1, 20_001, dtype=np.int64)
    flat = FaissIndex.build(x, ids)
    half = flat.as_fp16()
    assert half is not None and half.kind == "flat_fp16" and len(half) == len(flat)
    queries = rng.standard_normal((16, 32)).astype(np.float32)
    assert recall_at_k(half, flat, queries, 200) >= 0.999
    got, _ = half.search(queries[:1], 10, exclude=[{int(flat.search(queries[:1], 1)[0][0, 0])}])
    assert len(set(got[0])) == 10  # exclusion and ids work through the copy
    assert choose_search_index(flat, queries, 200)[1] == {"kind": "flat"}  # 2.5 MB: it stays in cache
    chosen, info = choose_search_index(flat, queries, 200, min_bytes=0)
    assert chosen.kind == info["kind"] == min(info["timings_ms"], key=info["timings_ms"].get)
    assert half.as_fp16() is None  # only the fp32 scan has a half-precision copy
    refused, info = choose_search_index(flat, queries, 200, min_recall=1.01, min_bytes=0)
    assert refused is flat and "flat_fp16" in info["refused"]
