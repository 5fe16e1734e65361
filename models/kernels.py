"""dinrec's C++ units (``csrc/``) and the one way they are built: the fused serving scorer
(``din_score.cpp``, CPUs with AVX-512 BF16), the listwise activation unit (``din_lists.cpp``) and the
training-mode Dice unit (``din_unit.cpp``, wrapped by training.kernels).

Each is compiled on first use, with the C++ compiler PyTorch's extensions use, into
``~/.cache/dinrec/kernels`` (``DINREC_KERNEL_CACHE`` moves it), in a folder keyed on torch's version, the
CPU's vector unit and the source with its flags. A library already in that folder is loaded as it is,
with no compiler: an image compiles its units at build time (``python models/kernels.py``, below) and
ships them. Where a unit can neither be loaded nor built the caller keeps its PyTorch ops.

This module imports nothing of dinrec's, so an image's build stage can run it from the two paths
``models/kernels.py`` and ``models/csrc`` before the rest of the source is copied."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import torch

log = logging.getLogger(__name__)

_CSRC = Path(__file__).with_name("csrc")
_SCORE_FLAGS = ["-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16", "-mfma"]


def _build_dir(source: Path, cflags: list[str], ldflags: list[str]) -> Path:
    root = Path(os.environ.get("DINREC_KERNEL_CACHE", Path.home() / ".cache" / "dinrec" / "kernels"))
    # A build depends on the source and its flags, torch, and the CPU's vector unit (an AVX-512 build
    # must not be loaded on a machine with AVX2 only).
    digest = hashlib.sha256(source.read_bytes())
    digest.update("\0".join(cflags + ["--"] + ldflags).encode())
    return root / f"{torch.__version__}-{torch.backends.cpu.get_cpu_capability()}-{digest.hexdigest()[:12]}"


# Set to "avx2", dinrec behaves as on a CPU without AVX-512 or AMX (benchmarks' --isa avx2, with
# ATEN_CPU_CAPABILITY and ONEDNN_MAX_CPU_ISA for PyTorch and oneDNN): both figures from one machine.
ISA_LIMIT_ENV = "DINREC_CPU_ISA"
_ISA_LIMITS = {"native": (), "avx2": ("avx512", "amx")}


def isa_limit() -> str:
    value = os.environ.get(ISA_LIMIT_ENV, "native").strip().lower() or "native"
    if value not in _ISA_LIMITS:
        raise ValueError(f"{ISA_LIMIT_ENV}={value!r}: expected one of {sorted(_ISA_LIMITS)}")
    return value


def isa_environment(isa: str) -> dict[str, str]:
    """The environment that makes a fresh process (dinrec, PyTorch and oneDNN) use only ``isa``."""
    if isa not in _ISA_LIMITS:
        raise ValueError(f"unknown ISA {isa!r}: expected one of {sorted(_ISA_LIMITS)}")
    if isa == "native":
        return {}
    return {ISA_LIMIT_ENV: isa, "ATEN_CPU_CAPABILITY": isa, "ONEDNN_MAX_CPU_ISA": isa.upper(),
            "MKL_ENABLE_INSTRUCTIONS": isa.upper(), "FAISS_SIMD_LEVEL": isa.upper()}


def cpu_flag_present(flag: str) -> bool:
    """Whether /proc/cpuinfo lists ``flag`` (e.g. avx512_bf16), whatever the ISA limit."""
    try:
        with open("/proc/cpuinfo") as fh:
            return any(flag in line.split() for line in fh if line.startswith("flags"))
    except OSError:
        return False


def cpu_has(flag: str) -> bool:
    """Whether dinrec may use ``flag`` here: the CPU has it and ``DINREC_CPU_ISA`` does not hide it."""
    if any(flag.startswith(hidden) for hidden in _ISA_LIMITS[isa_limit()]):
        return False
    return cpu_flag_present(flag)


# Set to "off", no fused unit is loaded: every caller keeps its PyTorch ops (the test tier that holds the
# suite green without dinrec's C++, CONTRIBUTING.md; a kernel suspected of a wrong answer, ruled out).
KERNELS_ENV = "DINREC_KERNELS"


def kernels_enabled() -> bool:
    value = os.environ.get(KERNELS_ENV, "on").strip().lower() or "on"
    if value not in ("on", "off"):
        raise ValueError(f"{KERNELS_ENV}={value!r}: expected on or off")
    return value == "on"


def build_extension(name: str, source: Path, cflags: list[str], ldflags: list[str], failure: str) -> bool:
    """Load the library built from ``source`` with these flags for this CPU, compiling it first where
    it is not there yet, and register its ops; False, logging ``failure`` % (error type, last line),
    where that fails — compiler or headers missing, …: the caller keeps its PyTorch ops. False, without
    a word, under ``DINREC_KERNELS=off``."""
    if not kernels_enabled():
        return False
    try:
        build_dir = _build_dir(source, cflags, ldflags)
        built = build_dir / f"{name}.so"
        if built.is_file():
            try:  # shipped or built before: no compiler, no write access needed
                torch.ops.load_library(str(built))
                return True
            except (OSError, RuntimeError) as e:  # a half-written library: build it again below
                log.info("kernel %s: %s; building it again", built, e)
        from torch.utils.cpp_extension import load as load_extension

        build_dir.mkdir(parents=True, exist_ok=True)
        load_extension(name=name, sources=[str(source)], extra_cflags=cflags, extra_ldflags=ldflags,
                       build_directory=str(build_dir), is_python_module=False, verbose=False)
    except Exception as e:  # noqa: BLE001 - any build failure means "use the PyTorch ops"
        log.warning(failure, type(e).__name__, str(e).strip().splitlines()[-1] if str(e).strip() else "")
        return False
    return True


@functools.cache
def load_score() -> bool:
    """The fused serving unit (``csrc/din_score.cpp``): ``torch.ops.dinrec_score`` registered; False
    where the CPU lacks AVX-512 BF16 or the unit cannot be loaded (the scorer then keeps its PyTorch ops)."""
    if sys.platform != "linux" or not cpu_has("avx512_bf16"):
        return False
    return build_extension("dinrec_din_score", _CSRC / "din_score.cpp", _SCORE_FLAGS, [],
                           "fused scoring unit unavailable (%s: %s); scoring uses PyTorch ops")


def _lists_flags() -> list[str]:
    flags = ["-O3", "-fopenmp-simd", "-ffp-contract=fast"]
    if cpu_has("avx512f"):
        flags += ["-mavx512f", "-mavx512vl", "-mavx512bw", "-mavx512dq", "-mfma"]
    elif cpu_has("avx2"):
        flags += ["-mavx2", "-mfma"]
    return flags


@functools.cache
def load_lists() -> bool:
    """The fused listwise unit (``csrc/din_lists.cpp``): ``torch.ops.dinrec_lists`` registered; False,
    with a warning, where it cannot be loaded (the model keeps its PyTorch ops)."""
    if sys.platform != "linux":
        return False
    return build_extension("dinrec_din_lists", _CSRC / "din_lists.cpp", _lists_flags(), [],
                           "fused listwise unit unavailable (%s: %s); lists are scored with PyTorch ops")


def _dice_flags() -> list[str]:
    flags = ["-O3", "-fopenmp", "-ffast-math"]  # fast-math: lets GCC vectorise expf with glibc's libmvec
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        flags += ["-mavx2", "-mfma"]
    return flags


def build_dice() -> bool:
    """The fused training-mode Dice unit (``csrc/din_unit.cpp``, wrapped by training.kernels):
    ``torch.ops.dinrec`` registered; False, with a warning, where it cannot be loaded."""
    if sys.platform != "linux":
        log.info("fused Dice kernel: only built on Linux; using PyTorch ops")
        return False
    return build_extension("dinrec_din_unit", _CSRC / "din_unit.cpp", _dice_flags(), ["-fopenmp"],
                           "fused Dice kernel unavailable (%s: %s); training uses PyTorch ops")


def build_all() -> dict[str, bool]:
    """Every unit this CPU (under ``DINREC_CPU_ISA``) can use, built or loaded: {unit: available}."""
    return {"score": load_score(), "lists": load_lists(), "dice": build_dice()}


def main(argv: list[str]) -> int:
    """``python models/kernels.py [ISA …]``: build every unit for each ISA (default: this CPU's and
    AVX2, which covers the machines an image is likely to meet), each in a fresh process, since torch
    reads its vector unit once. Prints {isa: {unit: built}}; exit 1 where nothing built for this CPU.
    ``--env ISA``: print the shell ``export`` lines of :func:`isa_environment` (CONTRIBUTING.md: the AVX2 tier)."""
    if argv[:1] == ["--env"] and len(argv) == 2:
        print("\n".join(f"export {k}={v}" for k, v in isa_environment(argv[1]).items()))
        return 0
    if argv[:1] == ["--here"]:
        print(json.dumps(build_all()))
        return 0
    built = {}
    for isa in argv or ["native", "avx2"]:
        env = {**os.environ, **isa_environment(isa)}
        out = subprocess.run([sys.executable, __file__, "--here"], env=env, stdout=subprocess.PIPE, text=True)
        if out.returncode != 0:
            return out.returncode
        built[isa] = json.loads(out.stdout.strip().splitlines()[-1])
    print(json.dumps(built))
    return 0 if any(built.get("native", {"any": True}).values()) else 1


class _ListUnit(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, h, a, pb, pf, filled, wpt, wpair, alpha, wout, bout):  # noqa: ANN001, ANN205
        inputs = [t.detach().contiguous() for t in (q, h, a, pb, pf)] + [filled.contiguous()] + [
            t.detach().contiguous() for t in (wpt, wpair, alpha, wout, bout)]
        ctx.save_for_backward(*inputs)
        return torch.ops.dinrec_lists.unit_forward(*inputs)

    @staticmethod
    def backward(ctx, gw):  # noqa: ANN001, ANN205
        g_q, g_h, g_a, g_pb, g_wpt, g_wpair, g_alpha, g_wout, g_bout = torch.ops.dinrec_lists.unit_backward(
            gw.contiguous(), *ctx.saved_tensors)
        return g_q, g_h, g_a, g_pb, None, None, g_wpt, g_wpair, g_alpha, g_wout, g_bout


def list_unit(q: torch.Tensor, h: torch.Tensor, a: torch.Tensor, pb: torch.Tensor, pf: torch.Tensor,
              filled: torch.Tensor, wpt: torch.Tensor, wpair: torch.Tensor, alpha: torch.Tensor, wout: torch.Tensor,
              bout: torch.Tensor) -> torch.Tensor:
    """DIN's one-layer PReLU activation unit over lists (models.din.DIN.lists_from), fused: q (B, N, D),
    h (B, L, D), a (B, N, H) the candidates' first-layer term, pb (B, L, H) the behaviours', pf (B, N, L, P)
    the pair features, filled (B, L) bool, WpT (D, H), Wpair (P, H), alpha, wout (H,), bout (1,) →
    w (B, N, L), 0 where a slot holds no behaviour. Differentiable in everything but pf and filled."""
    return _ListUnit.apply(q, h, a, pb, pf, filled, wpt, wpair, alpha, wout, bout)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    raise SystemExit(main(sys.argv[1:]))
