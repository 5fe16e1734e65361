"""Exit codes a scheduler can act on: 75 (EX_TEMPFAIL) when a dependency is down — retry later — apart from 2,
a usage or configuration error that a retry cannot fix; and `dinrec --version`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dinrec.registry.store import UnknownAlias, open_registry
from dinrec.storage import CloudError, outage
from tests.conftest import REPO, free_port


def _dinrec(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dinrec.cli.main", *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


@pytest.fixture
def dead_port() -> int:
    """A loopback port nothing listens on: connecting is refused at once."""
    return free_port()


def test_version():
    from dinrec.models.bundle import code_version

    out = _dinrec("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"dinrec {code_version()}"


def test_an_unreachable_redis_exits_75(dead_port, tmp_path):
    events = tmp_path / "events.jsonl"
    events.write_text('{"user_id": "u1", "item_id": "i1", "ts": 1700000000}\n')
    out = _dinrec("ingest", "backfill", "--data", str(events), "--to", "store",
                  env={"DINREC_STORE": "redis", "DINREC_REDIS_URL": f"redis://127.0.0.1:{dead_port}/0"})
    assert out.returncode == 75, out.stderr
    assert "a dependency is unavailable: StoreUnavailable; retry later" in out.stderr
    assert "Traceback" not in out.stderr


def test_an_unreachable_kafka_exits_75(dead_port):
    out = _dinrec("ingest", "--idle-exit", "1", env={"DINREC_STREAM": "kafka",
                                                   "DINREC_KAFKA_BOOTSTRAP": f"127.0.0.1:{dead_port}"})
    assert out.returncode == 75, out.stderr[-2000:]
    assert "a dependency is unavailable: StreamUnavailable" in out.stderr
    assert "Traceback" not in out.stderr


def test_an_unreachable_s3_exits_75_and_a_refusing_one_2(dead_port, aws_env, tmp_path):
    down = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{dead_port}"}
    out = _dinrec("models", "list", "--registry", "s3://models/registry", env=down)
    assert out.returncode == 75, out.stderr
    assert "a dependency is unavailable: CloudError" in out.stderr
    # S3 answers, and refuses: no such bucket is a configuration error, not an outage.
    out = _dinrec("models", "list", "--registry", "s3://no-such-bucket/registry")
    assert out.returncode == 2, out.stderr
    assert "NoSuchBucket" in out.stderr and "retry later" not in out.stderr


def test_a_usage_error_exits_2(tmp_path):
    out = _dinrec("models", "list", "--registry", "ftp://somewhere/registry")
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("error: ") and "retry later" not in out.stderr


def test_an_outage_is_not_an_unknown_alias(dead_port, tmp_path, monkeypatch):
    """A registry that cannot be read is not a registry without a champion: the retrain job would otherwise
    train a "first model" and promote it ungated. The outage is found through the registry error's cause."""
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{dead_port}",
                       "AWS_MAX_ATTEMPTS": "1"}.items():
        monkeypatch.setenv(key, value)
    registry = open_registry("s3://models/registry", tmp_path / "cache")
    with pytest.raises(Exception) as caught:
        registry.resolve("champion")
    assert not isinstance(caught.value, UnknownAlias)
    assert isinstance(outage(caught.value), CloudError)
    local = open_registry(tmp_path / "registry", tmp_path / "cache")
    with pytest.raises(UnknownAlias) as missing:
        local.resolve("champion")
    assert outage(missing.value) is None


def test_only_a_transient_cloud_error_is_an_outage():
    assert outage(CloudError("s3 get: SlowDown", "SlowDown", transient=True)) is not None
    assert outage(CloudError("s3 get: AccessDenied", "AccessDenied")) is None
    try:
        try:
            raise CloudError("s3 get: endpoint unreachable", transient=True)
        except CloudError as inner:
            raise ValueError("registry s3://x: get aliases/champion") from inner
    except ValueError as outer:
        assert outage(outer) is not None


@pytest.mark.kafka
@pytest.mark.parametrize("fmt", ["json", "text"])
def test_every_process_logs_in_the_format_asked(kafka_bootstrap, unique, fmt):
    """Not only the API: the ingest consumer (like retrain and train) logs what DINREC_LOG_FORMAT says."""
    import json

    env = {"DINREC_STREAM": "kafka", "DINREC_KAFKA_BOOTSTRAP": kafka_bootstrap, "DINREC_TOPIC": unique,
           "DINREC_LOG_FORMAT": fmt}
    out = _dinrec("ingest", "--idle-exit", "1", env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert any("created topic" in line for line in lines), lines  # an info line of the consumer's
    for line in lines:
        if fmt == "json":
            entry = json.loads(line)
            assert {"time", "level", "logger", "message"} <= entry.keys()
        else:
            assert not line.startswith("{"), line
