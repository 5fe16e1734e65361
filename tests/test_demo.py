"""`dinrec demo --smoke`: the whole loop on embedded defaults, as the README promises."""

import json
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_demo_smoke_runs_the_whole_loop(tmp_path):
    out = subprocess.run([sys.executable, "-m", "dinrec.cli.main", "demo", "--smoke", "--out", str(tmp_path)],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert '"strategy": "din"' in out.stdout and '"strategy": "popular"' in out.stdout
    assert "→ 422" in out.stdout and '"status": "ready"' in out.stdout
    assert (tmp_path / "bundle" / "manifest.json").is_file()
    assert "demo finished" in out.stderr
    # Triton's teardown leak report (torch imports it; dinrec never runs it) is kept off the terminal.
    assert "nanobind" not in out.stderr
    assert "PUT /admin/experiments/din-vs-popular" in out.stdout  # the experiment, started through the API
    experiment = next(line for line in out.stderr.splitlines() if line.startswith("6/7 ran an experiment"))
    assert "din CTR" in experiment and "popular lift" in experiment and "/dashboard" in experiment
    # Every click the results call unattributed is one on a list served outside the experiment (after the
    # guardrail stopped an arm, its users leave it): no rule drops a click shown in the experiment.
    line = next(line for line in out.stderr.splitlines() if "unattributed clicks:" in line)
    unattributed, outside = (int(x) for x in re.findall(r": (\d+)", line)[:2])
    assert unattributed == outside, line
    # The held-back behaviours arrive, the stream is archived and the retrain job decides through its gate.
    retrain = next(line for line in out.stderr.splitlines() if line.startswith("7/7 archived"))
    assert "retrain: promoted" in retrain or "retrain: refused" in retrain
    assert "vs champion" in retrain  # the candidate was measured against the champion on one holdout
    report = json.loads((tmp_path / "retrain" / "latest.json").read_text())
    assert report["data"]["attributed"] > 0 and report["data"]["holdout"] == "organic"
    # Whichever way the gate went, the decision is the checks' verdict and the service acted on it.
    failed = [c["metric"] for c in report["checks"] if not c["passed"]]
    assert report["status"] == ("refused" if failed else "promoted"), (report["status"], failed)
    serving = next(line for line in out.stderr.splitlines() if line.strip().startswith("serving "))
    if failed:  # refused: every failed check is named, and the champion keeps serving
        assert all(m in report["reason"] for m in failed), report["reason"]
        assert f"serving {report['champion']['version']} " in serving, serving
    else:  # promoted: the service followed the alias to the candidate
        assert f"serving {report['candidate']['version']}" in serving


@pytest.mark.slow
def test_seed_registry_publishes_a_first_model_once_and_never_replaces_one(tmp_path):
    """`dinrec demo --seed-registry`: the trial stack's seed service. It publishes the demo's model under the
    alias while that names nothing; once it names a model (a seed's, a retrain's), it trains nothing."""
    from dinrec.registry.store import open_registry

    def seed(run: str) -> tuple[dict, str]:
        out = subprocess.run([sys.executable, "-m", "dinrec.cli.main", "demo", "--seed-registry",
                              str(tmp_path / "registry"), "--smoke", "--out", str(tmp_path / run)],
                             cwd=REPO, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr

    first, said = seed("first")
    registry = open_registry(tmp_path / "registry")
    assert first["status"] == "seeded" and registry.resolve("champion") == first["version"]
    assert "3/4 trained DIN" in said
    manifest = registry.manifest(first["version"])
    assert manifest["lineage"]["trained_by"] == "dinrec demo --seed-registry"
    assert manifest["lineage"]["data_window"]["end"] < 1.8e9  # the synthetic log's: before any real behaviour
    again, said = seed("again")
    assert again == {**first, "status": "kept"} and "trained DIN" not in said
    assert registry.versions() == [first["version"]]
