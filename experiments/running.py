"""The experiments a service runs: loaded from ``DINREC_EXPERIMENTS_FILE`` at start-up, assigned per
request (experiments.spec: deterministic, so every replica agrees)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from experiments.spec import Experiment, ExperimentFile, Variant


class Experiments:
    """An immutable set of experiments (the service swaps in a new one when the file changes)."""

    def __init__(self, experiments: list[Experiment], version: int = 0, mtime_ns: int | None = None) -> None:
        self.all = experiments
        self.version, self.mtime_ns = version, mtime_ns

    def models(self) -> set[str]:
        """The registry aliases or versions running experiments' variants serve."""
        return {v.model for e in self.all if e.status == "running" for v in e.variants if v.model}

    @classmethod
    def load(cls, path: str | Path | None) -> Experiments:
        if not path or not Path(path).exists():  # none yet: the admin API creates it
            return cls([])
        mtime = Path(path).stat().st_mtime_ns
        loaded = ExperimentFile.load(path)
        return cls(loaded.experiments, loaded.version, mtime)

    def as_file(self) -> ExperimentFile:
        return ExperimentFile(version=self.version, experiments=self.all)

    def get(self, name: str) -> Experiment | None:
        return next((e for e in self.all if e.name == name), None)

    def assign(self, user_id: str, coverage: Mapping[str, float] | None = None) -> tuple[Experiment, Variant] | None:
        """The first running experiment that takes this user, and the user's variant in it (``coverage``:
        per experiment, the ramp step now in force)."""
        for exp in self.all:
            variant = exp.assign(user_id, (coverage or {}).get(exp.name))
            if variant is not None:
                return exp, variant
        return None
