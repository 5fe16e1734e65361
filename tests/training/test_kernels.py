"""The fused CPU kernel of the Dice activation unit equals the model's PyTorch ops (training mode)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest
import torch

from dinrec.models.din import DIN, Dice, DINConfig, PReLU
from dinrec.training import kernels
from tests.conftest import REPO

pytestmark = pytest.mark.skipif(not kernels.load(), reason="the fused kernel could not be built here (see the log)")


def _batch(b: int, length: int, n_items: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(0, length + 1, (b,), generator=g)
    lens[:3] = torch.tensor([0, length, 1])  # an empty history, a full one, a single behaviour
    pad = torch.arange(length).unsqueeze(0) < (length - lens).unsqueeze(1)  # left padding
    items = torch.randint(1, n_items, (b, length), generator=g).masked_fill(pad, 0)
    cats = (items % 7 + 1).masked_fill(pad, 0)
    return items, cats, torch.randint(1, n_items, (b,), generator=g), torch.randint(1, 8, (b,), generator=g)


def _models(hidden: tuple[int, ...]) -> tuple[DIN, DIN]:
    torch.manual_seed(0)
    ref = DIN(DINConfig(n_items=400, n_categories=8, item_dim=8, cat_dim=4, attention_hidden=hidden,
                        attention_activation="dice")).train()
    with torch.no_grad():  # slopes away from 0, so a wrong α gradient or α term shows
        for module in ref.modules():
            if isinstance(module, Dice | PReLU):  # the modules with a slope
                module.alpha.uniform_(-0.5, 0.5)
    fused = copy.deepcopy(ref)
    fused.fused_unit = kernels.din_unit
    return ref, fused


@pytest.mark.parametrize("hidden", [(80, 40), (16,), (24, 12, 6)])
def test_fused_unit_equals_pytorch_ops(hidden):
    ref, fused = _models(hidden)
    batch = _batch(b=300, length=30, n_items=400)  # M ≈ 4,500 behaviours: several chunks, shared edge samples
    g = torch.randn(300, generator=torch.Generator().manual_seed(1))
    out_ref, out_fused = ref(*batch), fused(*batch)
    torch.testing.assert_close(out_fused, out_ref, rtol=1e-5, atol=1e-5)
    (out_ref * g).sum().backward()
    (out_fused * g).sum().backward()
    for (name, p_ref), (_, p_fused) in zip(ref.named_parameters(), fused.named_parameters(), strict=True):
        # relative to the gradient's size; a bias just before a batch norm has a true gradient of 0 (float noise)
        assert p_ref.grad is not None and p_fused.grad is not None
        scale = max(p_ref.grad.abs().max().item(), 1.0)
        torch.testing.assert_close(p_fused.grad / scale, p_ref.grad / scale, rtol=0, atol=2e-5, msg=name)
    for (name, b_ref), (_, b_fused) in zip(ref.named_buffers(), fused.named_buffers(), strict=True):
        torch.testing.assert_close(b_fused, b_ref, rtol=1e-5, atol=1e-6, msg=name)  # BN running statistics


def check_independent_of_threads() -> None:
    """The kernel's own outputs and gradients, bitwise, at the default thread count, at 1, and at the default
    again (PyTorch's ops around it, e.g. the MLP's, do depend on the thread count)."""
    _, model = _models((80, 40))
    hist_items, hist_cats, target_item, target_cat = _batch(b=200, length=40, n_items=400)
    rows, cols = (hist_items != 0).nonzero(as_tuple=True)
    hist = model.embed(hist_items[rows, cols], hist_cats[rows, cols]).detach().requires_grad_()
    query = model.embed(target_item, target_cat).detach().requires_grad_()
    per_sample = torch.randn(200, 80, requires_grad=True)
    w_cat = torch.randn(80, 2 * model.dim, requires_grad=True)
    g = torch.randn(200, model.dim)
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (threads, 1, threads):
            torch.set_num_threads(n)
            inputs = (hist, query, per_sample, w_cat, *model.parameters())
            for t in inputs:
                t.grad = None
            pooled = kernels.din_unit(query, hist, rows, per_sample, w_cat, model)
            (pooled * g).sum().backward()
            results.append([pooled.detach(), *(t.grad for t in inputs if t.grad is not None)])
    finally:
        torch.set_num_threads(threads)
    assert len(results[0]) > 5
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other, strict=True))


def test_fused_unit_is_deterministic_and_independent_of_threads():
    """What the kernel promises: its chunks depend only on the row count and their partial sums are reduced
    in chunk order, so its results do not depend on the thread count. The matrix products inside each chunk
    are MKL's, whose AVX2 code path rounds differently with the thread count (its AVX-512 path does not):
    the check runs with MKL's strict reproducibility mode (MKL_CBWR), in a fresh process since MKL reads it
    once, so what is asserted is the kernel's own order, on every ISA."""
    code = "from tests.training.test_kernels import check_independent_of_threads as c; c()"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "MKL_CBWR": "AUTO,STRICT"},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]


def test_eval_mode_and_empty_batches_use_the_pytorch_ops():
    ref, fused = _models((80, 40))
    empty = (torch.zeros(4, 5, dtype=torch.long), torch.zeros(4, 5, dtype=torch.long), torch.tensor([1, 2, 3, 4]),
             torch.tensor([1, 1, 2, 2]))
    torch.testing.assert_close(fused(*empty), ref(*empty))  # no behaviours at all: nothing for the kernel
    ref.eval()
    fused.eval()  # running statistics, no batch statistics: the plain model
    batch = _batch(b=50, length=10, n_items=400)
    assert torch.equal(fused(*batch), ref(*batch))


def test_a_kernel_that_cannot_be_built_falls_back_with_a_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("DINREC_KERNEL_CACHE", str(tmp_path / "cache"))
    assert kernels.build() is False
    assert "fused Dice kernel unavailable" in caplog.text
