"""Write deploy/docker/requirements.lock: every distribution the dinrec package needs at run time (no
extras), pinned to the version this interpreter's environment has installed — the environment the
tests passed in. The image installs exactly these; the torch pin is the project's (pyproject.toml).

torch's CUDA libraries (nvidia-*, cuda-*, triton) are left out: PyTorch's CPU wheel, the image's
default, needs none, and where torch comes from PyPI its own exact pins choose them. A requirement only
Debian bookworm's Python (3.11.2, the base images.sh makes) needs, and so not installed here (redis's
async-timeout, below 3.11.3), is written as its requirement, marker and all.

Run it after a dependency change, in the CI environment: ``python deploy/docker/lock.py``."""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

LOCK = Path(__file__).with_name("requirements.lock")
CUDA_BUILD_ONLY = re.compile(r"^(nvidia-|cuda-|triton$)")
HEADER = """\
# dinrec's run-time dependencies, pinned (deploy/docker/lock.py wrote this from the environment the
# tests passed in; tests/test_deploy.py holds it to pyproject.toml). The image installs exactly these.
"""


BOOKWORM_PYTHON = {"python_full_version": "3.11.2", "python_version": "3.11"}


def _applies(req: Requirement, extras: set[str]) -> bool:
    if req.marker is None:
        return True
    return any(req.marker.evaluate({"extra": e, **env}) for e in ["", *sorted(extras)] for env in ({}, BOOKWORM_PYTHON))


def closure(root: str = "dinrec") -> dict[str, str]:
    """{distribution: its line in the lock} for ``root``'s requirements and theirs, extras followed:
    ``name==installed version``, or the requirement itself where it is not installed here."""
    lines: dict[str, str] = {}
    extras: dict[str, set[str]] = {}
    todo = [r for r in map(Requirement, metadata.requires(root) or []) if _applies(r, set())]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if CUDA_BUILD_ONLY.match(name):
            continue
        wanted = set(req.extras) - extras.get(name, set())
        if name in lines and not wanted:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:  # needed only by another Python (see the module's docstring)
            lines[name] = str(req)
            continue
        lines[name] = f"{name}=={dist.version}"
        extras[name] = extras.get(name, set()) | set(req.extras)
        todo += [sub for sub in map(Requirement, dist.requires or []) if _applies(sub, extras[name])]
    return dict(sorted(lines.items()))


def main() -> int:
    LOCK.write_text(HEADER + "".join(f"{line}\n" for line in closure().values()))
    print(f"wrote {LOCK}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
