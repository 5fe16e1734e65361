"""Serving settings (env prefix ``DINREC_``), created by the CLI or the caller of create_app."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from dinrec.models.ranking_settings import RankingSettings
from dinrec.storage.settings import SharedSettings

MIN_ADMIN_TOKEN_CHARS = 32
# Values copied from examples and manifests: a token anyone can read is no token.
_PLACEHOLDER_WORDS = ("change-me", "changeme", "secret", "password", "token", "example", "xxxx")


class ServingSettings(SharedSettings, RankingSettings):
    """The service's settings; what the served list is made of (lanes, seen policy, rules, the long-tail
    lane) is RankingSettings', read from the same variables by everything that measures that list."""

    model_config = SettingsConfigDict(env_prefix="DINREC_", extra="forbid", validate_default=True,
                                      populate_by_name=True)

    bundle_dir: Path = Field(Path("runs/latest/bundle"), description="the model bundle to serve (no registry)")
    model_alias: str = Field("champion", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", description=(
        "the registry alias this service serves and follows (hot reload)"))
    reload_poll_s: float = Field(2.0, gt=0, le=3600, description="how often the alias is checked for a new model")
    admin_token: SecretStr | None = Field(None, description=(
        "enables /admin/* with `Authorization: Bearer <token>`: at least 32 printable ASCII characters, no "
        "spaces (`openssl rand -hex 32`); a weaker or placeholder token is refused at start-up; empty: off"))
    results_token: SecretStr | None = Field(None, description=(
        "where the service listens beyond loopback, GET /experiments and /experiments/{name}/results answer only "
        "with `Authorization: Bearer <token>` (this token or the admin token; the dashboard takes it once as "
        "/dashboard#token=…); the same strength rules as the admin token. Bound to loopback (the default, the "
        "demo) it is not asked for; empty: the results are readable by whoever reaches the service"))
    host: str = Field("127.0.0.1", description="address the HTTP server binds")
    port: int = Field(8000, ge=0, le=65535, description="port the HTTP server binds (0: any free port)")
    catalog_poll_s: float = Field(5.0, ge=0, le=3600, description=(
        "how often the store's item catalog is read for items the model does not know (recalled by category); "
        "0: never"))
    events_per_user_per_minute: int = Field(600, ge=0, le=10_000_000, description=(
        "events one user id may send through POST /events per minute, per worker (a token bucket holding a "
        "minute's worth); more are answered 429 with Retry-After. The admin token is not counted (backfills). "
        "0: no quota"))
    cold_items_per_category: int = Field(1000, ge=1, le=1_000_000, description=(
        "items the model does not know kept recallable per category (the newest admitted): bounds the cold "
        "lane's memory and the time a request spends searching it"))
    recall_ef_search: int | None = Field(None, ge=1, le=100_000,
                                         description="HNSW search breadth (default: the bundle's, 400)")
    score_precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="DIN products in bf16 where the CPU has it and scores stay within 1e-3 of fp32")
    guardrail_interval_s: float = Field(30.0, gt=0, le=3600, description=(
        "how often the guardrail analyses running experiments (and stops a significantly worse variant)"))
    guardrail_min_users: int = Field(100, ge=2, description="users each arm needs before the guardrail may act")
    request_deadline_ms: int = Field(200, ge=1, le=60_000, description=(
        "a /recommend that has spent this long before ranking (a slow store) answers from the bundle's "
        "popularity instead, degraded with reason deadline"))
    store_cooldown_s: float = Field(
        1.0, gt=0, le=60, description="after a failed feature-store read, answer degraded this long before retrying")
    popular_cache_s: float = Field(1.0, ge=0, le=60, description=(
        "how long a worker reuses the store's live popularity (a sharded store merges its shards on every "
        "read): 0 reads it on every request that needs it"))
    user_header: str | None = Field(None, pattern=r"^[A-Za-z0-9-]{1,64}$", description=(
        "behind a gateway that authenticates users: the header carrying the user's id (e.g. x-user-id); "
        "/recommend and /events then answer only for that user (401 without it, 403 for another id)"))
    auto_promote: Literal["verified", "always"] = Field("verified", description=(
        "an experiment with promote moves its alias by itself when a winner is significant only where users "
        "are verified (DINREC_USER_HEADER): where clients may name any user, bots could pick the winner, so it "
        "is proposed and an operator approves it (POST /admin/experiments/{name}/approve). always: trust the "
        "clients"))
    anonymous_users: bool = Field(False, description=(
        "listening beyond loopback without DINREC_USER_HEADER: any caller may read and write any user by "
        "naming them. Refused at start-up unless this says it is meant (a public demo, a trusted network)"))
    explain: Literal["admin", "public", "off"] = Field("admin", description=(
        "who may ask /recommend for explain=true, which names the user's own recent behaviours: callers with "
        "the admin token, anyone (behind a gateway that authenticates users), or nobody"))
    max_in_flight: int = Field(8, ge=0, le=100_000, description=(
        "requests one worker holds at once (probes aside); more are answered 503 with Retry-After at once, so "
        "overload sheds instead of queueing without bound (0: no cap). A worker ranks one request at a time, "
        "so each one held adds its service time to the wait of every later one: keep it small"))
    max_body_bytes: int = Field(1 << 20, ge=1024, description="larger request bodies are refused (413)")
    request_body_timeout_s: float = Field(2.0, gt=0, le=600, description=(
        "a request's body must arrive whole within this long after its headers (else 408): it is read before "
        "the request takes an in-flight slot, so a client that sends headers and then nothing holds no slot"))
    max_body_reads_per_client: int = Field(8, ge=0, le=100_000, description=(
        "request bodies of one client address a worker reads at once; more are answered 429 at once (0: no "
        "limit). Behind a proxy every client has the proxy's address: raise it, or let the proxy buffer bodies"))
    request_read_timeout_s: float = Field(10.0, gt=0, le=600, description=(
        "a connection whose request (headers and body) has not fully arrived this long after its first byte, "
        "or after the connection opened, is closed: trickled or idle requests hold no connection"))
    health_port: int | None = Field(None, ge=0, le=65535, description=(
        "also answer GET /healthz on this port from a thread of its own, off the request loop, so a busy "
        "worker is not mistaken for a dead one (point the liveness probe here); unset: only on the main port"))
    liveness_max_stall_s: float = Field(30.0, gt=0, le=3600, description=(
        "on the health port, a worker whose event loop has not turned for this long answers 503 (stalled)"))
    workers: int | None = Field(None, ge=1, le=64, description=(
        "uvicorn worker processes (`dinrec serve --workers`); default: one per CPU with Redis as the store, "
        "1 with the embedded store (it lives inside one process)"))
    replica_dir: Path | None = Field(None, description=(
        "a folder the worker processes of this replica share (their merged /metrics, which worker runs the "
        "guardrail's decisions); `dinrec serve` with several workers makes a temporary one unless this is set"))
    torch_threads: int | None = Field(None, ge=1, le=256, description="per worker; default: CPUs / workers")
    malloc_arenas: int = Field(2, ge=0, le=1024, description=(
        "glibc malloc arenas per worker (0: glibc's default, 8 per core): a few keep freed memory where it can "
        "be reused, so a long-running worker's RSS stays flat (serving/allocator.py)"))
    log_format: Literal["json", "text"] = Field("json", description="one JSON object per log line, or plain text")
    access_log: bool = Field(False, description=(
        "a log line per request (uvicorn's access log); off by default: /metrics counts every request by route "
        "and status, and under a flood a line per refused request is CPU and disk a client makes the service spend"))
    max_k: int = Field(100, ge=1, le=1000, description="the largest list GET /recommend may ask for (k above it: 422)")
    default_k: int = Field(10, ge=1, le=1000, description="the list length when a request names no k")
    events_sink: Literal["store", "stream"] = Field(
        "stream", description="POST /events writes to the online store directly, or publishes to the stream")
    events_max_future_s: float = Field(300.0, ge=0, le=86_400, description=(
        "POST /events refuses an event whose ts is further than this past the server's clock (a history is "
        "ordered by ts: a future one would stay at its head)"))
    shutdown_drain_s: float = Field(5.0, ge=0, le=600,
                                    description="at shutdown, how long to keep sending accepted events to the stream")
    ingest_in_app: bool | None = Field(
        None, description="run the stream→store consumer inside the service; default: only for the in-process stream")

    @field_validator("admin_token", "results_token")
    @classmethod
    def _a_strong_token(cls, token: SecretStr | None) -> SecretStr | None:
        value = token.get_secret_value() if token is not None else ""
        if not value:
            return None  # set but empty (a compose file's blank): admin is off, as when unset
        if len(value) < MIN_ADMIN_TOKEN_CHARS:
            raise ValueError(f"too short ({len(value)} characters; at least {MIN_ADMIN_TOKEN_CHARS}: "
                             "`openssl rand -hex 32`)")
        if not all("!" <= c <= "~" for c in value):
            raise ValueError("printable ASCII without spaces only")
        if any(word in value.lower() for word in _PLACEHOLDER_WORDS) or len(set(value)) < 10:
            raise ValueError("looks like a placeholder; generate one: `openssl rand -hex 32`")
        return token

    @model_validator(mode="after")
    def _identity_beyond_loopback(self) -> ServingSettings:
        if self.user_header is None and not self.anonymous_users and not is_loopback(self.host):
            raise ValueError(
                f"host {self.host!r} is reachable beyond this machine, and without DINREC_USER_HEADER any caller "
                "may read and write any user's history by naming them: set DINREC_USER_HEADER to the header your "
                "gateway sets from its authentication (e.g. x-user-id), or DINREC_ANONYMOUS_USERS=true to serve "
                "anonymous users on purpose")
        return self


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the service on this machine (localhost, 127.0.0.0/8, ::1)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[] ")).is_loopback
    except ValueError:
        return False  # a name: it may resolve anywhere
