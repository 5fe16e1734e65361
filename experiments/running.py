"""The experiments a service runs: read from the experiments document (experiments.document,
``DINREC_EXPERIMENTS_FILE``), assigned per request (experiments.spec: deterministic, so every replica
agrees)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from dinrec.experiments.document import ExperimentsDocument
from dinrec.experiments.spec import Experiment, ExperimentFile, Variant


class Experiments:
    """An immutable set of experiments (the service swaps in a new one when the document changes)."""

    def __init__(self, experiments: list[Experiment], version: int = 0) -> None:
        self.all = experiments
        self.version = version

    def models(self) -> set[str]:
        """The registry aliases or versions running experiments' variants serve."""
        return {v.model for e in self.all if e.status == "running" for v in e.variants if v.model}

    @classmethod
    def of(cls, document: ExperimentFile) -> Experiments:
        return cls(document.experiments, document.version)

    @classmethod
    def load(cls, location: str | Path | None) -> Experiments:
        """The experiments document at ``location`` (none yet, or no location: no experiments)."""
        if not location:
            return cls([])
        return cls.of(ExperimentsDocument.open(location).read()[0])

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
