"""`dinrec bench retrain --archive-span N`: does a retrain's data cost follow its window or the archive?

A dataset's log is archived twice (streams.archive, each record produced when it happened): the
whole log, and only its last 1/N — the window a retrain reads. The retrain's data phase (the window's
events read from the archive, then the training samples built from them: retrain.events.read_window,
training.pipeline.samples_for) runs on each in a fresh process, alternately, ``rounds`` times; the
result is each's median wall time and peak memory (the process's max RSS, and the phase's own peak of
allocations by tracemalloc, past the interpreter and its libraries) and the long archive's ratio to the
window alone. The peer, in the same run: the long archive read the way retraining read it
before, every file of the topic held in memory and the window filtered out of it.
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from dinrec.benchmarks.machine import machine
from dinrec.datasets import load_dataset
from dinrec.streams.archive import archive_events
from dinrec.training.progress import Stages, showing

TOPIC = "dinrec.events"


def read_once(archive: Path, start: float, end: float, scan: bool = False) -> dict:
    """The data phase, timed: in the process that measures its peak memory. ``scan``: the way it read
    before (the peer): every file of the topic into memory, then the window's events filtered out."""
    from dinrec.retrain.events import read_window, window_of
    from dinrec.streams.archive import read_archive
    from dinrec.training.pipeline import samples_for
    from dinrec.training.settings import TrainSettings

    settings = TrainSettings(progress=False)
    tracemalloc.start()  # what the phase allocates (Python and numpy), past the interpreter and its libraries
    t0 = time.perf_counter()
    if scan:  # the whole history held, then filtered
        window = window_of(read_archive(archive, TOPIC), TOPIC, start, end)
    else:
        window = read_window(archive, TOPIC, start, end)
    samples = samples_for(window.data, settings)
    seconds = time.perf_counter() - t0
    phase_peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return {"seconds": seconds, "events": window.stats["events"], "train_samples": len(samples.train),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "phase_peak_mb": phase_peak}


def _measure(archive: Path, start: float, end: float, scan: bool = False) -> dict:
    out = subprocess.run([sys.executable, "-m", "dinrec.benchmarks.window_bench", str(archive), str(start), str(end),
                          "scan" if scan else "window"], capture_output=True, text=True, timeout=1800, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_window(data_dir: Path, span: int = 10, rounds: int = 3, progress: bool | None = None) -> dict:
    """``progress``: a line per stage on stderr (default: when stderr is a terminal)."""
    say = Stages(showing(progress))
    data = load_dataset(data_dir)
    events = sorted(data.events(), key=lambda e: e.ts)
    ts = np.array([e.ts for e in events])
    end = (float(ts.max()) // 3600 + 1) * 3600
    start = end - (end - float(ts.min())) / span // 3600 * 3600  # the last 1/span of the log, whole hours
    with tempfile.TemporaryDirectory(prefix="dinrec-bench-window-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        full = archive_events(events, root / "long")
        archive_s = time.perf_counter() - t0
        alone = archive_events([e for e in events if e.ts >= start], root / "window")
        say(f"archived: {full.records} records in all, {alone.records} in the window")
        runs: dict[str, list[dict]] = {"window": [], "long": [], "long_scanned": []}
        for n in range(rounds):  # alternately, so drift in the machine hits each
            runs["window"].append(_measure(root / "window", start, end))
            runs["long"].append(_measure(root / "long", start, end))
            runs["long_scanned"].append(_measure(root / "long", start, end, scan=True))
            say(f"round {n + 1}/{rounds}: window {runs['window'][-1]['seconds']:.1f} s, "
                f"long {runs['long'][-1]['seconds']:.1f} s, scanned {runs['long_scanned'][-1]['seconds']:.1f} s")
    summary = {k: {"seconds": statistics.median(r["seconds"] for r in v),
                   "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in v),
                   "phase_peak_mb": statistics.median(r["phase_peak_mb"] for r in v),
                   "events": v[0]["events"], "train_samples": v[0]["train_samples"]} for k, v in runs.items()}
    assert summary["long"]["events"] == summary["window"]["events"], "the two archives' windows differ"
    return {"dataset": str(data_dir), "span": span, "window_hours": (end - start) / 3600,
            "archived_records": {"long": full.records, "window": alone.records, "files_long": full.files},
            "archive_seconds_long": round(archive_s, 1), "rounds": rounds, **summary,
            "ratio": {"seconds": summary["long"]["seconds"] / summary["window"]["seconds"],
                      "peak_rss": summary["long"]["peak_rss_mb"] / summary["window"]["peak_rss_mb"],
                      "phase_peak": summary["long"]["phase_peak_mb"] / summary["window"]["phase_peak_mb"],
                      "scanned_seconds": summary["long_scanned"]["seconds"] / summary["window"]["seconds"],
                      "scanned_phase_peak": summary["long_scanned"]["phase_peak_mb"]
                      / summary["window"]["phase_peak_mb"]},
            "machine": machine()}


if __name__ == "__main__":  # one measured run: archive, start, end, window|scan
    print(json.dumps(read_once(Path(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "scan")))
