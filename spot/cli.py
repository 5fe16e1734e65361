"""`dinrec plan` and `dinrec spot …`: choose an instance, run a training job on spot, report its cost."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, cast

import typer

from dinrec.spot.wiring import aws_for, backend_for, create_job, job_store, job_supervisor, load_spec


def _duration(hours: float) -> str:
    if hours < 1 / 60:
        return f"{hours * 3600:.0f} s"
    return f"{hours * 60:.1f} min" if hours < 1 else f"{hours:.1f} h"


def _usd(x: float) -> str:
    return f"{x:.2f}" if x >= 0.01 else "<0.01"


def _table(options: list, workload) -> str:
    head = f"{'#':>2}  {'instance':<14} {'GPU':<14} {'tables':<10} {'fits':<4}  {'GB/GPU':>6}  {'bound':<12} " \
           f"{'est. time':>9} {'spot $':>9} {'on-dem. $':>10}  note"
    lines = [f"{workload.name}: embedding tables {workload.table_bytes / 1e6:,.1f} MB "
             f"({workload.n_items:,} item rows), {workload.train_samples:,} samples × {workload.epochs} epochs", head]
    for o in options:
        if not o.fits:
            note = o.why_not or ""
        elif o.recommended:
            note = "← recommended"
        else:  # the verdict clause of the planner's note ("ruled out: …", "1.5× faster … for 15× the cost")
            note = o.note.split(";")[0] if ";" in o.note else ""
        gpus, fits = f"{o.gpus}× {o.gpu}", "yes" if o.fits else "no"
        lines.append(f"{o.rank or '-':>2}  {o.instance:<14} {gpus:<14} {o.embeddings:<10} {fits:<4}  "
                     f"{o.gpu_mem_gb:>6.1f}  {o.bound:<12} "
                     f"{_duration(o.est_hours):>9} {_usd(o.spot_usd):>9} {_usd(o.on_demand_usd):>10}  {note}")
    return "\n".join(lines)


def _read_workload(path: Path):
    from pydantic import ValidationError

    from dinrec.spot.planner import Workload

    try:
        return Workload.model_validate_json(path.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc
    except ValidationError as exc:
        raise ValueError(f"{path}: {exc}") from exc


def _spot_prices(settings, instance_types: list[str]) -> dict[str, float]:
    """Live spot prices, or {} (the catalog's fallbacks apply) with a warning when EC2 cannot answer."""
    from dinrec.spot.aws import live_spot_prices
    from dinrec.storage import CloudError

    try:
        return live_spot_prices(aws_for(settings), instance_types)
    except CloudError as exc:
        typer.echo(f"warning: live spot prices unavailable ({exc}); using the catalog's", err=True)
        return {}


def plan(
    config: Annotated[Path, typer.Option(help="JSON workload: n_items, train_samples, dims, layers, batch, epochs")],
    prices: Annotated[Path | None, typer.Option(help="JSON price overrides per instance type")] = None,
    calibrate: Annotated[Path | None, typer.Option(help="a `dinrec bench train --json` result from a GPU")] = None,
    max_hours: Annotated[float | None, typer.Option(help="rule out options slower than this")] = None,
    live_prices: Annotated[bool | None, typer.Option(help="ask EC2 for current spot prices")] = None,
    instance: Annotated[list[str] | None, typer.Option(help="only these instance types (repeatable)")] = None,
    embeddings: Annotated[list[str] | None, typer.Option(
        help="table placement to plan: replicated (DDP) or sharded (TorchRec), repeatable; default both")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="a ranked JSON list instead of a table")] = False,
) -> None:
    """Rank GPU instances for a DIN training job: fits?, bound by what, hours, spot and on-demand cost."""
    from dinrec.spot.catalog import load_catalog
    from dinrec.spot.planner import Efficiency, Embeddings
    from dinrec.spot.planner import calibrate as fit
    from dinrec.spot.planner import plan as make_plan
    from dinrec.spot.settings import SpotSettings

    settings = SpotSettings()
    workload = _read_workload(config)
    catalog = load_catalog(prices, only=instance)
    efficiency = Efficiency()
    if calibrate is not None:
        try:
            efficiency = fit(json.loads(calibrate.read_text()), catalog)
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read {calibrate}: {exc}") from exc
    use_live = live_prices if live_prices is not None else settings.live_prices
    spot_prices = _spot_prices(settings, [t.name for t in catalog]) if use_live else {}
    modes = tuple(embeddings or ("replicated", "sharded"))
    if not set(modes) <= {"replicated", "sharded"}:
        raise ValueError(f"--embeddings must be replicated or sharded, got {', '.join(modes)}")
    options = make_plan(workload, catalog, spot_prices=spot_prices, efficiency=efficiency, max_hours=max_hours,
                        embeddings=cast(tuple[Embeddings, ...], modes))  # their values checked above
    if as_json:
        typer.echo(json.dumps({"workload": workload.model_dump(mode="json"), "efficiency": efficiency.model_dump(),
                               "options": [o.to_json() for o in options]}))
    else:
        typer.echo(_table(options, workload))


spot_app = typer.Typer(help="Training jobs on spot GPUs: launch, supervise, watch, cancel, cost.",
                       no_args_is_help=True)


def _types_from_plan(plan_file: Path, catalog, top: int = 3) -> tuple[list[str], str]:
    """The plan's best fitting option decides how the job runs (its tables' placement, one rank per GPU);
    its candidates are the next best options that run the same way on as many GPUs (a relaunch resumes
    the same checkpoint)."""
    from dinrec.spot.planner import plan as make_plan

    fitting = [o for o in make_plan(_read_workload(plan_file), catalog) if o.fits]
    if not fitting:
        raise ValueError(f"{plan_file}: no instance in the catalog fits this job (see `dinrec plan`)")
    best = fitting[0]
    alike = [o.instance for o in fitting if o.embeddings == best.embeddings and o.gpus == best.gpus]
    return list(dict.fromkeys(alike))[:top], best.embeddings


@spot_app.command("run")
def spot_run(
    data: Annotated[Path | None, typer.Option(help="dataset folder (uploaded to the job); new jobs only")] = None,
    job_id: Annotated[str | None, typer.Option(help="continue this job instead of creating one")] = None,
    instance_type: Annotated[list[str] | None, typer.Option(help="candidate types, best first (repeatable)")] = None,
    plan_config: Annotated[Path | None, typer.Option("--plan", help="take the candidates from `dinrec plan`")] = None,
    backend: Annotated[str | None, typer.Option(help="ec2, sagemaker or local")] = None,
    train_args: Annotated[str, typer.Option(help="extra `dinrec train` flags, e.g. '--epochs 3'")] = "",
    budget_usd: Annotated[float | None, typer.Option(help="stop relaunching past this spend")] = None,
    max_relaunches: Annotated[int | None, typer.Option(help="stop after this many relaunches")] = None,
    imds_url: Annotated[list[str] | None, typer.Option(help="local backend: metadata endpoint per attempt")] = None,
    detach: Annotated[bool, typer.Option(help="launch the first attempt and return (supervise later)")] = False,
    ranks: Annotated[str, typer.Option(help="training processes per instance: gpus (one per GPU) or a count")] \
        = "gpus",
    embeddings: Annotated[str | None, typer.Option(help=(
        "DIN's tables: replicated or sharded (default: the plan's choice with --plan, else the trainer's)"))] = None,
) -> None:
    """Create (or continue) a spot training job and supervise it to the end; prints its cost report."""
    import shlex

    from dinrec.spot.catalog import load_catalog
    from dinrec.spot.settings import SpotSettings
    from dinrec.spot.supervisor import cost_report

    settings = SpotSettings(backend=backend) if backend else SpotSettings()
    if job_id is None:
        if data is None or not data.is_dir():
            raise ValueError("a new job needs --data DIR (an existing dataset folder)")
        types = instance_type
        if not types and plan_config:
            types, planned = _types_from_plan(plan_config, load_catalog())
            embeddings = embeddings or planned
        if not types:
            raise ValueError("say where to run: --instance-type T (repeatable) or --plan JOB.json")
        store, spec = create_job(settings, data, list(types), shlex.split(train_args), budget_usd=budget_usd,
                                 max_relaunches=max_relaunches, ranks=ranks, embeddings=embeddings)
        typer.echo(json.dumps({"job_id": spec.job_id, "job_uri": store.uri}), err=True)
        job_id = spec.job_id
    from dinrec.storage import LeaseHeld

    store, spec, supervisor = job_supervisor(settings, job_id, imds_url)
    try:
        if detach:
            typer.echo(json.dumps({"job_id": job_id, "status": supervisor.start().status}))
            return
        state = supervisor.run()
    except LeaseHeld as exc:  # another supervisor has the job: it keeps it, this one does nothing
        typer.echo(json.dumps({"job_id": job_id, "status": "supervised elsewhere", "reason": str(exc),
                               "holder": exc.holder}))
        raise typer.Exit(4) from None
    typer.echo(json.dumps(cost_report(spec, state)))
    if state.status != "done":
        raise typer.Exit(1)


@spot_app.command("launch")
def spot_launch(
    data: Annotated[Path, typer.Option(help="dataset folder (uploaded to the job)")],
    instance_type: Annotated[list[str] | None, typer.Option(help="candidate types, best first (repeatable)")] = None,
    plan_config: Annotated[Path | None, typer.Option("--plan", help="take the candidates from `dinrec plan`")] = None,
    backend: Annotated[str | None, typer.Option(help="ec2, sagemaker or local")] = None,
    train_args: Annotated[str, typer.Option(help="extra `dinrec train` flags, e.g. '--epochs 3'")] = "",
    budget_usd: Annotated[float | None, typer.Option(help="stop relaunching past this spend")] = None,
    ranks: Annotated[str, typer.Option(help="training processes per instance: gpus (one per GPU) or a count")] \
        = "gpus",
    embeddings: Annotated[str | None, typer.Option(help=(
        "DIN's tables: replicated or sharded (default: the plan's choice with --plan, else the trainer's)"))] = None,
) -> None:
    """Create a job and launch its first attempt without supervising it (`dinrec spot run --job-id` does)."""
    spot_run(data=data, job_id=None, instance_type=instance_type, plan_config=plan_config, backend=backend,
             train_args=train_args, budget_usd=budget_usd, max_relaunches=None, imds_url=None, detach=True,
             ranks=ranks, embeddings=embeddings)


@spot_app.command("status")
def spot_status(job_id: Annotated[str, typer.Option(help="the job")]) -> None:
    """The job's state, attempts and cost so far (JSON)."""
    from dinrec.spot.settings import SpotSettings
    from dinrec.spot.supervisor import cost_report, load_state

    store = job_store(SpotSettings(), job_id)
    spec = load_spec(store, job_id)
    state = load_state(store)
    typer.echo(json.dumps({**cost_report(spec, state),
                           "attempt_list": [a.model_dump(mode="json") for a in state.attempts]}))


@spot_app.command("cancel")
def spot_cancel(job_id: Annotated[str, typer.Option(help="the job")]) -> None:
    """Stop the job: a running supervisor stops at its next poll; the current attempt is terminated."""
    from dinrec.spot.catalog import load_catalog
    from dinrec.spot.settings import SpotSettings
    from dinrec.spot.supervisor import Supervisor

    settings = SpotSettings()
    store = job_store(settings, job_id)
    spec = load_spec(store, job_id)
    supervisor = Supervisor(store, spec, backend_for(spec.backend, settings, None),
                            {t.name: t for t in load_catalog()})
    typer.echo(json.dumps({"job_id": job_id, "status": supervisor.cancel().status}))


@spot_app.command("agent", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def spot_agent(
    ctx: typer.Context,
    job_uri: Annotated[str, typer.Option(help="the job's store (s3://… or a folder)")],
    attempt: Annotated[int, typer.Option(help="attempt number")],
    data_dir: Annotated[Path | None, typer.Option(help="fetch the job's data/ here first")] = None,
    results: Annotated[Path | None, typer.Option(help="upload this folder to results/ when done")] = None,
) -> None:
    """On the instance: run the command after `--` (dinrec train …) under the interruption watcher."""
    import sys

    from dinrec.spot.agent import fetch_data, run_agent
    from dinrec.spot.imds import Imds
    from dinrec.spot.jobstore import open_job_store
    from dinrec.spot.settings import SpotSettings

    command = [a for a in ctx.args if a != "--"]
    if not command:
        raise ValueError("give the command to run after `--`, e.g. -- dinrec train --data …")
    settings = SpotSettings()
    store = open_job_store(job_uri, aws_for(settings))
    if data_dir is not None and not (data_dir.exists() and any(data_dir.iterdir())):
        fetch_data(store, "data", data_dir)
    imds = None if settings.imds_url == "none" else Imds(settings.imds_url)
    sys.exit(run_agent(store, attempt, command, imds=imds, results=results, poll_s=settings.imds_poll_s))
