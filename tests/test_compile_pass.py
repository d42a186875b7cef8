"""kernelwright.compile: the graph pass replaces patterns written as users write them.

Every test compiles a small function or module, checks outputs and gradients against eager
(fp32), and counts the kernel launches of the replaced sites at run time — a rewrite that did
not happen launches nothing and fails. Tiny shapes on the suite's device (every tensor and
module is made there): on CPU through the interpreter, with Inductor compiling for the CPU
around our custom ops; on a GPU through the compiled kernels.
"""

import logging

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICE

import kernelwright
from kernelwright.compile import CompileReport, passes
from kernelwright.ops import _gated
from kernelwright.ops import cross_entropy as cross_entropy_mod
from kernelwright.ops import fused_add_rms_norm as fused_add_mod
from kernelwright.ops import fused_linear_cross_entropy as flce_mod
from kernelwright.ops import layer_norm as layer_norm_mod
from kernelwright.ops import rms_norm as rms_norm_mod
from kernelwright.ops import rope as rope_mod
from kernelwright.ops import softmax as softmax_mod

pytestmark = pytest.mark.compile

ATOL, RTOL = 2e-5, 2e-5


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    torch.set_default_device(DEVICE)  # the tests' tensors and modules, on the suite's device
    try:
        yield
    finally:
        torch.set_default_device(None)
        torch._dynamo.reset()


@pytest.fixture
def launches(monkeypatch):
    """Counts the forward and backward launches of the kernels the pass inserts."""
    counts: dict[str, int] = {}

    def counting(module, name, key):
        orig = getattr(module, name)
        depth = [0]  # a launcher that calls itself (layer_norm's backward) counts once

        def wrapper(*args, **kwargs):
            if depth[0] == 0:
                k = key(args) if callable(key) else key
                counts[k] = counts.get(k, 0) + 1
            depth[0] += 1
            try:
                return orig(*args, **kwargs)
            finally:
                depth[0] -= 1

        monkeypatch.setattr(module, name, wrapper)

    counting(rms_norm_mod, "rms_norm_fwd_launch", "rms_norm.fwd")
    counting(rms_norm_mod, "rms_norm_bwd_launch", "rms_norm.bwd")
    counting(_gated, "gated_fwd_launch", lambda a: f"{a[0]}.fwd")
    counting(_gated, "gated_bwd_launch", lambda a: f"{a[0]}.bwd")
    counting(softmax_mod, "softmax_fwd_launch", lambda a: ("log_" if a[2] else "") + "softmax.fwd")
    counting(softmax_mod, "softmax_bwd_launch", lambda a: ("log_" if a[3] else "") + "softmax.bwd")
    counting(layer_norm_mod, "layer_norm_fwd_launch", "layer_norm.fwd")
    counting(layer_norm_mod, "layer_norm_bwd_launch", "layer_norm.bwd")
    counting(fused_add_mod, "fused_add_rms_norm_fwd_launch", "fused_add_rms_norm.fwd")
    counting(fused_add_mod, "fused_add_rms_norm_bwd_launch", "fused_add_rms_norm.bwd")
    counting(cross_entropy_mod, "cross_entropy_fwd_launch", "cross_entropy.fwd")
    counting(cross_entropy_mod, "cross_entropy_scale_launch", "cross_entropy.bwd")
    counting(flce_mod, "cross_entropy_fwd_launch", "fused_linear_cross_entropy.chunk")
    counting(rope_mod, "rope_fwd_launch", "rope.fwd")
    counting(rope_mod, "rope_bwd_launch", "rope.bwd")
    return counts


def _leaves(*shapes, dtype=torch.float32):
    return [torch.randn(*s, dtype=dtype, requires_grad=True) for s in shapes]


def _check_against_eager(fn, compiled, inputs, params=()):
    """Outputs and the gradients of inputs and params (those requiring one) of compiled ==
    eager; fp32 to ATOL/RTOL, other dtypes to assert_close's own tolerance for them."""
    leaves = [t for t in (*inputs, *params) if t.requires_grad]
    out = compiled(*inputs)
    torch.manual_seed(1)
    dy = torch.randn_like(out)
    got = torch.autograd.grad(out, leaves, dy)
    want_out = fn(*inputs)
    want = torch.autograd.grad(want_out, leaves, dy)
    torch.testing.assert_close(out, want_out, atol=ATOL, rtol=RTOL)
    for g, w in zip(got, want, strict=True):
        tol = {"atol": ATOL, "rtol": RTOL} if w.dtype == torch.float32 else {}
        torch.testing.assert_close(g, w, **tol)


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


def test_fused_add_rms_norm_residual_stream(launches):
    """A pre-norm decoder as Hugging Face writes it: every norm that reads a residual sum
    becomes fused_add_rms_norm, whose second result is that sum for the next residual add."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.input_norm, self.post_norm = LlamaRMSNorm(24), LlamaRMSNorm(24)
            self.attn, self.mlp = torch.nn.Linear(24, 24), torch.nn.Linear(24, 24)

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([Layer(), Layer()])
            self.norm, self.other = LlamaRMSNorm(24), LlamaRMSNorm(24)
            self.shift = torch.nn.Parameter(torch.randn(24))

        def forward(self, h):
            for layer in self.layers:
                residual = h
                h = layer.input_norm(h)
                h = layer.attn(h)
                h = residual + h
                residual = h
                h = layer.post_norm(h)
                h = layer.mlp(h)
                h = residual + h
            return self.norm(h) + self.other(h + self.shift)  # h + shift broadcasts: unfused

    torch.manual_seed(0)
    model = Decoder()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.copy_(torch.rand_like(p) + 0.5)
    report = CompileReport()
    compiled = kernelwright.compile(model, report=report, fullgraph=True)
    (x,) = _leaves((2, 3, 24))
    _check_against_eager(model, compiled, [x], list(model.parameters()))
    assert [(s.pattern, s.replaced) for s in report] == [("rms_norm", True)] + [
        ("rms_norm(x + residual)", True)
    ] * 4 + [("rms_norm", True)]
    assert report[1].shapes == {"x": (2, 3, 24), "residual": (2, 3, 24), "weight": (24,)}
    assert launches == {"rms_norm.fwd": 2, "rms_norm.bwd": 2, "fused_add_rms_norm.fwd": 4,
                        "fused_add_rms_norm.bwd": 4}  # fmt: skip


def test_fused_add_without_a_place_falls_back_to_rms_norm(launches):
    def fn(a, b, w0):
        s = a + b
        t = s * 3  # reads the sum before the weight exists: no place for the fused call
        w = w0 * 2
        return t + w * (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6))

    torch.manual_seed(0)
    a, b, w0 = _leaves((3, 16), (3, 16), (16,))
    report = CompileReport()
    compiled = kernelwright.compile(fn, report=report, backend="aot_eager", fullgraph=True)
    _check_against_eager(fn, compiled, [a, b, w0])
    assert [(s.pattern, s.replaced) for s in report] == [("rms_norm", True)]
    assert "reads the result before" in report[0].reason and "not fused" in report[0].reason
    assert launches == {"rms_norm.fwd": 1, "rms_norm.bwd": 1}


# --------------------------------------------------------------------------- LayerNorm


def test_layer_norm_spellings(launches):
    class Norms(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.affine = torch.nn.LayerNorm(24, eps=1e-6)
            self.plain = torch.nn.LayerNorm(24, elementwise_affine=False)

        def forward(self, x, w):
            return (
                self.affine(x)
                + self.plain(x * 2) * F.layer_norm(x, (24,), w, None, 1e-5)  # bias None
                + F.layer_norm(x, x.shape[-2:])  # over the last two dimensions: left alone
            )

    torch.manual_seed(0)
    norms = Norms()
    with torch.no_grad():
        norms.affine.weight.copy_(torch.rand(24) + 0.5)
        norms.affine.bias.copy_(torch.randn(24))
    x, w = _leaves((2, 3, 24), (24,))
    report = CompileReport()
    compiled = kernelwright.compile(norms, report=report, fullgraph=True)
    _check_against_eager(norms, compiled, [x, w], list(norms.parameters()))
    assert [(s.pattern, s.replaced) for s in report] == [
        ("layer_norm", True),
        ("layer_norm (no affine)", True),
        ("layer_norm", True),
        ("layer_norm (no affine)", False),
    ]
    assert "spans more than the last dimension" in report[3].reason
    assert report[0].shapes == {"x": (2, 3, 24), "weight": (24,), "bias": (24,)}
    assert launches == {"layer_norm.fwd": 3, "layer_norm.bwd": 3}


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


# --------------------------------------------------------------------------- RoPE


def test_rotate_half_rope(launches):
    """HF's apply_rotary_pos_emb ([B, H, S, D] with unsqueeze_dim=1, [B, S, H, D] with 2):
    one site for q and one for k, each a rope launch, values and gradients as eager's."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    def fn(q, k, cos, sin, q2, k2):
        a, b = apply_rotary_pos_emb(q, k, cos, sin)
        c, d = apply_rotary_pos_emb(q2, k2, cos[:1], sin[:1], unsqueeze_dim=2)
        return a.sum(1) + b.sum(1) + (c.sum(2) + d.sum(2)) * 0.5

    torch.manual_seed(0)
    q, k, q2, k2 = _leaves((2, 4, 6, 16), (2, 2, 6, 16), (2, 6, 4, 16), (2, 6, 2, 16))
    cos, sin = torch.randn(2, 6, 16), torch.randn(2, 6, 16)  # no gradient, as HF's
    report = CompileReport()
    compiled = kernelwright.compile(fn, report=report, fullgraph=True)
    _check_against_eager(fn, compiled, [q, k, cos, sin, q2, k2])
    assert _summary(report) == [("rope", True, "kernelwright")] * 4
    assert launches == {"rope.fwd": 4, "rope.bwd": 4}


def test_rope_sites_left_alone(launches):
    """Partial rotary written as HF writes it (the rotated slice is its own q) is replaced;
    cos/sin that require grad, or are float64 (eager promotes), are reported and left."""
    from transformers.models.llama.modeling_llama import rotate_half

    def fn(q, cos_r, sin_r, cos_g, sin_g, cos64, sin64):
        q_rot = q[..., :8]
        partial = q_rot * cos_r.unsqueeze(1) + rotate_half(q_rot) * sin_r.unsqueeze(1)
        grad = q * cos_g.unsqueeze(1) + rotate_half(q) * sin_g.unsqueeze(1)
        wide = q * cos64.unsqueeze(1) + rotate_half(q) * sin64.unsqueeze(1)
        return partial.sum() + grad.sum() + wide.sum()

    torch.manual_seed(0)
    (q,) = _leaves((2, 4, 6, 16))
    cos_r, sin_r = torch.randn(2, 6, 8), torch.randn(2, 6, 8)
    cos_g, sin_g = _leaves((2, 6, 16), (2, 6, 16))
    cos64, sin64 = torch.randn(2, 6, 16, dtype=torch.float64), torch.randn(2, 6, 16).double()
    report = CompileReport()
    compiled = kernelwright.compile(fn, report=report)
    _check_against_eager(fn, compiled, [q, cos_r, sin_r, cos_g, sin_g, cos64, sin64])
    rope_sites = [s for s in report if s.op == "rope"]
    assert [s.replaced for s in rope_sites] == [True, False, False], report.summary()
    assert "require grad" in rope_sites[1].reason and "promotes" in rope_sites[2].reason
    assert launches == {"rope.fwd": 1, "rope.bwd": 1}


# --------------------------------------------------------------------------- cross-entropy


def test_cross_entropy_spellings(launches):
    """Hugging Face's causal-LM loss (upcast, flatten, shifted labels) on bf16 and fp32 logits,
    nn.CrossEntropyLoss, and F.cross_entropy with its options."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    V = 40

    def fn(logits, logits16, labels, w):
        flat = (logits * 2).reshape(-1, V)
        return (
            ForCausalLMLoss(logits, labels, vocab_size=V)
            + ForCausalLMLoss(logits16, labels, vocab_size=V)
            + torch.nn.CrossEntropyLoss(label_smoothing=0.2)(logits[0], labels[0])
            + F.cross_entropy(flat, labels.clamp(min=0).view(-1), ignore_index=3, reduction="sum",
                              label_smoothing=0.1)
            + F.cross_entropy(logits[1], labels[1], weight=w, reduction="none").sum()
        )  # fmt: skip

    torch.manual_seed(0)
    logits, logits16 = _leaves((2, 7, V), (2, 7, V))
    logits16 = logits16.detach().bfloat16().requires_grad_()
    labels = torch.randint(0, V, (2, 7))
    labels[0, 2] = labels[1, 4] = -100
    labels[1, 1] = 3
    w = torch.rand(V) + 0.5  # class weights get no gradient
    report = CompileReport()
    compiled = kernelwright.compile(fn, report=report, fullgraph=True)
    _check_against_eager(fn, compiled, [logits, logits16, labels, w])
    assert _summary(report) == [("cross_entropy", True, "kernelwright")] * 5
    # the upcast and the flatten are part of the site: the kernel reads the bf16 logits
    assert report[1].dtypes["logits"] == "bfloat16" and report[1].shapes["logits"] == (2, 7, V)
    assert launches == {"cross_entropy.fwd": 5, "cross_entropy.bwd": 5}


def test_lm_head_and_cross_entropy_become_fused_linear_cross_entropy(launches):
    """`F.cross_entropy(lm_head(h).float().view(-1, V), y.view(-1))` (nn.Linear, with a bias)
    and `F.cross_entropy(F.linear(h, W), y)`: one fused site each, the logits never made; a
    model that also returns its logits keeps them and gets the plain cross-entropy site."""
    V, H = 24, 16
    torch.manual_seed(0)
    head = torch.nn.Linear(H, V)

    def fused(h, y, w):
        a = F.cross_entropy(head(h).float().view(-1, V), y.view(-1), ignore_index=2)
        return a + F.cross_entropy(F.linear(h[0], w), y[0], reduction="sum")

    def returns_logits(h, y, w):
        logits = F.linear(h, w)
        return F.cross_entropy(logits.view(-1, V), y.view(-1)) + logits.mean()

    h, w = _leaves((2, 5, H), (V, H))
    y = torch.randint(0, V, (2, 5))
    y[0, 1] = 2
    report = CompileReport()
    compiled = kernelwright.compile(fused, report=report)
    _check_against_eager(fused, compiled, [h, y, w], params=list(head.parameters()))
    assert _summary(report) == [("fused_linear_cross_entropy", True, "kernelwright")] * 2
    assert launches["fused_linear_cross_entropy.chunk"] >= 2 and "cross_entropy.fwd" not in launches
    report = CompileReport()
    compiled = kernelwright.compile(returns_logits, report=report)
    _check_against_eager(returns_logits, compiled, [h, y, w])
    assert _summary(report) == [("cross_entropy", True, "kernelwright")]
    assert "logits are also read outside the loss" in report[0].reason


def test_cross_entropy_sites_left_alone(launches):
    def fn(x, probs, x3, t3, xb, t, x64, w64):
        return (
            F.cross_entropy(x, probs)  # class probabilities
            + F.cross_entropy(x3, t3)  # [N, C, d]: classes along dimension 1
            + F.cross_entropy(xb, t).float()  # bf16 without an upcast
            + F.cross_entropy(x64, t, weight=w64).float()  # float64 logits and weights
        )

    torch.manual_seed(0)
    x, x3 = _leaves((4, 6), (4, 6, 3))
    probs = torch.softmax(torch.randn(4, 6), -1)
    xb = torch.randn(4, 6, dtype=torch.bfloat16, requires_grad=True)
    x64 = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    w64 = torch.rand(6, dtype=torch.float64)
    t, t3 = torch.randint(0, 6, (4,)), torch.randint(0, 6, (4, 3))
    report = CompileReport()
    compiled = kernelwright.compile(fn, report=report, backend="aot_eager", fullgraph=True)
    _check_against_eager(fn, compiled, [x, probs, x3, t3, xb, t, x64, w64])
    assert [s.replaced for s in report] == [False] * 4
    reasons = [s.reason for s in report]
    assert "class probabilities" in reasons[0]
    assert "classes along dimension 1" in reasons[1]
    assert "without an upcast" in reasons[2]
    assert "float64" in reasons[3]
    assert launches == {}


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
    (where,) = report.breaks
    assert "after graph 0 at" in where and "test_compile_pass.py" in where and "print" in where
    assert where in report.summary()
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


def test_as_an_inductor_pre_grad_pass(launches):
    """The same rewrite as Inductor's pre_grad_custom_pass, torch.compile called as usual."""

    def fn(x, w):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
        return F.relu(h) ** 2

    x, w = _leaves((3, 32), (32,))
    report = CompileReport()
    compiled = torch.compile(
        fn, options={"pre_grad_custom_pass": kernelwright.compile.inductor_pass(report=report)}
    )
    _check_against_eager(fn, compiled, [x, w])
    assert _summary(report) == [("rms_norm", True, "kernelwright"),
                                ("relu_squared", True, "kernelwright")]  # fmt: skip
    assert launches["rms_norm.fwd"] == 1 and launches["relu_squared.fwd"] == 1
