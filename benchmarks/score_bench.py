"""`dinrec bench score`: the latency of scoring one request — one user's history of L behaviours
against N recalled candidates — on one thread, in one run, for the model `dinrec train` ships by default
(``--shape shipped``: benchmarks.shipped, its context built per request as serving builds it) or the DIN
paper's (``--shape paper``, ids only, the sizes given):

* ``dinrec``: models.scorer as serving uses it: every implementation this CPU allows (shipped: the listwise
  path fused or as PyTorch ops, fp32; paper: the fused AVX-512 BF16 unit, PyTorch ops with bf16 products
  through oneDNN, fp32) timed on probe requests, the fastest whose scores stay within 1e-3 of fp32 kept
  (``choice``); each implementation's latency is reported too (``implementations``), with the share of the
  machine's own GEMM rate it reaches (``fraction_of_peak``: multiply-adds per request (:func:`score_macs`)
  ×2 / p50, against the one-core GEMM rate of its precision, measured in the same run:
  ``machine.bf16_gemm_gflops``, ``fp32_gemm_gflops``; ``fraction_of_bf16_peak`` is null where the CPU has
  no native bf16 products);
* ``torch``: the training model's own function as PyTorch ops (paper: its forward on the request expanded
  to (N, L) — what serving did before; shipped: its listwise path);
* ``deepctr``: DeepCTR-Torch's DIN ``predict`` on the same (N, L) rows, one batch, of the same sizes (ids
  only: it has no context).

Random weights (latency does not depend on training). Each is timed ``requests`` times after a warm-up,
each request with a fresh history and candidate set; p50/p99 in milliseconds.
"""

from __future__ import annotations

import contextlib
import sys
import time

import numpy as np
import torch

from dinrec.benchmarks.machine import machine_with_ceiling
from dinrec.models.din import DIN, DINConfig
from dinrec.models.scorer import Scorer, bf16_supported, candidate_scorers, choose_scorer
from dinrec.training.progress import Stages, showing


def _timed(fn, requests: list, warmup: int = 20) -> dict:
    for r in requests[:warmup]:
        fn(*r)
    times = []
    for r in requests:
        t0 = time.perf_counter()
        fn(*r)
        times.append(time.perf_counter() - t0)
    ms = np.array(times) * 1000
    return {"p50_ms": round(float(np.percentile(ms, 50)), 3), "p99_ms": round(float(np.percentile(ms, 99)), 3),
            "mean_ms": round(float(ms.mean()), 3)}


SHAPES = ("shipped", "paper")


def bench_score(*, shape: str = "shipped", candidates: int | None = None, seq_len: int = 50, items: int = 100_000,
                categories: int = 1_000, item_dim: int = 32, cat_dim: int = 32,
                attention_hidden: tuple[int, ...] = (80, 40), mlp_hidden: tuple[int, ...] = (200, 80),
                attention_activation: str = "prelu", mlp_activation: str = "relu", requests: int = 500,
                vs_deepctr: bool = True, compiled: bool = False, seed: int = 0, progress: bool | None = None) -> dict:
    """``shape`` "shipped": the DIN `dinrec train` ships by default (benchmarks.shipped; the size options
    are ignored), against ``candidates`` (default 300: the default bundle's 200 recalled and 100
    co-visited), each request with the context serving builds for it (timed with the scoring: it is
    part of what a request pays to be scored); "paper": the DIN paper's model of the size options, no
    context (default 200 candidates). ``compiled`` (shipped): also the listwise path's PyTorch ops through
    torch.compile (:func:`_compiled`). ``progress``: a line per stage on stderr (default: when stderr is a
    terminal)."""
    if shape not in SHAPES:
        raise ValueError(f"shape {shape!r}: one of {', '.join(SHAPES)}")
    say = Stages(showing(progress))
    torch.set_num_threads(1)
    rng = np.random.default_rng(seed)
    if shape == "shipped":
        from dinrec.benchmarks.shipped import shipped_model

        shipped = shipped_model(items - 1, categories - 1, seq_len, seed)
        model, item_cat = shipped.model, shipped.item_category
        candidates = candidates or 300
        context_of = _served_context(shipped, seq_len)
    else:
        torch.manual_seed(seed)
        model = DIN(DINConfig(n_items=items, n_categories=categories, item_dim=item_dim, cat_dim=cat_dim,
                              attention_hidden=attention_hidden, mlp_hidden=mlp_hidden,
                              attention_activation=attention_activation, mlp_activation=mlp_activation)).eval()
        item_cat = torch.randint(1, categories, (items,))
        item_cat[0] = 0
        candidates = candidates or 200
        context_of = None
    cfg = model.cfg
    reqs = []
    for _ in range(requests):
        hist = torch.as_tensor(rng.integers(1, items, seq_len))
        cand = torch.as_tensor(rng.choice(np.arange(1, items), candidates, replace=False))
        reqs.append((hist, item_cat[hist], cand))
    say(f"{requests} requests built")

    out: dict = {"shape": shape, "candidates": candidates, "seq_len": seq_len, "items": items, "threads": 1,
                 "config": {k: v for k, v in cfg.to_json().items() if k not in ("n_items", "n_categories", "extra")},
                 "machine": machine_with_ceiling()}
    say("the machine's gemm ceiling measured")
    macs = score_macs(cfg, candidates, seq_len)
    out["multiply_adds_per_request"] = macs
    peak = {"fp32": out["machine"]["fp32_gemm_gflops"], "bf16": out["machine"]["bf16_gemm_gflops"]}
    # Without native bf16 (an AVX2 CPU, or --isa avx2) the probe times an emulation a few hundred times
    # slower than fp32: a share of that is no ceiling, so there is none (null)
    native_bf16 = bf16_supported()

    def with_peak(timed: dict, precision: str) -> dict:
        gflops = 2 * macs / (timed["p50_ms"] / 1000) / 1e9
        return {**timed, "gflops": round(gflops, 1), "fraction_of_peak": round(gflops / peak[precision], 4),
                "fraction_of_bf16_peak": round(gflops / peak["bf16"], 4) if native_bf16 else None}

    def scored(scorer: Scorer):
        if context_of is None:
            return lambda h, c, n: scorer.score(h, c, n)
        return lambda h, c, n: scorer.score(h, c, n, context=context_of(h, c, n))

    probes = [(*r, context_of(*r)) if context_of is not None else r for r in reqs[:8]]
    chosen, choice = choose_scorer(model, item_cat, "auto", probes)
    out["choice"] = choice.as_dict()
    say(f"scorer chosen: {chosen.impl}")
    out["implementations"] = {}
    for name, scorer in candidate_scorers(model, item_cat, "auto").items():
        timed = _timed(scored(scorer), reqs)
        out["implementations"][name] = {"impl": name, **with_peak(timed, scorer.precision)}
        say(f"{name} timed (p50 {timed['p50_ms']} ms)")
    out["dinrec"] = out["implementations"][chosen.impl]
    out["dinrec"]["max_prob_diff_vs_fp32"] = choice.max_prob_diff.get(chosen.impl, 0.0)
    if context_of is not None:  # the part of it that builds the context (models.context.served_context)
        out["dinrec"]["context"] = _timed(context_of, reqs)

    with torch.inference_mode():
        if context_of is None:
            def torch_forward(h, c, n):
                return model(h.unsqueeze(0).expand(len(n), -1), c.unsqueeze(0).expand(len(n), -1), n, item_cat[n])
        else:  # the model's own listwise path, as PyTorch ops (what training computes)
            def torch_forward(h, c, n):
                return model.score_lists(h[None], c[None], n[None], item_cat[n][None], context_of(h, c, n))
        out["torch"] = _timed(torch_forward, reqs)
    say(f"torch forward timed (p50 {out['torch']['p50_ms']} ms)")
    if compiled and context_of is not None:
        ops = candidate_scorers(model, item_cat, "fp32")["lists_fp32"]
        out["compiled"] = {"impl": "lists_fp32 through torch.compile", **_compiled(ops, reqs, context_of)}
        out["compiled"].update(with_peak(out["compiled"], "fp32"))
        say(f"torch.compile timed (p50 {out['compiled']['p50_ms']} ms)")

    if vs_deepctr:
        # DeepCTR-Torch's DIN of the same sizes, on ids alone (it has no context); its MLP cannot use Dice
        # (its DNN builds Dice for 3-D inputs), so PReLU stands in, at the same cost per element.
        peer = {"item_dim": cfg.item_dim, "cat_dim": cfg.cat_dim, "attention_hidden": cfg.attention_hidden,
                "mlp_hidden": cfg.mlp_hidden, "attention_activation": cfg.attention_activation,
                "mlp_activation": "prelu" if cfg.mlp_activation == "dice" else cfg.mlp_activation}
        out["deepctr"] = {**_deepctr(reqs, item_cat, items, categories, seq_len, seed=seed, **peer),
                          "config": {k: list(v) if isinstance(v, tuple) else v for k, v in peer.items()}}
        say(f"deepctr timed (p50 {out['deepctr']['p50_ms']} ms)")
        out["speedup_vs_deepctr"] = round(out["deepctr"]["p50_ms"] / out["dinrec"]["p50_ms"], 2)
    out["speedup_vs_torch"] = round(out["torch"]["p50_ms"] / out["dinrec"]["p50_ms"], 2)
    return out


def _compiled(ops: Scorer, reqs: list, context_of) -> dict:
    """The listwise path as PyTorch ops (``ops``: the lists_fp32 scorer) through torch.compile — inductor,
    dynamic shapes (a served request's candidate count varies) — timed as the others are, beside how long
    the first calls took to compile and its largest logit difference from the eager ops. Measured, not
    served: every worker would pay the compile at start and at each new bundle."""
    from dinrec.models.din import ListContext

    model = ops.model

    def forward(h, filled, q, gaps, pairs, features):
        return model.lists_from(h, filled, q, ListContext(gaps, pairs, features), head=ops._head)[0]

    fn = torch.compile(forward, dynamic=True)

    def score(h, c, n):
        context = context_of(h, c, n)
        with torch.inference_mode():
            return fn(model.embed(h, c)[None], torch.ones(1, len(h), dtype=torch.bool),
                      ops.item_vectors.index_select(0, n)[None], context.gaps, context.pairs, context.candidates)[0]

    t0 = time.perf_counter()
    diff = max(float((score(*r) - ops.score(*r, context=context_of(*r)).logits).abs().max()) for r in reqs[:3])
    compile_s = time.perf_counter() - t0
    return {**_timed(score, reqs), "compile_seconds": round(compile_s, 1), "max_logit_diff_vs_ops": round(diff, 6)}


def _served_context(shipped, seq_len: int):
    """A function (hist, cats, cand) → the ListContext serving builds for that request
    (models.context.served_context, from the shipped lane's pair table and counts), the behaviours a
    minute to a month apart."""
    from dinrec.models.context import served_context
    from dinrec.retrieval.covisit import PairTable

    pairs = PairTable([shipped.lane]) if shipped.lane is not None else None
    counts = torch.from_numpy(shipped.counts.astype(np.float32))
    ts = torch.cumsum(torch.logspace(1, 6, seq_len, dtype=torch.float64).flip(0), 0)[None]  # (1, L), newest last
    cfg, item_cat = shipped.model.cfg, shipped.item_category

    def context(h: torch.Tensor, c: torch.Tensor, n: torch.Tensor):
        return served_context(cfg, pairs, counts, h[None], c[None], ts, n[None], item_cat[n][None])
    return context


def score_macs(cfg: DINConfig, candidates: int, seq_len: int) -> int:
    """Multiply-adds of one request in the scorer's arrangement (models/scorer.py), one fixed formula
    per shape: the history's part of the unit's first layer once (L·D·H1); the candidate × behaviour
    products (N·L·D·H1), the unit's other layers per pair and the weighted sum pooling (N·L·D); the MLP
    per candidate. A DIN with context (its listwise path, models.din.lists_from) also pays per request
    the candidates' part of the first layer (N·D·H1; the plain scorer has it per item at load), the
    pair inputs per pair (N·L·2P·H1) and the context features into the MLP and its linear term."""
    n, length, d, h = candidates, seq_len, cfg.item_dim + cfg.cat_dim, list(cfg.attention_hidden)
    unit = sum(a * b for a, b in zip(h, [*h[1:], 1], strict=True))
    if not cfg.scores_lists:
        widths = [2 * d, *cfg.mlp_hidden, 1]
        mlp = sum(a * b for a, b in zip(widths, widths[1:], strict=False))
        return length * d * h[0] + n * length * (d * h[0] + unit + d) + n * mlp
    extra = cfg.context_width
    widths = [(3 if cfg.cross else 2) * d + extra, *cfg.mlp_hidden, 1]
    mlp = sum(a * b for a, b in zip(widths, widths[1:], strict=False)) + extra
    pair = 2 * cfg.pair_inputs * h[0]
    return length * d * h[0] + n * d * h[0] + n * length * (d * h[0] + pair + unit + d) + n * mlp


def _deepctr(reqs, item_cat, items, categories, seq_len, item_dim, cat_dim, attention_hidden, mlp_hidden,
             attention_activation, mlp_activation, seed) -> dict:
    from dinrec.benchmarks.deepctr_peer import build_deepctr_din

    model = build_deepctr_din(items, categories, seq_len=seq_len, item_dim=item_dim, cat_dim=cat_dim,
                              attention_hidden=attention_hidden, mlp_hidden=mlp_hidden,
                              attention_activation=attention_activation, mlp_activation=mlp_activation, seed=seed)
    model.eval()

    def predict(h, c, n):
        rows = len(n)
        x = {"item_id": n.numpy(), "cate_id": item_cat[n].numpy(),
             "hist_item_id": np.repeat(h.numpy()[None], rows, 0), "hist_cate_id": np.repeat(c.numpy()[None], rows, 0),
             "seq_length": np.full(rows, len(h))}
        with contextlib.redirect_stdout(sys.stderr):
            return model.predict(x, batch_size=rows)

    return _timed(predict, reqs)
