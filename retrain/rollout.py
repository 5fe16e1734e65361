"""Rollout through A/B: a retrained model that passed the gate serves a ramped share of users as the
challenger against the champion (the default model), in an experiment the services' guardrail stops
when it is significantly worse and promotes to champion when it wins (experiments).

The treatment names the **version**, not the ``challenger`` alias, so a later retrain that moves the
alias never swaps the model under a running experiment; that later retrain stops this experiment and
starts its own (one retrain experiment at a time).
"""

from __future__ import annotations

from datetime import UTC, datetime

from dinrec.experiments.document import DocumentConflict, ExperimentsDocument
from dinrec.experiments.spec import Experiment, Variant
from dinrec.retrain.settings import RetrainSettings

PREFIX = "retrain-"
_TRIES = 5  # another writer between our read and write: read again and redo the change, a few times


def start_challenger_experiment(s: RetrainSettings, version: str) -> str:
    """Add (and start) the experiment for ``version`` to the experiments document (RetrainSettings requires
    one for rollout=challenger), by the document's compare-and-swap like the admin API; returns its name."""
    assert s.experiments_file is not None
    doc = ExperimentsDocument.open(s.experiments_file)
    name = f"{PREFIX}{version}"[:128]

    def change(experiments: list[Experiment]) -> list[Experiment]:
        now = datetime.now(UTC)
        kept = [e.model_copy(update={"status": "stopped", "stop": now})
                if e.name.startswith(PREFIX) and e.status == "running" else e
                for e in experiments if e.name != name]
        variants = [Variant(name="champion"), Variant(name="challenger", model=version)]
        experiment = Experiment(name=name, variants=variants, control="champion", ramp=list(s.ramp),
                                ramp_hold_s=s.ramp_hold_s, promote="champion", status="running", start=now)
        return [*kept, experiment]

    for attempt in range(_TRIES):
        current, _ = doc.read()
        if any(e.name == name for e in current.experiments):
            return name  # a resumed run that already started it (what became of it since is the guardrail's)
        try:
            doc.update(change, expected=current.version)
            return name
        except DocumentConflict:  # an admin change landed first: it is kept; ours is redone on top of it
            if attempt == _TRIES - 1:
                raise
    raise AssertionError("unreachable")
