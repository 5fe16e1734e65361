"""What a spot job installs and what it brings back are checked: an instance installs only the wheel
its job uploaded, by hash; the retrain gate takes only results the job's own instance signed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dinrec.spot.signing import SIGNATURE, ResultsRejected, check_results, job_key, master_key, signed

KEY = "k" * 64


def test_results_signed_with_another_jobs_key_or_changed_after_signing_are_refused(tmp_path):
    results = tmp_path / "results"
    (results / "sub").mkdir(parents=True)
    (results / "model.safetensors").write_bytes(b"weights")
    (results / "sub" / "index.faiss").write_bytes(b"index")
    master = master_key(KEY)
    mine, other = job_key(master, "job-a"), job_key(master, "job-b")
    assert mine != other and len(mine) == 64
    doc = signed(results, mine)
    check_results(results, doc, mine)  # as signed: taken
    with pytest.raises(ResultsRejected, match="not the job's"):
        check_results(results, signed(results, other), mine)  # another job's instance signed it
    with pytest.raises(ResultsRejected, match="no signature"):
        check_results(results, None, mine)
    (results / "model.safetensors").write_bytes(b"planted")
    with pytest.raises(ResultsRejected, match="differ.*model.safetensors"):
        check_results(results, doc, mine)
    (results / "model.safetensors").write_bytes(b"weights")
    (results / "extra.bin").write_bytes(b"x")
    with pytest.raises(ResultsRejected, match="differ.*extra.bin"):
        check_results(results, doc, mine)


def test_the_master_key_file_is_made_once_and_private(tmp_path):
    path = tmp_path / "conf" / "spot-results.key"
    first = master_key(None, path)
    assert master_key(None, path) == first and len(first) == 64 and path.stat().st_mode & 0o777 == 0o600
    assert master_key(KEY, path) == KEY.encode()  # a configured key wins


def _job(tmp_path: Path, monkeypatch, wheel: Path | None = None, backend: str = "local"):
    from dinrec.spot.settings import SpotSettings
    from dinrec.spot.wiring import create_job

    for name, value in {"DINREC_SPOT_STATE_URI": str(tmp_path / "state"), "DINREC_SPOT_BACKEND": backend,
                        "DINREC_SPOT_WORKDIR": str(tmp_path / "work"), "DINREC_SPOT_POLL_S": "0.2",
                        "DINREC_SPOT_RESULTS_KEY": KEY, "DINREC_SPOT_IMAGE_ID": "ami-1"}.items():
        monkeypatch.setenv(name, value)
    if wheel is not None:
        monkeypatch.setenv("DINREC_SPOT_WHEEL", str(wheel))
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    (data / "events.jsonl").write_text("")
    return create_job(SpotSettings(), data, ["g5.xlarge"], ["--epochs", "1"])


def test_an_instance_refuses_a_wheel_that_is_not_the_one_its_job_uploaded(tmp_path, monkeypatch):
    from dinrec.spot.settings import SpotSettings
    from dinrec.spot.wiring import job_supervisor

    wheel = tmp_path / "dinrec-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"the wheel this job was made with")
    store, spec = _job(tmp_path, monkeypatch, wheel)
    assert spec.wheel == wheel.name and len(spec.wheel_sha256) == 64
    assert store.get_bytes(f"dist/{wheel.name}") == wheel.read_bytes()
    store.put_bytes(f"dist/{wheel.name}", b"a wheel somebody swapped in")  # the stored copy, changed
    _, _, supervisor = job_supervisor(SpotSettings(), spec.job_id)
    state = supervisor.run()
    assert state.status == "failed" and state.attempts[0].outcome == "failed"
    status = store.get_json("attempts/1/status.json")
    assert status["state"] == "failed" and "not the SHA-256 the job recorded" in status["reason"]
    log = (tmp_path / "work" / spec.job_id / "attempt-1" / "log.txt").read_text()
    assert "dinrec spot agent" not in log and "Traceback" not in log  # stopped before anything ran


def test_an_ec2_job_says_what_its_instances_install(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="DINREC_SPOT_WHEEL.*DINREC_SPOT_INSTALL"):
        _job(tmp_path, monkeypatch, backend="ec2")
    monkeypatch.setenv("DINREC_SPOT_WHEEL", str(tmp_path / "missing.whl"))
    with pytest.raises(ValueError, match="not a wheel file"):
        _job(tmp_path, monkeypatch, backend="ec2")


def test_the_retrain_gate_refuses_results_the_jobs_instance_did_not_sign(tmp_path, monkeypatch, tiny_run):
    """A finished job whose results/ hold a bundle no instance of it signed (another job's instance
    planted it): the candidate is refused before the gate, and the run forgets the job."""
    from dinrec.retrain.spot import SpotFailed, train_on_spot
    from dinrec.spot.supervisor import STATE
    from dinrec.storage import LocalStorage
    from dinrec.training.settings import TrainSettings

    store, spec = _job(tmp_path, monkeypatch)
    store.put_json(STATE, {"status": "done"})
    shutil.copytree(tiny_run[2], tmp_path / "planted")
    store.upload_dir(tmp_path / "planted", "results")
    run = tmp_path / "run"
    LocalStorage(run).put_json("spot-job.json", {"job_id": spec.job_id, "job_uri": store.uri})
    with pytest.raises(SpotFailed) as refused:
        train_on_spot(run, tmp_path / "samples", None, TrainSettings(progress=False), ["g5.xlarge"], {})
    assert refused.value.report["status"] == "results_rejected" and "no signature" in refused.value.report["reason"]
    assert not (run / "candidate").exists() and not (run / "spot-job.json").exists()
    # Signed with another job's key: refused too.
    store.put_json(SIGNATURE, signed(tmp_path / "planted", job_key(master_key(KEY), "another-job")))
    LocalStorage(run).put_json("spot-job.json", {"job_id": spec.job_id, "job_uri": store.uri})
    with pytest.raises(SpotFailed, match="results_rejected"):
        train_on_spot(run, tmp_path / "samples", None, TrainSettings(progress=False), ["g5.xlarge"], {})
    # Signed with its own: taken.
    store.put_json(SIGNATURE, signed(tmp_path / "planted", job_key(master_key(KEY), spec.job_id)))
    LocalStorage(run).put_json("spot-job.json", {"job_id": spec.job_id, "job_uri": store.uri})
    bundle, report = train_on_spot(run, tmp_path / "samples", None, TrainSettings(progress=False), ["g5.xlarge"], {})
    assert report["status"] == "done" and json.loads((run / "candidate" / "manifest.json").read_text())["lineage"] == {}


def test_the_agent_gives_its_trainer_the_jobs_key_for_the_checkpoints(tmp_path, monkeypatch):
    from dinrec.spot.agent import run_agent
    from dinrec.storage import LocalStorage

    monkeypatch.setenv("DINREC_SPOT_JOB_KEY", "j" * 64)
    store = LocalStorage(tmp_path / "job")
    code = run_agent(store, 1, ["bash", "-c", f'test "$DINREC_CHECKPOINT_KEY" = {"j" * 64}'], imds=None)
    status = store.get_json("attempts/1/status.json")
    assert code == 0 and status is not None and status["state"] == "done"
