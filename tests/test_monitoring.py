"""The alert rules (deploy/monitoring/alerts.yaml): promtool accepts them, each fires on its fault and stays
quiet on a healthy fleet (promtool's own rule tests, on series written here), and every metric they read
is one dinrec exports — checked against a live service's /metrics and the ingest consumer's registry."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest
import yaml

from tests.conftest import REPO, _need

RULES = REPO / "deploy" / "monitoring" / "alerts.yaml"
NS, POD = {"namespace": "prod"}, {"namespace": "prod", "pod": "api-0"}


def _promtool() -> str:
    """DINREC_PROMTOOL (deploy/local/services.sh sets it), else one on PATH; else skipped, or failed where the
    services are required (the other services' rule: tests.conftest._need)."""
    return os.environ.get("DINREC_PROMTOOL") or shutil.which("promtool") or _need("DINREC_PROMTOOL")


def _series(name: str, labels: dict, values: str) -> dict:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


# alert → (input series, when to look, the label sets it fires with then). Intervals of 1 minute.
FAULTS: dict[str, tuple[list[dict], str, list[dict]]] = {
    "DinrecStoreDown": ([_series("dinrec_store_up", POD, "1 1 0x10"),
                         _series("dinrec_store_up", {**POD, "pod": "api-1"}, "1x12")], "6m", [POD]),
    "DinrecBackgroundThreadDead": ([_series("dinrec_thread_alive", {**POD, "name": "dinrec-outbox"}, "1 0x10"),
                                    _series("dinrec_thread_alive", {**POD, "name": "dinrec-impressions"}, "1x11")],
                                   "5m", [{**POD, "name": "dinrec-outbox"}]),
    "DinrecBackgroundThreadRestarting": ([_series("dinrec_thread_restarts_total", {**POD, "name": "dinrec-ingest"},
                                                  "0+1x20")], "10m", [{**POD, "name": "dinrec-ingest"}]),
    "DinrecOutboxGrowing": ([_series("dinrec_outbox_pending_bytes", POD, "0+500000x30")], "20m", [POD]),
    "DinrecDegradedAnswers": ([_series("dinrec_degraded_responses_total", {**POD, "reason": "store"}, "0+10x30"),
                               _series("dinrec_http_request_seconds_count",
                                       {**POD, "route": "/recommend", "status": "200"}, "0+100x30")], "20m", [NS]),
    "DinrecShedding": ([_series("dinrec_shed_requests_total", POD, "0+5x30"),
                        _series("dinrec_http_request_seconds_count", {**POD, "route": "/recommend", "status": "200"},
                                "0+100x30")], "20m", [NS]),
    "DinrecRecommendSlow": ([_series("dinrec_http_request_seconds_bucket", {**POD, "route": "/recommend",
                                                                            "status": "200", "le": le}, values)
                             for le, values in [("0.1", "0+90x30"), ("0.25", "0+95x30"), ("0.5", "0+100x30"),
                                                ("+Inf", "0+100x30")]], "20m", [NS]),
    "DinrecImpressionsDropped": ([_series("dinrec_impressions_dropped_total", POD, "0 0 0 5x10")], "6m", [POD]),
    "DinrecGuardrailHeld": ([_series("dinrec_experiment_held", {**POD, "experiment": "ranker-v2"}, "1x40"),
                             _series("dinrec_experiment_held", {**POD, "experiment": "other"}, "0x40")], "35m",
                            [{**NS, "experiment": "ranker-v2"}]),
    "DinrecIngestLagging": ([_series("dinrec_ingest_lag_records", {**NS, "pod": "ingest-0", "partition": "3"},
                                     "0+20000x30")], "20m", [NS]),
    "DinrecDeadLetters": ([_series("dinrec_ingest_dead_lettered_total", {**NS, "pod": "ingest-0"}, "0 0 2x10")],
                          "6m", [NS]),
    "DinrecRetrainFailed": ([_series("kube_job_failed", {**NS, "job_name": "dinrec-retrain-29100000",
                                                         "condition": "true"}, "1x5"),
                             _series("kube_job_failed", {**NS, "job_name": "dinrec-retrain-29100060",
                                                         "condition": "false"}, "1x5")], "3m",
                            [{**NS, "job_name": "dinrec-retrain-29100000"}]),
    "DinrecRetrainStale": ([_series("kube_job_status_completion_time", {**NS, "job_name": "dinrec-retrain-1"},
                                    "0x500")], "7h", [NS]),
}

# A healthy fleet: the same metrics, nothing wrong. No alert may fire at any of these times.
HEALTHY = [
    _series("dinrec_store_up", POD, "1x60"),
    _series("dinrec_thread_alive", {**POD, "name": "dinrec-outbox"}, "1x60"),
    _series("dinrec_thread_restarts_total", {**POD, "name": "dinrec-ingest"}, "0 1x59"),
    _series("dinrec_outbox_pending_bytes", POD, "0 2000 0 4000 0x56"),
    _series("dinrec_degraded_responses_total", {**POD, "reason": "store"}, "0+1x60"),
    _series("dinrec_shed_requests_total", POD, "0x60"),
    _series("dinrec_http_request_seconds_count", {**POD, "route": "/recommend", "status": "200"}, "0+100x60"),
    *[_series("dinrec_http_request_seconds_bucket", {**POD, "route": "/recommend", "status": "200", "le": le}, v)
      for le, v in [("0.01", "0+95x60"), ("0.05", "0+100x60"), ("+Inf", "0+100x60")]],
    _series("dinrec_impressions_dropped_total", POD, "0x60"),
    _series("dinrec_experiment_held", {**POD, "experiment": "ranker-v2"}, "0x60"),
    _series("dinrec_ingest_lag_records", {**NS, "pod": "ingest-0", "partition": "0"}, "5 100 20 0x57"),
    _series("dinrec_ingest_dead_lettered_total", {**NS, "pod": "ingest-0"}, "0x60"),
    _series("kube_job_failed", {**NS, "job_name": "dinrec-retrain-1", "condition": "false"}, "1x60"),
    _series("kube_job_status_completion_time", {**NS, "job_name": "dinrec-retrain-1"}, "0+60x60"),
]


def _rules() -> dict[str, dict]:
    return {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r}


def _annotations(rule: dict, labels: dict) -> dict:
    """The rule's annotations as Prometheus renders them for ``labels`` (they template only $labels)."""
    return {k: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], v)
            for k, v in rule["annotations"].items()}


def test_the_rules_are_valid_and_each_alert_has_a_runbook():
    out = subprocess.run([_promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    rules = _rules()
    assert set(rules) == set(FAULTS), "every alert has a fault scenario here, and only alerts do"
    operations = (REPO / "docs" / "operations.md").read_text().lower()
    for name, rule in rules.items():
        url = rule["annotations"]["runbook_url"]
        anchor = url.split("#", 1)[1]
        assert url.startswith("docs/operations.md#alert-"), url
        assert f"### alert: {anchor.removeprefix('alert-')}\n" in operations, f"{name}: no runbook section for {url}"
        assert rule["labels"]["severity"] in {"critical", "warning"}


def test_each_alert_fires_on_its_fault_and_none_on_a_healthy_fleet(tmp_path):
    rules = _rules()
    tests = []
    for name, (series, at, fired) in FAULTS.items():
        expected = [{"exp_labels": {**labels, "alertname": name, **rules[name]["labels"]},
                     "exp_annotations": _annotations(rules[name], labels)} for labels in fired]
        tests.append({"interval": "1m", "input_series": series,
                      "alert_rule_test": [{"eval_time": at, "alertname": name, "exp_alerts": expected}]})
    tests.append({"interval": "1m", "input_series": HEALTHY,
                  "alert_rule_test": [{"eval_time": at, "alertname": name, "exp_alerts": []}
                                      for name in rules for at in ("10m", "30m", "59m")]})
    spec = tmp_path / "alerts.test.yaml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": tests}))
    out = subprocess.run([_promtool(), "test", "rules", str(spec)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def _exported(text: str) -> set[str]:
    """Every sample name an exposition can carry, from its TYPE lines (a labelled family nobody has counted
    yet has no samples, but it is declared)."""
    names = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        # (prometheus_client declares a counter by its sample name, ``…_total``; the family name too, in case)
        names |= {"counter": {name if name.endswith("_total") else f"{name}_total"},
                  "histogram": {f"{name}_bucket", f"{name}_count", f"{name}_sum"}}.get(kind, {name})
    return names


def _read_by(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (dinrec's and kube-state-metrics')."""
    return set(re.findall(r"\b(?:dinrec|kube)_[a-z0-9_]+\b", expr))


@pytest.fixture(scope="module")
def exported(tiny_run, tmp_path_factory) -> set[str]:
    """What the code declares, not a list: a live service's /metrics (with a running experiment, so the
    guardrail's gauge has a row) and the ingest consumer's registry."""
    import json

    from prometheus_client import generate_latest

    from dinrec.feature_store.ingest_stats import IngestStats
    from dinrec.feature_store.online.memory import MemoryStore
    from dinrec.feature_store.settings import FeatureStoreSettings
    from dinrec.serving.settings import ServingSettings
    from dinrec.streams.inprocess import InProcessStream
    from tests.serving.conftest import live_server

    path = tmp_path_factory.mktemp("monitoring") / "experiments.json"
    path.write_text(json.dumps({"experiments": [{"name": "ranker-v2", "status": "running", "seed": "s", "variants": [
        {"name": "din"}, {"name": "popular", "overrides": {"strategy": "popular"}}]}]}))
    settings = ServingSettings(bundle_dir=tiny_run[2], experiments_file=path)
    with live_server(settings, FeatureStoreSettings(), store=MemoryStore(), stream=InProcessStream()) as client:
        assert client.get("/recommend", params={"user_id": "u1", "k": 3}).status_code == 200
        text = client.get("/metrics").text
    assert 'dinrec_experiment_held{experiment="ranker-v2"} 0.0' in text
    return _exported(text) | _exported(generate_latest(IngestStats().registry).decode())


@pytest.mark.slow
def test_every_metric_an_alert_reads_is_exported(exported):
    """kube_* come from kube-state-metrics."""
    read = {m for rule in _rules().values() for m in _read_by(rule["expr"])}
    assert read, "the rules read no metric?"
    missing = {m for m in read if not m.startswith("kube_")} - exported
    assert not missing, f"alerts read metrics nothing exports: {sorted(missing)}"


DASHBOARD = REPO / "deploy" / "monitoring" / "dashboard.json"


def _panels() -> list[dict]:
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


@pytest.mark.slow
def test_the_dashboard_reads_valid_promql_over_metrics_dinrec_exports(exported, tmp_path):
    """Grafana's layout rules (unique ids, a 24-column grid without overlaps, every query on the dashboard's
    Prometheus variable), every query valid PromQL (promtool checks it as a recording rule, Grafana's
    $__rate_interval as 5m) and reading only metrics the service or ingest declare."""
    board = json.loads(DASHBOARD.read_text())
    assert isinstance(board["schemaVersion"], int) and board["uid"] and board["title"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in board["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
    exprs = []
    for p in _panels():
        assert p["type"] in {"timeseries", "stat"} and p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
            exprs.append(t["expr"].replace("$__rate_interval", "5m").replace("$namespace", ".*"))
    rules = tmp_path / "panels.yaml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": [
        {"record": f"dinrec:panel:{n}", "expr": e} for n, e in enumerate(exprs)]}]}))
    out = subprocess.run([_promtool(), "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    read = {m for e in exprs for m in _read_by(e)}
    missing = read - exported
    assert not missing, f"the dashboard reads metrics nothing exports: {sorted(missing)}"


def test_the_dashboard_is_what_grafanas_schema_describes():
    """The dashboard loads into Grafana's dashboard model as its schema describes it (the Foundation SDK's
    classes, generated from Grafana's own schema) and comes back unchanged in every field it sets: a
    misspelt or unknown field would be dropped, and fail here."""
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard

    board = json.loads(DASHBOARD.read_text())
    back = json.loads(json.dumps(Dashboard.from_json(board), cls=JSONEncoder))

    def lost(ours, theirs, path: str = "") -> list[str]:
        if isinstance(ours, dict):
            if not isinstance(theirs, dict):
                return [path]
            return [p for k, v in ours.items() for p in ([f"{path}/{k}"] if k not in theirs else
                                                         lost(v, theirs[k], f"{path}/{k}"))]
        if isinstance(ours, list):
            if not isinstance(theirs, list) or len(ours) != len(theirs):
                return [path]
            return [p for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) for p in lost(a, b, f"{path}[{i}]")]
        return [] if ours == theirs else [path]

    assert lost(board, back) == []
    assert len(back["panels"]) == len(board["panels"]) > 10
