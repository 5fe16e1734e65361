"""Distributed data parallel under ``torchrun``: NCCL on GPU, gloo on CPU.

Every rank walks the same global permutation and takes its share (``rank::world_size``) of each
global batch, so N processes with batch B/N step like one process with batch B: DDP averages the
gradients of the per-rank mean losses. Only rank 0 logs and writes checkpoints and bundles.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(use_cuda: bool) -> DistInfo:
    """Join the process group torchrun set up (WORLD_SIZE > 1); a single process otherwise."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    if not dist.is_initialized():
        # NCCL for the gradients on GPU, gloo alongside it for the small CPU-side collectives
        # (stop/checkpoint flags, metric gathering): NCCL alone rejects CPU tensors.
        dist.init_process_group(backend="cpu:gloo,cuda:nccl" if use_cuda else "gloo")
    info = DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))
    if use_cuda:
        torch.cuda.set_device(info.local_rank)
    return info


def any_rank(flags: tuple[bool, ...], info: DistInfo) -> tuple[bool, ...]:
    """Each flag true on every rank if it is true on any (so all ranks act at the same step); one
    collective for all of them."""
    if not info.enabled:
        return flags
    t = torch.tensor([1 if f else 0 for f in flags], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return tuple(bool(v) for v in t.tolist())


def _map(obj, fn):
    if isinstance(obj, dict):
        return {k: _map(v, fn) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_map(v, fn) for v in obj)
    return fn(obj)


@dataclass(frozen=True)
class _Array:
    """A tensor in transit, as numpy (all_gather_object cannot unpickle tensor storages everywhere)."""

    value: np.ndarray


def gather_objects(obj, info: DistInfo, tensors: bool = False) -> list:
    """Every rank's ``obj``, on every rank; with ``tensors``, tensors inside survive the trip."""
    if not info.enabled:
        return [obj]
    if tensors:
        obj = _map(obj, lambda v: _Array(v.cpu().numpy()) if isinstance(v, torch.Tensor) else v)
    out: list = [None] * info.world_size
    dist.all_gather_object(out, obj)
    if tensors:
        out = [_map(o, lambda v: torch.from_numpy(v.value) if isinstance(v, _Array) else v) for o in out]
    return out


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def shutdown(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()
