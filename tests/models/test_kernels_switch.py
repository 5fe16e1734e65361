"""DINREC_KERNELS=off: no fused unit loads, so every path runs PyTorch's ops (the suite's kernels-off tier,
CONTRIBUTING.md); a mistyped value is an error, not a silent default."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dinrec.models import kernels


def test_off_loads_no_unit_and_a_mistyped_value_is_refused(monkeypatch, tmp_path):
    source = tmp_path / "never_built.cpp"  # off: not even looked at
    monkeypatch.setenv(kernels.KERNELS_ENV, "off")
    assert not kernels.build_extension("never_built", source, [], [], "%s %s")
    monkeypatch.setenv(kernels.KERNELS_ENV, "of")
    with pytest.raises(ValueError, match="DINREC_KERNELS='of'"):
        kernels.build_extension("never_built", source, [], [], "%s %s")


def test_a_process_under_off_builds_none_of_the_units():
    code = "import json; from dinrec.models import kernels; print(json.dumps(kernels.build_all()))"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, kernels.KERNELS_ENV: "off"},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == '{"score": false, "lists": false, "dice": false}'

