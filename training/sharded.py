"""DIN with its embedding tables sharded over the torchrun ranks by TorchRec.

The tables live in a TorchRec ``EmbeddingCollection`` (sequence lookups: DIN attends over each
behaviour, it does not pool them) under ``DistributedModelParallel``: TorchRec's planner places them
(row-wise, table-wise or column-wise, within each device's memory), each rank's lookups travel to the
shard that holds the row and back by all-to-all, and FBGEMM's fused row-wise Adagrad updates the touched
rows inside the backward pass (one state value per row). The dense part — the activation unit and the
MLP, models.din — is replicated under DDP as in the unsharded trainer.

The function is the unsharded trainer's, step for step: the same samples in the same order (every rank
takes ``rank::world`` of each global batch), the same initial weights (models.din.table_rows draws any
shard's rows as the whole table would have them), the same update (training.optim.RowWiseAdagrad is the
unsharded twin of the fused optimizer). TorchRec sums the rows' gradients over the ranks where DDP
averages the dense ones, so each rank's lookups carry 1/world of its gradient.

Checkpoints: every rank writes its own shards (weights and optimizer rows) beside the dense state rank 0
writes; a run resumes on the same number of ranks and plan. The bundle is exported whole: the shards
gathered to rank 0 into a plain DIN, the format serving loads.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from dinrec.models.din import DIN, DINConfig, table_rows
from dinrec.training import dist as tdist
from dinrec.training.checkpoint import CheckpointError, CheckpointStore, checkpoint_name
from dinrec.training.data import SplitTensors
from dinrec.training.loop import DINWithLoss, Trainer, model_config_for, split_metrics

TABLES = ("item_emb", "cat_emb")  # the names DIN gives them: a gathered table drops into DIN's state_dict


def torchrec_missing() -> str | None:
    """Why TorchRec cannot be used here, or None when it can."""
    try:
        import torchrec  # noqa: F401
        from fbgemm_gpu.split_embedding_configs import EmbOptimType  # noqa: F401
    except (ImportError, OSError) as exc:  # OSError: FBGEMM's library built for another torch
        return f"TorchRec is not usable here ({exc}); install the sharded extra (README: sharded tables)"
    return None


class ShardedDIN(nn.Module):
    """DIN whose two tables are a TorchRec EmbeddingCollection (built on the meta device: the
    planner places them), the rest DIN's own modules. Same inputs and logits as models.din.DIN."""

    def __init__(self, cfg: DINConfig) -> None:
        super().__init__()
        from torchrec import EmbeddingCollection, EmbeddingConfig

        self.cfg = cfg
        # The dense part first: DIN with one-row tables, dropped (its dense layers draw from the generator
        # exactly as a whole DIN's do, and table_seed after them).
        self.din = DIN(replace(cfg, n_items=1, n_categories=1))
        self.table_seed = self.din.table_seed
        for table in ("item_emb", "cat_emb"):
            self.din.register_module(table, None)  # dropped (what assigning None does): the tables are below
        self.tables = EmbeddingCollection(tables=[
            EmbeddingConfig(name="item_emb", embedding_dim=cfg.item_dim, num_embeddings=cfg.n_items,
                            feature_names=["items"]),
            EmbeddingConfig(name="cat_emb", embedding_dim=cfg.cat_dim, num_embeddings=cfg.n_categories,
                            feature_names=["cats"])], device=torch.device("meta"))

    def forward(self, hist_items: torch.Tensor, hist_cats: torch.Tensor, target_item: torch.Tensor,
                target_cat: torch.Tensor) -> torch.Tensor:
        from torchrec import KeyedJaggedTensor

        known = hist_items != 0  # (B, L)
        rows = known.nonzero(as_tuple=True)[0]  # (M,) the sample of each real behaviour, sorted
        lengths = known.sum(dim=1) + 1  # (B,) each sample's behaviours, then its candidate
        # Per sample: its behaviours oldest first, then the candidate (a jagged layout; L·B is never built).
        last = torch.cumsum(lengths, 0) - 1  # (B,) where each candidate lands
        is_hist = torch.ones(int(lengths.sum()), dtype=torch.bool, device=hist_items.device)
        is_hist[last] = False
        items = torch.empty_like(is_hist, dtype=torch.long)
        cats = torch.empty_like(items)
        items[is_hist], items[last] = hist_items[known], target_item
        cats[is_hist], cats[last] = hist_cats[known], target_cat
        kjt = KeyedJaggedTensor(keys=["items", "cats"], values=torch.cat([items, cats]),
                                lengths=torch.cat([lengths, lengths]))
        out = self.tables(kjt)
        # Index 0 is padding / unknown: a zero vector with no gradient, as nn.Embedding(padding_idx=0) has.
        vectors = torch.cat([out["items"].values() * (items != 0).unsqueeze(1),
                             out["cats"].values() * (cats != 0).unsqueeze(1)], dim=1)  # (M + B, D)
        return self.din.logits(vectors[last], vectors[is_hist], rows)  # (B,)


def _local_shards(t) -> list[tuple[list[int], torch.Tensor]]:  # noqa: ANN001 - a ShardedTensor
    return [(list(s.metadata.shard_offsets), s.tensor) for s in t.local_shards()]


def refuse_unsupported(init: object | None) -> None:
    """What sharded tables cannot do, said before any work: run without TorchRec, or start warm."""
    missing = torchrec_missing()
    if missing:
        raise ValueError(missing)
    if init is not None:
        raise ValueError("a warm start (init_from) is not supported with sharded tables")


def join_group(info: tdist.DistInfo) -> None:
    """TorchRec needs a process group: one process makes a group of one, so the same code path runs."""
    if not info.enabled and not dist.is_initialized():
        import os

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        dist.init_process_group("gloo", rank=0, world_size=1)


def _quiet(method: Callable) -> Callable:
    """TorchRec 1.9 hands its CPU shards out as ShardedTensors, which torch now warns are deprecated
    (FutureWarning, "use DTensor") each time one is made: nothing here can act on it."""
    import functools
    import warnings

    @functools.wraps(method)
    def wrapper(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Please use DTensor instead", FutureWarning)
            return method(*args, **kwargs)
    return wrapper


class ShardedTables:
    """The tables of a module under TorchRec's DistributedModelParallel: placed by TorchRec's planner
    (or one sharding type), trained by FBGEMM's fused row-wise Adagrad, and — on this rank — initialised,
    checkpointed, restored and gathered whole. DIN's trainer and the towers' share it."""

    def __init__(self, module: nn.Module, names: tuple[str, ...], *, device: torch.device, world_size: int,
                 lr: float, sharding: str = "auto") -> None:
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
        from torchrec.distributed.embedding import EmbeddingCollectionSharder
        from torchrec.distributed.model_parallel import DistributedModelParallel
        from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
        from torchrec.distributed.planner.types import KernelConfig, TopologyFactory, TrainerConfig

        self.names = names
        sharder = EmbeddingCollectionSharder(fused_params={
            "optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": lr, "eps": 1e-8})
        constraints = None
        if sharding != "auto":
            constraints = {t: ParameterConstraints(sharding_types=[sharding]) for t in names}
        # The factory resolves the device's memory (HBM on a GPU) where a bare Topology takes defaults.
        topology = TopologyFactory.create_topology(TrainerConfig(world_size=world_size),
                                                   kernel_config=KernelConfig(compute_device=device.type))
        planner = EmbeddingShardingPlanner(topology=topology, constraints=constraints)
        self.plan = planner.collective_plan(module, [sharder], dist.GroupMember.WORLD)
        self.module = DistributedModelParallel(module, device=device, plan=self.plan, sharders=[sharder])

    @_quiet
    def tensors(self) -> dict[str, object]:
        """Each table's ShardedTensor by table name."""
        state = self.module.state_dict()
        return {t: next(v for k, v in state.items() if k.endswith(f"embeddings.{t}.weight")) for t in self.names}

    @_quiet
    def optimizer_tensors(self) -> dict[str, object]:
        """The fused optimizer's ShardedTensors (one row-wise sum per table) by state key."""
        out = {}
        for param_state in self.module.fused_optimizer.state_dict()["state"].values():
            out.update({k: v for k, v in param_state.items() if hasattr(v, "local_shards")})
        return out

    @_quiet
    def init(self, rows: Callable[[str, int, int, int], torch.Tensor]) -> None:
        """Fill this rank's shards: ``rows(table, start, stop, dim)`` gives rows [start, stop) of a table."""
        with torch.no_grad():
            for name, table in self.tensors().items():
                for (row, col), shard in _local_shards(table):
                    shard.copy_(rows(name, row, row + shard.shape[0], table.size(1))[:, col:col + shard.shape[1]])

    @_quiet
    def state(self) -> dict:
        """This rank's rows: weights and optimizer state, with their offsets."""
        def pack(tensors: dict) -> dict:
            return {k: [(offsets, t.detach().clone()) for offsets, t in _local_shards(v)] for k, v in tensors.items()}
        return {"tables": pack(self.tensors()), "optimizer": pack(self.optimizer_tensors()), "plan": str(self.plan)}

    @_quiet
    def load(self, state: dict) -> None:
        if state.get("plan") != str(self.plan):
            raise CheckpointError("the checkpoint's tables were sharded by another plan than this run's")
        with torch.no_grad():
            for part, tensors in (("tables", self.tensors()), ("optimizer", self.optimizer_tensors())):
                for key, table in tensors.items():
                    mine = _local_shards(table)
                    saved = state[part].get(key, [])
                    if [o for o, _ in mine] != [o for o, _ in saved]:
                        raise CheckpointError(f"checkpoint shard {key} does not match this rank's")
                    for (_, t), (_, value) in zip(mine, saved, strict=True):
                        t.copy_(value)

    def save_shard(self, checkpoints: CheckpointStore, name: str, rank: int) -> None:
        buf = io.BytesIO()
        torch.save(self.state(), buf)
        checkpoints.save_shard(name, rank, buf.getvalue())

    @_quiet
    def gather(self, is_main: bool) -> dict[str, torch.Tensor] | None:
        """Every table whole on rank 0 (a collective: every rank calls it); None elsewhere."""
        full: dict[str, torch.Tensor] = {}
        for name, t in self.tensors().items():
            out = torch.empty(tuple(t.size())) if is_main else None
            t.gather(dst=0, out=out)
            if out is not None:
                full[name] = out
        return full if is_main else None


class ShardCheckpoints:
    """The sharded trainers' checkpoints (DIN's and the towers'): every rank writes its own shard of the tables
    before rank 0 completes the checkpoint with the trainer's state; a resume loads this rank's shard after it.
    Mixed in before the trainer class, whose ``save_checkpoint`` and ``resume`` it extends."""

    tables: ShardedTables
    checkpoints: CheckpointStore | None
    info: tdist.DistInfo
    progress: Any

    def save_checkpoint(self) -> str | None:
        if self.checkpoints is not None:
            self.tables.save_shard(self.checkpoints, checkpoint_name(self.progress.global_step), self.info.rank)
        tdist.barrier(self.info)  # every shard is written before rank 0 completes the checkpoint
        return super().save_checkpoint()  # type: ignore[misc]  # a mixin: the trainer after it in the MRO has it

    def resume(self, *which: str) -> str | None:
        name = super().resume(*which)  # type: ignore[misc]  # a mixin: the trainer after it in the MRO has it
        if name is not None and self.checkpoints is not None:
            self.tables.load(self.checkpoints.load_shard(name, self.info.rank))
        return name


class ShardedTrainer(ShardCheckpoints, Trainer):
    """training.loop.Trainer with DIN's tables sharded (see the module docstring)."""

    def _build_model(self, init: Callable[[DIN], dict] | None) -> dict | None:
        refuse_unsupported(init)
        if self.precision.name == "fp16":
            raise ValueError("sharded tables train in fp32 or bf16 (fp16's loss scaling cannot reach the fused "
                             "optimizer); this device has no bf16")
        s, info = self.s, self.info
        join_group(info)
        self.sharded_din = ShardedDIN(model_config_for(self.samples, s))
        self.model = self.sharded_din.din  # the dense part: fused kernels, the dense optimizer, checkpoints
        if s.fused_kernels and self.device.type == "cpu" and s.attention_activation == "dice":
            from dinrec.training import kernels

            if kernels.load():
                self.model.fused_unit = kernels.din_unit
        loss = DINWithLoss(self.sharded_din)  # type: ignore[arg-type]  # DIN's inputs and logits
        self.tables = ShardedTables(loss, TABLES, device=self.device, world_size=info.world_size,
                                    lr=s.table_lr or s.lr, sharding=s.embedding_sharding)
        self.plan, self.step_fn = self.tables.plan, self.tables.module
        seed = self.sharded_din.table_seed
        self.tables.init(lambda name, start, stop, dim: table_rows(seed, name, start, stop, dim))
        return None

    def _optimizers(self) -> list[torch.optim.Optimizer]:
        """Adam for the dense part; the tables' fused optimizer runs inside the backward pass."""
        return [torch.optim.Adam(self._dense_parameters(), lr=self.s.lr)]

    # ------------------------------------------------------------------ evaluation and the result
    @torch.no_grad()
    def _evaluate(self, split: SplitTensors, name: str = "") -> dict:
        """Every rank scores its share of each batch (the lookups are collective), rank 0's order kept."""
        n, world, rank = len(split), self.info.world_size, self.info.rank
        if n == 0:
            return split_metrics(split, np.zeros(0))
        self.step_fn.eval()
        mine = []
        step = self.s.eval_batch_size * world
        for start in range(0, n, step):
            idx = torch.arange(start, min(start + step, n), device=split.label.device)
            share = idx[rank::world]
            if len(share) == 0:  # fewer samples than ranks: score one again, drop it after
                share = idx[:1]
            batch = split.batch(share)
            with self.precision.autocast():
                logits = self.sharded_din(*batch.inputs()).float().cpu()
            mine.append((share.cpu(), logits))
        self.step_fn.train()
        parts = tdist.gather_objects(mine, self.info, tensors=True)
        index = torch.cat([i for rank_parts in parts for i, _ in rank_parts])
        values = torch.cat([v for rank_parts in parts for _, v in rank_parts])
        logits = torch.empty(n)
        logits[index] = values  # a duplicate writes the same value twice
        return split_metrics(split, logits.numpy())

    def _final_model(self) -> DIN | None:
        """The tables gathered to rank 0, with the dense part, as one plain DIN (the bundle's format)."""
        full = self.tables.gather(self.info.is_main)
        if full is None:
            return None
        model = DIN(self.sharded_din.cfg)
        dense = {k: v for k, v in self.model.state_dict().items()}
        model.load_state_dict({**dense, "item_emb.weight": full["item_emb"], "cat_emb.weight": full["cat_emb"]})
        return model.eval()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
