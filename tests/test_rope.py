"""rope: forward and q/k gradients against the fp32 reference, both channel pairings, partial
rotary, GQA/MQA head counts, cos/sin shapes and dtypes, both layouts and strided inputs, output
layout, int64 offsets, launch configs, errors, the harness itself, torch.compile and the
benchmark spec."""

import functools
import math

import pytest
import torch
from conftest import ON_GPU, rope_agrees

from kernelwright.bench.harness import make_context, run_spec
from kernelwright.bench.models import MODELS
from kernelwright.bench.specs import ROPE
from kernelwright.ops import rope as R
from kernelwright.ops.rope import RoPE, rope, rope_eager, rope_ref, rope_tables
from kernelwright.runtime import LaunchConfig
from kernelwright.runtime.tables.rope import TABLE
from kernelwright.testing import (
    Tolerance,
    check_op,
    generator,
    poisoned,
    rand,
    rel_norm_error,
)

# Relative-norm error bounds vs the fp32 reference. Forward and backward compute in fp32 and
# round once; in fp32 the interpreter matches the reference exactly (the GPU may fuse the
# products into fma, ~1e-7). Measured under the interpreter over CASES: fp16 2.1e-4, bf16
# 3.4e-3 (the interpreter truncates fp32 -> bf16: about twice the error of rounding).
TOL = {
    torch.float32: Tolerance(fwd=1e-6, bwd=1e-6),
    torch.float16: Tolerance(fwd=5e-4, bwd=5e-4),
    torch.bfloat16: Tolerance(fwd=6e-3, bwd=6e-3),
}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
QK = ("q", "k")  # the differentiable inputs: cos/sin get no gradient

# (B, S, Hq, Hk, D, R, Bc), Bc = 0 meaning cos/sin of shape [S, R]. The interpreter's table
# takes 8 tokens per program: S = 7 and 9 leave a partly filled token block.
if ON_GPU:
    CASES = {
        "gqa3": (2, 300, 6, 2, 64, 64, 2),
        "llama": (2, 1000, 32, 8, 128, 128, 1),
        "mqa_partial": (1, 777, 16, 1, 80, 48, 1),
        "odd_heads_partial": (3, 257, 5, 3, 96, 32, 3),
        "half_not_pow2": (2, 300, 12, 12, 96, 96, 0),
    }
else:
    CASES = {
        "gqa3": (2, 7, 6, 2, 64, 64, 2),  # GQA 3:1, cos/sin per batch element
        "mqa_partial": (1, 9, 4, 1, 80, 48, 1),  # MQA, R < D (pairs 24: padded to 32)
        "odd_heads_partial": (2, 5, 5, 3, 96, 32, 1),  # Hk = 3 does not divide Hq = 5
        "half_not_pow2": (2, 6, 3, 3, 96, 96, 0),  # R/2 = 48 padded to 64, cos/sin [S, R]
    }
LAYOUTS = ["hf", "contiguous", "strided_d", "fused_qkv"]


def _qk(b, s, h, d, dtype, device, gen, *, unsqueeze_dim=1, layout="hf"):
    # q or k in the op's layout ([B, H, S, D] for unsqueeze_dim=1, else [B, S, H, D]), stored as
    # - "hf": a [B, S, H, D] projection output (for unsqueeze_dim=1 its transposed view, as HF's
    #   attention passes it),
    # - "contiguous": contiguous in the op's layout,
    # - "strided_d": head_dim not contiguous (a view transposed in its last two dims).
    shape = (b, h, s, d) if unsqueeze_dim == 1 else (b, s, h, d)
    if layout == "hf":
        t = rand((b, s, h, d), dtype, device, gen=gen)
        return t.transpose(1, 2) if unsqueeze_dim == 1 else t
    if layout == "strided_d":
        return rand(shape, dtype, device, gen=gen, layout="transposed")
    return rand(shape, dtype, device, gen=gen)


def _inputs(case, dtype, seed, device, *, unsqueeze_dim=1, layout="hf", cos_dtype=torch.float32):
    b, s, hq, hk, d, r, bc = case
    gen = generator(seed)
    if layout == "fused_qkv":
        # q and k are slices of one fused qkv projection [B, S, (Hq + 2 Hk) * D]: neither is
        # dense, both share the buffer's token stride.
        qkv = rand((b, s, (hq + 2 * hk) * d), dtype, device, gen=gen).view(b, s, hq + 2 * hk, d)
        q, k = qkv[:, :, :hq], qkv[:, :, hq : hq + hk]
        if unsqueeze_dim == 1:
            q, k = q.transpose(1, 2), k.transpose(1, 2)
    else:
        opts = dict(unsqueeze_dim=unsqueeze_dim, layout=layout)
        q = _qk(b, s, hq, d, dtype, device, gen, **opts)
        k = _qk(b, s, hk, d, dtype, device, gen, **opts)
    # Random cos/sin, not a rotation table: every channel's cos and sin distinct, so a kernel
    # that assumed cos[:R/2] == cos[R/2:] or mixed up the pairing fails.
    table = (bc, s, r) if bc else (s, r)
    cos = rand(table, cos_dtype, device, gen=gen)
    sin = rand(table, cos_dtype, device, gen=gen)
    return {"q": q, "k": k, "cos": cos, "sin": sin}


def _check(inputs, **kwargs):
    return check_op(rope, rope_ref, inputs, kwargs=kwargs, grad_inputs=QK, tolerances=TOL)


# --------------------------------------------------------------------------- vs the reference


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_forward_backward_matches_reference(dtype, interleaved, case, device):
    inputs = _inputs(CASES[case], dtype, 0, device)
    _check(inputs, interleaved=interleaved).assert_ok()


def test_more_seeds(device):
    for seed in (1, 2, 3):
        for interleaved in (False, True):
            inputs = _inputs(CASES["mqa_partial"], torch.float32, seed, device)
            _check(inputs, interleaved=interleaved).assert_ok()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
def test_layouts(unsqueeze_dim, layout, device):
    # Any strides, both layouts; bf16 interleaved too (its split/join path).
    for dtype, interleaved in [(torch.float32, False), (torch.bfloat16, True)]:
        inputs = _inputs(
            CASES["odd_heads_partial"], dtype, 3, device, unsqueeze_dim=unsqueeze_dim, layout=layout
        )
        _check(inputs, unsqueeze_dim=unsqueeze_dim, interleaved=interleaved).assert_ok()


@pytest.mark.parametrize(
    "dtype,cos_dtype",
    [
        (torch.float32, torch.bfloat16),
        (torch.bfloat16, torch.bfloat16),
        (torch.float16, torch.float32),
    ],
    ids=str,
)
def test_cos_sin_dtypes(dtype, cos_dtype, device):
    # cos/sin in q's dtype (as HF's rotary embedding returns them) or another float dtype: read
    # in fp32 either way. The reference gets fp32 copies of the same values.
    inputs = _inputs(CASES["gqa3"], dtype, 4, device, cos_dtype=cos_dtype)
    _check(inputs).assert_ok()


@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_real_tables_rotate_and_preserve_norms(interleaved, device):
    # HF's tables (inv_freq = base^(-2i/R)): every rotated pair keeps its norm, position 0 is
    # the identity (cos 1, sin 0), pass-through channels are copied bit for bit, and the
    # result equals HF's code in fp32.
    b, s, hq, hk, d, r = 2, 11, 4, 2, 64, 48
    cos, sin = rope_tables(s, r, interleaved=interleaved, device=device)
    gen = generator(5)
    q = _qk(b, s, hq, d, torch.float32, device, gen)
    k = _qk(b, s, hk, d, torch.float32, device, gen)
    q_out, k_out = rope(q, k, cos, sin, interleaved=interleaved)
    q_eager, k_eager = rope_eager(q, k, cos, sin, interleaved=interleaved)
    assert rel_norm_error(q_out, q_eager) < 1e-6 and rel_norm_error(k_out, k_eager) < 1e-6
    for x, out in ((q, q_out), (k, k_out)):
        assert torch.allclose(out[..., :r].norm(dim=-1), x[..., :r].norm(dim=-1), rtol=1e-5)
        assert torch.equal(out[:, :, 0], x[:, :, 0])
        assert torch.equal(out[..., r:], x[..., r:])
        assert not torch.allclose(out[:, :, 1:, :r], x[:, :, 1:, :r])  # it did rotate


def test_interleaved_is_half_split_on_permuted_channels(device):
    # Pairs (2i, 2i+1) are pairs (i, i + R/2) once the channels are reordered evens-then-odds:
    # the two kernel paths must agree, bit for bit under the interpreter (on the GPU each path
    # may contract its products into fma its own way: to fp32 rounding).
    inputs = _inputs(CASES["gqa3"], torch.float32, 6, device)
    r = inputs["cos"].shape[-1]
    perm = torch.cat([torch.arange(0, r, 2), torch.arange(1, r, 2)]).to(device)
    q_i, k_i = rope(**inputs, interleaved=True)
    q_h, k_h = rope(*(t[..., perm] for t in inputs.values()))
    for a, b in ((q_i[..., perm], q_h), (k_i[..., perm], k_h)):
        assert rel_norm_error(a, b) < 1e-7 if ON_GPU else torch.equal(a, b)


@pytest.mark.parametrize("case", ["mqa_partial", "half_not_pow2"])
def test_deinterleave_matches_reference(case, device):
    # DeepSeek-V3's pairing (read pairs (2i, 2i+1) by angle i from cos[:R/2], write them
    # half-split; the gradient goes back interleaved): fp32 and bf16, partial rotary, and
    # random cos/sin whose halves differ, so reading cos[R/2:] fails.
    for dtype in (torch.float32, torch.bfloat16):
        _check(_inputs(CASES[case], dtype, 8, device), deinterleave=True).assert_ok()


@pytest.mark.parametrize(("unsqueeze_dim", "layout"), [(1, "fused_qkv"), (2, "strided_d")])
def test_deinterleave_layouts(unsqueeze_dim, layout, device):
    inputs = _inputs(
        CASES["odd_heads_partial"], torch.float32, 9, device, unsqueeze_dim=unsqueeze_dim,
        layout=layout,
    )  # fmt: skip
    _check(inputs, unsqueeze_dim=unsqueeze_dim, deinterleave=True).assert_ok()


def test_deinterleave_is_deepseek_v3s_function(device):
    # MLA's call: q_rot a split view of the [B, S, H, nope + rope] projection, k_rot one head;
    # HF's apply_rotary_pos_emb_interleave, forward and backward, bit for bit under the
    # interpreter; in place too. And the pairing is half-split rope on evens-then-odds.
    modeling = pytest.importorskip("transformers.models.deepseek_v3.modeling_deepseek_v3")
    b, s, h, nope, r = 2, 7, 3, 6, 20
    gen = generator(10)
    q = rand((b, s, h, nope + r), torch.float32, device, gen=gen).transpose(1, 2)[..., nope:]
    k = rand((b, s, r), torch.float32, device, gen=gen).view(b, 1, s, r)
    cos, sin = rope_tables(s, r, device=device)
    ours = functools.partial(rope, deinterleave=True)
    out, close = rope_agrees(modeling.apply_rotary_pos_emb_interleave, ours, q, k, cos, sin, gen)
    perm = torch.cat([torch.arange(0, r, 2), torch.arange(1, r, 2)]).to(device)
    for a, b in zip(out, rope(q[..., perm], k[..., perm], cos, sin), strict=True):
        assert close(a, b)
    q_in, k_in = q.clone(), k.clone()
    for a, b in zip(rope(q_in, k_in, cos, sin, deinterleave=True, in_place=True), out, strict=True):
        assert close(a, b)
    with pytest.raises(ValueError, match="at most one"):
        rope(q, k, cos, sin, interleaved=True, deinterleave=True)


def test_agrees_with_eager_fp16(device):
    # HF's code rounds three times (q * cos, rotate_half(q) * sin, the sum), the kernel once:
    # its fp16 error vs the fp32 reference is no larger than eager's. (bf16: the interpreter
    # truncates instead of rounding, see INTERPRETER.md.)
    b, s, hq, hk, d = 2, 9, 4, 2, 64
    cos, sin = rope_tables(s, d, dtype=torch.float16, device=device)
    gen = generator(7)
    q = _qk(b, s, hq, d, torch.float16, device, gen)
    k = _qk(b, s, hk, d, torch.float16, device, gen)
    ref = rope_ref(q.float(), k.float(), cos, sin)
    ours, eager = rope(q, k, cos, sin), rope_eager(q, k, cos, sin)
    for o, e, r in zip(ours, eager, ref, strict=True):
        assert o.dtype == e.dtype == torch.float16
        assert rel_norm_error(o, r) <= rel_norm_error(e, r) + 1e-6


# --------------------------------------------------------------------------- layout, gradients


def test_outputs_keep_the_input_layout_and_are_not_views(device):
    # HF's q is a transposed view of [B, S, H, D] storage: q_out and dq are laid out the same
    # way, so dq flows back through the transpose and view(B, S, H * D) without a copy.
    inputs = _inputs(CASES["gqa3"], torch.float32, 8, device)
    q, k = (inputs[n].detach().requires_grad_() for n in QK)
    q_out, k_out = rope(q, k, inputs["cos"], inputs["sin"])
    assert q_out.shape == q.shape and k_out.shape == k.shape
    assert q_out.transpose(1, 2).is_contiguous() and k_out.transpose(1, 2).is_contiguous()
    assert q_out._base is None and k_out._base is None
    dq, dk = torch.autograd.grad((q_out, k_out), (q, k), (q_out.detach(), k_out.detach()))
    assert dq.transpose(1, 2).is_contiguous() and dk.transpose(1, 2).is_contiguous()
    # contiguous [B, H, S, D] in, contiguous out; slices of a fused qkv buffer: dense out
    contiguous = _inputs(CASES["gqa3"], torch.float32, 8, device, layout="contiguous")
    assert all(t.is_contiguous() for t in rope(**contiguous))
    fused = _inputs(CASES["gqa3"], torch.float32, 8, device, layout="fused_qkv")
    assert all(t.transpose(1, 2).is_contiguous() for t in rope(**fused))


def test_output_can_be_modified_in_place(device):
    inputs = _inputs(CASES["mqa_partial"], torch.float32, 9, device)
    grads = []
    for fn in (rope, rope_ref):
        q, k = (inputs[n].detach().clone().requires_grad_() for n in QK)
        q_out, k_out = fn(q, k, inputs["cos"], inputs["sin"])
        (q_out.mul_(3.0).sum() + k_out.sum()).backward()
        grads.append((q.grad, k.grad))
    for ours, theirs in zip(*grads, strict=True):
        assert rel_norm_error(ours, theirs) < 1e-6


def test_expanded_and_missing_upstream_gradients(device):
    # q_out.sum() hands the backward a stride-0 gradient; k_out unused gives zeros for it.
    inputs = _inputs(CASES["gqa3"], torch.float32, 10, device)
    results = []
    for fn in (rope, rope_ref):
        q, k = (inputs[n].detach().clone().requires_grad_() for n in QK)
        with poisoned():
            q_out, _ = fn(q, k, inputs["cos"], inputs["sin"])
            results.append(torch.autograd.grad(q_out.sum(), (q, k), allow_unused=True))
    (dq, dk), (dq_ref, dk_ref) = results
    assert rel_norm_error(dq, dq_ref) < 1e-6
    assert dk_ref is None and torch.equal(dk, torch.zeros_like(dk))


def _huge_stride_view(shape, dim, dtype, device, gen):
    # A view of `shape` whose stride along `dim` puts index 2 past 2^31 elements; only the
    # elements themselves are written, so it costs a few KB of real memory.
    big = 2**30 + 64
    strides, inner = [0] * len(shape), 1
    for i in reversed(range(len(shape))):
        if i != dim:
            strides[i] = inner
            inner *= shape[i]
    strides[dim] = big
    storage = torch.empty(big * (shape[dim] - 1) + inner, dtype=dtype, device=device)
    view = storage.as_strided(shape, strides)
    view.copy_(rand(shape, dtype, device, gen=gen))
    return view


def test_int64_offsets(device):
    # q's batch 2 and k's head 2 start past 2^31 elements: int32 offsets would wrap.
    gen = generator(11)
    dtype = torch.float16
    b, s, hq, hk, d = 3, 3, 2, 3, 64
    q = _huge_stride_view((b, hq, s, d), 0, dtype, device, gen)
    k = _huge_stride_view((b, hk, s, d), 1, dtype, device, gen)
    cos, sin = rand((b, s, d), dtype, device, gen=gen), rand((b, s, d), dtype, device, gen=gen)
    _check({"q": q, "k": k, "cos": cos, "sin": sin}).assert_ok()
    _check({"q": q, "k": k, "cos": cos, "sin": sin}, interleaved=True).assert_ok()


@pytest.mark.parametrize("b,s", [(0, 5), (2, 0)])
def test_zero_size(b, s, device):
    q = torch.empty(b, 4, s, 16, device=device).requires_grad_()
    k = torch.empty(b, 2, s, 16, device=device).requires_grad_()
    cos = sin = torch.ones(1, s, 16, device=device)
    q_out, k_out = rope(q, k, cos, sin)
    assert q_out.shape == q.shape and k_out.shape == k.shape
    (q_out.sum() + k_out.sum()).backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape


def test_module(device):
    inputs = _inputs(CASES["gqa3"], torch.float32, 12, device)
    for kwargs in ({}, {"interleaved": True}):
        ours = RoPE(**kwargs)(*inputs.values())
        for a, b in zip(ours, rope(**inputs, **kwargs), strict=True):
            assert torch.equal(a, b)
    m = RoPE(unsqueeze_dim=2, interleaved=True)
    assert "unsqueeze_dim=2, interleaved=True" in repr(m)
    inputs = _inputs(CASES["gqa3"], torch.float32, 12, device, unsqueeze_dim=2)
    for a, b in zip(m(*inputs.values()), rope_ref(**inputs, unsqueeze_dim=2, interleaved=True),
                    strict=True):  # fmt: skip
        assert rel_norm_error(a, b) < 1e-6


# --------------------------------------------------------------------------- launch configs


@pytest.mark.parametrize("kernel", ["fwd", "bwd"])
def test_every_table_config(kernel, device):
    # Each launch config the GPU table holds, and an odd one (one head per tile, 3 tokens per
    # program), gives the same bits (on a GPU, to within an fp32 ulp: the compiler may contract
    # a product and a sum into an FMA in one config and not another); the first matches the
    # reference (or its vector-Jacobian product: the backward launch rotates gradients by the
    # transpose).
    inputs = _inputs(CASES["mqa_partial"], torch.float32, 13, device)
    q, k, cos, sin = inputs.values()
    configs = [cfg for _, cfg in TABLE[kernel]["default"]] + [LaunchConfig(block_n=64, rows=3)]
    launch = R.rope_fwd_launch if kernel == "fwd" else R.rope_bwd_launch
    for interleaved in (False, True):
        results = []
        for cfg in configs:
            outs = [torch.full_like(t, math.nan) for t in (q, k)]
            launch(q, k, cos, sin, *outs, 1, interleaved, config=cfg)
            results.append(outs)
        for outs, cfg in zip(results[1:], configs[1:], strict=True):
            for got, first in zip(outs, results[0], strict=True):
                assert rel_norm_error(got, first) < 2e-7 if ON_GPU else torch.equal(got, first), cfg
        q_r, k_r = (t.detach().clone().requires_grad_() for t in (q, k))
        expected = rope_ref(q_r, k_r, cos, sin, interleaved=interleaved)
        if kernel == "bwd":  # here q and k play the output gradients
            expected = torch.autograd.grad(expected, (q_r, k_r), (q, k))
        for got, want in zip(results[0], expected, strict=True):
            assert rel_norm_error(got, want) < 1e-6


# --------------------------------------------------------------------------- errors


def _bad_inputs(device):
    other = "cpu" if ON_GPU else "meta"  # a device the kernels cannot use here
    t = lambda *shape, dtype=torch.float32, dev=device: torch.ones(*shape, dtype=dtype, device=dev)
    q, k, cos = t(2, 3, 5, 8), t(2, 1, 5, 8), t(1, 5, 8)
    table = r"\[1 or 2, 5, R\] or \[5, R\] \(R = rotary dim <= head_dim 8, even\)"
    return [
        (lambda: rope(t(2, 3, 5, 8, dtype=torch.int32), k, cos, cos), TypeError,
         r"rope: argument 'q' must have dtype in \(float32, float16, bfloat16\), got int32"),
        (lambda: rope(q, t(2, 1, 5, 8, dtype=torch.float16), cos, cos), TypeError,
         r"rope: argument 'k' has dtype float16 but 'q' has dtype float32"),
        (lambda: rope([1.0], k, cos, cos), TypeError,
         r"rope: argument 'q' must be a torch.Tensor, got list"),
        (lambda: rope(t(3, 5, 8), k, cos, cos), ValueError,
         r"rope: argument 'q' must have shape \[batch, heads, seq, head_dim\] \(4-D, "
         r"unsqueeze_dim=1\), got \(3, 5, 8\)"),
        (lambda: rope(q, t(2, 1, 1, 5, 8), cos, cos), ValueError,
         r"rope: argument 'k' must have shape \[batch, heads, seq, head_dim\] \(4-D"),
        (lambda: rope(q, k, cos, cos, unsqueeze_dim=3), ValueError,
         r"rope: unsqueeze_dim must be 1 .* or 2 .*, got 3"),
        (lambda: rope(q, t(2, 1, 5, 6), cos, cos), ValueError,
         r"rope: argument 'k' must have shape .*with q's batch 2, seq 5 and head_dim 8, "
         r"got \(2, 1, 5, 6\)"),
        (lambda: rope(q, t(2, 1, 4, 8), cos, cos), ValueError,
         r"rope: argument 'k' must have shape .*got \(2, 1, 4, 8\)"),
        (lambda: rope(q, t(1, 1, 5, 8), cos, cos), ValueError,
         r"rope: argument 'k' must have shape .*got \(1, 1, 5, 8\)"),
        (lambda: rope(q, k, t(1, 5, 10), t(1, 5, 10)), ValueError,
         rf"rope: argument 'cos' must have shape {table}, got \(1, 5, 10\)"),
        (lambda: rope(q, k, t(1, 5, 7), t(1, 5, 7)), ValueError,
         rf"rope: argument 'cos' must have shape {table}, got \(1, 5, 7\)"),
        (lambda: rope(q, k, t(1, 5, 0), t(1, 5, 0)), ValueError,
         rf"rope: argument 'cos' must have shape {table}, got \(1, 5, 0\)"),
        (lambda: rope(q, k, cos, t(1, 5, 6)), ValueError,
         r"rope: arguments 'cos' and 'sin' must have one shape, got \(1, 5, 8\) and \(1, 5, 6\)"),
        (lambda: rope(q, k, t(3, 5, 8), t(3, 5, 8)), ValueError,
         rf"rope: argument 'cos' must have shape {table}, got \(3, 5, 8\)"),
        (lambda: rope(q, k, t(1, 4, 8), t(1, 4, 8)), ValueError,
         rf"rope: argument 'cos' must have shape {table}, got \(1, 4, 8\)"),
        (lambda: rope(q, k, t(1, 1, 5, 8), t(1, 1, 5, 8)), ValueError,
         rf"rope: argument 'cos' must have shape {table}, got \(1, 1, 5, 8\)"),
        (lambda: rope(q, k, t(1, 5, 8, dtype=torch.int64), cos), TypeError,
         r"rope: argument 'cos' must have dtype in .*got int64"),
        (lambda: rope(q, k, t(1, 5, 8, dev=other), cos), RuntimeError,
         r"rope: argument 'cos' is on"),
        # unsqueeze_dim=2 reads q as [B, S, H, D]: S = 3 here, so a [1, 5, 8] table is wrong
        (lambda: rope(q, k, cos, cos, unsqueeze_dim=2), ValueError,
         r"rope: argument 'k' must have shape \[batch, seq, heads, head_dim\] with q's batch 2, "
         r"seq 3 and head_dim 8, got \(2, 1, 5, 8\)"),
        (lambda: rope(q, t(2, 3, 1, 8), cos, cos, unsqueeze_dim=2), ValueError,
         r"rope: argument 'cos' must have shape \[1 or 2, 3, R\] or \[3, R\]"),
    ]  # fmt: skip


@pytest.mark.parametrize("case", range(20))
def test_bad_input_errors(case, device):
    call, exc, message = _bad_inputs(device)[case]
    with pytest.raises(exc, match=message):
        call()


def test_cos_sin_requiring_grad_is_an_error(device):
    inputs = _inputs(CASES["gqa3"], torch.float32, 14, device)
    for name in ("cos", "sin"):
        bad = {**inputs, name: inputs[name].detach().requires_grad_()}
        with pytest.raises(ValueError, match=rf"rope: argument '{name}' requires grad.*q and k"):
            rope(**bad)
        with torch.no_grad():  # no gradient to miss: allowed
            rope(**bad)


# --------------------------------------------------------------------------- the harness itself


def test_harness_catches_a_wrong_kernel(device, monkeypatch):
    # A test that cannot fail is a defect: the forward rotation run as the backward, a grid one
    # program short, and the other channel pairing must each fail.
    inputs = _inputs(CASES["gqa3"], torch.float16, 15, device)
    assert _check(inputs).ok

    real_launch = R._launch
    as_forward = lambda *args, config=None: real_launch("fwd", *args, config)
    monkeypatch.setattr(R, "rope_bwd_launch", as_forward)
    report = _check(inputs)
    assert [r.ok for r in report.rows] == [True, True, False, False], report.table()
    monkeypatch.undo()

    real_grid = R._grid
    monkeypatch.setattr(R, "_grid", lambda b, s, cfg: (real_grid(b, s, cfg)[0] - 1,))
    R._PLANS.clear()  # launch plans are memoized: rebuild them with the short grid
    report = check_op(rope, rope_ref, inputs, tolerances=TOL, backward=False)
    assert not report.ok and report.rows[0].error == math.inf, report.table()
    monkeypatch.undo()
    R._PLANS.clear()

    swapped = lambda **kw: rope(**kw, interleaved=True)
    report = check_op(swapped, rope_ref, inputs, tolerances=TOL, backward=False)
    assert not report.ok, report.table()


# --------------------------------------------------------------------------- in place


def _in_place_block(b, s, hq, hk, d, interleaved, in_place):
    # q and k as HF attention makes them: views of a fused projection's output (not leaves)
    def block(qkv, cos, sin):
        x = (qkv * 2.0).view(b, s, hq + 2 * hk, d)
        q, k = x[:, :, :hq].transpose(1, 2), x[:, :, hq : hq + hk].transpose(1, 2)
        q_out, k_out = rope(q, k, cos, sin, interleaved=interleaved, in_place=in_place)
        if in_place and not torch.compiler.is_compiling():  # the outputs are q and k's storage
            assert q_out.data_ptr() == q.data_ptr() and torch.equal(q_out, q)
        return q_out.sin().sum() + (k_out * k_out).sum()

    return block


@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_in_place_matches_out_of_place(interleaved, device):
    b, s, hq, hk, d = 2, 9, 6, 2, 64
    qkv = rand((b, s, (hq + 2 * hk) * d), torch.float32, device, gen=generator(21))
    cos = rand((b, s, d), torch.float32, device, gen=generator(22))
    sin = rand((b, s, d), torch.float32, device, gen=generator(23))
    results = []
    for in_place in (False, True):
        x = qkv.detach().clone().requires_grad_()
        with poisoned():
            loss = _in_place_block(b, s, hq, hk, d, interleaved, in_place)(x, cos, sin)
            loss.backward()
        results.append((loss, x.grad))
    for ours, theirs in zip(*results, strict=True):
        assert rel_norm_error(ours, theirs) < 1e-6


def test_in_place_needs_a_contiguous_last_dim(device):
    inputs = _inputs(CASES["gqa3"], torch.float32, 24, device, layout="strided_d")
    with pytest.raises(ValueError, match="in_place=True needs q and k with a contiguous last"):
        rope(*inputs.values(), in_place=True)


@pytest.mark.parametrize("which", ["q", "k"])
def test_in_place_refuses_a_leaf_that_requires_grad(which, device):
    # as PyTorch's in-place ops do: the leaf's values would be lost to the rotated ones
    inputs = _inputs(CASES["gqa3"], torch.float32, 25, device)
    leaf = inputs[which].requires_grad_()
    before = leaf.detach().clone()
    with pytest.raises(RuntimeError, match=f"in_place=True would write over '{which}', a leaf"):
        rope(*inputs.values(), in_place=True)
    assert torch.equal(leaf.detach(), before)


# --------------------------------------------------------------------------- torch.compile


@pytest.mark.compile
def test_torch_compile_fullgraph(device):
    # Both layouts and pairings in one graph, forward and backward through the custom ops, q and
    # k cut from a fused projection inside the graph as an attention block does.
    torch._dynamo.reset()
    b, s, hq, hk, d = 2, 5, 4, 2, 32
    qkv = rand((b, s, (hq + 2 * hk) * d), torch.float32, device, gen=generator(17))
    cos, sin = rand((1, s, d), torch.float32, device, gen=generator(18)).chunk(2, dim=-1)
    cos, sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)

    def block(qkv, cos, sin):
        x = (qkv * 2.0).view(b, s, hq + 2 * hk, d)
        q, k = x[:, :, :hq], x[:, :, hq : hq + hk]
        q1, k1 = rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        q2, k2 = rope(q, k, cos[0], sin[0], unsqueeze_dim=2, interleaved=True)
        return q1.sin() + q2.transpose(1, 2), (k1 * k2.transpose(1, 2)).cos()

    compiled = torch.compile(block, fullgraph=True)
    results = []
    for fn in (compiled, block):
        x = qkv.detach().clone().requires_grad_()
        outs = fn(x, cos, sin)
        (outs[0].sum() + outs[1].sum()).backward()
        results.append((*outs, x.grad))
    for ours, theirs in zip(*results, strict=True):
        assert rel_norm_error(ours, theirs) < 1e-6


@pytest.mark.compile
def test_torch_compile_in_place(device):
    torch._dynamo.reset()
    b, s, hq, hk, d = 2, 5, 4, 2, 32
    qkv = rand((b, s, (hq + 2 * hk) * d), torch.float32, device, gen=generator(25))
    cos, sin = (rand((1, s, d), torch.float32, device, gen=generator(i)) for i in (26, 27))
    results = []
    for in_place, compile_it in ((False, False), (True, True)):
        block = _in_place_block(b, s, hq, hk, d, False, in_place)
        fn = torch.compile(block, fullgraph=True) if compile_it else block
        x = qkv.detach().clone().requires_grad_()
        loss = fn(x, cos, sin)
        loss.backward()
        results.append((loss, x.grad))
    for ours, theirs in zip(*results, strict=True):
        assert rel_norm_error(ours, theirs) < 1e-6


# --------------------------------------------------------------------------- benchmark spec


def test_bench_bytes_count_each_tensor_once(device):
    shape = {"tokens": 6, "heads": 4, "kv_heads": 2, "head_dim": 32}
    for dtype in (torch.bfloat16, torch.float32):
        inp = ROPE.make_inputs(shape, dtype, device)
        q, k, cos, sin = (inp[n] for n in ("q", "k", "cos", "sin"))
        assert q.shape == (1, 4, 6, 32) and not q.is_contiguous()  # HF's transposed view
        assert cos.shape == (1, 6, 32) and cos.dtype == dtype
        q_out, k_out = rope(q, k, cos, sin)
        tables = cos.nbytes + sin.nbytes
        fwd = q.nbytes + k.nbytes + tables + q_out.nbytes + k_out.nbytes
        bwd = q_out.nbytes + k_out.nbytes + tables + q.nbytes + k.nbytes  # dq_out, dk_out in
        assert ROPE.bytes(shape, dtype, "forward") == fwd
        assert ROPE.bytes(shape, dtype, "backward") == bwd
        assert ROPE.bytes(shape, dtype, "full") == fwd + bwd


def test_bench_sweeps_cover_the_model_registry():
    configs = {(m.heads, m.kv_heads, m.head_dim) for m in MODELS}
    (head_sweep,) = [s for s in ROPE.sweeps if s.name == "qk_width"]
    shapes = head_sweep.shapes()
    assert {(sh["heads"], sh["kv_heads"], sh["head_dim"]) for _, sh in shapes} == configs
    assert len({x for x, _ in shapes}) == len(configs)  # one distinct x per config
    assert all(sh["tokens"] == 8192 for _, sh in shapes)


def test_bench_end_to_end(device):
    # The quick sweep (the interpreter's tiny one on CPU) through the real providers.
    ctx = make_context(device, copy_gbps=1000.0)
    rows = run_spec(ROPE, providers=["kernelwright", "torch"], quick=True, ctx=ctx)
    assert rows and all(r.ok for r in rows), [r.error for r in rows if r.error]
    assert {r.mode for r in rows} == {"forward", "backward", "full"}
