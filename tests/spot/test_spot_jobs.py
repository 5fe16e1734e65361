"""Spot jobs through the `dinrec spot` commands: the local backend (the embedded default), the
supervisor's decisions (restart, cancel, budget), and SageMaker managed spot against moto."""

import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from tests.conftest import REPO, synthetic_dataset_dir, wait_until

TRAIN = "--epochs 1 --seq-len 20 --batch-size 256"
RESULTS_KEY = "r" * 64  # the supervisors' master key (spot.signing): not a key file in the home folder


def _dinrec(*args, env, timeout=600):
    return subprocess.run([sys.executable, "-m", "dinrec.cli.main", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _last_json(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


@pytest.fixture
def local_env(tmp_path):
    return {**os.environ, "DINREC_SPOT_STATE_URI": str(tmp_path / "state"), "DINREC_SPOT_BACKEND": "local",
            "DINREC_SPOT_WORKDIR": str(tmp_path / "work"), "DINREC_SPOT_POLL_S": "0.3",
            "DINREC_SPOT_RESULTS_KEY": RESULTS_KEY}


@pytest.fixture
def small_data(tmp_path):
    return synthetic_dataset_dir(tmp_path / "data", n_users=300, n_items=200, n_categories=10,
                                 mean_events_per_user=30, seed=1)


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"  # exited, not yet reaped
    except FileNotFoundError:
        return True


@pytest.mark.slow
def test_local_job_runs_to_done_and_reports_status_and_cost(local_env, small_data, tmp_path):
    from dinrec.spot.signing import SIGNATURE, check_results, job_key, master_key

    wheel = tmp_path / "dinrec-0.1.0-py3-none-any.whl"  # uploaded with the job, its hash checked at boot
    wheel.write_bytes(b"a wheel")
    run = _dinrec("spot", "run", "--data", str(small_data), "--instance-type", "g5.xlarge", "--train-args", TRAIN,
                  env={**local_env, "DINREC_SPOT_WHEEL": str(wheel)})
    assert run.returncode == 0, run.stderr[-3000:]
    report = _last_json(run.stdout)
    assert report["status"] == "done" and report["attempts"] == 1 and report["interruptions"] == 0
    assert report["by_instance"][0]["instance_type"] == "g5.xlarge" and report["saved_pct"] > 0
    job_id = json.loads(run.stderr.strip().splitlines()[0])["job_id"]
    job = tmp_path / "state" / "jobs" / job_id
    assert (job / "results" / "model.safetensors").exists()  # the bundle came back to the job store
    # signed with the job's key by its agent
    check_results(job / "results", json.loads((job / SIGNATURE).read_text()), job_key(master_key(RESULTS_KEY), job_id))
    assert json.loads((job / "attempts" / "1" / "status.json").read_text())["state"] == "done"
    status = _dinrec("spot", "status", "--job-id", job_id, env=local_env)
    assert status.returncode == 0 and _last_json(status.stdout)["status"] == "done"
    assert _last_json(status.stdout)["attempt_list"][0]["outcome"] == "done"


@pytest.mark.slow
def test_a_restarted_supervisor_continues_the_same_job(local_env, small_data):
    first = _dinrec("spot", "launch", "--data", str(small_data), "--instance-type", "g4dn.xlarge",
                    "--train-args", TRAIN, env=local_env)  # launch = create + first attempt, no supervision
    assert first.returncode == 0, first.stderr[-3000:]
    job_id = _last_json(first.stdout)["job_id"]
    assert _last_json(first.stdout)["status"] == "running"
    again = _dinrec("spot", "run", "--job-id", job_id, env=local_env)  # a new supervisor process
    assert again.returncode == 0, again.stderr[-3000:]
    report = _last_json(again.stdout)
    assert report["status"] == "done" and report["attempts"] == 1  # it waited for attempt 1, launched nothing new


def test_cancel_stops_a_running_job_and_it_stays_cancelled(local_env, small_data, tmp_path):
    start = _dinrec("spot", "run", "--data", str(small_data), "--instance-type", "g5.xlarge",
                    "--train-args", "--epochs 500 --patience 0 --seq-len 20 --checkpoint-every 5", "--detach",
                    env=local_env)
    assert start.returncode == 0, start.stderr[-3000:]
    job_id = _last_json(start.stdout)["job_id"]
    job = tmp_path / "state" / "jobs" / job_id
    wait_until(lambda: (job / "checkpoints" / "latest").exists(), timeout_s=120, what="training to start")
    pid = int(json.loads((job / "state.json").read_text())["attempts"][0]["backend_id"])
    cancel = _dinrec("spot", "cancel", "--job-id", job_id, env=local_env)
    assert cancel.returncode == 0 and _last_json(cancel.stdout)["status"] == "cancelled"
    wait_until(lambda: _gone(pid), timeout_s=120, what="the attempt to stop")
    resumed = _dinrec("spot", "run", "--job-id", job_id, env=local_env)
    assert resumed.returncode == 1 and _last_json(resumed.stdout)["status"] == "cancelled"


def test_two_supervisors_on_one_job_one_supervises_and_a_killed_ones_lease_expires(local_env, small_data, tmp_path):
    env = {**local_env, "DINREC_SPOT_LEASE_S": "2"}
    start = _dinrec("spot", "launch", "--data", str(small_data), "--instance-type", "g5.xlarge",
                    "--train-args", "--epochs 500 --patience 0 --seq-len 20 --checkpoint-every 5", env=env)
    assert start.returncode == 0, start.stderr[-3000:]
    job_id = _last_json(start.stdout)["job_id"]
    job = tmp_path / "state" / "jobs" / job_id
    first = subprocess.Popen([sys.executable, "-m", "dinrec.cli.main", "spot", "run", "--job-id", job_id], cwd=REPO,
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def held_by_first() -> bool:
            lease = json.loads((job / "lease.json").read_text()) if (job / "lease.json").exists() else {}
            return lease.get("holder", "").split(":")[1:2] == [str(first.pid)]

        wait_until(held_by_first, timeout_s=120, what="the first supervisor to hold the job")
        second = _dinrec("spot", "run", "--job-id", job_id, env=env)
        assert second.returncode == 4, second.stderr[-3000:]
        answer = _last_json(second.stdout)
        assert answer["status"] == "supervised elsewhere" and answer["holder"]["holder"].split(":")[1] == str(first.pid)
        assert len(json.loads((job / "state.json").read_text())["attempts"]) == 1  # it launched nothing
        first.kill()  # SIGKILL: no release; its lease frees itself 2 s after its last renewal
        first.wait(timeout=30)
        wait_until(lambda: _dinrec("spot", "run", "--job-id", job_id, "--detach", env=env).returncode == 0,
                   timeout_s=60, interval_s=0.5, what="another supervisor to take the job over")
        assert len(json.loads((job / "state.json").read_text())["attempts"]) == 1  # the attempt runs on, adopted
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        _dinrec("spot", "cancel", "--job-id", job_id, env=env)  # stop the training attempt


def test_budget_stops_the_job_and_the_running_attempt(local_env, small_data):
    run = _dinrec("spot", "run", "--data", str(small_data), "--instance-type", "p5en.48xlarge",
                  "--train-args", "--epochs 500 --patience 0 --seq-len 20", "--budget-usd", "0.0005", env=local_env)
    assert run.returncode == 1
    report = _last_json(run.stdout)
    assert report["status"] == "budget_spent" and report["spent_usd"] >= 0.0005 and report["attempts"] == 1


def test_bad_requests_are_clear_errors(local_env, small_data, tmp_path):
    no_data = _dinrec("spot", "run", "--instance-type", "g5.xlarge", env=local_env)
    assert no_data.returncode == 2 and "--data" in no_data.stderr
    unknown = _dinrec("spot", "run", "--data", str(small_data), "--instance-type", "g9.mega", env=local_env)
    assert unknown.returncode == 2 and "g9.mega" in unknown.stderr
    missing = _dinrec("spot", "status", "--job-id", "nope", env=local_env)
    assert missing.returncode == 2 and "no job" in missing.stderr
    no_store = _dinrec("spot", "status", "--job-id", "x", env={**local_env, "DINREC_SPOT_BACKEND": "ec2"})
    assert no_store.returncode == 2 and "DINREC_SPOT_STATE_URI=s3://" in no_store.stderr
    for out in (no_data, unknown, missing, no_store):
        assert "Traceback" not in out.stderr


@pytest.mark.usefixtures("aws_env")
def test_sagemaker_backend_submits_managed_spot_training(aws_env, small_data):
    s3 = boto3.client("s3", endpoint_url=aws_env, region_name="us-east-1")
    s3.create_bucket(Bucket="dinrec-sm")
    env = {**os.environ, "DINREC_SPOT_STATE_URI": "s3://dinrec-sm/spot", "DINREC_SPOT_BACKEND": "sagemaker",
           "DINREC_SPOT_SAGEMAKER_ROLE_ARN": "arn:aws:iam::123456789012:role/dinrec-training",
           "DINREC_SPOT_SAGEMAKER_IMAGE_URI": "123456789012.dkr.ecr.us-east-1.amazonaws.com/dinrec:1",
           "DINREC_SPOT_POLL_S": "0.2"}
    run = _dinrec("spot", "run", "--data", str(small_data), "--instance-type", "g5.xlarge", "--train-args", TRAIN,
                  env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert _last_json(run.stdout)["status"] == "done"  # moto completes training jobs at once
    job_id = json.loads(run.stderr.strip().splitlines()[0])["job_id"]
    sm = boto3.client("sagemaker", endpoint_url=aws_env, region_name="us-east-1")
    d = sm.describe_training_job(TrainingJobName=f"dinrec-{job_id}-1")
    assert d["EnableManagedSpotTraining"] is True
    assert d["CheckpointConfig"]["S3Uri"] == f"s3://dinrec-sm/spot/jobs/{job_id}/checkpoints/"
    assert d["StoppingCondition"]["MaxWaitTimeInSeconds"] >= d["StoppingCondition"]["MaxRuntimeInSeconds"]
    assert d["ResourceConfig"]["InstanceType"] == "ml.g5.xlarge"
    args = d["AlgorithmSpecification"]["ContainerArguments"]
    assert args[args.index("--resume") + 1] == "auto"
    data = s3.list_objects_v2(Bucket="dinrec-sm", Prefix=f"spot/jobs/{job_id}/data/")["Contents"]
    assert [o["Key"].rsplit("/", 1)[-1] for o in data] == ["events.jsonl"]  # the channel SageMaker mounts
    tags = {t["Key"]: t["Value"] for t in sm.list_tags(ResourceArn=d["TrainingJobArn"])["Tags"]}
    assert tags["dinrec:job"] == job_id


def test_no_capacity_is_retried_then_given_up(tmp_path):
    """AWS's capacity errors cannot be produced by a local endpoint, so this one backend is a stand-in."""
    from dinrec.spot.backends import Backend
    from dinrec.spot.catalog import DEFAULT_CATALOG
    from dinrec.spot.job import JobSpec
    from dinrec.spot.jobstore import LocalJobStore
    from dinrec.spot.supervisor import Supervisor
    from dinrec.storage import CloudError

    class NoCapacity(Backend):
        tries = 0

        def launch(self, spec, attempt, types, avoid_zone):
            NoCapacity.tries += 1
            raise CloudError("no spot capacity", "InsufficientInstanceCapacity")

        def poll(self, attempt):
            raise AssertionError("nothing was launched")

        def terminate(self, attempt):
            raise AssertionError("nothing was launched")

    store = LocalJobStore(tmp_path / "job")
    spec = JobSpec(job_id="j1", job_uri=store.uri, backend="local", instance_types=["g5.xlarge"], max_relaunches=2)
    state = Supervisor(store, spec, NoCapacity(), {t.name: t for t in DEFAULT_CATALOG}, poll_s=0,
                       sleep=lambda s: None).run()
    assert state.status == "retries_exhausted" and state.reason is not None and "no capacity" in state.reason
    assert NoCapacity.tries == 3
    assert json.loads((tmp_path / "job" / "state.json").read_text())["status"] == "retries_exhausted"


def test_the_supervisor_iam_policy_allows_every_ec2_sagemaker_and_iam_call_the_code_makes():
    import re

    policy = json.loads((Path(REPO) / "deploy" / "aws" / "supervisor-policy.json").read_text())
    allowed = set()
    for statement in policy["Statement"]:
        actions = statement["Action"]
        if statement["Effect"] == "Allow":
            allowed |= {actions} if isinstance(actions, str) else set(actions)
    source = "\n".join(p.read_text() for p in (Path(REPO) / "spot").glob("*.py"))
    calls = set(re.findall(r'call\("(ec2|sagemaker|iam)\.([a-z_]+)"', source))
    assert len(calls) >= 17
    for service, op in calls:
        action = f"{service}:{''.join(w.capitalize() for w in op.split('_'))}"
        assert action in allowed, f"{action} is used by spot but not in supervisor-policy.json"


def test_the_supervisor_may_launch_only_catalog_instances_tagged_with_their_job():
    from dinrec.spot.backends import JOB_TAG
    from dinrec.spot.catalog import DEFAULT_CATALOG

    policy = json.loads((Path(REPO) / "deploy" / "aws" / "supervisor-policy.json").read_text())
    on_instances = [s for s in policy["Statement"] if "ec2:RunInstances" in s["Action"]
                    and "instance/" in json.dumps(s["Resource"])]
    assert len(on_instances) == 1, "one statement decides which instances may start"
    (launch,) = on_instances
    # the allowlist is the planner's catalog: a type it may choose can start, and no other
    assert set(launch["Condition"]["StringEquals"]["ec2:InstanceType"]) == {t.name for t in DEFAULT_CATALOG}
    assert launch["Condition"]["Null"] == {f"aws:RequestTag/{JOB_TAG}": "false"}
    for statement in policy["Statement"]:  # no other statement lets an instance start unconditioned
        if {"ec2:RunInstances", "ec2:CreateFleet"} & set(statement["Action"]) and statement is not launch:
            resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            assert all(r != "*" and "instance/" not in r for r in resources), statement["Sid"]


def test_job_data_keys_that_climb_out_of_the_dataset_are_never_written(aws_env, tmp_path):
    import uuid

    import boto3

    from dinrec.spot.agent import fetch_data
    from dinrec.storage import open_storage

    s3 = boto3.client("s3", endpoint_url=aws_env, region_name="us-east-1")
    bucket = f"jobs-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    store = open_storage(f"s3://{bucket}/spot/jobs/j1", s3)
    store.put_bytes("data/part-0.txt", b"events")
    escape = tmp_path / "escape.txt"
    for key in ("data/../../escape.txt", f"data//{escape}"):  # S3 allows both
        s3.put_object(Bucket=bucket, Key=f"spot/jobs/j1/{key}", Body=b"planted")
    into = tmp_path / "instance" / "data"
    fetch_data(store, "data", into)
    assert (into / "part-0.txt").read_bytes() == b"events"
    planted = [p for p in tmp_path.rglob("escape.txt")]
    # `..` is skipped; a doubled slash is read as a path inside the dataset, never as an absolute one.
    assert not escape.exists() and all(p.is_relative_to(into) for p in planted) and len(planted) == 1
