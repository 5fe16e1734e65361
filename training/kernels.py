"""The fused CPU kernel for DIN's Dice activation unit (``models/csrc/din_unit.cpp``), built on first use.

``din_unit(…, model)`` equals ``model.interest_jagged`` with a Dice activation unit in training mode
(batch statistics; running statistics updated the way ``nn.BatchNorm1d`` does) up to float rounding,
forward and backward; see the C++ file for why it is faster. models.kernels builds it, as every C++
unit, once per machine (or ships it in an image); where it cannot be loaded, ``load()`` says why once
and returns False, and the model keeps its PyTorch ops."""

from __future__ import annotations

import functools

import torch

from dinrec.models.din import DIN
from dinrec.models.kernels import build_dice


@functools.cache
def load() -> bool:
    """``build()`` once per process."""
    return build()


def build() -> bool:
    """Build (or load the built) unit and register ``torch.ops.dinrec``; False, with a warning, where
    that fails."""
    return build_dice()


class _DinUnit(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hist, rows, query, per_sample, w_cat, eps: float, n: int, *params):
        # params: W (n−1), b (n−1), w_out, b_out, alpha (n). The op gets plain tensors: no autograd inside.
        hist, query, per_sample, w_cat = (t.detach().contiguous() for t in (hist, query, per_sample, w_cat))
        rows = rows.contiguous()
        plain = [p.detach().contiguous() for p in params]
        W, b = plain[:n - 1], plain[n - 1:2 * n - 2]
        w_out, b_out, alpha = plain[2 * n - 2].reshape(-1), plain[2 * n - 1], plain[2 * n:]
        res = torch.ops.dinrec.din_unit_forward(hist, rows, query, per_sample, w_cat, W, b, w_out, b_out, alpha, eps)
        pooled, w, zs = res[0], res[1], res[2:2 + n]
        means, variances, invstds = res[2 + n:2 + 2 * n], res[2 + 2 * n:2 + 3 * n], res[2 + 3 * n:2 + 4 * n]
        ctx.save_for_backward(hist, rows, query, w_cat, w, *zs, *means, *invstds, *W, w_out, *alpha)
        ctx.n, ctx.w_out_shape = n, plain[2 * n - 2].shape
        ctx.mark_non_differentiable(*means, *variances)
        return (pooled, *means, *variances)

    @staticmethod
    def backward(ctx, g_pooled, *_):
        n = ctx.n
        hist, rows, query, w_cat, w, *rest = ctx.saved_tensors
        zs, means, invstds = rest[:n], rest[n:2 * n], rest[2 * n:3 * n]
        W, w_out, alpha = rest[3 * n:4 * n - 1], rest[4 * n - 1], rest[4 * n:]
        g = torch.ops.dinrec.din_unit_backward(g_pooled.contiguous(), hist, rows, query, w_cat, w, zs, means,
                                               invstds, W, w_out, alpha)
        g_hist, g_query, g_per_sample, g_wcat = g[:4]
        gW, gb = g[4:3 + n], g[3 + n:2 + 2 * n]
        g_wout, g_bout, galpha = g[2 + 2 * n].reshape(ctx.w_out_shape), g[3 + 2 * n], g[4 + 2 * n:]
        return (g_hist, None, g_query, g_per_sample, g_wcat, None, None, *gW, *gb, g_wout, g_bout, *galpha)


def din_unit(query: torch.Tensor, hist: torch.Tensor, rows: torch.Tensor, per_sample: torch.Tensor,
             w_cat: torch.Tensor, model: DIN) -> torch.Tensor:
    """The activation unit and sum pooling of ``model`` (all Dice, training mode), fused.

    query (B, D), hist (M, D), rows (M,) sorted, per_sample (B, H0) the first layer's per-sample term,
    w_cat (H0, 2D) its weights for [h, q⊙h] → pooled interest (B, D); see ``DIN.interest_jagged``.
    """
    dices, linears, out = model.dice_unit_layers()
    n = len(dices)
    bns = [d.bn for d in dices]
    params = [*(lin.weight for lin in linears), *(lin.bias for lin in linears), out.weight, out.bias,
              *(d.alpha for d in dices)]
    if len({bn.eps for bn in bns}) != 1:  # the op takes one eps for every layer
        raise ValueError("the fused unit needs the same batch-norm eps in every Dice layer")
    res = _DinUnit.apply(hist, rows, query, per_sample, w_cat, bns[0].eps, n, *params)
    pooled, means, variances = res[0], res[1:n + 1], res[n + 1:]
    m = hist.shape[0]
    with torch.no_grad():  # what nn.BatchNorm1d does in training mode (unbiased variance in the running one)
        for bn, mean, var in zip(bns, means, variances, strict=True):
            if bn.track_running_stats and bn.running_mean is not None:
                assert bn.running_var is not None and bn.num_batches_tracked is not None  # tracked with the mean
                bn.num_batches_tracked.add_(1)
                momentum = bn.momentum if bn.momentum is not None else 1.0 / float(bn.num_batches_tracked)
                bn.running_mean.lerp_(mean, momentum)
                bn.running_var.lerp_(var * (m / max(m - 1, 1)), momentum)
    return pooled
