"""Mixed precision chosen from the device.

auto: bf16 autocast where the GPU supports it (A10G, L4, A100, H100/H200), fp16 autocast with a
GradScaler where it does not (T4, V100), TF32 matmuls on Ampere and newer; fp32 on CPU (bf16 on
CPU is opt-in: ``precision="bf16"``). An explicit setting overrides.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

PRECISIONS = ("auto", "fp32", "bf16", "fp16")


@dataclass(frozen=True)
class Precision:
    name: str  # fp32 | bf16 | fp16
    device_type: str  # cpu | cuda
    tf32: bool = False

    @property
    def dtype(self) -> torch.dtype | None:
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.name)

    @property
    def needs_scaler(self) -> bool:
        return self.name == "fp16"

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def grad_scaler(self) -> torch.amp.GradScaler:
        return torch.amp.GradScaler(self.device_type, enabled=self.needs_scaler)


def choose_precision(device: torch.device, requested: str = "auto") -> Precision:
    if requested not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {requested!r}")
    if device.type != "cuda":
        if requested == "fp16":
            raise ValueError("fp16 autocast needs a CUDA device; use fp32 or bf16 on CPU")
        return Precision("bf16" if requested == "bf16" else "fp32", "cpu")
    major, _ = torch.cuda.get_device_capability(device)
    tf32 = major >= 8
    if tf32:  # Ampere+: fp32 matmuls that remain (e.g. outside autocast) use tensor cores
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if requested == "auto":
        requested = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    if requested == "bf16" and not torch.cuda.is_bf16_supported():
        raise ValueError(f"{torch.cuda.get_device_name(device)} has no bf16 support; use fp16 or fp32")
    return Precision(requested, "cuda", tf32)
