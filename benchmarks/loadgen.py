"""An open-loop HTTP/1.1 load generator that leaves the CPU to the service it measures.

On a 2-core box the generator shares the cores with the service, so its own cost per request is
part of what is measured. httpx spends ~1 ms of CPU per request; this sends prepared request bytes
over kept-alive connections and reads only the status line, Content-Length and body (~0.1 ms).

Open loop: request ``i`` leaves at ``start + i / rps`` whether or not earlier ones have answered
(a new connection is opened when none is idle), and its latency counts from that scheduled time,
so a stalled server shows up as latency instead of as fewer requests (no coordinated omission).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Outcome:
    sent_s: float     # the scheduled send time, from the start of the run
    latency_s: float  # from the scheduled send time to the last byte of the answer
    status: int       # 0: no answer (see ``failure``)
    degraded: bool    # the answer said "degraded": true
    failure: str = ""  # why there was no answer: timeout, connect, connection limit, …


# What both uvloop.run and asyncio.run are, as called here (their optional keywords differ).
_Runner = Callable[[Coroutine[Any, Any, list[Outcome]]], list[Outcome]]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile of latencies (numpy's linear interpolation), to 0.01; None when there are none."""
    return round(float(np.percentile(values, q)), 2) if len(values) else None


def request_bytes(host: str, port: int, path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nhost: {host}:{port}\r\naccept: application/json\r\n\r\n".encode()


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> tuple[int, bytes]:
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = None
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    if length is None:  # the service always sends Content-Length; anything else is an error here
        raise ConnectionError("response without content-length")
    return status, await reader.readexactly(length)


async def drive(host: str, port: int, requests: Sequence[bytes], rps: float, seconds: float,
                timeout_s: float = 1.0, max_connections: int = 1024) -> list[Outcome]:
    """Send ``rps × seconds`` requests (cycling through ``requests``) on schedule; one Outcome each."""
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    open_count = 0
    outcomes: list[Outcome] = []
    loop = asyncio.get_running_loop()

    async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        nonlocal open_count
        if open_count >= max_connections:
            raise ConnectionError("connection limit reached")
        open_count += 1
        try:
            return await asyncio.open_connection(host, port)
        except BaseException:
            open_count -= 1
            raise

    def drop(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        nonlocal open_count
        conn[1].close()
        open_count -= 1

    async def one(request: bytes, scheduled: float) -> None:
        conn = None
        status, degraded, failure = 0, False, ""
        try:
            async with asyncio.timeout_at(loop.time() + timeout_s - (time.perf_counter() - scheduled)):
                reused = bool(idle)
                conn = idle.pop() if reused else await connect()
                try:
                    status, body = await _exchange(*conn, request)
                except (asyncio.IncompleteReadError, ConnectionResetError, BrokenPipeError) as exc:
                    if not reused or (isinstance(exc, asyncio.IncompleteReadError) and exc.partial):
                        raise
                    # The server closed this idle connection (its keep-alive timeout) as the request
                    # left: nothing was answered, so send it again on a fresh one, as HTTP clients do.
                    drop(conn)
                    conn = None
                    conn = await connect()
                    status, body = await _exchange(*conn, request)
                degraded = b'"degraded":true' in body or b'"degraded": true' in body
            idle.append(conn)
            conn = None
        except TimeoutError:
            status, failure = 0, "timeout"
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:  # ConnectionError is an OSError
            status, failure = 0, f"{'connect' if conn is None else 'read'}: {type(exc).__name__}"
        finally:
            if conn is not None:  # a half-used connection cannot be reused
                drop(conn)
        outcomes.append(Outcome(scheduled - start, time.perf_counter() - scheduled, status, degraded, failure))

    tasks = []
    start = time.perf_counter()
    for i in range(int(rps * seconds)):
        scheduled = start + i / rps
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(requests[i % len(requests)], scheduled)))
    await asyncio.gather(*tasks)
    for _, writer in idle:
        writer.close()
    return outcomes


def run(host: str, port: int, requests: Sequence[bytes], rps: float, seconds: float,
        timeout_s: float = 1.0) -> list[Outcome]:
    """:func:`drive` on uvloop when it is installed (cheaper per request), else asyncio's loop.

    The collector is off while it runs: a full collection over the caller's heap (a bundle's
    vocabulary, torch) stalls the loop for 100+ ms, which would show as the service's latency."""
    try:
        import uvloop
        runner: _Runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return runner(drive(host, port, requests, rps, seconds, timeout_s))
    finally:
        if was_enabled:
            gc.enable()


async def _closed(host: str, port: int, requests: Sequence[bytes], concurrency: int, seconds: float) -> list[Outcome]:
    """``concurrency`` connections, each sending its next request when the last is answered."""
    outcomes: list[Outcome] = []
    start = time.perf_counter()

    async def client(k: int) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        i = k
        try:
            while (sent := time.perf_counter()) - start < seconds:
                status, body = await _exchange(reader, writer, requests[i % len(requests)])
                outcomes.append(Outcome(sent - start, time.perf_counter() - sent, status,
                                        b'"degraded":true' in body))
                i += concurrency
        finally:
            writer.close()

    await asyncio.gather(*(client(k) for k in range(concurrency)))
    return outcomes


def closed_loop(host: str, port: int, requests: Sequence[bytes], concurrency: int, seconds: float) -> list[Outcome]:
    """What the service completes when it is never idle and never queued past ``concurrency``: its capacity."""
    try:
        import uvloop
        runner: _Runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    return runner(_closed(host, port, requests, concurrency, seconds))
