"""Spot jobs assembled from settings: the job store, the backend, a new job, a job's supervisor (the
spot CLI and `dinrec retrain --spot` both build them here)."""

from __future__ import annotations

from pathlib import Path

from dinrec.spot.jobstore import open_job_store


def aws_for(settings):
    from dinrec.spot.aws import Aws

    return Aws(settings.region, settings.endpoint_url)


def job_store(settings, job_id: str):

    root = settings.state_uri if settings.state_uri.startswith("s3://") else str(Path(settings.state_uri).expanduser())
    if settings.backend != "local" and not root.startswith("s3://"):
        raise ValueError(f"the {settings.backend} backend needs DINREC_SPOT_STATE_URI=s3://bucket/prefix "
                         "(instances keep checkpoints and state there)")
    return open_job_store(f"{root.rstrip('/')}/jobs/{job_id}", aws_for(settings))


def results_master(settings) -> bytes:
    """The master key the jobs' result keys derive from (spot.signing)."""
    from dinrec.spot.signing import master_key

    return master_key(settings.results_key.get_secret_value() if settings.results_key else None)


def backend_for(name: str, settings, imds_urls: list[str] | None):
    from dinrec.spot.backends import Ec2Backend, LocalBackend, SageMakerBackend

    if name == "ec2":
        return Ec2Backend(aws_for(settings), settings, results_master(settings))
    if name == "sagemaker":
        return SageMakerBackend(aws_for(settings), settings)
    if name == "local":
        return LocalBackend(Path(settings.workdir).expanduser(), imds_urls, results_master(settings))
    raise ValueError(f"unknown backend {name!r}: ec2, sagemaker or local")


def load_spec(store, job_id: str):
    from dinrec.spot.job import JobSpec
    from dinrec.spot.supervisor import SPEC

    doc = store.get_json(SPEC)
    if doc is None:
        raise ValueError(f"no job {job_id!r} under {store.uri}")
    return JobSpec.model_validate(doc)


def same_rank_count(instance_types: list[str], ranks: str) -> None:
    """A job resumes only on as many ranks as it checkpointed with: with one rank per GPU, every
    candidate type must have the same GPU count (else an interruption could strand the job)."""
    from dinrec.spot.catalog import load_catalog

    if ranks != "gpus":
        return
    gpus = {t.name: t.gpus for t in load_catalog() if t.name in instance_types}
    if len(set(gpus.values())) > 1:
        raise ValueError(f"candidate instance types with different GPU counts ({gpus}): a job resumes on as many "
                         "ranks as it started with, so give types with one GPU count (or a fixed --ranks)")


def create_job(settings, data: Path, instance_types: list[str], train_args: list[str], *,
               budget_usd: float | None = None, max_relaunches: int | None = None, ranks: str = "gpus",
               embeddings: str | None = None):
    """A new job: its spec and data in the job store (what `dinrec retrain --spot` also calls)."""
    from dinrec.spot.job import JobSpec, new_job_id
    from dinrec.spot.supervisor import SPEC
    from dinrec.storage import file_sha256

    same_rank_count(instance_types, ranks)
    wheel = settings.wheel.expanduser() if settings.wheel is not None else None
    if wheel is not None and not (wheel.is_file() and wheel.suffix == ".whl"):
        raise ValueError(f"DINREC_SPOT_WHEEL={settings.wheel}: not a wheel file")
    if wheel is None and settings.backend == "ec2" and "install" not in settings.model_fields_set:
        raise ValueError("say what an instance installs: DINREC_SPOT_WHEEL (a dinrec wheel, installed by its hash) "
                         "or DINREC_SPOT_INSTALL (your own pinned line); an instance does not install whatever the "
                         "public index serves as 'dinrec'")
    job_id = new_job_id()
    store = job_store(settings, job_id)
    install = settings.install
    if settings.backend == "local":
        install = "true"  # this dinrec: the wheel's hash is still checked
    elif wheel is not None:
        install = f'pip install "$WORK/{wheel.name}[gpu]"'
    spec = JobSpec(job_id=job_id, job_uri=store.uri, backend=settings.backend, instance_types=instance_types,
                   train_args=train_args, ranks=ranks, embeddings=embeddings,
                   max_relaunches=settings.max_relaunches if max_relaunches is None else max_relaunches,
                   budget_usd=budget_usd or settings.budget_usd, region=settings.region, install=install,
                   wheel=wheel.name if wheel else None, wheel_sha256=file_sha256(wheel) if wheel else None)
    if wheel is not None:
        store.put_bytes(f"dist/{wheel.name}", wheel.read_bytes())
    store.upload_dir(data, "data")
    store.put_json(SPEC, spec.model_dump(mode="json"))
    return store, spec


def job_supervisor(settings, job_id: str, imds_url: list[str] | None = None):
    """(store, spec, supervisor) of an existing job, ready to start or run to the end."""
    from dinrec.spot.aws import live_spot_prices
    from dinrec.spot.catalog import load_catalog
    from dinrec.spot.supervisor import Supervisor

    store = job_store(settings, job_id)
    spec = load_spec(store, job_id)
    prices = {}
    if settings.live_prices and spec.backend == "ec2":  # an EC2 job needs working AWS access anyway: errors stop it
        prices = live_spot_prices(aws_for(settings), spec.instance_types)
    supervisor = Supervisor(store, spec, backend_for(spec.backend, settings, imds_url),
                            {t.name: t for t in load_catalog()}, prices, poll_s=settings.poll_s,
                            lease_s=settings.lease_s)
    return store, spec, supervisor
