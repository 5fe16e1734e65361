"""The wheel installs one import name, `dinrec`, and works beside distributions named like its folders.

The venv is fresh: the wheel and two other projects' distributions, `models` and `storage`, are installed into
it by pip. dinrec's dependencies (torch alone is gigabytes) are read from this environment's site-packages,
after the venv's own, as `make peers` does; this environment's dinrec is a link tree under build/ that a
path entry does not activate, so the only dinrec the venv can import is the wheel's.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

ROOMS = ("storage", "events", "datasets", "streams", "feature_store", "experiments", "retrieval", "spot", "models",
         "registry", "training", "serving", "retrain", "benchmarks", "cli")


def _pip(*args: str, cwd: Path | None = None) -> None:
    out = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args], cwd=cwd,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]


def _other_project(root: Path, name: str) -> Path:
    """Another project's distribution `name`, whose import package is also `name`."""
    src = root / f"src-{name}"
    (src / name).mkdir(parents=True)
    (src / name / "__init__.py").write_text(f"WHO = 'another project called {name}'\n")
    (src / "pyproject.toml").write_text(f'[build-system]\nrequires = ["setuptools"]\nbuild-backend = '
                                        f'"setuptools.build_meta"\n[project]\nname = "{name}"\nversion = "1.0"\n')
    return src


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # Built from a copy of what the wheel is made of: a build in the repository would leave build/lib there,
    # whose files from an earlier layout a later local build would carry along.
    source, dist = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("dist")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for room in ROOMS:
        shutil.copytree(REPO / room, source / room, ignore=shutil.ignore_patterns("__pycache__"))
    _pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(source))
    return next(dist.glob("dinrec-*.whl"))


def test_the_wheel_holds_every_package_under_dinrec_and_nothing_else(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"dinrec", wheel.name.split("-py3")[0] + ".dist-info"}
    # every package folder of the tree is in it (pyproject.toml lists them: a new one must be added there)
    for room in ROOMS:
        for init in (REPO / room).rglob("__init__.py"):
            assert f"dinrec/{init.relative_to(REPO).as_posix()}" in names, f"{init.parent} is not in the wheel"
    assert "dinrec/models/csrc/din_score.cpp" in names and "dinrec/serving/static/dashboard.html" in names
    assert "dinrec/benchmarks/peers/rectools_peer.py" in names  # run as a script by the bench
    assert not any(n.startswith("dinrec/tests/") or n.endswith("__init__.py") and n.count("/") == 1 for n in names)


@pytest.mark.slow
def test_an_installed_dinrec_runs_beside_packages_named_models_and_storage(wheel, tmp_path):
    others = tmp_path / "others"
    others.mkdir()
    for name in ("models", "storage"):
        _pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(others), str(_other_project(tmp_path, name)))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    _pip("--python", str(python), "install", "--no-deps", "--no-index", *map(str, others.glob("*.whl")), str(wheel))
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (Path(purelib) / "zz-dinrec-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    work = tmp_path / "work"  # not the repository: its folders must not be importable by their bare names
    work.mkdir()
    probe = ("import dinrec.cli.main, dinrec.models.din, dinrec.storage.local, models, storage, importlib.util\n"
             "print(models.WHO); print(storage.WHO); print(dinrec.models.din.__file__)\n"
             "print(importlib.util.find_spec('training'), importlib.util.find_spec('serving'))")
    out = subprocess.run([str(python), "-c", probe], cwd=work, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[:2] == ["another project called models", "another project called storage"]
    assert lines[2].startswith(purelib), lines[2]  # the wheel's dinrec, not this tree's
    assert lines[3] == "None None"  # no bare `training` or `serving` in an installed venv

    demo = subprocess.run([str(venv / "bin" / "dinrec"), "demo", "--smoke", "--out", str(work / "demo")], cwd=work,
                          capture_output=True, text=True, timeout=300)
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert "demo finished" in demo.stderr and (work / "demo" / "bundle" / "manifest.json").is_file()


def test_no_module_of_the_tree_loads_under_its_bare_name():
    """From the repository root the folders are importable by their bare names too; importing every module
    of dinrec must not load any of them (that would be a second copy of each module, with its own state)."""
    code = ("import pkgutil, sys, dinrec\n"
            "for m in pkgutil.walk_packages(dinrec.__path__, 'dinrec.'):\n"
            "    if not m.name.endswith(('rectools_peer', 'fastapi_ceiling')):\n"
            "        __import__(m.name)\n"
            f"print(sorted(n for n in sys.modules if n.split('.')[0] in {ROOMS!r} + ('dinrec_cli',)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
