"""serving.turns: one inline ranking per turn of the event loop, so what the sockets bring between two
rankings (a new request to shed, a probe) runs before the next one."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from dinrec.serving.turns import RankingTurns


def _rank(log: list[str], name: str, seconds: float = 0.005) -> None:
    log.append(f"start {name}")
    end = time.perf_counter() + seconds  # inline CPU work, as /recommend's ranking: the loop is held
    while time.perf_counter() < end:
        pass
    log.append(f"end {name}")


async def _requests(turns: RankingTurns | None) -> list[str]:
    """Three requests ready together; while the first ranks, a byte arrives on a socket (a new request)."""
    loop = asyncio.get_running_loop()
    log: list[str] = []
    ours, theirs = socket.socketpair()
    ours.setblocking(False)

    def read() -> None:
        ours.recv(1)
        log.append("socket read")

    loop.add_reader(ours, read)

    async def request(name: str) -> None:
        if name == "a":
            theirs.send(b"x")  # arrives while "a" ranks: readable at the loop's next poll
        if turns is None:
            _rank(log, name)
            return
        async with turns:
            _rank(log, name)

    try:
        await asyncio.gather(request("a"), request("b"), request("c"))
        while "socket read" not in log:
            await asyncio.sleep(0)
    finally:
        loop.remove_reader(ours)
        ours.close()
        theirs.close()
    return log


def test_the_sockets_are_read_between_two_rankings_not_after_all_of_them():
    inline = asyncio.run(_requests(None))
    # Without turns, the three rank in one turn of the loop and the socket waits for all of them.
    assert inline == ["start a", "end a", "start b", "end b", "start c", "end c", "socket read"]
    turned = asyncio.run(_requests(RankingTurns()))
    assert turned == ["start a", "end a", "socket read", "start b", "end b", "start c", "end c"]


def test_a_waiter_cancelled_before_or_as_its_turn_comes_passes_it_on():
    async def scenario() -> list[str]:
        turns, log = RankingTurns(), []
        hold = asyncio.Event()

        async def request(name: str, wait: asyncio.Event | None = None) -> None:
            async with turns:
                log.append(name)
                if wait is not None:
                    await wait.wait()

        a = asyncio.create_task(request("a", hold))
        await asyncio.sleep(0)
        b, c, d = (asyncio.create_task(request(n)) for n in "bcd")
        while turns.waiting < 3:
            await asyncio.sleep(0)
        b.cancel()  # cancelled while waiting: leaves the queue
        await asyncio.sleep(0)
        assert turns.waiting == 2
        hold.set()
        await a
        c.cancel()  # handed the turn by a, cancelled before it ranks: the turn goes on to d
        await asyncio.gather(c, d, return_exceptions=True)
        assert b.cancelled() and c.cancelled()
        async with turns:  # free again: taken at once
            log.append("e")
        return log

    assert asyncio.run(scenario()) == ["a", "d", "e"]


@pytest.mark.parametrize("fail", [False, True])
def test_the_turn_is_given_back_whether_the_ranking_answers_or_raises(fail):
    async def scenario() -> int:
        turns = RankingTurns()

        async def request() -> None:
            async with turns:
                if fail:
                    raise RuntimeError("model failed")

        results = await asyncio.gather(*(request() for _ in range(4)), return_exceptions=True)
        assert all(isinstance(r, RuntimeError) for r in results) if fail else results == [None] * 4
        async with turns:
            return turns.waiting

    assert asyncio.run(scenario()) == 0
