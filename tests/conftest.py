"""Shared fixtures: real services (from deploy/local/services.sh) and the shared datasets.

Servers are found through DINREC_REDIS_URL / DINREC_KAFKA_BOOTSTRAP. When they are unset a
test that needs them is skipped with the command that starts them; with DINREC_REQUIRE_SERVICES=1
(as `make test` and CI set) a missing server is an error instead, so CI can never pass by skipping.
"""

from __future__ import annotations

import atexit
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import pytest

from dinrec.cli.teardown import quiet_triton_teardown
from dinrec.serving.server import free_port

if TYPE_CHECKING:
    import subprocess  # the fixtures import it when they run

atexit.register(quiet_triton_teardown)  # after pytest's summary: Triton's leak report is noise

REPO = Path(__file__).resolve().parents[1]
# A token the admin settings accept (32 characters, not a placeholder); tests send ADMIN_HEADERS.
ADMIN_TOKEN = "0f3c9a7e5b1d4f6a8c2e9b7d5a3f1c8e"
ADMIN_HEADERS = {"authorization": f"Bearer {ADMIN_TOKEN}"}
SHARED_DATA = Path(os.environ.get("DINREC_SHARED_DATA", REPO.parent / "shared" / "data"))


def wait_until(predicate, timeout_s: float = 30.0, interval_s: float = 0.05, what: str = "condition"):
    """Poll ``predicate`` until it returns something truthy (returned), or fail after ``timeout_s``."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"{what} not met within {timeout_s}s")


def _need(var: str) -> str:
    value = os.environ.get(var)
    if value:
        return value
    msg = f"{var} is not set: run `eval $(deploy/local/services.sh start)` first"
    if os.environ.get("DINREC_REQUIRE_SERVICES") == "1":
        pytest.fail(msg)
    pytest.skip(msg)


@pytest.fixture(scope="session")
def redis_url() -> str:
    return _need("DINREC_REDIS_URL")


@pytest.fixture(scope="session")
def redis_cluster_url() -> str:
    """A node of the Redis Cluster deploy/local/services.sh starts (3 primaries + 3 replicas)."""
    return _need("DINREC_REDIS_CLUSTER_URL")


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    return _need("DINREC_KAFKA_BOOTSTRAP")


CHART = REPO / "deploy" / "helm" / "dinrec"
# The chart with everything optional on (what its tests check): monitoring objects and the admin token.
CHART_ALL_ON = ("serviceMonitor.enabled=true", "prometheusRule.enabled=true", "grafanaDashboard.enabled=true",
                "adminToken.existingSecret=dinrec-admin")


def helm() -> str:
    """DINREC_HELM (deploy/local/services.sh builds it), else one on PATH; else skipped, or failed in CI."""
    import shutil

    return os.environ.get("DINREC_HELM") or shutil.which("helm") or _need("DINREC_HELM")


def helm_template(*settings: str, namespace: str = "recs") -> tuple[str, list[dict]]:
    """``helm template`` of the chart with ``--set`` each of ``settings``: the text and its objects."""
    import subprocess

    import yaml

    cmd = [helm(), "template", "dinrec", str(CHART), "--namespace", namespace]
    for s in settings:
        cmd += ["--set", s]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout, [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="session")
def chart_objects() -> list[dict]:
    """Every object the chart renders with everything optional on."""
    return helm_template(*CHART_ALL_ON)[1]


def variables_the_deployments_set(chart_objects: list[dict]) -> set[str]:
    """Every DINREC_ variable the shipped deployments set: the image (deploy/docker/Dockerfile), the compose
    file's services, and the chart's ConfigMaps, Secrets and containers' env (``chart_objects``)."""
    import re

    import yaml

    names = set(re.findall(r"\b(DINREC_[A-Z0-9_]+)=", (REPO / "deploy" / "docker" / "Dockerfile").read_text()))
    compose = yaml.safe_load((REPO / "deploy" / "docker" / "docker-compose.yml").read_text())
    for service in compose["services"].values():
        names |= set(service.get("environment") or {})
    names |= set(compose["x-dinrec-env"])

    def envs(node):
        if isinstance(node, dict):
            yield from (e["name"] for e in node.get("env", []) if isinstance(e, dict) and "name" in e)
            for value in node.values():
                yield from envs(value)
        elif isinstance(node, list):
            for value in node:
                yield from envs(value)

    for doc in chart_objects:
        names |= set((doc.get("data") or {}) | (doc.get("stringData") or {})) | set(envs(doc))
    return {n for n in names if n.startswith("DINREC_")}


@pytest.fixture
def unique() -> str:
    """A fresh name for keys, topics and groups, so tests never see each other's data."""
    return f"t{uuid.uuid4().hex[:10]}"


def shared_dataset(name: str) -> Path:
    path = SHARED_DATA / name
    if not path.is_dir():
        pytest.skip(f"dataset {name} not found at {path} (set DINREC_SHARED_DATA to the shared/data folder)")
    return path


# The backends the store contract runs on: the embedded store; one Redis server with everything in one
# shard, and with four (one per partition of a 4-partition topic); the Redis Cluster with four.
STORE_KINDS = ["memory", "redis", "redis-4", "redis-cluster-4"]


def online_store(kind: str, request, prefix: str, history_cap: int, **kw):
    """A fresh online store of ``kind`` (one of STORE_KINDS; a Redis one under its own key prefix);
    close it after. ``kw`` goes to the store (dedup_window_s, clock)."""
    from dinrec.feature_store.online.memory import MemoryStore
    from dinrec.feature_store.online.redis_store import RedisStore

    if kind == "memory":
        yield MemoryStore(history_cap=history_cap, **kw)
        return
    cluster = kind.startswith("redis-cluster")
    url = request.getfixturevalue("redis_cluster_url" if cluster else "redis_url")
    store = RedisStore(url, prefix=prefix, history_cap=history_cap, partitions=4 if "-4" in kind else 1,
                       cluster=cluster, **kw)
    yield store
    store.flush_prefix()
    store.close()


def synthetic_dataset_dir(folder: Path, **config) -> Path:
    """Write a synthetic behaviour log as ``folder/events.jsonl`` (a dataset `dinrec train` reads)."""
    from dinrec.datasets.synthetic import SyntheticConfig, generate
    from dinrec.events.schema import dumps_many

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "events.jsonl").write_text(dumps_many(list(generate(SyntheticConfig(**config)).events())))
    return folder


def dinrec_train(data: Path, out: Path, *args: str, env: dict, ranks: int = 1, torchrun: bool = False,
                 wait: bool = True):
    """`dinrec train` on CPU in a subprocess: with ``ranks`` > 1 through `--ranks` (dinrec's launcher) or,
    with ``torchrun``, the torchrun command. Returns the last JSON line (asserting exit 0), or the
    running process when not ``wait``."""
    import json
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "dinrec.cli.main", "train", "--data", str(data), "--out", str(out),
           "--device", "cpu", "--no-progress", *args]
    if ranks > 1 and torchrun:
        cmd[1:3] = ["-m", "torch.distributed.run", f"--nproc_per_node={ranks}", f"--master_port={free_port()}",
                    "-m", "dinrec.cli.main"]
    elif ranks > 1:
        cmd += ["--ranks", str(ranks)]
    p = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, **env}, text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    if not wait:
        return p
    out_s, err_s = p.communicate(timeout=900)
    assert p.returncode == 0, err_s[-4000:]
    return json.loads(out_s.strip().splitlines()[-1])




@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """A small synthetic log, trained for two epochs and exported: (data, samples, bundle_dir, metrics)."""
    from dinrec.datasets.synthetic import SyntheticConfig, generate
    from dinrec.training.pipeline import train_bundle
    from dinrec.training.samples import build_samples
    from dinrec.training.settings import TrainSettings

    data = generate(SyntheticConfig(n_users=300, n_items=200, n_categories=10, mean_events_per_user=25, seed=11))
    samples = build_samples(data, seq_len=20)
    out = tmp_path_factory.mktemp("tiny-run")
    settings = TrainSettings(epochs=2, progress=False, item_dim=8, cat_dim=8, recall_epochs=3, recall_dim=16)
    trained = train_bundle(samples, settings, out / "bundle", run_dir=out)
    return data, samples, trained.bundle, trained.result.metrics


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory):
    """A real moto server (boto3 talks HTTP to it, nothing is patched), on a free loopback port."""
    import shutil
    import sys

    exe = shutil.which("moto_server") or str(Path(sys.executable).parent / "moto_server")
    if not Path(exe).exists():
        pytest.fail("moto_server not found: pip install 'moto[server]' (in the dev extra)")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc, log = _spawn_server([exe, "-H", "127.0.0.1", "-p", str(port)], tmp_path_factory.mktemp("moto") / "moto.log",
                              url + "/moto-api/", "moto_server", timeout_s=30)
    yield url
    proc.terminate()
    proc.wait(timeout=10)
    log.close()


def _spawn_server(cmd: list[str], log_path: Path, probe, what: str, timeout_s: float, cwd: Path | None = None):
    """Start a server process logging to ``log_path``; return (process, log file) once ``probe``
    (a URL or urllib Request) answers, or fail the test."""
    import subprocess
    import time
    import urllib.request

    log = log_path.open("w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=cwd)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(probe, timeout=1):
                return proc, log
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                log.close()
                pytest.fail(f"{what} did not start (see {log_path})")
            time.sleep(0.1)


@pytest.fixture
def aws_env(moto_endpoint, monkeypatch):
    """Point boto3 at the moto server through its standard environment variables."""
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": moto_endpoint}.items():
        monkeypatch.setenv(key, value)
    return moto_endpoint


@pytest.fixture
def metadata_mock(tmp_path):
    """Start AWS's amazon-ec2-metadata-mock (IMDSv2 only) with the given sub-command and flags on a
    free loopback port; returns its base URL. Built by deploy/local/services.sh (DINREC_AEMM)."""
    import urllib.request

    exe = _need("DINREC_AEMM")
    if not Path(exe).exists():
        pytest.fail(f"DINREC_AEMM={exe} does not exist: run deploy/local/services.sh start")
    started: list[tuple[subprocess.Popen, TextIO]] = []

    def start(*args: str, port: int | None = None) -> str:
        port = port or free_port()
        url = f"http://127.0.0.1:{port}"
        token = urllib.request.Request(url + "/latest/api/token", method="PUT",
                                       headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
        started.append(_spawn_server([exe, "--imdsv2", "--hostname", "127.0.0.1", "--port", str(port), *args],
                                     tmp_path / f"aemm-{port}.log", token, "ec2-metadata-mock", timeout_s=20,
                                     cwd=tmp_path))
        return url

    yield start
    for proc, log in started:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


class RedisServer:
    """A redis-server of the test's own (the shared one is not for killing), persisting to an RDB
    snapshot only when told: a restart comes back with the data as of the last SAVE."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.port = folder, free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        import subprocess

        import redis

        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.folder), "--dbfilename", "dump.rdb", "--logfile", str(self.folder / "redis.log")])
        client = redis.Redis.from_url(self.url)

        def pings() -> bool:
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False

        wait_until(pings, timeout_s=20, what="redis-server up")
        client.close()

    def kill(self) -> None:
        import signal

        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def save(self) -> None:
        import redis

        client = redis.Redis.from_url(self.url)
        client.save()
        client.close()


def cluster_port() -> int:
    """A free loopback port whose cluster bus port (10,000 above it, so <= 55535) is free too."""
    import random
    import socket

    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20_000, 55_535)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10_000))
        except OSError:
            continue
        return port
    raise AssertionError("no free pair of loopback ports for a cluster node")


class RedisClusterServers:
    """A Redis Cluster of the test's own (3 primaries + 3 replicas on free loopback ports, made with
    ``redis-cli --cluster create``), for killing primaries; a 2 s node timeout, so a replica takes over
    a killed primary's slots within seconds."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.ports: list[int] = []
        while len(self.ports) < 6:
            port = cluster_port()
            if not {port, port + 10_000} & {q for p in self.ports for q in (p, p + 10_000)}:
                self.ports.append(port)
        self.procs: dict[int, subprocess.Popen] = {}
        self.url = f"redis://127.0.0.1:{self.ports[0]}"

    def start(self) -> None:
        import subprocess

        for port in self.ports:
            (self.folder / f"node-{port}").mkdir(parents=True, exist_ok=True)
            self.procs[port] = subprocess.Popen(
                ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                 "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000", "--save", "",
                 "--appendonly", "no", "--repl-diskless-sync-delay", "0",
                 "--dir", str(self.folder / f"node-{port}"), "--logfile", "redis.log"])
        for port in self.ports:
            wait_until(lambda p=port: self._answer(p, "PING"), timeout_s=20, what=f"node {port} up")
        subprocess.run(["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                        "--cluster-replicas", "1", "--cluster-yes"], check=True, capture_output=True, timeout=60)
        wait_until(self.healthy, timeout_s=30, what="the cluster to agree")
        # A replica that never finished its first sync refuses to take over ("disconnected from master for
        # longer than allowed"): the drill starts once every replica holds its primary's data.
        wait_until(self.replicas_in_sync, timeout_s=30, what="every replica to sync with its primary")

    def replicas_in_sync(self) -> bool:
        roles = [self._answer(p, "INFO", "replication") or {} for p in self.ports]
        replicas = [r for r in roles if r.get("role") == "slave"]
        return len(replicas) == 3 and all(r.get("master_link_status") == "up" for r in replicas)

    def _answer(self, port: int, *command: str):
        import redis

        try:
            client = redis.Redis(port=port, socket_timeout=1, decode_responses=True)
            try:
                return client.execute_command(*command)
            finally:
                client.close()
        except redis.RedisError:
            return None

    def healthy(self) -> bool:
        """Every live node says cluster_state:ok."""
        live = [p for p in self.ports if self.procs[p].poll() is None]
        return all("cluster_state:ok" in (self._answer(p, "CLUSTER", "INFO") or "") for p in live)

    def primary_of(self, key: str) -> int:
        """The port of the primary serving ``key``'s slot now."""
        live = next(p for p in self.ports if self.procs[p].poll() is None)
        slot = self._answer(live, "CLUSTER", "KEYSLOT", key)
        for start, end, primary, *_ in self._answer(live, "CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return int(primary[1])
        raise AssertionError(f"no node serves slot {slot}")

    def kill(self, port: int) -> None:
        proc = self.procs[port]
        proc.kill()
        proc.wait(timeout=10)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


@pytest.fixture
def own_cluster(tmp_path, redis_cluster_url):  # redis_cluster_url: only where the test services are
    cluster = RedisClusterServers(tmp_path / "cluster")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def own_redis(tmp_path, redis_url):  # redis_url: only where the test services (and redis-server) are
    server = RedisServer(tmp_path)
    server.start()
    yield server
    if server.proc and server.proc.poll() is None:
        server.kill()
