"""What every op promises autograd, whatever the caller passes:

- a second derivative (`create_graph=True`, then a backward through the gradient) raises, never
  silently drops the second-order term: the backward kernels are not differentiable;
- a gradient taken with `create_graph=True` of something else in the same graph still works;
- norm weights and biases that are views (a strided slice of a packed parameter, an expanded
  scalar) give the values and gradients of the contiguous ones;
- the log-prob statistics are 0, with no gradient, at ignored tokens also when every token is
  ignored or every token is computed (the traced path).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICE

import kernelwright as kw
from kernelwright.losses import fused_linear_logprob_stats, fused_linear_logprobs
from kernelwright.losses import logprobs as logprobs_module

M, N = 6, 24


def _x(seed=0, shape=(M, N)):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(DEVICE).requires_grad_(True)


def _w(seed=1, n=N):
    g = torch.Generator().manual_seed(seed)
    return (1 + 0.3 * torch.randn(n, generator=g)).to(DEVICE)


def _targets(v=N):
    return torch.randint(0, v, (M,), generator=torch.Generator().manual_seed(2)).to(DEVICE)


def _rope(x):
    q = x.view(1, 2, M, N // 2)
    cos, sin = kw.rope_tables(M, N // 2, device=DEVICE)
    return kw.rope(q, q.detach().clone(), cos, sin)[0]


# op name -> a function of x [M, N] (requires grad) whose output depends on x non-linearly
OPS = {
    "rms_norm": lambda x: kw.rms_norm(x, _w()),
    "fused_add_rms_norm": lambda x: kw.fused_add_rms_norm(x, x.detach() * 0.5, _w())[0],
    "layer_norm": lambda x: kw.layer_norm(x, _w(), _w(3)),
    "softmax": kw.softmax,
    "log_softmax": kw.log_softmax,
    "swiglu": lambda x: kw.swiglu_fused(x),
    "geglu": lambda x: kw.geglu_fused(x),
    "relu_squared": kw.relu_squared,
    "rope": _rope,
    "cross_entropy": lambda x: kw.cross_entropy(x, _targets(), reduction="none"),
    "fused_linear_cross_entropy": lambda x: kw.fused_linear_cross_entropy(
        x, _w(4, N * N).view(N, N), _targets(), reduction="none"
    ),
    "fused_linear_logprobs": lambda x: fused_linear_logprobs(
        x, _w(4, N * N).view(N, N), _targets()
    ),
}


@pytest.mark.parametrize("name", list(OPS))
def test_second_derivative_raises(name):
    x = _x()
    (g,) = torch.autograd.grad(OPS[name](x).pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice|automatic differentiation"):
        g.pow(2).sum().backward()


def test_create_graph_elsewhere_in_the_graph_works():
    x, z = _x(), torch.randn(3, device=DEVICE, requires_grad=True)
    loss = kw.softmax(x).pow(2).sum() + z.pow(3).sum()
    (gz,) = torch.autograd.grad(loss, z, create_graph=True)
    gz.sum().backward()
    torch.testing.assert_close(z.grad, 6 * z.detach())


def _rms_ref(x, w):
    x32 = x.float()
    return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()


VIEWS = {
    "strided": lambda base: base[::2],  # every other element of a packed [2N] parameter
    "expanded": lambda base: base[:1].expand(N),  # one scalar broadcast over the row
}


@pytest.mark.parametrize("view", list(VIEWS))
@pytest.mark.parametrize("op", ["rms_norm", "fused_add_rms_norm", "layer_norm"])
def test_norm_parameters_that_are_views(op, view):
    base = _w(5, 2 * N).requires_grad_(True)
    bias_base = _w(6, 2 * N).requires_grad_(True)
    w, b = VIEWS[view](base), VIEWS[view](bias_base)
    x, res = _x(), _x(7).detach()
    if op == "rms_norm":
        out, ref = kw.rms_norm(x, w), _rms_ref(x, w)
    elif op == "fused_add_rms_norm":
        out, ref = kw.fused_add_rms_norm(x, res, w)[0], _rms_ref(x + res, w)
    else:
        out, ref = kw.layer_norm(x, w, b), F.layer_norm(x, (N,), w, b)
    dy = torch.randn_like(ref)
    leaves = [x, base] + ([bias_base] if op == "layer_norm" else [])
    got = torch.autograd.grad(out, leaves, dy)
    want = torch.autograd.grad(ref, leaves, dy)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g, r, atol=1e-4, rtol=1e-4)


def _head():
    g = torch.Generator().manual_seed(8)
    hidden = torch.randn(2, 5, 16, generator=g).to(DEVICE).requires_grad_(True)
    weight = (0.3 * torch.randn(37, 16, generator=g)).to(DEVICE)
    return hidden, weight


def test_logprob_stats_all_ignored_are_zero():
    hidden, weight = _head()
    target = torch.full((2, 5), -100, device=DEVICE)
    lp, ent = fused_linear_logprobs(hidden, weight, target, return_entropy=True)
    assert lp.abs().max() == 0 and ent.abs().max() == 0
    ent.sum().backward()
    assert hidden.grad.abs().max() == 0
    for name, x in fused_linear_logprob_stats(hidden, weight, target)._asdict().items():
        assert x.float().abs().max() == 0, name


def test_logprob_stats_every_token_computed_zero_at_ignored(monkeypatch):
    # a traced call computes every token (no mask from a host sync): as the eager path's values
    hidden, weight = _head()
    target = torch.randint(0, 37, (2, 5), generator=torch.Generator().manual_seed(9))
    target[0, :2] = -100
    target = target.to(DEVICE)
    eager = fused_linear_logprob_stats(hidden, weight, target)
    monkeypatch.setattr(logprobs_module, "_scored_checked", lambda *a: None)
    every = fused_linear_logprob_stats(hidden, weight, target)
    for name in eager._fields:
        a, b = getattr(eager, name), getattr(every, name)
        assert b[0, :2].float().abs().max() == 0, name
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
