"""The one pipeline from a dataset to a bundle — samples → recall towers → co-visitation → DIN → blend → bundle — that
``dinrec train``, ``dinrec retrain``, the demo, the simulator, the benchmarks and the tests all call."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dinrec.datasets.base import Interactions
from dinrec.training.samples import SampleSet, build_samples
from dinrec.training.settings import TrainSettings

if TYPE_CHECKING:  # torch comes with these: imported when a model is trained, not when this is
    from dinrec.models.bundle import Bundle
    from dinrec.training.checkpoint import CheckpointStore
    from dinrec.training.lists import ListSettings
    from dinrec.training.loop import TrainResult


def samples_for(data: Interactions, settings: TrainSettings) -> SampleSet:
    """Point-in-time samples as the settings ask for them."""
    return build_samples(data, seq_len=settings.seq_len, negatives=settings.negatives,
                         eval_negatives=settings.eval_negatives, seed=settings.seed,
                         negative_power=settings.negative_power)


@dataclass
class Trained:
    result: TrainResult  # DIN and its metrics (the towers' under metrics["recall"])
    bundle: Path | None  # None where this process does not export (a torchrun rank other than 0)


def list_settings(settings: TrainSettings) -> ListSettings:
    """The listwise objective's settings: the training ones, and the served lanes' sizes (the candidates
    DIN is trained against and measured on are the ones it will rank)."""
    from dinrec.models.ranking_settings import RankingSettings
    from dinrec.training.lists import ListSettings

    served = RankingSettings()
    return ListSettings(negatives=settings.list_negatives, hard_share=settings.hard_negative_share,
                        popular_power=settings.popular_negative_power, guard_folds=settings.guard_folds,
                        recall_candidates=served.recall_candidates, covisit_candidates=served.covisit_candidates,
                        seed=settings.seed, context=tuple(settings.din_context))


def train_bundle(samples: SampleSet, settings: TrainSettings, bundle_dir: str | Path, *,
                 run_dir: Path | None = None, checkpoints: CheckpointStore | None = None, resume: str | None = None,
                 stop: threading.Event | None = None, checkpoint_now: threading.Event | None = None,
                 champion: Bundle | None = None, warm_towers: bool = True, lineage: dict | None = None,
                 after_training: Callable[[TrainResult], bool] | None = None, export: bool = True,
                 say: Callable[[str], None] | None = None) -> Trained:
    """Train the recall towers, fit the co-visitation lane, train DIN on ``samples`` against the lanes'
    candidates (checkpoints in ``checkpoints``, else ``run_dir/checkpoints``; warm-started from
    ``champion``, its towers too if ``warm_towers``), then export them and the blend as one bundle at
    ``bundle_dir``. The towers come first: listwise DIN mines its negatives from them and is measured on
    the candidates they and the lane recall. ``after_training`` sees DIN before the export (retrain's drills
    degrade it there) and returns whether to go on; ``export`` False: everything trains (with the other
    ranks, under torchrun) but nothing is exported (bundle None). ``say``: told each stage as it ends
    (training.progress.Stages: the command's progress lines).
    Raises training.loop.TrainingInterrupted when ``stop`` ends it first."""
    from dinrec.training.export import export_bundle, fit_covisitation
    from dinrec.training.run import train, train_towers
    from dinrec.training.towers_train import towers_settings
    from dinrec.training.warm_start import initializers

    say = say or (lambda _: None)
    din_init, towers_init = initializers(champion, samples.vocab, towers=warm_towers)
    if checkpoints is None and run_dir is not None:  # one store: DIN's checkpoints and the towers' beside them
        from dinrec.training.checkpoint import open_checkpoint_store

        checkpoints = open_checkpoint_store(run_dir / "checkpoints", keep=settings.keep_checkpoints)
    towers, recall_metrics = None, None
    if settings.recall_epochs > 0:
        # On every rank under torchrun (DDP), checkpointed beside DIN's, resumed with it.
        recall = train_towers(samples, towers_settings(settings), init=towers_init, checkpoints=checkpoints,
                              resume=resume, stop=stop, checkpoint_now=checkpoint_now)
        towers, recall_metrics = recall.model, recall.metrics
        say(f"recall towers trained: best epoch {recall_metrics.get('best_epoch')}, validation HR@200 "
            f"{recall_metrics.get('val_hr')}")
    lane = None
    if towers is not None and (settings.ranking_blend or settings.objective == "listwise"):
        lane = fit_covisitation(samples)  # deterministic: every rank fits the same
        say(f"co-visitation fitted (window {lane[0].cfg.window}, decay {lane[0].cfg.decay})")
    lists = None
    if settings.objective == "listwise":
        from dinrec.training.lists import ListData

        # listwise trains the towers (TrainSettings: recall_epochs > 0) on one process or DDP (not sharded),
        # so every rank has them and the lane
        assert lane is not None
        lists = ListData(samples, list_settings(settings), towers, lane[0], min(settings.seq_len, samples.seq_len))
    result = train(samples, settings, checkpoints=checkpoints, resume=resume, stop=stop,
                   checkpoint_now=checkpoint_now, init=din_init, lists=lists)
    say(f"DIN trained: best epoch {result.metrics.get('best_epoch')} of {result.metrics.get('epoch')} "
        f"(chosen on {result.metrics.get('selection')})")
    if lists is not None and result.model is not None:
        from dinrec.training.lists import calibrate

        # Probabilities again (the gate compares log loss and calibration): relative to the validation
        # split's negatives per positive, which is what the gate corrects sampling rates from.
        result.metrics["calibration"] = fitted = calibrate(result.model, lists)
        result.metrics["train_negatives"] = fitted.get("negatives_per_positive") or samples.negatives
    # Every setting the model was built from, beside its metrics (a spot-trained candidate and a local
    # one can be compared field by field).
    result.metrics["train_settings"] = json.loads(settings.model_dump_json())
    if recall_metrics is not None:  # the towers' metrics go beside DIN's, under "recall"
        result.metrics["recall"] = recall_metrics
    if not export or (after_training is not None and not after_training(result)):
        return Trained(result, None)
    if result.model is None:
        raise ValueError("export on a rank without the model: a sharded run exports from rank 0 (others: export=False)")
    bundle = export_bundle(bundle_dir, result.model, samples, result.metrics, towers=towers, lineage=lineage,
                           blend=settings.ranking_blend, lane=lane)
    say(f"exported {bundle}")
    return Trained(result, Path(bundle))
