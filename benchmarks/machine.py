"""The machine a benchmark ran on, for its JSON: a figure that does not name its CPU cannot be
compared with one from the next machine."""

from __future__ import annotations

import os
import platform

import torch

from models.kernels import cpu_has

# The vector units that change which code path runs (the fused kernels need avx512_bf16).
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def machine() -> dict:
    """CPU model and the flags that matter, cores this process may use, torch's threads and the vector
    unit it dispatches to."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), model)
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": model, "flags": [f for f in ISA_FLAGS if cpu_has(f)], "cores": cores,
            "torch_threads": torch.get_num_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__}
