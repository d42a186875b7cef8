"""kernelwright.compile: the graph pass replaces patterns written as users write them.

Every test compiles a small function or module, checks outputs and gradients against eager
(fp32), and counts the kernel launches of the replaced sites at run time — a rewrite that did
not happen launches nothing and fails. CPU, the interpreter, tiny shapes: Inductor compiles
for the CPU around our custom ops.
"""

import logging

import pytest
import torch
import torch.nn.functional as F

import kernelwright
from kernelwright.compile import CompileReport, passes
from kernelwright.ops import _gated
from kernelwright.ops import rms_norm as rms_norm_mod
from kernelwright.ops import softmax as softmax_mod

pytestmark = pytest.mark.compile

ATOL, RTOL = 2e-5, 2e-5


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def launches(monkeypatch):
    """Counts the forward and backward launches of the kernels the pass inserts."""
    counts: dict[str, int] = {}

    def counting(module, name, key):
        orig = getattr(module, name)

        def wrapper(*args, **kwargs):
            k = key(args) if callable(key) else key
            counts[k] = counts.get(k, 0) + 1
            return orig(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    counting(rms_norm_mod, "rms_norm_fwd_launch", "rms_norm.fwd")
    counting(rms_norm_mod, "rms_norm_bwd_launch", "rms_norm.bwd")
    counting(_gated, "gated_fwd_launch", lambda a: f"{a[0]}.fwd")
    counting(_gated, "gated_bwd_launch", lambda a: f"{a[0]}.bwd")
    counting(softmax_mod, "softmax_fwd_launch", lambda a: ("log_" if a[2] else "") + "softmax.fwd")
    counting(softmax_mod, "softmax_bwd_launch", lambda a: ("log_" if a[3] else "") + "softmax.bwd")
    return counts


def _leaves(*shapes, dtype=torch.float32):
    return [torch.randn(*s, dtype=dtype, requires_grad=True) for s in shapes]


def _check_against_eager(fn, compiled, inputs, params=()):
    """Outputs and the gradients of inputs and params of compiled == eager."""
    leaves = [*inputs, *params]
    out = compiled(*inputs)
    torch.manual_seed(1)
    dy = torch.randn_like(out)
    got = torch.autograd.grad(out, leaves, dy)
    want_out = fn(*inputs)
    want = torch.autograd.grad(want_out, leaves, dy)
    torch.testing.assert_close(out, want_out, atol=ATOL, rtol=RTOL)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=ATOL, rtol=RTOL)


def _summary(report):
    return [(s.op, s.replaced, s.impl) for s in report]


# --------------------------------------------------------------------------- RMSNorm


def test_llama_rms_norm_module(launches):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    norm = LlamaRMSNorm(48, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(48))
    report = CompileReport()
    compiled = kernelwright.compile(norm, report=report, fullgraph=True)
    (x,) = _leaves((2, 3, 48))
    _check_against_eager(norm, compiled, [x], [norm.weight])
    assert _summary(report) == [("rms_norm", True, "kernelwright")]
    assert report.graphs == 1 and report[0].shapes == {"x": (2, 3, 48), "weight": (48,)}
    assert launches == {"rms_norm.fwd": 1, "rms_norm.bwd": 1}


def test_rms_norm_without_casts_and_without_weight(launches):
    def fn(x, w):
        a = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w  # casting "none"
        b = a.float()
        return b * (b * b).mean(dim=-1, keepdim=True).add(1e-6).rsqrt()  # no weight

    torch.manual_seed(0)
    x, w = _leaves((5, 40), (40,))
    report = CompileReport()
    compiled = kernelwright.compile(fn, report=report, fullgraph=True)
    _check_against_eager(fn, compiled, [x, w])
    assert [s.pattern for s in report] == ["rms_norm", "rms_norm (no weight)"]
    assert all(s.replaced for s in report)
    assert launches == {"rms_norm.fwd": 2, "rms_norm.bwd": 2}


# --------------------------------------------------------------------------- activations


@pytest.mark.parametrize(
    "act, key",
    [
        (F.silu, "silu"),
        (lambda g: F.gelu(g, approximate="tanh"), "gelu_tanh"),
        (F.gelu, "gelu_erf"),
    ],
    ids=["silu", "gelu-tanh", "gelu-none"],
)
def test_gated_mlp(launches, act, key):
    def fn(g, u):
        return act(g) * u

    torch.manual_seed(0)
    g, u = _leaves((3, 2, 40), (3, 2, 40))
    report = CompileReport()
    _check_against_eager(fn, kernelwright.compile(fn, report=report, fullgraph=True), [g, u])
    assert _summary(report) == [("swiglu" if key == "silu" else "geglu", True, "kernelwright")]
    assert launches == {f"{key}.fwd": 1, f"{key}.bwd": 1}  # the activation asked for


def test_relu_squared_spellings(launches):
    def fn(x):
        return F.relu(x) ** 2 + torch.square(torch.relu(x * 2))

    torch.manual_seed(0)
    (x,) = _leaves((4, 33))
    report = CompileReport()
    _check_against_eager(fn, kernelwright.compile(fn, report=report, fullgraph=True), [x])
    assert _summary(report) == [("relu_squared", True, "kernelwright")] * 2
    assert launches == {"relu_squared.fwd": 2, "relu_squared.bwd": 2}


def test_softmax_spellings_through_torch_compile(launches):
    """The same pass as a backend of a torch.compile the user calls."""

    def fn(x):
        return torch.softmax(x, -1) + F.softmax(x * 3, dim=-1) * F.log_softmax(x, -1)

    torch.manual_seed(0)
    (x,) = _leaves((6, 50))
    report = CompileReport()
    backend = kernelwright.compile_backend(report=report)
    _check_against_eager(fn, torch.compile(fn, backend=backend, fullgraph=True), [x])
    assert [s.pattern for s in report] == [
        "softmax(x, dim=-1)",
        "softmax(x, dim=-1)",
        "log_softmax(x, dim=-1)",
    ]
    assert all(s.replaced for s in report)
    assert launches == {"softmax.fwd": 2, "softmax.bwd": 2, "log_softmax.fwd": 1,
                        "log_softmax.bwd": 1}  # fmt: skip


# --------------------------------------------------------------------------- left alone


def test_sites_the_kernels_cannot_take_stay_with_inductor(launches, caplog, monkeypatch):
    def fn(x64, x, g, u):
        return (
            torch.softmax(x64, -1).sum()  # float64
            + torch.softmax(x, 0).sum()  # not the last dimension
            + (F.silu(g) * u).sum()  # up broadcasts over gate
        )

    torch.manual_seed(0)
    x64 = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    x, g, u = _leaves((3, 8), (3, 8), (8,))
    report = CompileReport()
    monkeypatch.setenv("KERNELWRIGHT_LOG", "registry")
    with caplog.at_level(logging.INFO, logger="kernelwright.compile"):
        compiled = kernelwright.compile(fn, report=report, fullgraph=True)
        _check_against_eager(fn, compiled, [x64, x, g, u])
    assert [s.replaced for s in report] == [False, False, False]
    reasons = [s.reason for s in report]
    assert "float64" in reasons[0]
    assert "not the last dimension" in reasons[1]
    assert "broadcasts" in reasons[2]
    assert launches == {}
    lines = [r.getMessage() for r in caplog.records if r.name == "kernelwright.compile"]
    assert len(lines) == 3 and all("left to the backend" in line for line in lines)


def test_selection_inductor_is_respected(launches, monkeypatch):
    class Inductor:
        op, impl, reason, measured = "swiglu", "inductor", "measured faster", True

    monkeypatch.setattr(passes, "choose", lambda op, **kw: Inductor())

    def fn(g, u):
        return F.silu(g) * u

    g, u = _leaves((2, 16), (2, 16))
    report = CompileReport()
    compiled = kernelwright.compile(fn, report=report, backend="aot_eager", fullgraph=True)
    _check_against_eager(fn, compiled, [g, u])
    assert _summary(report) == [("swiglu", False, "inductor")]
    assert report[0].reason == "measured faster"
    assert launches == {}


def test_graph_breaks_each_graph_rewritten(launches):
    def fn(x):
        y = torch.softmax(x, -1)
        print("", end="")  # a graph break
        return F.relu(y) ** 2

    (x,) = _leaves((2, 16))
    report = CompileReport()
    compiled = kernelwright.compile(fn, report=report, backend="aot_eager")
    _check_against_eager(fn, compiled, [x])
    assert report.graphs == 2
    assert [(s.graph, s.op, s.replaced) for s in report] == [
        (0, "softmax", True),
        (1, "relu_squared", True),
    ]
    assert sum(launches.values()) == 4


# --------------------------------------------------------------------------- HF modules


def test_hf_llama_norm_and_mlp(launches):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

    cfg = LlamaConfig(
        hidden_size=32, intermediate_size=48, num_attention_heads=2, num_key_value_heads=2
    )
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
            self.mlp = LlamaMLP(cfg)

        def forward(self, x):
            return x + self.mlp(self.norm(x))

    block = Block()
    with torch.no_grad():
        block.norm.weight.copy_(torch.rand(cfg.hidden_size) + 0.5)
    report = CompileReport()
    compiled = kernelwright.compile(block, report=report, fullgraph=True)
    (x,) = _leaves((2, 5, cfg.hidden_size))
    _check_against_eager(block, compiled, [x], list(block.parameters()))
    assert _summary(report) == [
        ("rms_norm", True, "kernelwright"),
        ("swiglu", True, "kernelwright"),
    ]
    assert launches == {"rms_norm.fwd": 1, "rms_norm.bwd": 1, "silu.fwd": 1, "silu.bwd": 1}


def test_shared_intermediate_left_alone_and_module_paths(launches):
    def fn(x):
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return x * r + r  # the rsqrt is read outside the pattern too

    (x,) = _leaves((3, 16))
    report = CompileReport()
    compiled = kernelwright.compile(fn, report=report, backend="aot_eager", fullgraph=True)
    _check_against_eager(fn, compiled, [x])
    assert [(s.op, s.replaced) for s in report] == [("rms_norm", False)]
    assert "also used outside the pattern" in report[0].reason
    assert launches == {}
    # kernelwright.compile is the function and the package at once
    import kernelwright.compile.passes as p

    assert p is passes and callable(kernelwright.compile)
