"""glibc's allocator, told how a long-running service allocates.

By default glibc gives threads that allocate concurrently arenas of their own, up to 8 per core, and
gives memory back to the system only from the top of an arena. A worker's request threads allocate and
free many short-lived buffers (request bodies, tensors, the store's expiring entries), so freed memory
stays spread over many arenas and the process's RSS creeps long after every table it keeps is bounded.
`dinrec bench soak` on the embedded store (7 minutes at 600 requests/s of invented ids, the 2-core dev
VM): +24.6 MB over the last 3½ minutes with glibc's defaults, −6.5 MB with two arenas. The environment's
``MALLOC_ARENA_MAX`` does the same, but only for a process started with it; this applies to the threads
a worker starts after it, which are the ones that serve.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

log = logging.getLogger(__name__)

M_ARENA_MAX = -8  # mallopt's parameter (glibc's malloc.h)


def limit_arenas(arenas: int) -> bool:
    """At most ``arenas`` malloc arenas in this process (0: leave glibc as it is). Returns whether it was
    applied: not on another C library, which has no mallopt."""
    if arenas == 0 or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):  # musl and others
        log.info("no glibc mallopt here: the allocator is left as it is")
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if mallopt(M_ARENA_MAX, arenas) != 1:
        log.warning("glibc refused %d malloc arenas", arenas)
        return False
    return True
