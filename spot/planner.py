"""Choose the instance for a DIN training job from the model's memory, bandwidth and FLOPs.

For each catalog instance the planner estimates, per GPU:

* **memory** — embedding tables (parameters, gradients, Adam's two moments, the temporary the
  multi-tensor Adam step allocates), activations of one batch, the samples our trainer keeps on the
  device, CUDA context; and on the host: runtime, samples, a staged checkpoint and a resumed one.
  An instance whose GPU or host memory is too small, or whose network cannot get a checkpoint to S3
  inside the 2-minute spot notice, does not fit.
* **time per step** — ``overhead + max(FLOPs / (peak × e_c), bytes / (bandwidth × e_b)) + all-reduce``.
  Bytes include, with dense embedding gradients, a sweep over *every* table element each step
  (gradient, Adam moments, weights) — which is why big tables make bandwidth, not FLOPs, the limit,
  and why fp16 loss scaling (T4, V100: no bf16) costs an extra pass over the gradients. The overhead
  (kernel launches, Python) is the same on every GPU, so small models run equally fast everywhere
  and the cheapest instance wins; big tables reward bandwidth per dollar.
* **cost** — spot hours (plus the expected re-work after interruptions) × spot price, and the same
  hours on-demand.

Each instance is planned twice, its tables **replicated** (every GPU holds them whole, DDP, dense Adam:
the sweep above) and **sharded** (TorchRec row-wise shards, lookups and their gradients exchanged by
all-to-all, a fused row-wise optimizer touching only the looked-up rows: per GPU a 1/G shard and one
state value per row; samples kept in host memory); an option that fits only sharded says so.

Options are ranked by spot cost among those that fit (and meet ``max_hours`` if given); an option
another one beats on both time and cost is marked dominated. Nothing here names an instance: rules
of thumb such as "a table over ~500 MB or 100M rows rules out g4dn.xlarge" come out of the numbers.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from dinrec.spot.catalog import InstanceType

GB = 1e9
CUDA_CONTEXT_BYTES = 1.0 * GB  # context, cuBLAS workspace, allocator slack
HOST_RUNTIME_BYTES = 4.0 * GB  # Python, torch, CUDA libraries
DEVICE_BYTES_PER_SAMPLE = 48  # our trainer keeps every split's index tensors on the device
SPOT_NOTICE_S = 120.0


class Workload(BaseModel):
    """What is trained: the model's shape and how much data (a JSON file for ``dinrec plan``)."""

    model_config = ConfigDict(extra="forbid")

    name: str = "job"
    n_items: int = Field(gt=0, description="item embedding rows")
    n_categories: int = Field(1000, gt=0)
    item_dim: int = Field(16, gt=0)
    cat_dim: int = Field(16, gt=0)
    seq_len: int = Field(50, gt=0)
    attention_hidden: tuple[int, ...] = (80, 40)
    mlp_hidden: tuple[int, ...] = (200, 80)
    batch_size: int = Field(1024, gt=0, description="global batch (over all GPUs)")
    train_samples: int = Field(gt=0, description="training samples per epoch")
    epochs: int = Field(2, gt=0)
    sparse_embeddings: bool = False
    # The recall towers, trained after DIN on the same GPUs with their tables placed as DIN's
    # (training.towers_train: replicated, DDP, dense Adam; training.sharded_towers: sharded, row-wise
    # Adagrad, sampled softmax); 0 epochs: recall from DIN's item embeddings.
    recall_epochs: int = Field(20, ge=0, description="the towers' epochs (an upper bound: they stop early)")
    recall_dim: int = Field(32, gt=0)
    recall_batch_size: int = Field(512, gt=0)
    recall_negatives: int = Field(8192, gt=0, description="sampled negatives per step (full softmax below "
                                  "recall_full_softmax_items)")
    recall_full_softmax_items: int = Field(200_000, ge=0)
    negatives: int = Field(1, ge=1, description="DIN's sampled negatives per positive (the towers train on positives)")

    @property
    def table_elements(self) -> int:
        return self.n_items * self.item_dim + self.n_categories * self.cat_dim

    @property
    def table_bytes(self) -> int:
        return 4 * self.table_elements

    @property
    def towers_elements(self) -> int:
        """The towers' four tables: items and categories, as candidates and as behaviours."""
        return 2 * (self.n_items + self.n_categories) * self.recall_dim

    @property
    def table_rows(self) -> int:
        return self.n_items + self.n_categories

    @property
    def towers_rows(self) -> int:
        return 2 * (self.n_items + self.n_categories)

    @property
    def towers_dense_parameters(self) -> int:
        """The recency weights and the MLP ([pooled, newest] → 2d → d)."""
        d = self.recall_dim
        return self.seq_len + (2 * d + 1) * 2 * d + (2 * d + 1) * d

    @property
    def dense_parameters(self) -> int:
        """The activation unit's and the MLP's weights: what DDP all-reduces beside sharded tables."""
        d = self.item_dim + self.cat_dim
        att, mlp = (4 * d, *self.attention_hidden, 1), (2 * d, *self.mlp_hidden, 1)
        return sum((a + 1) * b for layers in (att, mlp) for a, b in zip(layers[:-1], layers[1:], strict=True))


class Efficiency(BaseModel):
    """Fractions of peak reached in practice, and the fixed cost per step; calibrate from a bench run."""

    model_config = ConfigDict(extra="forbid")

    compute: float = Field(0.35, gt=0, le=1)  # small matmuls rarely exceed a third of peak
    bandwidth: float = Field(0.6, gt=0, le=1)  # gathers and scatters, not streaming copies
    interconnect: float = Field(0.7, gt=0, le=1)
    network: float = Field(0.5, gt=0, le=1)  # of the instance's network bandwidth, to S3
    step_overhead_s: float = Field(0.005, ge=0)  # launches + Python + one host sync (jagged nonzero)
    # Each collective's fixed cost (NCCL launch and handshake, the ranks waiting for each other), on top
    # of its bytes: a sharded step has five (ids and lengths distributed, rows forward, gradients back,
    # the dense all-reduce), a replicated one the all-reduce. A guess until a GPU check measures it.
    collective_latency_s: float = Field(0.0005, ge=0)


class SpotModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    interruptions_per_hour: float = Field(0.05, ge=0)
    restart_s: float = Field(420, ge=0, description="boot, install, load the checkpoint")
    checkpoint_every_s: float = Field(600, gt=0, description="work lost per interruption is half this")


# How the embedding tables are placed: every GPU holds them whole (DDP: gradients all-reduced, dense
# Adam), or TorchRec shards them row-wise over the GPUs (DistributedModelParallel: lookups exchanged
# by all-to-all, a fused row-wise optimizer updating only the rows a batch touched; on one GPU, the
# whole table with that optimizer).
Embeddings = Literal["replicated", "sharded"]
ROWWISE_STATE_BYTES = 4  # the fused row-wise Adagrad's state: one fp32 per row, not two per element


@dataclass(frozen=True)
class StepCost:
    flops: float  # per step, per GPU
    bytes: float  # HBM traffic per step, per GPU
    allreduce_bytes: float  # per GPU (replicated: the table gradient; sharded: the dense layers)
    all_to_all_bytes: float = 0.0  # per GPU: embedding rows and their gradients exchanged (sharded)
    collectives: int = 0  # per step


@dataclass
class Option:
    instance: str
    gpu: str
    gpus: int
    embeddings: Embeddings
    fits: bool
    why_not: str | None
    bound: str  # compute | bandwidth | overhead | interconnect
    gpu_mem_gb: float  # needed per GPU
    host_mem_gb: float
    step_ms: float
    est_hours: float  # training time (DIN, then the recall towers), no interruptions
    spot_usd: float  # expected, interruptions included
    on_demand_usd: float
    spot_price_usd: float
    on_demand_price_usd: float
    spot_price_source: str
    step_parts_ms: dict[str, float] | None = None  # DIN's step: overhead, compute, bandwidth, interconnect
    towers_hours: float = 0.0  # of est_hours: the recall towers
    dominated_by: str | None = None
    recommended: bool = False
    rank: int | None = None
    note: str = ""  # the reason for this option's place, in words

    def to_json(self) -> dict:
        return asdict(self)


def step_cost(w: Workload, itype: InstanceType, embeddings: Embeddings = "replicated") -> StepCost:
    """FLOPs and bytes one GPU spends on one step (its share of the global batch)."""
    g = itype.gpus
    b = math.ceil(w.batch_size / g)
    d, L = w.item_dim + w.cat_dim, w.seq_len
    att = (*w.attention_hidden, 1)
    # forward FLOPs per sample: activation unit per behaviour (first layer sees h and q⊙h: 2D inputs;
    # the query's part is once per sample), pooling, then the MLP over [interest, query]
    per_behaviour = 2 * 2 * d * att[0] + sum(2 * a * b_ for a, b_ in zip(att[:-1], att[1:], strict=True)) + 2 * d
    mlp = (2 * d, *w.mlp_hidden, 1)
    per_sample = L * per_behaviour + 2 * d * att[0] + sum(2 * a * b_ for a, b_ in zip(mlp[:-1], mlp[1:], strict=True))
    flops = 3 * per_sample * b  # backward ≈ 2 × forward
    act = 2  # every catalog GPU trains in bf16 or fp16 (mixed precision)
    # HBM traffic per sample: gather (L+1) embeddings and scatter their gradients (read-modify-write),
    # and each activation-unit layer's output written, read back and its gradient (≈ 6 passes)
    gather = 5 * (L + 1) * d * 4
    activations = 6 * L * (4 * d + sum(w.attention_hidden)) * act
    per_step = b * (gather + activations)
    looked_up = b * (L + 1) * d * 4  # bytes of the rows this GPU's samples look up
    if embeddings == "sharded":
        # The fused backward updates only the touched rows (counted in ``gather``): no pass over the
        # table. Each GPU's samples' rows come from every shard and their gradients go back (all-to-all,
        # forward and backward), ids too; DDP all-reduces the dense layers alone.
        share = (g - 1) / g
        return StepCost(flops=flops, bytes=per_step,
                        allreduce_bytes=2 * share * 4 * w.dense_parameters if g > 1 else 0.0,
                        all_to_all_bytes=share * (2 * looked_up + 2 * 8 * b * (L + 1)),
                        collectives=5 if g > 1 else 0)
    if w.sparse_embeddings:
        touched = min(w.table_elements, b * (L + 1) * d)  # at most every behaviour a distinct row
        per_step += 32 * touched  # SparseAdam on touched rows: read p, g, m, v; write p, m, v (+ coalesce)
    else:
        per_step += 32 * w.table_elements  # zero the dense gradient, Adam reads p, g, m, v, writes p, m, v
        if not itype.gpu.bf16:
            per_step += 8 * w.table_elements  # fp16 loss scaling: unscale + inf check pass over the gradient
    dense_grad = w.table_bytes if not w.sparse_embeddings else 0
    allreduce = 2 * (g - 1) / g * dense_grad if g > 1 else 0.0
    return StepCost(flops=flops, bytes=per_step, allreduce_bytes=allreduce, collectives=1 if g > 1 else 0)


def _towers_scored(w: Workload, embeddings: Embeddings) -> int:
    """Items each towers step scores: every item while the catalog is small (replicated only), else the
    sampled negatives and the target."""
    full = embeddings == "replicated" and w.n_items <= w.recall_full_softmax_items
    return w.n_items if full else w.recall_negatives + 1


def towers_step_cost(w: Workload, itype: InstanceType, embeddings: Embeddings = "replicated") -> StepCost:
    """One step of the recall towers, per GPU: the user tower over each history, the softmax against
    every item (or the sampled negatives); replicated, dense Adam over the four tables and their gradient
    all-reduced; sharded, the touched rows updated in the backward and their vectors moved by all-to-all."""
    g = itype.gpus
    b = math.ceil(w.recall_batch_size / g)
    d, L = w.recall_dim, w.seq_len
    k = _towers_scored(w, embeddings)
    per_sample = 2 * L * d + 2 * (4 * d * d + 2 * d * d)  # pooling, then the MLP over [pooled, newest]
    flops = 3 * (b * per_sample + 2 * b * k * d + 4 * k * d)  # + the softmax's logits and the item vectors
    bytes_ = b * (5 * (L + 1) * d * 4 + 3 * k * 4) + 5 * k * d * 4
    if embeddings == "sharded":
        share = (g - 1) / g
        looked_up = 2 * (b * L + b + k) * d * 4  # behaviours, targets and negatives: item row + category row
        return StepCost(flops=flops, bytes=bytes_,
                        allreduce_bytes=2 * share * 4 * w.towers_dense_parameters if g > 1 else 0.0,
                        all_to_all_bytes=share * (2 * looked_up + 2 * 8 * 2 * (b * L + b + k)),
                        collectives=5 if g > 1 else 0)
    bytes_ += 32 * w.towers_elements
    allreduce = 2 * (g - 1) / g * 4 * w.towers_elements if g > 1 else 0.0
    return StepCost(flops=flops, bytes=bytes_, allreduce_bytes=allreduce, collectives=1 if g > 1 else 0)


def towers_memory_bytes(w: Workload, itype: InstanceType, embeddings: Embeddings = "replicated") -> float:
    """Per GPU while the towers train: replicated, their tables with gradient, Adam's moments and the
    step's temporary (20 bytes per element); sharded, a 1/G shard with its row-wise state and the step's
    looked-up rows; and the logits of a batch."""
    if w.recall_epochs == 0:
        return 0.0
    b = math.ceil(w.recall_batch_size / itype.gpus)
    k = _towers_scored(w, embeddings)
    logits = 3 * 4 * b * k
    if embeddings == "sharded":
        shard = (4 * w.towers_elements + ROWWISE_STATE_BYTES * w.towers_rows) / itype.gpus
        lookups = 4 * 2 * (b * w.seq_len + b + k) * w.recall_dim * 4
        return (shard + lookups + logits) * 1.1
    return (20 * w.towers_elements + logits) * 1.1


def peak_times(sc: StepCost, itype: InstanceType) -> tuple[float, float]:
    """Seconds one step's FLOPs and HBM bytes take at 100% of the GPU's peak: (compute, bandwidth)."""
    return sc.flops / (itype.gpu.tflops_mixed * 1e12), sc.bytes / (itype.gpu.bandwidth_gbs * GB)


def gpu_memory_bytes(w: Workload, itype: InstanceType, embeddings: Embeddings = "replicated") -> float:
    g = itype.gpus
    b = math.ceil(w.batch_size / g)
    e = w.table_elements
    d = w.item_dim + w.cat_dim
    activations = b * w.seq_len * (4 * d + 3 * sum(w.attention_hidden)) * 4  # saved for backward (fp32 worst case)
    if embeddings == "sharded":
        # This GPU's rows of every table and their row-wise state; the rows its samples looked up, the
        # ones it served to the others, and both's gradients. The samples stay in host memory (each rank
        # copies its batch over), so nothing scales with the dataset here.
        shard = (4 * e + ROWWISE_STATE_BYTES * w.table_rows) / g
        lookups = 4 * b * (w.seq_len + 1) * d * 4
        return (shard + lookups + activations) * 1.1 + CUDA_CONTEXT_BYTES
    # weights + Adam's two moments (SparseAdam keeps them dense too); dense: + gradient + the step's temporary
    tables = 12 * e + (0 if w.sparse_embeddings else 8 * e)
    if w.sparse_embeddings:
        tables += 3 * 4 * b * (w.seq_len + 1) * d  # sparse grad, coalesced copy, temp
    data = DEVICE_BYTES_PER_SAMPLE * w.train_samples * 1.2  # + validation/test splits
    return (tables + activations + data) * 1.1 + CUDA_CONTEXT_BYTES


def host_memory_bytes(w: Workload, embeddings: Embeddings = "replicated") -> float:
    # samples (built on the host, then copied; sharded: they stay there), a checkpoint staged for
    # writing and one being loaded
    samples = DEVICE_BYTES_PER_SAMPLE * w.train_samples * 1.2
    # Sharded, rank 0 gathers the towers' tables whole for each epoch's HR@n and the bundle.
    gathered = 4 * w.towers_elements if embeddings == "sharded" and w.recall_epochs else 0
    return HOST_RUNTIME_BYTES + 2 * samples + 2 * checkpoint_bytes(w, embeddings) + gathered


def checkpoint_bytes(w: Workload, embeddings: Embeddings = "replicated") -> float:
    """The larger checkpoint of the job, DIN's or the towers' (one is written at a time): weights and
    optimizer state (the dense layers are negligible), two Adam moments per element replicated, one
    row-wise value per row sharded (each GPU writes its shard)."""
    towers = w.towers_elements if w.recall_epochs else 0
    towers_rows = w.towers_rows if w.recall_epochs else 0
    if embeddings == "sharded":
        return max(4 * w.table_elements + ROWWISE_STATE_BYTES * w.table_rows,
                   4 * towers + ROWWISE_STATE_BYTES * towers_rows)
    return 12 * max(w.table_elements, towers)


def plan(w: Workload, catalog: list[InstanceType], *, spot_prices: dict[str, float] | None = None,
         efficiency: Efficiency | None = None, spot: SpotModel | None = None,
         max_hours: float | None = None,
         embeddings: tuple[Embeddings, ...] = ("replicated", "sharded")) -> list[Option]:
    """Every catalog instance with its tables placed each way in ``embeddings``, evaluated and ranked
    (best first); see the module docstring."""
    eff, sm = efficiency or Efficiency(), spot or SpotModel()
    spot_prices = spot_prices or {}
    options: list[Option] = []
    steps = math.ceil(w.train_samples / w.batch_size) * w.epochs
    for it in catalog:
        for mode in embeddings:
            options.append(_option(w, it, mode, steps, eff, sm, spot_prices, max_hours))
    for o in options:  # an option that fits only with its tables sharded says so
        if o.fits and o.embeddings == "sharded":
            twin = next((p for p in options if p.instance == o.instance and p.embeddings == "replicated"), None)
            if twin is not None and not twin.fits:
                o.note = f"fits only sharded (replicated: {twin.why_not})"
    fitting = [o for o in options if o.fits]
    for o in fitting:
        better = [p for p in fitting if p is not o and p.est_hours <= o.est_hours and p.spot_usd <= o.spot_usd
                  and (p.est_hours < o.est_hours or p.spot_usd < o.spot_usd)]
        if better:
            o.dominated_by = _name(min(better, key=lambda p: p.spot_usd))
    # Sharding ranks first only when it saves over 1 %: replicated tables need neither TorchRec nor a
    # checkpoint tied to the ranks' count and plan (on a small table the two cost the same to a cent).
    ranked = sorted(fitting, key=lambda o: (o.spot_usd * (SHARDED_HANDICAP if o.embeddings == "sharded" else 1.0),
                                            o.est_hours)) + \
        sorted((o for o in options if not o.fits), key=lambda o: o.spot_usd)
    for i, o in enumerate(ranked):
        o.rank = i + 1 if o.fits else None
    if fitting:
        ranked[0].recommended = True
    for o in ranked:
        o.note = "; ".join(x for x in (o.note, _explain(o, ranked[0] if fitting else None)) if x)
    return ranked


SHARDED_HANDICAP = 1.01


def _step_seconds(sc: StepCost, it: InstanceType, eff: Efficiency) -> tuple[float, dict[str, float]]:
    """One step's seconds, and its parts: ``overhead + max(compute, bandwidth) + interconnect``."""
    compute_peak_s, memory_peak_s = peak_times(sc, it)
    compute_s, memory_s = compute_peak_s / eff.compute, memory_peak_s / eff.bandwidth
    comm_bytes = sc.allreduce_bytes + sc.all_to_all_bytes
    comm_s = (comm_bytes / (it.interconnect_gbs * GB * eff.interconnect) if comm_bytes else 0.0) \
        + sc.collectives * eff.collective_latency_s
    parts = {"compute": compute_s, "bandwidth": memory_s, "overhead": eff.step_overhead_s, "interconnect": comm_s}
    return eff.step_overhead_s + max(compute_s, memory_s) + comm_s, parts


def _option(w: Workload, it: InstanceType, embeddings: Embeddings, steps: int, eff: Efficiency, sm: SpotModel,
            spot_prices: dict[str, float], max_hours: float | None) -> Option:
    step_s, parts = _step_seconds(step_cost(w, it, embeddings), it, eff)
    bound = max(parts, key=lambda part: parts[part])
    towers_s, _ = _step_seconds(towers_step_cost(w, it, embeddings), it, eff)
    positives = math.ceil(w.train_samples / (1 + w.negatives))
    towers_hours = math.ceil(positives / w.recall_batch_size) * w.recall_epochs * towers_s / 3600
    hours = steps * step_s / 3600 + towers_hours
    lost_h = sm.interruptions_per_hour * hours * (sm.restart_s + sm.checkpoint_every_s / 2) / 3600
    price_spot = spot_prices.get(it.name)
    source = "ec2" if price_spot is not None else "catalog"
    price_spot = price_spot if price_spot is not None else it.spot_usd
    # The towers train after DIN, beside its trained weights (a 1/G shard of them when sharded).
    din_weights = 4 * w.table_elements / (it.gpus if embeddings == "sharded" else 1)
    towers_need = CUDA_CONTEXT_BYTES + din_weights + towers_memory_bytes(w, it, embeddings) if w.recall_epochs else 0.0
    gpu_need = max(gpu_memory_bytes(w, it, embeddings), towers_need)
    host_need = host_memory_bytes(w, embeddings)
    why = []
    if gpu_need > it.gpu.memory_gb * GB * 0.95:
        why.append(f"needs {gpu_need / GB:.1f} GB per GPU, {it.gpu.name} has {it.gpu.memory_gb:g}")
    if host_need > it.host_memory_gib * 2**30 * 0.9:
        why.append(f"needs {host_need / 2**30:.1f} GiB host memory, has {it.host_memory_gib:g}")
    ckpt_s = checkpoint_bytes(w, embeddings) / (it.network_gbps / 8 * GB * eff.network)
    if ckpt_s > SPOT_NOTICE_S * 0.75:
        why.append(f"a checkpoint takes {ckpt_s:.0f} s to reach S3, over the 2-minute spot notice")
    if embeddings == "replicated" and w.sparse_embeddings and it.gpus > 1:
        why.append("sparse embedding gradients cannot be all-reduced by NCCL (use dense ones with DDP)")
    if not why and max_hours is not None and hours + lost_h > max_hours:
        why.append(f"takes {hours + lost_h:.1f} h, over the {max_hours:g} h limit")
    return Option(
        instance=it.name, gpu=it.gpu.name, gpus=it.gpus, embeddings=embeddings, fits=not why,
        why_not="; ".join(why) or None, bound=bound, gpu_mem_gb=round(gpu_need / GB, 2),
        host_mem_gb=round(host_need / 2**30, 2), step_ms=round(step_s * 1e3, 3), est_hours=hours,
        towers_hours=towers_hours,
        spot_usd=(hours + lost_h) * price_spot, on_demand_usd=hours * it.on_demand_usd, spot_price_usd=price_spot,
        on_demand_price_usd=it.on_demand_usd, spot_price_source=source,
        step_parts_ms={k: round(v * 1e3, 3) for k, v in parts.items()})


_BOUND_WHY = {
    "overhead": "launch-bound: per-step overhead dominates and is the same on every GPU",
    "compute": "compute-bound: tensor-core FLOPs set the pace",
    "bandwidth": "bandwidth-bound: embedding traffic and the optimizer's pass over the tables set the pace",
    "interconnect": "interconnect-bound: exchanging gradients (replicated: the whole table's, all-reduced; "
                    "sharded: the looked-up rows', all-to-all) dominates",
}


def _name(o: Option) -> str:
    return f"{o.instance} ({o.embeddings})"


def _explain(o: Option, best: Option | None) -> str:
    if not o.fits:
        return f"does not fit: {o.why_not}"
    parts = ", ".join(f"{k} {v:g} ms" for k, v in (o.step_parts_ms or {}).items() if v)
    text = f"{_BOUND_WHY[o.bound]} (step {o.step_ms:g} ms: {parts})"
    if o.recommended:
        return f"recommended: cheapest expected spot cost that fits; {text}"
    if o.dominated_by:
        return f"ruled out: {o.dominated_by} is faster and cheaper; {text}"
    if best is not None and o.est_hours < best.est_hours:
        return f"{best.est_hours / o.est_hours:.1f}× faster than {_name(best)} for " \
               f"{o.spot_usd / max(best.spot_usd, 1e-12):.1f}× the cost; {text}"
    return text


def calibrate(bench: dict, catalog: list[InstanceType], base: Efficiency | None = None) -> Efficiency:
    """Fit the efficiency that makes the model reproduce a measured ``dinrec bench train`` GPU run.

    The measured step time is ``batch / samples_per_s``. If the model says that run was limited
    by launch overhead, the overhead is what gets fitted; otherwise the efficiency of the resource
    that bound it (bandwidth or compute). One GPU run, one number: the rest keep their defaults.
    """
    base = base or Efficiency()
    mine = bench.get("dinrec", {})
    name = str(mine.get("gpu_name") or "")
    if not name:
        raise ValueError("calibration needs a `dinrec bench train` result from a GPU run (no gpu_name in it)")
    single = [it for it in catalog if it.gpus == 1 and _gpu_matches(it.gpu.name, name)]
    if not single:
        raise ValueError(f"no single-GPU catalog instance has a {name!r}; cannot calibrate from this run")
    try:
        cfg = bench["config"]
        w = Workload(n_items=bench["n_items"], n_categories=bench["n_categories"], item_dim=cfg["item_dim"],
                     cat_dim=cfg["cat_dim"], seq_len=cfg["seq_len"], attention_hidden=tuple(cfg["attention_hidden"]),
                     mlp_hidden=tuple(cfg["mlp_hidden"]), batch_size=cfg["batch_size"],
                     train_samples=bench["train_samples"], epochs=cfg["epochs"])
        measured = cfg["batch_size"] / float(mine["samples_per_s"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a `dinrec bench train --json` result: {exc}") from exc
    it = single[0]
    compute, memory = peak_times(step_cost(w, it), it)
    modelled = max(compute / base.compute, memory / base.bandwidth)
    if modelled < base.step_overhead_s:  # overhead-bound: fit the overhead
        return base.model_copy(update={"step_overhead_s": max(measured - modelled, 0.0)})
    busy = max(measured - base.step_overhead_s, 1e-6)
    if memory / base.bandwidth >= compute / base.compute:
        return base.model_copy(update={"bandwidth": min(1.0, max(0.01, memory / busy))})
    return base.model_copy(update={"compute": min(1.0, max(0.01, compute / busy))})


def _gpu_matches(catalog_name: str, device_name: str) -> bool:
    """'A100-40GB' matches 'NVIDIA A100-SXM4-40GB'; 'T4' matches 'Tesla T4' (not 'L4' or 'T40')."""
    family = catalog_name.split("-")[0].upper()
    tokens = device_name.upper().replace("-", " ").split()
    return family in tokens
