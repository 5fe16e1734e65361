"""`dinrec bench … --progress`: a line per stage on stderr, as e2e's; stdout stays the one JSON object, and
--no-progress keeps stderr free of them. The two cheapest benches stand for the others (same helper)."""

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

STAGE = re.compile(r"^\[\s*\d+\.\d s\] ", re.MULTILINE)
AB = ("ab", "--runs", "20", "--users", "500", "--looks", "3")
SCORE = ("score", "--requests", "20", "--items", "2000", "--vs", "none")


def _bench(*args: str) -> tuple[dict, list[str]]:
    """The JSON on stdout and the stage lines on stderr of ``dinrec bench ARGS``."""
    out = subprocess.run([sys.executable, "-m", "dinrec.cli.main", "bench", *args], cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout), STAGE.findall(out.stderr)


@pytest.mark.parametrize("bench", [AB, SCORE], ids=["ab", "score"])
def test_progress_prints_stages_on_stderr_and_leaves_stdout_the_json(bench):
    result, stages = _bench(*bench, "--progress")
    assert isinstance(result, dict) and result["machine"]
    assert len(stages) >= 2, stages


def test_no_progress_prints_no_stages():
    result, stages = _bench(*AB, "--no-progress")
    assert result["runs"] == 20 and stages == []
