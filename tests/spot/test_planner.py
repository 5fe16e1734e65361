"""The instance planner: the seed's rules of thumb must come out of the memory/bandwidth model."""

import json
import subprocess
import sys

import pytest

from dinrec.spot.catalog import DEFAULT_CATALOG, load_catalog
from dinrec.spot.planner import Efficiency, Workload, calibrate, plan, step_cost
from tests.conftest import REPO


def _rows_for(table_mb: float, dim: int = 16) -> int:
    return int(table_mb * 1e6 / 4 / dim)


def _option(options, name, embeddings="replicated"):
    return next(o for o in options if o.instance == name and o.embeddings == embeddings)


def test_catalog_has_the_vendor_figures_the_planner_relies_on():
    cat = {t.name: t for t in DEFAULT_CATALOG}
    t4, h200 = cat["g4dn.xlarge"].gpu, cat["p5en.48xlarge"].gpu
    assert (t4.memory_gb, t4.bandwidth_gbs, t4.tflops_mixed, t4.bf16) == (16, 320, 65, False)
    assert (h200.memory_gb, h200.bandwidth_gbs) == (141, 4800)
    assert cat["p4d.24xlarge"].gpus == 8 and cat["p4d.24xlarge"].gpu.bandwidth_gbs == 1555
    assert cat["p3.2xlarge"].gpu.tflops_mixed == 125 and not cat["p3.2xlarge"].gpu.bf16
    assert all(t.spot_usd < t.on_demand_usd for t in DEFAULT_CATALOG)


def test_small_model_is_launch_bound_and_the_cheapest_gpu_wins():
    options = plan(Workload(n_items=10_000, n_categories=100, train_samples=1_000_000), load_catalog(),
                   embeddings=("replicated",))
    best = options[0]
    assert best.recommended and best.instance == "g4dn.xlarge" and best.bound == "overhead"
    assert all(o.fits for o in options)


def test_a_table_over_500_mb_rules_out_g4dn_xlarge_by_bandwidth_per_dollar():
    """Dense Adam sweeps every table element each step; past a few hundred MB the T4's 320 GB/s
    (plus fp16's extra unscale pass) costs more than its lower price saves."""
    cat = load_catalog()
    verdicts = {}
    for mb in (100, 300, 600, 1000):
        options = plan(Workload(n_items=_rows_for(mb), train_samples=20_000_000, recall_epochs=0), cat,
                       embeddings=("replicated",))
        g4 = _option(options, "g4dn.xlarge")
        verdicts[mb] = (g4.recommended, g4.dominated_by, g4.bound)
        if mb == 1000:
            assert g4.note.startswith(f"ruled out: {g4.dominated_by} is faster and cheaper") and "bandwidth" in g4.note
    assert verdicts[100][0] and verdicts[300][0]  # small tables: the T4 is the cheapest way
    for mb in (600, 1000):
        recommended, dominated_by, bound = verdicts[mb]
        assert not recommended and dominated_by is not None and bound == "bandwidth"


def test_100m_embedding_rows_do_not_fit_g4dn_xlarge():
    options = plan(Workload(n_items=100_000_000, train_samples=10_000_000, recall_epochs=0), load_catalog(),
                   embeddings=("replicated",))
    g4 = _option(options, "g4dn.xlarge")
    assert not g4.fits and "T4 has 16" in g4.why_not and g4.rank is None
    assert options[0].fits and options[0].gpu_mem_gb > 16


def test_200m_row_table_replicated_needs_the_h200_and_says_why_the_others_fail():
    options = plan(Workload(n_items=200_000_000, n_categories=10_000, train_samples=200_000_000, epochs=1,
                            recall_epochs=0), load_catalog())
    fitting = [o.instance for o in options if o.fits and o.embeddings == "replicated"]
    assert fitting == ["p5en.48xlarge"]
    assert "H100 has 80" in _option(options, "p5.48xlarge").why_not


def test_sharding_the_200m_row_table_fits_the_a100_and_v100_machines_for_less():
    """Row-wise shards (TorchRec) hold an eighth of the table each, with one optimizer value per row
    instead of Adam's two per element, and no dense gradient to sweep or all-reduce."""
    w = Workload(n_items=200_000_000, n_categories=10_000, train_samples=200_000_000, epochs=1, recall_epochs=0)
    options = plan(w, load_catalog())
    replicated = _option(options, "p5en.48xlarge")
    for name in ("p4d.24xlarge", "p3.16xlarge"):
        sharded = _option(options, name, "sharded")
        assert sharded.fits and sharded.note.startswith("fits only sharded (replicated: needs 84.1 GB per GPU")
        assert sharded.gpu_mem_gb < 4 and sharded.spot_usd < replicated.spot_usd / 10
        assert sharded.step_parts_ms["interconnect"] > 0  # the all-to-all and the dense all-reduce
    per_gpu = {o.gpus: o.gpu_mem_gb for o in options if o.embeddings == "sharded" and o.instance.startswith("g")}
    assert per_gpu[1] > 3 * per_gpu[4]  # the table divides over the GPUs
    best = options[0]
    assert best.recommended and best.embeddings == "sharded" and best.spot_usd < replicated.spot_usd
    assert step_cost(w, DEFAULT_CATALOG[0], "sharded").all_to_all_bytes == 0  # one GPU exchanges nothing


def test_pcie_multi_gpu_is_interconnect_bound_for_big_dense_tables():
    options = plan(Workload(n_items=_rows_for(500), train_samples=20_000_000), load_catalog())
    assert _option(options, "g5.12xlarge").bound == "interconnect"
    assert step_cost(Workload(n_items=_rows_for(500), train_samples=1), DEFAULT_CATALOG[0]).allreduce_bytes == 0


def test_sparse_embeddings_remove_the_table_sweep():
    dense = Workload(n_items=_rows_for(1000), train_samples=1_000_000)
    sparse = dense.model_copy(update={"sparse_embeddings": True})
    g4 = DEFAULT_CATALOG[0]
    assert step_cost(sparse, g4).bytes < step_cost(dense, g4).bytes / 10
    multi = _option(plan(sparse, load_catalog()), "p4d.24xlarge")
    assert not multi.fits and "NCCL" in multi.why_not  # the trainer refuses sparse gradients with DDP on GPU


def test_max_hours_and_expected_interruption_cost():
    w = Workload(n_items=_rows_for(1000), train_samples=50_000_000, epochs=3)
    options = plan(w, load_catalog(), max_hours=0.5)
    slow = [o for o in options if o.why_not and "limit" in o.why_not]
    assert slow and all(o.est_hours > 0.4 for o in slow)
    for o in options:  # spot hours include the expected re-work; still far below on-demand
        assert o.spot_usd > o.est_hours * o.spot_price_usd
        assert o.spot_usd < o.on_demand_usd


def test_price_overrides_change_the_ranking_and_bad_files_are_refused(tmp_path):
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"g6.xlarge": {"spot_usd": 0.01}}))
    w = Workload(n_items=10_000, train_samples=1_000_000)
    assert plan(w, load_catalog(prices))[0].instance == "g6.xlarge"
    for bad, message in [({"g9.xlarge": {"spot_usd": 1}}, "unknown instance type"),
                         ({"g5.xlarge": {"gpus": 2}}, "only on_demand_usd and spot_usd"),
                         ({"g5.xlarge": {"spot_usd": -1}}, "positive number")]:
        prices.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=message):
            load_catalog(prices)
    prices.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read prices"):
        load_catalog(prices)


def _bench(gpu_name: str, samples_per_s: float, n_items: int) -> dict:
    return {"n_items": n_items, "n_categories": 20, "train_samples": 100_000,
            "config": {"epochs": 2, "seq_len": 50, "batch_size": 1024, "item_dim": 16, "cat_dim": 16,
                       "attention_hidden": [80, 40], "mlp_hidden": [200, 80]},
            "dinrec": {"samples_per_s": samples_per_s, "gpu_name": gpu_name}}


def test_calibration_reproduces_the_measured_step_time():
    cat = load_catalog()
    a10g = _option(plan(Workload(n_items=1683, n_categories=20, train_samples=100_000), cat), "g5.xlarge")
    # a small model measured at 100k samples/s: launch-bound, so the overhead is what gets fitted
    eff = calibrate(_bench("NVIDIA A10G", 100_000, 1683), cat)
    assert eff.step_overhead_s != Efficiency().step_overhead_s
    refit = _option(plan(Workload(n_items=1683, n_categories=20, train_samples=100_000), cat, efficiency=eff),
                    "g5.xlarge")
    assert refit.step_ms == pytest.approx(1024 / 100_000 * 1e3, rel=1e-3) and refit.step_ms != a10g.step_ms
    # a 1 GB table measured at 40k samples/s: bandwidth-bound, so bandwidth efficiency gets fitted
    rows = _rows_for(1000)
    eff = calibrate(_bench("NVIDIA A10G", 40_000, rows), cat)
    assert eff.bandwidth != Efficiency().bandwidth and eff.step_overhead_s == Efficiency().step_overhead_s
    w = Workload(n_items=rows, n_categories=20, train_samples=100_000)
    assert _option(plan(w, cat, efficiency=eff), "g5.xlarge").step_ms == pytest.approx(1024 / 40_000 * 1e3, rel=1e-3)


def test_calibration_refuses_cpu_runs_and_unknown_gpus():
    with pytest.raises(ValueError, match="GPU run"):
        calibrate({"dinrec": {"samples_per_s": 1.0, "device": "cpu"}}, load_catalog())
    with pytest.raises(ValueError, match="no single-GPU catalog instance"):
        calibrate(_bench("NVIDIA GeForce RTX 4090", 1.0, 10), load_catalog())


@pytest.mark.usefixtures("aws_env")
def test_dinrec_plan_json_uses_live_spot_prices_from_ec2(tmp_path):
    config = tmp_path / "job.json"
    config.write_text(json.dumps({"name": "movielens", "n_items": 1683, "n_categories": 20, "train_samples": 103_546}))
    out = subprocess.run([sys.executable, "-m", "dinrec.cli.main", "plan", "--config", str(config), "--json"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    options = json.loads(out.stdout)["options"]
    assert len(options) == 2 * len(DEFAULT_CATALOG) and options[0]["recommended"]  # replicated and sharded
    assert {"instance", "fits", "bound", "est_hours", "spot_usd", "on_demand_usd"} <= set(options[0])
    by_name = {o["instance"]: o for o in options if o["embeddings"] == "replicated"}
    catalog = {t.name: t for t in DEFAULT_CATALOG}
    assert by_name["g4dn.xlarge"]["spot_price_source"] == "ec2", out.stderr
    assert by_name["g4dn.xlarge"]["spot_price_usd"] == pytest.approx(1e-05)  # what moto's server quotes
    for name, o in by_name.items():  # types EC2 did not quote (moto has no p3 in us-east-1) keep the catalog's
        assert o["spot_price_source"] == "ec2" or o["spot_price_usd"] == catalog[name].spot_usd


def test_dinrec_plan_rejects_a_bad_config_clearly(tmp_path):
    config = tmp_path / "job.json"
    config.write_text(json.dumps({"n_items": -5, "train_samples": 10, "typo": 1}))
    out = subprocess.run([sys.executable, "-m", "dinrec.cli.main", "plan", "--config", str(config),
                          "--no-live-prices"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "n_items" in out.stderr and "typo" in out.stderr and "Traceback" not in out.stderr


def test_the_recall_towers_time_and_memory_are_in_the_plan():
    """The towers train after DIN on the same GPUs: their four tables (dense Adam) count in the memory,
    their steps in the time and cost; at 200M rows they fit only sharded, as DIN's tables do."""
    w = Workload(n_items=_rows_for(300), train_samples=20_000_000, recall_epochs=0)
    alone = _option(plan(w, load_catalog()), "g5.xlarge")
    both = _option(plan(w.model_copy(update={"recall_epochs": 5}), load_catalog()), "g5.xlarge")
    assert alone.towers_hours == 0 and both.towers_hours > 0
    assert both.est_hours == pytest.approx(alone.est_hours + both.towers_hours)
    assert both.spot_usd > alone.spot_usd and both.gpu_mem_gb > alone.gpu_mem_gb
    big = Workload.model_validate_json((REPO / "deploy" / "plans" / "taobao-200m-with-towers.json").read_text())
    options = plan(big, load_catalog())
    assert not any(o.fits for o in options if o.embeddings == "replicated")  # 295 GB per GPU
    fitting = [o for o in options if o.fits]
    assert fitting and all(o.embeddings == "sharded" and o.gpus >= 4 for o in fitting)
    best = fitting[0]
    assert best.towers_hours > 0 and best.gpu_mem_gb < 24  # four L4s or A10Gs hold a quarter each
    # The towers' sharded step moves rows by all-to-all and sweeps no table: it costs no more than DIN's
    # tables alone replicated on the one machine that fits them (p5en, ~$106).
    assert best.spot_usd < 20
