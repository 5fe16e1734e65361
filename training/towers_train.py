"""Train the recall towers (models.towers) on the same samples as DIN.

Each training positive (a behaviour and the history before it) is a softmax over items: the
target against every item while the catalog is small enough to score whole (``full_softmax_items``),
else against ``sampled_negatives`` items drawn uniformly and shared by the batch (uniform draws
need no log-Q correction; accidental hits of the target are masked). The best epoch by validation
HR@``eval_n`` is kept — measured as serving recalls: history items excluded.

Operationally like DIN's trainer (training.loop): on the job's device, under torchrun with DDP (every
rank takes ``rank::world`` of each global batch, the sampled negatives are the same on every rank), and
checkpointed — at each epoch's end and every ``checkpoint_every`` steps, on SIGTERM too — in the job's
checkpoint store under ``towers/``, so ``--resume auto`` continues exactly where they stopped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dinrec.models.recall import target_found, top_unseen
from dinrec.models.towers import TABLES, Towers, TowersConfig
from dinrec.training import dist as tdist
from dinrec.training.checkpoint import CheckpointError, CheckpointStore, checkpoint_name
from dinrec.training.data import split_histories
from dinrec.training.loop import TrainingInterrupted
from dinrec.training.optim import RowWiseAdagrad
from dinrec.training.samples import SampleSet, Split
from dinrec.training.settings import TrainSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TowersSettings:
    dim: int = 32
    epochs: int = 20
    batch_size: int = 512
    lr: float = 3e-3
    weight_decay: float = 0.0
    temperature: float = 0.07
    full_softmax_items: int = 200_000
    sampled_negatives: int = 8192
    eval_n: int = 200
    patience: int = 3  # epochs without a better validation HR before stopping
    checkpoint_every: int = 0  # also checkpoint every N steps (0: at epoch ends only)
    device: str = "cpu"
    seed: int = 0
    table_optimizer: str = "adam"  # or rowwise_adagrad (training.optim; the fused one when sharded)
    table_lr: float | None = None  # the tables' learning rate (None: lr)
    embeddings: str = "replicated"  # or sharded: the tables split over the ranks by TorchRec (sampled softmax)
    sharding: str = "auto"  # with sharded tables: TorchRec's planner, or row_wise / table_wise / column_wise


def towers_settings(train: TrainSettings) -> TowersSettings:
    """The recall towers' settings from ``dinrec train``'s (the device is DIN's): every field is reachable from
    a DINREC_TRAIN_RECALL_* variable or one DIN shares (tests/training/test_towers.py holds the defaults
    equal)."""
    device = train.device if train.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    return TowersSettings(dim=train.recall_dim, epochs=train.recall_epochs, batch_size=train.recall_batch_size,
                          lr=train.recall_lr, weight_decay=train.recall_weight_decay,
                          temperature=train.recall_temperature, full_softmax_items=train.recall_full_softmax_items,
                          sampled_negatives=train.recall_sampled_negatives, eval_n=train.recall_eval_n,
                          patience=train.recall_patience, checkpoint_every=train.checkpoint_every, device=device,
                          seed=train.seed, table_optimizer=train.table_optimizer, table_lr=train.table_lr,
                          embeddings=train.embeddings, sharding=train.embedding_sharding)


@dataclass
class TowersResult:
    model: Towers | None  # None on the ranks but 0 of a sharded run (rank 0 gathers the tables)
    metrics: dict


@dataclass
class _Progress:
    epoch: int = 0  # completed epochs
    step_in_epoch: int = 0
    global_step: int = 0
    seconds: float = 0.0
    loss_sum: float = 0.0  # over the current epoch
    best: float = -1.0
    best_epoch: int = -1
    done: bool = False  # stopped early: no better validation HR for ``patience`` epochs
    history: list = field(default_factory=list)


def sampled_softmax(users: torch.Tensor, pos_v: torch.Tensor, neg_v: torch.Tensor, target: torch.Tensor,
                    neg: torch.Tensor, temperature: float) -> torch.Tensor:
    """Each user's target against the batch's shared negatives (an accidental hit of the target masked):
    users (B, D), pos_v (B, D), neg_v (M, D), target (B,), neg (M,) → the mean loss."""
    pos_logit = (users * pos_v).sum(-1, keepdim=True)  # (B, 1)
    neg_logit = (users @ neg_v.T).masked_fill(neg.unsqueeze(0) == target.unsqueeze(1), -torch.inf)  # (B, M)
    logits = torch.cat([pos_logit, neg_logit], dim=1) / temperature  # (B, 1 + M)
    return F.cross_entropy(logits, torch.zeros(len(target), dtype=torch.long, device=target.device))


class _Loss(nn.Module):
    """The towers' softmax loss for one batch: what DDP wraps (its forward is what syncs gradients)."""

    item_category: torch.Tensor  # (I,) a buffer: each item's category index

    def __init__(self, model: Towers, item_category: torch.Tensor, full: bool) -> None:
        super().__init__()
        self.model, self.full = model, full
        self.register_buffer("item_category", item_category, persistent=False)

    def forward(self, hist: torch.Tensor, cats: torch.Tensor, target: torch.Tensor,
                neg: torch.Tensor | None) -> torch.Tensor:
        model, t = self.model, self.model.cfg.temperature
        users = model.users(hist, cats)  # (B, D)
        if self.full:
            logits = users @ model.item_table(self.item_category).T / t  # (B, I)
            logits[:, 0] = -torch.inf
            return F.cross_entropy(logits, target)
        assert neg is not None
        pos_v = model.items(target, self.item_category[target])  # (B, D)
        neg_v = model.items(neg, self.item_category[neg])  # (M, D)
        return sampled_softmax(users, pos_v, neg_v, target, neg, t)


def _positives(split: Split) -> np.ndarray:
    return np.flatnonzero(split.label == 1)


@torch.no_grad()
def hit_rate_at(model: Towers, samples: SampleSet, split: Split, n: int, item_category: torch.Tensor,
                batch: int = 1024) -> float:
    """HR@n over ``split``'s positives: the target among the n best items, history items excluded."""
    model.eval()
    device = item_category.device
    table = model.item_table(item_category)  # (I, D)
    rows = _positives(split)
    found = 0
    for s in range(0, len(rows), batch):
        r = rows[s:s + batch]
        hist, cats = (t.to(device) for t in split_histories(samples, split, r))
        top = top_unseen(model.users(hist, cats) @ table.T, hist, n).cpu()  # (B, I) scores → (B, n)
        found += int(target_found(top, torch.from_numpy(split.target_item[r])).sum())
    return found / max(len(rows), 1)


class TowersTrainer:
    def __init__(self, samples: SampleSet, settings: TowersSettings, init: Callable[[Towers], dict] | None = None,
                 *, checkpoints: CheckpointStore | None = None, stop: threading.Event | None = None,
                 checkpoint_now: threading.Event | None = None) -> None:
        self.samples, self.s = samples, settings
        self.checkpoints = checkpoints.part("towers") if checkpoints is not None else None
        self.stop = stop or threading.Event()
        self.checkpoint_now = checkpoint_now or threading.Event()
        self.info = tdist.init_distributed(settings.device == "cuda")
        self.device = torch.device("cuda", self.info.local_rank) if settings.device == "cuda" else \
            torch.device(settings.device)
        if settings.batch_size % self.info.world_size:
            raise ValueError(f"the towers' batch {settings.batch_size} must divide evenly over "
                             f"{self.info.world_size} ranks")
        torch.manual_seed(settings.seed)  # the same initial weights on every rank
        vocab = samples.vocab
        self.cfg = TowersConfig(n_items=vocab.n_items, n_categories=len(vocab.categories), dim=settings.dim,
                                seq_len=samples.seq_len, temperature=settings.temperature)
        self.item_category = torch.as_tensor(vocab.item_category, dtype=torch.long, device=self.device)  # (I,)
        # Sharded tables never score the whole catalog per step: their softmax is always sampled.
        self.full = vocab.n_items <= settings.full_softmax_items and settings.embeddings != "sharded"
        self.init_info = self._build_model(init)  # self.model, self.step_fn
        self.opts = self._optimizers()
        self.train_rows = _positives(samples.train)
        # Data order and negatives from generators of their own, the same on every rank, saved in checkpoints.
        self.order_gen = torch.Generator().manual_seed(settings.seed)
        self.neg_gen = torch.Generator().manual_seed(settings.seed + 1)
        self.epoch_order_state = self.order_gen.get_state()
        self.progress = _Progress()
        self.best_state: dict | None = None

    def _build_model(self, init: Callable[[Towers], dict] | None) -> dict | None:
        self.model: Towers = Towers(self.cfg)
        info = init(self.model) if init is not None else None
        self.model.to(self.device)
        self.step_fn: nn.Module = _Loss(self.model, self.item_category, self.full)
        if self.info.enabled:
            self.step_fn = nn.parallel.DistributedDataParallel(
                self.step_fn, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        return info

    def _optimizers(self) -> list[torch.optim.Optimizer]:
        """Adam; the tables with their own learning rate and, where asked, row-wise Adagrad (training.optim)."""
        s = self.s
        if s.table_optimizer == "adam" and s.table_lr is None:
            return [torch.optim.Adam(self.model.parameters(), lr=s.lr, weight_decay=s.weight_decay)]
        tables = [getattr(self.model, t).weight for t in TABLES]
        dense = torch.optim.Adam(self.model.dense_parameters(), lr=s.lr, weight_decay=s.weight_decay)
        if s.table_optimizer == "rowwise_adagrad":
            return [RowWiseAdagrad(tables, lr=s.table_lr or s.lr), dense]
        return [torch.optim.Adam(tables, lr=s.table_lr or s.lr, weight_decay=s.weight_decay), dense]

    def _hit_rate(self, split: Split) -> float:
        """HR@eval_n of the towers as they are now."""
        return self._hit_rate_of(self.model, split)

    def _hit_rate_of(self, model: Towers | None, split: Split) -> float:
        assert model is not None  # this trainer always has its towers (only a sharded run's other ranks have none)
        return hit_rate_at(model, self.samples, split, self.s.eval_n, self.item_category)

    def _snapshot(self) -> dict | None:
        """The weights to keep as the best epoch's."""
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def _final_model(self) -> Towers | None:
        """The best epoch's towers, for the test split and the bundle."""
        if self.best_state is not None:
            self.model.load_state_dict(self.best_state)
        return self.model.eval()

    # ------------------------------------------------------------------ checkpoints
    def _resume_settings(self) -> dict:
        """The settings a checkpoint must share with the run resuming it: those that change a step."""
        return {k: v for k, v in asdict(self.s).items() if k not in ("checkpoint_every", "device")}

    def save_checkpoint(self) -> str | None:
        if self.checkpoints is None:
            return None
        name = checkpoint_name(self.progress.global_step)
        if self.info.is_main:
            state = {"model": self.model.state_dict(), "optimizers": [o.state_dict() for o in self.opts],
                     "order_gen": self.epoch_order_state, "neg_gen": self.neg_gen.get_state(),
                     "progress": asdict(self.progress), "best_model": self.best_state}
            self.checkpoints.save(name, state, {"settings": self._resume_settings(), "world_size": self.info.world_size,
                                                "dataset_fingerprint": self.samples.fingerprint})
        tdist.barrier(self.info)
        return name

    def resume(self) -> str | None:
        """From the latest complete towers checkpoint, if there is one."""
        if self.checkpoints is None:
            return None
        name = self.checkpoints.latest()
        if name is None:
            return None
        state, meta = self.checkpoints.load(name)
        if meta.get("dataset_fingerprint") != self.samples.fingerprint \
                or meta.get("settings") != self._resume_settings() or meta.get("world_size") != self.info.world_size:
            raise CheckpointError(f"towers checkpoint {name} was made on other data, settings or ranks")
        if "optimizers" not in state:
            raise CheckpointError(f"towers checkpoint {name} is from an older dinrec (one optimizer): start over")
        self.model.load_state_dict(state["model"])
        for o, o_state in zip(self.opts, state["optimizers"], strict=True):
            o.load_state_dict(o_state)
        self.epoch_order_state = state["order_gen"]
        self.neg_gen.set_state(state["neg_gen"])
        self.progress = _Progress(**state["progress"])
        self.best_state = state["best_model"]
        return name

    # ------------------------------------------------------------------ the loop
    def _step(self, rows: np.ndarray, neg: torch.Tensor | None) -> float:
        local = rows[self.info.rank::self.info.world_size]  # this rank's share of the global batch
        hist, cats = (t.to(self.device) for t in split_histories(self.samples, self.samples.train, local))
        target = torch.from_numpy(self.samples.train.target_item[local]).to(self.device)  # (B,)
        loss = self.step_fn(hist, cats, target, neg)
        for o in self.opts:
            o.zero_grad(set_to_none=True)
        loss.backward()
        for o in self.opts:
            o.step()
        return float(loss.detach()) * len(rows)

    def _run_epoch(self) -> None:
        s, p = self.s, self.progress
        self.order_gen.set_state(self.epoch_order_state)
        order = self.train_rows[torch.randperm(len(self.train_rows), generator=self.order_gen).numpy()]
        self.model.train()
        t0 = time.perf_counter()
        n_batches = -(-len(order) // s.batch_size)
        for step in range(p.step_in_epoch, n_batches):
            rows = order[step * s.batch_size:(step + 1) * s.batch_size]
            neg = None if self.full else torch.randint(1, self.cfg.n_items, (s.sampled_negatives,),
                                                       generator=self.neg_gen).to(self.device)  # (M,)
            p.loss_sum += self._step(rows, neg)
            p.step_in_epoch, p.global_step = step + 1, p.global_step + 1
            stop, asked = tdist.any_rank((self.stop.is_set(), self.checkpoint_now.is_set()), self.info)
            if stop or asked or (s.checkpoint_every and p.global_step % s.checkpoint_every == 0):
                self.checkpoint_now.clear()
                p.seconds += time.perf_counter() - t0
                name = self.save_checkpoint()
                t0 = time.perf_counter()
                if stop:
                    raise TrainingInterrupted(name)
        p.seconds += time.perf_counter() - t0
        self.epoch_order_state = self.order_gen.get_state()

    def run(self) -> TowersResult:
        s, p = self.s, self.progress
        while p.epoch < s.epochs and not p.done:
            self._run_epoch()
            hr = self._hit_rate(self.samples.val)
            n = max(len(self.train_rows), 1)
            p.history.append({"epoch": p.epoch, "loss": round(p.loss_sum / n, 4), f"val_hr@{s.eval_n}": round(hr, 4)})
            log.info("towers epoch %d: loss %.4f, val HR@%d %.4f", p.epoch, p.loss_sum / n, s.eval_n, hr)
            if hr > p.best:
                p.best, p.best_epoch = hr, p.epoch
                self.best_state = self._snapshot()
            elif p.epoch - p.best_epoch >= s.patience:
                p.done = True
            p.epoch, p.step_in_epoch, p.loss_sum = p.epoch + 1, 0, 0.0
            self.save_checkpoint()
        final = self._final_model()
        test_hr = self._hit_rate_of(final, self.samples.test)
        metrics = {"val_hr": round(p.best, 4), "test_hr": round(test_hr, 4), "eval_n": s.eval_n,
                   "best_epoch": p.best_epoch, "epochs": p.history, "softmax": "full" if self.full else "sampled",
                   "seconds": round(p.seconds, 1), "device": str(self.device), "world_size": self.info.world_size,
                   "global_step": p.global_step, "warm_start": self.init_info, "embeddings": s.embeddings}
        return TowersResult(final.cpu() if final is not None else None, metrics)
