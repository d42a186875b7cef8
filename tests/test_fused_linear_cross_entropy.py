"""fused_linear_cross_entropy: loss and hidden / weight / bias gradients against the fp64
reference (logits in fp64, then cross_entropy_ref) and against eager PyTorch, chunking (ragged
last chunk), every reduction (and the recompute-in-backward path of "none"), the loss options,
fp32 accumulation, tied embeddings, partial requires_grad, gradient accumulation, all rows
ignored, autocast, the chunk heuristic, errors, the module and torch.compile."""

import functools

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICE, ON_GPU

import kernelwright.ops.fused_linear_cross_entropy as FL
from kernelwright.ops.fused_linear_cross_entropy import (
    FusedLinearCrossEntropyLoss,
    choose_chunk_rows,
    fused_linear_cross_entropy,
    fused_linear_cross_entropy_eager,
    fused_linear_cross_entropy_ref,
)
from kernelwright.testing import (
    Tolerance,
    check_op,
    class_targets,
    generator,
    poisoned,
    rand,
    rel_norm_error,
)

# Relative-norm error bounds vs the fp64 reference, about 2x the worst measured under the
# interpreter over every comparison in this file (CPU matmuls; H = 32, std-1 hidden, weight
# std 0.5, so the logits have std ~3):
#   loss: fp32 1.5e-7; in fp16 / bf16 the logits are rounded to the matmul dtype (as in eager
#       PyTorch), which dominates: fp16 1.3e-4, bf16 8.5e-4 (per-token "none" losses; a mean
#       averages it down: 2.9e-4 at V = 128256);
#   grads: fp32 4.4e-7; fp16 6.7e-4, bf16 9.0e-3 (dlogits rounded to the dtype -- truncated by
#       the interpreter -- then half-precision matmuls, grad_weight summed over the chunks).
# The fp32 bounds leave room for the GPU's cuBLAS summation order over H = 512 and V = 128256
# (fp32 matmuls without TF32: PyTorch's default).
# On the GPU (H200, measured): fp32 grads 3.4-3.6e-6 (the GPU's approximate exp in the
# softmax), fp16 grads 2.0-2.1e-3 (cuBLAS's fp16 logits): bounds ~2x those there.
TOL = {
    torch.float32: Tolerance(fwd=1e-6, bwd=8e-6 if ON_GPU else 2e-6),
    torch.float16: Tolerance(fwd=3e-4, bwd=4.5e-3 if ON_GPU else 1.4e-3),
    torch.bfloat16: Tolerance(fwd=1.7e-3, bwd=1.8e-2),
}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
REDUCTIONS = ["mean", "sum", "none"]
F64 = torch.float64
GRADS = ("hidden", "weight", "bias")

# N tokens, hidden size H, vocabulary sizes (the interpreter table: one block up to 4096, looped
# above) and a chunk size leaving a ragged last chunk (45 = 16 + 16 + 13).
if ON_GPU:
    N, H, VS, CHUNK = 2048, 512, [32000, 128256], 1000  # 2048 = 1000 + 1000 + 48
else:
    N, H, VS, CHUNK = 45, 32, [300, 5001], 16
LLAMA3_V = 128256
# Under the interpreter the backward's scaling of grad_weight by a non-unit upstream gradient is
# one program per vocabulary row (~0.6 ms each): at V = 5001 the weight is frozen for "mean" /
# "sum" (its gradient is the same matmul of the same dlogits at any V, checked at V = 300).
SLOW_WEIGHT = () if ON_GPU else ("weight",)


def _inputs(n, V, dtype, seed, *, bias=True, lead=None, layout="contiguous"):
    gen = generator(seed)
    lead = lead or (n,)
    hidden = rand(tuple(lead) + (H,), dtype, DEVICE, gen=gen, layout=layout)
    weight = rand((V, H), dtype, DEVICE, gen=gen, std=0.5, layout=layout)
    b = rand((V,), dtype, DEVICE, gen=gen) if bias else None
    return {"hidden": hidden, "weight": weight, "bias": b}


def _targets(lead, V, seed, *, ignore_index=-100, frac=0.25, dtype=torch.int64):
    """Random classes, about `frac` ignored; the first row never, the last one always."""
    gen = generator(seed + 500)
    lead = tuple(lead)
    t = class_targets(lead, V, gen, "cpu", ignore_fraction=frac, ignore_index=ignore_index)
    t = t.reshape(-1)
    t[0] = (ignore_index + 1) % V if t[0] == ignore_index else t[0]
    t[-1] = ignore_index
    return t.reshape(lead).to(dtype).to(DEVICE)


def _class_weight(V, seed):
    return (0.5 + 1.5 * torch.rand(V, generator=generator(seed + 900))).to(DEVICE)


REF = functools.partial(fused_linear_cross_entropy_ref, dtype=F64)


def _report(inputs, dtype, seed=0, fn=fused_linear_cross_entropy, frozen=(), **kwargs):
    # check_op: our outputs and gradients poisoned first, the reference on fp64 copies, the same
    # random upstream gradients (a random scalar for "mean"/"sum", per token for "none").
    # `frozen` inputs get no gradient.
    grads = [k for k in GRADS if inputs.get(k) is not None and k not in frozen]
    return check_op(
        fn,
        REF,
        inputs,
        kwargs=kwargs,
        grad_inputs=grads,
        tolerances=TOL,
        dtype=dtype,
        ref_dtype=F64,
        seed=seed,
    )


def _check(inputs, dtype, seed=0, frozen=(), **kwargs):
    report = _report(inputs, dtype, seed, frozen=frozen, **kwargs)
    report.assert_ok()
    return report


def _leaves(inputs, dtype=None, requires=GRADS):
    out = {}
    for k, v in inputs.items():
        if v is None:
            out[k] = None
            continue
        v = v.detach().to(dtype, copy=True) if dtype else v.detach().clone()
        out[k] = v.requires_grad_(k in requires)
    return out


# --------------------------------------------------------------------------- vs the reference


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matches_reference_and_eager(dtype, reduction):
    # Several chunks with a ragged last one. Also STYLE 4 for matmul-like ops: our error vs
    # fp64 is within twice that of eager PyTorch in the same dtype (logits in the dtype, then
    # F.cross_entropy in fp32) plus a small epsilon, for the loss and every gradient.
    V = VS[0]
    inputs = _inputs(N, V, dtype, 0)
    t = _targets((N,), V, 0)
    ours = _check(inputs, dtype, 1, target=t, reduction=reduction, chunk_size=CHUNK)
    eager_fn = fused_linear_cross_entropy_eager
    eager = _report(inputs, dtype, 1, fn=eager_fn, target=t, reduction=reduction)
    eps = 1e-6 if dtype == torch.float32 else 1e-4
    for a, b in zip(ours.rows, eager.rows, strict=True):
        assert a.name == b.name
        assert a.error <= 2 * b.error + eps, (a.name, a.error, b.error)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_looped_vocabulary(dtype, reduction):
    V = VS[1]
    inputs = _inputs(N, V, dtype, 2)
    frozen = SLOW_WEIGHT if reduction != "none" else ()
    t = _targets((N,), V, 2)
    _check(inputs, dtype, 3, frozen, target=t, reduction=reduction, chunk_size=CHUNK)


OPTIONS = {
    "ignore_index_3": dict(ignore_index=3),
    "class_weight": dict(class_weight=True),
    "smoothing": dict(label_smoothing=0.1),
    "smoothing_class_weight": dict(label_smoothing=0.2, class_weight=True),
    "softcap": dict(softcap=4.0),
    "z_loss": dict(lse_square_scale=1e-2),
    "z_loss_returned": dict(lse_square_scale=1e-2, return_z_loss=True),
    "num_items_int": dict(num_items_in_batch=29),
    "num_items_tensor": dict(num_items_in_batch="tensor"),
    "everything": dict(
        ignore_index=-1,
        class_weight=True,
        label_smoothing=0.1,
        softcap=5.0,
        lse_square_scale=1e-3,
        return_z_loss=True,
        num_items_in_batch=31,
    ),
}
OPTION_CASES = [
    (name, reduction)
    for name in OPTIONS
    for reduction in REDUCTIONS
    if reduction == "mean" or (reduction == "none" and "num_items_in_batch" not in OPTIONS[name])
]  # "sum" is "mean" without the division: in the main grid


def _options(name, V, seed):
    kw = dict(OPTIONS[name])
    if kw.pop("class_weight", False):
        kw["class_weight"] = _class_weight(V, seed)
    if kw.get("num_items_in_batch") == "tensor":
        kw["num_items_in_batch"] = torch.tensor(27, device=DEVICE)
    return kw


@pytest.mark.parametrize("name,reduction", OPTION_CASES, ids=[f"{n}-{r}" for n, r in OPTION_CASES])
def test_options(name, reduction):
    V = VS[0]
    kw = _options(name, V, 6)
    t = _targets((N,), V, 6, ignore_index=kw.get("ignore_index", -100))
    _check(_inputs(N, V, torch.float32, 6), torch.float32, 7, target=t, reduction=reduction, **kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_options_looped_and_half(dtype):
    # Every option at once through the looped kernel, and in bf16.
    for V in VS:
        for reduction in ("mean", "none"):
            kw = _options("everything", V, 8)
            if reduction == "none":
                kw.pop("num_items_in_batch")
            t = _targets((N,), V, 8, ignore_index=-1)
            inputs = _inputs(N, V, dtype, 8)
            frozen = SLOW_WEIGHT if reduction != "none" and VS[1] == V else ()
            _check(inputs, dtype, 9, frozen, target=t, reduction=reduction, chunk_size=CHUNK, **kw)


def test_more_seeds_no_bias():
    for seed in (10, 11):
        inputs = _inputs(N, VS[0], torch.float32, seed, bias=False)
        for reduction in REDUCTIONS:
            t = _targets((N,), VS[0], seed)
            _check(inputs, torch.float32, seed, target=t, reduction=reduction, chunk_size=CHUNK)


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_three_d_hidden_and_layouts(layout):
    # [B, S, H] hidden with [B, S] int32 targets; "transposed": hidden's and weight's last
    # dimension is not contiguous (hidden is copied, weight goes to the matmul as it is).
    V = VS[0]
    lead = (3, N // 3)
    inputs = _inputs(N, V, torch.float32, 13, lead=lead, layout=layout)
    assert inputs["hidden"].is_contiguous() == (layout == "contiguous")
    t = _targets(lead, V, 13, dtype=torch.int32)
    for reduction in REDUCTIONS:
        _check(inputs, torch.float32, 14, target=t, reduction=reduction, chunk_size=CHUNK)


@pytest.mark.parametrize("chunk", [1, 7, N, 10 * N, None])
def test_chunk_sizes(chunk):
    # One token per chunk, a ragged last chunk, exactly one chunk, a chunk larger than the
    # batch, and the default (from V and the memory budget).
    V = VS[0]
    inputs = _inputs(N, V, torch.float32, 15)
    _check(inputs, torch.float32, 16, target=_targets((N,), V, 15), chunk_size=chunk)


def test_large_vocab_bf16():
    # Llama 3's vocabulary with a handful of tokens: the loss within 1e-3 of fp64 (the logits
    # are rounded to bf16 as in eager PyTorch; lse accumulates in fp32), gradients within TOL.
    n = 6 if not ON_GPU else 512
    inputs = _inputs(n, LLAMA3_V, torch.bfloat16, 17)
    t = _targets((n,), LLAMA3_V, 17)
    report = _check(inputs, torch.bfloat16, 18, SLOW_WEIGHT, target=t)
    assert report.rows[0].error < 1e-3
    loss = fused_linear_cross_entropy(inputs["hidden"], inputs["weight"], t, inputs["bias"])
    ref = REF(inputs["hidden"], inputs["weight"], t, inputs["bias"])
    assert abs(loss.item() - ref.item()) / abs(ref.item()) < 1e-3


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_fp32_accumulation(reduction, monkeypatch):
    # accum_dtype=torch.float32: grad_weight summed over the chunks in an fp32 buffer (seen by a
    # spy on the update), returned in the weight dtype (check_op checks that), and no less
    # accurate than summing in bf16. Measured with 12 chunks of 4 tokens: weight 6.2e-3 with
    # fp32 sums vs 6.7e-3 in bf16 (the bf16 rounding of dlogits dominates either way).
    acc_dtypes = []
    addmm = FL._addmm_
    monkeypatch.setattr(
        FL, "_addmm_", lambda acc, *a: (acc_dtypes.append(acc.dtype), addmm(acc, *a))
    )
    V = VS[0]
    inputs = _inputs(N, V, torch.bfloat16, 19)
    t = _targets((N,), V, 19)
    errs = {}
    for acc in (None, torch.float32):
        acc_dtypes.clear()
        kw = dict(target=t, reduction=reduction, chunk_size=4, accum_dtype=acc)
        report = _check(inputs, torch.bfloat16, 20, **kw)
        assert acc_dtypes == [acc or torch.bfloat16] * -(-N // 4)  # one update per chunk
        errs[acc] = {r.name: r.error for r in report.rows}
    assert errs[torch.float32]["weight"] <= errs[None]["weight"] * 1.02
    # accum_dtype equal to the weight dtype is accepted (a no-op), and fp32 for fp32 weights
    _check(inputs, torch.bfloat16, 20, target=t, chunk_size=4, accum_dtype=torch.bfloat16)
    fp32 = _inputs(N, V, torch.float32, 21)
    _check(fp32, torch.float32, 22, target=t, chunk_size=CHUNK, accum_dtype=torch.float32)


# --------------------------------------------------------------------------- autograd cases


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_tied_embedding_weight(reduction):
    # The lm-head weight is also the input embedding: its gradient is the embedding lookup's
    # (scatter-added rows) plus ours, accumulated by autograd.
    V = VS[0]
    ids = torch.randint(0, V, (N,), generator=generator(23)).to(DEVICE)
    t = _targets((N,), V, 23)
    w0 = rand((V, H), torch.float32, DEVICE, gen=generator(24), std=0.5)
    dy = None
    grads = []
    for dtype in (torch.float32, F64):
        emb = torch.nn.Embedding(V, H, device=DEVICE, dtype=dtype)
        with torch.no_grad():
            emb.weight.copy_(w0)
        hidden = torch.tanh(emb(ids) * 1.5)
        if dtype == F64:
            loss = REF(hidden, emb.weight, t, reduction=reduction)
        else:
            with poisoned():
                loss = fused_linear_cross_entropy(
                    hidden, emb.weight, t, reduction=reduction, chunk_size=CHUNK
                )
            dy = rand(loss.shape, torch.float32, DEVICE, gen=generator(25))
        loss.backward(dy.to(dtype))
        grads.append(emb.weight.grad)
    assert rel_norm_error(grads[0], grads[1]) < TOL[torch.float32].bwd


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_frozen_weight(reduction, monkeypatch):
    # Only hidden requires grad (a frozen lm head): no weight gradient is computed at all.
    calls = []
    addmm = FL._addmm_
    monkeypatch.setattr(FL, "_addmm_", lambda *a: (calls.append(a), addmm(*a)))
    V = VS[0]
    inputs = _inputs(N, V, torch.float32, 26)
    t = _targets((N,), V, 26)
    leaves = _leaves(inputs, requires=("hidden",))
    with poisoned():
        loss = fused_linear_cross_entropy(**leaves, target=t, reduction=reduction, chunk_size=CHUNK)
        loss.backward(torch.full_like(loss, 0.37))
    assert calls == []
    assert leaves["weight"].grad is None and leaves["bias"].grad is None
    ref_in = _leaves(inputs, F64, requires=("hidden",))
    REF(**ref_in, target=t, reduction=reduction).backward(
        torch.full(loss.shape, 0.37, dtype=F64, device=DEVICE)
    )
    assert rel_norm_error(leaves["hidden"].grad, ref_in["hidden"].grad) < TOL[torch.float32].bwd


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_only_weight_requires_grad(reduction, monkeypatch):
    # hidden without grad (say, a frozen trunk): no [N, H] hidden gradient is allocated.
    shapes = []
    empty = FL.empty
    monkeypatch.setattr(
        FL, "empty", lambda shape, **kw: (shapes.append(tuple(shape)), empty(shape, **kw))[1]
    )
    V = VS[0]
    inputs = _inputs(N, V, torch.float32, 27)
    t = _targets((N,), V, 27)
    leaves = _leaves(inputs, requires=("weight",))
    with poisoned():
        loss = fused_linear_cross_entropy(**leaves, target=t, reduction=reduction, chunk_size=CHUNK)
        loss.backward(torch.full_like(loss, -0.5))
    assert (N, H) not in shapes
    assert leaves["hidden"].grad is None and leaves["bias"].grad is None
    ref_in = _leaves(inputs, F64, requires=("weight",))
    REF(**ref_in, target=t, reduction=reduction).backward(
        torch.full(loss.shape, -0.5, dtype=F64, device=DEVICE)
    )
    assert rel_norm_error(leaves["weight"].grad, ref_in["weight"].grad) < TOL[torch.float32].bwd


def test_no_grad_returns_the_loss():
    V = VS[0]
    inputs = _inputs(N, V, torch.float32, 28)
    t = _targets((N,), V, 28)
    leaves = _leaves(inputs)
    for reduction in REDUCTIONS:
        with torch.no_grad(), poisoned():
            loss = fused_linear_cross_entropy(
                **leaves, target=t, reduction=reduction, chunk_size=CHUNK
            )
        assert not loss.requires_grad
        ref = REF(**inputs, target=t, reduction=reduction)
        assert rel_norm_error(loss, ref) < TOL[torch.float32].fwd
    # inputs that need no gradient at all, outside no_grad
    loss = fused_linear_cross_entropy(**inputs, target=t, chunk_size=CHUNK)
    assert not loss.requires_grad


def test_no_grad_computes_no_gradients(monkeypatch):
    calls = []
    launch = FL.cross_entropy_fwd_launch
    monkeypatch.setattr(
        FL, "cross_entropy_fwd_launch", lambda *a, **k: (calls.append(k["grad"]), launch(*a, **k))
    )
    inputs = _inputs(N, VS[0], torch.float32, 29)
    leaves = _leaves(inputs)
    with torch.no_grad():
        fused_linear_cross_entropy(**leaves, target=_targets((N,), VS[0], 29), chunk_size=CHUNK)
    assert calls and all(g is None for g in calls)


def test_second_backward():
    # Gradients computed in the forward ("mean", "sum"): a second backward is refused. "none"
    # recomputes in its backward, so a retained graph gives the same gradients again.
    V = VS[0]
    inputs = _inputs(N, V, torch.float32, 30)
    t = _targets((N,), V, 30)
    leaves = _leaves(inputs)
    loss = fused_linear_cross_entropy(**leaves, target=t, chunk_size=CHUNK)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="fused_linear_cross_entropy: backward ran twice"):
        loss.backward()
    leaves = _leaves(inputs)
    loss = fused_linear_cross_entropy(**leaves, target=t, reduction="none", chunk_size=CHUNK)
    dy = rand(loss.shape, torch.float32, DEVICE, gen=generator(31))
    loss.backward(dy, retain_graph=True)
    first = {k: leaves[k].grad.clone() for k in GRADS}
    loss.backward(dy)
    for k in GRADS:
        assert rel_norm_error(leaves[k].grad, 2 * first[k]) < 1e-6


@pytest.mark.parametrize("num_items_kind", ["int", "tensor"])
def test_gradient_accumulation_with_num_items(num_items_kind):
    # Two micro-batches with num_items_in_batch = the non-ignored count of both: the summed
    # losses and accumulated gradients equal one batch of both with reduction="mean".
    V = VS[0]
    inputs = _inputs(2 * N, V, torch.float32, 32)
    t = _targets((2 * N,), V, 32)
    t[N - 1] = -100  # each half has ignored rows
    n = int((t != -100).sum())
    n = torch.tensor(n, device=DEVICE) if num_items_kind == "tensor" else n
    micro = _leaves(inputs)
    total = 0.0
    for half in (slice(0, N), slice(N, 2 * N)):
        loss = fused_linear_cross_entropy(
            micro["hidden"][half],
            micro["weight"],
            t[half],
            micro["bias"],
            num_items_in_batch=n,
            chunk_size=CHUNK,
        )
        loss.backward()
        total = total + loss.detach()
    whole = _leaves(inputs)
    loss = fused_linear_cross_entropy(**whole, target=t, chunk_size=CHUNK)
    loss.backward()
    assert rel_norm_error(total, loss.detach()) < 1e-6
    for k in GRADS:
        assert rel_norm_error(micro[k].grad, whole[k].grad) < 1e-6
    ref = _leaves(inputs, F64)
    REF(**ref, target=t).backward()
    for k in GRADS:
        assert rel_norm_error(micro[k].grad, ref[k].grad) < TOL[torch.float32].bwd


@pytest.mark.skipif(
    ON_GPU, reason="on a GPU a device-side assert (test_cross_entropy's own process)"
)
@pytest.mark.parametrize("bad", [-1, "V"], ids=["negative", "V"])
def test_out_of_range_target_raises(bad):
    # As cross_entropy: a target outside [0, V) that is not ignore_index is an error naming
    # it (before: a silent NaN loss); so is num_items_in_batch = 0 (before: an infinite loss).
    V = VS[0]
    inputs = _inputs(N, V, torch.float32, 36)
    t = _targets((N,), V, 36)
    t[2] = V if bad == "V" else bad
    with pytest.raises(ValueError, match=rf"target\[2\] = {int(t[2])} .*V = {V} .*\(-100\)"):
        fused_linear_cross_entropy(**inputs, target=t, chunk_size=CHUNK)
    t[2] = -100
    for n in (0, torch.tensor(0.0, device=DEVICE)):
        with pytest.raises(ValueError, match="num_items_in_batch must be > 0"):
            fused_linear_cross_entropy(**inputs, target=t, num_items_in_batch=n)
    assert torch.isfinite(fused_linear_cross_entropy(**inputs, target=t, chunk_size=CHUNK))


@pytest.mark.parametrize(
    "reduction,kw",
    [("sum", {}), ("none", {}), ("mean", {}), ("mean", dict(num_items_in_batch=5))],
    ids=["sum", "none", "mean", "mean_num_items"],
)
def test_all_rows_ignored(reduction, kw):
    # "sum" / "none": 0, zero gradients. "mean": 0 / 0 = NaN as in PyTorch, zero gradients.
    # num_items_in_batch > 0: 0.
    V = VS[0]
    inputs = _inputs(N, V, torch.float32, 33)
    t = torch.full((N,), -100, dtype=torch.int64, device=DEVICE)
    leaves = _leaves(inputs)
    with poisoned():
        loss = fused_linear_cross_entropy(
            **leaves, target=t, reduction=reduction, chunk_size=CHUNK, **kw
        )
        loss.backward(torch.full_like(loss, 0.37))
    logits = F.linear(inputs["hidden"].double(), inputs["weight"].double(), inputs["bias"].double())
    pt = F.cross_entropy(logits, t, reduction="sum" if kw else reduction)
    if reduction == "mean" and not kw:
        assert torch.isnan(pt) and torch.isnan(loss)
    else:
        assert torch.equal(loss, torch.zeros_like(loss)) and (pt == 0).all()
    for k in GRADS:
        assert torch.equal(leaves[k].grad, torch.zeros_like(leaves[k]))


def test_autocast_bf16():
    # fp32 inputs under autocast(bf16): the matmuls run in bf16 (as nn.Linear would), so the
    # result matches the reference on bf16-rounded inputs; gradients come back in fp32.
    V = VS[0]
    inputs = _inputs(N, V, torch.float32, 34)
    t = _targets((N,), V, 34)
    leaves = _leaves(inputs)
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        loss = fused_linear_cross_entropy(**leaves, target=t, chunk_size=CHUNK)
    assert loss.dtype == torch.float32
    loss.backward()
    ref = _leaves({k: v.to(torch.bfloat16) for k, v in inputs.items()}, F64)
    ref_loss = REF(**ref, target=t)
    ref_loss.backward()
    tol = TOL[torch.bfloat16]
    assert rel_norm_error(loss, ref_loss) < tol.fwd
    for k in GRADS:
        assert leaves[k].grad.dtype == torch.float32
        assert rel_norm_error(leaves[k].grad, ref[k].grad) < tol.bwd
    # and it differs from the fp32 computation by bf16 rounding, i.e. it did run in bf16
    fp32 = fused_linear_cross_entropy(**inputs, target=t, chunk_size=CHUNK)
    assert 1e-6 < rel_norm_error(loss, fp32) < tol.fwd


def test_choose_chunk_rows():
    # Tokens per chunk: a multiple of 64 (whole matmul tiles), at least 64, never more than the
    # tokens, never fewer than 1; the logits buffer within the budget (CHUNK_BYTES, or `budget`)
    # unless a floor (64 rows, MIN_CHUNK_TOKENS, a share of the tokens) says otherwise. The
    # anchors, at 8192 tokens, hold for the 128 MiB default: 512 rows at V = 128256 in bf16.
    cpu = torch.device("cpu")
    n = 8192
    assert choose_chunk_rows(n, 128256, 2, cpu) == 512
    assert choose_chunk_rows(n, 32000, 2, cpu) == 2048
    assert choose_chunk_rows(n, 128256, 2, cpu, budget=2**30) == 4160  # 4186 -> 64k
    assert choose_chunk_rows(n, 32000, 2, cpu, budget=64 * 2**20) == 1024
    assert choose_chunk_rows(100, 128256, 2, cpu) == 100  # clamped to the token count
    assert choose_chunk_rows(1, 32000, 2, cpu) == 1
    assert choose_chunk_rows(0, 32000, 2, cpu) == 1
    for n in (1, 45, 63, 64, 65, 1000, 8192, 10**6):
        for V in (1, 300, 5001, 128256, 262144):
            for itemsize in (2, 4):
                rows = choose_chunk_rows(n, V, itemsize, cpu)
                assert 1 <= rows <= max(n, 1)
                assert rows == n or (rows % 64 == 0 and rows >= 64)
                # more tokens never give smaller chunks; a larger vocabulary never larger ones
                assert choose_chunk_rows(2 * n, V, itemsize, cpu) >= rows
                assert choose_chunk_rows(n, 2 * V, itemsize, cpu) <= rows


# --------------------------------------------------------------------------- errors


def _bad_input_cases():
    gen = generator(35)
    h = rand((4, 8), torch.float32, "cpu", gen=gen)
    w = rand((10, 8), torch.float32, "cpu", gen=gen)
    t = torch.tensor([1, 2, 3, -100], device=DEVICE)
    return {
        "hidden_size": (
            (h[:, :7], w, t),
            {},
            ValueError,
            r"hidden's last dimension \(7\) must match",
        ),
        "weight_1d": ((h, w[0], t), {}, ValueError, "'weight' must have at least 2 dimension"),
        "weight_3d": ((h, w.view(2, 5, 8), t), {}, ValueError, r"weight must be \[V, H\]"),
        "dtype_mismatch": ((h, w.bfloat16(), t), {}, TypeError, "must have one dtype"),
        "bias_dtype": (
            (h, w, t, torch.ones(10, dtype=torch.float16, device=DEVICE)),
            {},
            TypeError,
            r"and bias \(torch.float16\)",
        ),
        "bias_shape": (
            (h, w, t, torch.ones(11, device=DEVICE)),
            {},
            ValueError,
            r"bias must have shape \(10,\)",
        ),
        "chunk_zero": ((h, w, t), dict(chunk_size=0), ValueError, "an int >= 1, got 0"),
        "chunk_float": ((h, w, t), dict(chunk_size=2.5), ValueError, "an int >= 1, got 2.5"),
        "empty_hidden": (
            (h[:, :0], w[:, :0], t),
            {},
            ValueError,
            r"empty last dimension \(H = 0\)",
        ),
        "accum_fp16": (
            (h, w, t),
            dict(accum_dtype=torch.float16),
            ValueError,
            "accum_dtype must be None or torch.float32",
        ),
        "no_classes": ((h, w[:0], t), {}, ValueError, r"weight has no classes \(V = 0\)"),
        "float_target": ((h, w, t.float()), {}, TypeError, "int64 or int32"),
        "target_shape": (
            (h.view(2, 2, 8), w, t),
            {},
            ValueError,
            r"hidden's leading shape \(2, 2\)",
        ),
        "target_count": ((h, w, t[:3]), {}, ValueError, "one class index per row"),
        "reduction": (
            (h, w, t),
            dict(reduction="batchmean"),
            ValueError,
            "reduction must be one of",
        ),
        "smoothing": (
            (h, w, t),
            dict(label_smoothing=2.0),
            ValueError,
            "label_smoothing must be in",
        ),
        "z_scale": (
            (h, w, t),
            dict(lse_square_scale=-1.0),
            ValueError,
            "lse_square_scale must be >= 0",
        ),
        "softcap": ((h, w, t), dict(softcap=0.0), ValueError, "softcap must be > 0"),
        "num_items_sum": (
            (h, w, t),
            dict(reduction="sum", num_items_in_batch=3),
            ValueError,
            "num_items_in_batch",
        ),
        "class_weight_shape": (
            (h, w, t),
            dict(class_weight=torch.ones(9, device=DEVICE)),
            ValueError,
            r"class weights must have shape \(10,\)",
        ),
        "int_hidden": ((h.long(), w, t), {}, TypeError, "'hidden' must have dtype"),
    }


@pytest.mark.parametrize("case", list(_bad_input_cases()))
def test_bad_input_errors(case):
    args, kwargs, exc, match = _bad_input_cases()[case]
    args = tuple(a.to(DEVICE) for a in args)
    with pytest.raises(exc, match=match):
        fused_linear_cross_entropy(*args, **kwargs)


def test_harness_catches_a_wrong_kernel():
    # A check that cannot fail is a defect: dropping the bias, and using the transposed-free
    # weight gradient of another input, must both fail against the reference.
    V = VS[0]
    inputs = _inputs(N, V, torch.float32, 36)
    t = _targets((N,), V, 36)
    no_bias = lambda hidden, weight, bias, **kw: fused_linear_cross_entropy(hidden, weight, **kw)
    assert not _report(inputs, torch.float32, fn=no_bias, target=t).ok

    def scaled_hidden(hidden, weight, bias, **kw):
        return fused_linear_cross_entropy(hidden * 1.01, weight, bias=bias, **kw)

    assert not _report(inputs, torch.float32, fn=scaled_hidden, target=t).ok


# --------------------------------------------------------------------------- module, compile


def test_module_matches_function():
    V = VS[0]
    inputs = _inputs(N, V, torch.float32, 37)
    t = _targets((N,), V, 37, ignore_index=-1)
    cw = _class_weight(V, 37)
    opts = dict(ignore_index=-1, reduction="sum", label_smoothing=0.1)
    extra = dict(lse_square_scale=1e-3, return_z_loss=True, softcap=20.0, chunk_size=CHUNK)
    mod = FusedLinearCrossEntropyLoss(**opts, class_weight=cw, **extra)
    a = mod(inputs["hidden"], inputs["weight"], t, inputs["bias"])
    b = fused_linear_cross_entropy(**inputs, target=t, class_weight=cw, **opts, **extra)
    for u, v in zip(a, b, strict=True):
        assert torch.equal(u, v)
    mean = FusedLinearCrossEntropyLoss(accum_dtype=torch.float32)
    t = _targets((N,), V, 37)
    got = mean(inputs["hidden"], inputs["weight"], t, num_items_in_batch=11)
    want = fused_linear_cross_entropy(inputs["hidden"], inputs["weight"], t, num_items_in_batch=11)
    assert torch.equal(got, want)
    assert "class_weight" in dict(mod.named_buffers())


@pytest.mark.compile
def test_torch_compile_fullgraph():
    torch._dynamo.reset()
    V = VS[0]
    inputs = _inputs(N, V, torch.float32, 38)
    t = _targets((N,), V, 38)
    cw = _class_weight(V, 38)

    def step(hidden, weight, bias):
        loss = fused_linear_cross_entropy(
            hidden * 2.0, weight, t, bias, class_weight=cw, label_smoothing=0.1, chunk_size=CHUNK
        )
        rows = fused_linear_cross_entropy(hidden, weight, t, reduction="none", softcap=3.0)
        return loss + (rows * rows).sum()

    compiled = torch.compile(step, fullgraph=True)
    a, b = _leaves(inputs), _leaves(inputs)
    out = compiled(**a)
    out.backward()
    out_r = step(**b)
    out_r.backward()
    assert rel_norm_error(out, out_r) < 1e-6
    for k in GRADS:
        assert rel_norm_error(a[k].grad, b[k].grad) < 1e-5
