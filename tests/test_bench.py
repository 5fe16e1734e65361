"""Bench-format tests: each `dinrec bench …` runs end to end and prints the JSON the docs' tables are made
from, with its peer measured in the same run. They check the output's shape and its counts, never a timing:
performance is what the benchmarks report (docs/benchmarks.md), not what a test asserts."""

import json
import os
import subprocess
import sys

import pytest

from dinrec.datasets.synthetic import SyntheticConfig, generate
from dinrec.events.schema import dumps_many
from dinrec.models.scorer import bf16_supported
from dinrec.training.settings import TrainSettings
from tests.conftest import REPO


@pytest.mark.slow
def test_bench_train_vs_deepctr_prints_both_sides(tmp_path):
    pytest.importorskip("deepctr_torch", reason="the peer is in the optional `bench` extra")
    (tmp_path / "events.jsonl").write_text(
        dumps_many(list(generate(SyntheticConfig(n_users=120, n_items=90, n_categories=6, seed=2)).events())))
    out = subprocess.run([sys.executable, "-m", "dinrec.cli.main", "bench", "train", "--data", str(tmp_path),
                          "--vs", "deepctr", "--epochs", "2", "--seq-len", "20", "--seeds", "0,1", "--also-pointwise",
                          "--json"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)  # stdout is exactly one JSON object: the peer's chatter goes to stderr
    assert result["objective"] == "listwise" and result["dinrec"]["objective"] == "listwise"
    for side in ("dinrec", "deepctr", "dinrec_pointwise"):
        assert {"samples_per_s", "candidates_per_s", "test_auc", "test_gauc"} <= set(result[side])
        assert result[side]["samples_per_s"] > 0 and 0 <= result[side]["test_gauc"] <= 1
        runs = result[side]["runs"]  # one run per seed; the top level is their mean
        assert [r["seed"] for r in runs] == [0, 1]
        assert result[side]["test_gauc"] == pytest.approx(sum(r["test_gauc"] for r in runs) / 2)
    # A sample is a positive with its negatives: list_negatives of them listwise, one pointwise. DeepCTR trains
    # on dinrec's lists, a row per counted candidate (the user's own items are never counted: fewer rows).
    k = result["config"]["list_negatives"]
    assert result["config"]["peer_samples"] == "dinrec_lists"
    assert result["dinrec"]["candidates_per_s"] == pytest.approx((1 + k) * result["dinrec"]["samples_per_s"])
    pointwise = result["dinrec_pointwise"]
    assert pointwise["candidates_per_s"] == pytest.approx(2 * pointwise["samples_per_s"])
    peer_run = result["deepctr"]
    assert peer_run["samples"] == 2 * result["dinrec"]["train_lists"]  # every list of both epochs, once each
    assert 2 * peer_run["samples"] < peer_run["rows"] <= (1 + k) * peer_run["samples"]
    last = peer_run["runs"][-1]  # rows and samples are the last seed's (its negatives are its own)
    assert last["candidates_per_s"] / last["samples_per_s"] == pytest.approx(peer_run["rows"] / peer_run["samples"])
    probes = result["dinrec"]["epochs"]  # the test GAUC after each epoch, for the time to the peer's
    assert [p["epoch"] for p in probes] == [1, 2] and probes[0]["train_seconds"] < probes[1]["train_seconds"]
    reached = result["dinrec"]["seconds_to_peer_gauc"]
    peer = result["deepctr"]["runs"][-1]["test_gauc"]
    assert reached == next((p["train_seconds"] for p in probes if p["test_gauc"] >= peer), None)
    assert result["speedup"] == pytest.approx(result["dinrec"]["samples_per_s"] / result["deepctr"]["samples_per_s"])
    assert result["listwise_vs_pointwise_samples_per_s"] == pytest.approx(
        result["dinrec"]["samples_per_s"] / result["dinrec_pointwise"]["samples_per_s"])


@pytest.mark.kafka
@pytest.mark.redis
def test_bench_ingest_prints_both_sides_and_counted_every_event_once(redis_url, kafka_bootstrap):
    env = {**os.environ, "DINREC_REDIS_URL": redis_url, "DINREC_KAFKA_BOOTSTRAP": kafka_bootstrap}
    out = subprocess.run([sys.executable, "-m", "dinrec.cli.main", "bench", "ingest", "--events", "6000",
                          "--users", "500", "--items", "800", "--rate", "2000", "--seconds", "1", "--json"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["dinrec"]["events_per_s"] > 0
    assert result["redis_py_pipelined"]["consumed"] == result["dinrec"]["consumed"] == 6000
    assert result["ratio_vs_reference"] == pytest.approx(
        result["dinrec"]["events_per_s"] / result["redis_py_pipelined"]["events_per_s"], rel=1e-2)
    # Every backlog and latency-phase event was applied once (all are behaviours with distinct ids).
    assert result["dinrec"]["behaviours_applied"] == 6000 + result["dinrec"]["measured"]
    # Where each drain's time went: dinrec's store writes are one script (more Redis work per event than the
    # reference's three plain commands, for the dedup, offsets and counts it keeps)
    for side in (result["dinrec"], result["redis_py_pipelined"]):
        assert side["redis_cpu_us_per_event"] > 0 and side["client_cpu_us_per_event"] > 0
    assert result["dinrec"]["redis_cpu_us_per_event"] > result["redis_py_pipelined"]["redis_cpu_us_per_event"]
    assert 0 < result["latency_p50_ms"] <= result["latency_p99_ms"]


def _bench(*args: str, env: dict | None = None) -> dict:
    out = subprocess.run([sys.executable, "-m", "dinrec.cli.main", "bench", *args, "--json"], cwd=REPO,
                         capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def test_bench_score_times_each_implementation_against_the_machines_own_ceiling_and_the_peer():
    pytest.importorskip("deepctr_torch", reason="the peer is in the optional `bench` extra")
    result = _bench("score", "--items", "3000", "--requests", "40", "--compiled")
    # the model `dinrec train` ships: its DIN reads context, scored by its listwise path (fused or as ops)
    assert result["shape"] == "shipped" and result["candidates"] == 300
    shipped = TrainSettings()
    assert result["config"]["attention_hidden"] == list(shipped.attention_hidden)
    assert result["config"]["pair_inputs"] == 1 and result["config"]["cross"]
    impls = result["implementations"]
    assert "lists_fp32" in impls and set(impls) <= {"lists_fused", "lists_fp32"}
    assert 0 < result["dinrec"]["context"]["p50_ms"] < result["dinrec"]["p50_ms"]  # building it is part of scoring
    assert result["deepctr"]["config"]["attention_hidden"] == list(shipped.attention_hidden)  # the same sizes
    for side in [*impls.values(), result["torch"], result["deepctr"]]:
        assert 0 < side["p50_ms"] <= side["p99_ms"]
    # the chosen one is the fastest of those timed on the probes, and is what "dinrec" reports
    choice = result["choice"]
    assert choice["impl"] == min(choice["timings_ms"], key=choice["timings_ms"].get)
    assert result["dinrec"]["impl"] == choice["impl"]
    assert set(choice["timings_ms"]) | set(choice["refused"]) - {"bf16"} == set(impls)  # bf16: not for lists
    m = result["machine"]
    assert m["cpu"] and m["bf16_gemm_gflops"] > 0 and m["fp32_gemm_gflops"] > 0 and m["isa_limit"] == "native"
    native_bf16 = bf16_supported()  # what the bench decides by (the run is native: asserted above)
    for side in impls.values():  # the share of the machine's own rate follows from the figures
        rate = 2 * result["multiply_adds_per_request"] / (side["p50_ms"] / 1000) / 1e9
        assert side["fraction_of_peak"] == pytest.approx(rate / m["fp32_gemm_gflops"], rel=0.02)  # fp32 lists
        if native_bf16:
            assert side["fraction_of_bf16_peak"] == pytest.approx(rate / m["bf16_gemm_gflops"], rel=0.02)
        else:  # an emulated bf16 rate is no ceiling
            assert side["fraction_of_bf16_peak"] is None
    assert result["speedup_vs_deepctr"] == pytest.approx(result["deepctr"]["p50_ms"] / result["dinrec"]["p50_ms"],
                                                         rel=1e-2)
    assert result["threads"] == 1
    # --compiled: the ops through torch.compile, beside the rest, computing the same logits
    compiled = result["compiled"]
    assert 0 < compiled["p50_ms"] <= compiled["p99_ms"] and compiled["compile_seconds"] > 0
    assert compiled["max_logit_diff_vs_ops"] < 1e-4


def test_every_bench_can_run_as_on_an_avx2_only_machine():
    result = _bench("--isa", "avx2", "score", "--shape", "paper", "--items", "2000", "--requests", "20", "--vs", "none")
    assert result["shape"] == "paper" and result["config"]["attention_hidden"] == [80, 40]
    m = result["machine"]
    assert m["isa_limit"] == "avx2" and not any(f.startswith(("avx512", "amx")) for f in m["flags"])
    assert m["cpu_capability"] in ("AVX2", "DEFAULT")  # ATen dispatches to AVX2 kernels at most
    assert m["faiss_simd"] in ("AVX2", "NONE")
    assert set(result["implementations"]) == {"fp32"}  # no fused unit, no bf16 without native bf16
    assert result["dinrec"]["impl"] == "fp32"
    # bf16 is emulated here, hundreds of times slower than fp32: its rate is no ceiling to report a share of
    assert result["dinrec"]["fraction_of_bf16_peak"] is None and result["dinrec"]["fraction_of_peak"] > 0


@pytest.mark.redis
@pytest.mark.slow
def test_bench_serve_drives_the_service_open_loop(redis_url, redis_cluster_url):
    env = {**os.environ, "DINREC_REDIS_URL": redis_url, "DINREC_REDIS_CLUSTER_URL": redis_cluster_url}
    out = subprocess.run([sys.executable, "-m", "dinrec.cli.main", "bench", "serve", "--rps", "40", "--seconds", "2",
                          "--items", "3000", "--users", "100", "--store", "redis-cluster", "--partitions", "4",
                          "--vs", "fastapi", "--probe-seconds", "1", "--json"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["store"] == "redis" and result["redis_cluster"]["store"] == "redis-cluster"
    for run in (result, result["redis_cluster"]):  # the same load on one server, then on the cluster
        assert run["requests"] == 80 and run["errors"] == 0 and run["degraded"] == 0, run
    ratio = result["cluster_vs_single"]
    assert ratio["p99_ms"] == pytest.approx(result["redis_cluster"]["p99_ms"] / result["p99_ms"], abs=1e-3)
    assert 0 < result["p50_ms"] <= result["p95_ms"] <= result["p99_ms"]
    assert result["rps"] > 0
    # what ran, where: the shipped model (its DIN reads context: its listwise path)
    assert result["scorer"] in ("lists_fused", "lists_fp32") and result["machine"]["cpu"]
    stages = result["cpu_ms_by_stage"]  # the server's CPU per request, by stage, adds up to its whole
    assert {"assign", "features", "recall", "score", "select", "log", "encode", "other"} == set(stages)
    assert stages["score"] > 0 and stages["recall"] > 0
    assert sum(stages.values()) == pytest.approx(result["server_cpu_ms_per_request"], abs=0.01)
    # --vs fastapi: the rate dinrec holds and the bare FastAPI app's, each searched the same way in this run
    ceiling = result["fastapi"]
    assert ceiling["workers"] == result["workers"] and ceiling["fastapi"] and ceiling["uvicorn"]
    for held in (result["held"], ceiling):
        assert held["held_rps"] > 0 and held["p99_bound_ms"] == 25
        assert any(not p["held"] for p in held["probes"]), "the search stops at a rate that does not hold"
        assert all(p["errors"] == 0 and p["p99_ms"] <= 25 for p in held["probes"] if p["held"])
        assert held["held_offered_rps"] == max(p["offered_rps"] for p in held["probes"] if p["held"])
        assert held["server_cpu_ms_per_request"] > 0
    assert result["held_rps"] == result["held"]["held_rps"]
    assert result["fraction_of_fastapi"] == pytest.approx(result["held_rps"] / ceiling["held_rps"], abs=1e-3)


@pytest.mark.redis
def test_bench_store_size_measures_real_keys_and_projects_a_cluster(redis_url):
    env = {**os.environ, "DINREC_REDIS_URL": redis_url}
    out = subprocess.run([sys.executable, "-m", "dinrec.cli.main", "bench", "store-size", "--users", "200",
                          "--behaviours", "20", "--items", "500", "--json"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    per_user = result["memory_usage_per_user"]
    assert result["keys"] >= 200 * 3 and all(per_user[f] > 0 for f in ("hist", "seen", "items", "ab_and_attribution"))
    assert per_user["hist"] > 20 * 20  # 20 behaviours of ~20+ bytes each (ids, separators, scores)
    assert result["bytes_per_user"] >= result["memory_usage_per_user_total"] and result["bytes_per_item"] > 0
    small, _, big = result["projection"]
    assert (small["users"], big["users"]) == (1_000_000, 100_000_000) and big["primaries"] >= small["primaries"]
    assert big["gb"] == pytest.approx((1e8 * result["bytes_per_user"] + 1e6 * result["bytes_per_item"]) / 1e9, abs=0.1)


@pytest.mark.redis
@pytest.mark.slow
def test_bench_overload_measures_capacity_then_overloads_it_with_the_cap_and_without(redis_url):
    env = {**os.environ, "DINREC_REDIS_URL": redis_url}
    out = subprocess.run([sys.executable, "-m", "dinrec.cli.main", "bench", "overload", "--seconds", "2",
                          "--peer-seconds", "1", "--cap", "4", "--items", "3000", "--users", "100",
                          "--slow-clients", "4", "--json"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["capacity_rps"] > 0 and result["offered_rps"] == 2 * result["capacity_rps"]
    assert result["capped"]["requests"] == int(result["offered_rps"] * 2)
    assert result["peer_uncapped"]["shed"] == 0  # no cap: nothing is ever refused for load
    assert result["ok_rps"] > 0 and result["healthz_p99_ms"] is not None and isinstance(result["recovered"], bool)
    assert result["machine"]["cpu"] and result["cap"] == 4
    # What a 503 costs the server, derived from its CPU over the phase, beside what an answer costs.
    assert result["answer_cpu_ms"] > 0 and result["capped"]["server_cpu_ms"] > 0
    assert (result["shed_cpu_ms"] is None) == (result["capped"]["shed"] == 0)
    # The same overload beside 4 connections that sent a POST's headers and nothing more: they were held
    # open, and the load's answers were measured both ways.
    assert result["slow_clients"] == 4 and result["slow_connections_opened"] >= 4
    assert result["ok_rps_without_slow_clients"] > 0 and result["capped_beside_slow_clients"]["requests"] > 0


def test_bench_ab_prints_the_error_rates_and_power():
    out = subprocess.run([sys.executable, "-m", "dinrec.cli.main", "bench", "ab", "--runs", "100", "--users", "2000",
                          "--looks", "5", "--lift", "0.3", "--json"], cwd=REPO, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["runs"] == 100 and result["looks"] == 5
    for key in ("aa_fpr_fixed", "aa_fpr_fixed_peeking", "aa_fpr_sequential", "power_fixed", "power_sequential"):
        assert 0.0 <= result[key]["rate"] <= 1.0 and result[key]["se"] >= 0
    assert result["aa_fpr_fixed_peeking"]["rate"] >= result["aa_fpr_fixed"]["rate"]  # more looks, more chances
    assert result["power_fixed"]["rate"] > 0.8  # a 30 % lift on 2,000 users a side is found
    for metric in ("ctr", "conversion"):  # the keys issue 42 names, with and without CUPED
        for fpr in ("aa_fpr_fixed", "aa_fpr_sequential"):
            assert 0.0 <= result["metrics"][metric][fpr]["rate"] <= 1.0
            assert 0.0 <= result["cuped"][metric][fpr]["rate"] <= 1.0
        # What CUPED removed is what the world's own correlation with its pre-period says it can.
        cuped = result["cuped"][metric]
        assert 0.05 < cuped["expected_variance_reduction"] < 0.5
        assert cuped["variance_reduction"] == pytest.approx(cuped["expected_variance_reduction"], abs=0.05)
    # Two weeks of snapshots every 30 s: a bounded number kept, a point a day shown, the call timed.
    two_weeks = result["results_two_weeks"]
    # Kept: the last day at the interval (2,880), plus what the current hour added before its first snapshot
    # drops the ones a day old (up to 120: where in the hour the run ends depends on the clock), plus one an
    # hour before that (at most 14 × 24).
    assert two_weeks["snapshots_written"] == 40_320 and two_weeks["snapshots_kept"] <= 2_880 + 120 + 336
    assert two_weeks["resolution"] == "day" and two_weeks["points_shown"] <= 16
    assert result["results_ms_two_weeks"] == two_weeks["median_ms"] > 0


def bench_on_synthetic(folder, config: SyntheticConfig, bench: str, *args: str) -> dict:
    """``dinrec bench BENCH --data FOLDER ARGS --json`` on a synthetic log written to ``folder``."""
    (folder / "events.jsonl").write_text(dumps_many(list(generate(config).events())))
    out = subprocess.run([sys.executable, "-m", "dinrec.cli.main", "bench", bench, "--data", str(folder), *args,
                          "--json"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def test_bench_recall_prints_the_stage_beside_both_baselines(tmp_path):
    result = bench_on_synthetic(tmp_path, SyntheticConfig(n_users=300, n_items=400, n_categories=10,
                                                          mean_events_per_user=25, seed=4),
                                "recall", "--epochs", "1", "--recall-epochs", "4", "--seq-len", "20")
    for name in ("faiss", "din_mean", "item_cf", "popularity"):
        assert {"hr@50", "hr@200", "hr@1000"} <= set(result[name])
        assert result[name]["hr@50"] <= result[name]["hr@200"] <= result[name]["hr@1000"] <= 1
    assert result["faiss"]["hr@200"] > result["popularity"]["hr@200"]  # the towers learn the categories
    assert result["ratios"]["faiss_vs_popularity_hr@200"] == pytest.approx(
        result["faiss"]["hr@200"] / result["popularity"]["hr@200"], abs=1e-3)
    lane, plain = result["final"]["lane"], result["final"]["no_lane"]
    assert result["long_tail_share"] == lane["long_tail_share"] >= plain["long_tail_share"]
    assert result["item_cf"]["window"] in (5, 10, 20)


def test_bench_recall_at_scale_reports_build_size_latency_and_recall():
    out = subprocess.run([sys.executable, "-m", "dinrec.cli.main", "bench", "recall", "--synthetic-items", "20000"],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["items"] == 20000 and result["index"] == "flat"  # 1.3M cells: below the exact-scan limit
    assert result["recall_at_200_vs_exact"] == 1.0 and result["index_mb"] >= result["vectors_mb"]
    assert 0 < result["query_ms"]["p50"] <= result["query_ms"]["p99"]


@pytest.mark.timeout(900)  # five retrain jobs, each fitting the ranking blend
@pytest.mark.slow
def test_bench_retrain_replays_a_log_and_prints_retrain_peer_and_drills(tmp_path):
    result = bench_on_synthetic(tmp_path, SyntheticConfig(n_users=400, n_items=300, n_categories=12,
                                                          mean_events_per_user=25, seed=5),
                                "retrain", "--epochs", "5", "--recall-epochs", "3", "--seq-len", "20")
    assert result["first_model"]["status"] == "promoted" and result["retrain"]["holdout_users"] >= 10
    for side in ("stale_champion", "warm_candidate", "peer_cold_candidate", "peer_warm_towers_candidate"):
        assert 0 < result[side]["gauc"] < 1 and result[side]["users"] == result["retrain"]["holdout_users"]
        assert 0 <= result[side]["recall_tail_hr"] <= 1 and result[side]["tail_positives"] > 0
    # The warm-towers peer differs only in how its towers start — and so in what they recall, which the
    # listwise DIN trains against: its GAUC is its own, measured on the same holdout users.
    assert result["peer_warm_towers_candidate"]["users"] == result["warm_candidate"]["users"]
    assert result["warm_vs_cold"]["gauc_delta"] == pytest.approx(
        result["warm_candidate"]["gauc"] - result["peer_cold_candidate"]["gauc"], abs=1e-3)
    assert result["drills"]["shuffled-labels"]["status"] == "refused"
    miscalibrated = result["drills"]["miscalibrated"]["candidate"]
    # The drill scales the warm candidate's logits: the same ranking, other probabilities.
    assert miscalibrated["gauc"] == result["warm_candidate"]["gauc"]
    assert miscalibrated["logloss"] != result["warm_candidate"]["logloss"]


@pytest.mark.slow
def test_bench_e2e_serves_through_http_and_measures_every_method(tmp_path):
    """Two seeds, the library peers from their own environment (make peers), the stage taken apart; the
    gate's list is the list HTTP served."""
    from tests.conftest import synthetic_dataset_dir

    data = synthetic_dataset_dir(tmp_path / "data", n_users=200, n_items=120, n_categories=6,
                                 mean_events_per_user=20, seed=3)
    out = subprocess.run([sys.executable, "-m", "dinrec.cli.main", "bench", "e2e", "--data", str(data),
                          "--seeds", "0,1", "--peers", "sasrec_rectools,ease_rectools", "--progress",
                          "--partial", str(tmp_path / "so-far.json"), "--json"],
                         cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert out.returncode == 0, out.stderr[-3000:]
    for stage in ("] seed 0: dinrec trained", "] seed 1: the stage's variants done", "] seed 0: ease_rectools done",
                  "] seed 1: sasrec_rectools done"):
        assert stage in out.stderr, stage  # --progress: a line per stage on stderr; stdout stays the JSON
    result = json.loads(out.stdout)
    # --partial: written after seed 0, the figures of that seed alone (a stopped run keeps them).
    so_far = json.loads((tmp_path / "so-far.json").read_text())
    assert so_far["seeds_done"] == [0]
    assert so_far["dinrec"]["per_seed"]["hr@10"] == result["dinrec"]["per_seed"]["hr@10"][:1]
    assert result["users"] > 50 and result["seeds"] == [0, 1]
    keys = {"hr@10", "ndcg@10", "hr@50", "coverage", "long_tail_share", "seen_in_list", "per_seed", "vs_item_cf"}
    methods = ("dinrec", "popularity", "item_cf", "towers", "din_alone", "din_catalog", "without_din",
               "without_covisit", "without_towers", "sasrec_rectools", "ease_rectools")
    for method in methods:
        m = result[method]
        assert keys - ({"vs_item_cf"} if method == "item_cf" else set()) <= set(m), method
        assert 0 <= m["ndcg@10"] <= m["hr@10"] <= m["hr@50"] <= 1 and 0 < m["coverage"] <= 1
        assert m["seen_in_list"] == 0, method  # every method keeps out what the user took
        assert m["mean_list_len"] == 10, method
        # A mean over the seeds it ran (the deterministic baselines and EASE run once).
        assert m["seeds_run"] == (1 if method in ("popularity", "item_cf", "ease_rectools") else 2), method
        assert m["hr@10"] == pytest.approx(sum(m["per_seed"]["hr@10"]) / m["seeds_run"], abs=2e-4)
        if method != "dinrec":
            assert m["vs_dinrec"]["hr@10"]["diff"] == pytest.approx(result["dinrec"]["hr@10"] - m["hr@10"], abs=2e-4)
        if method != "item_cf":
            assert m["vs_item_cf"]["hr@10"]["diff"] == pytest.approx(m["hr@10"] - result["item_cf"]["hr@10"], abs=2e-4)
            assert m["vs_item_cf"]["hr@10"]["se"] > 0
    for peer in ("sasrec_rectools", "ease_rectools"):
        runs = result[peer]["runs"]
        assert runs and all(r["library"].startswith("rectools ") and r["settings"] for r in runs), peer
    assert {"epochs_run", "best_epoch", "train_seconds"} <= set(result["sasrec_rectools"]["runs"][0])
    dinrec = result["dinrec"]
    for serving in dinrec["serving"]:
        assert serving["strategies"] == {"din": result["users"]} and serving["degraded"] == 0
        assert serving["http_matches_in_process"] == 1.0  # the same lists through HTTP as in-process
    # The retrain gate's served list (training.evaluation, in-process) is the list HTTP served.
    for gate, hr in zip(dinrec["gate"], dinrec["per_seed"]["hr@10"], strict=True):
        assert gate["lists_equal_http"] == 1.0 and gate["served_hr@10"] == pytest.approx(hr, abs=1e-4)
    assert 0 < result["ceiling"]["hr"] <= 1 and result["ceiling"]["candidates"] > 0
    assert result["dinrec"]["hr@10"] > result["popularity"]["hr@10"]  # the synthetic world has tastes to find
    assert result["machine"]["cores"] >= 1 and result["machine"]["cpu"]  # the seconds name their machine


def test_bench_e2e_pools_a_users_seeds_before_the_standard_error():
    """Users are the independent units: a user's difference is averaged over the seeds first, so two seeds
    that agree do not halve the standard error, and per-seed noise that cancels within users shrinks it."""
    import numpy as np

    from dinrec.benchmarks.e2e_bench import Case, Runs

    test = [Case(f"u{i}", i, np.array([1]), np.array([1]), 2 + i % 3, 0.0) for i in range(40)]
    runs = Runs(test, n_items=10, tail=np.zeros(10, dtype=bool))
    hits = [[c.target] + [9] * 9 for c in test]
    misses = [[9] * 10 for _ in test]
    half = [hits[i] if i % 2 else misses[i] for i in range(40)]
    runs.add("item_cf", half)
    runs.add("dinrec", hits)
    runs.add("dinrec", hits)  # a second seed that agrees: the same 40 units
    out = runs.summary()
    d = np.r_[np.ones(20), np.zeros(20)]  # dinrec − item-CF per user: 1 where item-CF missed
    assert out["dinrec"]["vs_item_cf"]["hr@10"] == {"diff": 0.5, "se": round(float(d.std(ddof=1) / np.sqrt(40)), 4)}
    alternating = Runs(test, n_items=10, tail=np.zeros(10, dtype=bool))
    alternating.add("item_cf", half)
    alternating.add("dinrec", half)
    alternating.add("dinrec", [misses[i] if i % 2 else hits[i] for i in range(40)])  # the other half
    pooled = alternating.summary()["dinrec"]
    assert pooled["hr@10"] == 0.5 and pooled["per_seed"]["hr@10"] == [0.5, 0.5]
    # Each user: 0.5 on average over the seeds; item-CF 1 or 0 → differences ±0.5, mean 0.
    d = np.where(np.arange(40) % 2 == 1, -0.5, 0.5)
    assert pooled["vs_item_cf"]["hr@10"] == {"diff": 0.0, "se": round(float(d.std(ddof=1) / np.sqrt(40)), 4)}


@pytest.mark.slow
def test_bench_soak_reads_memory_and_p99_over_windows_of_invented_ids():
    out = subprocess.run([sys.executable, "-m", "dinrec.cli.main", "bench", "soak", "--minutes", "0.25",
                          "--window-s", "5", "--store", "memory", "--rps", "40", "--json"],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    run = json.loads(out.stdout)["runs"]["memory"]
    assert [w["t_s"] for w in run["windows"]] == [5, 10, 15] and run["offered_rps"] == 40
    assert all(w["rss_mb"] > 0 and w["ok_share"] > 0.5 for w in run["windows"]) and run["capacity_rps"] > 0
    assert run["rss_mb_start"] > 0 and run["p99_last_vs_first"] is not None and run["new_user_ids"] == 600
