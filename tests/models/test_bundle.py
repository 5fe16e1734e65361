from __future__ import annotations

import json
import shutil

import pytest
import torch

from dinrec.models.bundle import BundleError, load_bundle
from dinrec.models.context import known_last, served_context
from dinrec.training.data import SplitTensors


def _list_scores(bundle, hist, cats, target, target_cat) -> torch.Tensor:
    """Each sample's target scored as a one-candidate list, with the context serving builds from the bundle
    (its co-visitation lane and counts; every behaviour at one time)."""
    hist, cats = known_last(hist, cats)
    cand, cand_cats = target[:, None], target_cat[:, None]  # (B, 1)
    pairs, counts = bundle.context_sources()
    context = served_context(bundle.model.cfg, pairs, counts, hist, cats,
                             torch.zeros(hist.shape, dtype=torch.float64), cand, cand_cats)
    return bundle.model.score_lists(hist, cats, cand, cand_cats, context)  # (B, 1)


def test_round_trip_gives_the_same_scores(tiny_run):
    data, samples, bundle_dir, metrics = tiny_run
    bundle = load_bundle(bundle_dir)
    assert bundle.metrics["weights_sha256"] == metrics["weights_sha256"]
    assert bundle.vocab.items == samples.vocab.items
    assert bundle.manifest["format_version"] == 1 and bundle.manifest["feature_schema_version"] == 1
    t = SplitTensors(samples, samples.test, 20)
    b = t.batch(torch.arange(len(t)))
    assert bundle.model.cfg.scores_lists  # the default DIN reads context: it scores lists with what serving gives
    torch.testing.assert_close(_list_scores(bundle, *b.inputs()), _list_scores(load_bundle(bundle_dir), *b.inputs()),
                               rtol=0, atol=0)
    assert bundle.item_index_path.is_file() and bundle.popularity[0][1] >= bundle.popularity[-1][1]


@pytest.mark.parametrize("victim", ["model.safetensors", "vocab.json", "item_index.faiss"])
def test_a_tampered_file_is_refused(tiny_run, tmp_path, victim):
    copy = tmp_path / "b"
    shutil.copytree(tiny_run[2], copy)
    with (copy / victim).open("r+b") as fh:
        fh.seek(-2, 2)
        last = fh.read(1)
        fh.seek(-2, 2)
        fh.write(bytes([last[0] ^ 0xFF]))
    with pytest.raises(BundleError, match=f"checksum mismatch for {victim}"):
        load_bundle(copy)


def test_unknown_versions_and_missing_files_are_refused(tiny_run, tmp_path):
    copy = tmp_path / "b"
    shutil.copytree(tiny_run[2], copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    (copy / "manifest.json").write_text(json.dumps({**manifest, "format_version": 99}))
    with pytest.raises(BundleError, match="format version 99 is not supported"):
        load_bundle(copy)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    (copy / "vocab.json").unlink()
    with pytest.raises(BundleError, match="vocab.json is listed in the manifest but missing"):
        load_bundle(copy)
    with pytest.raises(BundleError, match="not a dinrec bundle"):
        load_bundle(tmp_path)


def test_the_bundle_carries_its_input_contract_and_its_index_card(tiny_run):
    import json

    from dinrec.models.bundle import load_bundle

    data, samples, bundle_dir, metrics = tiny_run
    bundle = load_bundle(bundle_dir)
    assert bundle.config.extra["seq_len"] == metrics["seq_len"] == 20 == bundle.seq_len
    info = json.loads((bundle_dir / "item_index.json").read_text())
    assert info["kind"] == "flat" and info["items"] == samples.vocab.n_items - 1
    assert info == bundle.item_index_info


def test_an_hnsw_index_gets_its_ef_search_measured_on_real_histories(tiny_run, tmp_path):
    from dinrec.models.bundle import load_bundle
    from dinrec.retrieval.index import EF_SEARCH_STEPS, IndexSpec
    from dinrec.training.export import export_bundle

    _, samples, bundle_dir, metrics = tiny_run
    v1 = load_bundle(bundle_dir)
    assert v1.covisit is not None
    bundle = load_bundle(export_bundle(tmp_path / "hnsw", v1.model, samples, dict(metrics),
                                       IndexSpec(kind="hnsw"), towers=v1.towers, lane=(v1.covisit, {})))
    info = bundle.item_index_info
    assert info["kind"] == "hnsw" and info["space"] == "towers"
    assert info["spec"]["ef_search"] in EF_SEARCH_STEPS and list(info["ef_search_tried"])[-1] == str(
        info["spec"]["ef_search"])
    # The smallest step reaching 0.95 recall@200 (each tried in order until one does), else the largest.
    tried = {int(ef): r for ef, r in info["ef_search_tried"].items()}
    assert list(tried) == list(EF_SEARCH_STEPS[:len(tried)])
    first = next((i for i, r in enumerate(tried.values()) if r >= 0.95), None)
    assert len(tried) == (len(EF_SEARCH_STEPS) if first is None else first + 1)  # it stops at the first that does
    assert info["spec"]["ef_search"] == EF_SEARCH_STEPS[len(tried) - 1]
    assert info["recall_at_200"] == tried[info["spec"]["ef_search"]]


def test_a_file_the_manifest_does_not_list_or_a_name_outside_the_folder_is_refused(tiny_run, tmp_path):
    copy = tmp_path / "b"
    shutil.copytree(tiny_run[2], copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    (copy / "item_index.json").unlink()  # the index card is read whether listed or not: it must be listed
    del manifest["files"]["item_index.json"]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    load_bundle(copy)  # unlisted and absent: fine
    (copy / "item_index.json").write_text("{}")
    with pytest.raises(BundleError, match="item_index.json not listed in the manifest"):
        load_bundle(copy)
    (copy / "item_index.json").unlink()
    (tmp_path / "secret").write_text("x")
    manifest["files"]["../secret"] = "0" * 64
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="not a plain file name"):
        load_bundle(copy)
