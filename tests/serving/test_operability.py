"""Operating the service: Prometheus metrics, JSON logs with the request id, worker processes,
body limits."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator

import httpx

from dinrec.feature_store.online.memory import MemoryStore
from dinrec.feature_store.settings import FeatureStoreSettings
from dinrec.serving.server import free_port
from dinrec.serving.settings import ServingSettings
from dinrec.streams.inprocess import InProcessStream
from tests.conftest import REPO, wait_until
from tests.serving.conftest import live_server


def test_metrics_show_requests_stages_and_the_model(tiny_run):
    store = MemoryStore()
    store.write(list(tiny_run[0].events()))
    with live_server(ServingSettings(bundle_dir=tiny_run[2], events_sink="stream"), FeatureStoreSettings(),
                     store=store, stream=InProcessStream()) as c:
        user = tiny_run[0].user_id[0]
        for _ in range(3):
            assert c.get("/recommend", params={"user_id": user}).status_code == 200
        c.post("/recommend", json={"user_id": user})
        text = c.get("/metrics").text
        state = c.service_state()
    assert 'dinrec_http_request_seconds_count{route="/recommend",status="200"} 4.0' in text
    for stage in ("features", "recall", "rank"):
        assert f'dinrec_stage_seconds_count{{stage="{stage}"}} 4.0' in text
    cpu = {m[0]: float(m[1]) for m in re.findall(r'dinrec_recommend_cpu_seconds_total\{stage="(\w+)"\} (\S+)', text)}
    assert set(cpu) == {"assign", "features", "recall", "score", "select", "log", "encode"} and cpu["score"] > 0
    rec = state.recommender
    if rec.model.cfg.scores_lists:  # a DIN with context has one path, its lists; the choice says why
        assert rec.scorer.impl.startswith("lists_") and "fp32" in rec.scorer_choice.refused["bf16"]
    else:
        assert rec.scorer.impl in rec.scorer_choice.timings_ms  # the one chosen was timed here
    assert rec.index.kind == rec.index_choice["kind"]
    assert (f'dinrec_model_info{{precision="{rec.precision}",recall_index="{rec.index.kind}",'
            f'scorer="{rec.scorer.impl}",version="{rec.model_version}"}} 1.0') in text
    assert "dinrec_in_flight_requests 1.0" in text  # the scrape itself
    assert "dinrec_outbox_pending_bytes" in text
    # The process collector: this worker's memory and open files (the alerts and dashboard read them).
    rss_line = re.search(r"^process_resident_memory_bytes (\S+)$", text, re.M)
    assert rss_line is not None
    rss = float(rss_line[1])
    assert rss > 50e6 and re.search(r"^process_open_fds \d", text, re.M) and "python_info{" in text


def test_a_body_over_the_limit_is_refused_in_the_error_shape(tiny_run):
    with live_server(ServingSettings(bundle_dir=tiny_run[2], max_body_bytes=2048, events_sink="store"),
                     FeatureStoreSettings(), store=MemoryStore(), stream=InProcessStream()) as c:
        events = [{"event_id": f"e{i}", "user_id": "u", "item_id": f"i{i}", "ts": 5} for i in range(100)]
        r = c.post("/events", json={"events": events})
        assert r.status_code == 413 and r.json()["error"] == "request_too_large"
        assert c.post("/events", json={"events": events[:3]}).status_code == 202


@contextlib.contextmanager
def _dinrec_serve(bundle, log_path, env: dict[str, str], workers: int) -> Iterator[int]:
    """`dinrec serve` in a process of its own, its output to ``log_path``; yields its port once /healthz answers."""
    port = free_port()
    log = log_path.open("w")
    proc = subprocess.Popen([sys.executable, "-m", "dinrec.cli.main", "serve", "--bundle", str(bundle),
                             "--port", str(port), "--workers", str(workers)], cwd=REPO, env={**os.environ, **env},
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        def up() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, timeout_s=120, interval_s=0.5, what="the service to start")
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()


def _json_lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def test_workers_serve_and_log_json_lines_with_the_request_id(tiny_run, tmp_path):
    env = {"DINREC_STORE": "redis", "DINREC_REDIS_URL": "redis://127.0.0.1:1/0",  # degraded: logs
           "DINREC_EVENTS_SINK": "store", "DINREC_STORE_COOLDOWN_S": "60"}
    with _dinrec_serve(tiny_run[2], tmp_path / "serve.log", env, workers=2) as port:
        answers = [httpx.get(f"http://127.0.0.1:{port}/recommend", params={"user_id": "u1"},
                             headers={"x-request-id": f"req-{i}"}, timeout=10) for i in range(6)]
        assert all(r.status_code == 200 and r.json()["degraded"] for r in answers)
        answers += [httpx.get(f"http://127.0.0.1:{port}/recommend", params={"user_id": f"u{i}"},
                              headers={"x-request-id": f"req-more-{i}"}, timeout=10)
                    for i in range(30)]  # a connection each: the kernel spreads them over the workers
        assert all(r.status_code == 200 for r in answers)
        # Whichever worker answers a scrape, it answers for the replica: every request counted once.
        scrapes = [httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text for _ in range(8)]
        for text in scrapes:
            served = re.findall(r'dinrec_http_request_seconds_count\{route="/recommend",status="200"\} (\S+)', text)
            assert served == ["36.0"], served
            assert re.search(r'dinrec_degraded_responses_total\{reason="feature_store"\} 36\.0', text)
            assert "dinrec_thread_alive{" in text  # the answering worker's own threads
        pids = {m for text in scrapes for m in re.findall(r'dinrec_model_info\{[^}]*pid="(\d+)"', text)}
        assert len(pids) == 2, pids  # one model line per live worker
    lines = _json_lines(tmp_path / "serve.log")
    warned = [x for x in lines if "feature store unavailable" in x["message"]]
    assert warned and all(x["request_id"].startswith("req-") for x in warned)
    started = {x["message"] for x in lines if x["message"].startswith("serving model")}
    assert len([x for x in lines if x["message"].startswith("serving model")]) == 2, started  # one per worker
    assert not [x for x in lines if x["logger"] == "uvicorn.access"]  # no line per request unless asked


def test_the_access_log_when_asked_is_a_json_line_per_request_with_its_id(tiny_run, tmp_path):
    env = {"DINREC_STORE": "memory", "DINREC_ACCESS_LOG": "true"}
    with _dinrec_serve(tiny_run[2], tmp_path / "serve.log", env, workers=1) as port:
        for i in range(3):
            r = httpx.get(f"http://127.0.0.1:{port}/recommend", params={"user_id": "u1"},
                          headers={"x-request-id": f"acc-{i}"}, timeout=10)
            assert r.status_code == 200
    lines = _json_lines(tmp_path / "serve.log")
    access = [x for x in lines if x["logger"] == "uvicorn.access" and "/recommend" in x["message"]]
    assert [x["request_id"] for x in access] == ["acc-0", "acc-1", "acc-2"]
    assert all(" 200" in x["message"] for x in access)


def test_the_openapi_examples_are_requests_the_service_accepts(tiny_run):
    store = MemoryStore()
    store.write(list(tiny_run[0].events()))
    with live_server(ServingSettings(bundle_dir=tiny_run[2], events_sink="store"), FeatureStoreSettings(),
                     store=store, stream=InProcessStream()) as c:
        components = c.get("/openapi.json").json()["components"]["schemas"]
        recommend, events = components["RecommendRequest"]["examples"], components["EventsRequest"]["examples"]
        assert len(recommend) == 2 and len(events) == 1
        assert all(c.post("/recommend", json=ex).status_code == 200 for ex in recommend)
        assert all(c.post("/events", json=ex).status_code == 202 for ex in events)
