"""Settings: a mistyped keyword raises, a mistyped variable is reported, the reference is generated."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from pydantic import ValidationError

from dinrec.cli.config import COMPONENTS, MUST_SET, RENAMED, known_variables, unknown_variables
from dinrec.serving.settings import ServingSettings
from tests.conftest import REPO, variables_the_deployments_set


def test_a_mistyped_keyword_raises_in_every_settings_class():
    with pytest.raises(ValidationError, match="guardrail_interval"):
        ServingSettings(guardrail_interval=1)  # type: ignore[call-arg]  # the mistake under test: it is ..._s
    for _, cls, _ in COMPONENTS:
        with pytest.raises(ValidationError, match="extra"):
            cls(no_such_setting=1)


def test_a_mistyped_variable_is_reported_with_the_closest_known_name(tmp_path):
    env = {**os.environ, "DINREC_GUARDRAIL_INTERVL_S": "1", "DINREC_NOTHING_LIKE_IT": "x"}
    out = subprocess.run([sys.executable, "-m", "dinrec.cli.main", "serve", "--bundle", str(tmp_path / "none")],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0  # no bundle there: the warning comes before the failure
    assert ("warning: DINREC_GUARDRAIL_INTERVL_S is not a dinrec setting (did you mean "
            "DINREC_GUARDRAIL_INTERVAL_S?)") in out.stderr
    assert "warning: DINREC_NOTHING_LIKE_IT is not a dinrec setting\n" in out.stderr
    assert unknown_variables({"DINREC_STORE": "redis", "DINREC_TOPC": "t", "HOME": "/"}) == [
        ("DINREC_TOPC", "DINREC_TOPIC")]


def test_a_shared_fact_is_one_variable_for_every_component(monkeypatch):
    from dinrec.feature_store.settings import FeatureStoreSettings
    from dinrec.retrain.settings import RetrainSettings

    monkeypatch.setenv("DINREC_REGISTRY", "s3://models/registry")
    monkeypatch.setenv("DINREC_TOPIC", "shop.events")
    monkeypatch.setenv("DINREC_EXPERIMENTS_FILE", "/etc/dinrec/experiments.json")
    serving, retrain, store = ServingSettings(), RetrainSettings(), FeatureStoreSettings()
    assert serving.registry == retrain.registry == "s3://models/registry"
    assert store.topic == retrain.topic == serving.topic == "shop.events"
    assert str(serving.experiments_file) == str(retrain.experiments_file) == "/etc/dinrec/experiments.json"
    assert RetrainSettings(registry="runs/registry").registry == "runs/registry"  # a keyword still overrides
    # The variables they replaced are reported with the one that took their place.
    assert unknown_variables({"DINREC_RETRAIN_REGISTRY": "x", "DINREC_RETRAIN_TOPIC": "t"}) == [
        ("DINREC_RETRAIN_REGISTRY", "DINREC_REGISTRY"), ("DINREC_RETRAIN_TOPIC", "DINREC_TOPIC")]


def test_the_checked_in_reference_is_what_dinrec_config_prints():
    out = subprocess.run([sys.executable, "-m", "dinrec.cli.main", "config"], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == (REPO / "docs" / "configuration.md").read_text(), \
        "docs/configuration.md is stale: regenerate it with `dinrec config > docs/configuration.md`"
    for _, cls, _ in COMPONENTS:  # every setting is documented
        for name, field in cls.model_fields.items():
            assert field.description, f"{cls.__name__}.{name} has no description"


def test_every_dinrec_variable_the_code_names_is_in_the_reference():
    files = [p for pattern in ("*.py", "*.sh", "*.yaml", "Makefile", "run") for p in REPO.rglob(pattern)
             if ".venv" not in p.parts and "node_modules" not in p.parts and p.name != "test_config.py"]
    named = {m for p in files for m in re.findall(r"\bDINREC_[A-Z0-9_]*[A-Z0-9]\b", p.read_text(errors="ignore"))}
    # Prefixes spelled in the code (DINREC_TRAIN_ + a field) are not variables.
    named -= {"DINREC_TRAIN", "DINREC_RETRAIN", "DINREC_SPOT"}
    named -= set(RENAMED)  # the old names the warning maps to their shared variable
    assert named, "the scan found nothing"
    assert sorted(named - known_variables()) == []


def test_what_a_deployment_must_set_names_real_settings_and_the_deployments_set_them(chart_objects):
    """Each is a setting, and the shipped deployment sets it: in the image, the chart's ConfigMap, or a
    container's env (spot state: only where spot jobs run, so not there)."""
    assert set(MUST_SET) <= known_variables()
    set_here = variables_the_deployments_set(chart_objects)
    missing = set(MUST_SET) - set_here - {"DINREC_SPOT_STATE_URI"}
    assert not missing, f"the deployment (deploy/docker, deploy/helm) sets none of {sorted(missing)}"
