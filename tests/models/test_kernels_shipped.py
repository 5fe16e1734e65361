"""C++ units built once (an image's build stage: ``python models/kernels.py``) load where no compiler
is installed, and loading them writes nothing — the image's runtime stage, whose cache its non-root user
cannot write."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dinrec.models import kernels

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "models" / "kernels.py"

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the C++ units are built on Linux only")


def _units(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    out = subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=280)
    return out.returncode, out.stdout, out.stderr


def test_units_built_once_load_with_no_compiler_and_a_read_only_cache(tmp_path):
    if not kernels.kernels_enabled():
        pytest.skip("DINREC_KERNELS=off: this process builds no unit to ship (the kernels-off tier)")
    if not kernels.load_lists():
        pytest.skip("the listwise unit cannot be built here (see the log)")
    # The cache this process built into, copied: what an image's build stage leaves in /opt/dinrec/kernels.
    source_cache = Path(os.environ.get("DINREC_KERNEL_CACHE", Path.home() / ".cache" / "dinrec" / "kernels"))
    shipped = tmp_path / "shipped"
    shutil.copytree(source_cache, shipped)
    # The units themselves are under test: built and loaded even in the kernels-off tier (DINREC_KERNELS).
    env = {**os.environ, "DINREC_KERNEL_CACHE": str(shipped), "PYTHONPATH": str(ROOT), kernels.KERNELS_ENV: "on"}
    code, out, err = _units(env, "native")  # builds what this cache lacks (the Dice unit, say)
    assert code == 0, err
    built = json.loads(out)["native"]
    assert built["lists"] is True

    before = _listing(shipped)
    no_compiler = {**env, "CXX": str(tmp_path / "no-such-compiler"), "PATH": str(tmp_path)}
    code, out, err = _units(no_compiler, "--here")
    assert code == 0, err
    assert json.loads(out) == built  # every unit built above loads as shipped
    assert "unavailable" not in err
    assert _listing(shipped) == before  # nothing written: no lock file, no rebuild


def _listing(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def test_a_unit_neither_shipped_nor_buildable_falls_back_with_a_warning(tmp_path):
    env = {**os.environ, "DINREC_KERNEL_CACHE": str(tmp_path / "kernels"), "PYTHONPATH": str(ROOT),
           kernels.KERNELS_ENV: "on",
           "CXX": str(tmp_path / "no-such-compiler")}
    code, out, err = _units(env, "--here")
    assert code == 0, err
    assert json.loads(out) == {"score": False, "lists": False, "dice": False}
    assert "fused listwise unit unavailable" in err and "fused Dice kernel unavailable" in err


def test_env_prints_the_exports_that_limit_a_process_to_an_isa():
    """CONTRIBUTING.md's AVX2 tier evals this: the same variables isa_environment gives a benchmark's process."""
    code, out, err = _units(dict(os.environ), "--env", "avx2")
    assert code == 0, err
    assert out.strip().splitlines() == [f"export {k}={v}" for k, v in kernels.isa_environment("avx2").items()]
    assert "export ATEN_CPU_CAPABILITY=avx2" in out and "export DINREC_CPU_ISA=avx2" in out
