"""The operational training loop: devices, precision, DDP, optimiser, evaluation, checkpoints.

The model (models.din) knows nothing of this; :class:`DINWithLoss` adds the loss.

Exact resume: a checkpoint holds everything the next step depends on — weights, optimiser,
schedule, grad scaler, every RNG (per rank), the data generator's state at the start of the
epoch plus the number of batches done in it — so an interrupted run that resumes makes the same
steps, in the same order, as one that never stopped (bitwise on CPU).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from dinrec.models.bundle import code_version
from dinrec.models.context import CANDIDATE_FEATURES, GAP_BUCKETS
from dinrec.models.din import DIN, DINConfig, ListContext
from dinrec.models.kernels import list_unit, load_lists
from dinrec.training import dist as tdist
from dinrec.training import kernels
from dinrec.training.amp import Precision, choose_precision
from dinrec.training.checkpoint import CheckpointError, CheckpointStore, checkpoint_name
from dinrec.training.data import SplitTensors
from dinrec.training.lists import ListData
from dinrec.training.metrics import auc, gauc, logloss
from dinrec.training.optim import RowWiseAdagrad
from dinrec.training.progress import showing
from dinrec.training.samples import SampleSet
from dinrec.training.settings import TrainSettings
from dinrec.training.telemetry import GpuMonitor, ScalarLog, memory_stats

log = logging.getLogger(__name__)

# Settings that change what a step computes: a checkpoint made under others cannot be resumed.
RESUME_KEYS = ("batch_size", "lr", "seq_len", "negatives", "item_dim", "cat_dim", "mlp_hidden", "attention_hidden",
               "attention_activation", "mlp_activation", "seed", "precision", "mba_l2", "warmup_steps",
               "sparse_embeddings", "embeddings", "embedding_sharding", "embedding_optimizer", "embedding_lr",
               "objective", "list_negatives", "hard_negative_share", "popular_negative_power", "guard_folds",
               "din_context", "dropout")


class TrainingInterrupted(Exception):
    """SIGTERM/SIGINT arrived; a checkpoint was written at a step boundary."""

    def __init__(self, checkpoint: str | None) -> None:
        super().__init__(f"interrupted; checkpoint {checkpoint}")
        self.checkpoint = checkpoint


class MiniBatchL2(nn.Module):
    """The DIN paper's mini-batch-aware L2 on DIN's two tables: Σ over the rows a batch touches (padding 0
    aside) of ‖row‖² / the row's training frequency. Only the batch's rows, so a step costs what the batch
    does, not the table; over the frequency, so a popular row, in many batches, is not pulled harder over an
    epoch than a rare one."""

    inv_item_freq: torch.Tensor  # (I,) buffers: 1 / each row's training frequency
    inv_cat_freq: torch.Tensor  # (C,)

    def __init__(self, weight: float, item_freq: torch.Tensor, cat_freq: torch.Tensor) -> None:
        super().__init__()
        self.weight = weight
        self.register_buffer("inv_item_freq", 1.0 / item_freq.clamp_min(1).float(), persistent=False)
        self.register_buffer("inv_cat_freq", 1.0 / cat_freq.clamp_min(1).float(), persistent=False)

    def forward(self, model: DIN, items: tuple[torch.Tensor, ...], cats: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """``items``, ``cats``: the batch's item and category ids, tensors of any shapes."""
        sparse = model.cfg.sparse_embeddings
        return self.weight * (_table_l2(model.item_emb.weight, self.inv_item_freq, items, sparse)
                              + _table_l2(model.cat_emb.weight, self.inv_cat_freq, cats, sparse))


def _table_l2(table: torch.Tensor, inv_freq: torch.Tensor, ids: tuple[torch.Tensor, ...], sparse: bool) -> torch.Tensor:
    used = torch.unique(torch.cat([t.reshape(-1) for t in ids]))  # (U,) rows this batch touches
    used = used[used != 0]
    rows = F.embedding(used, table, sparse=sparse)  # (U, E)
    return (rows.float().pow(2).sum(1) * inv_freq.index_select(0, used)).sum()


class DINWithLoss(nn.Module):
    """Train wrapper: the pure model, binary cross-entropy on its logits, and optionally ``l2``, the
    paper's mini-batch-aware L2 on the embeddings."""

    def __init__(self, model: DIN, l2: MiniBatchL2 | None = None) -> None:
        super().__init__()
        self.model, self.l2 = model, l2

    def forward(self, hist_items, hist_cats, target_item, target_cat, label) -> torch.Tensor:
        logits = self.model(hist_items, hist_cats, target_item, target_cat)  # (B,)
        loss = F.binary_cross_entropy_with_logits(logits.float(), label)
        if self.l2 is not None:
            loss = loss + self.l2(self.model, (hist_items, target_item), (hist_cats, target_cat))
        return loss


class DINListLoss(nn.Module):
    """Train wrapper for lists (training.lists): the softmax cross-entropy of each list's positive (column 0)
    against its negatives, and optionally ``l2``, the mini-batch-aware L2 over the rows of the histories and
    of every candidate, positive or negative. The logits leave autocast as fp32 before the
    log-Q correction is subtracted and the softmax taken: a list of a hundred logits, some corrected by
    −log(K·q) of a rare item, must not overflow in fp16 or round away in bf16."""

    def __init__(self, model: DIN, l2: MiniBatchL2 | None = None) -> None:
        super().__init__()
        self.model, self.l2 = model, l2

    def forward(self, hist_items: torch.Tensor, hist_cats: torch.Tensor, cand_items: torch.Tensor,
                cand_cats: torch.Tensor, gaps: torch.Tensor | None, pairs: torch.Tensor | None,
                features: torch.Tensor | None, valid: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
        logits = self.model.score_lists(hist_items, hist_cats, cand_items, cand_cats,
                                        ListContext(gaps, pairs, features))  # (B, N)
        logits = (logits.float() - log_q).masked_fill(~valid, -torch.inf)
        loss = F.cross_entropy(logits, torch.zeros(len(logits), dtype=torch.long, device=logits.device))
        if self.l2 is not None:
            loss = loss + self.l2(self.model, (hist_items, cand_items), (hist_cats, cand_cats))
        return loss


def list_scores(model: DIN, inputs: tuple) -> torch.Tensor:
    """(B, N) logits of one chunk of training.lists' validation or held-out lists."""
    hist_items, hist_cats, cand, cand_cats, context = inputs
    return model.score_lists(hist_items, hist_cats, cand, cand_cats, context).float()


@torch.no_grad()
def evaluate_lists(model: DIN, lists: ListData, split: SplitTensors | None, split_name: str,
                   precision: Precision | None = None, k: int = 10) -> dict:
    """DIN alone over the served candidates of ``split_name``'s positives — ``din_hr@10`` (the selection
    metric of listwise training) and ``din_ndcg@10``, a target recall missed counting as a miss — and the
    split's AUC, GAUC and logloss over its sampled negatives (health metrics)."""
    samples = lists.samples
    split_data = samples.split(split_name)
    was_training = model.training
    model.eval()
    hits, gains = [], []
    with precision.autocast() if precision else contextlib.nullcontext():
        for _, cand, where, inputs in lists.candidate_lists(split_data, np.flatnonzero(split_data.label == 1)):
            logits = list_scores(model, inputs).masked_fill(cand < 0, -torch.inf)  # (b, R + C)
            target = logits.gather(1, where.clamp_min(0).unsqueeze(1))  # (b, 1)
            above = (logits > target).sum(dim=1)  # candidates ranked before the target
            found = (where >= 0) & (above < k)
            hits.append(found.float())
            gains.append(torch.where(found, 1.0 / torch.log2(above.float() + 2), 0.0))
        split_logits = np.zeros(len(split_data.label), dtype=np.float32)
        for group, inputs in lists.split_groups(split_data):
            split_logits[group] = list_scores(model, inputs).cpu().numpy()
    model.train(was_training)
    hit = torch.cat(hits).numpy() if hits else np.zeros(0)
    out = split_metrics(split, split_logits) if split is not None else {}
    out.update({f"din_hr@{k}": float(hit.mean()) if len(hit) else float("nan"),
                f"din_ndcg@{k}": float(torch.cat(gains).mean()) if gains else float("nan")})
    return out


def pick_device(name: str, info: tdist.DistInfo | None = None) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device 'cuda' requested but no CUDA device is available")
        return torch.device("cuda", info.local_rank if info else 0)
    return torch.device(name)


def weights_sha256(model: nn.Module) -> str:
    """A hash of the weights (names, dtypes, shapes, bytes), so two runs can be compared."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.int16).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes())
    return h.hexdigest()


@torch.no_grad()
def evaluate(model: DIN, split: SplitTensors, batch_size: int, precision: Precision | None = None) -> dict:
    if len(split) == 0:
        return split_metrics(split, np.zeros(0))
    was_training = model.training
    model.eval()
    with precision.autocast() if precision else contextlib.nullcontext():
        logits = torch.cat([model(*b.inputs()).float().cpu() for b in split.batches(batch_size)]).numpy()
    model.train(was_training)
    return split_metrics(split, logits)


def split_metrics(split: SplitTensors, logits: np.ndarray) -> dict:
    """AUC, GAUC and logloss of ``logits`` (N,), one per sample of ``split`` in its order."""
    if len(split) == 0:
        return {"auc": float("nan"), "gauc": float("nan"), "logloss": float("nan"), "n": 0}
    labels, users = split.label.cpu().numpy(), split.user.cpu().numpy()
    # plain floats: these go into checkpoints, which hold tensors and Python scalars only
    return {"auc": float(auc(labels, logits)), "gauc": float(gauc(users, labels, logits)),
            "logloss": float(logloss(labels, logits)), "n": int(len(labels))}


def model_config_for(samples: SampleSet, s: TrainSettings) -> DINConfig:
    """DIN's configuration for these samples (:func:`din_config` over their vocabulary and histories)."""
    return din_config(samples.vocab.n_items, samples.vocab.n_categories, min(s.seq_len, samples.seq_len), s)


def din_config(n_items: int, n_categories: int, seq_len: int, s: TrainSettings) -> DINConfig:
    """The DIN ``s`` trains over a vocabulary of ``n_items`` items (padding included) and histories of
    ``seq_len``; listwise, with the context ``din_context`` names (models.context: what the ranking stage
    computes for it at serving time). With the default settings: the model ``dinrec train`` ships, the one
    the serving and scoring benchmarks measure."""
    ctx = set(s.din_context) if s.objective == "listwise" else set()
    return DINConfig(n_items=n_items, n_categories=n_categories,
                     item_dim=s.item_dim, cat_dim=s.cat_dim, mlp_hidden=tuple(s.mlp_hidden),
                     attention_hidden=tuple(s.attention_hidden), attention_activation=s.attention_activation,
                     mlp_activation=s.mlp_activation, sparse_embeddings=s.sparse_embeddings, dropout=s.dropout,
                     positions=seq_len if "position" in ctx else 0,
                     time_buckets=GAP_BUCKETS if "time" in ctx else 0, pair_inputs=int("covisit" in ctx),
                     candidate_inputs=len(CANDIDATE_FEATURES) if "candidate" in ctx else 0,
                     cross=s.objective == "listwise")


@dataclass
class Progress:
    epoch: int = 0  # completed epochs
    step_in_epoch: int = 0  # global batches done in the current epoch
    global_step: int = 0
    samples_seen: int = 0
    train_seconds: float = 0.0
    loss_sum: float = 0.0  # over the current epoch, for logging
    best_val: float = -math.inf  # the selection metric's best (listwise: val din_hr@10; pointwise: val GAUC)
    best_epoch: int = 0
    bad_epochs: int = 0
    history: list = field(default_factory=list)

    @property
    def samples_per_s(self) -> float:
        return self.samples_seen / self.train_seconds if self.train_seconds else 0.0


@dataclass
class TrainResult:
    model: DIN | None  # None on a sharded run's ranks but the first, which gathers the tables
    metrics: dict = field(default_factory=dict)


def _rng_state(device: torch.device) -> dict:
    np_state = np.random.get_state(legacy=True)  # numpy's default (its stubs' default, legacy=False, is not)
    assert isinstance(np_state, tuple)  # the global RandomState is an MT19937: legacy gives its tuple
    return {"python": random.getstate(), "numpy": [np_state[0], torch.from_numpy(np_state[1].copy()), *np_state[2:]],
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def _set_rng_state(state: dict, device: torch.device) -> None:
    v, keys, *rest = state["python"]
    random.setstate((v, tuple(keys), *rest))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy(), *rest))
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def _frequencies(samples: SampleSet) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.from_numpy(np.bincount(samples.seq_items, minlength=samples.vocab.n_items)),
            torch.from_numpy(np.bincount(samples.seq_cats, minlength=samples.vocab.n_categories)))


class Trainer:
    def __init__(self, samples: SampleSet, s: TrainSettings, *, checkpoints: CheckpointStore | None = None,
                 stop: threading.Event | None = None, checkpoint_now: threading.Event | None = None,
                 init: Callable[[DIN], dict] | None = None, lists: ListData | None = None,
                 on_epoch: Callable[[Trainer], None] | None = None) -> None:
        """``init``: called on the fresh model before training (a warm start: training.warm_start);
        what it returns goes to the metrics as ``warm_start``. A resumed checkpoint replaces it.
        ``lists``: the listwise objective's data (training.lists), which ``objective=listwise`` needs.
        ``on_epoch``: called after each epoch's validation (a benchmark's probe; it must not train)."""
        self.on_epoch = on_epoch
        if (s.objective == "listwise") != (lists is not None):
            raise ValueError("the listwise objective trains on training.lists.ListData (and only it does)")
        self.samples, self.s, self.checkpoints, self.lists = samples, s, checkpoints, lists
        self.stop = stop or threading.Event()
        # set from outside (SIGUSR1: a spot rebalance recommendation) → one extra checkpoint, keep going
        self.checkpoint_now = checkpoint_now or threading.Event()
        if s.threads:
            torch.set_num_threads(s.threads)
        want_cuda = s.device == "cuda" or (s.device == "auto" and torch.cuda.is_available())
        self.info = tdist.init_distributed(want_cuda)
        self.device = pick_device(s.device, self.info)
        self.precision = choose_precision(self.device, s.precision)
        if s.batch_size % self.info.world_size:
            raise ValueError(f"batch_size {s.batch_size} must divide evenly over {self.info.world_size} ranks")
        torch.manual_seed(s.seed)  # identical initial weights on every rank
        random.seed(s.seed)
        np.random.seed(s.seed)
        self.model: DIN
        self.step_fn: nn.Module
        self.init_info = self._build_model(init)
        self.resumed_from: str | None = None  # the checkpoint this run continued, for its JSON
        self.opts = self._optimizers()
        warmup = s.warmup_steps
        self.scheds = [torch.optim.lr_scheduler.LambdaLR(
            o, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0) for o in self.opts]
        self.scaler = self.precision.grad_scaler()
        self.seq_len = min(s.seq_len, samples.seq_len)
        self.train_t = SplitTensors(samples, samples.train, self.seq_len, self.device)
        self.val_t = SplitTensors(samples, samples.val, self.seq_len, self.device, share_seq_with=self.train_t)
        self.test_t = SplitTensors(samples, samples.test, self.seq_len, self.device, share_seq_with=self.train_t)
        self.gen = torch.Generator().manual_seed(s.seed)  # data order, identical on every rank
        self.epoch_gen_state = self.gen.get_state()
        self.progress = Progress()
        self.best_state: dict | None = None
        self.gpu = GpuMonitor(self.device)
        self.scalars = ScalarLog(s.tensorboard_dir if self.info.is_main else None)

    def _build_model(self, init: Callable[[DIN], dict] | None) -> dict | None:
        """``self.model`` (DIN) and ``self.step_fn`` (it with its loss, under DDP with several ranks);
        returns what ``init`` said of the warm start."""
        s = self.s
        if s.embeddings != "replicated":
            raise ValueError("sharded tables are trained by training.sharded.ShardedTrainer")
        self.model = DIN(model_config_for(self.samples, s))
        init_info = init(self.model) if init is not None else None
        self.model.to(self.device)
        if s.fused_kernels and self.device.type == "cpu" and s.attention_activation == "dice" and kernels.load():
            self.model.fused_unit = kernels.din_unit
        if s.fused_kernels and self.device.type == "cpu" and s.objective == "listwise" and load_lists():
            self.model.list_unit = list_unit  # the listwise unit, fused (models.kernels; the same function)
        l2 = MiniBatchL2(s.mba_l2, *_frequencies(self.samples)) if s.mba_l2 > 0 else None
        self.step_fn = (DINListLoss(self.model, l2) if s.objective == "listwise"
                        else DINWithLoss(self.model, l2)).to(self.device)
        if self.info.enabled:
            self.step_fn = nn.parallel.DistributedDataParallel(
                self.step_fn, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        if s.sparse_embeddings and self.info.enabled and self.device.type == "cuda":
            raise ValueError("sparse embedding gradients are not supported by NCCL; use dense ones with DDP on GPU")
        return init_info

    def _dense_parameters(self) -> list[nn.Parameter]:
        """DIN's parameters but its tables."""
        return [p for name, p in self.model.named_parameters() if not name.startswith(("item_emb.", "cat_emb."))]

    def _optimizers(self) -> list[torch.optim.Optimizer]:
        """Adam; the tables with their own learning rate (embedding_lr) and optimizer where asked: row-wise
        Adagrad (training.optim), or with sparse embeddings SparseAdam (lazy: only touched rows' moments move)."""
        s = self.s
        table_lr = s.table_lr or s.lr
        if s.table_optimizer == "adam" and not s.sparse_embeddings and s.table_lr is None:
            return [torch.optim.Adam(self.model.parameters(), lr=s.lr)]
        tables = [self.model.item_emb.weight, self.model.cat_emb.weight]
        dense = torch.optim.Adam(self._dense_parameters(), lr=s.lr)
        if s.table_optimizer == "rowwise_adagrad":
            return [RowWiseAdagrad(tables, lr=table_lr), dense]
        if s.sparse_embeddings:
            return [torch.optim.SparseAdam(tables, lr=table_lr), dense]
        return [torch.optim.Adam(tables, lr=table_lr), dense]

    # ------------------------------------------------------------------ checkpoints
    def _meta(self) -> dict:
        return {"settings": json.loads(self.s.model_dump_json()), "code_version": code_version(),
                "dataset_fingerprint": self.samples.fingerprint, "world_size": self.info.world_size,
                "global_step": self.progress.global_step, "epoch": self.progress.epoch}

    def save_checkpoint(self) -> str | None:
        rngs = tdist.gather_objects(_rng_state(self.device), self.info, tensors=True)
        name = checkpoint_name(self.progress.global_step)
        if self.info.is_main and self.checkpoints is not None:
            state = {"model": self.model.state_dict(), "optimizers": [o.state_dict() for o in self.opts],
                     "schedulers": [sc.state_dict() for sc in self.scheds], "scaler": self.scaler.state_dict(),
                     "rng": rngs, "data_gen": self.epoch_gen_state, "progress": asdict(self.progress),
                     "best_model": self.best_state}
            self.checkpoints.save(name, state, self._meta())
        tdist.barrier(self.info)
        return name if self.checkpoints is not None else None

    def resume(self, which: str) -> str | None:
        """``auto``: the latest complete checkpoint, if any; or a checkpoint's name."""
        if self.checkpoints is None:
            raise CheckpointError("resuming needs a checkpoint location")
        name = self.checkpoints.latest() if which == "auto" else which
        if name is None:
            return None
        state, meta = self.checkpoints.load(name)
        self._check_compatible(meta)
        self.model.load_state_dict(state["model"])
        for o, o_state in zip(self.opts, state["optimizers"], strict=True):
            o.load_state_dict(o_state)
        for sc, sc_state in zip(self.scheds, state["schedulers"], strict=True):
            sc.load_state_dict(sc_state)
        self.scaler.load_state_dict(state["scaler"])
        _set_rng_state(state["rng"][self.info.rank], self.device)
        self.epoch_gen_state = state["data_gen"]
        progress = dict(state["progress"])
        if "best_val_gauc" in progress:  # checkpoints from before the listwise objective
            progress["best_val"] = progress.pop("best_val_gauc")
        self.progress = Progress(**progress)
        self.best_state = state.get("best_model")
        self.resumed_from = name
        if self.info.is_main:
            log.warning("resumed from %s (epoch %d, step %d of the epoch)", name, self.progress.epoch,
                        self.progress.step_in_epoch)
        return name

    def _check_compatible(self, meta: dict) -> None:
        if meta.get("dataset_fingerprint") != self.samples.fingerprint:
            raise CheckpointError("checkpoint was made on different data (dataset fingerprint "
                                  f"{meta.get('dataset_fingerprint')} != {self.samples.fingerprint})")
        if meta.get("world_size") != self.info.world_size:
            raise CheckpointError(f"checkpoint was made with {meta.get('world_size')} ranks, this run has "
                                  f"{self.info.world_size}")
        old, new = meta.get("settings", {}), json.loads(self.s.model_dump_json())
        diffs = [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in RESUME_KEYS if old.get(k) != new.get(k)]
        if diffs:
            raise CheckpointError("checkpoint settings differ: " + "; ".join(diffs))

    # ------------------------------------------------------------------ the loop
    def _train_step(self, idx: torch.Tensor) -> float:
        rank, world = self.info.rank, self.info.world_size
        if self.lists is not None:
            # The global batch's lists, drawn alike on every rank; this rank trains on its share.
            p = self.progress
            lists = self.lists.batch(idx.cpu().numpy(), p.epoch, p.global_step)
            mine = lists.take(torch.arange(rank, len(idx), world))
            c = mine.context
            inputs = [t.to(self.device) if t is not None else None for t in (
                mine.hist_items, mine.hist_cats, mine.cand_items, mine.cand_cats, c.gaps, c.pairs, c.candidates,
                mine.valid, mine.log_q)]
            with self.precision.autocast():
                loss = self.step_fn(*inputs)
        else:
            local = idx[rank::world]  # this rank's share of the global batch
            batch = self.train_t.batch(local)
            with self.precision.autocast():
                loss = self.step_fn(*batch.inputs(), batch.label)
        for o in self.opts:
            o.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        for o in self.opts:
            self.scaler.step(o)
        self.scaler.update()
        for sc in self.scheds:
            sc.step()
        return float(loss.detach())

    def run(self) -> TrainResult:
        s, p = self.s, self.progress
        n = len(self.lists.positives) if self.lists is not None else len(self.train_t)
        n_batches = (n + s.batch_size - 1) // s.batch_size
        self.model.train()
        assert s.epochs is not None  # filled by TrainSettings' validation (its objective's default)
        try:
            while p.epoch < s.epochs and not (s.max_steps and p.global_step >= s.max_steps):
                next_epoch_gen = self._run_epoch(n, n_batches)
                if self._end_epoch(n_batches, next_epoch_gen) or (s.max_steps and p.global_step >= s.max_steps):
                    break
        finally:  # also when interrupted: stop the NVML sampler, flush TensorBoard
            self.gpu.close()
            self.scalars.close()
        if s.patience and self.best_state is not None:
            self.model.load_state_dict(self.best_state)  # early stopping keeps the best epoch's weights
        test = self._evaluate(self.test_t, "test")
        final = self._final_model()
        metrics = {**(p.history[-1] if p.history else {}), **{f"test_{k}": v for k, v in test.items()}}
        metrics.update({"samples_per_s": p.samples_per_s,
                        "train_samples": n, "seq_len": self.seq_len, "device": str(self.device),
                        "precision": self.precision.name, "world_size": self.info.world_size,
                        "fused_kernel": self.model.fused_unit is not None or self.model.list_unit is not None,
                        "embeddings": s.embeddings,
                        "best_epoch": p.best_epoch, "global_step": p.global_step, "warm_start": self.init_info,
                        "objective": s.objective, "selection": self.selection,
                        "resumed_from": self.resumed_from,
                        "weights_sha256": weights_sha256(final) if final is not None else None})
        if self.device.type == "cuda":
            metrics["gpu_name"] = torch.cuda.get_device_name(self.device)  # what `dinrec plan --calibrate` matches
        return TrainResult(model=final, metrics=metrics)

    @property
    def selection(self) -> str:
        """The validation figure early stopping and the best epoch go by."""
        return "val_din_hr@10" if self.lists is not None else "val_gauc"

    def _evaluate(self, split: SplitTensors, name: str) -> dict:
        if self.lists is not None:
            return evaluate_lists(self.model, self.lists, split, name, self.precision)
        return evaluate(self.model, split, self.s.eval_batch_size, self.precision)

    def _final_model(self) -> DIN | None:
        """The trained DIN, whole (None on a rank that does not hold it)."""
        return self.model

    def _run_epoch(self, n: int, n_batches: int) -> torch.Tensor:
        """The rest of the current epoch (all of it, or from a resumed position); returns the data
        generator's state for the next epoch."""
        s, p = self.s, self.progress
        self.gen.set_state(self.epoch_gen_state)
        order = torch.randperm(n, generator=self.gen).to(self.device)  # the epoch's global order
        next_epoch_gen = self.gen.get_state()
        bar = tqdm(range(p.step_in_epoch, n_batches), total=n_batches, initial=p.step_in_epoch,
                   disable=not (showing(s.progress) and self.info.is_main), desc=f"epoch {p.epoch + 1}/{s.epochs}",
                   unit="batch", leave=False)
        t0 = time.perf_counter()
        for step in bar:
            idx = order[step * s.batch_size:(step + 1) * s.batch_size]
            p.loss_sum += self._train_step(idx)
            p.step_in_epoch, p.global_step, p.samples_seen = step + 1, p.global_step + 1, p.samples_seen + len(idx)
            if step % 20 == 0:
                bar.set_postfix(loss=f"{p.loss_sum / p.step_in_epoch:.4f}")
            stop, asked = tdist.any_rank((self.stop.is_set(), self.checkpoint_now.is_set()), self.info)
            if stop:
                p.train_seconds += time.perf_counter() - t0
                raise TrainingInterrupted(self.save_checkpoint())
            if asked or (s.checkpoint_every and p.global_step % s.checkpoint_every == 0):
                self.checkpoint_now.clear()
                p.train_seconds += time.perf_counter() - t0
                self.save_checkpoint()
                t0 = time.perf_counter()
            if s.max_steps and p.global_step >= s.max_steps:
                break
        p.train_seconds += time.perf_counter() - t0
        return next_epoch_gen

    def _end_epoch(self, n_batches: int, next_epoch_gen: torch.Tensor) -> bool:
        """Evaluate, track the best epoch, checkpoint; True when early stopping ends training."""
        s, p = self.s, self.progress
        val = self._evaluate(self.val_t, "val")
        p.epoch += 1
        entry = {"epoch": p.epoch, "train_loss": p.loss_sum / max(n_batches, 1),
                 "samples_per_s": p.samples_per_s,
                 **{f"val_{k}": v for k, v in val.items()}, **memory_stats(self.device), **self.gpu.read()}
        p.history.append(entry)
        self.scalars.write(entry, p.global_step)
        p.step_in_epoch, p.loss_sum = 0, 0.0
        self.epoch_gen_state = next_epoch_gen
        figure = val[self.selection.removeprefix("val_")]
        improved = not math.isnan(figure) and figure > p.best_val
        if improved:
            p.best_val, p.best_epoch, p.bad_epochs = figure, p.epoch, 0
            if s.patience:
                self.best_state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        else:
            p.bad_epochs += 1
        if self.on_epoch is not None:
            self.on_epoch(self)
        if self.info.is_main:
            log.info("epoch %d: %s", p.epoch, json.dumps(entry))
            if showing(s.progress):  # stderr: stdout carries the command's one JSON result
                tqdm.write(json.dumps({k: round(v, 5) if isinstance(v, float) else v for k, v in entry.items()}),
                           file=sys.stderr)
        self.save_checkpoint()
        return bool(s.patience and p.bad_epochs >= s.patience)
