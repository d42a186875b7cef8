"""fused_linear_logprobs(..., backward="stored") against the default recomputing backward and
the unfused logits: values, gradients, and what the forward keeps for the backward."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE

from kernelwright.losses import (
    fused_linear_logprob_stats,
    fused_linear_logprobs,
    fused_linear_logprobs_ref,
)


def _inputs(seed, T, H, V, *, head_grad, bias=False, ignore_index=-100):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(2, T, H, generator=g).to(DEVICE).requires_grad_()
    weight = (torch.randn(V, H, generator=g) * 0.4).to(DEVICE).requires_grad_(head_grad)
    b = torch.randn(V, generator=g).to(DEVICE).requires_grad_(head_grad) if bias else None
    target = torch.randint(0, V, (2, T), generator=g).to(DEVICE)
    target[0, :4] = ignore_index  # a prompt
    target[1, -1] = ignore_index  # padding
    dl = torch.randn(2, T, generator=g).to(DEVICE)
    de = torch.randn(2, T, generator=g).to(DEVICE)
    return hidden, weight, b, target, dl, de


def _saved_shapes(fn):
    """The shapes of the tensors autograd keeps from the forward `fn` runs, and its result."""
    shapes = []

    def pack(x):
        shapes.append(tuple(x.shape))
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        out = fn()
    return shapes, out


CASES = [
    # trainable head: the logits are kept
    dict(head_grad=True, bias=True, entropy=False, kw=dict(temperature=0.7)),
    dict(head_grad=True, bias=False, entropy=True, kw=dict(softcap=3.0, logit_scale=1.3)),
    # frozen head: the log-probs' hidden-gradient rows are kept
    dict(head_grad=False, bias=True, entropy=False, kw=dict(temperature=0.8, softcap=4.0)),
    dict(head_grad=False, bias=False, entropy=False, kw=dict(ignore_index=7)),
    # frozen head with entropy: the logits are kept
    dict(head_grad=False, bias=False, entropy=True, kw=dict(temperature=1.2)),
]


@pytest.mark.parametrize("case", CASES, ids=range(len(CASES)))
def test_stored_backward_matches_the_recomputing_one_and_the_logits(case):
    T, H, V = 13, 12, 37  # odd sizes; chunks of 5 scored tokens leave a short last chunk
    ignore = case["kw"].get("ignore_index", -100)
    hidden, weight, bias, target, dl, de = _inputs(
        len(str(case)), T, H, V, head_grad=case["head_grad"], bias=case["bias"],
        ignore_index=ignore,
    )  # fmt: skip
    kw = dict(bias=bias, return_entropy=case["entropy"], **case["kw"])
    params = [p for p in (hidden, weight, bias) if p is not None and p.requires_grad]

    def run(backward):
        out = fused_linear_logprobs(hidden, weight, target, chunk_size=5, backward=backward, **kw)
        return out if case["entropy"] else (out,)

    def loss(out):
        return sum((o * d).sum() for o, d in zip(out, (dl, de)[: len(out)], strict=True))

    saved, stored = _saved_shapes(lambda: run("stored"))
    saved_rec, recomputed = _saved_shapes(lambda: run("recompute"))
    want = fused_linear_logprobs_ref(hidden, weight, target, **kw)
    want = want if case["entropy"] else (want,)
    keep = target != ignore
    for got, rec, ref in zip(stored, recomputed, want, strict=True):
        torch.testing.assert_close(got, rec, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(got, torch.where(keep, ref, 0.0), atol=2e-5, rtol=1e-5)
        assert (got[~keep] == 0).all()
    g_stored = torch.autograd.grad(loss(stored), params, retain_graph=True)
    g_rec = torch.autograd.grad(loss(recomputed), params)
    g_ref = torch.autograd.grad(loss([torch.where(keep, r, 0.0) for r in want]), params)
    for a, b, r in zip(g_stored, g_rec, g_ref, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(a, r, atol=1e-4, rtol=1e-4)
    # a second backward over the same graph gives the same gradients (nothing was consumed)
    again = torch.autograd.grad(loss(stored), params)
    for a, b in zip(again, g_stored, strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    # what the forward kept: [N, H] gradient rows alone, or the [N, V] logits (the
    # recomputing backward keeps none)
    n = int(keep.sum())
    assert (n, V) not in saved_rec
    if case["head_grad"] or case["entropy"]:
        assert saved.count((n, V)) == 1
    else:
        assert [x for x in saved if len(x) == 2] == [(n, H)]  # besides the token mask


def test_stored_backward_keeps_nothing_without_grad_mode_and_gives_the_same_values():
    hidden, weight, _, target, _, _ = _inputs(3, 9, 8, 29, head_grad=True)
    # "stored" runs on the statistics kernels: the same values as them, to the bit
    want = fused_linear_logprob_stats(hidden, weight, target, chunk_size=4, outputs=()).log_probs
    with torch.no_grad():
        got = fused_linear_logprobs(hidden, weight, target, chunk_size=4, backward="stored")
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    with torch.no_grad():
        saved, _ = _saved_shapes(lambda: fused_linear_logprobs(
            hidden, weight, target, backward="stored"))  # fmt: skip
    assert saved == []


def test_stored_rows_under_autocast_give_fp32_hidden_their_gradient():
    """A frozen bf16 head, fp32 hidden states under bf16 autocast: the gradient rows are
    accumulated in fp32 from the bf16 logits' gradient, as the recomputing backward does."""
    g = torch.Generator().manual_seed(11)
    T, H, V = 10, 16, 45
    hidden = torch.randn(T, H, generator=g).to(DEVICE).requires_grad_()
    weight = (torch.randn(V, H, generator=g) * 0.3).to(DEVICE, torch.bfloat16)
    target = torch.randint(0, V, (T,), generator=g).to(DEVICE)
    dl = torch.randn(T, generator=g).to(DEVICE)
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        got = fused_linear_logprobs(hidden, weight, target, backward="stored")
        rec = fused_linear_logprobs(hidden, weight, target)
    torch.testing.assert_close(got, rec, atol=1e-2, rtol=1e-2)
    (gh,) = torch.autograd.grad((got * dl).sum(), hidden)
    (rh,) = torch.autograd.grad((rec * dl).sum(), hidden)
    want = fused_linear_logprobs_ref(hidden.bfloat16(), weight, target)
    (wh,) = torch.autograd.grad((want * dl).sum(), hidden)
    assert gh.dtype == torch.float32
    torch.testing.assert_close(gh, rh, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(gh, wh, atol=2e-2, rtol=2e-2)


def test_stored_backward_with_every_token_ignored_and_a_bad_option():
    hidden, weight, _, target, _, _ = _inputs(5, 3, 4, 11, head_grad=False)
    target[:] = -100
    st = fused_linear_logprob_stats(hidden, weight, target, outputs=(), backward="stored")
    assert (st.log_probs == 0).all()
    (gh,) = torch.autograd.grad(st.log_probs.sum(), hidden)
    assert (gh == 0).all()
    with pytest.raises(ValueError, match="backward must be one of"):
        fused_linear_logprobs(hidden, weight, target, backward="keep")


@pytest.mark.parametrize("backward", ["stored", "recompute"])
def test_metric_entropy_keeps_gradient_rows_and_refuses_a_gradient(backward):
    """entropy_grad=False (an entropy that is logged, not trained on): the same values and
    log-prob gradients as with a differentiable entropy; with a frozen head the stored backward
    keeps the [N, H] rows instead of the [N, V] logits; a gradient reaching the entropy raises."""
    T, H, V = 11, 12, 41
    hidden, weight, bias, target, dl, _ = _inputs(21, T, H, V, head_grad=False, bias=True)
    kw = dict(bias=bias, temperature=0.9, return_entropy=True, chunk_size=4, backward=backward)
    saved, (lp, ent) = _saved_shapes(
        lambda: fused_linear_logprobs(hidden, weight, target, entropy_grad=False, **kw)
    )
    lp_d, ent_d = fused_linear_logprobs(hidden, weight, target, **kw)
    ref_lp, ref_ent = fused_linear_logprobs_ref(hidden, weight, target, bias=bias,
                                                temperature=0.9, return_entropy=True)  # fmt: skip
    keep = target != -100
    torch.testing.assert_close(lp, lp_d, atol=0, rtol=0)
    torch.testing.assert_close(ent, ent_d, atol=0, rtol=0)
    torch.testing.assert_close(ent, torch.where(keep, ref_ent, 0.0), atol=2e-5, rtol=1e-5)
    (g,) = torch.autograd.grad((lp * dl).sum(), hidden, retain_graph=True)
    (g_d,) = torch.autograd.grad((lp_d * dl).sum(), hidden)
    (g_ref,) = torch.autograd.grad((torch.where(keep, ref_lp, 0.0) * dl).sum(), hidden)
    torch.testing.assert_close(g, g_d, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(g, g_ref, atol=1e-4, rtol=1e-4)
    n = int(keep.sum())
    assert (n, V) not in saved
    if backward == "stored":
        assert [x for x in saved if len(x) == 2] == [(n, H)]
    with pytest.raises(RuntimeError, match="entropy_grad=False"):
        torch.autograd.grad((lp * dl + ent).sum(), hidden)
