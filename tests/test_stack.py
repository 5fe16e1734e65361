"""The compose stack run as an operator runs it: deploy/docker/docker-compose.yml on the images
deploy/local/images.sh builds here (compose.local.yml names them), brought up on empty volumes with
podman-compose. The API comes up waiting for a model; the trial's one-shot seed service publishes the
demo's model and the API serves it; events posted to it reach Kafka, the store (ingest) and the archive;
one retrain on them replaces the seed through the gate; the API loads it and serves a personalised list;
/metrics is scraped from the API and from ingest. Then the stack is torn down with its volumes.

podman < 4.6 (Debian bookworm's 4.3) cannot wait on a health condition and, with no systemd, runs no
health check by itself: the fixture starts Redis and Kafka first and runs their health checks
(`podman healthcheck run`) until both pass — what `depends_on: service_healthy` asks compose to do.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from dinrec.datasets.synthetic import SyntheticConfig, generate
from dinrec.serving.server import free_port
from tests.conftest import REPO, wait_until

pytestmark = [pytest.mark.stack, pytest.mark.slow, pytest.mark.timeout(1500)]

COMPOSE_DIR = REPO / "deploy" / "docker"
FILES = ("-f", "docker-compose.yml", "-f", "compose.local.yml")


def _images() -> dict[str, str]:
    names = ("DINREC_IMAGE", "DINREC_REDIS_IMAGE", "DINREC_KAFKA_IMAGE", "CONTAINERS_CONF")
    found = {n: os.environ.get(n, "") for n in names}
    if all(found.values()) and shutil.which("podman"):
        return found
    msg = 'the stack\'s images are not built: run `eval "$(deploy/local/images.sh build)"` first (make test does)'
    if os.environ.get("DINREC_REQUIRE_SERVICES") == "1":
        pytest.fail(msg)
    pytest.skip(msg)


@dataclass
class Stack:
    project: str
    env: dict[str, str]
    url: str
    admin: dict[str, str]

    def compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "podman_compose", "-p", self.project, *FILES, *args],
                              cwd=COMPOSE_DIR, env=self.env, capture_output=True, text=True, timeout=timeout)

    def container(self, service: str) -> str:
        out = subprocess.run(["podman", "ps", "-a", "--format", "{{.Names}}", "--filter",
                              f"label=io.podman.compose.project={self.project}", "--filter",
                              f"label=com.docker.compose.service={service}"],
                             env=self.env, capture_output=True, text=True, check=True)
        names = out.stdout.split()
        assert len(names) == 1, f"{service}: containers {names}"
        return names[0]

    def podman(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run(["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout)

    def healthy(self, service: str) -> bool:
        return self.podman("healthcheck", "run", self.container(service), timeout=60).returncode == 0

    def logs(self) -> str:
        out = []
        for service in ("redis", "kafka", "api", "ingest", "archive", "retrain"):
            try:
                tail = self.podman("logs", "--tail", "30", self.container(service), timeout=30)
                out.append(f"--- {service}\n{tail.stdout}{tail.stderr}")
            except (AssertionError, subprocess.SubprocessError) as e:
                out.append(f"--- {service}: {e}")
        return "\n".join(out)


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    images = _images()
    token = secrets.token_hex(32)
    port = free_port()
    env = {**os.environ, **images, "DINREC_ADMIN_TOKEN": token, "DINREC_API_PORT": str(port)}
    s = Stack(f"dinrec-test-{secrets.token_hex(3)}", env, f"http://127.0.0.1:{port}",
              {"authorization": f"Bearer {token}"})
    try:
        up = s.compose("up", "-d", "redis", "kafka")
        assert up.returncode == 0, up.stderr[-3000:]
        wait_until(lambda: s.healthy("redis") and s.healthy("kafka"), timeout_s=180, interval_s=1,
                   what="redis and kafka healthy")
        up = s.compose("up", "-d")
        assert up.returncode == 0, up.stderr[-3000:]
        yield s
    finally:
        sys.stderr.write(s.logs())  # shown with a failure
        s.compose("down", "-v", "-t", "5", timeout=300)


def _history(n_users: int = 300) -> list[dict]:
    """A synthetic log of the last 20 days, ending two hours ago: inside the retrain job's window."""
    log = generate(SyntheticConfig(n_users=n_users, n_items=600, n_categories=12, mean_events_per_user=30,
                                   days=20, seed=7))
    shift = (time.time() - 7200) - float(log.ts.max())
    return [{"event_id": f"h-{i}", "user_id": str(u), "item_id": str(it), "category_id": str(c),
             "event_type": "click", "ts": float(t) + shift}
            for i, (u, it, c, t) in enumerate(zip(log.user_id, log.item_id, log.category_id, log.ts, strict=True))]


def _metric(text: str, name: str) -> float:
    """The sum of a metric's samples in a Prometheus exposition (``name`` may end in its labels)."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and line[len(name)] in " {")


def test_an_empty_stack_serves_a_seed_then_a_model_of_its_own_events(stack: Stack):
    with httpx.Client(base_url=stack.url, timeout=30) as client:
        seed = _seeded(stack, client)
        _first_model_and_its_lists(stack, client, seed)


def _serving(client: httpx.Client, admin: dict[str, str], version: str) -> bool:
    try:
        return client.get("/admin/model", headers=admin).json().get("version") == version
    except (httpx.TransportError, ValueError):
        return False


def _seeded(stack: Stack, client: httpx.Client) -> str:
    """Up with no model, it says so; the trial's seed service (run once, as its comment says) publishes
    the demo's model, which the API then serves; run again, it keeps the champion and trains nothing."""
    wait_until(lambda: _ok(client, "/healthz"), timeout_s=180, interval_s=1, what="the API answers /healthz")
    waiting = client.get("/readyz")
    assert waiting.status_code == 503 and "model" in waiting.text  # up, no model yet, and says so

    def seed() -> dict:
        run = stack.compose("--profile", "trial", "run", "--rm", "seed", timeout=600)
        assert run.returncode == 0, f"seed exit {run.returncode}: {run.stderr[-3000:]}"
        return json.loads(run.stdout.strip().splitlines()[-1])

    first = seed()
    assert first["status"] == "seeded" and first["alias"] == "champion", first
    wait_until(lambda: _ok(client, "/readyz"), timeout_s=120, interval_s=1, what="the API loads the seed")
    answer = client.get("/recommend", params={"user_id": "someone", "k": 10}, headers=stack.admin).json()
    assert answer["model_version"] == first["version"] and len(answer["items"]) == 10, answer
    again = seed()
    assert again == {**first, "status": "kept"}, again
    return first["version"]


def _first_model_and_its_lists(stack: Stack, client: httpx.Client, seed: str) -> None:

    events = _history()
    for start in range(0, len(events), 1000):  # the operator's backfill: the admin token is not rate-limited
        r = client.post("/events", json={"events": events[start:start + 1000]}, headers=stack.admin)
        assert r.status_code == 202, r.text  # journaled; Kafka next
        assert r.json()["accepted"] == len(events[start:start + 1000])

    # One retrain, as the hourly job runs it, in the retrain service's container (its volumes, its
    # settings), its window ending now (the service's own first run, at start-up, found the archive empty
    # and skipped its window: a window once decided stays decided); until the archive has caught up it
    # finds too little and says so (exit 0, skipped).
    def retrained() -> dict | None:
        run = stack.podman("exec", stack.container("retrain"), "dinrec", "retrain", "--until", f"{time.time():.0f}",
                           timeout=900)
        report = json.loads(run.stdout.strip().splitlines()[-1]) if run.stdout.strip() else {}
        assert run.returncode in (0, 3), f"retrain exit {run.returncode}: {run.stderr[-3000:]}"
        return report if report.get("status") == "promoted" else None

    report = wait_until(retrained, timeout_s=900, interval_s=5, what="a champion of the stack's own events")
    assert report["exit_code"] == 0 and report["champion"]["version"] == seed  # it beat the seed at the gate

    wait_until(lambda: _serving(client, stack.admin, report["candidate"]["version"]), timeout_s=120, interval_s=1,
               what="the API loads the new champion")
    heavy = max({e["user_id"] for e in events}, key=lambda u: sum(e["user_id"] == u for e in events))
    seen = {e["item_id"] for e in events if e["user_id"] == heavy}
    answer = client.get("/recommend", params={"user_id": heavy, "k": 10}, headers=stack.admin).json()
    assert answer["strategy"] == "din" and not answer["degraded"], answer
    assert answer["model_version"] == report["candidate"]["version"]
    items = [i["item_id"] for i in answer["items"]]
    assert len(items) == 10 and not set(items) & seen  # personalised, nothing the user already took

    # A newcomer's three events change their list: from the popular fallback to one of their own.
    before = client.get("/recommend", params={"user_id": "newcomer", "k": 10}, headers=stack.admin).json()
    assert before["strategy"] == "popular"
    mine = [e for e in events if e["user_id"] == heavy][:3]
    now = time.time()
    posted = [{**e, "event_id": f"n-{i}", "user_id": "newcomer", "ts": now + i} for i, e in enumerate(mine)]
    assert client.post("/events", json={"events": posted}, headers=stack.admin).status_code == 202

    def personalised() -> dict | None:
        a = client.get("/recommend", params={"user_id": "newcomer", "k": 10}, headers=stack.admin).json()
        return a if a["strategy"] == "din" and a["history_len"] == 3 else None

    after = wait_until(personalised, timeout_s=120, interval_s=0.5, what="the newcomer's events in the store")
    assert [i["item_id"] for i in after["items"]] != [i["item_id"] for i in before["items"]]
    assert not {i["item_id"] for i in after["items"]} & {e["item_id"] for e in mine}

    # Metrics: the API's, and ingest's from inside its container (its port is not published).
    api_metrics = client.get("/metrics").text
    batches = -(-len(events) // 1000)
    assert _metric(api_metrics, 'dinrec_http_request_seconds_count{route="/events",status="202"}') >= batches + 1
    assert _metric(api_metrics, "process_resident_memory_bytes") > 0
    scrape = stack.podman("exec", stack.container("ingest"), "python", "-c",
                          "import urllib.request as u; print(u.urlopen('http://127.0.0.1:9100/metrics').read().decode())")
    assert scrape.returncode == 0, scrape.stderr
    assert _metric(scrape.stdout, "dinrec_ingest_applied_total") >= len(events)


def _ok(client: httpx.Client, path: str) -> bool:
    try:
        return client.get(path).status_code == 200
    except httpx.TransportError:
        return False


def test_the_images_hold_what_they_say(stack: Stack):
    """dinrec's image: non-root, its units compiled in (loaded here with no compiler installed), dinrec
    importable only as installed, torch the pinned one."""
    probe = ("import json, os, shutil, torch; from dinrec.models.kernels import build_all; "
             "print(json.dumps({'uid': os.getuid(), 'cxx': shutil.which('c++') or shutil.which('g++'), "
             "'torch': torch.__version__, 'units': build_all()}))")
    out = stack.podman("run", "--rm", "--entrypoint", "python", stack.env["DINREC_IMAGE"], "-c", probe, timeout=300)
    assert out.returncode == 0, out.stderr
    facts = json.loads(out.stdout.strip().splitlines()[-1])
    assert facts["uid"] == 10001 and facts["cxx"] is None
    assert facts["torch"].startswith("2.14.")
    assert facts["units"]["lists"] and facts["units"]["dice"]  # built in the build stage, for this CPU
    assert "unavailable" not in out.stderr
