"""Row-wise Adagrad for embedding tables, in plain PyTorch: what FBGEMM's fused
``EXACT_ROWWISE_ADAGRAD`` (the optimizer of TorchRec's sharded tables, training.sharded) computes, for
tables held whole. One state value per row, not two per element as Adam keeps::

    s[r] += mean(g[r]²)                  g[r]: row r's gradient, its lookups in the batch summed
    w[r] -= lr · g[r] / (√s[r] + eps)

A row the batch did not touch has a zero gradient and does not move (FBGEMM visits only the touched
rows; here the zero makes the same update). It is both the unsharded run's optimizer when the tables
train row-wise and the reference the sharded run is checked against.
"""

from __future__ import annotations

import torch


class RowWiseAdagrad(torch.optim.Optimizer):
    def __init__(self, params, lr: float = 1e-2, eps: float = 1e-8) -> None:
        super().__init__(params, {"lr": lr, "eps": eps})

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001 - torch's signature
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "sum" not in state:
                    state["sum"] = torch.zeros(p.shape[0], dtype=torch.float32, device=p.device)  # (R,)
                grad = p.grad
                if grad.is_sparse:  # the touched rows, their lookups summed
                    grad = grad.coalesce()
                    rows, g = grad.indices()[0], grad.values().float()  # (U,), (U, D)
                else:
                    rows, g = None, grad.float()  # every row; untouched ones have g = 0 and stay
                total = state["sum"] if rows is None else state["sum"].index_select(0, rows)
                total = total + g.pow(2).mean(dim=1)  # (U,) or (R,)
                step = g * (group["lr"] / (total.sqrt() + group["eps"])).unsqueeze(1)  # (U, D)
                if rows is None:
                    state["sum"].copy_(total)
                    p.sub_(step.to(p.dtype))
                else:
                    state["sum"].index_copy_(0, rows, total)
                    p.index_add_(0, rows, -step.to(p.dtype))
