"""Synthetic event logs for the retraining tests: users whose interests drift to new items.

Phase 1 (the champion's data): 40 categories of 25 items each; each user clicks within two favourite
categories (90 %), popular items more often. Phase 2 (after the champion's window): 15 new categories
of new items arrive and each user's favourites move to one old and one new category — what the
champion cannot know and a retrained model learns.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from dinrec.events.schema import BehaviourEvent
from dinrec.streams.archive import archive_events

DAY = 86_400.0
END = 1_790_000_000.0 // 3600 * 3600  # the newest window's end (aligned, as the job aligns it)
FAST = {"DINREC_TRAIN_EPOCHS": "3", "DINREC_TRAIN_RECALL_EPOCHS": "5", "DINREC_TRAIN_NEGATIVE_POWER": "1",
        "DINREC_TRAIN_BATCH_SIZE": "256", "DINREC_TRAIN_THREADS": "1"}


def _clicks(rng, users: int, per_user: int, favourites, catalog, t0: float, t1: float, tag: str):
    events = []
    for u in range(users):
        ts = np.sort(rng.uniform(t0, t1, per_user))
        for j, t in enumerate(ts):
            cat = favourites[u][rng.integers(len(favourites[u]))] if rng.random() < 0.9 \
                else rng.integers(len(catalog))
            items = catalog[cat]
            weights = 1.0 / np.arange(1, len(items) + 1) ** 0.8
            item = items[rng.choice(len(items), p=weights / weights.sum())]
            events.append(BehaviourEvent(event_id=f"{tag}-{u}-{j}", user_id=f"u{u}", item_id=f"i{item}",
                                         category_id=f"c{cat}", event_type="click", ts=round(float(t), 3)))
    return events


def drifting_world(end: float, users: int = 300, per_user: int = 12, seed: int = 0):
    """(phase-1 events in [end − 10 d, end − 5 d), phase-2 events in [end − 5 d, end))."""
    rng = np.random.default_rng(seed)
    old_cats, new_cats, per_cat = 40, 15, 25
    catalog = [list(range(c * per_cat, (c + 1) * per_cat)) for c in range(old_cats + new_cats)]
    old_fav = [rng.choice(old_cats, 2, replace=False) for _ in range(users)]
    new_fav = [np.array([f[0], old_cats + rng.integers(new_cats)]) for f in old_fav]
    old_catalog = catalog[:old_cats]
    phase1 = _clicks(rng, users, per_user, old_fav, old_catalog, end - 10 * DAY, end - 5 * DAY, "a")
    phase2 = _clicks(rng, users, per_user, new_fav, catalog, end - 5 * DAY, end, "b")
    return phase1, phase2


def chain_world(end: float, users: int = 300, chains: int = 8, length: int = 100, steps: int = 12, seed: int = 1):
    """Users who walk chains of items, one step at a time (item j, then j + 1): what comes next is the
    successor of the newest behaviour — item-to-item co-visitation finds it, a model blind to order
    does not. Events in [end − 10 d, end)."""
    rng = np.random.default_rng(seed)
    events = []
    for u in range(users):
        chain, start = rng.integers(chains), rng.integers(length - steps)
        ts = np.sort(rng.uniform(end - 10 * DAY, end, steps))
        for j, t in enumerate(ts):
            item = chain * length + start + j
            events.append(BehaviourEvent(event_id=f"c-{u}-{j}", user_id=f"u{u}", item_id=f"i{item}",
                                         category_id=f"c{chain}", event_type="click", ts=round(float(t), 3)))
    return events


def archive(events: list[BehaviourEvent], root, topic: str = "dinrec.events") -> None:
    """Publish ``events`` and archive them as the ingest side would (streams.archive)."""
    stats = archive_events(events, root, topic)
    assert stats.records == len(events)


def retrain(root, *args: str, env: dict | None = None, wait: bool = True, stderr: list[str] | None = None):
    """``dinrec retrain`` on ``root``'s archive, registry and work folder: (exit code, report), or the
    running process when ``wait`` is False; its stderr appended to ``stderr`` when given."""
    from tests.conftest import REPO

    full = {**os.environ, **FAST, "DINREC_RETRAIN_ARCHIVE_DIR": str(root / "archive"),
            "DINREC_REGISTRY": str(root / "registry"), "DINREC_RETRAIN_WORK_DIR": str(root / "work"),
            **(env or {})}
    cmd = [sys.executable, "-m", "dinrec.cli.main", "retrain", *args]
    if not wait:
        return subprocess.Popen(cmd, cwd=REPO, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = subprocess.run(cmd, cwd=REPO, env=full, capture_output=True, text=True, timeout=600)
    if stderr is not None:
        stderr.append(out.stderr)
    report = json.loads(out.stdout.strip().splitlines()[-1]) if out.stdout.strip() else None
    assert report is not None, out.stderr[-3000:]
    return out.returncode, report
