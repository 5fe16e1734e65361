"""docs/api.md runs as written: each request, in order, against a real service; each answer has the status
and the shape the page shows. ``DINREC_WRITE_API_EXAMPLES=1`` rewrites the page's answers from this run."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from http import HTTPStatus

from dinrec.feature_store.online.memory import MemoryStore
from dinrec.feature_store.settings import FeatureStoreSettings
from dinrec.serving.settings import ServingSettings
from dinrec.streams.inprocess import InProcessStream
from tests.conftest import ADMIN_TOKEN, REPO
from tests.serving.conftest import live_server

PAGE = REPO / "docs" / "api.md"
# A request block, then its answer's block (the answer's body, where shown, is filled from a run).
_PAIR = re.compile(r"```http\n(?P<request>(?!HTTP/)[^`]*?)```\n\n[^`]*?"
                   r"```http\n(?P<response>HTTP/1\.1 [^`]*?)```", re.S)
_SHOWN_HEADERS = ("content-type", "retry-after")  # the headers an answer block shows
_METRICS_SHOWN = ("dinrec_http_request_seconds", "dinrec_degraded_responses_total", "dinrec_model_info",
                  "dinrec_store_up", "dinrec_thread_alive")


@dataclass
class Example:
    method: str
    target: str
    headers: dict[str, str]
    body: str
    status: int
    shown: str  # the answer block as the page has it
    span: tuple[int, int]  # where that block is in the page


def examples(text: str) -> list[Example]:
    found = []
    for m in _PAIR.finditer(text):
        head, _, body = m["request"].partition("\n\n")
        request_line, *header_lines = head.strip().splitlines()
        method, target, _ = request_line.split(" ")
        headers = dict(line.split(": ", 1) for line in header_lines)
        status = int(m["response"].split(" ", 2)[1])
        found.append(Example(method, target, {k.lower(): v for k, v in headers.items()}, body.strip(), status,
                             m["response"], m.span("response")))
    return found


def _shape(value):
    """What the page promises of a value: its fields, nested the same way, their JSON types (a list by its
    first element's shape; numbers are numbers, int or float)."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    if isinstance(value, bool) or value is None:
        return type(value).__name__
    return "number" if isinstance(value, int | float) else type(value).__name__


def _answer_block(response) -> str:
    reason = HTTPStatus(response.status_code).phrase
    lines = [f"HTTP/1.1 {response.status_code} {reason}"]
    lines += [f"{name}: {response.headers[name]}" for name in _SHOWN_HEADERS if name in response.headers]
    ctype = response.headers.get("content-type", "")
    if ctype.startswith("application/json"):
        body = json.dumps(response.json(), indent=2)
    elif ctype.startswith("text/plain"):  # /metrics: what a few of its families are (their values vary)
        body = "\n".join(line for line in response.text.splitlines()
                         if line.startswith("# ") and line.split(" ")[2] in _METRICS_SHOWN) + "\n…"
    else:  # the dashboard's page
        body = response.text.strip().splitlines()[0] + "\n…"
    return "\n".join(lines) + "\n\n" + body + "\n"


def _check(example: Example, response) -> None:
    where = f"docs/api.md: {example.method} {example.target}"
    assert response.status_code == example.status, f"{where}: {response.status_code} {response.text[:500]}"
    head, _, body = example.shown.partition("\n\n")
    shown_headers = dict(line.split(": ", 1) for line in head.splitlines()[1:])
    for name, value in shown_headers.items():
        assert response.headers.get(name, "").split(";")[0] == value.split(";")[0], f"{where}: header {name}"
    if shown_headers.get("content-type", "").startswith("application/json"):
        assert _shape(response.json()) == _shape(json.loads(body)), f"{where}: {response.text[:2000]}"
    elif body.strip():  # text: every line shown is in the answer
        missing = [line for line in body.strip().splitlines() if line != "…" and line not in response.text]
        assert not missing, f"{where}: not in the answer: {missing[:5]}"


def test_every_example_on_the_api_page_answers_as_shown(registry, tiny_run, tmp_path):
    text = PAGE.read_text()
    found = examples(text)
    store = MemoryStore()
    store.write(list(tiny_run[0].events()))
    settings = ServingSettings(registry=str(registry.root), reload_poll_s=0.2, admin_token=ADMIN_TOKEN,
                               events_sink="store", experiments_file=str(tmp_path / "experiments.json"),
                               score_precision="fp32")
    writing = os.environ.get("DINREC_WRITE_API_EXAMPLES") == "1"
    answers = []
    with live_server(settings, FeatureStoreSettings(), store=store, stream=InProcessStream()) as client:
        routes = {(method.upper(), path) for path, ops in client.get("/openapi.json").json()["paths"].items()
                  for method in ops}
        for example in found:
            headers = {k: v.replace("$TOKEN", ADMIN_TOKEN) for k, v in example.headers.items()}
            response = client.request(example.method, example.target, headers=headers,
                                      content=example.body.encode() or None)
            if writing:
                assert response.status_code == example.status, f"{example.target}: {response.text[:500]}"
                answers.append((example.span, _answer_block(response)))
            else:
                _check(example, response)
    # Every route the service has is on the page (its schema's, and the two it keeps out of it).
    documented = {(e.method, re.sub(r"/experiments/(?!plan$)[^/?]+", "/experiments/{name}", e.target.split("?")[0]))
                  for e in found}
    assert routes | {("GET", "/metrics"), ("GET", "/dashboard")} <= documented | {
        ("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/docs/oauth2-redirect"), ("GET", "/redoc")}, \
        sorted(routes - documented)
    assert len(found) >= 20
    if writing:
        for (start, end), block in reversed(answers):
            text = text[:start] + block + text[end:]
        PAGE.write_text(text)
