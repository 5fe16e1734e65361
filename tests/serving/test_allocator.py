"""A worker limits glibc's malloc arenas before its serving threads start: threads that allocate then
share a few arenas instead of one each (each arena keeps freed memory of its own, which made a
long-running worker's RSS creep in `dinrec bench soak`)."""

import subprocess
import sys

import pytest

from tests.conftest import REPO

THREADS = """
import ctypes, sys, threading
from dinrec.serving.allocator import limit_arenas
applied = limit_arenas(int(sys.argv[1]))
held, go = [], threading.Barrier(8)
def work():
    go.wait()  # all at once, so that each new thread asks for an arena while the others hold theirs
    held.append([bytearray(64 * 1024) for _ in range(4)])  # malloc'd (below the mmap threshold)
threads = [threading.Thread(target=work) for _ in range(8)]
[t.start() for t in threads]; [t.join() for t in threads]
ctypes.CDLL("libc.so.6").malloc_stats()  # glibc: one "Arena N:" block per arena, on stderr
print(applied)
"""


def _arenas(limit: int) -> tuple[bool, int]:
    out = subprocess.run([sys.executable, "-c", THREADS, str(limit)], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip() == "True", sum(line.startswith("Arena ") for line in out.stderr.splitlines())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt (Linux)")
def test_the_workers_threads_share_the_arenas_the_setting_allows():
    applied, limited = _arenas(2)
    assert applied and 1 <= limited <= 2
    applied, default = _arenas(0)  # glibc's default: an arena per thread that allocates, up to 8 per core
    assert not applied and default > 2


def test_the_setting_is_validated_at_start_up():
    from pydantic import ValidationError

    from dinrec.serving.settings import ServingSettings

    assert ServingSettings().malloc_arenas == 2
    with pytest.raises(ValidationError):
        ServingSettings(malloc_arenas=-1)
