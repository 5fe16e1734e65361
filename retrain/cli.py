"""`dinrec retrain`: retrain from the event archive; promote only through the gate.

Exit codes (what a scheduler alerts on): 0 promoted, or nothing new to train on; 1 the spot job
failed (no candidate; the champion keeps serving); 2 bad input or
configuration; 3 refused by the gate (the champion keeps serving; the report says why); 4 another
run holds the lock; 5 a gate drill's degraded candidate was NOT refused; 75 stopped by
SIGTERM/SIGINT (rerun: it resumes the same window).
The report is printed as one JSON object and kept in ``{work_dir}/runs/{run}/report.json`` and
``{work_dir}/latest.json``.

``--every 1h`` runs it on a fixed period in this process — the embedded scheduler for one machine;
cron and Kubernetes start one run per period instead (the Helm chart's CronJob, docs/deploying.md).
"""

from __future__ import annotations

import json
import logging
import re
import signal
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``1h``, ``1d`` → seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not m or float(m.group(1)) <= 0:
        raise typer.BadParameter(f"{text!r}: use a positive number of seconds, or e.g. 30m, 1h, 1d")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def parse_time(text: str) -> float:
    """Unix seconds, or an ISO-8601 time (UTC unless it says otherwise)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise typer.BadParameter(f"{text!r}: use unix seconds or an ISO-8601 time") from exc
    return when.timestamp() if when.tzinfo else when.replace(tzinfo=UTC).timestamp()


def retrain(
    until: Annotated[str | None, typer.Option(help="end of the data window (unix seconds or ISO-8601); default: "
                                                   "now, aligned down to DINREC_RETRAIN_ALIGN_S")] = None,
    every: Annotated[str | None, typer.Option(help="keep running: one run per period, e.g. 1h (embedded "
                                                   "scheduler)")] = None,
    rollout: Annotated[str | None, typer.Option(help="champion or challenger (through an A/B experiment)")] = None,
    registry: Annotated[str | None, typer.Option(help="model registry: a folder or s3://bucket/prefix")] = None,
    archive_dir: Annotated[str | None, typer.Option(help="the event archive: a folder or s3://bucket/prefix")] = None,
    work_dir: Annotated[Path | None, typer.Option(help="lock, per-window state and reports")] = None,
    spot: Annotated[bool, typer.Option("--spot", help="train the candidate as a spot job (DINREC_SPOT_*: backend, "
                                                      "state, …; DINREC_RETRAIN_SPOT_INSTANCE_TYPES)")] = False,
    drill: Annotated[str | None, typer.Option(help="gate drill: shuffled-labels or miscalibrated (a degraded "
                                                   "candidate that must be refused; it never ships)")] = None,
) -> None:
    """Retrain DIN and the recall towers on archived events, compare with the champion on the same
    recent holdout, promote only a model that is not worse; print the report as JSON."""
    from dinrec.retrain.job import EXIT_BAD_INPUT, EXIT_INTERRUPTED, RetrainJob
    from dinrec.retrain.settings import RetrainSettings
    from dinrec.training.settings import TrainSettings

    logging.getLogger().setLevel(logging.INFO)  # a service: say what it does
    overrides: dict[str, Any] = {k: v for k, v in {"rollout": rollout, "registry": registry, "archive_dir": archive_dir,
                                   "work_dir": work_dir}.items() if v is not None}
    end = parse_time(until) if until else None
    period = parse_duration(every) if every else None
    stop = threading.Event()

    def job() -> RetrainJob:  # a new one per period: the window moves with the clock
        return RetrainJob(settings, train_settings, until=end, stop=stop, drill=drill, spot=spot)

    try:  # settings, drill and spot are checked before any work (pydantic's errors are ValueErrors)
        settings, train_settings = RetrainSettings(**overrides), TrainSettings()
        current = job()
    except ValueError as exc:
        typer.echo(f"dinrec retrain: {exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while True:
        outcome = current.run()
        typer.echo(json.dumps(outcome.report, default=str))
        if period is None or stop.is_set():
            sys.exit(EXIT_INTERRUPTED if stop.is_set() else outcome.exit_code)
        stop.wait(period - time.time() % period)  # the next period boundary
        if stop.is_set():
            sys.exit(0)
        current = job()
