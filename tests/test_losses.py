"""kernelwright.losses: the fused log-prob primitive against the unfused logits, and each loss
against its paper's formula written out here independently (values and gradients)."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import DEVICE

import kernelwright.losses as kernelwright_losses
from kernelwright.losses import (
    DPO_LOSS_TYPES,
    cpo_loss,
    dpo_loss,
    fused_linear_distill,
    fused_linear_logprob_stats,
    fused_linear_logprobs,
    fused_linear_logprobs_ref,
    grpo_loss,
    kto_loss,
    orpo_loss,
    sequence_logprobs,
    simpo_loss,
)
from kernelwright.losses.logprobs import logits_ref  # noqa: E402


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fused_linear_logprobs_matches_the_unfused_logits(temperature, with_bias):
    g = torch.Generator().manual_seed(0)
    T, H, V = 37, 16, 53
    hidden = torch.randn(2, T, H, generator=g).to(DEVICE).requires_grad_()
    weight = (torch.randn(V, H, generator=g) * 0.3).to(DEVICE).requires_grad_()
    bias = torch.randn(V, generator=g).to(DEVICE).requires_grad_() if with_bias else None
    target = torch.randint(0, V, (2, T), generator=g).to(DEVICE)
    target[0, :5] = -100  # prompt tokens: no log-prob
    kw = dict(bias=bias, temperature=temperature)
    got = fused_linear_logprobs(hidden, weight, target, chunk_size=16, **kw)
    want = fused_linear_logprobs_ref(hidden, weight, target, **kw)
    assert got.shape == target.shape and got.dtype == torch.float32
    assert (got[0, :5] == 0).all() and (got[:, 5:] < 0).all()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    dy = torch.randn(got.shape, generator=g).to(DEVICE)
    params = [hidden, weight] + ([bias] if with_bias else [])
    got_g, want_g = torch.autograd.grad(got, params, dy), torch.autograd.grad(want, params, dy)
    for a, b in zip(got_g, want_g, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("with_bias", [False, True])
def test_logprobs_with_entropy_match_the_unfused_logits(with_bias):
    g = torch.Generator().manual_seed(6)
    T, H, V = 23, 16, 47
    hidden = torch.randn(2, T, H, generator=g).to(DEVICE).requires_grad_()
    weight = (torch.randn(V, H, generator=g) * 0.3).to(DEVICE).requires_grad_()
    bias = torch.randn(V, generator=g).to(DEVICE).requires_grad_() if with_bias else None
    target = torch.randint(0, V, (2, T), generator=g).to(DEVICE)
    target[1, :6] = -100
    kw = dict(bias=bias, temperature=0.9, return_entropy=True)
    logps, ent = fused_linear_logprobs(hidden, weight, target, chunk_size=10, **kw)
    want_l, want_e = fused_linear_logprobs_ref(hidden, weight, target, **kw)
    torch.testing.assert_close(logps, want_l, atol=1e-5, rtol=1e-5)
    want_e = torch.where(target != -100, want_e, 0.0)  # ignored tokens are not computed
    torch.testing.assert_close(ent, want_e, atol=1e-5, rtol=1e-5)
    assert (ent[1, :6] == 0).all() and (ent[1, 6:] > 0).all() and (logps[1, :6] == 0).all()
    # the plain path gives the same log-probs
    plain = fused_linear_logprobs(hidden, weight, target, bias=bias, temperature=0.9)
    torch.testing.assert_close(logps, plain, atol=1e-5, rtol=1e-5)
    dl, de = (torch.randn(logps.shape, generator=g).to(DEVICE) for _ in range(2))
    params = [hidden, weight] + ([bias] if with_bias else [])
    got = torch.autograd.grad((logps * dl).sum() + (ent * de).sum(), params)
    want = torch.autograd.grad((want_l * dl).sum() + (want_e * de).sum(), params)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def _stats_ref(hidden, weight, target, bias, **kw):
    z = logits_ref(hidden, weight, bias, **kw)
    logp = z.log_softmax(-1)
    keep = target != -100
    first_max = z.argmax(-1) == target
    zero = torch.zeros((), dtype=z.dtype)
    return dict(
        entropy=torch.where(keep, -(logp.exp() * logp).sum(-1), zero),
        log_sum_sq_probs=torch.where(keep, torch.logsumexp(2 * logp, -1), zero),
        mean_logits=torch.where(keep, z.mean(-1), zero),
        is_top1=first_max & keep,
    )


@pytest.mark.parametrize(
    "V, kw",
    [
        (53, dict(temperature=0.8)),
        (53, dict(softcap=3.0, temperature=0.7, logit_scale=1.5)),
        (4099, dict(softcap=30.0)),  # two vocabulary blocks: the online statistics rescale
    ],
)
def test_logprob_stats_match_the_unfused_logits(V, kw):
    g = torch.Generator().manual_seed(V)
    T, H = (19, 16) if V < 100 else (5, 8)
    hidden = torch.randn(T, H, generator=g).to(DEVICE).requires_grad_()
    weight = torch.randn(V, H, generator=g).to(DEVICE).requires_grad_()
    bias = torch.randn(V, generator=g).to(DEVICE).requires_grad_()
    target = torch.randint(0, V, (T,), generator=g).to(DEVICE)
    target[:2] = -100
    # one target that is its row's argmax, so is_top1 is not all False
    with torch.no_grad():
        target[3] = logits_ref(hidden, weight, bias, **kw)[3].argmax()
    st = fused_linear_logprob_stats(hidden, weight, target, bias=bias, chunk_size=7, **kw)
    want_l = fused_linear_logprobs_ref(hidden, weight, target, bias=bias, **kw)
    want = _stats_ref(hidden, weight, target, bias, **kw)
    torch.testing.assert_close(st.log_probs, want_l, atol=2e-5, rtol=1e-5)
    for name, w in want.items():
        got = getattr(st, name)
        if name == "is_top1":
            assert got.dtype == torch.bool and got[3] and (got == w).all()
        else:
            torch.testing.assert_close(got, w, atol=2e-5, rtol=1e-5, msg=name)
    # the plain path (no statistics) and the stats path agree
    plain = fused_linear_logprobs(hidden, weight, target, bias=bias, **kw)
    torch.testing.assert_close(plain, want_l, atol=2e-5, rtol=1e-5)
    dl, de = torch.randn(T, generator=g).to(DEVICE), torch.randn(T, generator=g).to(DEVICE)
    params = [hidden, weight, bias]
    got = torch.autograd.grad(
        (st.log_probs * dl).sum() + (st.entropy * de).sum(), params, retain_graph=True
    )
    ref = torch.autograd.grad(
        (want_l * dl).sum() + (want["entropy"] * de).sum(), params, retain_graph=True
    )
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    # only the log-probs' gradient, and only the entropy's
    for loss, ref_loss in ((st.log_probs * dl, want_l * dl),):
        a = torch.autograd.grad(loss.sum(), hidden, retain_graph=True)[0]
        b = torch.autograd.grad(ref_loss.sum(), hidden, retain_graph=True)[0]
        torch.testing.assert_close(a, b,
                                   atol=1e-4, rtol=1e-4)  # fmt: skip
    a = torch.autograd.grad((st.entropy * de).sum(), weight)[0]
    b = torch.autograd.grad((want["entropy"] * de).sum(), weight)[0]
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_logprob_stats_in_bf16_under_autocast_match_fp32_logits():
    g = torch.Generator().manual_seed(3)
    T, H, V = 24, 32, 77
    hidden = torch.randn(T, H, generator=g).to(DEVICE).requires_grad_()
    weight = (torch.randn(V, H, generator=g) * 0.2).to(DEVICE, torch.bfloat16).requires_grad_()
    target = torch.randint(0, V, (T,), generator=g).to(DEVICE)
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        st = fused_linear_logprob_stats(hidden, weight, target, outputs=("entropy",),
                                        accum_dtype=torch.float32)  # fmt: skip
    # the reference rounds the matmul's inputs as autocast does, then works in fp32
    want_l, want_e = fused_linear_logprobs_ref(hidden.bfloat16(), weight, target,
                                               return_entropy=True)  # fmt: skip
    assert st.log_probs.dtype == torch.float32 and st.mean_logits is None
    torch.testing.assert_close(st.log_probs, want_l, atol=3e-2, rtol=1e-2)
    torch.testing.assert_close(st.entropy, want_e, atol=3e-2, rtol=1e-2)
    gh, gw = torch.autograd.grad((st.log_probs + st.entropy).sum(), [hidden, weight])
    rh, rw = torch.autograd.grad((want_l + want_e).sum(), [hidden, weight])
    assert gh.dtype == torch.float32 and gw.dtype == torch.bfloat16
    torch.testing.assert_close(gh, rh, atol=5e-2, rtol=5e-2)
    torch.testing.assert_close(gw.float(), rw.float(), atol=5e-2, rtol=5e-2)


def test_logprob_stats_say_what_is_wrong():
    h, w, t = torch.randn(3, 4).to(DEVICE), torch.randn(5, 4).to(DEVICE), torch.tensor([0, 1, 2])
    t = t.to(DEVICE)
    with pytest.raises(ValueError, match="unknown outputs"):
        fused_linear_logprob_stats(h, w, t, outputs=("entropy", "perplexity"))
    with pytest.raises(ValueError, match="outside"):
        fused_linear_logprob_stats(h, w, torch.tensor([0, 5, 1]).to(DEVICE))
    with pytest.raises(ValueError, match="target shape"):
        fused_linear_logprob_stats(h, w, torch.tensor([0, 1]).to(DEVICE))
    with pytest.raises(ValueError, match="softcap"):
        fused_linear_logprobs(h, w, t, softcap=0.0)


def test_fused_linear_logprobs_rejects_a_bad_temperature():
    with pytest.raises(ValueError, match="temperature"):
        fused_linear_logprobs(torch.randn(2, 4), torch.randn(5, 4), torch.zeros(2).long(),
                              temperature=0.0)  # fmt: skip


def test_sequence_logprobs_sum_and_mean_over_the_mask():
    lp = torch.tensor([[-1.0, -2.0, -4.0], [-0.5, -0.5, -9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert sequence_logprobs(lp, mask).tolist() == [-3.0, -0.5]
    assert sequence_logprobs(lp, mask, average=True).tolist() == [-1.5, -0.5]


def _logps(n: int = 7, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, generator=g) * 4 - 30).requires_grad_() for _ in range(4)]


def _neg_log_sigmoid(z: torch.Tensor) -> torch.Tensor:
    # written out, not F.logsigmoid: log(1 + exp(-z)), stable for either sign
    return torch.where(z > 0, torch.log1p(torch.exp(-z)), -z + torch.log1p(torch.exp(z)))


@pytest.mark.parametrize("loss_type", DPO_LOSS_TYPES)
@pytest.mark.parametrize("eps", [0.0, 0.15])
def test_dpo_loss_types_follow_their_formulas(loss_type, eps):
    c, r, rc, rr = _logps()
    beta = 0.3
    ignored = eps > 0 and loss_type != "robust"  # label smoothing is the robust loss's alone
    with pytest.warns(UserWarning, match="no effect") if ignored else warnings.catch_warnings():
        losses, chosen_rw, rejected_rw = dpo_loss(c, r, rc, rr, beta=beta, loss_type=loss_type,
                                                  label_smoothing=eps)  # fmt: skip
    h = (c - r) - (rc - rr)  # the implicit reward margin over the reference
    want = {
        "sigmoid": _neg_log_sigmoid(beta * h),
        "robust": ((1 - eps) * _neg_log_sigmoid(beta * h) - eps * _neg_log_sigmoid(-beta * h))
        / (1 - 2 * eps),
        "hinge": torch.clamp(1 - beta * h, min=0),
        "ipo": (h - 1 / (2 * beta)) ** 2,
    }[loss_type]
    torch.testing.assert_close(losses, want)
    torch.testing.assert_close(chosen_rw, beta * (c - rc).detach())
    torch.testing.assert_close(rejected_rw, beta * (r - rr).detach())
    got = torch.autograd.grad(losses.sum(), [c, r, rc, rr])
    ref = torch.autograd.grad(want.sum(), [c, r, rc, rr])
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b)


def test_dpo_reference_free_is_a_zero_reference():
    c, r, _, _ = _logps(seed=1)
    free, _, _ = dpo_loss(c, r, beta=0.5)
    zero, _, _ = dpo_loss(c, r, torch.zeros(7), torch.zeros(7), beta=0.5)
    torch.testing.assert_close(free, zero)


def test_dpo_says_what_is_wrong():
    c, r, rc, rr = _logps()
    with pytest.raises(ValueError, match="loss_type"):
        dpo_loss(c, r, rc, rr, loss_type="sigmoids")
    with pytest.raises(ValueError, match="both reference"):
        dpo_loss(c, r, rc, None)
    with pytest.raises(ValueError, match="label_smoothing"):
        dpo_loss(c, r, rc, rr, loss_type="robust", label_smoothing=0.5)
    with pytest.raises(ValueError, match="share a shape"):
        dpo_loss(c, r[:3], rc, rr)


def test_simpo_and_cpo_follow_their_formulas():
    c, r, _, _ = _logps(seed=2)
    losses, _, _ = simpo_loss(c / 10, r / 10, beta=2.0, gamma=0.5)
    torch.testing.assert_close(losses, _neg_log_sigmoid(2.0 * (c - r) / 10 - 0.5))
    losses, cw, _ = cpo_loss(c, r, beta=0.1, label_smoothing=0.1)
    want = 0.9 * _neg_log_sigmoid(0.1 * (c - r)) + 0.1 * _neg_log_sigmoid(-0.1 * (c - r))
    torch.testing.assert_close(losses, want)
    torch.testing.assert_close(cw, 0.1 * c.detach())


def _grpo_batch():
    logps = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.5, -2.5]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv = torch.tensor([1.0, -2.0])
    return logps, mask, adv


@pytest.mark.parametrize(
    ("loss_type", "kw", "want"),
    [
        # on-policy (ratio 1): per token -A; row 0 has two tokens of -1, row 1 three of +2
        ("grpo", {}, ((-2 / 2) + (6 / 3)) / 2),
        ("bnpo", {}, (-2 + 6) / 5),
        ("dr_grpo", {"max_completion_length": 4}, (-2 + 6) / (2 * 4)),
        ("dapo", {}, (-2 + 6) / 5),
        ("dapo", {"num_items_in_batch": 10}, (-2 + 6) / 10),
    ],
)
def test_grpo_loss_types_normalise_as_documented(loss_type, kw, want):
    logps, mask, adv = _grpo_batch()
    loss, metrics = grpo_loss(logps, adv, mask, loss_type=loss_type, **kw)
    assert loss.item() == pytest.approx(want)
    assert metrics["clip_ratio"].item() == 0.0
    # on-policy (ratio 1) the gradient is the advantage-weighted score, -A per token, times
    # the same normalisation; masked tokens get none
    (grad,) = torch.autograd.grad(loss, [logps])
    m = mask.float()
    weight = {
        "grpo": 1 / (m.sum(-1, keepdim=True) * 2),
        "bnpo": torch.tensor(1 / 5),
        "dr_grpo": torch.tensor(1 / 8),
        "dapo": torch.tensor(1 / kw.get("num_items_in_batch", 5)),
    }[loss_type]
    torch.testing.assert_close(grad, -adv[:, None] * weight * m)


def test_grpo_clipping_and_kl_follow_the_formula():
    logps, mask, adv = _grpo_batch()
    old = logps.detach() + torch.tensor([[0.5, -0.5, 0.0], [0.3, -0.3, 0.1]])
    ref = logps.detach() + 0.2
    beta, lo, hi = 0.05, 0.2, 0.28
    loss, metrics = grpo_loss(logps, adv, mask, old_logps=old, ref_logps=ref, beta=beta,
                              epsilon_low=lo, epsilon_high=hi, loss_type="bnpo")  # fmt: skip
    ratio = torch.exp(logps - old)
    a = adv[:, None]
    surrogate = torch.minimum(ratio * a, torch.clamp(ratio, 1 - lo, 1 + hi) * a)
    d = ref - logps
    kl = (torch.exp(d) - d - 1) * ratio  # times the ratio: the unbiased reverse-KL gradient
    m = mask.float()
    want = ((-surrogate + beta * kl) * m).sum() / m.sum()
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(metrics["kl"], (kl * m).sum().detach() / m.sum())
    clipped = ((ratio < 1 - lo) & (a < 0)) | ((ratio > 1 + hi) & (a > 0))
    torch.testing.assert_close(metrics["clip_ratio"], (clipped.float() * m).sum() / m.sum())
    assert 0 < metrics["clip_ratio"].item() < 1
    g1 = torch.autograd.grad(loss, [logps])[0]
    g2 = torch.autograd.grad(want, [logps])[0]
    torch.testing.assert_close(g1, g2)


def test_grpo_sequence_level_ratio_is_one_per_sequence():
    logps, mask, adv = _grpo_batch()
    old = logps.detach() + torch.tensor([[0.5, -0.1, 9.0], [0.3, -0.3, 0.1]])  # 9: masked
    loss, _ = grpo_loss(logps, adv, mask, old_logps=old, importance_sampling_level="sequence",
                        loss_type="grpo", epsilon_low=10.0)  # fmt: skip
    m = mask.float()
    seq = torch.exp(((logps - old) * m).sum(-1) / m.sum(-1))  # the masked mean log-ratio
    want = ((-(seq * adv)[:, None] * m).sum(-1) / m.sum(-1)).mean()
    torch.testing.assert_close(loss, want)


def test_grpo_says_what_is_wrong():
    logps, mask, adv = _grpo_batch()
    with pytest.raises(ValueError, match="ref_logps"):
        grpo_loss(logps, adv, mask, beta=0.1)
    with pytest.raises(ValueError, match="max_completion_length"):
        grpo_loss(logps, adv, mask, loss_type="dr_grpo")
    with pytest.raises(ValueError, match="loss_type"):
        grpo_loss(logps, adv, mask, loss_type="ppo")
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        grpo_loss(logps[0], adv, mask)


def _trl_style_divergence(s_logits, t_logits, beta, temperature):
    # F.kl_div(input, target, log_target=True) = exp(target) * (target - input)
    import torch.nn.functional as F

    s = torch.log_softmax(s_logits / temperature, -1)
    t = torch.log_softmax(t_logits / temperature, -1)
    if beta == 0:
        return F.kl_div(s, t, reduction="none", log_target=True).sum(-1)
    if beta == 1:
        return F.kl_div(t, s, reduction="none", log_target=True).sum(-1)
    b = torch.tensor(beta)
    m = torch.logsumexp(torch.stack([s + torch.log(1 - b), t + torch.log(b)]), dim=0)
    kl_t = F.kl_div(m, t, reduction="none", log_target=True).sum(-1)
    kl_s = F.kl_div(m, s, reduction="none", log_target=True).sum(-1)
    return beta * kl_t + (1 - beta) * kl_s


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("reduction", ["batchmean", "sum"])
def test_fused_linear_distill_matches_the_unfused_divergence(beta, reduction):
    g = torch.Generator().manual_seed(3)
    B, T, Hs, Ht, V = 2, 19, 16, 24, 41
    hs = torch.randn(B, T, Hs, generator=g).to(DEVICE).requires_grad_()
    ws = (torch.randn(V, Hs, generator=g) * 0.3).to(DEVICE).requires_grad_()
    bs = torch.randn(V, generator=g).to(DEVICE).requires_grad_()
    ht = torch.randn(B, T, Ht, generator=g).to(DEVICE)
    wt = (torch.randn(V, Ht, generator=g) * 0.3).to(DEVICE)
    labels = torch.randint(0, V, (B, T), generator=g).to(DEVICE)
    labels[:, :4] = -100  # the prompt
    got = fused_linear_distill(hs, ws, ht, wt, labels, student_bias=bs, beta=beta,
                               temperature=0.8, reduction=reduction, chunk_size=7)  # fmt: skip
    per_token = _trl_style_divergence(hs @ ws.T + bs, ht @ wt.T, beta, 0.8)
    keep = labels != -100
    want = per_token[keep].sum() / (keep.sum() if reduction == "batchmean" else 1)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    for a, b in zip(torch.autograd.grad(got * 1.7, [hs, ws, bs]),
                    torch.autograd.grad(want * 1.7, [hs, ws, bs]), strict=True):  # fmt: skip
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("beta", [0.0, 0.3, 1.0])
def test_fused_linear_distill_over_several_vocabulary_blocks_and_in_bf16(beta):
    # V > one block of the kernel (the online log-sum-exps rescale); then the same in bf16
    # under autocast against fp32 logits of the bf16-rounded inputs
    g = torch.Generator().manual_seed(11)
    N, H, V = 6, 8, 4103
    hs = torch.randn(N, H, generator=g).to(DEVICE).requires_grad_()
    ws = torch.randn(V, H, generator=g).to(DEVICE).requires_grad_()
    ht, wt = torch.randn(N, H, generator=g).to(DEVICE), torch.randn(V, H, generator=g).to(DEVICE)
    labels = torch.randint(0, V, (N,), generator=g).to(DEVICE)
    labels[0] = -100
    got = fused_linear_distill(hs, ws, ht, wt, labels, beta=beta, temperature=1.3)
    keep = labels != -100
    want = _trl_style_divergence(hs @ ws.T, ht @ wt.T, beta, 1.3)[keep].mean()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for a, b in zip(torch.autograd.grad(got, [hs, ws]), torch.autograd.grad(want, [hs, ws]),
                    strict=True):  # fmt: skip
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        got = fused_linear_distill(hs, ws, ht, wt, labels, beta=beta, temperature=1.3)
    bf = [x.bfloat16().float() for x in (hs, ws, ht, wt)]
    want = _trl_style_divergence(bf[0] @ bf[1].T, bf[2] @ bf[3].T, beta, 1.3)[keep].mean()
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=0.05, rtol=0.05)
    gh = torch.autograd.grad(got, hs)[0]
    assert gh.dtype == torch.float32 and torch.isfinite(gh).all() and gh.abs().sum() > 0


def test_fused_linear_distill_with_every_token_ignored_is_a_differentiable_zero():
    hs = torch.randn(4, 8).to(DEVICE).requires_grad_()
    w = torch.randn(11, 8).to(DEVICE)
    loss = fused_linear_distill(hs, w, torch.randn(4, 8).to(DEVICE), w,
                                torch.full((4,), -100).to(DEVICE))  # fmt: skip
    (g,) = torch.autograd.grad(loss, hs)
    assert loss.item() == 0 and (g == 0).all()


def test_fused_linear_distill_says_what_is_wrong():
    h, w = torch.randn(3, 4, device=DEVICE), torch.randn(5, 4, device=DEVICE)
    with pytest.raises(ValueError, match="beta"):
        fused_linear_distill(h, w, h, w, beta=1.5)
    with pytest.raises(ValueError, match="vocabularies"):
        fused_linear_distill(h, w, h, torch.randn(6, 4, device=DEVICE))
    with pytest.raises(ValueError, match="reduction"):
        fused_linear_distill(h, w, h, w, reduction="mean")


def test_orpo_follows_its_formula():
    g = torch.Generator().manual_seed(4)
    c = (-torch.rand(6, generator=g) * 3 - 0.05).requires_grad_()  # mean log-probs < 0
    r = (-torch.rand(6, generator=g) * 3 - 0.05).requires_grad_()
    losses, cw, rw, log_odds = orpo_loss(c, r, beta=0.2)
    odds = lambda lp: torch.exp(lp) / (1 - torch.exp(lp))  # noqa: E731  p / (1 - p)
    want_lo = torch.log(odds(c) / odds(r))
    torch.testing.assert_close(log_odds, want_lo.detach())
    want = 0.2 * _neg_log_sigmoid(want_lo)
    torch.testing.assert_close(losses, want)
    torch.testing.assert_close(cw, 0.2 * c.detach())
    for a, b in zip(torch.autograd.grad(losses.sum(), [c, r]),
                    torch.autograd.grad(want.sum(), [c, r]), strict=True):  # fmt: skip
        torch.testing.assert_close(a, b)


def test_kto_follows_its_formula():
    c, r, rc, rr = _logps(n=5, seed=5)
    losses, cw, rw = kto_loss(c, r[:3], rc, rr[:3], kl=torch.tensor(0.4), beta=0.3,
                              desirable_weight=1.5, undesirable_weight=0.7)  # fmt: skip
    z = 0.4
    want = torch.cat([1.5 * (1 - torch.sigmoid(0.3 * ((c - rc) - z))),
                      0.7 * (1 - torch.sigmoid(0.3 * (z - (r[:3] - rr[:3]))))])  # fmt: skip
    torch.testing.assert_close(losses, want)
    torch.testing.assert_close(rw, 0.3 * (r[:3] - rr[:3]).detach())
    # a negative KL estimate counts as 0, and the estimate gets no gradient
    kl = torch.tensor(-1.0, requires_grad=True)
    zero, _, _ = kto_loss(c, r, rc, rr, kl=kl)
    torch.testing.assert_close(zero, kto_loss(c, r, rc, rr, kl=0.0)[0])
    assert torch.autograd.grad(zero.sum(), [kl], allow_unused=True)[0] is None


# ---- lm_heads as models hold them: PEFT LoRA (tied, FSDP2 and DDP: test_losses_training.py) --


def _head_logps_ref(head, hidden, target):
    logp = head(hidden).float().log_softmax(-1)
    keep = target != -100
    return torch.where(keep, logp.gather(-1, target.clamp(min=0)[..., None])[..., 0], 0.0)


def test_head_weight_of_a_lora_lm_head_gives_the_modules_log_probs_and_gradients():
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=61, hidden_size=16, intermediate_size=32,
                                   num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=1, tie_word_embeddings=True)  # fmt: skip
    model = transformers.LlamaForCausalLM(cfg).to(DEVICE)
    lora = peft.LoraConfig(r=4, target_modules=["lm_head"], lora_dropout=0.0)
    head = peft.get_peft_model(model, lora).get_output_embeddings()
    with torch.no_grad():  # B starts at zero: make the adapter matter
        head.lora_B["default"].weight.normal_()
    hidden = torch.randn(2, 9, 16, device=DEVICE, requires_grad=True)
    target = torch.randint(0, 61, (2, 9), device=DEVICE)
    target[0, :3] = -100
    weight, bias = kernelwright_losses.head_weight(head)
    got = fused_linear_logprobs(hidden, weight, target, bias=bias)
    want = _head_logps_ref(head, hidden, target)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    params = [hidden, head.lora_A["default"].weight, head.lora_B["default"].weight]
    dy = torch.randn(got.shape, device=DEVICE)
    for a, b in zip(torch.autograd.grad(got, params, dy), torch.autograd.grad(want, params, dy),
                    strict=True):  # fmt: skip
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    # tied: the base weight is the input embedding itself
    assert head.base_layer.weight is model.get_input_embeddings().weight
    # dropout on the head's input cannot be merged into a weight
    head.lora_dropout["default"] = torch.nn.Dropout(0.1)
    head.train()
    with pytest.raises(ValueError, match="dropout"):
        kernelwright_losses.head_weight(head)
