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
    code = ("import sys, dinrec.datasets.cli, dinrec.cli.main; "
            "print(sorted(m for m in ('torch', 'faiss', 'redis', 'kafka') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


def test_a_command_that_loads_no_model_does_not_import_torch():
    # `dinrec ingest` runs for weeks beside the broker: torch's ~120k objects would be walked by every
    # full garbage collection of its loop (docs/benchmarks.md#ingestion-throughput). Its --help runs the
    # CLI's whole start-up (main(): error mapping, the settings check) without consuming.
    code = ("import sys; sys.argv = ['dinrec', 'ingest', '--help']\n"
            "import dinrec.cli.main as m\n"
            "try:\n    m.main()\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules, file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert "Usage" in out.stdout and out.stderr.strip().endswith("False"), out.stderr
