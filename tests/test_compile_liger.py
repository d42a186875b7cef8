"""kernelwright.compile calling Liger Kernel where the results database says it is fastest
(compile/liger.py): Liger's function called at the site with the site's arguments, outputs and
gradients equal to eager; sites Liger does not compute (the erf GELU, log_softmax, cos/sin not
shown to be HF's tables, reduction="none" with the lm-head fused) and a missing liger_kernel
fall back to the next fastest with the reason in the report.

liger_kernel here is a stand-in installed into sys.modules: each function computes the math
Liger documents in PyTorch, takes Liger's positional arguments, records its calls, and writes
over its inputs where Liger does (rope rotates q and k in place, and dq and dk in its backward;
cross-entropy overwrites the logits). The timings are made up, keyed to an sm_90 GPU."""

from __future__ import annotations

import json
import sys
import types
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICE

import kernelwright
from kernelwright import registry
from kernelwright.bench.db import ResultsDB, new_run_id
from kernelwright.bench.harness import BenchRow
from kernelwright.compile import CompileReport, liger, passes, select

pytestmark = [pytest.mark.compile, pytest.mark.usefixtures("fresh_dynamo")]

B, S, H, D, V = 2, 5, 2, 8, 24
N = H * D  # hidden size, and the MLP's width
ROWS = B * S


# --------------------------------------------------------------------------- the stand-in


def _rms(x, w, eps, offset, casting_mode, in_place):
    xc = x.float() if casting_mode == "llama" else x
    y = xc * torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + eps)
    y = y.to(x.dtype) if casting_mode == "llama" else y
    return y if w is None else y * (offset + w)


def _fused_add(x, r, w, eps, offset, casting_mode, in_place):
    s = x + r
    return _rms(s, w, eps, offset, casting_mode, in_place), s


def _rotate(t, cos, sin):
    # Liger reads the first half of cos/sin only
    h = cos.shape[-1] // 2
    cos, sin = torch.cat([cos[..., :h]] * 2, -1), torch.cat([sin[..., :h]] * 2, -1)
    rot = torch.cat((-t[..., h:], t[..., :h]), -1)
    return t * cos.unsqueeze(1) + rot * sin.unsqueeze(1)


class _Rope(torch.autograd.Function):
    """q and k [B, H, S, D] rotated in place, as Liger does; the backward rotates back."""

    @staticmethod
    def forward(ctx, q, k, cos, sin):
        ctx.save_for_backward(cos, sin)
        for t in (q, k):  # written behind autograd's back, as a kernel does
            t.detach().copy_(_rotate(t, cos, sin))
        return q.transpose(1, 2).transpose(1, 2), k.transpose(1, 2).transpose(1, 2)

    @staticmethod
    def backward(ctx, dq, dk):
        cos, sin = ctx.saved_tensors
        for t in (dq, dk):  # Liger rotates the upstream gradients in place and returns them
            t.copy_(_rotate(t, cos, -sin))
        return dq, dk, None, None


def _ce(logits, target, weight, ignore_index, lse_scale, smoothing, reduction, *flags):
    loss = F.cross_entropy(logits, target, weight, ignore_index=ignore_index,
                           reduction=reduction, label_smoothing=smoothing)  # fmt: skip
    with torch.no_grad():
        logits.detach().fill_(0.5)  # Liger writes its gradient over the logits
    return loss, None, None, None


def _flce(hidden, w, target, bias, ce_weight, ignore_index, lse, smoothing, reduction, *rest):
    logits = F.linear(hidden, w, bias).float()
    loss = F.cross_entropy(logits, target, ce_weight, ignore_index=ignore_index,
                           reduction=reduction, label_smoothing=smoothing)  # fmt: skip
    return loss, None, None, None


STAND_IN = {
    "liger_kernel.ops.rms_norm": ("LigerRMSNormFunction", _rms),
    "liger_kernel.ops.fused_add_rms_norm": ("LigerFusedAddRMSNormFunction", _fused_add),
    "liger_kernel.ops.layer_norm": (
        "LigerLayerNormFunction", lambda x, w, b, eps: F.layer_norm(x, (x.shape[-1],), w, b, eps)
    ),
    "liger_kernel.ops.swiglu": ("LigerSiLUMulFunction", lambda a, b: F.silu(a) * b),
    "liger_kernel.ops.geglu": (
        "LigerGELUMulFunction", lambda a, b: F.gelu(a, approximate="tanh") * b
    ),
    "liger_kernel.ops.relu_squared": ("LigerReLUSquaredFunction", lambda x: F.relu(x) ** 2),
    "liger_kernel.ops.softmax": ("LigerSoftmaxFunction", lambda x: torch.softmax(x, -1)),
    "liger_kernel.ops.rope": ("LigerRopeFunction", _Rope.apply),
    "liger_kernel.ops.cross_entropy": ("LigerCrossEntropyFunction", _ce),
    "liger_kernel.ops.fused_linear_cross_entropy": (
        "LigerFusedLinearCrossEntropyFunction", _flce
    ),
}  # fmt: skip


@pytest.fixture
def fake_liger(monkeypatch) -> Counter:
    """The stand-in liger_kernel in sys.modules; returns the calls per function."""
    calls: Counter = Counter()
    for name in ("liger_kernel", "liger_kernel.ops"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    for module, (cls, fn) in STAND_IN.items():

        def apply(*args, _fn=fn, _cls=cls):
            calls[_cls] += 1
            return _fn(*args)

        mod = types.ModuleType(module)
        setattr(mod, cls, type(cls, (), {"apply": staticmethod(apply)}))
        monkeypatch.setitem(sys.modules, module, mod)
    return calls


@pytest.fixture
def no_liger(monkeypatch):
    """liger_kernel not importable, whatever this machine has."""
    for name in [n for n in sys.modules if n.startswith("liger_kernel")] + ["liger_kernel"]:
        monkeypatch.setitem(sys.modules, name, None)


@pytest.fixture
def as_on_sm90(monkeypatch):
    """Sites read as on an sm_90 GPU, where Liger is capable and its rows count."""
    real = select.choose
    monkeypatch.setattr(
        passes, "choose", lambda op, **kw: real(op, **(kw | {"device": "cuda", "arch": "sm_90"}))
    )


# (dims of a bench row in each site's bucket); the timings per provider are the test's
DIMS = {
    "rms_norm": {"tokens": ROWS, "hidden": N},
    "fused_add_rms_norm": {"tokens": ROWS, "hidden": N},
    "rope": {"tokens": ROWS, "heads": H, "kv_heads": H, "head_dim": D},
    "swiglu": {"tokens": ROWS, "intermediate": N},
    "cross_entropy": {"tokens": ROWS, "vocab": V},
    "layer_norm": {"tokens": ROWS, "hidden": N},
    "geglu": {"tokens": ROWS, "intermediate": N},
    "softmax": {"rows": ROWS, "n": N},
    "relu_squared": {"tokens": ROWS, "n": N},
    "fused_linear_cross_entropy": {"tokens": ROWS, "hidden": N, "vocab": V},
}


def _db(path, ops, timings: dict[str, float], dtype: str = "float32") -> ResultsDB:
    rows = [
        BenchRow(op=op, mode="full", provider=p, x_name="n", x_value=1,
                 shape="x".join(str(d) for d in DIMS[op].values()), dtype=dtype,
                 ms_p20=ms, ms_p50=ms, ms_p80=ms, host_ms=0.01,
                 timing="cuda_events_gpu_only_demote_flush", gpu="test", arch="sm_90",
                 dims=json.dumps(DIMS[op]))
        for op in ops for p, ms in timings.items()
    ]  # fmt: skip
    db = ResultsDB(path)
    db.append(rows, source="bench", run_id=new_run_id(), command="test")
    return db


LIGER_FIRST = {"liger": 0.5, "torch_compile": 1.0, "kernelwright": 2.0}


def _check(fn, compiled, inputs, grads_of):
    """The compiled outputs and the gradients of `grads_of` equal eager's, for random upstream
    gradients."""
    got, want = compiled(*inputs), fn(*inputs)
    torch.testing.assert_close(got, want)
    dys = [torch.randn_like(w) for w in want]
    wrt = [inputs[i] for i in grads_of]
    for a, b in zip(
        torch.autograd.grad(got, wrt, dys), torch.autograd.grad(want, wrt, dys), strict=True
    ):
        torch.testing.assert_close(a, b)


def _rotate_half(t):
    return torch.cat((-t[..., D // 2 :], t[..., : D // 2]), dim=-1)


# --------------------------------------------------------------------------- a decoder layer


def decoder(x, res, w_norm, wq, wg, wu, lm, target, pos):
    """Residual add + HF RMSNorm, HF RoPE on a [B, H, S, D] view with its tables built in the
    graph, SwiGLU, and HF's upcast cross-entropy; the logits returned too."""
    s = x + res
    s32 = s.to(torch.float32)
    h = w_norm * (s32 * torch.rsqrt(s32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(s.dtype)
    q = (h @ wq).view(B, S, H, D).transpose(1, 2)
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, device=x.device, dtype=torch.float32) / D))
    freqs = pos[:, :, None].float() * inv
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    q = q * cos.unsqueeze(1) + _rotate_half(q) * sin.unsqueeze(1)
    o = q.transpose(1, 2).reshape(B, S, N) + F.silu(h @ wg) * (h @ wu)
    logits = o @ lm
    loss = F.cross_entropy(logits.float().view(-1, V), target.view(-1))
    return loss, logits


def _decoder_inputs():
    torch.manual_seed(0)
    f = [torch.randn(*s, device=DEVICE, requires_grad=True)
         for s in ((B, S, N), (B, S, N), (N,), (N, N), (N, N), (N, N), (N, V))]  # fmt: skip
    target = torch.randint(0, V, (B, S), device=DEVICE)
    target[0, 0] = -100  # ignored
    pos = torch.arange(S, device=DEVICE).expand(B, S)
    return [*f, target, pos]


DECODER_OPS = ("fused_add_rms_norm", "rope", "swiglu", "cross_entropy")


def test_liger_fastest_is_called_at_each_site(tmp_path, fake_liger, as_on_sm90):
    db = _db(tmp_path / "r.db", DECODER_OPS, LIGER_FIRST)
    report = CompileReport()
    compiled = kernelwright.compile(decoder, report=report, db=db.path, backend="aot_eager")
    _check(decoder, compiled, _decoder_inputs(), range(7))
    assert [(s.op, s.impl, s.replaced) for s in report] == [
        (op, "liger", True) for op in DECODER_OPS
    ]
    assert all("fastest measured" in s.reason and "liger 0.5 ms" in s.reason for s in report)
    assert "taken in the forward" in report[-1].reason  # cross-entropy: no second forward
    # one forward each; the backward runs the forward again, but for the loss
    assert fake_liger == {"LigerFusedAddRMSNormFunction": 2, "LigerRopeFunction": 2,
                          "LigerSiLUMulFunction": 2, "LigerCrossEntropyFunction": 1}  # fmt: skip


def test_without_liger_the_next_fastest_wins_and_says_why(tmp_path, no_liger, as_on_sm90):
    db = _db(tmp_path / "r.db", DECODER_OPS, LIGER_FIRST)
    report = CompileReport()
    compiled = kernelwright.compile(decoder, report=report, db=db.path, backend="aot_eager")
    _check(decoder, compiled, _decoder_inputs(), range(7))
    assert [(s.op, s.impl, s.replaced) for s in report] == [
        (op, "inductor", False) for op in DECODER_OPS
    ]
    for site in report:
        assert site.reason.startswith(
            "liger measured fastest; not insertable here (liger_kernel is not installed); "
            "chose inductor, the fastest it can insert"
        )


def _hf_rms_norm(x, w):
    x32 = x.to(torch.float32)
    return w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)


def norms(x, x2, w, w32):
    """HF's RMSNorm in bf16: with a bf16 weight (Liger's casting "llama"), and with an fp32
    weight, which eager promotes and Liger would not."""
    return _hf_rms_norm(x, w), _hf_rms_norm(x2, w32)


def test_bf16_rms_norm_is_llama_casting(tmp_path, fake_liger, as_on_sm90):
    db = _db(tmp_path / "r.db", ["rms_norm"], LIGER_FIRST, dtype="bfloat16")
    torch.manual_seed(2)
    x, x2 = (torch.randn(B, S, N, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    w = torch.rand(N, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    w32 = torch.rand(N, device=DEVICE, requires_grad=True)
    inputs = [x.requires_grad_(), x2.requires_grad_(), w, w32]
    report = CompileReport()
    compiled = kernelwright.compile(norms, report=report, db=db.path, backend="aot_eager")
    torch.testing.assert_close(compiled(*inputs)[0], norms(*inputs)[0], rtol=0, atol=0)
    _check(norms, compiled, inputs, range(4))
    assert [s.impl for s in report] == ["liger", "inductor"]
    assert "weight is float32 and x bfloat16: Liger computes in x's dtype" in report[1].reason
    assert fake_liger == {"LigerRMSNormFunction": 3}  # two forwards, one backward


# --------------------------------------------------------------------------- variants


def _tables(pos):
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, device=pos.device, dtype=torch.float32) / D))
    freqs = pos[:, :, None].float() * inv
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def variants(x, w, b, gate, up, q, cos, sin, hidden, lm, target, pos):
    """What Liger computes (LayerNorm, tanh GELU, softmax, relu², RoPE on [B, S, H, D], FLCE,
    per-row CE) beside what it does not (erf GELU, log_softmax, RoPE on tables given from
    outside)."""
    y = F.layer_norm(x, (N,), w, b, 1e-5)
    tanh = F.gelu(gate, approximate="tanh") * up
    erf = F.gelu(gate) * up
    soft, log = torch.softmax(y, -1), torch.log_softmax(y, -1)
    relu2 = F.relu(y) ** 2
    rot = q * cos.unsqueeze(2) + _rotate_half(q) * sin.unsqueeze(2)  # [B, S, H, D]
    c, s = _tables(pos)
    rot2 = q * c.unsqueeze(2) + _rotate_half(q) * s.unsqueeze(2)
    flce = F.cross_entropy(F.linear(hidden, lm).float().view(-1, V), target.view(-1))
    rows = F.cross_entropy((hidden @ lm.t()).view(-1, V), target.view(-1), reduction="none")
    return y, tanh, erf, soft, log, relu2, rot, rot2, flce, rows


def test_liger_variants_and_what_stays_with_the_next_fastest(tmp_path, fake_liger, as_on_sm90):
    db = _db(tmp_path / "r.db", [*DIMS], LIGER_FIRST)
    torch.manual_seed(1)
    shapes = ((B, S, N), (N,), (N,), (B, S, N), (B, S, N), (B, S, H, D), (B, S, D), (B, S, D),
              (B, S, N), (V, N))  # fmt: skip
    inputs = [torch.randn(*s, device=DEVICE, requires_grad=i != 6 and i != 7)
              for i, s in enumerate(shapes)]  # fmt: skip
    inputs.append(torch.randint(0, V, (B, S), device=DEVICE))
    inputs.append(torch.arange(S, device=DEVICE).expand(B, S))
    report = CompileReport()
    compiled = kernelwright.compile(variants, report=report, db=db.path, backend="aot_eager")
    _check(variants, compiled, inputs, (0, 1, 2, 3, 4, 5, 8, 9))
    got = {(s.pattern.split("(")[0], s.impl) for s in report}
    assert got == {
        ("layer_norm", "liger"), ("gelu", "liger"), ("gelu", "inductor"), ("softmax", "liger"),
        ("log_softmax", "inductor"), ("relu", "liger"), ("q * cos + rotate_half", "inductor"),
        ("q * cos + rotate_half", "liger"), ("cross_entropy", "liger"),
    }  # fmt: skip
    reasons = " | ".join(s.reason for s in report if s.impl == "inductor")
    for why in ("the tanh form only", "Liger has softmax only", "not shown to repeat"):
        assert "liger measured fastest; not insertable here (" in reasons and why in reasons
    flce = [s for s in report if s.op == "fused_linear_cross_entropy"]
    assert [s.impl for s in flce] == ["liger"]
    assert fake_liger == {"LigerLayerNormFunction": 2, "LigerGELUMulFunction": 2,
                          "LigerSoftmaxFunction": 2, "LigerReLUSquaredFunction": 2,
                          "LigerRopeFunction": 2, "LigerFusedLinearCrossEntropyFunction": 1,
                          "LigerCrossEntropyFunction": 1}  # fmt: skip


def test_flce_without_a_mean_or_sum_is_not_liger():
    m = types.SimpleNamespace(op="fused_linear_cross_entropy", kwargs={"reduction": "none"})
    assert "reduction='none'" in liger.ADAPTERS[m.op].check(m)
    for op in liger.ADAPTERS:  # every adapter calls what the registry lists
        assert liger.target(op).startswith("liger_kernel.ops.")
        assert registry.get(op).impl("liger").provider == "liger"
