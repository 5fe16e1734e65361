"""`dinrec train`: dataset (or prepared samples) in, checkpoints + bundle + one JSON line out.

Exit codes: 0 done; 2 bad input; 75 interrupted by SIGTERM/SIGINT after writing a checkpoint
(rerun with ``--resume auto`` to continue exactly where it stopped). SIGUSR1 asks for one extra
checkpoint after the current step (the spot agent sends it on a rebalance recommendation).
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Annotated

import typer

from dinrec.spot.protocol import EXIT_INTERRUPTED


def _clean(metrics: dict) -> dict:
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in metrics.items()}


def train(
    data: Annotated[Path, typer.Option(help="a dataset folder whose layout is recognised, or a sample set")],
    out: Annotated[Path, typer.Option(help="output folder: samples/, checkpoints/, bundle/")],
    objective: Annotated[str | None, typer.Option(help=(
        "listwise (each positive against negatives like the candidates it will rank; the default) or pointwise "
        "(the DIN paper's binary cross-entropy)"))] = None,
    epochs: Annotated[int | None, typer.Option(help="passes over the training samples at most")] = None,
    seq_len: Annotated[int | None, typer.Option("--seq-len", help="behaviours per history (L)")] = None,
    batch_size: Annotated[int | None, typer.Option(help="samples per step (global, over all ranks)")] = None,
    negatives: Annotated[int | None, typer.Option(help="sampled negatives per positive")] = None,
    negative_power: Annotated[float | None, typer.Option(help="training negatives ∝ item count^power (0: uniform)")] \
        = None,
    seed: Annotated[int | None, typer.Option(help="random seed")] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu or cuda")] = None,
    precision: Annotated[str | None, typer.Option(help="auto, fp32, bf16 or fp16")] = None,
    patience: Annotated[int | None, typer.Option(help=(
        "early stopping (epochs without a better validation figure: listwise, DIN alone's HR@10 over the served "
        "candidates; pointwise, GAUC); 0 = off"))] = None,
    recall_epochs: Annotated[int | None, typer.Option(help="recall towers' epochs; 0 = recall from DIN's "
                                                           "item embeddings")] = None,
    checkpoint_dir: Annotated[str | None, typer.Option(help="local folder or s3://bucket/prefix")] = None,
    checkpoint_every: Annotated[int | None, typer.Option(help="also checkpoint every N steps")] = None,
    max_steps: Annotated[int | None, typer.Option(help="end training after N steps (0: no limit)")] = None,
    resume: Annotated[str, typer.Option(help="auto (latest complete checkpoint), none, or a checkpoint name")] = "none",
    init_from: Annotated[Path | None, typer.Option(help=(
        "warm-start DIN (and the towers: --init-towers) from this bundle (rows by item/category id; a relative "
        "path is looked for in --data first, so a spot job can ship it with its data)"))] = None,
    init_towers: Annotated[bool, typer.Option("--init-towers/--no-init-towers",
                                              help="with --init-from: warm-start the recall towers too (off: they "
                                                   "train from scratch, which kept more of the long tail in "
                                                   "dinrec bench retrain)")] = False,
    no_progress: Annotated[bool, typer.Option("--no-progress", help="no progress on stderr (default: shown when "
                                                                   "stderr is a terminal)")] = False,
    settings_file: Annotated[Path | None, typer.Option("--settings", help=(
        "every training setting as JSON (TrainSettings' fields; what `dinrec retrain --spot` ships with the job); "
        "a relative path is looked for in --data first; the flags above override it"))] = None,
    embeddings: Annotated[str | None, typer.Option(help="DIN's tables: replicated (DDP) or sharded (TorchRec over "
                                                        "the ranks)")] = None,
    ranks: Annotated[str, typer.Option(help=(
        "processes on this machine: a count, or gpus (one per GPU; one without a GPU) — torchrun's launcher, "
        "with exit code 75 when the ranks stopped after a checkpoint"))] = "1",
) -> None:
    """Train DIN and the recall towers, evaluate (AUC/GAUC/logloss; recall HR@200), export a bundle;
    print the final metrics as JSON."""
    from dinrec.training.launch import launch, parse_ranks, without_ranks

    n_ranks = parse_ranks(ranks)
    if n_ranks > 1 and "WORLD_SIZE" not in os.environ:  # the launcher: start the ranks, report their outcome
        argv = sys.argv[1:]
        sys.exit(launch(n_ranks, without_ranks(argv[argv.index("train") + 1:])))
    from dinrec.datasets import load_dataset
    from dinrec.training.checkpoint import open_checkpoint_store
    from dinrec.training.loop import TrainingInterrupted
    from dinrec.training.pipeline import samples_for, train_bundle
    from dinrec.training.progress import Stages, showing
    from dinrec.training.samples import SampleSet, is_sample_dir
    from dinrec.training.settings import TrainSettings

    overrides = {k: v for k, v in {"objective": objective, "epochs": epochs, "seq_len": seq_len,
                                   "batch_size": batch_size, "negatives": negatives,
                                   "negative_power": negative_power, "seed": seed, "device": device,
                                   "precision": precision,
                                   "patience": patience, "checkpoint_every": checkpoint_every,
                                   "max_steps": max_steps,
                                   "recall_epochs": recall_epochs, "embeddings": embeddings}.items() if v is not None}
    if no_progress:
        overrides["progress"] = False
    shipped: dict = {}
    if settings_file is not None:
        found = data / settings_file if not settings_file.is_absolute() and (data / settings_file).is_file() \
            else settings_file
        shipped = json.loads(found.read_text())
    settings = TrainSettings(**{**shipped, **overrides})
    say = Stages(showing(settings.progress))
    if is_sample_dir(data):
        samples = SampleSet.load(data)
    else:
        samples = samples_for(load_dataset(data), settings)  # every rank builds the same (seeded) samples
        if int(os.environ.get("RANK", "0")) == 0:
            samples.save(out / "samples")
    say(f"samples: {len(samples.train.label):,} training, {len(samples.val.label):,} validation, "
        f"{len(samples.test.label):,} test rows")
    store = open_checkpoint_store(checkpoint_dir or out / "checkpoints", keep=settings.keep_checkpoints,
                                  key=os.environ.get("DINREC_CHECKPOINT_KEY") or None)  # a spot job's (spot.agent)
    champion = None
    if init_from is not None:
        from dinrec.models.bundle import load_bundle

        found = data / init_from if not init_from.is_absolute() and (data / init_from).is_dir() else init_from
        champion = load_bundle(found)

    stop, checkpoint_now = threading.Event(), threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):  # finish the step, checkpoint, exit 75
        signal.signal(sig, lambda *_: stop.set())
    signal.signal(signal.SIGUSR1, lambda *_: checkpoint_now.set())  # checkpoint after this step, keep training
    try:  # under torchrun only rank 0 trains recall and exports
        trained = train_bundle(samples, settings, out / "bundle", checkpoints=store, resume=resume, stop=stop,
                               checkpoint_now=checkpoint_now, champion=champion, warm_towers=init_towers,
                               export=int(os.environ.get("RANK", "0")) == 0, say=say)
    except TrainingInterrupted as exc:
        typer.echo(json.dumps({"interrupted": True, "checkpoint": exc.checkpoint}))
        sys.exit(EXIT_INTERRUPTED)
    if trained.bundle is not None:
        bundle = trained.bundle
        final = _clean(trained.result.metrics)
        final["bundle"] = str(bundle)
        if len(samples.test):  # the served list against the baselines, as the retrain gate compares them
            from dinrec.models.bundle import load_bundle
            from dinrec.training.evaluation import served_comparison

            final["served"] = served_comparison(load_bundle(bundle), samples)
            say(f"the served list measured on the test split: HR@10 {final['served'].get('served_hr')}")
        typer.echo(json.dumps(final))
