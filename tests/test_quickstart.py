"""README's "Your first recommendation" runs as written: train, serve, three events in, the newcomer's list out."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO, free_port, wait_until


def _quickstart() -> str:
    text = (REPO / "README.md").read_text()
    found = re.search(r"<!-- quickstart:start -->\n```bash\n(.*?)```\n<!-- quickstart:end -->", text, re.S)
    assert found, "README.md has no quickstart block"
    return found.group(1)


@pytest.mark.slow
def test_the_readme_quickstart_runs_as_written(tmp_path):
    port = free_port()
    script = _quickstart()
    assert script.count("8000") >= 4  # the test moves the port, nothing else
    (tmp_path / "quickstart.sh").write_text(script.replace("8000", str(port)))
    # `dinrec` is this tree's, whatever the environment has installed.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "dinrec").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m dinrec.cli.main "$@"\n')
    (bin_dir / "dinrec").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(REPO),
           "DINREC_LOG_FORMAT": "text"}
    # Files, not pipes: the service the script leaves in the background holds them open.
    stdout, stderr = tmp_path / "stdout", tmp_path / "stderr"
    with stdout.open("w") as o, stderr.open("w") as e:
        proc = subprocess.Popen(["bash", "-e", "quickstart.sh"], cwd=tmp_path, env=env, stdout=o, stderr=e,
                                start_new_session=True)
    try:
        proc.wait(timeout=900)
        out, err = stdout.read_text(), stderr.read_text()
        assert proc.returncode == 0, err[-3000:]
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        ready, accepted, answer = lines[-3:]
        assert ready["status"] == "ready" and accepted == {"accepted": 3, "sink": "store"}
        items = [i["item_id"] for i in answer["items"]]
        assert answer["user_id"] == "newcomer" and len(items) == 5 and not answer["degraded"]
        assert not {"i1899", "i1209", "i51"} & set(items)  # nothing they took
        # Personal: the list is not the one a user with no history gets, and it leans to their categories.
        base = f"http://127.0.0.1:{port}"
        nobody = httpx.get(f"{base}/recommend", params={"user_id": "nobody-at-all", "k": 5}).json()
        assert items != [i["item_id"] for i in nobody["items"]]
        assert sum(i["category_id"] in {"c3", "c27"} for i in answer["items"]) >= 3
        assert httpx.get(f"{base}/dashboard").status_code == 200  # what the README points to
        assert httpx.get(f"{base}/docs").status_code == 200
    finally:
        _end_group(proc.pid)  # the service the script left running in the background


def _members(pgid: int) -> list[int]:
    """Live processes of the group (zombies left for init to reap do not count)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp, …
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def _end_group(pgid: int) -> None:
    def gone() -> bool:
        return not _members(pgid)

    if not gone():
        os.killpg(pgid, signal.SIGTERM)
        try:
            wait_until(gone, timeout_s=60, what="the quickstart's service to stop")
        except AssertionError:
            os.killpg(pgid, signal.SIGKILL)
            raise
