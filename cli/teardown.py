"""Keep Triton's teardown leak report off the terminal."""

from __future__ import annotations

import os
import sys


def quiet_triton_teardown() -> None:
    """Registered with atexit: once everything of ours is written, if torch imported Triton
    (torch.optim imports torch._dynamo, which probes for it), hide the leak report its nanobind
    bindings print while the interpreter tears down — a known Triton bug (triton-lang/triton-cpu#278)
    that Triton silences the same way in its own workers; dinrec never runs Triton kernels, and the
    report reads like a crash."""
    if "triton" not in sys.modules:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
