"""Training settings (env prefix ``DINREC_TRAIN_``; CLI flags override), validated at start-up."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class TrainSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DINREC_TRAIN_", extra="forbid", validate_default=True)

    epochs: int = Field(2, ge=1, le=1000, description="passes over the training samples")
    batch_size: int = Field(1024, ge=1, le=1 << 20, description=(
        "training samples per step (per process under torchrun)"))
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
    attention_hidden: tuple[int, ...] = Field((80, 40), description="the activation unit's hidden layers (JSON list)")
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
    fused_kernels: bool = Field(True, description="CPU training: the activation unit's Dice layers as one fused C++ "
                                "kernel (built on first use; PyTorch ops where it cannot be built)")
    mba_l2: float = Field(0.0, ge=0, description="mini-batch-aware L2 on the embeddings (DIN paper)")
    warmup_steps: int = Field(0, ge=0, description="linear learning-rate warm-up")
    patience: int = Field(0, ge=0, description="early stopping on validation GAUC after this many flat epochs; 0=off")
    checkpoint_every: int = Field(0, ge=0, description="also checkpoint every N steps (0: at epoch ends only)")
    keep_checkpoints: int = Field(3, ge=1, description="checkpoints kept (oldest deleted first)")
    tensorboard_dir: str | None = Field(None, description="write TensorBoard scalars here (needs tensorboard)")
    threads: int = Field(0, ge=0, description="torch CPU threads; 0 = all cores")
    eval_batch_size: int = Field(8192, ge=1, description="validation/test samples per forward")
    progress: bool = Field(True, description="print a progress line per epoch")
    recall_epochs: int = Field(20, ge=0, le=1000, description=(
        "epochs of the recall towers trained beside DIN (early-stopped on validation HR@200); 0 = none: "
        "recall from DIN's item embeddings"))
    ranking_blend: bool = Field(True, description=(
        "fit the ranking blend (DIN + towers + co-visitation + popularity, weights from validation) and the "
        "co-visitation lane into the bundle; false: the served score is DIN's alone"))
    recall_dim: int = Field(32, ge=2, le=4096, description="the recall towers' vector size (the FAISS index's)")
    recall_lr: float = Field(3e-3, gt=0, le=1.0, description="the recall towers' Adam learning rate")
