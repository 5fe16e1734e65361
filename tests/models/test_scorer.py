"""The serving scorer computes the training model's function: same logits (fp32, within 1e-5), same
attention weights, on random models of several shapes and on a trained bundle."""

from __future__ import annotations

import pytest
import torch

from dinrec.models.din import DIN, DINConfig
from dinrec.models.kernels import kernels_enabled
from dinrec.models.scorer import Scorer, bf16_supported, choose_scorer


def random_model(attention_activation: str, mlp_activation: str, attention_hidden=(80, 40), mlp_hidden=(64, 32),
                 n_items: int = 500, n_cats: int = 20, seed: int = 0, dims: tuple[int, int] = (12, 6),
                 scale: float = 0.3) -> tuple[DIN, torch.Tensor]:
    torch.manual_seed(seed)
    model = DIN(DINConfig(n_items=n_items, n_categories=n_cats, item_dim=dims[0], cat_dim=dims[1],
                          attention_hidden=attention_hidden, mlp_hidden=mlp_hidden,
                          attention_activation=attention_activation, mlp_activation=mlp_activation)).eval()
    with torch.no_grad():  # trained-looking parameters, so every term of the function matters
        for p in model.parameters():
            p.normal_(0, scale)
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                assert m.running_mean is not None and m.running_var is not None  # Dice's BN tracks them
                m.running_mean.normal_(0, 0.5)
                m.running_var.uniform_(0.3, 3.0)
    item_cat = torch.randint(1, n_cats, (n_items,))
    item_cat[0] = 0
    return model, item_cat


def reference_logits(model: DIN, item_cat: torch.Tensor, hist: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        n = len(cand)
        return model(hist.unsqueeze(0).expand(n, -1), item_cat[hist].unsqueeze(0).expand(n, -1), cand, item_cat[cand])


@pytest.mark.parametrize("attention_activation, mlp_activation, attention_hidden", [
    ("prelu", "dice", (80, 40)), ("dice", "relu", (80, 40)), ("dice", "dice", (16,)), ("sigmoid", "prelu", (24, 12, 6)),
])
def test_fp32_scores_equal_the_models_forward(attention_activation, mlp_activation, attention_hidden):
    model, item_cat = random_model(attention_activation, mlp_activation, attention_hidden)
    scorer = Scorer(model, item_cat, "fp32", chunk=7)  # chunks that do not divide N
    g = torch.Generator().manual_seed(1)
    for length in (50, 13, 1):
        hist = torch.randint(1, 500, (length,), generator=g)
        hist[::5] = 0  # unknown behaviours are ignored, as the model ignores padding
        cand = torch.randperm(499, generator=g)[:30] + 1
        got = scorer.score(hist, item_cat[hist], cand).logits
        want = reference_logits(model, item_cat, hist, cand)
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), (got - want).abs().max()
        assert want.std() > 0.01  # the candidates' scores really differ: the check has teeth


def test_an_empty_or_unknown_history_scores_like_the_model():
    model, item_cat = random_model("prelu", "dice")
    scorer = Scorer(model, item_cat, "fp32")
    cand = torch.arange(1, 41)
    hist = torch.zeros(5, dtype=torch.long)  # only unknown items
    assert torch.allclose(scorer.score(hist, item_cat[hist], cand).logits,
                          reference_logits(model, item_cat, hist, cand), atol=1e-5)


def test_attention_weights_are_the_activation_units_weights():
    model, item_cat = random_model("dice", "relu")
    hist = torch.tensor([3, 0, 77, 120, 9])
    cand = torch.tensor([5, 400, 250])
    weights = Scorer(model, item_cat, "fp32").score(hist, item_cat[hist], cand, with_attention=True).attention
    assert weights is not None
    known = hist[hist != 0]
    with torch.inference_mode():  # the paper's form: W·[q, h, q−h, q⊙h], then the rest of the unit
        h = model.embed(known, item_cat[known])  # (L, D)
        q = model.embed(cand, item_cat[cand])  # (N, D)
        qq, hh = q.unsqueeze(1).expand(-1, len(known), -1), h.unsqueeze(0).expand(len(cand), -1, -1)
        z = model.att_in(torch.cat([qq, hh, qq - hh, qq * hh], dim=-1))  # (N, L, H1)
        want = model._activation_weights(z.reshape(-1, z.shape[-1])).reshape(len(cand), len(known))
    assert weights.shape == (3, 4) and torch.allclose(weights, want, atol=1e-5)


def _probes(item_cat, n: int = 3, length: int = 40, candidates: int = 50):
    g = torch.Generator().manual_seed(2)
    return [(h, item_cat[h], torch.randperm(499, generator=g)[:candidates] + 1)
            for h in (torch.randint(1, 500, (length,), generator=g) for _ in range(n))]


def test_the_scorer_is_the_fastest_implementation_that_stays_within_the_tolerance():
    model, item_cat = random_model("prelu", "relu")
    probes = _probes(item_cat)
    scorer, choice = choose_scorer(model, item_cat, "auto", probes)
    allowed = {"fp32", "bf16", "fused_bf16"} if bf16_supported() else {"fp32"}
    assert set(choice.timings_ms) | set(choice.refused) <= allowed and "fp32" in choice.timings_ms
    assert scorer.impl == choice.impl == min(choice.timings_ms, key=choice.timings_ms.__getitem__)
    for name, diff in choice.max_prob_diff.items():  # timed only if close enough to fp32
        assert (name in choice.timings_ms) == (diff <= 1e-3) and diff < 0.05
    exact, _ = choose_scorer(model, item_cat, "fp32", probes)
    assert exact.impl == "fp32"
    strict, strict_choice = choose_scorer(model, item_cat, "auto", probes, tolerance=0.0)
    assert strict.impl == "fp32" or strict_choice.max_prob_diff[strict.impl] == 0.0


@pytest.mark.skipif(not bf16_supported(), reason="this CPU has no native bf16 (AVX-512 BF16 / AMX)")
def test_bf16_is_kept_when_asked_for_whatever_its_difference():
    model, item_cat = random_model("prelu", "relu")
    scorer, choice = choose_scorer(model, item_cat, "bf16", _probes(item_cat), tolerance=0.0)
    assert scorer.precision == "bf16" and "fp32" not in choice.timings_ms


def test_an_avx2_only_machine_is_offered_fp32_alone(monkeypatch):
    from dinrec.models import kernels

    monkeypatch.setenv(kernels.ISA_LIMIT_ENV, "avx2")
    assert not bf16_supported() and not kernels.cpu_has("avx512f")
    model, item_cat = random_model("prelu", "relu")
    scorer, choice = choose_scorer(model, item_cat, "auto", _probes(item_cat, n=1))
    assert scorer.impl == "fp32" and list(choice.timings_ms) == ["fp32"]
    monkeypatch.setenv(kernels.ISA_LIMIT_ENV, "avx-9000")
    with pytest.raises(ValueError, match="DINREC_CPU_ISA"):
        kernels.cpu_has("avx2")


def _fused_kernel_builds() -> bool:
    from dinrec.models.kernels import load_score

    return load_score()


@pytest.mark.skipif(not bf16_supported(), reason="this CPU has no AVX-512 BF16: the fused unit is not built")
@pytest.mark.skipif(not kernels_enabled(), reason="DINREC_KERNELS=off: the fused unit is not loaded (its tier)")
@pytest.mark.parametrize("attention_hidden", [(80, 40), (64, 32)])
def test_the_fused_bf16_unit_scores_and_attends_like_fp32(attention_hidden):
    assert _fused_kernel_builds(), "the fused scoring unit did not build on a CPU that has AVX-512 BF16"
    model, item_cat = random_model("prelu", "relu", attention_hidden, dims=(32, 32), scale=0.15)
    fused, exact = Scorer(model, item_cat, "bf16"), Scorer(model, item_cat, "fp32")
    assert fused.fused and not exact.fused
    g = torch.Generator().manual_seed(3)
    for length in (50, 17, 8, 7, 1):  # whole tiles of 8 rows, tails, a single row
        hist = torch.randint(1, 500, (length,), generator=g)
        cand = torch.randperm(499, generator=g)[:60] + 1
        got = fused.score(hist, item_cat[hist], cand, with_attention=True)
        want = exact.score(hist, item_cat[hist], cand, with_attention=True)
        p_got, p_want = torch.sigmoid(got.logits), torch.sigmoid(want.logits)
        assert (p_got - p_want).abs().max() < 2e-3, (p_got - p_want).abs().max()
        assert p_want.std() > 0.01  # the scores differ between candidates: the comparison has teeth
        assert got.attention is not None and want.attention is not None
        scale = want.attention.abs().max()
        assert got.attention.shape == want.attention.shape
        assert (got.attention - want.attention).abs().max() < 0.02 * scale
        # The top 5 are the same items, up to swaps between candidates closer than bf16's rounding.
        top, got_top = torch.argsort(want.logits, descending=True)[:5], torch.argsort(got.logits, descending=True)[:5]
        rounding = (got.logits - want.logits).abs().max()
        assert want.logits[got_top].min() >= want.logits[top].min() - 2 * rounding
        assert len(set(got_top.tolist()) & set(top.tolist())) >= 4
    empty = torch.zeros(4, dtype=torch.long)  # no known behaviour: no unit to run
    got, want = fused.score(empty, item_cat[empty], cand), exact.score(empty, item_cat[empty], cand)
    assert torch.allclose(got.logits, want.logits, atol=0.05)


def test_units_the_fused_kernel_was_not_built_for_keep_the_pytorch_ops():
    model, item_cat = random_model("dice", "relu", (80, 40), dims=(32, 32))  # Dice, not PReLU
    assert not Scorer(model, item_cat, "bf16").fused
    model, item_cat = random_model("prelu", "relu", (80, 40))  # D = 18: not a multiple of 32
    assert not Scorer(model, item_cat, "bf16").fused


def test_a_trained_bundle_scores_the_same(tiny_run):
    from dinrec.models.bundle import load_bundle

    bundle = load_bundle(tiny_run[2])
    item_cat = torch.as_tensor(bundle.vocab.item_category, dtype=torch.long)
    scorer = Scorer(bundle.model, item_cat, "fp32")
    hist = torch.arange(1, 21)
    cand = torch.arange(21, 121)
    assert bundle.model.cfg.scores_lists  # the default DIN reads context: scored as serving scores it
    from dinrec.models.context import served_context

    ts = torch.linspace(0, 86_400 * 30, 20, dtype=torch.float64)[None]  # (1, L): a month of behaviours
    pairs, counts = bundle.context_sources()
    context = served_context(bundle.model.cfg, pairs, counts, hist[None], item_cat[hist][None],
                             ts, cand[None], item_cat[cand][None])
    want = bundle.model.score_lists(hist[None], item_cat[hist][None], cand[None], item_cat[cand][None], context)[0]
    got = scorer.score(hist, item_cat[hist], cand, context=context).logits
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5) and want.std() > 0.01


def test_a_din_with_context_is_offered_its_fused_and_its_ops_path_and_keeps_the_faster():
    from dinrec.models.context import probe_context
    from dinrec.training.loop import din_config
    from dinrec.training.settings import TrainSettings

    torch.manual_seed(0)
    cfg = din_config(500, 20, 30, TrainSettings())  # the shape `dinrec train` ships, over 500 items
    model = DIN(cfg).eval()
    with torch.no_grad():  # trained-looking: the context terms start at zero
        for param in model.parameters():
            param.normal_(0, 0.3)
    item_cat = torch.randint(1, 20, (500,))
    item_cat[0] = 0
    g = torch.Generator().manual_seed(1)
    probes = []
    for _ in range(3):
        h = torch.randint(1, 500, (30,), generator=g)
        context = probe_context(cfg, 60, 30, g)
        assert context is not None and context.pairs is not None and context.pairs.shape == (1, 60, 30, 1)
        probes.append((h, item_cat[h], torch.randperm(499, generator=g)[:60] + 1, context))
    scorer, choice = choose_scorer(model, item_cat, "auto", probes)
    from dinrec.models.kernels import load_lists

    offered = {"lists_fp32", "lists_fused"} if load_lists() else {"lists_fp32"}
    assert set(choice.timings_ms) | set(choice.refused) - {"bf16"} == offered
    assert scorer.impl == choice.impl == min(choice.timings_ms, key=choice.timings_ms.__getitem__)
    assert model.list_unit is None  # each scorer switches its own copy of the module, not the model
    for p in probes:  # whichever is kept, it is the model's own function
        want = model.lists_from(model.embed(p[0], p[1])[None], torch.ones(1, 30, dtype=torch.bool),
                                model.embed(p[2], item_cat[p[2]])[None], p[3])[0][0]
        assert torch.allclose(scorer.score(p[0], p[1], p[2], context=p[3]).logits, want, atol=1e-4)
    assert "lists_fused" not in choice.max_prob_diff or choice.max_prob_diff["lists_fused"] <= 1e-3


def test_cold_items_appended_in_steps_score_like_the_unknown_item_of_their_category():
    model, item_cat = random_model("prelu", "dice")
    scorer = Scorer(model, item_cat, "fp32")
    first = scorer.with_cold_items(torch.tensor([3, 5]))  # candidates 500, 501
    both = first.with_cold_items(torch.tensor([7]))  # and 502
    assert first.item_vectors.data_ptr() == scorer.item_vectors.data_ptr() == both.item_vectors.data_ptr()
    assert len(scorer.item_category) == 500 and len(first.item_category) == 502  # older versions unchanged
    hist = torch.randint(1, 500, (30,))
    cand = torch.tensor([500, 501, 502, 10])
    got = both.score(hist, item_cat[hist], cand).logits
    # DIN's view of a cold item: the unknown item (0) in its category.
    cats = torch.tensor([3, 5, 7, int(item_cat[10])])
    with torch.inference_mode():
        n = len(cand)
        want = model(hist.unsqueeze(0).expand(n, -1), item_cat[hist].unsqueeze(0).expand(n, -1),
                     torch.tensor([0, 0, 0, 10]), cats)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
