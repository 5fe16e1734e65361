"""One ranking per turn of the event loop.

``/recommend`` ranks inline on the worker's event loop (serving/routes.py says why). asyncio runs, in one
turn of its loop, every callback that was ready when the turn began, and polls the sockets only between
turns. Requests that became ready together would each rank to the end in that one turn — up to the in-flight
cap's worth, ~6 ms each — while new connections wait in the kernel: the 503 that shedding owes them, and the
answer to a probe, waited for all of them.

:class:`RankingTurns` lets one request rank at a time, and hands the turn on only through the loop, so the
sockets are polled between any two rankings and what they bring runs before the next one: a request that
arrives meanwhile is read, and refused when the worker is full, after one ranking at most. The order is first
come, first served; the work done is the same.
"""

from __future__ import annotations

import asyncio
from collections import deque
from types import TracebackType


class RankingTurns:
    """An async context manager: ``async with turns:`` around the inline work of one request."""

    def __init__(self) -> None:
        self._busy = False
        self._waiting: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        """Requests waiting for their turn (for tests and metrics)."""
        return len(self._waiting)

    async def __aenter__(self) -> None:
        if not self._busy and not self._waiting:
            self._busy = True
            return
        turn = asyncio.get_running_loop().create_future()
        self._waiting.append(turn)
        try:
            await turn  # resolved by the request before this one, on its way out
            # The turn is ours (_busy stayed True through the handover). One more turn of the loop before
            # ranking: what the poll that woke us read (new requests: their 503s, probes) runs first.
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():  # the turn was ours: pass it on
                asyncio.get_running_loop().call_soon(self._pass_on)
            else:
                self._waiting.remove(turn)
            raise

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        # Held until the loop's next turn: a request that became ready in this turn, behind this one, waits
        # for it too, rather than ranking in the same turn before the sockets are polled.
        asyncio.get_running_loop().call_soon(self._pass_on)

    def _pass_on(self) -> None:
        """Give the turn to the first waiter (its task resumes in a later turn of the loop: a future's
        callbacks are scheduled, never run in place), or free it."""
        while self._waiting:
            turn = self._waiting.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self._busy = False
