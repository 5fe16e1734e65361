"""What the trainer reports besides metrics: memory, and on NVIDIA GPUs the SM and memory-bandwidth
utilisation sampled from NVML — a T4 at 50% "GPU util" may be bandwidth-bound, and only the
second number says so. Also TensorBoard scalars, when a log folder is given."""

from __future__ import annotations

import resource
import threading
from pathlib import Path

import torch

from dinrec.storage.loops import every


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class GpuMonitor:
    """Samples NVML utilisation in a thread; ``read()`` returns means since the last read.

    ``utilization.gpu`` is the share of time a kernel ran (SM activity); ``utilization.memory`` is
    the share of time device memory was read or written (bandwidth pressure).
    """

    def __init__(self, device: torch.device, interval_s: float = 0.5) -> None:
        self._handle = None
        self._samples: list[tuple[int, int]] = []
        self._stop = threading.Event()
        if device.type != "cuda":
            return
        try:
            import pynvml  # from nvidia-ml-py (the `gpu` extra)

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        except Exception:  # noqa: BLE001 - no NVML: report nothing rather than fail training
            self._handle = None
            return
        # An NVML read that fails (a driver hiccup) is logged and the next one runs: the sampler must not
        # end silently and leave the run's GPU figures stale.
        self._thread = every(interval_s, self._stop, self._sample, name="dinrec-nvml")

    def _sample(self) -> None:
        u = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
        self._samples.append((u.gpu, u.memory))

    def read(self) -> dict[str, float]:
        if self._handle is None or not self._samples:
            return {}
        samples, self._samples = self._samples, []
        return {"gpu_sm_util": sum(s[0] for s in samples) / len(samples),
                "gpu_mem_bw_util": sum(s[1] for s in samples) / len(samples)}

    def close(self) -> None:
        self._stop.set()


def memory_stats(device: torch.device) -> dict[str, float]:
    out = {"peak_rss_mb": peak_rss_mb()}
    if device.type == "cuda":
        out["gpu_peak_mem_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    return out


class ScalarLog:
    """TensorBoard scalars (optional dependency); a no-op without a folder."""

    def __init__(self, folder: str | Path | None) -> None:
        self._writer = None
        if folder:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:
                raise ImportError("TensorBoard logging needs `pip install tensorboard`") from exc
            self._writer = SummaryWriter(str(folder))

    def write(self, values: dict, step: int) -> None:
        if self._writer is None:
            return
        for k, v in values.items():
            if isinstance(v, int | float):
                self._writer.add_scalar(k, v, step)
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
