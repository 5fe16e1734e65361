"""Spot jobs on EC2, end to end against real local endpoints: moto's server (EC2 fleets, S3, spot
prices) and AWS's metadata mock. Moto starts no machines, so the test plays the instances: it
reads each launched instance's user-data back from EC2 and runs that script here, with the
metadata endpoint pointed at the mock — the script, the agent, the trainer and the supervisor are
the real ones."""

import base64
import json
import os
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import boto3
import pytest

from tests.conftest import REPO, free_port, synthetic_dataset_dir

BUCKET = "dinrec-jobs"
TRAIN_ARGS = ["--epochs", "2", "--batch-size", "128", "--seq-len", "20"]


@pytest.fixture
def ec2_env(aws_env, tmp_path):
    s3 = boto3.client("s3", endpoint_url=aws_env, region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    ec2 = boto3.client("ec2", endpoint_url=aws_env, region_name="us-east-1")
    subnets = ec2.describe_subnets()["Subnets"][:2]
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    iam = boto3.client("iam", endpoint_url=aws_env, region_name="us-east-1")
    boundary = (REPO / "deploy" / "aws" / "instance-boundary.json").read_text()
    boundary_arn = iam.create_policy(PolicyName=f"dinrec-instance-boundary-{tmp_path.name}"[:128],
                                     PolicyDocument=boundary.replace("BUCKET", BUCKET).replace("PREFIX", "spot"),
                                     )["Policy"]["Arn"]
    env = {**os.environ, "DINREC_SPOT_BACKEND": "ec2", "DINREC_SPOT_STATE_URI": f"s3://{BUCKET}/spot",
           "DINREC_SPOT_IMAGE_ID": ami, "DINREC_SPOT_INSTANCE_BOUNDARY_ARN": boundary_arn,
           "DINREC_SPOT_SUBNET_IDS": json.dumps([s["SubnetId"] for s in subnets]),
           "DINREC_SPOT_ENDPOINT_URL": aws_env, "DINREC_SPOT_INSTALL": "true", "DINREC_SPOT_POLL_S": "0.5",
           "DINREC_SPOT_RESULTS_KEY": "e" * 64}
    return {"s3": s3, "ec2": ec2, "iam": iam, "env": env, "endpoint": aws_env}


class InstancePlayer(threading.Thread):
    """Runs the user-data of every instance the job launches, as that instance would at boot."""

    def __init__(self, ec2, s3, workdir: Path, imds_for_attempt):
        super().__init__(daemon=True)
        self.ec2, self.s3, self.workdir, self.imds_for_attempt = ec2, s3, workdir, imds_for_attempt
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: list = []
        self.scripts: dict[str, str] = {}
        self.templates: dict[str, dict] = {}
        self.halt = threading.Event()

    def run(self):
        while not self.halt.is_set():
            resp = self.ec2.describe_instances(Filters=[{"Name": "tag-key", "Values": ["dinrec:job"]},
                                                        {"Name": "instance-state-name", "Values": ["running"]}])
            for r in resp["Reservations"]:
                for inst in r["Instances"]:
                    iid = inst["InstanceId"]
                    if iid in self.procs:
                        continue
                    tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
                    attempt = int(tags["dinrec:attempt"])
                    ud = self.ec2.describe_instance_attribute(InstanceId=iid, Attribute="userData")["UserData"]
                    versions = self.ec2.describe_launch_template_versions(
                        LaunchTemplateName=f"dinrec-{tags['dinrec:job']}-{attempt}")["LaunchTemplateVersions"]
                    self.templates[iid] = versions[0]["LaunchTemplateData"]
                    script = base64.b64decode(ud["Value"]).decode()
                    self.scripts[iid] = script
                    work = self.workdir / iid
                    work.mkdir(parents=True)
                    env = {**os.environ, "DINREC_SPOT_WORKDIR": str(work), "DINREC_SPOT_SHUTDOWN_CMD": "true",
                           "DINREC_SPOT_IMDS_URL": self.imds_for_attempt(attempt, tags["dinrec:job"]),
                           "DINREC_SPOT_IMDS_POLL_S": "0.3",
                           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
                    log = (self.workdir / f"{iid}.log").open("w")
                    self.logs.append(log)
                    self.procs[iid] = subprocess.Popen(["bash", "-c", script], env=env, stdout=log,
                                                       stderr=subprocess.STDOUT)
            self.halt.wait(0.3)

    def stop(self):
        self.halt.set()
        self.join(10)
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
            p.wait(10)
        for log in self.logs:
            log.close()


def _checkpoint_written(s3, job_id: str) -> bool:
    resp = s3.list_objects_v2(Bucket=BUCKET, Prefix=f"spot/jobs/{job_id}/checkpoints/")
    return any(o["Key"].endswith("/latest") for o in resp.get("Contents", []))


@pytest.mark.slow
def test_interrupted_spot_job_is_relaunched_resumes_and_ends_with_the_uninterrupted_weights(
        ec2_env, metadata_mock, tmp_path):
    data = synthetic_dataset_dir(tmp_path / "data", n_users=1200, n_items=400, n_categories=12,
                                 mean_events_per_user=40, seed=5)
    reference = subprocess.run([sys.executable, "-m", "dinrec.cli.main", "train", "--data", str(data),
                                "--out", str(tmp_path / "ref"), "--no-progress", *TRAIN_ARGS],
                               cwd=REPO, capture_output=True, text=True, timeout=600)
    assert reference.returncode == 0, reference.stderr[-2000:]
    ref_sha = json.loads(reference.stdout.strip().splitlines()[-1])["weights_sha256"]

    s3, ec2 = ec2_env["s3"], ec2_env["ec2"]
    interrupting_port = free_port()  # attempt 1's metadata service: announces termination once training runs
    calm = metadata_mock("events")  # later attempts: a metadata service with no notice

    def imds_for_attempt(attempt: int, job_id: str) -> str:
        if attempt > 1:
            return calm

        def announce_when_training():
            while not _checkpoint_written(s3, job_id):
                time.sleep(0.1)
            metadata_mock("spot", "--mock-delay-sec", "0", port=interrupting_port)

        threading.Thread(target=announce_when_training, daemon=True).start()
        return f"http://127.0.0.1:{interrupting_port}"

    player = InstancePlayer(ec2, s3, tmp_path / "instances", imds_for_attempt)
    player.start()
    try:
        run = subprocess.run([sys.executable, "-m", "dinrec.cli.main", "spot", "run", "--data", str(data),
                              "--instance-type", "g5.xlarge", "--instance-type", "g4dn.xlarge",
                              "--train-args", " ".join([*TRAIN_ARGS, "--checkpoint-every", "10"])],
                             cwd=REPO, env=ec2_env["env"], capture_output=True, text=True, timeout=900)
    finally:
        player.stop()
    logs = "\n".join(p.read_text()[-1500:] for p in (tmp_path / "instances").glob("*.log"))
    assert run.returncode == 0, run.stderr[-3000:] + logs
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["status"] == "done" and report["attempts"] == 2 and report["interruptions"] == 1, report
    # relaunched on the next candidate type, not the one that was just reclaimed
    assert {r["instance_type"] for r in report["by_instance"]} == {"g5.xlarge", "g4dn.xlarge"}
    assert 0 < report["spent_usd"] < report["on_demand_usd"]

    job_id = json.loads(run.stderr.strip().splitlines()[0])["job_id"]
    prefix = f"spot/jobs/{job_id}"
    first = json.loads(s3.get_object(Bucket=BUCKET, Key=f"{prefix}/attempts/1/status.json")["Body"].read())
    assert first["state"] == "interrupted" and first["exit_code"] == 75 and first["notice"]["action"] == "terminate"
    seen, ended = (datetime.fromisoformat(first["notice"]["seen"]), datetime.fromisoformat(first["ended"]))
    assert (ended - seen).total_seconds() < 60  # checkpointed to S3 and out well inside the 2-minute notice
    metrics = json.loads(s3.get_object(Bucket=BUCKET, Key=f"{prefix}/results/metrics.json")["Body"].read())
    assert metrics["weights_sha256"] == ref_sha  # resumed exactly: same weights as the uninterrupted run
    assert metrics["global_step"] == json.loads(reference.stdout.strip().splitlines()[-1])["global_step"]

    # what was launched: spot fleets from templates that require IMDSv2, every resource tagged
    assert len(player.templates) == 2
    for lt in player.templates.values():
        assert lt["MetadataOptions"]["HttpTokens"] == "required"
        assert lt["InstanceInitiatedShutdownBehavior"] == "terminate"
        # each instance runs as its job's own role (tests/spot/test_job_role.py holds what it may write)
        assert lt["IamInstanceProfile"]["Arn"].endswith(f":instance-profile/dinrec/dinrec-job-{job_id}")
    iam = ec2_env["iam"]
    assert not [r for r in iam.list_roles(PathPrefix="/dinrec/")["Roles"] if job_id in r["RoleName"]]  # deleted
    templates = ec2.describe_launch_templates()["LaunchTemplates"]
    assert not [t for t in templates if t["LaunchTemplateName"].startswith(f"dinrec-{job_id}")]  # cleaned up
    script = next(iter(player.scripts.values()))
    assert "--resume auto" in script and f"s3://{BUCKET}/{prefix}/checkpoints" in script
    instances = [i for r in ec2.describe_instances(Filters=[{"Name": "tag:dinrec:job", "Values": [job_id]}])
                 ["Reservations"] for i in r["Instances"]]
    assert len(instances) == 2 and all(i["InstanceLifecycle"] == "spot" for i in instances)
    assert all(i["State"]["Name"] == "terminated" for i in instances)  # nothing left running (or billing)
