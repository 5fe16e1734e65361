"""The outbox: accepted events survive a stopped broker and a killed process, and arrive in order."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from dinrec.events.schema import BehaviourEvent
from dinrec.streams.base import event_record
from dinrec.streams.inprocess import InProcessStream
from dinrec.streams.kafka_stream import KafkaStream
from dinrec.streams.outbox import Outbox, OutboxFull
from tests.conftest import REPO, wait_until


def records(n: int, start: int = 0):
    return [event_record(BehaviourEvent(event_id=f"e{i}", user_id=f"u{i % 9}", item_id=f"i{i}", ts=float(i)))
            for i in range(start, start + n)]


def arrived(stream: InProcessStream, want: int, timeout_s: float = 30) -> list[bytes]:
    c = stream.consumer("check")
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        got += [r.value for r in c.poll(max_records=10_000, timeout_s=0.2)]
    return got


def test_accepted_events_arrive_in_order_across_segments(tmp_path):
    stream = InProcessStream()
    box = Outbox(stream, tmp_path, segment_bytes=4096, send_batch=50).start()
    sent = records(300)
    for i in range(0, 300, 30):
        box.put(sent[i:i + 30])
    assert arrived(stream, 300) == [r.value for r in sent]
    wait_until(lambda: box.pending_bytes == 0, what="the outbox to drain")
    segments = sorted((tmp_path / "slot-0").glob("*.log"))
    assert len(segments) == 1  # sent segments are deleted; ~20 were written
    assert box.sent == 300
    box.close()


def test_a_stopped_broker_holds_nothing_up_and_a_full_journal_refuses(tmp_path):
    down = KafkaStream("127.0.0.1:1", "t", request_timeout_ms=500)  # a real client that cannot connect
    box = Outbox(down, tmp_path, max_bytes=64 * 1024).start()
    accepted = 0
    started = time.monotonic()
    with pytest.raises(OutboxFull, match="unsent bytes"):
        for i in range(10_000):
            box.put(records(10, start=i * 10))
            accepted += 10
    assert time.monotonic() - started < 5  # appends never waited for the broker
    assert 0 < box.pending_bytes <= 64 * 1024
    box.close(drain_timeout_s=0)
    down.close()
    # The broker is back (here: another stream): everything accepted is sent, nothing else.
    stream = InProcessStream()
    again = Outbox(stream, tmp_path).start()
    assert arrived(stream, accepted) == [r.value for r in records(accepted)]
    again.close()


KILLED = """
import sys, time
from dinrec.streams.outbox import Outbox
from dinrec.streams.kafka_stream import KafkaStream
from tests.streams.test_outbox import records
box = Outbox(KafkaStream("127.0.0.1:1", "t", request_timeout_ms=500), sys.argv[1]).start()
for i in range(0, 500, 50):
    box.put(records(50, start=i))
print("accepted", flush=True)
time.sleep(600)
"""


def test_kill_minus_nine_loses_nothing_accepted_and_a_torn_tail_is_cut(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "accepted"
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    (segment,) = (tmp_path / "slot-0").glob("*.log")
    with segment.open("ab") as fh:  # as if a write had been cut mid-entry (it was never acknowledged)
        fh.write(b"\x40\x00\x00\x00\x01\x02")
    stream = InProcessStream()
    box = Outbox(stream, tmp_path).start()
    assert arrived(stream, 500) == [r.value for r in records(500)]
    assert arrived(stream, 501, timeout_s=1.0)[500:] == []  # no garbage from the torn tail
    box.close()


def test_each_process_takes_its_own_slot(tmp_path):
    a = Outbox(InProcessStream(), tmp_path)
    b = Outbox(InProcessStream(), tmp_path)
    assert (a.dir.name, b.dir.name) == ("slot-0", "slot-1")
    a.close()
    c = Outbox(InProcessStream(), tmp_path)  # a restarted worker takes the free slot back
    assert c.dir.name == "slot-0"
    b.close()
    c.close()


DISK_FULL = """
import resource, signal, sys
from dinrec.streams.outbox import Outbox, OutboxFull
from dinrec.streams.inprocess import InProcessStream
from tests.streams.test_outbox import records
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit a write is cut short, then fails (EFBIG)
box = Outbox(InProcessStream(), sys.argv[1])  # never started: what is accepted stays journaled
resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))
accepted = 0
for i in range(0, 10_000, 50):
    try:
        box.put(records(50, start=i))
    except OutboxFull as exc:
        print(accepted, box.pending_bytes, exc, flush=True)
        break
    accepted += 50
"""


def test_a_write_the_disk_refuses_is_answered_full_and_leaves_nothing_torn(tmp_path):
    out = subprocess.run([sys.executable, "-c", DISK_FULL, str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    accepted, pending, message = out.stdout.split(" ", 2)
    assert int(accepted) > 0 and "cannot write" in message
    (segment,) = (tmp_path / "slot-0").glob("*.log")
    assert segment.stat().st_size == int(pending) < 20_000  # cut back to the last whole entry
    stream = InProcessStream()
    box = Outbox(stream, tmp_path).start()  # the disk has room again: exactly what was accepted is sent
    assert arrived(stream, int(accepted)) == [r.value for r in records(int(accepted))]
    assert arrived(stream, int(accepted) + 1, timeout_s=1.0)[int(accepted):] == []
    box.close()


NO_DESCRIPTORS = """
import json, os, resource, sys
from dinrec.streams.outbox import Outbox, OutboxFull
from dinrec.streams.inprocess import InProcessStream
from tests.streams.test_outbox import records
box = Outbox(InProcessStream(), sys.argv[1], segment_bytes=4096)  # never started: what is accepted stays
accepted = 0
while box._seg_size + 30 * 120 <= 4096:  # fill the first segment: the next put must start a new one
    box.put(records(30, start=accepted)); accepted += 30
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
hog = []
try:
    while True:
        hog.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
refused = []
for _ in range(3):  # every put while no descriptor is free: refused as full, the journal as it was
    try:
        box.put(records(30, start=accepted)); accepted += 30
    except OutboxFull as exc:
        refused.append(str(exc))
failing = box.journal_problem()
for fd in hog:
    os.close(fd)
box.put(records(30, start=accepted)); accepted += 30  # descriptors again: it rolls and accepts
print(json.dumps({"accepted": accepted, "refused": refused, "failing": failing,
                  "after": box.journal_problem(), "segments": sorted(os.listdir(box.dir))}))
"""


def test_a_segment_that_cannot_be_opened_refuses_the_put_and_leaves_the_journal_writable(tmp_path):
    """Out of descriptors when a segment is full: the put is answered full (503 upstream), readiness says
    the journal is failing, and once descriptors are free the next put rolls — no closed descriptor
    written to, no segment number without a file — and everything accepted is sent, in order."""
    import json

    out = subprocess.run([sys.executable, "-c", NO_DESCRIPTORS, str(tmp_path)], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert len(got["refused"]) == 3 and all("cannot start a new segment" in m for m in got["refused"])
    assert got["failing"] is not None and "cannot start a new segment" in got["failing"] and got["after"] is None
    assert [n for n in got["segments"] if n.endswith(".log")] == ["000000000000.log", "000000000001.log"]
    stream = InProcessStream()
    box = Outbox(stream, tmp_path).start()
    assert arrived(stream, got["accepted"]) == [r.value for r in records(got["accepted"])]
    box.close()


def test_an_unreadable_cursor_sends_again_instead_of_failing_start_up(tmp_path):
    box = Outbox(InProcessStream(), tmp_path)
    box.put(records(5))
    box.close()
    (tmp_path / "slot-0" / "cursor").write_text("")  # as a crash can leave it
    stream = InProcessStream()
    again = Outbox(stream, tmp_path).start()
    assert arrived(stream, 5) == [r.value for r in records(5)]
    again.close()


def test_a_slot_left_by_a_worker_that_no_longer_runs_is_adopted_and_sent(tmp_path):
    from dinrec.streams.outbox import adopt_orphaned_slots

    first, second = Outbox(InProcessStream(), tmp_path), Outbox(InProcessStream(), tmp_path)  # two workers
    first.put(records(5))
    second.put(records(5, start=5))
    first.close()
    second.close()  # the host restarts with one worker: slot-1 is nobody's
    stream = InProcessStream()
    box = Outbox(stream, tmp_path).start()  # takes slot-0 and sends its own
    assert adopt_orphaned_slots(stream, tmp_path, box.dir) == 1
    assert sorted(arrived(stream, 10)) == sorted(r.value for r in records(10))
    assert adopt_orphaned_slots(stream, tmp_path, box.dir) == 0  # sent: nothing left to adopt
    box.close()


def test_a_put_wakes_the_idle_sender_at_once(tmp_path, monkeypatch):
    """The sender (storage.loops.worker) sleeps until a put wakes it: with its fallback timer at an hour,
    each put still goes out at once."""
    import dinrec.streams.outbox as outbox_module

    monkeypatch.setattr(outbox_module, "_IDLE_S", 3600.0)
    stream = InProcessStream()
    box = Outbox(stream, tmp_path).start()
    for i in range(3):
        wait_until(box._drained.is_set, what="the sender to find nothing left and sleep")
        box.put(records(10, start=10 * i))
        wait_until(lambda: box.sent == 10 * (i + 1), what="the put to be sent")  # noqa: B023 - used at once
    assert box.sender_alive
    assert arrived(stream, 30) == [r.value for r in records(30)]
    box.close()
