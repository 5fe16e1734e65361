"""GPU instance catalog: what each AWS instance type offers a DIN trainer, and what it costs.

GPU figures are the vendors' datasheet numbers for *dense* math (no structured sparsity):
``tflops_fp32`` for plain fp32 (no tensor cores), ``tflops_mixed`` for the fastest mixed precision
the GPU supports (bf16 where ``bf16`` is true, otherwise fp16 with loss scaling), memory bandwidth
per GPU. Prices are us-east-1 Linux on-demand list prices (USD per instance-hour, after AWS's June
2025 P4/P5 price cuts); the spot fallbacks are a flat typical discount, not market data. Both go
stale, so a JSON file overrides them
(``load_catalog(prices=…)``), and the planner asks EC2 for live spot prices when it can.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_gb: float  # per GPU, decimal GB as the vendors state it
    bandwidth_gbs: float  # HBM/GDDR bandwidth per GPU, GB/s
    tflops_fp32: float
    tflops_mixed: float  # dense tensor-core bf16 (or fp16 where there is no bf16)
    bf16: bool


@dataclass(frozen=True)
class InstanceType:
    name: str
    gpu: Gpu
    gpus: int
    vcpus: int
    host_memory_gib: float
    interconnect_gbs: float  # GPU↔GPU bandwidth per GPU for all-reduce (NVLink/NVSwitch or PCIe)
    network_gbps: float  # to S3: bounds how fast a checkpoint leaves the instance
    on_demand_usd: float  # per instance-hour
    spot_usd: float  # fallback spot price when EC2 cannot be asked: 40% of on-demand (30% for p3)


T4 = Gpu("T4", 16, 320, 8.1, 65, bf16=False)
A10G = Gpu("A10G", 24, 600, 31.2, 125, bf16=True)
L4 = Gpu("L4", 24, 300, 30.3, 121, bf16=True)
V100 = Gpu("V100", 16, 900, 15.7, 125, bf16=False)
A100_40 = Gpu("A100-40GB", 40, 1555, 19.5, 312, bf16=True)
H100 = Gpu("H100", 80, 3350, 67, 989, bf16=True)
H200 = Gpu("H200", 141, 4800, 67, 989, bf16=True)

_PCIE3, _PCIE4 = 12.0, 24.0  # achievable all-reduce GB/s per GPU over PCIe gen3 / gen4 (no NVLink)

DEFAULT_CATALOG: tuple[InstanceType, ...] = (
    InstanceType("g4dn.xlarge", T4, 1, 4, 16, 0, 25, 0.526, 0.2104),
    InstanceType("g4dn.12xlarge", T4, 4, 48, 192, _PCIE3, 50, 3.912, 1.5648),
    InstanceType("g5.xlarge", A10G, 1, 4, 16, 0, 10, 1.006, 0.4024),
    InstanceType("g5.12xlarge", A10G, 4, 48, 192, _PCIE4, 40, 5.672, 2.2688),
    InstanceType("g6.xlarge", L4, 1, 4, 16, 0, 10, 0.8048, 0.3219),
    InstanceType("g6.12xlarge", L4, 4, 48, 192, _PCIE4, 40, 4.6016, 1.8406),
    InstanceType("p3.2xlarge", V100, 1, 8, 61, 0, 10, 3.06, 0.918),
    InstanceType("p3.16xlarge", V100, 8, 64, 488, 300, 25, 24.48, 7.344),
    InstanceType("p4d.24xlarge", A100_40, 8, 96, 1152, 600, 400, 21.96, 8.784),
    InstanceType("p5.48xlarge", H100, 8, 192, 2048, 900, 3200, 55.04, 22.016),
    InstanceType("p5en.48xlarge", H200, 8, 192, 2048, 900, 3200, 63.296, 25.3184),
)


def load_catalog(prices: Path | None = None, only: list[str] | None = None) -> list[InstanceType]:
    """The default catalog, with prices overridden from a JSON file if given::

        {"g5.xlarge": {"on_demand_usd": 1.006, "spot_usd": 0.45}, ...}

    Unknown instance names or fields are errors (a typo must not silently keep a stale price).
    """
    catalog = {t.name: t for t in DEFAULT_CATALOG}
    if prices is not None:
        try:
            overrides = json.loads(Path(prices).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read prices from {prices}: {exc}") from exc
        if not isinstance(overrides, dict):
            raise ValueError(f"{prices}: expected an object of instance type → prices")
        for name, fields in overrides.items():
            if name not in catalog:
                raise ValueError(f"{prices}: unknown instance type {name!r}; known: {', '.join(catalog)}")
            if not isinstance(fields, dict) or not set(fields) <= {"on_demand_usd", "spot_usd"}:
                raise ValueError(f"{prices}: {name}: only on_demand_usd and spot_usd can be overridden")
            for key, value in fields.items():
                if not isinstance(value, int | float) or value <= 0:
                    raise ValueError(f"{prices}: {name}.{key} must be a positive number, got {value!r}")
            old = catalog[name]
            catalog[name] = replace(old, on_demand_usd=float(fields.get("on_demand_usd", old.on_demand_usd)),
                                    spot_usd=float(fields.get("spot_usd", old.spot_usd)))
    if only:
        missing = [n for n in only if n not in catalog]
        if missing:
            raise ValueError(f"unknown instance type(s) {missing}; known: {', '.join(catalog)}")
        return [catalog[n] for n in only]
    return list(catalog.values())
