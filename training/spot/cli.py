"""`dinrec plan` and `dinrec spot …`: choose an instance, run a training job on spot, report its cost."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer


def _duration(hours: float) -> str:
    if hours < 1 / 60:
        return f"{hours * 3600:.0f} s"
    return f"{hours * 60:.1f} min" if hours < 1 else f"{hours:.1f} h"


def _usd(x: float) -> str:
    return f"{x:.2f}" if x >= 0.01 else "<0.01"


def _table(options: list, workload) -> str:
    head = f"{'#':>2}  {'instance':<14} {'GPU':<14} {'fits':<4}  {'bound':<12} {'est. time':>9} {'spot $':>9} " \
           f"{'on-dem. $':>10}  note"
    lines = [f"{workload.name}: embedding tables {workload.table_bytes / 1e6:,.1f} MB "
             f"({workload.n_items:,} item rows), {workload.train_samples:,} samples × {workload.epochs} epochs", head]
    for o in options:
        if o.recommended:
            note = "← recommended"
        elif not o.fits:
            note = o.why_not or ""
        elif o.dominated_by:
            note = f"dominated by {o.dominated_by} (faster and cheaper)"
        else:
            note = ""
        gpus, fits = f"{o.gpus}× {o.gpu}", "yes" if o.fits else "no"
        lines.append(f"{o.rank or '-':>2}  {o.instance:<14} {gpus:<14} {fits:<4}  {o.bound:<12} "
                     f"{_duration(o.est_hours):>9} {_usd(o.spot_usd):>9} {_usd(o.on_demand_usd):>10}  {note}")
    return "\n".join(lines)


def plan(
    config: Annotated[Path, typer.Option(help="JSON workload: n_items, train_samples, dims, layers, batch, epochs")],
    prices: Annotated[Path | None, typer.Option(help="JSON price overrides per instance type")] = None,
    calibrate: Annotated[Path | None, typer.Option(help="a `dinrec bench train --json` result from a GPU")] = None,
    max_hours: Annotated[float | None, typer.Option(help="rule out options slower than this")] = None,
    live_prices: Annotated[bool | None, typer.Option(help="ask EC2 for current spot prices")] = None,
    instance: Annotated[list[str] | None, typer.Option(help="only these instance types (repeatable)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="a ranked JSON list instead of a table")] = False,
) -> None:
    """Rank GPU instances for a DIN training job: fits?, bound by what, hours, spot and on-demand cost."""
    from pydantic import ValidationError

    from training.spot.aws import Aws, CloudError, live_spot_prices
    from training.spot.catalog import load_catalog
    from training.spot.planner import Efficiency, Workload
    from training.spot.planner import calibrate as fit
    from training.spot.planner import plan as make_plan
    from training.spot.settings import SpotSettings

    settings = SpotSettings()
    try:
        workload = Workload.model_validate_json(config.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read {config}: {exc}") from exc
    except ValidationError as exc:
        raise ValueError(f"{config}: {exc}") from exc
    catalog = load_catalog(prices, only=instance)
    efficiency = Efficiency()
    if calibrate is not None:
        try:
            efficiency = fit(json.loads(calibrate.read_text()), catalog)
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read {calibrate}: {exc}") from exc
    spot_prices: dict[str, float] = {}
    if live_prices if live_prices is not None else settings.live_prices:
        try:
            spot_prices = live_spot_prices(Aws(settings.region, settings.endpoint_url), [t.name for t in catalog])
        except CloudError as exc:
            typer.echo(f"warning: live spot prices unavailable ({exc}); using the catalog's", err=True)
    options = make_plan(workload, catalog, spot_prices=spot_prices, efficiency=efficiency, max_hours=max_hours)
    if as_json:
        typer.echo(json.dumps({"workload": workload.model_dump(mode="json"), "efficiency": efficiency.model_dump(),
                               "options": [o.to_json() for o in options]}))
    else:
        typer.echo(_table(options, workload))
