"""What ``dinrec train`` does with a dataset, as functions the CLI, the benchmarks and the tests share:
samples from the settings, then DIN, the recall towers and the bundle."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from feature_store.datasets.base import Interactions
from training.loop import TrainResult
from training.samples import SampleSet, build_samples
from training.settings import TrainSettings
from training.towers import Towers


def samples_for(data: Interactions, settings: TrainSettings) -> SampleSet:
    """Point-in-time samples as the settings ask for them."""
    return build_samples(data, seq_len=settings.seq_len, negatives=settings.negatives,
                         eval_negatives=settings.eval_negatives, seed=settings.seed,
                         negative_power=settings.negative_power)


def export_trained(out: str | Path, trained: TrainResult, samples: SampleSet, settings: TrainSettings, *,
                   towers_init: Callable[[Towers], dict] | None = None, lineage: dict | None = None) -> Path:
    """The trained DIN, with the recall towers trained beside it, as one bundle."""
    from training.export import export_with_recall

    return export_with_recall(out, trained.model, samples, trained.metrics, settings, towers_init=towers_init,
                              lineage=lineage)
