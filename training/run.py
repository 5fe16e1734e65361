"""Run a training: the replicated trainer or, with ``embeddings=sharded``, its TorchRec subclass — chosen here,
above both, so the base trainers (training.loop, training.towers_train) never import the sharded ones
(pyproject.toml states it as a contract)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from dinrec.models.din import DIN
from dinrec.models.towers import Towers
from dinrec.training.checkpoint import CheckpointStore
from dinrec.training.lists import ListData
from dinrec.training.loop import Trainer, TrainResult
from dinrec.training.samples import SampleSet
from dinrec.training.settings import TrainSettings
from dinrec.training.towers_train import TowersResult, TowersSettings, TowersTrainer


def train(samples: SampleSet, s: TrainSettings, out: Path | None = None, *, checkpoints: CheckpointStore | None = None,
          resume: str | None = None, stop: threading.Event | None = None,
          checkpoint_now: threading.Event | None = None, init: Callable[[DIN], dict] | None = None,
          lists: ListData | None = None, on_epoch: Callable[[Trainer], None] | None = None) -> TrainResult:
    """Train (resuming first when asked). ``out`` alone keeps checkpoints in ``out/checkpoints``.
    ``lists``: the listwise objective's data (training.lists; training.pipeline builds it); ``on_epoch``: see
    :class:`Trainer`."""
    if checkpoints is None and out is not None:
        from dinrec.training.checkpoint import open_checkpoint_store

        checkpoints = open_checkpoint_store(out / "checkpoints", keep=s.keep_checkpoints)
    if s.embeddings == "sharded":
        from dinrec.training.sharded import ShardedTrainer  # TorchRec: imported only for a sharded run

        trainer: Trainer = ShardedTrainer(samples, s, checkpoints=checkpoints, stop=stop,
                                          checkpoint_now=checkpoint_now, init=init)
    else:
        trainer = Trainer(samples, s, checkpoints=checkpoints, stop=stop, checkpoint_now=checkpoint_now, init=init,
                          lists=lists, on_epoch=on_epoch)
    if resume and resume != "none":
        trainer.resume(resume)
    return trainer.run()


def train_towers(samples: SampleSet, settings: TowersSettings | None = None,
                 init: Callable[[Towers], dict] | None = None, *, checkpoints: CheckpointStore | None = None,
                 resume: str | None = None, stop: threading.Event | None = None,
                 checkpoint_now: threading.Event | None = None) -> TowersResult:
    """``init``: called on the fresh towers before training (a warm start: training.warm_start); a
    resumed checkpoint (``resume`` auto: the latest in ``checkpoints``' towers/) replaces it. Raises
    training.loop.TrainingInterrupted when ``stop`` ends it first (after a checkpoint)."""
    settings = settings or TowersSettings()
    trainer_type: type[TowersTrainer] = TowersTrainer
    if settings.embeddings == "sharded":
        from dinrec.training.sharded_towers import ShardedTowersTrainer  # TorchRec: only for a sharded run

        trainer_type = ShardedTowersTrainer
    trainer = trainer_type(samples, settings, init, checkpoints=checkpoints, stop=stop,
                           checkpoint_now=checkpoint_now)
    if resume and resume != "none":
        if resume != "auto":
            raise ValueError("the towers resume from their latest checkpoint (auto) only")
        trainer.resume()
    return trainer.run()
