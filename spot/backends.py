"""Where an attempt runs: EC2 spot (create_fleet), SageMaker managed spot training, or this machine.

Each backend launches one attempt, reports whether it is still alive, and terminates it. They
do not decide anything — the supervisor does; they only translate to one API.
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import subprocess
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from dinrec.spot.aws import Aws
from dinrec.spot.catalog import InstanceType
from dinrec.spot.job import Attempt, JobSpec, Outcome, boot_script, launch_args
from dinrec.spot.job_role import JobRole
from dinrec.spot.settings import SpotSettings
from dinrec.spot.signing import job_key
from dinrec.storage import CloudError, call

JOB_TAG = "dinrec:job"
PROFILE_NOT_READY = "InstanceProfileNotReady"  # a new IAM profile EC2 does not see yet: retried like no capacity


@dataclass(frozen=True)
class Launched:
    backend_id: str
    instance_type: str
    zone: str | None
    market: str = "spot"


@dataclass(frozen=True)
class Liveness:
    alive: bool
    reason: str | None = None  # why it ended, as the backend says it
    spot_reclaimed: bool = False
    billable_s: float | None = None
    final_status: Outcome | None = None  # backends that know the job's outcome themselves (SageMaker)


class Backend(ABC):
    @abstractmethod
    def launch(self, spec: JobSpec, attempt: int, types: list[InstanceType], avoid_zone: str | None) -> Launched: ...

    @abstractmethod
    def poll(self, attempt: Attempt) -> Liveness: ...

    @abstractmethod
    def terminate(self, attempt: Attempt) -> None: ...

    def cleanup(self, spec: JobSpec) -> None:  # noqa: B027 - most backends leave nothing behind
        """Remove what the job's launches left behind once the job has ended."""


def _tags(spec: JobSpec, attempt: int) -> list[dict]:
    return [{"Key": JOB_TAG, "Value": spec.job_id}, {"Key": "dinrec:attempt", "Value": str(attempt)},
            {"Key": "Name", "Value": f"dinrec-{spec.job_id}-{attempt}"}]


class Ec2Backend(Backend):
    """One instant fleet per attempt over the candidate types × subnets, price-capacity-optimized,
    from a launch template that requires IMDSv2 and terminates the instance when it powers off. The
    instances run as the job's own role (spot.job_role), which may write only that job's prefix."""

    def __init__(self, aws: Aws, settings: SpotSettings, results_master: bytes) -> None:
        if not settings.image_id:
            raise ValueError("the EC2 backend needs an AMI: set DINREC_SPOT_IMAGE_ID (one with the NVIDIA driver)")
        if not settings.instance_boundary_arn:
            raise ValueError("the EC2 backend gives each job its own instance role under a permissions boundary: "
                             "set DINREC_SPOT_INSTANCE_BOUNDARY_ARN (deploy/aws/instance-boundary.json)")
        self.aws, self.s, self.results_master = aws, settings, results_master
        self.ec2 = aws.client("ec2")
        self.role = JobRole(aws.client("iam"), settings.instance_boundary_arn)

    def _subnets(self, avoid_zone: str | None) -> list[tuple[str | None, str | None]]:
        if not self.s.subnet_ids:
            return [(None, None)]
        resp = call("ec2.describe_subnets", self.ec2.describe_subnets, SubnetIds=self.s.subnet_ids)
        zones = [(s["SubnetId"], s["AvailabilityZone"]) for s in resp["Subnets"]]
        preferred = [z for z in zones if z[1] != avoid_zone]
        return preferred or zones  # other zones first after an interruption; the same one if it is all we have

    def launch(self, spec: JobSpec, attempt: int, types: list[InstanceType], avoid_zone: str | None) -> Launched:
        user_data = boot_script(spec, attempt, endpoint_url=self.s.endpoint_url,
                                job_key=job_key(self.results_master, spec.job_id))
        data: dict = {
            "ImageId": self.s.image_id,
            "UserData": base64.b64encode(user_data.encode()).decode(),
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled", "HttpPutResponseHopLimit": 2},
            "InstanceInitiatedShutdownBehavior": "terminate",
            "IamInstanceProfile": {"Arn": self.role.ensure(spec.job_id, spec.job_uri)},
            "TagSpecifications": [{"ResourceType": "instance", "Tags": _tags(spec, attempt)},
                                  {"ResourceType": "volume", "Tags": _tags(spec, attempt)}],
        }
        if self.s.key_name:
            data["KeyName"] = self.s.key_name
        if self.s.security_group_ids:
            data["SecurityGroupIds"] = self.s.security_group_ids
        name = f"dinrec-{spec.job_id}-{attempt}"
        template = call("ec2.create_launch_template", self.ec2.create_launch_template, LaunchTemplateName=name,
                        LaunchTemplateData=data,
                        TagSpecifications=[{"ResourceType": "launch-template", "Tags": _tags(spec, attempt)}])
        template_id = template["LaunchTemplate"]["LaunchTemplateId"]
        overrides = []
        for priority, itype in enumerate(types):
            for subnet, _zone in self._subnets(avoid_zone):
                o: dict = {"InstanceType": itype.name, "Priority": float(priority)}
                if subnet:
                    o["SubnetId"] = subnet
                overrides.append(o)
        resp = call("ec2.create_fleet", self.ec2.create_fleet, Type="instant",
                    LaunchTemplateConfigs=[{"LaunchTemplateSpecification": {"LaunchTemplateId": template_id,
                                                                            "Version": "$Latest"},
                                            "Overrides": overrides}],
                    TargetCapacitySpecification={"TotalTargetCapacity": 1, "DefaultTargetCapacityType": "spot"},
                    SpotOptions={"AllocationStrategy": "price-capacity-optimized"},
                    TagSpecifications=[{"ResourceType": "fleet", "Tags": _tags(spec, attempt)}])
        launched = [i for i in resp.get("Instances", []) if i.get("InstanceIds")]
        if not launched:
            errors = "; ".join(f"{e.get('ErrorCode')}: {e.get('ErrorMessage')}" for e in resp.get("Errors", []))
            if "instance profile" in errors.lower() or "iaminstanceprofile" in errors.lower():
                # IAM is eventually consistent: EC2 may not see a profile made seconds ago
                raise CloudError(f"the job's instance profile is not visible to EC2 yet: {errors}", PROFILE_NOT_READY)
            raise CloudError(f"no spot capacity for {[t.name for t in types]}: {errors or 'no instance launched'}",
                             "InsufficientInstanceCapacity")
        instance_id = launched[0]["InstanceIds"][0]
        desc = call("ec2.describe_instances", self.ec2.describe_instances, InstanceIds=[instance_id])
        inst = desc["Reservations"][0]["Instances"][0]
        return Launched(instance_id, inst["InstanceType"], inst.get("Placement", {}).get("AvailabilityZone"),
                        "spot" if inst.get("InstanceLifecycle") == "spot" else "on-demand")

    def poll(self, attempt: Attempt) -> Liveness:
        resp = call("ec2.describe_instances", self.ec2.describe_instances, InstanceIds=[attempt.backend_id])
        inst = resp["Reservations"][0]["Instances"][0]
        state = inst["State"]["Name"]
        if state in ("pending", "running"):
            return Liveness(alive=True)
        reason = inst.get("StateReason", {}).get("Code") or state
        return Liveness(alive=False, reason=reason, spot_reclaimed="Spot" in reason)

    def terminate(self, attempt: Attempt) -> None:
        call("ec2.terminate_instances", self.ec2.terminate_instances, InstanceIds=[attempt.backend_id])

    def cleanup(self, spec: JobSpec) -> None:
        """Delete the job's launch templates (one per attempt; a region holds at most 5,000) and its role."""
        resp = call("ec2.describe_launch_templates", self.ec2.describe_launch_templates,
                    Filters=[{"Name": f"tag:{JOB_TAG}", "Values": [spec.job_id]}])
        for template in resp.get("LaunchTemplates", []):
            call("ec2.delete_launch_template", self.ec2.delete_launch_template,
                 LaunchTemplateId=template["LaunchTemplateId"])
        self.role.delete(spec.job_id)


class SageMakerBackend(Backend):
    """SageMaker managed spot training: SageMaker itself waits for capacity and restarts after an
    interruption (up to MaxWaitTimeInSeconds), syncing /opt/ml/checkpoints with the job's S3
    checkpoints; the supervisor watches one training job per attempt."""

    CHECKPOINT_PATH = "/opt/ml/checkpoints"

    def __init__(self, aws: Aws, settings: SpotSettings, max_run_s: int = 24 * 3600, max_wait_s: int = 48 * 3600):
        if not settings.sagemaker_role_arn or not settings.sagemaker_image_uri:
            raise ValueError("the SageMaker backend needs DINREC_SPOT_SAGEMAKER_ROLE_ARN and _SAGEMAKER_IMAGE_URI")
        self.aws, self.s, self.max_run_s, self.max_wait_s = aws, settings, max_run_s, max_wait_s
        self.sm = aws.client("sagemaker")

    def launch(self, spec: JobSpec, attempt: int, types: list[InstanceType], avoid_zone: str | None) -> Launched:
        itype = types[0]
        name = f"dinrec-{spec.job_id}-{attempt}"[:63]
        job = spec.job_uri.rstrip("/")
        call("sagemaker.create_training_job", self.sm.create_training_job, TrainingJobName=name,
             AlgorithmSpecification={"TrainingImage": self.s.sagemaker_image_uri, "TrainingInputMode": "File",
                                     "ContainerEntrypoint": ["dinrec", "train"],
                                     "ContainerArguments": ["--data", "/opt/ml/input/data/train",
                                                            "--out", "/opt/ml/model",
                                                            "--checkpoint-dir", self.CHECKPOINT_PATH,
                                                            "--resume", "auto", "--no-progress",
                                                            *launch_args(spec), *spec.train_args]},
             RoleArn=self.s.sagemaker_role_arn,
             InputDataConfig=[{"ChannelName": "train", "DataSource": {"S3DataSource": {
                 "S3DataType": "S3Prefix", "S3Uri": f"{job}/data/", "S3DataDistributionType": "FullyReplicated"}}}],
             OutputDataConfig={"S3OutputPath": f"{job}/results/"},
             ResourceConfig={"InstanceType": f"ml.{itype.name}", "InstanceCount": 1, "VolumeSizeInGB": 100},
             StoppingCondition={"MaxRuntimeInSeconds": self.max_run_s, "MaxWaitTimeInSeconds": self.max_wait_s},
             EnableManagedSpotTraining=True,
             CheckpointConfig={"S3Uri": f"{job}/checkpoints/", "LocalPath": self.CHECKPOINT_PATH},
             Tags=_tags(spec, attempt))
        return Launched(name, itype.name, None)

    def poll(self, attempt: Attempt) -> Liveness:
        d = call("sagemaker.describe_training_job", self.sm.describe_training_job, TrainingJobName=attempt.backend_id)
        status = d["TrainingJobStatus"]
        if status in ("InProgress", "Stopping"):
            return Liveness(alive=True)
        finals: dict[str, Outcome] = {"Completed": "done", "Failed": "failed", "Stopped": "cancelled"}
        final = finals.get(status, "failed")
        billable = d.get("BillableTimeInSeconds")
        return Liveness(alive=False, reason=d.get("FailureReason") or status, final_status=final,
                        billable_s=float(billable) if billable is not None else None)

    def terminate(self, attempt: Attempt) -> None:
        try:
            call("sagemaker.stop_training_job", self.sm.stop_training_job, TrainingJobName=attempt.backend_id)
        except CloudError as exc:
            if exc.code != "ValidationException":  # already finished
                raise


class LocalBackend(Backend):
    """Runs each attempt's boot script on this machine (the embedded default: no AWS needed).
    ``imds_urls`` (one per attempt, the last reused) lets a rehearsal point attempts at a metadata
    mock that announces an interruption; without one the agent does not watch."""

    def __init__(self, workdir: Path, imds_urls: list[str] | None = None, results_master: bytes | None = None):
        self.workdir, self.imds_urls, self.results_master = Path(workdir), imds_urls or [], results_master
        self._procs: dict[int, subprocess.Popen] = {}

    def launch(self, spec: JobSpec, attempt: int, types: list[InstanceType], avoid_zone: str | None) -> Launched:
        run = self.workdir / spec.job_id / f"attempt-{attempt}"
        run.mkdir(parents=True, exist_ok=True)
        script = run / "boot.sh"
        key = job_key(self.results_master, spec.job_id) if self.results_master else None
        script.write_text(boot_script(spec, attempt, job_key=key))
        env = {**os.environ, "DINREC_SPOT_WORKDIR": str(run), "DINREC_SPOT_SHUTDOWN_CMD": "true",
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}  # this dinrec
        if self.imds_urls:
            env["DINREC_SPOT_IMDS_URL"] = self.imds_urls[min(attempt - 1, len(self.imds_urls) - 1)]
        else:
            env["DINREC_SPOT_IMDS_URL"] = "none"
        with (run / "log.txt").open("ab") as log:
            proc = subprocess.Popen(["bash", str(script)], env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self._procs[proc.pid] = proc
        return Launched(str(proc.pid), types[0].name, "local")

    def poll(self, attempt: Attempt) -> Liveness:
        pid = int(attempt.backend_id)
        proc = self._procs.get(pid)
        if proc is not None:
            code = proc.poll()
            return Liveness(alive=True) if code is None else Liveness(alive=False, reason=f"exit {code}")
        try:  # a restarted supervisor: only the pid is known
            os.kill(pid, 0)
            return Liveness(alive=True)
        except ProcessLookupError:
            return Liveness(alive=False, reason="process gone")

    def terminate(self, attempt: Attempt) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(attempt.backend_id), signal.SIGTERM)
