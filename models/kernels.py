"""The fused CPU scoring unit (``csrc/din_score.cpp``) the serving scorer uses where the CPU has
AVX-512 BF16, and the one way dinrec builds a C++ extension (training.kernels builds its unit with it).

Builds are cached per machine in ``~/.cache/dinrec/kernels`` (``DINREC_KERNEL_CACHE`` moves it); where a
build fails the caller keeps its PyTorch ops."""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import sys
from pathlib import Path

import torch

log = logging.getLogger(__name__)

_SCORE_SOURCE = Path(__file__).with_name("csrc") / "din_score.cpp"
_SCORE_FLAGS = ["-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16", "-mfma"]


def _build_dir(source: Path) -> Path:
    root = Path(os.environ.get("DINREC_KERNEL_CACHE", Path.home() / ".cache" / "dinrec" / "kernels"))
    # The build depends on the source, torch and the CPU's vector unit (an AVX2 build must not be
    # reused on a machine without AVX2).
    key = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    return root / f"{torch.__version__}-{torch.backends.cpu.get_cpu_capability()}-{key}"


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


@functools.cache
def load_score() -> bool:
    """Build (or reuse) the fused serving unit (``csrc/din_score.cpp``) and register
    ``torch.ops.dinrec_score``; False where the CPU lacks AVX-512 BF16 or the build fails (the scorer
    then keeps its PyTorch ops)."""
    if sys.platform != "linux" or not cpu_has("avx512_bf16"):
        return False
    return build_extension("dinrec_din_score", _SCORE_SOURCE, _SCORE_FLAGS, [],
                            "fused scoring unit unavailable (%s: %s); scoring uses PyTorch ops")


def build_extension(name: str, source: Path, cflags: list[str], ldflags: list[str], failure: str) -> bool:
    """Compile (or reuse the cached build of) ``source`` and register its ops; False, logging
    ``failure`` % (error type, last line), where that fails — compiler or headers missing, …:
    the caller keeps its PyTorch ops."""
    try:
        from torch.utils.cpp_extension import load as load_extension

        build_dir = _build_dir(source)
        build_dir.mkdir(parents=True, exist_ok=True)
        load_extension(name=name, sources=[str(source)], extra_cflags=cflags, extra_ldflags=ldflags,
                       build_directory=str(build_dir), is_python_module=False, verbose=False)
    except Exception as e:  # noqa: BLE001 - any build failure means "use the PyTorch ops"
        log.warning(failure, type(e).__name__, str(e).strip().splitlines()[-1] if str(e).strip() else "")
        return False
    return True


_LISTS_SOURCE = Path(__file__).with_name("csrc") / "din_lists.cpp"


def _lists_flags() -> list[str]:
    flags = ["-O3", "-fopenmp-simd", "-ffp-contract=fast"]
    if cpu_has("avx512f"):
        flags += ["-mavx512f", "-mavx512vl", "-mavx512bw", "-mavx512dq", "-mfma"]
    elif cpu_has("avx2"):
        flags += ["-mavx2", "-mfma"]
    return flags


@functools.cache
def load_lists() -> bool:
    """Build (or reuse) the fused listwise unit (``csrc/din_lists.cpp``) and register
    ``torch.ops.dinrec_lists``; False, with a warning, where that fails (the model keeps its PyTorch ops)."""
    if sys.platform != "linux":
        return False
    return build_extension(f"dinrec_din_lists_{isa_limit()}", _LISTS_SOURCE, _lists_flags(), [],
                           "fused listwise unit unavailable (%s: %s); lists are scored with PyTorch ops")


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
