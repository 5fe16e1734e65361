"""Training settings (env prefix ``DINREC_TRAIN_``; CLI flags override), validated at start-up."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# Row-wise Adagrad steps a row by lr · g / rms(g): its lr is a distance per step, not Adam's 1e-3 scale.
# Measured on ml-100k (2 epochs, defaults otherwise; test GAUC): Adam 0.761; row-wise Adagrad at 1e-3 0.746,
# 0.01 0.757, 0.05 0.758, 0.2 0.806, 1.0 0.817. 0.05 is where it matches Adam; the higher ones are one
# dataset's runs, not yet a default.
ROWWISE_ADAGRAD_LR = 0.05
DIN_CONTEXT = ("position", "time", "covisit", "candidate")  # what listwise DIN may read besides ids


class TrainSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DINREC_TRAIN_", extra="forbid", validate_default=True)

    objective: Literal["listwise", "pointwise"] = Field("listwise", description=(
        "listwise: each training positive against list_negatives negatives like the candidates it will rank "
        "(mined from the recall lanes, and popular ones with the log-Q correction), softmax cross-entropy, "
        "early-stopped on DIN alone's validation HR@10 over the served candidates; pointwise: binary "
        "cross-entropy on the samples' own negatives (the DIN paper's, early-stopped on validation GAUC)"))
    epochs: int | None = Field(None, ge=1, le=1000, description=(
        "passes over the training samples at most (default: 20 listwise, where early stopping usually ends "
        "sooner; 2 pointwise)"))
    batch_size: int = Field(256, ge=1, le=1 << 20, description=(
        "training samples per step — lists (a positive with its negatives) for listwise — over all ranks "
        "under torchrun (each rank takes its share)"))
    list_negatives: int = Field(32, ge=1, le=1024, description="listwise: negatives per training positive (K)")
    hard_negative_share: float = Field(0.5, ge=0, le=1, description=(
        "listwise: the share of the negatives drawn from what the recall lanes return for the history (the "
        "served lanes' candidates, the user's own items excluded); the rest ∝ count^popular_negative_power"))
    popular_negative_power: float = Field(0.75, ge=0, le=2, description=(
        "listwise: the popular negatives are drawn ∝ training count^power (0: uniform), their logits "
        "corrected by −log(K·q)"))
    guard_folds: int = Field(5, ge=2, le=100, description=(
        "listwise: co-visitation lanes fitted each without one fold of users, so a training positive's pair "
        "similarities never count its own co-occurrence"))
    din_context: tuple[str, ...] = Field(("position", "time", "covisit", "candidate"), description=(
        "listwise: what DIN reads besides ids (JSON list of position, time, covisit, candidate): each "
        "behaviour's position from the newest and time gap to it, co-visitation's similarity per (candidate, "
        "behaviour), and per candidate its training count and recent-category share (models.context)"))
    lr: float = Field(1e-3, gt=0, le=1.0, description="DIN's Adam learning rate")
    seq_len: int = Field(50, ge=1, le=10_000, description="behaviours per history (L)")
    negatives: int = Field(1, ge=1, le=100, description="sampled negatives per training positive")
    eval_negatives: int = Field(20, ge=1, le=1000, description="sampled negatives per validation/test positive")
    negative_power: float = Field(0.0, ge=0, le=2, description=(
        "training negatives drawn ∝ item count^power (0: uniform; 1: as popular as they are); "
        "validation/test negatives stay uniform"))
    item_dim: int = Field(16, ge=1, le=4096, description="item embedding size")
    cat_dim: int = Field(16, ge=1, le=4096, description="category embedding size")
    mlp_hidden: tuple[int, ...] = Field((200, 80), description="DIN's MLP hidden layers (JSON list)")
    dropout: float = Field(0.0, ge=0, lt=1, description=(
        "dropout after each of DIN's MLP layers while training (its draws are part of an exact resume); "
        "0.2 measured no better on ml-100k over three seeds (docs/benchmarks.md)"))
    attention_hidden: tuple[int, ...] = Field((16,), description=(
        "the activation unit's hidden layers (JSON list): it runs once per (candidate, behaviour), so listwise "
        "training and serving pay for its width; the DIN paper's is [80, 40]"))
    attention_activation: Literal["prelu", "dice", "relu", "sigmoid"] = Field("prelu", description=(
        "the activation unit's nonlinearity"))
    mlp_activation: Literal["prelu", "dice", "relu", "sigmoid"] = Field("dice", description=(
        "the MLP's nonlinearity (dice: the DIN paper's)"))
    seed: int = Field(0, description=(
        "seed of the samples' negatives, initialisation and shuffling (same seed, same model)"))
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: CUDA when there is a GPU, else CPU")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto", description="auto: bf16 (or fp16 + GradScaler) on GPU, fp32 on CPU")
    sparse_embeddings: bool = Field(False, description="sparse embedding gradients + SparseAdam (large tables)")
    embeddings: Literal["replicated", "sharded"] = Field("replicated", description=(
        "replicated: every process holds DIN's and the recall towers' tables whole (DDP); sharded: TorchRec "
        "splits them over the torchrun ranks (DistributedModelParallel, a fused row-wise optimizer; needs the "
        "sharded extra)"))
    embedding_sharding: Literal["auto", "row_wise", "table_wise", "column_wise"] = Field("auto", description=(
        "with sharded tables: how they are split (auto: TorchRec's planner chooses within each device's memory)"))
    embedding_optimizer: Literal["auto", "adam", "rowwise_adagrad"] = Field("auto", description=(
        "DIN's and the recall towers' tables' optimizer (auto: adam replicated, rowwise_adagrad sharded — one "
        "state value per row)"))
    embedding_lr: float | None = Field(None, gt=0, le=10.0, description=(
        "the tables' learning rate (unset: 0.05 with rowwise_adagrad; with adam, lr for DIN's and recall_lr for "
        "the towers')"))
    fused_kernels: bool = Field(True, description="CPU training: the activation unit's Dice layers as one fused C++ "
                                "kernel (built on first use; PyTorch ops where it cannot be built)")
    mba_l2: float = Field(0.0, ge=0, description="mini-batch-aware L2 on the embeddings (DIN paper)")
    warmup_steps: int = Field(0, ge=0, description="linear learning-rate warm-up")
    max_steps: int = Field(0, ge=0, description=(
        "end training after this many steps (the epoch in progress is evaluated as the last); 0: no limit"))
    patience: int | None = Field(None, ge=0, description=(
        "stop after this many epochs without a better validation figure (listwise: DIN alone's HR@10 over the "
        "served candidates; pointwise: GAUC) and keep the best epoch's weights; 0: off (default: 2 listwise, "
        "0 pointwise)"))
    checkpoint_every: int = Field(0, ge=0, description="also checkpoint every N steps (0: at epoch ends only)")
    keep_checkpoints: int = Field(3, ge=1, description="checkpoints kept (oldest deleted first)")
    tensorboard_dir: str | None = Field(None, description="write TensorBoard scalars here (needs tensorboard)")
    threads: int = Field(0, ge=0, description="torch CPU threads; 0 = all cores")
    eval_batch_size: int = Field(8192, ge=1, description="validation/test samples per forward")
    # Not serialised (exclude): how a run reports is not part of what it trains, so a checkpoint, a bundle's
    # record and the settings a spot job is shipped are the same whether or not a terminal watched.
    progress: bool | None = Field(None, exclude=True, description=(
        "progress on stderr (a line per stage, a bar per epoch); default: when stderr is a terminal"))
    recall_epochs: int = Field(20, ge=0, le=1000, description=(
        "epochs of the recall towers trained beside DIN (early-stopped on validation HR@200); 0 = none: "
        "recall from DIN's item embeddings"))
    ranking_blend: bool = Field(True, description=(
        "fit the ranking blend (DIN + towers + co-visitation + popularity, weights from validation) and the "
        "co-visitation lane into the bundle; false: the served score is DIN's alone"))
    recall_dim: int = Field(32, ge=2, le=4096, description="the recall towers' vector size (the FAISS index's)")
    recall_lr: float = Field(3e-3, gt=0, le=1.0, description="the recall towers' Adam learning rate")
    recall_full_softmax_items: int = Field(200_000, ge=0, description=(
        "the towers score every item per step while the catalog has at most this many; past it (and with "
        "sharded tables) each target meets recall_sampled_negatives sampled negatives"))
    recall_sampled_negatives: int = Field(8192, ge=1, le=1_000_000, description=(
        "negatives each recall target meets when the catalog is past recall_full_softmax_items (uniform draws "
        "shared by the batch)"))
    recall_batch_size: int = Field(512, ge=1, le=1_000_000, description="the recall towers' samples per step")
    recall_weight_decay: float = Field(0.0, ge=0, le=1.0, description="the recall towers' Adam weight decay")
    recall_temperature: float = Field(0.07, gt=0, le=10.0, description=(
        "the recall towers' softmax temperature (the scores are cosine similarities)"))
    recall_eval_n: int = Field(200, ge=1, le=100_000, description=(
        "the recall towers' early stopping reads validation HR at this many candidates"))
    recall_patience: int = Field(3, ge=1, le=1000, description=(
        "the recall towers stop after this many epochs without a better validation HR"))

    @model_validator(mode="after")
    def _objective_defaults(self) -> TrainSettings:
        listwise = self.objective == "listwise"
        if self.epochs is None:
            self.epochs = 20 if listwise else 2
        if self.patience is None:
            self.patience = 2 if listwise else 0
        return self

    @model_validator(mode="after")
    def _listwise_options(self) -> TrainSettings:
        if self.objective != "listwise":
            return self
        unknown = sorted(set(self.din_context) - set(DIN_CONTEXT))
        if unknown:
            raise ValueError(f"din_context: unknown {unknown}; choose from {list(DIN_CONTEXT)}")
        if self.attention_activation == "dice":
            raise ValueError("listwise scores lists of candidates over padded histories: the activation unit needs "
                             "an activation without batch statistics (prelu, relu or sigmoid)")
        if self.recall_epochs == 0:
            raise ValueError("listwise mines its negatives from the recall towers and measures DIN over the served "
                             "candidates: it needs them (recall_epochs > 0), or use objective=pointwise")
        if self.embeddings == "sharded":
            raise ValueError("sharded tables train the pointwise objective (objective=pointwise)")
        return self

    @model_validator(mode="after")
    def _sharded_options(self) -> TrainSettings:
        if self.embeddings == "sharded":
            assert self.patience is not None  # filled by _objective_defaults (after-validators run in order)
            if self.embedding_optimizer == "adam":
                raise ValueError("sharded tables train with the fused rowwise_adagrad (embedding_optimizer)")
            unsupported = {"sparse_embeddings": self.sparse_embeddings, "mba_l2": self.mba_l2 > 0,
                           "warmup_steps": self.warmup_steps > 0, "patience": self.patience > 0,
                           "precision fp16": self.precision == "fp16"}
            if any(unsupported.values()):
                raise ValueError("sharded tables do not support " + ", ".join(k for k, v in unsupported.items() if v))
        elif self.embedding_sharding != "auto":
            raise ValueError("embedding_sharding applies to sharded tables (embeddings=sharded)")
        return self

    @property
    def table_lr(self) -> float | None:
        """The tables' learning rate where it is not the model's own (None: DIN's lr, the towers' recall_lr)."""
        if self.embedding_lr is not None:
            return self.embedding_lr
        return ROWWISE_ADAGRAD_LR if self.table_optimizer == "rowwise_adagrad" else None

    @property
    def table_optimizer(self) -> Literal["adam", "rowwise_adagrad"]:
        if self.embedding_optimizer != "auto":
            return self.embedding_optimizer
        return "rowwise_adagrad" if self.embeddings == "sharded" else "adam"
