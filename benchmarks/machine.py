"""The machine a benchmark ran on, for its JSON: a figure that does not name its CPU cannot be
compared with one from the next machine — nor one whose code path is not named (the fused kernel,
oneDNN's bf16, fp32) with one that took another."""

from __future__ import annotations

import functools
import os
import platform
import re
import time

import torch

from dinrec.models.kernels import cpu_flag_present, cpu_has, isa_limit

# The vector units that change which code path runs (the fused kernels need avx512_bf16; oneDNN's bf16
# products are fastest with amx_bf16).
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


@functools.cache
def _cpu_model() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), model)
    except OSError:
        pass
    return model


def onednn_version() -> str | None:
    """oneDNN's version as PyTorch was built with it (from torch.__config__.show())."""
    match = re.search(r"(?:oneDNN|MKL-DNN) v([0-9][^ \n]*)", torch.__config__.show())
    return match.group(1) if match else None


def faiss_simd() -> str | None:
    """The SIMD level FAISS dispatches its scans to here (AVX512, AVX2, …)."""
    try:
        import faiss

        return faiss.SIMDConfig.get_level_name()
    except (ImportError, AttributeError):
        return None


def machine() -> dict:
    """CPU model and the flags that matter (those dinrec may use, and the CPU's own where an ISA limit
    hides some), cores this process may use, torch's threads, the vector unit ATen dispatches to and
    the versions of torch and oneDNN."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    out = {"cpu": _cpu_model(), "flags": [f for f in ISA_FLAGS if cpu_has(f)], "cores": cores,
           "torch_threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads(),
           "cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
           "onednn": onednn_version(), "faiss_simd": faiss_simd(), "isa_limit": isa_limit()}
    if out["isa_limit"] != "native":
        out["cpu_flags"] = [f for f in ISA_FLAGS if cpu_flag_present(f)]
    return out


def gemm_gflops(dtype: torch.dtype, n: int = 1024, seconds: float = 0.5) -> float:
    """This machine's matrix-multiply rate on one thread: (n × n) @ (n × n) in ``dtype`` through
    PyTorch (oneDNN for bf16: AMX where the CPU has it), best of repeated runs, in GFLOP/s. The
    ceiling a kernel's speed is read against."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        g = torch.Generator().manual_seed(0)
        a, b = (torch.randn(n, n, generator=g).to(dtype) for _ in range(2))
        out = torch.empty(n, n, dtype=dtype)
        for _ in range(2):
            torch.mm(a, b, out=out)
        best = float("inf")
        deadline = time.perf_counter() + seconds
        runs = 0
        while runs < 3 or time.perf_counter() < deadline:
            t0 = time.perf_counter()
            torch.mm(a, b, out=out)
            best = min(best, time.perf_counter() - t0)
            runs += 1
        return round(2 * n ** 3 / best / 1e9, 1)
    finally:
        torch.set_num_threads(threads)


def machine_with_ceiling() -> dict:
    """:func:`machine` and its one-core bf16 and fp32 GEMM rates."""
    return {**machine(), "bf16_gemm_gflops": gemm_gflops(torch.bfloat16),
            "fp32_gemm_gflops": gemm_gflops(torch.float32)}
