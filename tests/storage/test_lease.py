"""Leases on the storage layer, on a folder and on S3 (a real moto server): one holder at a time, a dead
holder's lease free once it expires, and a holder that was overtaken told so before it acts."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import boto3
import pytest

from dinrec.storage import Lease, LeaseHeld, LeaseLost, open_storage
from tests.conftest import REPO, wait_until


@pytest.fixture(params=["local", "s3"])
def location(request, tmp_path) -> str:
    if request.param == "local":
        return str(tmp_path / "shared")
    request.getfixturevalue("aws_env")
    bucket = request.getfixturevalue("unique")
    boto3.client("s3").create_bucket(Bucket=bucket)
    return f"s3://{bucket}/control"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def held(lease: Lease) -> dict:
    """What the lease's key holds now, which must have been taken."""
    record = lease.read()
    assert record is not None
    return record


def test_one_holder_at_a_time_and_an_expired_lease_is_taken_over(location):
    storage, clock = open_storage(location), Clock()
    a = Lease(storage, "leases/job.json", ttl_s=30, holder="a", clock=clock).acquire()
    b = Lease(open_storage(location), "leases/job.json", ttl_s=30, holder="b", clock=clock)
    with pytest.raises(LeaseHeld, match="another holder has the lease .*: a") as info:
        b.acquire()
    assert info.value.holder["holder"] == "a"
    clock.now += 20
    a.renew()  # good for 30 s from now
    clock.now += 20
    with pytest.raises(LeaseHeld):
        b.acquire()
    clock.now += 11  # a stalled past its lease: b takes it
    b.acquire()
    with pytest.raises(LeaseLost, match="taken over by b"):
        a.renew()
    with pytest.raises(LeaseLost):
        a.check()
    a.release()  # lost: leaves b's lease alone
    assert held(b)["holder"] == "b"
    b.release()  # released: free at once
    assert held(Lease(storage, "leases/job.json", ttl_s=30, holder="c", clock=clock).acquire())["holder"] == "c"


def test_a_killed_holders_lease_frees_itself_and_another_takes_over(location):
    """A process takes the lease, renews it from its background thread, and is SIGKILLed: the lease
    stays held while it renews, and is taken by another holder once ttl_s passed without a renewal."""
    script = textwrap.dedent(f"""
        import sys, time
        from dinrec.storage import Lease, open_storage
        with Lease(open_storage({location!r}), "leases/job.json", ttl_s=1.5, holder="doomed"):
            print("held", flush=True)
            time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None  # a pipe
    try:
        assert proc.stdout.readline().strip() == "held"
        other = Lease(open_storage(location), "leases/job.json", ttl_s=1.5, holder="next")
        renewed = held(other)["expires"]
        wait_until(lambda: held(other)["expires"] > renewed, timeout_s=10, what="the holder to renew")
        with pytest.raises(LeaseHeld):  # renewed: still held past its first expiry
            other.acquire()
        proc.kill()
        proc.wait(timeout=10)

        def taken() -> bool:
            try:
                other.acquire()
                return True
            except LeaseHeld:
                return False

        wait_until(taken, timeout_s=15, interval_s=0.1, what="the dead holder's lease to expire")
        assert held(other)["holder"] == "next"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def test_a_holder_whose_renewals_fail_learns_it_from_check(tmp_path):
    storage, clock = open_storage(tmp_path / "shared"), Clock()
    mine = Lease(storage, "lease", ttl_s=0.3, holder="mine", clock=clock).acquire().keep()
    mine.check()  # renewing: fine
    clock.now += 1  # its renewals keep it (they use the same clock)
    Lease(storage, "lease", ttl_s=0.3, holder="thief", clock=lambda: clock.now + 100).acquire()  # a clock far ahead
    wait_until(lambda: mine._lost is not None, timeout_s=10, what="the renewal to find the lease taken")
    with pytest.raises(LeaseLost, match="taken over by thief"):
        mine.check()
    mine.release()
    assert held(Lease(storage, "lease"))["holder"] == "thief"


def test_a_holder_that_was_not_renewed_in_time_is_told_before_anyone_takes_over(location):
    """The review's case: A's storage fails, so its renewals do; past its TTL B takes the lease. A's
    ``check`` says so already when its last renewal runs out, not only once it sees B."""
    clock = Clock()
    a = Lease(open_storage(location), "lease.json", ttl_s=30, holder="a", clock=clock).acquire()
    clock.now += 20
    a.check()  # 10 s left of 30: still its own
    clock.now += 6
    with pytest.raises(LeaseLost, match="not renewed in time"):
        a.check()  # 4 s left: within half a renewal period, two renewals missed
    clock.now += 5
    b = Lease(open_storage(location), "lease.json", ttl_s=30, holder="b", clock=clock).acquire()
    assert b.token == a.token + 1
    b.check()
    with pytest.raises(LeaseLost):
        a.check()


def test_a_stalled_holders_write_cannot_overwrite_its_successors(location):
    """Fencing: each write the lease guards carries the writer's token; one that finds a higher token
    there is refused, even when the stale holder's own ``check`` would not have caught it."""
    clock = Clock()
    storage = open_storage(location)
    a = Lease(storage, "lease.json", ttl_s=30, holder="a", clock=clock).acquire()
    a.fenced_put_json(storage, "state.json", {"status": "running", "by": "a"})
    assert storage.get_json("state.json") == {"status": "running", "by": "a", "fence": a.token}
    clock.now += 31  # a stalls past its lease; b takes over and writes
    b = Lease(open_storage(location), "lease.json", ttl_s=30, holder="b", clock=clock).acquire()
    b.fenced_put_json(storage, "state.json", {"status": "running", "by": "b"})
    a._valid_until = clock.now + 30  # a stale holder that believes itself renewed (a clock jump, a bug)
    with pytest.raises(LeaseLost, match="later holder"):
        a.fenced_put_json(storage, "state.json", {"status": "done", "by": "a"})
    assert (storage.get_json("state.json") or {}).get("by") == "b"
    b.release()
    again = Lease(storage, "lease.json", ttl_s=30, holder="b", clock=clock).acquire()  # the same holder: its token
    assert again.token == b.token
