"""The layering in pyproject.toml ([tool.importlinter]) holds, and nothing heavy loads at import."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_layers_are_respected():
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    out = subprocess.run([exe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"Contracts: [1-9]\d* kept, 0 broken", out.stdout), out.stdout  # any number of contracts


def test_nothing_heavy_at_import_time():
    # Settings are created at start-up, never at import; torch/faiss load only when used.
    code = ("import sys, feature_store.cli, dinrec_cli.main; "
            "print(sorted(m for m in ('torch', 'faiss', 'redis', 'kafka') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr
