"""The deployment files are validated here, not run: Kubernetes manifests against the API schemas
(kubernetes-validate, offline, strict), the Dockerfile by hadolint, docker-compose parsed and checked
for what operators rely on, and every DINREC_ variable they set is a setting dinrec reads."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from feature_store.settings import FeatureStoreSettings
from retrain.settings import RetrainSettings
from serving.settings import ServingSettings
from tests.conftest import REPO
from training.settings import TrainSettings

K8S = sorted((REPO / "deploy" / "k8s").glob("*.yaml"))
COMPOSE = REPO / "deploy" / "docker" / "docker-compose.yml"
DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"


def _tool(name: str) -> str:
    path = Path(sys.executable).with_name(name)
    found = str(path) if path.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: it comes with the dev extra (pip install -e '.[dev]')")
    return found


def _validate(*files: Path) -> subprocess.CompletedProcess:
    return subprocess.run([_tool("kubernetes-validate"), "--strict", "-k", "1.31.0", *map(str, files)],
                          capture_output=True, text=True, timeout=120)


def test_kubernetes_manifests_pass_strict_schema_validation():
    assert {p.name for p in K8S} >= {"api.yaml", "ingest.yaml", "retrain.yaml", "configmap.yaml", "secret.yaml"}
    out = _validate(*K8S)
    assert out.returncode == 0, out.stdout + out.stderr
    kinds = {d["kind"] for p in K8S for d in yaml.safe_load_all(p.read_text()) if d}
    assert {"Service", "HorizontalPodAutoscaler", "StatefulSet", "CronJob", "ConfigMap", "Secret",
            "PodDisruptionBudget", "NetworkPolicy"} <= kinds


def test_the_retrain_cronjob_never_overlaps_and_fails_only_where_a_retry_cannot_help():
    (cron,) = [d for d in yaml.safe_load_all((REPO / "deploy" / "k8s" / "retrain.yaml").read_text())
               if d["kind"] == "CronJob"]
    spec = cron["spec"]
    assert spec["concurrencyPolicy"] == "Forbid" and spec["startingDeadlineSeconds"] > 0
    assert spec["successfulJobsHistoryLimit"] >= 1 and spec["failedJobsHistoryLimit"] >= 1
    job = spec["jobTemplate"]["spec"]
    assert job["activeDeadlineSeconds"] > 0 and job["backoffLimit"] >= 1  # a killed run is retried: it resumes
    fail_now = next(r for r in job["podFailurePolicy"]["rules"] if r["action"] == "FailJob")
    from retrain.job import EXIT_BAD_INPUT, EXIT_DRILL_UNCAUGHT, EXIT_INTERRUPTED, EXIT_REFUSED

    assert set(fail_now["onExitCodes"]["values"]) == {EXIT_BAD_INPUT, EXIT_REFUSED, EXIT_DRILL_UNCAUGHT}
    assert EXIT_INTERRUPTED not in fail_now["onExitCodes"]["values"]
    (container,) = job["template"]["spec"]["containers"]
    assert container["args"][0] == "retrain" and job["template"]["spec"]["restartPolicy"] == "Never"


def test_the_validator_would_catch_a_broken_manifest(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text((REPO / "deploy" / "k8s" / "api.yaml").read_text().replace("replicas: 2", "replica: 2", 1))
    out = _validate(broken)
    assert out.returncode != 0 and "replica" in out.stdout + out.stderr


def test_the_api_probes_and_rollout_keep_serving_and_keep_accepted_events():
    docs = [d for d in yaml.safe_load_all((REPO / "deploy" / "k8s" / "api.yaml").read_text()) if d]
    api = next(d for d in docs if d["kind"] == "StatefulSet")
    pod = api["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}  # off the request loop
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert {"name": "health", "containerPort": int(env["DINREC_HEALTH_PORT"])} in container["ports"]
    assert container["livenessProbe"]["timeoutSeconds"] >= 5
    # The outbox (events answered 202) on the pod's own persistent volume, never an emptyDir.
    assert [t["metadata"]["name"] for t in api["spec"]["volumeClaimTemplates"]] == ["outbox"]
    assert "outbox" not in {v["name"] for v in pod["volumes"]}
    pdb = next(d for d in docs if d["kind"] == "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1 and any(d["kind"] == "NetworkPolicy" for d in docs)
    hpa = next(d for d in docs if d["kind"] == "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "dinrec-api"}


def test_every_pod_runs_locked_down():
    for p in K8S:
        for doc in yaml.safe_load_all(p.read_text()):
            if not doc or doc["kind"] not in ("StatefulSet", "Deployment", "CronJob"):
                continue
            spec = doc["spec"]
            pod = spec.get("jobTemplate", {}).get("spec", spec)["template"]["spec"]
            where = f"{p.name} {doc['kind']} {doc['metadata']['name']}"
            assert pod["securityContext"]["runAsNonRoot"] is True, where
            assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, where
            assert pod["automountServiceAccountToken"] is False, where
            for c in pod["containers"]:
                sc = c["securityContext"]
                assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True, where
                assert sc["capabilities"] == {"drop": ["ALL"]}, where


def test_the_dockerfile_passes_hadolint_and_runs_as_non_root():
    out = subprocess.run([_tool("hadolint"), "--failure-threshold", "warning", str(DOCKERFILE)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    text = DOCKERFILE.read_text()
    assert re.search(r"^USER 10001", text, re.M) and "download.pytorch.org/whl/cpu" in text


def test_the_image_copies_every_package_the_wheel_ships():
    import tomllib

    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {p.rstrip("*") for p in patterns}
    copied = set(re.findall(r"^COPY (\w+) \./\1$", DOCKERFILE.read_text(), re.M))
    assert packages <= copied, f"the Dockerfile does not copy {sorted(packages - copied)}"


def test_compose_runs_every_part_with_healthchecks_and_volumes():
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    assert set(services) == {"redis", "kafka", "api", "ingest", "archive", "retrain"}
    probed = {name for name, s in services.items() if not s["healthcheck"].get("disable")}
    assert probed == {"redis", "kafka", "api", "ingest", "retrain"}  # the archive has no endpoint: restarted
    assert services["archive"]["restart"] == "unless-stopped"
    assert services["retrain"]["command"] == ["retrain", "--every", "1h"]
    assert services["api"]["command"] == ["serve"] and services["ingest"]["command"] == ["ingest"]
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, no ZooKeeper
    assert set(compose["volumes"]) >= {"redis-data", "kafka-data", "registry"}


def _dinrec_variables() -> set[str]:
    names: set[str] = set()
    for p in K8S:
        for doc in yaml.safe_load_all(p.read_text()):
            if not doc:
                continue
            names |= {k for k in {**doc.get("data", {}), **doc.get("stringData", {})} if k.startswith("DINREC_")}
            spec = doc.get("spec", {})
            pod = spec.get("jobTemplate", {}).get("spec", spec)  # a CronJob's pod is one level deeper
            for c in pod.get("template", {}).get("spec", {}).get("containers", []):
                names |= {e["name"] for e in c.get("env", []) if e["name"].startswith("DINREC_")}
    compose = yaml.safe_load(COMPOSE.read_text())
    for s in compose["services"].values():
        names |= {k for k in s.get("environment", {}) if k.startswith("DINREC_")}
    names |= {k for k in compose["x-dinrec-env"] if k.startswith("DINREC_")}
    names |= set(re.findall(r"\b(DINREC_[A-Z0-9_]+)=", DOCKERFILE.read_text()))
    return names


def test_every_variable_the_deployment_sets_is_a_setting():
    known = {f"DINREC_{f.upper()}" for cls in (ServingSettings, FeatureStoreSettings) for f in cls.model_fields}
    known |= {f"DINREC_TRAIN_{f.upper()}" for f in TrainSettings.model_fields}
    known |= {f"DINREC_RETRAIN_{f.upper()}" for f in RetrainSettings.model_fields}
    used = _dinrec_variables()
    assert len(used) >= 10 and not used - known, sorted(used - known)
