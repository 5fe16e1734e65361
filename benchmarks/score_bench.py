"""`dinrec bench score`: the latency of scoring one request — one user's history of L behaviours
against N recalled candidates — on one thread, in one run:

* ``dinrec``: models.scorer as serving uses it: every implementation this CPU allows (the fused
  AVX-512 BF16 unit, PyTorch ops with bf16 products through oneDNN, fp32) timed on probe requests,
  the fastest whose scores stay within 1e-3 of fp32 kept (``choice``); each implementation's
  latency is reported too (``implementations``), with the share of the machine's own GEMM rate it
  reaches (``fraction_of_peak``: multiply-adds per request ×2 / p50, against the one-core GEMM rate
  of its precision, measured in the same run: ``machine.bf16_gemm_gflops``, ``fp32_gemm_gflops``;
  ``fraction_of_bf16_peak`` is null where the CPU has no native bf16 products);
* ``torch``: the training model's forward on the request expanded to (N, L) — what serving did before;
* ``deepctr``: DeepCTR-Torch's DIN ``predict`` on the same (N, L) rows, one batch.

All have the same sizes (item + category embeddings, attention and MLP layers, activations) and
random weights (latency does not depend on training). Each is timed ``requests`` times after a
warm-up, each request with a fresh history and candidate set; p50/p99 in milliseconds.
"""

from __future__ import annotations

import contextlib
import sys
import time

import numpy as np
import torch

from dinrec.benchmarks.machine import machine_with_ceiling
from dinrec.models.din import DIN, DINConfig
from dinrec.models.scorer import bf16_supported, candidate_scorers, choose_scorer
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


def bench_score(*, candidates: int = 200, seq_len: int = 50, items: int = 100_000, categories: int = 1_000,
                item_dim: int = 32, cat_dim: int = 32, attention_hidden: tuple[int, ...] = (80, 40),
                mlp_hidden: tuple[int, ...] = (200, 80), attention_activation: str = "prelu",
                mlp_activation: str = "relu", requests: int = 500, vs_deepctr: bool = True, seed: int = 0,
                progress: bool | None = None) -> dict:
    """``progress``: a line per stage on stderr (default: when stderr is a terminal)."""
    say = Stages(showing(progress))
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    cfg = DINConfig(n_items=items, n_categories=categories, item_dim=item_dim, cat_dim=cat_dim,
                    attention_hidden=attention_hidden, mlp_hidden=mlp_hidden,
                    attention_activation=attention_activation, mlp_activation=mlp_activation)
    model = DIN(cfg).eval()
    item_cat = torch.randint(1, categories, (items,))
    item_cat[0] = 0
    rng = np.random.default_rng(seed)
    reqs = []
    for _ in range(requests):
        hist = torch.as_tensor(rng.integers(1, items, seq_len))
        cand = torch.as_tensor(rng.choice(np.arange(1, items), candidates, replace=False))
        reqs.append((hist, item_cat[hist], cand))
    say(f"{requests} requests built")

    out: dict = {"candidates": candidates, "seq_len": seq_len, "items": items, "threads": 1,
                 "config": {"item_dim": item_dim, "cat_dim": cat_dim, "attention_hidden": list(attention_hidden),
                            "mlp_hidden": list(mlp_hidden), "attention_activation": attention_activation,
                            "mlp_activation": mlp_activation},
                 "machine": machine_with_ceiling()}
    say("the machine's gemm ceiling measured")
    macs = score_macs(candidates, seq_len, item_dim + cat_dim, attention_hidden, mlp_hidden)
    out["multiply_adds_per_request"] = macs
    peak = {"fp32": out["machine"]["fp32_gemm_gflops"], "bf16": out["machine"]["bf16_gemm_gflops"]}
    # Without native bf16 (an AVX2 CPU, or --isa avx2) the probe times an emulation a few hundred times
    # slower than fp32: a share of that is no ceiling, so there is none (null)
    native_bf16 = bf16_supported()

    def with_peak(timed: dict, precision: str) -> dict:
        gflops = 2 * macs / (timed["p50_ms"] / 1000) / 1e9
        return {**timed, "gflops": round(gflops, 1), "fraction_of_peak": round(gflops / peak[precision], 3),
                "fraction_of_bf16_peak": round(gflops / peak["bf16"], 3) if native_bf16 else None}

    chosen, choice = choose_scorer(model, item_cat, "auto", reqs[:8])
    out["choice"] = choice.as_dict()
    say(f"scorer chosen: {chosen.impl}")
    out["implementations"] = {}
    for name, scorer in candidate_scorers(model, item_cat, "auto").items():
        timed = _timed(lambda h, c, n, s=scorer: s.score(h, c, n), reqs)
        out["implementations"][name] = {"impl": name, **with_peak(timed, scorer.precision)}
        say(f"{name} timed (p50 {timed['p50_ms']} ms)")
    out["dinrec"] = out["implementations"][chosen.impl]
    out["dinrec"]["max_prob_diff_vs_fp32"] = choice.max_prob_diff.get(chosen.impl, 0.0)

    with torch.inference_mode():
        def torch_forward(h, c, n):
            return model(h.unsqueeze(0).expand(len(n), -1), c.unsqueeze(0).expand(len(n), -1), n, item_cat[n])
        out["torch"] = _timed(torch_forward, reqs)
    say(f"torch forward timed (p50 {out['torch']['p50_ms']} ms)")

    if vs_deepctr:
        out["deepctr"] = _deepctr(reqs, item_cat, items, categories, seq_len, item_dim, cat_dim, attention_hidden,
                                  mlp_hidden, attention_activation, mlp_activation, seed)
        say(f"deepctr timed (p50 {out['deepctr']['p50_ms']} ms)")
        out["speedup_vs_deepctr"] = round(out["deepctr"]["p50_ms"] / out["dinrec"]["p50_ms"], 2)
    out["speedup_vs_torch"] = round(out["torch"]["p50_ms"] / out["dinrec"]["p50_ms"], 2)
    return out


def score_macs(candidates: int, seq_len: int, dim: int, attention_hidden: tuple[int, ...],
               mlp_hidden: tuple[int, ...]) -> int:
    """Multiply-adds of one request in the scorer's arrangement (models/scorer.py): the history's
    part of the unit's first layer once (L·D·H1), the candidate × behaviour products (N·D·L·H1), the
    unit's other layers per pair, the weighted sum pooling (N·L·D) and the MLP per candidate."""
    n, length, h = candidates, seq_len, list(attention_hidden)
    unit = sum(a * b for a, b in zip(h, [*h[1:], 1], strict=True))
    widths = [2 * dim, *mlp_hidden, 1]
    mlp = sum(a * b for a, b in zip(widths, widths[1:], strict=False))
    return length * dim * h[0] + n * length * (dim * h[0] + unit + dim) + n * mlp


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
