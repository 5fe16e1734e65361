"""`dinrec train --ranks N`: one process per rank on this machine, launched by torchrun's own library.

This is ``torchrun --standalone --nproc-per-node N -m dinrec.cli.main train …`` with the two things a
spot job needs that the torchrun command does not give it:

- **its exit code says what happened.** torchrun exits 1 whether the ranks failed or stopped cleanly
  on a SIGTERM; here every rank exiting with EXIT_INTERRUPTED (stopped after a checkpoint), or the
  launcher itself stopped by SIGTERM/SIGINT (it passes the signal on and waits for the ranks'
  checkpoint), is EXIT_INTERRUPTED, so the agent relaunches instead of calling the job failed.
- **time to checkpoint.** The ranks get ``STOP_TIMEOUT_S`` between the signal and SIGKILL (torchrun's
  default is 30 s; a spot notice gives two minutes, and a sharded table's rows take a while to write).

SIGUSR1 (the agent's "one extra checkpoint, keep going") is sent to the whole process group by the
agent; the launcher ignores it so that only the ranks act on it.
"""

from __future__ import annotations

import logging
import signal
import sys
import uuid

from dinrec.spot.protocol import EXIT_INTERRUPTED

STOP_TIMEOUT_S = 100  # inside a spot interruption's two-minute notice, with room for the upload to finish

log = logging.getLogger(__name__)


def parse_ranks(value: str) -> int:
    """``gpus`` (one rank per visible GPU, one process without a GPU) or a positive count."""
    if value == "gpus":
        import torch

        return max(torch.cuda.device_count(), 1)
    try:
        ranks = int(value)
    except ValueError:
        ranks = 0
    if not 1 <= ranks <= 1024:
        raise ValueError(f"--ranks must be `gpus` or a count from 1 to 1024, got {value!r}")
    return ranks


def without_ranks(argv: list[str]) -> list[str]:
    """``argv`` less its ``--ranks`` option (either spelling): what each rank runs."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--ranks":
            skip = True
        elif not arg.startswith("--ranks="):
            out.append(arg)
    return out


def exit_code(failures: dict) -> int:  # {rank: ProcessFailure}
    """The launch's exit code from its failed ranks: interrupted when every failed rank stopped after a
    checkpoint (or was stopped by the launcher's SIGTERM on the way down), else the first failure's."""
    codes = [f.exitcode for f in failures.values()]
    if all(c in (EXIT_INTERRUPTED, -signal.SIGTERM) for c in codes) and EXIT_INTERRUPTED in codes:
        return EXIT_INTERRUPTED
    first = next((c for c in codes if c not in (EXIT_INTERRUPTED, -signal.SIGTERM)), codes[0])
    return first if 0 < first < 256 else 1


def launch(ranks: int, train_argv: list[str]) -> int:
    """Run ``dinrec train <train_argv>`` as ``ranks`` local processes; returns the exit code."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=ranks, run_id=str(uuid.uuid4()),
                          rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", max_restarts=0,
                          monitor_interval=0.2, shutdown_timeout=STOP_TIMEOUT_S)
    previous = signal.signal(signal.SIGUSR1, lambda *_: None)  # the ranks got it too (process group)
    try:
        elastic_launch(config, sys.executable)("-m", "dinrec.cli.main", "train", *train_argv)
    except SignalException as exc:  # SIGTERM/SIGINT: torchrun passed it on and waited for the ranks
        log.warning("stopped by %s: the ranks were asked to checkpoint and stop", exc.sigval.name)
        return EXIT_INTERRUPTED
    except ChildFailedError as exc:
        return exit_code(exc.failures)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    return 0
