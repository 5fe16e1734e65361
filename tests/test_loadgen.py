"""The load generator behind `dinrec bench serve`, against a real uvicorn server on loopback."""

import asyncio

from fastapi import FastAPI, Response

from dinrec.benchmarks import loadgen
from dinrec.serving.server import free_port, serve_in_thread


def _app() -> FastAPI:
    app = FastAPI()

    @app.get("/ok")
    async def ok():
        return {"degraded": False}

    @app.get("/degraded")
    async def degraded():
        return Response(b'{"degraded":true}', media_type="application/json")

    @app.get("/down")
    async def down():
        return Response(b'{"error":"x"}', status_code=503, media_type="application/json")

    @app.get("/slow")
    async def slow():
        await asyncio.sleep(0.5)
        return {"degraded": False}

    return app


def test_outcomes_count_status_degraded_and_timeouts_from_the_schedule():
    port = free_port()
    paths = ["/ok", "/degraded", "/down", "/slow"]
    requests = [loadgen.request_bytes("127.0.0.1", port, p) for p in paths]
    with serve_in_thread(_app(), port):
        outcomes = loadgen.run("127.0.0.1", port, requests, rps=40, seconds=1, timeout_s=0.2)
    assert len(outcomes) == 40
    statuses = sorted((o.status, o.degraded) for o in outcomes)
    assert statuses.count((200, False)) == 10 and statuses.count((200, True)) == 10
    assert statuses.count((503, False)) == 10 and statuses.count((0, False)) == 10  # /slow: past the timeout
    timed_out = [o for o in outcomes if o.status == 0]
    assert all(o.latency_s >= 0.19 for o in timed_out)  # the loop's timer fires to the millisecond
    assert all(o.latency_s < 0.2 for o in outcomes if o.status != 0)
