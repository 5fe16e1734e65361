"""DIN scoring for serving: one user's history against N candidates, fast.

The model (models/din.py) stays the reference; this computes the same function, arranged for
the request shape (one history, many candidates) rather than the training shape (one candidate
per history). With W = [Wq | Wh | Wd | Wp] the activation unit's first layer (see
``DIN.interest_jagged``), for candidate n and behaviour l::

    z[n, l] = (Wq+Wd)·q_n + b   +   (Wh−Wd)·h_l   +   Wp·(q_n ⊙ h_l)
              a[n]: per item,       b[l]: once per     c[n, l]: the only N×L term, one GEMM
              computed at load      request            Q (N, D) @ G (D, L·H1), G[:, l] = h_l ⊙ Wp

The history is embedded once per request (the training path embeds it once per candidate), the
rest of the unit and the MLP are the model's own modules in eval mode, so the function is the
same; tests compare against the model within 1e-5 (fp32). ``precision="bf16"`` runs the matrix
products in bfloat16 (fast on CPUs with AVX-512 BF16 or AMX). With bf16, a unit of the default shape
(Linear→PReLU→Linear→PReLU→Linear, D a multiple of 32) can run as one fused kernel
(``csrc/din_score.cpp``); other units keep the ops below. Which of these is fastest depends on the
CPU: :func:`choose_scorer` times them on probe requests and keeps the fastest within a tolerance of fp32.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

import torch
import torch.nn.functional as F

from dinrec.models.din import DIN, Dice, ListContext, PReLU
from dinrec.models.rows import AppendOnlyRows

ScorePrecision = Literal["fp32", "bf16"]
_Name = TypeVar("_Name", bound=str)


@dataclass(frozen=True)
class Scores:
    logits: torch.Tensor          # (N,) float32
    attention: torch.Tensor | None  # (N, L) float32: the unit's weight of each behaviour, if asked for


def _linear_fn(layer: torch.nn.Linear, dtype: torch.dtype):
    """fp32 rows → the layer in ``dtype`` → fp32 rows."""
    weight_t, bias = layer.weight.detach().to(dtype).t().contiguous(), layer.bias.detach().to(dtype)
    return lambda x: torch.addmm(bias, x.to(dtype), weight_t).float()


def bf16_supported() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX); otherwise bf16 is slower."""
    from dinrec.models.kernels import cpu_has

    return cpu_has("avx512_bf16") or cpu_has("amx_bf16")


def _activation_fn(module: torch.nn.Module):
    """An eval-mode activation as a function of an fp32 (rows, H) tensor it may overwrite."""
    if isinstance(module, Dice):
        # BN with running statistics folded: p = sigmoid(x·s + t), y = x·(α + p·(1−α)).
        bn = module.bn
        assert bn.running_var is not None and bn.running_mean is not None  # Dice's BN tracks them (the default)
        scale = torch.rsqrt(bn.running_var + bn.eps)
        shift, alpha = -bn.running_mean * scale, module.alpha.detach()
        keep = 1 - alpha

        def dice(x: torch.Tensor) -> torch.Tensor:
            p = torch.addcmul(shift, x, scale).sigmoid_()  # (R, H)
            return x.mul_(p.mul_(keep).add_(alpha))
        return dice
    if isinstance(module, PReLU):
        alpha = module.alpha.detach()
        return lambda x: F.prelu(x, alpha)
    if isinstance(module, torch.nn.ReLU):
        return lambda x: x.relu_()
    if isinstance(module, torch.nn.Sigmoid):
        return lambda x: x.sigmoid_()
    raise TypeError(f"no scoring rule for {type(module).__name__}")


# The ways a Scorer computes the same scores: the fused AVX-512 BF16 unit (csrc/din_score.cpp), the
# PyTorch ops with bf16 products (oneDNN: AMX where the CPU has it), the PyTorch ops in fp32 (any CPU:
# ATen's AVX2 or AVX-512 kernels).
ScoreImpl = Literal["fused_bf16", "bf16", "fp32", "lists_fused", "lists_fp32"]


class Scorer:
    def __init__(self, model: DIN, item_category: torch.Tensor, precision: ScorePrecision = "fp32",
                 chunk: int = 100, fused: bool = True) -> None:
        """``fused``: with bf16, use the fused unit where it applies (False: PyTorch ops only)."""
        model = model.eval()
        self.model = model
        self.precision = precision
        self.chunk = chunk
        self.dim = model.dim
        with torch.inference_mode():
            items = torch.arange(model.cfg.n_items)  # (I,)
            self.item_vectors = model.embed(items, item_category.long()).float().contiguous()  # (I, D)
            w_q, w_h, w_d, w_p = model.att_in.weight.float().split(self.dim, dim=1)  # each (H1, D)
            # a[n]: the candidate's part of the first layer, bias included, for every item once.
            self._w_cand = (w_q + w_d).t().contiguous()  # (D, H1)
            self.item_first = torch.addmm(model.att_in.bias.float(), self.item_vectors, self._w_cand)  # (I, H1)
            self.w_hist = (w_h - w_d).t().contiguous()  # (D, H1)
            self.w_prod = w_p.t().contiguous()  # (D, H1)
        self.h1 = self.item_first.shape[1]
        self.item_category = item_category.long()
        # A model with context (models.din) is scored by its own listwise path, in fp32: the factorised
        # products below are written for the plain unit and MLP.
        self.lists = model.cfg.scores_lists
        if self.lists and precision != "fp32":
            raise ValueError("a DIN with context is scored in fp32")
        if self.lists:
            # Its own copy of the module (the weights shared), so the fused and the ops scorer of one model
            # can be timed side by side (choose_scorer) without one switching the other's path.
            model = self.model = copy.copy(model)
            model.list_unit = None
            if fused:
                from dinrec.models.kernels import list_unit, load_lists

                if load_lists():
                    model.list_unit = list_unit  # the same function, fused (models.kernels)
        self.n_items = model.cfg.n_items  # candidates at or past this are cold items (with_cold_items)
        # The rest of the activation unit as (function) steps: activations, and Linear layers with
        # their weights transposed once, in the precision the products run in.
        cd = self.compute_dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        # Products run in ``cd`` (bf16: twice the multiply rate on CPUs that have it); elementwise
        # work stays in fp32, which PyTorch's CPU kernels do faster than bf16.
        steps = [_activation_fn(model.att_in_act)]
        for m in model.att_hidden:
            steps.append(_linear_fn(m, cd) if isinstance(m, torch.nn.Linear) else _activation_fn(m))
        self._unit_steps = steps
        self._unit_out_w = model.att_out.weight.detach().float().t().contiguous()  # (H_last, 1)
        self._unit_out_b = model.att_out.bias.detach().float()
        self._mlp_steps = [_linear_fn(m, cd) if isinstance(m, torch.nn.Linear) else _activation_fn(m)
                           for m in model.mlp if not isinstance(m, torch.nn.Dropout)]
        self._out = _linear_fn(model.out, cd)
        # Growable (models.rows), so cold items join without copying a row of these.
        self._set_item_rows(tuple(AppendOnlyRows(t) for t in (self.item_vectors, self.item_first,
                                                               self.item_vectors.to(cd), self.item_category)))
        self._fused = self._pack_fused(w_p) if precision == "bf16" and fused else None

    def with_cold_items(self, categories: torch.Tensor) -> Scorer:
        """This scorer, also scoring one more item the model never saw per entry of ``categories`` (C,)
        (category indices): candidates ``len(self.item_category) + j``, after the cold items it scores
        already. Each is the unknown item (index 0) in its category, which is what DIN knows of it. The
        rows are appended to this scorer's tables (models.rows): this scorer, which requests may be
        using, keeps its own rows; nothing is recomputed or copied for the items it has."""
        new = copy.copy(self)
        with torch.inference_mode():
            cold = self.model.embed(torch.zeros_like(categories), categories.long()).float()  # (C, D)
            # (the first-layer rows below serve the plain unit's fast path; the listwise one reads the vectors)
            first = torch.addmm(self.model.att_in.bias.float(), cold, self._w_cand)  # (C, H1)
            vectors, item_first, vectors_cd, item_category = self._item_rows
            new._set_item_rows((vectors.appended(cold), item_first.appended(first),
                                vectors_cd.appended(cold.to(self.compute_dtype)),
                                item_category.appended(categories.long())))
        return new

    def _set_item_rows(self, tables: tuple[AppendOnlyRows, ...]) -> None:
        """Serve from ``tables``: the item vectors, their first-layer rows, the vectors in the compute
        dtype, and the item categories."""
        self._item_rows = tables
        self.item_vectors, self.item_first, self._item_vectors_cd, self.item_category = (t.rows for t in tables)

    @property
    def fused(self) -> bool:
        """Whether the activation unit runs as one fused kernel (csrc/din_score.cpp)."""
        return self._fused is not None

    @property
    def impl(self) -> ScoreImpl:
        if self.lists:  # a DIN with context: its listwise path, the fused unit where it built (models.kernels)
            return "lists_fused" if self.model.fuses_lists else "lists_fp32"
        return "fused_bf16" if self._fused is not None else self.precision

    def _pack_fused(self, w_p: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
        """The unit's weights laid out for the fused bf16 kernel, or None where it does not apply: a
        unit other than Linear→PReLU→Linear→PReLU→Linear, sizes it was not built for, or no AVX-512 BF16."""
        m = self.model
        layers = list(m.att_hidden)
        if not (isinstance(m.att_in_act, PReLU) and len(layers) == 2 and isinstance(layers[0], torch.nn.Linear)
                and isinstance(layers[1], PReLU)):
            return None
        h1, h2 = self.h1, layers[0].out_features
        h2p = -(-h2 // 16) * 16
        if self.dim % 32 or self.dim > 256 or (h1 // 16, h2p // 16) not in {(5, 3), (4, 2), (2, 1), (8, 4)} or h1 % 16:
            return None
        from dinrec.models.kernels import load_score

        if not load_score():
            return None

        def pad(v: torch.Tensor) -> torch.Tensor:
            return F.pad(v.detach().float(), (0, h2p - h2)).contiguous()

        with torch.inference_mode():
            # Pairs along the input dimension, as vdpbf16ps multiplies them: (in/2, out, 2).
            wp = w_p.reshape(h1, self.dim // 2, 2).permute(1, 0, 2).to(torch.bfloat16).contiguous()
            w2 = F.pad(layers[0].weight.detach().float(), (0, 0, 0, h2p - h2))  # (H2p, H1)
            w2 = w2.reshape(h2p, h1 // 2, 2).permute(1, 0, 2).to(torch.bfloat16).contiguous()
            return (wp, w2, m.att_in_act.alpha.detach().float().contiguous(), pad(layers[0].bias),
                    pad(layers[1].alpha), pad(m.att_out.weight.reshape(-1)), m.att_out.bias.detach().float().reshape(1))

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        """The MLP and the output layer on (R, W) rows → (R, 1) logits: eval-mode Dice folded into two
        fused passes (:func:`_activation_fn`), the products in the compute dtype."""
        for step in self._mlp_steps:
            x = step(x)
        return self._out(x)

    @torch.inference_mode()
    def score(self, hist_items: torch.Tensor, hist_cats: torch.Tensor, candidates: torch.Tensor,
              *, with_attention: bool = False, context: ListContext | None = None) -> Scores:
        """hist_items/hist_cats (L,) int64, the user's behaviours (0 = unknown: ignored);
        candidates (N,) int64 item indices → logits (N,) (and attention (N, L') over the L' known
        behaviours, in order, if asked). ``context``: what a DIN with context reads (models.context),
        over the L' known behaviours as one list: gaps (1, L'), pairs (1, N, L', P), candidates (1, N, F)."""
        known = hist_items != 0
        h = self.model.embed(hist_items[known], hist_cats[known]).float()  # (L, D)
        q = self.item_vectors.index_select(0, candidates)  # (N, D), fp32 for the MLP
        n, length = q.shape[0], h.shape[0]
        if self.lists:
            logits, weights = self.model.lists_from(h.unsqueeze(0), torch.ones(1, length, dtype=torch.bool),
                                                    q.unsqueeze(0), context, head=self._head)  # (1, N), (1, N, L)
            return Scores(logits[0].float(), weights[0].float() if with_attention else None)
        if length == 0:
            weights = torch.zeros(n, 0)
            interest = torch.zeros_like(q)
        elif self._fused is not None:
            a = self.item_first.index_select(0, candidates)  # (N, H1): a[n]
            b = torch.mm(h, self.w_hist)  # (L, H1): b[l]
            weights = torch.ops.dinrec_score.unit_weights(q, h.contiguous(), a, b, *self._fused)  # (N, L)
            interest = torch.mm(weights, h)
        else:
            cd = self.compute_dtype
            g = (h.unsqueeze(2) * self.w_prod.unsqueeze(0)).transpose(0, 1).reshape(self.dim, -1).to(cd)  # (D, L·H1)
            b = torch.mm(h, self.w_hist)  # (L, H1): b[l]
            qc = self._item_vectors_cd.index_select(0, candidates)  # (N, D)
            a = self.item_first.index_select(0, candidates)  # (N, H1): a[n]
            weights = torch.empty(n, length)
            # Candidates in chunks, so each chunk's (chunk·L, H1) activations stay in cache through
            # the unit's elementwise passes.
            for c0 in range(0, n, self.chunk):
                c1 = min(n, c0 + self.chunk)
                z = torch.mm(qc[c0:c1], g).float().view(c1 - c0, length, self.h1)  # c[n, l]
                z.add_(a[c0:c1].unsqueeze(1)).add_(b.unsqueeze(0))
                x = z.view(-1, self.h1)  # (chunk·L, H1)
                for step in self._unit_steps:
                    x = step(x)
                weights[c0:c1] = torch.addmm(self._unit_out_b, x, self._unit_out_w).view(c1 - c0, length)
            interest = torch.mm(weights, h)  # (N, D): sum pooling with the unit's weights
        logits = self._head(torch.cat([interest, q], dim=1)).squeeze(-1)  # (N, 2D) → (N,)
        return Scores(logits, weights if with_attention else None)


@dataclass(frozen=True)
class ScorerChoice:
    """Which implementation a scorer uses on this CPU, and why: each candidate's time on the probes
    (median ms per request) and its largest probability difference from fp32; those refused say why."""
    impl: ScoreImpl
    timings_ms: dict[ScoreImpl, float]
    max_prob_diff: dict[str, float]
    refused: dict[str, str]

    def as_dict(self) -> dict:
        return {"impl": self.impl, "timings_ms": self.timings_ms, "max_prob_diff_vs_fp32": self.max_prob_diff,
                "refused": self.refused}


def candidate_scorers(model: DIN, item_category: torch.Tensor, wanted: str) -> dict[ScoreImpl, Scorer]:
    """The implementations ``wanted`` (auto, fp32, bf16) allows on this CPU, by name. bf16 only where
    the CPU multiplies it natively (emulated, it is slower than fp32); the fused unit only where it
    builds and the model's unit has a shape it was written for. A DIN with context (the default one
    ``dinrec train`` ships) has its listwise path in fp32, fused where the kernel builds and applies."""
    out: dict[ScoreImpl, Scorer] = {}
    if model.cfg.scores_lists:
        fused = Scorer(model, item_category, "fp32")
        if fused.model.fuses_lists:
            out["lists_fused"] = fused
        out["lists_fp32"] = Scorer(model, item_category, "fp32", fused=False)
        return out
    if wanted in ("auto", "fp32"):
        out["fp32"] = Scorer(model, item_category, "fp32")
    if wanted == "bf16" or (wanted == "auto" and bf16_supported()):
        fused = Scorer(model, item_category, "bf16")
        if fused.fused:
            out["fused_bf16"] = fused
        out["bf16"] = Scorer(model, item_category, "bf16", fused=False)
    return out


# A probe request: (hist_items (L,), hist_cats (L,), candidates (N,)), and for a DIN with context what it
# reads (models.context.probe_context).
Probe = tuple[torch.Tensor, torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, torch.Tensor, ListContext]


def score_probe(scorer: Scorer, probe: Probe) -> Scores:
    return scorer.score(probe[0], probe[1], probe[2], context=probe[3] if len(probe) > 3 else None)


def _median_ms(scorers: Mapping[_Name, Scorer], probes: Sequence[Probe], rounds: int) -> dict[_Name, float]:
    """Median ms per probe request of each scorer, timed in interleaved rounds (each round times every
    scorer once), so a burst of contention — the other workers of the replica starting up beside
    this one — falls on all of them alike instead of on whichever was being timed."""
    import time

    for scorer in scorers.values():
        for p in probes[:2]:  # first calls pay for allocation and dispatch set-up
            score_probe(scorer, p)
    per_round: dict[_Name, list[float]] = {name: [] for name in scorers}
    for _ in range(rounds):
        for name, scorer in scorers.items():
            t0 = time.perf_counter()
            for p in probes:
                score_probe(scorer, p)
            per_round[name].append((time.perf_counter() - t0) * 1000 / len(probes))
    return {name: round(sorted(ms)[len(ms) // 2], 4) for name, ms in per_round.items()}


def choose_scorer(model: DIN, item_category: torch.Tensor, wanted: str, probes: Sequence[Probe],
                  tolerance: float = 1e-3, rounds: int = 9) -> tuple[Scorer, ScorerChoice]:
    """Time every implementation ``wanted`` allows here on the ``probes`` and keep the fastest whose
    probabilities stay within ``tolerance`` of fp32 (with ``wanted="bf16"`` a bf16 one is kept whatever
    its difference). Measured on the live CPU, because the fastest differs between machines: the fused
    kernel wins where AVX-512 BF16 is fast and oneDNN's bf16 products where AMX is; on an AVX2-only CPU
    fp32 is all there is. A DIN with context is offered its listwise path, fused and as PyTorch ops
    (both fp32; ``wanted`` bf16 does not apply to it), and its probes carry its context."""
    scorers = candidate_scorers(model, item_category, wanted)
    exact_name: ScoreImpl = "lists_fp32" if model.cfg.scores_lists else "fp32"
    exact = scorers.get(exact_name) or Scorer(model, item_category, "fp32")
    reference = [torch.sigmoid(score_probe(exact, p).logits) for p in probes]
    diffs: dict[str, float] = {}
    refused: dict[str, str] = {}
    if model.cfg.scores_lists and (wanted == "bf16" or (wanted == "auto" and bf16_supported())):
        refused["bf16"] = "a DIN with context is scored in fp32 (its lists)"
    for name, scorer in scorers.items():
        if name != exact_name:
            diffs[name] = round(max(float((torch.sigmoid(score_probe(scorer, p).logits) - r).abs().max())
                                    for p, r in zip(probes, reference, strict=True)), 6)
            if wanted != "bf16" and diffs[name] > tolerance:
                refused[name] = f"probabilities {diffs[name]:.2g} from fp32 (tolerance {tolerance:g})"
    timings = _median_ms({n: s for n, s in scorers.items() if n not in refused}, probes, rounds)
    best = min(timings, key=timings.__getitem__)
    return scorers[best], ScorerChoice(best, timings, diffs, refused)
