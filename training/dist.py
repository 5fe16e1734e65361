"""Distributed data parallel under ``torchrun``: NCCL on GPU, gloo on CPU.

Every rank walks the same global permutation and takes its share (``rank::world_size``) of each
global batch, so N processes with batch B/N step like one process with batch B: DDP averages the
gradients of the per-rank mean losses. Only rank 0 logs and writes checkpoints and bundles.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

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
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    info = DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))
    if use_cuda:
        torch.cuda.set_device(info.local_rank)
    return info


def any_rank(flag: bool, info: DistInfo) -> bool:
    """True on every rank if it is true on any (so all ranks stop at the same step)."""
    if not info.enabled:
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def gather_objects(obj, info: DistInfo) -> list:
    if not info.enabled:
        return [obj]
    out: list = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def shutdown(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()
