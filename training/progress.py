"""Progress on stderr for the long commands (train, retrain's candidate, benches): a line per stage, shown
when stderr is a terminal unless a setting says otherwise, so logs and pipes stay quiet by default."""

from __future__ import annotations

import os
import sys
import time


def showing(setting: bool | None) -> bool:
    """``setting`` (``DINREC_TRAIN_PROGRESS``, ``--no-progress``), else whether stderr is a terminal; never on a
    torchrun rank other than 0 (one process speaks for the job)."""
    if int(os.environ.get("RANK", "0")) != 0:
        return False
    return setting if setting is not None else sys.stderr.isatty()


class Stages:
    """``stages("towers trained")`` prints ``[  12.3 s] towers trained`` on stderr when on."""

    def __init__(self, on: bool) -> None:
        self.on, self.t0 = on, time.perf_counter()

    def __call__(self, what: str) -> None:
        if self.on:
            print(f"[{time.perf_counter() - self.t0:7.1f} s] {what}", file=sys.stderr, flush=True)
