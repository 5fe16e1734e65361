"""The deployment files, checked without a cluster: the Helm chart by `helm lint --strict` and its rendered
objects against the Kubernetes API schemas (kubernetes-validate, offline, strict) and prometheus-operator's
CRD schemas; the Dockerfile by hadolint; docker-compose parsed and checked for what operators rely on; and
every DINREC_ variable they set is a setting dinrec reads."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dinrec.cli.config import known_variables
from tests.conftest import CHART, CHART_ALL_ON, REPO, _need, helm, helm_template, variables_the_deployments_set

COMPOSE = REPO / "deploy" / "docker" / "docker-compose.yml"
DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"
MONITORING = REPO / "deploy" / "monitoring"
# What Kubernetes itself defines (kubernetes-validate's schemas); the rest are prometheus-operator's CRDs.
CORE_GROUPS = {"v1", "apps/v1", "batch/v1", "policy/v1", "networking.k8s.io/v1", "autoscaling/v2"}


def _tool(name: str) -> str:
    path = Path(sys.executable).with_name(name)
    found = str(path) if path.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: it comes with the dev extra (pip install -e '.[dev]')")
    return found


def _validate(*files: Path) -> subprocess.CompletedProcess:
    return subprocess.run([_tool("kubernetes-validate"), "--strict", "-k", "1.31.0", *map(str, files)],
                          capture_output=True, text=True, timeout=120)


def _core(objects: list[dict], tmp_path: Path) -> Path:
    path = tmp_path / "core.yaml"
    path.write_text(yaml.safe_dump_all([o for o in objects if o["apiVersion"] in CORE_GROUPS]))
    return path


def _kind(objects: list[dict], kind: str, name: str | None = None) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    return found


def test_helm_lint_passes_strict_with_defaults_and_with_everything_on():
    for settings in ((), CHART_ALL_ON):
        cmd = [helm(), "lint", "--strict", str(CHART)] + [a for s in settings for a in ("--set", s)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and "0 chart(s) failed" in out.stdout, out.stdout + out.stderr


def test_every_rendered_object_passes_the_kubernetes_schemas_strictly(chart_objects, tmp_path):
    kinds = {o["kind"] for o in chart_objects}
    assert {"Service", "HorizontalPodAutoscaler", "StatefulSet", "Deployment", "CronJob", "ConfigMap",
            "PodDisruptionBudget", "NetworkPolicy", "PersistentVolumeClaim", "ServiceAccount",
            "ServiceMonitor", "PrometheusRule"} <= kinds
    out = _validate(_core(chart_objects, tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert {o["metadata"]["namespace"] for o in chart_objects} == {"recs"}  # every object where it was asked
    _, moved = helm_template("namespaceOverride=elsewhere")
    assert {o["metadata"]["namespace"] for o in moved} == {"elsewhere"}


def _crd_schema(kind: str) -> dict:
    crds = Path(_need("DINREC_PROMETHEUS_CRDS"))
    crd = yaml.safe_load((crds / f"monitoring.coreos.com_{kind.lower()}s.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return _strict(version["schema"]["openAPIV3Schema"])


def _strict(node):
    """The CRD's structural schema as the API server applies it with strict field validation: a field the
    schema does not declare is an error (unless the schema keeps unknown fields)."""
    if isinstance(node, dict):
        node = {k: _strict(v) for k, v in node.items()}
        if "properties" in node and "additionalProperties" not in node \
                and not node.get("x-kubernetes-preserve-unknown-fields"):
            node["additionalProperties"] = False
        return node
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


def test_the_monitoring_objects_pass_prometheus_operators_crd_schemas(chart_objects):
    import jsonschema

    for kind in ("ServiceMonitor", "PrometheusRule"):
        obj = _kind(chart_objects, kind)
        assert obj["apiVersion"] == "monitoring.coreos.com/v1"
        # OpenAPI v3's schema objects are JSON Schema draft 4's keywords; their patterns are Go's (RE2), so the
        # schema is not checked against Python's regex syntax, only the objects against the schema.
        validator = jsonschema.Draft4Validator(_crd_schema(kind))
        validator.validate(obj)
        broken = json.loads(json.dumps(obj))
        broken["spec"]["endpoint" if kind == "ServiceMonitor" else "group"] = []  # a misspelt field
        with pytest.raises(jsonschema.ValidationError):
            validator.validate(broken)


def test_the_servicemonitor_scrapes_each_api_pod_and_each_ingester_once(chart_objects):
    monitor = _kind(chart_objects, "ServiceMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    scraped = [o for o in chart_objects if o["kind"] == "Service"
               and selector.items() <= o["metadata"]["labels"].items()]
    assert sorted(s["metadata"]["name"] for s in scraped) == ["dinrec-api-pods", "dinrec-ingest"]
    assert all(s["spec"]["clusterIP"] == "None" for s in scraped)  # headless: one target per pod
    ports = {p["name"] for s in scraped for p in s["spec"]["ports"]}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} == ports == {"http", "metrics"}
    assert {e["path"] for e in monitor["spec"]["endpoints"]} == {"/metrics"}


def test_the_prometheusrule_is_the_tested_rule_file_with_runbooks_prefixed():
    base = "https://docs.example.com/dinrec/"
    _, objects = helm_template("prometheusRule.enabled=true", f"prometheusRule.runbookBaseUrl={base}")
    rule = _kind(objects, "PrometheusRule")
    source = yaml.safe_load((MONITORING / "alerts.yaml").read_text())
    ours = [r for g in source["groups"] for r in g["rules"]]
    theirs = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    assert [r["alert"] for r in theirs] == [r["alert"] for r in ours] and len(ours) >= 10
    for mine, rendered in zip(ours, theirs, strict=True):
        assert rendered["expr"] == mine["expr"]  # `{{ $labels.pod }}` in annotations reaches Prometheus as is
        assert rendered["annotations"]["runbook_url"] == base + mine["annotations"]["runbook_url"]
        assert rendered["annotations"]["summary"] == mine["annotations"]["summary"]


def test_the_dashboard_configmap_carries_the_dashboard(chart_objects):
    board = _kind(chart_objects, "ConfigMap", "dinrec-dashboard")
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(board["data"]["dinrec.json"]) == json.loads((MONITORING / "dashboard.json").read_text())


def test_optional_objects_are_off_by_default_and_admin_is_off_without_a_secret():
    _, objects = helm_template()
    assert not [o for o in objects if o["apiVersion"].startswith("monitoring.coreos.com")]
    assert not [o for o in objects if o["kind"] == "ConfigMap" and "dashboard" in o["metadata"]["name"]]
    api = _kind(objects, "StatefulSet", "dinrec-api")
    (container,) = api["spec"]["template"]["spec"]["containers"]
    assert "DINREC_ADMIN_TOKEN" not in {e["name"] for e in container["env"]}
    assert container["image"] == f"dinrec:{yaml.safe_load((CHART / 'Chart.yaml').read_text())['appVersion']}"


def test_the_admin_token_comes_by_reference_and_a_digest_pins_the_image(chart_objects):
    digest = "sha256:" + "ab" * 32
    _, objects = helm_template(*CHART_ALL_ON, f"image.digest={digest}")
    for o in objects:
        spec = o.get("spec", {})
        pod = spec.get("jobTemplate", {}).get("spec", spec).get("template", {}).get("spec")
        for c in (pod or {}).get("containers", []):
            assert c["image"] == f"dinrec@{digest}", o["metadata"]["name"]
    api = _kind(chart_objects, "StatefulSet", "dinrec-api")
    (container,) = api["spec"]["template"]["spec"]["containers"]
    (token,) = [e for e in container["env"] if e["name"] == "DINREC_ADMIN_TOKEN"]
    assert token["valueFrom"] == {"secretKeyRef": {"name": "dinrec-admin", "key": "token"}}
    assert not [o for o in chart_objects if o["kind"] == "Secret"]  # the chart never holds the token


@pytest.mark.parametrize("setting, says", [
    ("api.replica=3", "replica"),  # a misspelt key
    ("api.workers=two", "workers"),  # a wrong type
    ("redis.store=memcached", "store"),
    ("config.DINREC_REDIS_URL=redis://x:6379/0", "redis.url"),  # a typed value set around its key
])
def test_a_mistyped_value_is_an_error_not_a_silent_default(setting, says):
    out = subprocess.run([helm(), "template", "dinrec", str(CHART), "--set", setting],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and says in out.stderr, out.stderr


def test_the_retrain_cronjob_never_overlaps_and_fails_only_where_a_retry_cannot_help(chart_objects):
    cron = _kind(chart_objects, "CronJob")
    spec = cron["spec"]
    assert spec["concurrencyPolicy"] == "Forbid" and spec["startingDeadlineSeconds"] > 0
    assert spec["successfulJobsHistoryLimit"] >= 1 and spec["failedJobsHistoryLimit"] >= 1
    job = spec["jobTemplate"]["spec"]
    assert job["activeDeadlineSeconds"] > 0 and job["backoffLimit"] >= 1  # a killed run is retried: it resumes
    fail_now = next(r for r in job["podFailurePolicy"]["rules"] if r["action"] == "FailJob")
    from dinrec.retrain.job import EXIT_BAD_INPUT, EXIT_DRILL_UNCAUGHT, EXIT_INTERRUPTED, EXIT_REFUSED

    assert set(fail_now["onExitCodes"]["values"]) == {EXIT_BAD_INPUT, EXIT_REFUSED, EXIT_DRILL_UNCAUGHT}
    assert EXIT_INTERRUPTED not in fail_now["onExitCodes"]["values"]
    (container,) = job["template"]["spec"]["containers"]
    assert container["args"][0] == "retrain" and job["template"]["spec"]["restartPolicy"] == "Never"


def test_the_validator_would_catch_a_broken_manifest(chart_objects, tmp_path):
    core = _core(chart_objects, tmp_path)
    broken = tmp_path / "broken.yaml"
    broken.write_text(core.read_text().replace("maxUnavailable: 1", "maxUnavailabel: 1", 1))
    assert broken.read_text() != core.read_text()
    out = _validate(broken)
    assert out.returncode != 0 and "maxUnavailabel" in out.stdout + out.stderr


def test_the_api_probes_and_rollout_keep_serving_and_keep_accepted_events(chart_objects):
    api = _kind(chart_objects, "StatefulSet", "dinrec-api")
    pod = api["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}  # off the request loop
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert {"name": "health", "containerPort": int(env["DINREC_HEALTH_PORT"])} in container["ports"]
    assert container["livenessProbe"]["timeoutSeconds"] >= 5
    # Drained before the kubelet's SIGKILL: the drain, the preStop sleep and the workers' stop fit the grace.
    assert pod["terminationGracePeriodSeconds"] > int(env["DINREC_SHUTDOWN_DRAIN_S"]) + 5
    # The outbox (events answered 202) on the pod's own persistent volume, never an emptyDir.
    assert [t["metadata"]["name"] for t in api["spec"]["volumeClaimTemplates"]] == ["outbox"]
    assert "outbox" not in {v["name"] for v in pod["volumes"]}
    assert _kind(chart_objects, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    assert _kind(chart_objects, "NetworkPolicy", "dinrec-api")
    hpa = _kind(chart_objects, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "dinrec-api"}
    assert "replicas" not in api["spec"]  # the autoscaler owns it: an upgrade must not reset the count


def _pods(objects: list[dict]):
    for doc in objects:
        if doc["kind"] in ("StatefulSet", "Deployment", "CronJob"):
            spec = doc["spec"]
            yield doc, spec.get("jobTemplate", {}).get("spec", spec)["template"]["spec"]


def test_every_pod_runs_locked_down(chart_objects):
    pods = list(_pods(chart_objects))
    assert len(pods) == 4  # the API, ingest, the archive, retrain
    for doc, pod in pods:
        where = f"{doc['kind']} {doc['metadata']['name']}"
        assert pod["securityContext"]["runAsNonRoot"] is True, where
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, where
        assert pod["automountServiceAccountToken"] is False, where
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True, where
            assert sc["capabilities"] == {"drop": ["ALL"]}, where


def test_a_config_change_rolls_the_pods():
    def checksums(*settings):
        _, objects = helm_template(*settings)
        return {d["metadata"]["name"]: d["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
                for d, _ in _pods(objects) if d["kind"] != "CronJob"}

    before, after = checksums(), checksums("config.DINREC_CATALOG_MIN_USERS=5")
    assert set(before) == {"dinrec-api", "dinrec-ingest", "dinrec-archive"}
    assert all(before[n] != after[n] for n in before)


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "redis.Dockerfile", "kafka.Dockerfile"])
def test_the_dockerfiles_pass_hadolint_and_run_as_non_root(dockerfile):
    out = subprocess.run([_tool("hadolint"), "--failure-threshold", "warning", str(DOCKERFILE.with_name(dockerfile))],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    text = DOCKERFILE.with_name(dockerfile).read_text()
    assert re.search(r"^USER \S+$", text, re.M) and not re.search(r"^USER (root|0)\b", text, re.M)
    assert re.search(r"^ARG BASE=", text, re.M)  # FROM a base made here, or the official image elsewhere


def test_the_image_installs_a_lock_that_agrees_with_pyproject():
    """One torch pin: the lock's torch (and every run-time dependency) inside pyproject's ranges."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    locked = {}
    for line in (REPO / "deploy" / "docker" / "requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            req = Requirement(line)
            pins = [s.version for s in req.specifier if s.operator == "=="]
            assert pins or req.marker, f"{line}: pinned, or needed only by another Python (its marker says which)"
            locked[canonicalize_name(req.name)] = pins[0] if pins else None
    for text in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        assert name in locked, f"{name} is not in requirements.lock: run deploy/docker/lock.py"
        pin = locked[name]
        assert pin is not None and req.specifier.contains(pin), f"requirements.lock has {name}=={pin}, pyproject {req}"
        assert set(req.extras) == set() or name in {"uvicorn", "redis"}  # their extras' packages are locked too
    assert {"httptools", "uvloop", "hiredis"} <= set(locked)
    assert not [n for n in locked if n.startswith(("nvidia-", "cuda-")) or n == "triton"]  # the CPU wheel's closure
    text = DOCKERFILE.read_text()
    assert "-r deploy/docker/requirements.lock" in text and "--no-deps" in text and "pip check" in text


def test_the_image_copies_every_package_the_wheel_ships():
    import tomllib

    folders = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values()
    packages = set(folders)
    copied = set(re.findall(r"^COPY (\w+) \./\1$", DOCKERFILE.read_text(), re.M))
    assert packages <= copied, f"the Dockerfile does not copy {sorted(packages - copied)}"


def test_compose_runs_every_part_with_healthchecks_and_volumes():
    compose = yaml.safe_load(COMPOSE.read_text())
    everything = compose["services"]
    # `up` starts the services with no profile; the trial's one-shot seed runs only when asked for.
    services = {name: s for name, s in everything.items() if not s.get("profiles")}
    assert set(services) == {"redis", "kafka", "api", "ingest", "archive", "retrain"}
    probed = {name for name, s in services.items() if not s["healthcheck"].get("disable")}
    assert probed == {"redis", "kafka", "api", "ingest", "retrain"}  # the archive has no endpoint: restarted
    assert {name for name, s in services.items() if s.get("restart") == "unless-stopped"} == set(services)
    seed = everything["seed"]
    assert seed["profiles"] == ["trial"] and seed["restart"] == "no"
    assert seed["command"][:2] == ["demo", "--seed-registry"]
    assert seed["command"][2] == services["api"]["environment"]["DINREC_REGISTRY"]  # the API's registry volume
    # The same Redis major and Kafka version as the tests' servers.
    assert services["redis"]["image"].startswith("redis:7.0-")
    kafka_version = re.search(r"<kafka.version>(.+)</kafka.version>", (REPO / "deploy/local/pom.xml").read_text())
    assert kafka_version is not None
    assert services["kafka"]["image"] == f"apache/kafka:{kafka_version[1]}"
    assert services["retrain"]["command"] == ["retrain", "--every", "1h"]
    assert services["api"]["command"] == ["serve"] and services["ingest"]["command"] == ["ingest"]
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, no ZooKeeper
    assert set(compose["volumes"]) >= {"redis-data", "kafka-data", "registry"}


def test_every_variable_the_deployment_sets_is_a_setting(chart_objects):
    used = variables_the_deployments_set(chart_objects)
    assert len(used) >= 10 and not used - known_variables(), sorted(used - known_variables())
