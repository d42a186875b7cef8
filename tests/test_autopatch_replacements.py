"""The MLP replacement's recompute path: same output and gradients as down(act(...)), and the
activation output is not among the tensors autograd keeps."""

import pytest
import torch
from conftest import DEVICE

from kernelwright.integrations.transformers.replacements import mlp_forward
from kernelwright.profiles.model import MLPDecision

LAYOUTS = {
    "separate": dict(
        activation="swiglu", gate_attribute="gate", up_attribute="up", down_attribute="down"
    ),
    "fused_gate_up": dict(activation="geglu_tanh", gate_up_attribute="gu", down_attribute="down"),
    "non_gated": dict(activation="relu_squared", up_attribute="up", down_attribute="down"),
}


class _MLP(torch.nn.Module):
    def __init__(self, h, i, bias):
        super().__init__()
        self.gate = torch.nn.Linear(h, i, bias=bias)
        self.up = torch.nn.Linear(h, i, bias=bias)
        self.gu = torch.nn.Linear(h, 2 * i, bias=bias)
        self.down = torch.nn.Linear(i, h, bias=bias)


def _saved_numels(fn):
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sizes


@pytest.fixture(autouse=True)
def _on_device():
    with torch.device(DEVICE):  # CUDA on a GPU machine, the CPU under the interpreter
        yield


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("bias", [False, True])
def test_recompute_matches_the_stored_path(layout, bias):
    torch.manual_seed(0)
    d = MLPDecision(class_name="M", layout=layout, **LAYOUTS[layout])
    m = _MLP(24, 40, bias)
    x = torch.randn(3, 5, 24, requires_grad=True)
    results = {}
    for recompute in (False, True):
        m.zero_grad()
        x.grad = None
        y, saved = _saved_numels(lambda r=recompute: mlp_forward(d, recompute=r)(m, x))
        dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(1), device="cpu")
        y.backward(dy.to(y.device))
        grads = [p.grad.clone() for p in m.parameters() if p.grad is not None]
        results[recompute] = (y.detach(), x.grad.clone(), grads, saved)
    (y0, dx0, g0, s0), (y1, dx1, g1, s1) = results[False], results[True]
    torch.testing.assert_close(y1, y0, rtol=0, atol=0)
    torch.testing.assert_close(dx1, dx0, rtol=1e-5, atol=1e-6)
    assert len(g1) == len(g0) and len(g0) >= 2
    for a, b in zip(g1, g0, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # the stored path keeps the [15, 40] activation output for down's weight gradient
    assert sum(s1) < sum(s0) and sum(s0) - sum(s1) >= 15 * 40


def test_recompute_falls_back_for_a_wrapped_down_projection():
    # a LoRA-style wrapper's own forward must run: the plain path is taken, same output
    d = MLPDecision(class_name="M", layout="separate", **LAYOUTS["separate"])
    m = _MLP(8, 16, False)

    class Wrapped(torch.nn.Linear):
        calls = 0

        def forward(self, x):
            Wrapped.calls += 1
            return super().forward(x)

    w = Wrapped(16, 8, bias=False)
    w.load_state_dict(m.down.state_dict())
    m.down = w
    x = torch.randn(2, 8, requires_grad=True)
    mlp_forward(d)(m, x).sum().backward()
    assert Wrapped.calls == 1 and m.down.weight.grad is not None
