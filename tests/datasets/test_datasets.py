from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from dinrec.datasets import detect_layout, load_dataset
from dinrec.datasets.errors import DatasetError
from dinrec.datasets.synthetic import SyntheticConfig, generate
from dinrec.events.schema import dumps_many
from tests.conftest import shared_dataset


def test_movielens_100k_as_published():
    d = load_dataset(shared_dataset("ml-100k"))
    assert detect_layout(shared_dataset("ml-100k")) == "movielens-100k"
    assert len(d) == 100_000 and len(set(d.user_id)) == 943
    b = d.behaviours()
    assert (d.value[np.isin(np.arange(len(d)), np.flatnonzero(d.value >= 4))] >= 4).all()
    assert len(b) == int((d.value >= 4).sum())
    # Toy Story (1): Animation|Children's|Comedy -> first genre
    assert set(d.category_id[d.item_id == "1"]) == {"Animation"}


def test_movielens_1m_dat_layout(tmp_path):
    (tmp_path / "ratings.dat").write_text("1::1193::5::978300760\n1::661::3::978302109\n2::1193::4::978298413\n")
    (tmp_path / "movies.dat").write_text("1193::One Flew (1975)::Drama\n661::James (1996)::Animation|Children's\n")
    d = load_dataset(tmp_path)
    assert d.source == "movielens-dat"
    assert d.category_id.tolist() == ["Drama", "Animation", "Drama"]
    assert d.behaviours().item_id.tolist() == ["1193", "1193"]


def test_movielens_latest_csv_layout_with_quoted_titles(tmp_path):
    (tmp_path / "ratings.csv").write_text("userId,movieId,rating,timestamp\n1,1,4.0,964982703\n1,3,3.5,964981247\n")
    (tmp_path / "movies.csv").write_text('movieId,title,genres\n1,"Toy Story, The (1995)",Adventure|Animation\n'
                                         "3,Grumpier (1995),Comedy|Romance\n")
    d = load_dataset(tmp_path)
    assert d.category_id.tolist() == ["Adventure", "Comedy"]
    assert d.behaviours().item_id.tolist() == ["1"]


def test_amazon_hin_uses_brand_as_the_category():
    d = load_dataset(shared_dataset("amazon-hin"))
    assert len(d) == 195_791 and len(set(d.user_id)) == 6_170 and len(set(d.item_id)) == 2_753
    assert len(set(d.category_id)) == 334 and all(c.startswith("brand:") for c in d.category_id[:10])
    assert len(d.behaviours()) == len(d)  # every review is a purchase


def test_amazon_mcauley_json_lines_2014_meta_is_python_literals(tmp_path):
    reviews = [{"reviewerID": "A1", "asin": "B1", "overall": 5.0, "unixReviewTime": 1400000000},
               {"reviewerID": "A1", "asin": "B2", "overall": 2.0, "unixReviewTime": 1400000100}]
    with gzip.open(tmp_path / "reviews_Books_5.json.gz", "wt") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in reviews))
    (tmp_path / "meta_Books.json").write_text(
        "{'asin': 'B1', 'categories': [['Books', 'Fiction']]}\n{'asin': 'B2', 'categories': [['Books']]}\n")
    d = load_dataset(tmp_path)
    assert d.source == "amazon-reviews"
    assert d.category_id.tolist() == ["Fiction", "Books"]
    assert d.value.tolist() == [5.0, 2.0]


def test_taobao_user_behavior_csv():
    d = load_dataset(shared_dataset("taobao-userbehavior-sample"))
    assert len(d) == 10_000 and len(set(d.user_id)) == 114 and len(set(d.category_id)) == 1_096
    assert sorted(set(d.event_type)) == ["buy", "cart", "fav", "view"]


def test_diginetica_item_views_sessions_are_users():
    folder = shared_dataset("diginetica-sample")
    assert detect_layout(folder) == "diginetica"
    d = load_dataset(folder)
    assert len(d) == 12_391 and len(set(d.user_id)) == 2_986 and len(set(d.item_id)) == 7_139
    assert set(d.event_type) == {"view"} and set(d.category_id) == {"-"}
    # Session 1's first row: 81766 at 526,309 ms into 2016-05-09 (UTC).
    first = np.flatnonzero((d.user_id == "s1") & (d.item_id == "81766"))[0]
    assert d.ts[first] == pytest.approx(1462752000.0 + 526.309)


def test_diginetica_malformed_rows_say_where(tmp_path):
    (tmp_path / "views.csv").write_text("session_id;user_id;item_id;timeframe;eventdate\n1;NA;5;10;2016-13-01\n")
    with pytest.raises(DatasetError, match="views.csv:2"):
        load_dataset(tmp_path)


def test_events_jsonl_layout_round_trips_synthetic_data(tmp_path):
    d = generate(SyntheticConfig(n_users=20, n_items=50, n_categories=5, seed=3))
    (tmp_path / "events.jsonl").write_text(dumps_many(list(d.events())))
    back = load_dataset(tmp_path)
    assert back.item_id.tolist() == d.item_id.tolist() and np.allclose(back.ts, d.ts)


def test_unknown_layout_and_malformed_files_say_what_is_wrong(tmp_path):
    with pytest.raises(DatasetError, match="layout not recognised"):
        load_dataset(tmp_path)
    (tmp_path / "u.data").write_text("1\t2\t3\n")
    with pytest.raises(DatasetError, match="expected 4 fields"):
        load_dataset(tmp_path)


def test_synthetic_is_deterministic_zipfian_and_respects_arrivals():
    cfg = SyntheticConfig(n_users=300, n_items=500, n_categories=10, seed=7)
    a, b = generate(cfg), generate(cfg)
    assert a.fingerprint() == b.fingerprint()
    assert generate(SyntheticConfig(n_users=300, n_items=500, n_categories=10, seed=8)).fingerprint() != a.fingerprint()
    counts = np.sort(np.unique(a.item_id, return_counts=True)[1])[::-1]
    assert counts[: len(counts) // 10].sum() > 0.3 * counts.sum()  # the head is heavy...
    assert (counts <= 2).sum() > 0  # ...and the tail is long
    # each item belongs to exactly one category
    pairs = set(zip(a.item_id.tolist(), a.category_id.tolist(), strict=True))
    assert len(pairs) == len(set(a.item_id))
