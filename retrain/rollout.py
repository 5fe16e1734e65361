"""Rollout through A/B: a retrained model that passed the gate serves a ramped share of users as the
challenger against the champion (the default model), in an experiment the services' guardrail stops
when it is significantly worse and promotes to champion when it wins (experiments).

The treatment names the **version**, not the ``challenger`` alias, so a later retrain that moves the
alias never swaps the model under a running experiment; that later retrain stops this experiment and
starts its own (one retrain experiment at a time).
"""

from __future__ import annotations

from datetime import UTC, datetime

from experiments.spec import Experiment, ExperimentFile, Variant
from retrain.settings import RetrainSettings

PREFIX = "retrain-"


def start_challenger_experiment(s: RetrainSettings, version: str) -> str:
    """Add (and start) the experiment for ``version`` to the experiments file (RetrainSettings requires
    one for rollout=challenger); returns its name."""
    assert s.experiments_file is not None
    name = f"{PREFIX}{version}"[:128]
    try:
        current = ExperimentFile.load(s.experiments_file)
    except FileNotFoundError:
        current = ExperimentFile()
    if current.running() and any(e.name == name for e in current.experiments):
        return name  # a resumed run that already started it
    now = datetime.now(UTC)
    kept = [e.model_copy(update={"status": "stopped", "stop": now})
            if e.name.startswith(PREFIX) and e.status == "running" else e
            for e in current.experiments if e.name != name]
    experiment = Experiment(name=name, variants=[Variant(name="champion"), Variant(name="challenger", model=version)],
                            control="champion", ramp=list(s.ramp), ramp_hold_s=s.ramp_hold_s, promote="champion",
                            status="running", start=now)
    s.experiments_file.parent.mkdir(parents=True, exist_ok=True)
    current.model_copy(update={"experiments": [*kept, experiment]}).save(s.experiments_file)
    return name
