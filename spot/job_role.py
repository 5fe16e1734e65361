"""One IAM role per spot job: its instances may read that job's prefix and write only what an
attempt of that job produces, so an instance (or whoever took it over) cannot plant files under
another job's checkpoints or results.

The role is created under a permissions boundary the operator made once
(``deploy/aws/instance-boundary.json``: every job's prefix at most), which is also the condition on
which the supervisor's policy lets it create roles at all — a supervisor cannot mint a role wider
than the boundary. The role and its instance profile are deleted when the job ends.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from dinrec.storage import CloudError, call

__all__ = ["JobRole", "job_policy", "role_name"]

ROLE_PATH = "/dinrec/"
POLICY_NAME = "this-job-only"
TRUST = {"Version": "2012-10-17", "Statement": [{
    "Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}


def role_name(job_id: str) -> str:
    return f"dinrec-job-{job_id}"[:64]  # IAM's limit; job ids are at most 63 characters


def _bucket_and_key(job_uri: str) -> tuple[str, str]:
    if not job_uri.startswith("s3://"):
        raise ValueError(f"a job role scopes an S3 prefix, not {job_uri!r}")
    bucket, _, key = job_uri[len("s3://"):].rstrip("/").partition("/")
    if not bucket or not key:
        raise ValueError(f"a job's S3 URI names a bucket and a prefix: {job_uri!r}")
    return bucket, key


def job_policy(job_uri: str) -> dict[str, Any]:
    """What one job's instances may do: read the job (spec, data, wheel, checkpoints) and write its
    attempts' status, checkpoints, results and their signature — nothing of any other job."""
    bucket, job = _bucket_and_key(job_uri)
    obj = f"arn:aws:s3:::{bucket}/{job}"
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "ReadThisJob", "Effect": "Allow", "Action": ["s3:GetObject"], "Resource": f"{obj}/*"},
        {"Sid": "WriteWhatAnAttemptOfThisJobProduces", "Effect": "Allow",
         "Action": ["s3:PutObject", "s3:DeleteObject"],
         "Resource": [f"{obj}/attempts/*", f"{obj}/checkpoints/*", f"{obj}/results/*", f"{obj}/results.sig.json"]},
        {"Sid": "ListThisJob", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": f"arn:aws:s3:::{bucket}",
         "Condition": {"StringLike": {"s3:prefix": f"{job}/*"}}},
    ]}


class JobRole:
    """Creates (idempotently: a restarted supervisor finds the role it made) and deletes one job's
    role and instance profile."""

    def __init__(self, iam: Any, boundary_arn: str) -> None:
        self.iam, self.boundary_arn = iam, boundary_arn

    def ensure(self, job_id: str, job_uri: str) -> str:
        """The ARN of the job's instance profile, its role holding only :func:`job_policy`."""
        name = role_name(job_id)
        tags = [{"Key": "dinrec:job", "Value": job_id}]
        try:
            call("iam.create_role", self.iam.create_role, RoleName=name, Path=ROLE_PATH,
                 AssumeRolePolicyDocument=json.dumps(TRUST), PermissionsBoundary=self.boundary_arn, Tags=tags,
                 Description=f"dinrec spot job {job_id}: its own S3 prefix only")
        except CloudError as exc:
            if exc.code != "EntityAlreadyExists":
                raise
        # put_role_policy replaces: the role holds exactly this job's policy even if it existed
        call("iam.put_role_policy", self.iam.put_role_policy, RoleName=name, PolicyName=POLICY_NAME,
             PolicyDocument=json.dumps(job_policy(job_uri)))
        try:
            profile = call("iam.create_instance_profile", self.iam.create_instance_profile,
                           InstanceProfileName=name, Path=ROLE_PATH, Tags=tags)["InstanceProfile"]
        except CloudError as exc:
            if exc.code != "EntityAlreadyExists":
                raise
            profile = call("iam.get_instance_profile", self.iam.get_instance_profile,
                           InstanceProfileName=name)["InstanceProfile"]
        if not any(r["RoleName"] == name for r in profile.get("Roles", [])):
            call("iam.add_role_to_instance_profile", self.iam.add_role_to_instance_profile,
                 InstanceProfileName=name, RoleName=name)
        return profile["Arn"]

    def delete(self, job_id: str) -> None:
        """Remove the job's profile and role; what is already gone is skipped."""
        name = role_name(job_id)
        with _unless_gone():
            call("iam.remove_role_from_instance_profile", self.iam.remove_role_from_instance_profile,
                 InstanceProfileName=name, RoleName=name)
        with _unless_gone():
            call("iam.delete_instance_profile", self.iam.delete_instance_profile, InstanceProfileName=name)
        with _unless_gone():
            call("iam.delete_role_policy", self.iam.delete_role_policy, RoleName=name, PolicyName=POLICY_NAME)
        with _unless_gone():
            call("iam.delete_role", self.iam.delete_role, RoleName=name)


@contextlib.contextmanager
def _unless_gone() -> Iterator[None]:
    try:
        yield
    except CloudError as exc:
        if exc.code != "NoSuchEntity":
            raise
