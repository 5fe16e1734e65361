"""`dinrec retrain` end to end on archived events: drift promotes, degraded candidates are refused
(by the exit code and the report), runs never overlap, a killed run resumes, a decided window replays."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from dinrec.models.bundle import load_bundle
from dinrec.models.vocab import Vocab
from dinrec.registry.store import Registry
from dinrec.retrain.gate import decide
from dinrec.retrain.job import LEASE_KEY, _iso
from dinrec.retrain.settings import RetrainSettings
from dinrec.storage import Lease, LocalStorage
from dinrec.training.metrics import paired_difference
from dinrec.training.warm_start import warm_start
from tests.conftest import REPO, wait_until
from tests.retrain.retrain_world import DAY, END, FAST, archive, chain_world, drifting_world, retrain


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Archived events of both phases, and a champion trained on phase 1 by `dinrec retrain` itself."""
    root = tmp_path_factory.mktemp("retrain")
    phase1, phase2 = drifting_world(END)
    archive(phase1 + phase2, root / "archive")
    log: list[str] = []
    code, report = retrain(root, "--until", str(END - 5 * DAY), env={"DINREC_TRAIN_PROGRESS": "true"}, stderr=log)
    assert (code, report["status"]) == (0, "promoted"), report
    assert "first model" in report["reason"] and report["candidate"]["holdout"]["gauc"] >= 0.55
    # Progress, asked for: the candidate's stages on stderr (stdout stays the one JSON report).
    assert f"retrain {report['run']}" in log[0] and "towers" in log[0] and "exported" in log[0], log[0][-2000:]
    return root


def fresh_copy(world, tmp_path):
    """The world with its own registry and work folder (for runs that move aliases)."""
    shutil.copytree(world, tmp_path / "w")
    return tmp_path / "w"


def describe(registry, version: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "dinrec.cli.main", "models", "describe", version, "--registry",
                          str(registry)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.slow
def test_a_drifted_window_yields_a_better_candidate_that_is_promoted_with_its_lineage(world, tmp_path):
    root = fresh_copy(world, tmp_path)
    reg = Registry(root / "registry")
    first = reg.resolve("champion")
    code, report = retrain(root, "--until", str(END))
    assert code == 0 and report["status"] == "promoted", report["reason"]
    cand, champ = report["candidate"]["holdout"], report["champion"]["holdout"]
    assert cand["gauc"] > champ["gauc"] and cand["recall_hr"] > champ["recall_hr"]
    # Compared on the same holdout: the behaviours after the champion's window, one per user.
    assert cand["rows"] == champ["rows"] == report["data"]["holdout_rows"] > 0
    assert report["champion"]["data_end"] == END - 5 * DAY
    new = reg.resolve("champion")
    assert new == report["candidate"]["version"] != first
    lineage = reg.manifest(new)["lineage"]
    assert lineage["parent"] == first and lineage["data_window"]["end"] == END and lineage["warm_start"]
    assert report["candidate"]["train"]["warm_start"]["items_new"] > 0  # new items got fresh rows
    # The towers train from scratch by default (DINREC_RETRAIN_WARM_START_TOWERS): they are retrained too.
    assert report["candidate"]["train"]["recall_warm_start"] is None and not lineage["warm_start_towers"]
    assert report["candidate"]["holdout"]["tail_positives"] > 0
    assert reg.history("champion")[-1]["reason"].startswith(f"retrain {report['run']}")
    listed = subprocess.run([sys.executable, "-m", "dinrec.cli.main", "models", "list", "--registry",
                             str(root / "registry")], cwd=REPO, capture_output=True, text=True, timeout=120)
    row = next(v for v in json.loads(listed.stdout)["versions"] if v["version"] == new)
    assert (row["parent"], row["data_window_end"], row["trained_by"]) == (first, END, "dinrec retrain")
    # `models describe` shows what the gate measured: the served list beside the champion and the baselines.
    [evaluation] = describe(root / "registry", new)["evaluations"]
    assert evaluation["run"] == report["run"] and evaluation["decision"] == "promoted"
    assert evaluation["champion"] == {"version": first, "served_hr": champ["served_hr"]}
    assert evaluation["served_hr"] == cand["served_hr"] and evaluation["failed_checks"] == []
    assert evaluation["baselines"] == {n: b["served_hr"] for n, b in report["baselines"].items()}
    assert set(evaluation["candidate_minus"]) == {"champion", "popularity", "item_cf"}

    # The same window again: decided already — the report replays, nothing is trained or moved.
    versions = reg.versions()
    code, again = retrain(root, "--until", str(END))
    assert code == 0 and again["replayed"] and again["run"] == report["run"]
    assert reg.versions() == versions and reg.resolve("champion") == new

    # Nothing new since the new champion's window: nothing to do.
    code, idle = retrain(root, "--until", str(END + 3600))
    assert (code, idle["status"]) == (0, "skipped") and "0 new behaviours" in idle["reason"]


def test_an_empty_archive_is_nothing_to_do_not_an_error(tmp_path):
    """A new deployment's hourly retrain runs before anything is archived: skipped (exit 0), so the
    compose service and the CronJob do not crash-loop or alert; the same run with events trains."""
    (tmp_path / "archive").mkdir()
    code, report = retrain(tmp_path, "--until", str(END))
    assert (code, report["status"]) == (0, "skipped"), report
    assert "no behaviours" in report["reason"] and report["data"]["behaviours"] == 0


@pytest.mark.slow
def test_a_first_model_that_serves_worse_than_item_cf_is_refused_and_the_default_is_not(tmp_path):
    """Chains of items: the next behaviour is the newest one's successor. The DIN paper's DIN alone (the
    pointwise objective, no blend: blind to order, trained against uniform negatives) serves far worse
    than item-CF on the holdout: refused, naming the baseline; the default ranking (listwise DIN, which
    reads positions and co-visitation, and the blend) holds against both baselines and is promoted."""
    archive(chain_world(END), tmp_path / "a" / "archive")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    code, report = retrain(tmp_path / "a", "--until", str(END), env={"DINREC_TRAIN_RANKING_BLEND": "false",
                                                                     "DINREC_TRAIN_OBJECTIVE": "pointwise"})
    assert (code, report["status"]) == (3, "refused"), report
    by_metric = {c["metric"]: c for c in report["checks"]}
    cf = by_metric["served_hr_vs_item_cf"]
    assert not cf["passed"] and cf["champion"] == report["baselines"]["item_cf"]["served_hr"]
    assert cf["candidate"] == report["candidate"]["holdout"]["served_hr"] < cf["champion"] - 0.02
    assert cf["se"] > 0 and cf["difference"] == pytest.approx(cf["candidate"] - cf["champion"], abs=1e-3)
    assert "worse than the baselines" in report["reason"] and "served_hr_vs_item_cf" in report["reason"]
    assert Registry(tmp_path / "a" / "registry").aliases().get("champion") is None  # nothing serves it
    [evaluation] = describe(tmp_path / "a" / "registry", report["candidate"]["version"])["evaluations"]
    assert evaluation["decision"] == "refused" and "served_hr_vs_item_cf" in evaluation["failed_checks"]
    assert evaluation["baselines"]["item_cf"] == cf["champion"] and evaluation["served_hr"] == cf["candidate"]
    assert evaluation["candidate_minus"]["item_cf"] == {"difference": cf["difference"], "se": cf["se"]}
    assert evaluation["champion"] == {"version": None, "served_hr": None} and "champion" not in \
        evaluation["candidate_minus"]
    code, report = retrain(tmp_path / "b", "--until", str(END))
    assert (code, report["status"]) == (0, "promoted"), report["reason"]
    assert report["candidate"]["holdout"]["served_hr"] >= report["baselines"]["item_cf"]["served_hr"] - 0.02
    assert report["candidate"]["holdout"]["served_hr"] > report["baselines"]["popularity"]["served_hr"]


@pytest.mark.slow
def test_a_candidate_trained_on_shuffled_labels_is_refused_and_never_ships(world, tmp_path):
    root = fresh_copy(world, tmp_path)
    reg = Registry(root / "registry")
    champion, versions = reg.resolve("champion"), reg.versions()
    code, report = retrain(root, "--until", str(END), "--drill", "shuffled-labels")
    assert code == 3 and report["status"] == "refused"
    failed = {c["metric"] for c in report["checks"] if not c["passed"]}
    # What it serves is noise: the served list and recall fail against the champion and item-CF. (Its GAUC
    # proves nothing here: the champion never saw phase 2's items, so its own GAUC is near chance too.)
    assert {"served_hr", "served_hr_vs_item_cf", "recall_hr"} <= failed, failed
    assert "served_hr" in report["reason"] and "refused as it should be" in report["reason"]
    assert report["candidate"]["holdout"]["served_hr"] < report["champion"]["holdout"]["served_hr"] / 4
    # Each mean-over-units check carries the paired difference and its standard error; AUC has none.
    by_metric = {c["metric"]: c for c in report["checks"]}
    served = by_metric["served_hr"]
    assert served["difference"] == pytest.approx(served["candidate"] - served["champion"], abs=1e-3)
    assert 0 < served["se"] < abs(served["difference"]) and "s.e." in served["why"]
    assert all(by_metric[m]["se"] > 0 for m in ("gauc", "logloss", "recall_hr")) and by_metric["auc"]["se"] is None
    assert reg.resolve("champion") == champion and reg.versions() == versions  # the champion keeps serving


@pytest.mark.slow
def test_a_miscalibrated_candidate_within_the_gauc_tolerance_is_refused_on_logloss(world, tmp_path):
    root = fresh_copy(world, tmp_path)
    reg = Registry(root / "registry")
    champion = reg.resolve("champion")
    loose = {"DINREC_RETRAIN_GAUC_TOLERANCE": "0.05", "DINREC_RETRAIN_AUC_TOLERANCE": "0.05",
             "DINREC_RETRAIN_RECALL_TOLERANCE": "1", "DINREC_RETRAIN_TAIL_TOLERANCE": "1"}
    code, report = retrain(root, "--until", str(END), "--drill", "miscalibrated", env=loose)
    checks = {c["metric"]: c for c in report["checks"]}
    assert code == 3 and report["status"] == "refused"
    assert checks["gauc"]["passed"] and checks["auc"]["passed"]  # ranking alone would have let it through
    assert not checks["logloss"]["passed"] and "logloss" in report["reason"]
    assert reg.resolve("champion") == champion


@pytest.mark.slow
def test_two_runs_started_at_once_one_runs_and_one_says_it_is_locked(world, tmp_path):
    root = fresh_copy(world, tmp_path)
    longer = {"DINREC_TRAIN_BATCH_SIZE": "64"}  # the holder must still run when the other asks for the lock
    procs = [retrain(root, "--until", str(END), env=longer, wait=False) for _ in range(2)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        results.append((p.returncode, json.loads(out.strip().splitlines()[-1])))
    results.sort(key=lambda r: r[0])
    (code_a, ran), (code_b, locked) = results
    assert (code_a, ran["status"]) == (0, "promoted")
    assert (code_b, locked["status"]) == (4, "locked") and "another retrain holds" in locked["reason"]
    assert int(locked["holder"]["holder"].split(":")[1]) in {p.pid for p in procs}  # host:pid:nonce

    # While the lease is held (here by this process), a run exits 4 at once and changes nothing.
    with Lease(LocalStorage(root / "registry"), LEASE_KEY, holder=f"test:{os.getpid()}:x"):
        code, report = retrain(root, "--until", str(END + 3600))
    assert code == 4 and report["holder"]["holder"] == f"test:{os.getpid()}:x"


@pytest.mark.slow
def test_a_killed_run_resumes_from_its_checkpoint(world, tmp_path):
    root = fresh_copy(world, tmp_path)
    slow = {"DINREC_TRAIN_EPOCHS": "4", "DINREC_TRAIN_CHECKPOINT_EVERY": "40", "DINREC_TRAIN_BATCH_SIZE": "64",
            # What is tested is the resume, not the model: small batches for many checkpoints overfit
            # (logloss and calibration past the gate's tolerances on this holdout), so the gate is loosened.
            "DINREC_RETRAIN_LOGLOSS_TOLERANCE": "1", "DINREC_RETRAIN_CALIBRATION_TOLERANCE": "10",
            "DINREC_RETRAIN_BASELINE_TOLERANCE": "1",
            "DINREC_RETRAIN_LEASE_S": "3"}  # a killed run's lease frees itself 3 s after its last renewal
    p = retrain(root, "--until", str(END), env=slow, wait=False)
    runs = root / "work" / "runs"
    this_window = f"*_{_iso(END)}_*"  # the copied world holds the champion's (finished) run too
    wait_until(lambda: any(runs.glob(f"{this_window}/checkpoints/step-*/meta.json")) or p.poll() is not None,
               timeout_s=300, what="a checkpoint")
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    (run_dir,) = runs.glob(this_window)
    assert not (run_dir / "report.json").exists() and (run_dir / "samples" / "samples.json").is_file()
    data = (run_dir / "data.json").read_text()
    lease = Lease(LocalStorage(root / "registry"), LEASE_KEY)
    def expires() -> float:
        held = lease.read()
        assert held is not None, "the lease's document is gone"
        return held["expires"]

    assert expires() > 0  # the killed run could not release it
    wait_until(lambda: expires() < time.time(), timeout_s=30, what="the killed run's lease to expire")
    code, report = retrain(root, "--until", str(END), env=slow)
    assert code == 0 and report["status"] == "promoted" and report["run"] == run_dir.name, report["reason"]
    assert report["candidate"]["train"]["resumed_from"] is not None  # from the checkpoint, not from scratch
    assert (run_dir / "data.json").read_text() == data  # on the samples the first attempt built


def test_bad_input_exits_2_and_says_why(world, tmp_path):
    for args, env, says in [(["--drill", "nonsense"], {}, "unknown drill"),
                            ([], {"DINREC_RETRAIN_HISTORY_DAYS": "-1"}, "history_days"),
                            (["--rollout", "challenger"], {}, "EXPERIMENTS_FILE"),
                            (["--spot"], {"DINREC_RETRAIN_SPOT_INSTANCE_TYPES": '["g4dn.xlarge", "g4dn.12xlarge"]'},
                             "different GPU counts")]:
        full = {**os.environ, "DINREC_RETRAIN_WORK_DIR": str(tmp_path), **env}
        out = subprocess.run([sys.executable, "-m", "dinrec.cli.main", "retrain", *args], cwd=REPO, env=full,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and says in out.stderr, out.stderr[-2000:]


def test_the_gate_refuses_any_measure_worse_beyond_its_tolerance():
    s = RetrainSettings()
    champion = {"gauc": 0.70, "auc": 0.72, "logloss": 0.50, "calibration_error": 0.10, "recall_hr": 0.40,
                "recall_tail_hr": 0.30, "recall_tail_share": 0.50}
    assert decide(dict(champion), champion, s)[0]
    better_gauc_worse_logloss = {**champion, "gauc": 0.71, "logloss": 0.50 * (1 + s.logloss_tolerance) + 0.01}
    ok, checks = decide(better_gauc_worse_logloss, champion, s)
    assert not ok and [c.metric for c in checks if not c.passed] == ["logloss"]
    slightly_worse = {**champion, "gauc": 0.70 - s.gauc_tolerance / 2}
    assert decide(slightly_worse, champion, s)[0]
    off_mean = {**champion, "calibration_error": 0.10 + s.calibration_tolerance + 0.05}
    assert [c.metric for c in decide(off_mean, champion, s)[1] if not c.passed] == ["calibration_error"]
    # ... unless its logloss is clearly better: then its probabilities carry more, whatever their mean.
    ok, checks = decide({**off_mean, "logloss": 0.50 * (1 - s.logloss_tolerance) - 0.01}, champion, s)
    assert ok and "logloss" in (next(c.note for c in checks if c.metric == "calibration_error") or "")
    misses_the_tail = {**champion, "recall_tail_hr": 0.30 - s.tail_tolerance - 0.01}
    assert [c.metric for c in decide(misses_the_tail, champion, s)[1] if not c.passed] == ["recall_tail_hr"]
    # A narrower recalled tail alone is not worse: serving's lane sets the tail share users see.
    assert decide({**champion, "recall_tail_share": 0.20}, champion, s)[0]
    assert not decide({**champion, "gauc": float("nan")}, champion, s)[0]
    assert not decide({**champion, "gauc": 0.52}, None, s)[0]  # a first model must beat chance clearly


def test_warm_start_carries_rows_by_external_id(tiny_run):
    _, samples, bundle_dir, _ = tiny_run
    old = load_bundle(bundle_dir)
    v = old.vocab
    # A new vocabulary: one item dropped, one new item and category added, the order shuffled.
    items = ["<pad>", "brand-new", *reversed(v.items[2:])]
    cats = ["<pad>", "new-cat", *v.categories[1:]]
    new_vocab = Vocab(items, cats, torch.zeros(len(items), dtype=torch.long).numpy())
    from dinrec.models.din import DIN

    new = DIN(old.config.__class__(**{**old.config.__dict__, "n_items": len(items), "n_categories": len(cats)}))
    fresh_row = new.item_emb.weight[1].clone()
    info = warm_start(new, old.model, v, new_vocab)
    assert info["items_new"] == 1 and info["items_kept"] == len(v.items) - 2 and info["categories_new"] == 1
    assert torch.equal(new.item_emb.weight[2], old.model.item_emb.weight[len(v.items) - 1])  # same id, moved row
    assert torch.equal(new.item_emb.weight[1], fresh_row)  # the new item keeps its fresh init
    assert torch.equal(new.cat_emb.weight[2], old.model.cat_emb.weight[1])
    assert torch.equal(new.out.weight, old.model.out.weight)  # dense layers copied whole


def test_clicks_on_served_recommendations_are_left_out_of_the_holdout(tmp_path):
    """The serving model chose what those users could click: as a holdout they would favour it."""
    from dinrec.events.schema import BehaviourEvent
    from dinrec.retrain.events import read_window
    from dinrec.training.evaluation import holdout_rows
    from dinrec.training.samples import build_samples

    events = []
    for u in range(6):
        for j in range(5):  # the last click of even users came from a /recommend answer
            served = j == 4 and u % 2 == 0
            events.append(BehaviourEvent(event_id=f"e{u}-{j}", user_id=f"u{u}", item_id=f"i{(u + j) % 7}",
                                         category_id="c1", ts=1000.0 + 10 * j + u,
                                         request_id="r1" if served else None, position=0 if served else None))
    events.append(BehaviourEvent(event_id="imp", user_id="u1", item_id="i1", event_type="impression", ts=1001.0,
                                 request_id="r2", position=1))  # impressions are never behaviours
    archive(events, tmp_path)
    window = read_window(tmp_path, "dinrec.events", 0, 2000)
    assert window.stats["attributed"] == 3 and window.stats["behaviours"] == 30
    samples = build_samples(window.data, seq_len=5, eval_negatives=2)
    every, organic = holdout_rows(samples, None), holdout_rows(samples, None, window.attributed)
    assert len(every) == 6 * 3 and len(organic) == 3 * 3  # whole groups: the positive and its negatives
    assert {samples.users[u] for u in samples.test.user[organic]} == {"u1", "u3", "u5"}
    assert len(holdout_rows(samples, 1043.0, window.attributed)) == 2 * 3  # and only after the champion's window


@pytest.mark.slow
def test_spot_trains_the_candidate_as_a_spot_job_warm_started_from_the_champion(world, tmp_path):
    root = fresh_copy(world, tmp_path)
    spot = {"DINREC_SPOT_STATE_URI": str(tmp_path / "spot-state"), "DINREC_SPOT_BACKEND": "local",
            "DINREC_SPOT_WORKDIR": str(tmp_path / "spot-work"), "DINREC_SPOT_POLL_S": "0.3",
            "DINREC_SPOT_RESULTS_KEY": "s" * 64}
    reg = Registry(root / "registry")
    first = reg.resolve("champion")
    # A setting the old --spot path did not pass on (it sent 5 of them as flags): the job must build with it.
    local_env = {"DINREC_RETRAIN_WARM_START_TOWERS": "1", "DINREC_TRAIN_NEGATIVE_POWER": "0.5"}
    code, report = retrain(root, "--until", str(END), "--spot", env={**spot, **local_env})
    assert code == 0 and report["status"] == "promoted", report.get("reason")
    job = report["candidate"]["spot"]
    assert job["status"] == "done" and job["attempts"] == 1 and job["by_instance"][0]["instance_type"] == "g5.xlarge"
    # The job trained on the run's samples, warm-started from the champion it shipped in init/.
    data = tmp_path / "spot-state" / "jobs" / job["job_id"] / "data"
    assert (data / "samples.json").is_file() and (data / "init" / "manifest.json").is_file()
    assert report["candidate"]["train"]["warm_start"]["items_new"] > 0
    assert report["candidate"]["train"]["recall_warm_start"]["items_new"] > 0  # asked for: the towers too
    lineage = reg.manifest(reg.resolve("champion"))["lineage"]
    assert lineage["parent"] == first and lineage["trained_by"] == "dinrec retrain --spot"
    assert lineage["warm_start_towers"]
    assert report["candidate"]["holdout"]["gauc"] > report["champion"]["holdout"]["gauc"]
    # The job was built from the same settings a local retrain uses, every field of them.
    shipped = json.loads((data / "train-settings.json").read_text())
    built = json.loads((reg.bundle_dir(reg.resolve("champion")) / "metrics.json").read_text())["train_settings"]
    assert shipped == built and built["negative_power"] == 0.5
    # What a local retrain in the same environment trains with (its CLI: TrainSettings from the environment).
    local = subprocess.run([sys.executable, "-c", "from dinrec.training.settings import TrainSettings; "
                            "print(TrainSettings(progress=False).model_dump_json())"],
                           env={**os.environ, **FAST, **local_env}, capture_output=True, text=True, check=True)
    assert json.loads(local.stdout) == built


def test_every_runs_on_a_period_until_sigterm(world, tmp_path):
    """The embedded scheduler: one run per period in one process; SIGTERM between runs ends it cleanly."""
    root = fresh_copy(world, tmp_path)
    p = retrain(root, "--until", str(END - 5 * DAY), "--every", "2s", wait=False)
    lines = [p.stdout.readline() for _ in range(2)]  # the decided window replays on every period
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    reports = [json.loads(line) for line in lines]
    assert [r["run"] for r in reports] == [reports[0]["run"]] * 2 and all(r.get("replayed") for r in reports)
    assert p.returncode in (0, 75), err[-2000:]  # 0 between runs; 75 if the signal met a run


def test_paired_difference_is_the_mean_difference_with_its_standard_error():
    a, b = np.array([1.0, 0.0, 1.0, 1.0]), np.array([0.0, 0.0, 1.0, 0.0])
    d, se = paired_difference(a, b)
    assert d == 0.5 and se == pytest.approx(np.std(a - b, ddof=1) / 2)
    # Weighted (GAUC: per-user AUCs weighted by rows), NaN units (one-class users) left out.
    d, se = paired_difference(np.array([0.9, 0.5, np.nan]), np.array([0.7, 0.5, 0.6]), np.array([3, 1, 5]))
    assert d == pytest.approx((3 * 0.2 + 0) / 4) and se > 0
    assert np.isnan(paired_difference(np.array([1.0]), np.array([0.0]))[1])  # one unit: no error to give

