"""Experiments and who sees which variant.

An experiment names its variants (each a model alias or version and/or serving overrides), their
weights, a coverage (the share of users in the experiment at all) and a seed. Assignment is a pure
function of (seed, user id), so every replica and every restart agrees without storing anything:
GrowthBook's v2 bucketing (FNV-1a 32 twice, ``n = fnv1a(str(fnv1a(seed + user))) % 10000 / 10000``)
and its bucket ranges, where variant i owns ``[start_i, start_i + coverage · w_i)`` with
``start_i`` the sum of the earlier weights — raising coverage only extends ranges, so an assigned
user never moves. Users outside every range get the default (no experiment).

A safe rollout sets ``ramp`` — coverage steps such as 1% → 5% → 10% → 25% → 50% — instead of one
coverage; the guardrail (serving.guardrail) moves to the next step once the current one has been held
``ramp_hold_s`` with every arm judged and none worse. Because raising coverage only extends ranges,
a ramp never reassigns anyone. ``promote`` names a registry alias that a treatment's model takes
when it wins under the sequential test: how a retrained challenger becomes champion.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from dinrec.events.schema import ExternalId
from dinrec.experiments.metrics import METRIC_NAMES

_FNV_OFFSET, _FNV_PRIME = 0x811C9DC5, 0x01000193


def fnv1a32(text: str) -> int:
    """32-bit FNV-1a over the string's code points (as GrowthBook's SDKs hash)."""
    h = _FNV_OFFSET
    for ch in text:
        h = ((h ^ ord(ch)) * _FNV_PRIME) & 0xFFFFFFFF
    return h


def bucket(seed: str, user_id: str) -> float:
    """The user's position in [0, 1) for this seed (GrowthBook hash v2)."""
    return (fnv1a32(str(fnv1a32(seed + user_id))) % 10000) / 10000


def bucket_ranges(weights: list[float], coverage: float) -> list[tuple[float, float]]:
    ranges, start = [], 0.0
    for w in weights:
        ranges.append((start, start + coverage * w))
        start += w
    return ranges


def _distinct_names(named: list, what: str) -> list:
    names = [x.name for x in named]
    if len(set(names)) != len(names):
        raise ValueError(f"{what} names must be distinct: {names}")
    return named


class Overrides(BaseModel):
    """Serving settings a variant changes (unset: the service's own)."""

    model_config = ConfigDict(extra="forbid")
    seq_len: int | None = Field(None, ge=1, le=10_000, description="history length used (e.g. 20 vs 50)")
    recall_candidates: int | None = Field(None, ge=1, le=10_000)
    strategy: Literal["din", "popular"] | None = Field(None, description="popular: a non-model baseline")
    tail_share: float | None = Field(None, ge=0, le=1, description="the long-tail lane's share of each list")


class MetricUse(BaseModel):
    """A metric an experiment reports (experiments.metrics), and what it does with it: the ``goal`` decides a
    winner (and stops an arm significantly worse on it); a ``guardrail`` stops an arm significantly worse on
    it; a ``secondary`` one is shown."""

    model_config = ConfigDict(extra="forbid")
    name: Literal[METRIC_NAMES]  # type: ignore[valid-type]  # the names experiments.metrics defines (built at run time)
    role: Literal["goal", "secondary", "guardrail"] = "secondary"
    direction: Literal["higher", "lower"] = Field("higher", description="which way is better")


def _default_metrics() -> list[MetricUse]:
    return [MetricUse(name="ctr", role="goal"), MetricUse(name="conversions_per_user", role="guardrail"),
            MetricUse(name="value_per_user", role="secondary")]


class Variant(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: ExternalId
    weight: float = Field(1.0, gt=0)
    model: ExternalId | None = Field(None, description="a registry alias or version (unset: the default model)")
    overrides: Overrides = Field(default_factory=Overrides)


class Experiment(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: ExternalId
    seed: str | None = Field(None, description="hash seed (default: the name); a new seed reshuffles users")
    variants: list[Variant] = Field(min_length=2)
    control: ExternalId | None = Field(None, description="the variant others are compared with (default: the first)")
    coverage: float = Field(1.0, ge=0, le=1, description="share of users in the experiment")
    status: Literal["draft", "running", "stopped"] = "draft"
    start: datetime | None = None
    stop: datetime | None = None
    ramp: list[Annotated[float, Field(gt=0, le=1)]] | None = Field(None, min_length=1, description=(
        "safe rollout: coverage steps (e.g. [0.01, 0.05, 0.1, 0.25, 0.5]), each held ramp_hold_s while the "
        "guardrail is green; replaces coverage"))
    ramp_hold_s: float = Field(3600.0, ge=0, description="least time at each ramp step")
    promote: ExternalId | None = Field(None, description=(
        "registry alias a treatment's model is moved to when it wins under the sequential test (ends the experiment)"))
    owner: str | None = Field(None, max_length=200, description="who answers for it (shown on the list)")
    hypothesis: str | None = Field(None, max_length=2000, description="what it is meant to show, before it runs")
    mde: float = Field(0.05, gt=0, le=1, description=(
        "the smallest relative lift worth finding (0.05 = 5 %): the results' users still needed are for it"))
    metrics: list[MetricUse] = Field(default_factory=_default_metrics, min_length=1, max_length=5, description=(
        "what the results report and the guardrail acts on: one goal, any guardrails and secondaries (default: "
        "CTR the goal, conversions per user a guardrail, value per user secondary)"))

    @field_validator("metrics")
    @classmethod
    def _one_goal(cls, metrics: list[MetricUse]) -> list[MetricUse]:
        names = [m.name for m in metrics]
        if len(set(names)) != len(names):
            raise ValueError(f"metric names must be distinct: {names}")
        if sum(m.role == "goal" for m in metrics) != 1:
            raise ValueError("exactly one metric must be the goal")
        return metrics

    @field_validator("ramp")
    @classmethod
    def _increasing(cls, ramp: list[float] | None) -> list[float] | None:
        if ramp is not None and any(b <= a for a, b in zip(ramp, ramp[1:], strict=False)):
            raise ValueError(f"ramp steps must increase: {ramp}")
        return ramp

    @field_validator("variants")
    @classmethod
    def _distinct(cls, variants: list[Variant]) -> list[Variant]:
        return _distinct_names(variants, "variant")

    @model_validator(mode="after")
    def _control_exists(self) -> Experiment:
        if self.control is not None and self.control not in {v.name for v in self.variants}:
            raise ValueError(f"control {self.control!r} is not one of the variants")
        return self

    @property
    def control_name(self) -> str:
        return self.control or self.variants[0].name

    @property
    def weights(self) -> dict[str, float]:
        """Normalised to sum to 1."""
        total = sum(v.weight for v in self.variants)
        return {v.name: v.weight / total for v in self.variants}

    def assign(self, user_id: str, coverage: float | None = None) -> Variant | None:
        """The user's variant, or None (not running, or outside coverage). ``coverage`` overrides the
        experiment's own (a ramp's current step; default: the first step of a ramp, else ``coverage``)."""
        if self.status != "running":
            return None
        if coverage is None:
            coverage = self.ramp[0] if self.ramp else self.coverage
        n = bucket(self.seed or self.name, user_id)
        for variant, (lo, hi) in zip(self.variants, bucket_ranges(list(self.weights.values()), coverage),
                                     strict=True):
            if lo <= n < hi:
                return variant
        return None


class ExperimentFile(BaseModel):
    """The versioned file of experiments: ``{"version": n, "experiments": [...]}`` (each save adds 1)."""

    model_config = ConfigDict(extra="forbid")
    version: int = Field(0, ge=0)
    experiments: list[Experiment] = Field(default_factory=list)

    @field_validator("experiments")
    @classmethod
    def _distinct(cls, experiments: list[Experiment]) -> list[Experiment]:
        return _distinct_names(experiments, "experiment")

    @classmethod
    def parse(cls, data: bytes, where: str) -> ExperimentFile:
        """The document from its bytes; a ValueError naming ``where`` if it is not valid."""
        try:
            return cls.model_validate(json.loads(data))
        except ValueError as exc:  # JSON or schema: say which document
            raise ValueError(f"{where}: not a valid experiments file: {exc}") from exc

    def running(self) -> list[Experiment]:
        return [e for e in self.experiments if e.status == "running"]
