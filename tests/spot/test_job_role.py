"""Each spot job's instances run as that job's own role: with IAM enforced (a moto server of its own,
checking every S3 call against the caller's policies), a job's credentials write that job's results
and checkpoints and are refused another job's — where one shared instance role (tried first, as it
was) let any job's instance plant another's candidate."""

import fnmatch
import json
import shutil
import sys
import urllib.request
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError

from tests.conftest import REPO, _spawn_server, free_port

BUCKET, PREFIX = "dinrec-jobs", "spot"


@pytest.fixture
def enforcing_moto(tmp_path):
    """A moto server this test alone talks to, so switching IAM enforcement on touches no other test."""
    exe = shutil.which("moto_server") or str(Path(sys.executable).parent / "moto_server")
    url = f"http://127.0.0.1:{free_port()}"
    proc, log = _spawn_server([exe, "-H", "127.0.0.1", "-p", url.rsplit(":", 1)[1]], tmp_path / "moto.log",
                              url + "/moto-api/", "moto_server", timeout_s=30)

    def enforce(on: bool) -> None:  # moto's switch: after N unchecked calls every call is checked (0 = now)
        body = b"0" if on else b"1000000000"
        with urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset-auth", data=body,
                                                           headers={"Content-Type": "text/plain"})) as resp:
            assert resp.status == 200

    yield url, enforce
    proc.terminate()
    proc.wait(timeout=10)
    log.close()


def _client(service, url, **creds):
    creds = creds or {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
    return boto3.client(service, endpoint_url=url, region_name="us-east-1", **creds)


def _boundary() -> str:
    return (REPO / "deploy" / "aws" / "instance-boundary.json").read_text().replace(
        "BUCKET", BUCKET).replace("PREFIX", PREFIX)


def test_a_jobs_instance_role_writes_only_its_own_job(enforcing_moto):
    from dinrec.spot.job_role import TRUST, JobRole, role_name

    url, enforce = enforcing_moto
    s3, iam, sts = _client("s3", url), _client("iam", url), _client("sts", url)
    s3.create_bucket(Bucket=BUCKET)
    boundary_arn = iam.create_policy(PolicyName="dinrec-instance-boundary", PolicyDocument=_boundary())["Policy"]["Arn"]
    roles = JobRole(iam, boundary_arn)
    profiles = {job: roles.ensure(job, f"s3://{BUCKET}/{PREFIX}/jobs/{job}") for job in ("job-a", "job-b")}
    assert roles.ensure("job-a", f"s3://{BUCKET}/{PREFIX}/jobs/job-a") == profiles["job-a"]  # a restarted supervisor
    role = iam.get_role(RoleName=role_name("job-a"))["Role"]
    assert role["PermissionsBoundary"]["PermissionsBoundaryArn"] == boundary_arn
    (profile,) = [p for p in iam.list_instance_profiles(PathPrefix="/dinrec/")["InstanceProfiles"]
                  if p["Arn"] == profiles["job-a"]]
    assert [r["RoleName"] for r in profile["Roles"]] == [role_name("job-a")]
    for job in ("job-a", "job-b"):
        s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/jobs/{job}/job.json", Body=b"{}")
    # before: one shared instance role (the boundary's rights) for every job's instances
    shared = iam.create_role(RoleName="dinrec-instance", AssumeRolePolicyDocument=json.dumps(TRUST))["Role"]
    iam.put_role_policy(RoleName="dinrec-instance", PolicyName="all-jobs", PolicyDocument=_boundary())
    creds = sts.assume_role(RoleArn=role["Arn"], RoleSessionName="i-0123")["Credentials"]  # what IMDS hands it
    shared_creds = sts.assume_role(RoleArn=shared["Arn"], RoleSessionName="i-0456")["Credentials"]

    enforce(True)
    try:
        as_shared = _client("s3", url, aws_access_key_id=shared_creds["AccessKeyId"],
                            aws_secret_access_key=shared_creds["SecretAccessKey"],
                            aws_session_token=shared_creds["SessionToken"])
        as_shared.put_object(Bucket=BUCKET, Key=f"{PREFIX}/jobs/job-b/results/metrics.json", Body=b"planted")
        as_a = _client("s3", url, aws_access_key_id=creds["AccessKeyId"],
                       aws_secret_access_key=creds["SecretAccessKey"], aws_session_token=creds["SessionToken"])
        for key in ("results/metrics.json", "results.sig.json", "checkpoints/step-10/sig", "attempts/1/status.json"):
            as_a.put_object(Bucket=BUCKET, Key=f"{PREFIX}/jobs/job-a/{key}", Body=b"mine")
        assert as_a.get_object(Bucket=BUCKET, Key=f"{PREFIX}/jobs/job-a/job.json")["Body"].read() == b"{}"
        refused = []
        for op, key in (("put", "results/metrics.json"), ("put", "results.sig.json"), ("put", "checkpoints/x/sig"),
                        ("put", "attempts/1/status.json"), ("get", "job.json")):
            try:
                if op == "put":
                    as_a.put_object(Bucket=BUCKET, Key=f"{PREFIX}/jobs/job-b/{key}", Body=b"planted")
                else:
                    as_a.get_object(Bucket=BUCKET, Key=f"{PREFIX}/jobs/job-b/{key}")
            except ClientError as exc:
                refused.append(exc.response["Error"]["Code"])
        assert refused == ["AccessDenied"] * 5
        with pytest.raises(ClientError, match="AccessDenied"):  # nor its own job's spec or data
            as_a.put_object(Bucket=BUCKET, Key=f"{PREFIX}/jobs/job-a/job.json", Body=b"changed")
    finally:
        enforce(False)

    roles.delete("job-a")
    roles.delete("job-a")  # what is already gone is skipped
    with pytest.raises(ClientError, match="NoSuchEntity"):
        iam.get_role(RoleName=role_name("job-a"))
    assert [p["InstanceProfileName"] for p in iam.list_instance_profiles(PathPrefix="/dinrec/")["InstanceProfiles"]] \
        == [role_name("job-b")]


def test_a_jobs_policy_stays_inside_the_boundary_the_operator_made():
    """The boundary caps every job role; a job policy asking for more would be silently cut by IAM."""
    from dinrec.spot.job_role import job_policy

    def listed(value):  # IAM allows one string or a list
        return [value] if isinstance(value, str) else value

    boundary = json.loads(_boundary())["Statement"]
    policy = job_policy(f"s3://{BUCKET}/{PREFIX}/jobs/job-a")["Statement"]
    for statement in policy:
        for action in listed(statement["Action"]):
            for resource in listed(statement["Resource"]):
                assert any(action in listed(b["Action"])
                           and any(fnmatch.fnmatchcase(resource, r) for r in listed(b["Resource"]))
                           for b in boundary), f"{action} on {resource} is outside the boundary"
    with pytest.raises(ValueError, match="S3"):
        job_policy("/var/jobs/job-a")
