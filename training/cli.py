"""`dinrec train`: dataset (or prepared samples) in, checkpoints + bundle + one JSON line out."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Annotated

import typer


def train(
    data: Annotated[Path, typer.Option(help="a dataset folder whose layout is recognised, or a sample set")],
    out: Annotated[Path, typer.Option(help="output folder: samples/, checkpoints/, bundle/")],
    epochs: Annotated[int | None, typer.Option(help="passes over the training samples")] = None,
    seq_len: Annotated[int | None, typer.Option("--seq-len", help="behaviours per history (L)")] = None,
    batch_size: Annotated[int | None, typer.Option(help="samples per step")] = None,
    negatives: Annotated[int | None, typer.Option(help="sampled negatives per positive")] = None,
    seed: Annotated[int | None, typer.Option(help="random seed")] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu or cuda")] = None,
    no_progress: Annotated[bool, typer.Option("--no-progress", help="no progress bar")] = False,
) -> None:
    """Train DIN, evaluate AUC/GAUC/logloss, export a bundle; print the final metrics as JSON."""
    from feature_store.datasets import load_dataset
    from training.export import export_bundle
    from training.loop import train as run_training
    from training.samples import SampleSet, build_samples, is_sample_dir
    from training.settings import TrainSettings

    logging.basicConfig(level=logging.WARNING)
    overrides = {k: v for k, v in {"epochs": epochs, "seq_len": seq_len, "batch_size": batch_size,
                                   "negatives": negatives, "seed": seed, "device": device}.items() if v is not None}
    if no_progress:
        overrides["progress"] = False
    settings = TrainSettings(**overrides)
    if is_sample_dir(data):
        samples = SampleSet.load(data)
    else:
        samples = build_samples(load_dataset(data), seq_len=settings.seq_len, negatives=settings.negatives,
                                seed=settings.seed)
        samples.save(out / "samples")
    result = run_training(samples, settings, out)
    bundle = export_bundle(out / "bundle", result.model, samples, result.metrics)
    final = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in result.metrics.items()}
    final["bundle"] = str(bundle)
    typer.echo(json.dumps(final))
