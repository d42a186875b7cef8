"""cross_entropy: loss and logits gradient against the fp64 reference and against PyTorch's
F.cross_entropy in fp64, every reduction and option, both kernel paths, layouts, upstream
gradients, the issue's numerics (large vocabulary in bf16, "none" with ignored rows, gradient
accumulation, all rows ignored), in-place, bad targets, poisoned outputs, errors, the module and
torch.compile."""

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICE, H100, ON_GPU

import kernelwright.ops.cross_entropy as CE
from kernelwright.ops._held import HOLD_FROM
from kernelwright.ops.cross_entropy import (
    CrossEntropyLoss,
    cross_entropy,
    cross_entropy_eager,
    cross_entropy_fwd_launch,
    cross_entropy_ref,
    cross_entropy_scale_launch,
)
from kernelwright.runtime import LaunchConfig
from kernelwright.testing import (
    Tolerance,
    check_op,
    class_targets,
    generator,
    large_offset_rows,
    poisoned,
    rand,
    rel_norm_error,
)

# Relative-norm error bounds vs the fp64 reference (and vs F.cross_entropy in fp64), about 2x
# the worst measured under the interpreter over every comparison in this file (std-3 logits,
# |logits| up to 1e4 excepted, see test_large_magnitude_logits):
#   loss (fp32 whatever the logits dtype; the reference sees the same rounded logits, so only
#       fp32 arithmetic differs): fp32 2.2e-7, fp16 1.2e-7, bf16 1.3e-7. Bound 1e-6, not 5e-7:
#       the GPU's exp2/log2 approximations add an ulp or two per row;
#   grad (fp32 math, rounded once to the logits dtype): fp32 3.1e-7, fp16 4.8e-4, bf16 9.4e-3
#       (the interpreter truncates fp32 -> bf16: about twice round-to-nearest's error).
# On the GPU the fp16 gradients measured 1.4e-3 to 4.8e-3 (H200): a mean over 1025 rows of
# 32000-40000 classes gives values near 1/(V * rows) ~ 3e-8, below fp16's normal range (6e-5),
# so they round as subnormals. Any fp16 gradient of that loss does (PyTorch's too).
TOL = {
    torch.float32: Tolerance(fwd=1e-6, bwd=6e-7),
    torch.float16: Tolerance(fwd=1e-6, bwd=1e-2 if ON_GPU else 1e-3),
    torch.bfloat16: Tolerance(fwd=1e-6, bwd=1.9e-2),
}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
REDUCTIONS = ["mean", "sum", "none"]
F64 = torch.float64

# (leading dims, V): leading ranks 1-3, V = 1 and 2, odd sizes, and both kernel paths: the
# interpreter table takes one block of 4096 (one block up to V = 4096, looped above).
if ON_GPU:
    # Row counts kept small: every case also runs an fp64 reference and torch in fp64.
    SHAPES = [
        ((1025,), 32000),
        ((257,), 128256),
        ((33,), 262144),
        ((3, 1000), 257),
        ((2, 3, 5), 1),
        ((4, 2), 2),
        ((2, 515), 5001),
        ((1, 7, 300), 40000),
    ]
    OPT_LEAD, OPT_VS = (7, 300), [300, 40000]  # one block, looped
    BIG_ROWS = 1025
else:
    SHAPES = [
        ((37,), 300),
        ((2, 3), 1),
        ((3, 4), 2),
        ((2, 3, 2), 4096),
        ((5,), 4097),
        ((2, 5), 5001),
    ]
    OPT_LEAD, OPT_VS = (2, 5), [300, 5001]
    BIG_ROWS = 4
PATHS = ["one_block", "looped"]
LLAMA3_V = 128256


# --------------------------------------------------------------------------- helpers


def _logits(lead, V, dtype, seed, *, layout="contiguous", std=3.0, mean=0.0):
    return rand(
        tuple(lead) + (V,), dtype, DEVICE, gen=generator(seed), layout=layout, std=std, mean=mean
    )


def _targets(lead, V, seed, *, ignore_index=-100, frac=0.25, dtype=torch.int64):
    """Random classes with about `frac` of the rows ignored; the first row is never ignored and
    (with two rows or more) the last one always is."""
    gen = generator(seed + 500)
    t = class_targets(lead, V, gen, "cpu", ignore_fraction=frac, ignore_index=ignore_index)
    t = t.reshape(-1)
    t[0] = (ignore_index + 1) % V if t[0] == ignore_index else t[0]
    if t.numel() > 1:
        t[-1] = ignore_index
    return t.reshape(tuple(lead)).to(dtype).to(DEVICE)


def _class_weight(V, seed):
    gen = generator(seed + 900)
    return (0.5 + 1.5 * torch.rand(V, generator=gen)).to(DEVICE)  # in [0.5, 2)


def _upstream(loss, seed):
    """A random, non-unit gradient of the loss's shape (one scalar for "mean" / "sum")."""
    return rand(loss.shape, torch.float32, DEVICE, gen=generator(seed + 700))


def torch_ce(x, t, weight=None, **kw):
    """The same loss from PyTorch's F.cross_entropy in the dtype of x, with the extras composed
    around it: soft-capping before, z-loss added, num_items_in_batch as sum / n."""
    ignore_index = kw.get("ignore_index", -100)
    reduction = kw.get("reduction", "mean")
    s, cap, n = kw.get("lse_square_scale", 0.0), kw.get("softcap"), kw.get("num_items_in_batch")
    V = x.shape[-1]
    z = x.reshape(-1, V)
    tt = t.reshape(-1).long()
    if cap is not None:
        z = cap * torch.tanh(z / cap)
    w = weight.to(x.dtype) if weight is not None else None
    loss = F.cross_entropy(
        z,
        tt,
        w,
        ignore_index=ignore_index,
        reduction="sum" if n is not None else reduction,
        label_smoothing=kw.get("label_smoothing", 0.0),
    )
    valid = tt != ignore_index
    z_rows = torch.where(valid, s * torch.logsumexp(z, -1) ** 2, torch.zeros_like(z[:, 0]))
    if reduction == "none":
        loss, z_red = loss.view(t.shape), z_rows.view(t.shape)
    elif reduction == "sum":
        z_red = z_rows.sum()
    else:
        if n is not None:
            denom = torch.as_tensor(n, dtype=x.dtype, device=x.device)
            loss = loss / denom
        elif w is not None:
            denom = w[tt[valid]].sum()
        else:
            denom = valid.sum()
        z_red = z_rows.sum() / denom
    loss = loss + z_red
    return (loss, z_red.detach()) if kw.get("return_z_loss") else loss


def _as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


def _run(fn, x, t, weight, dy, kw, *, dtype=None):
    """Loss outputs and the logits gradient of fn on a leaf copy of x (layout kept)."""
    xl = x.detach().to(dtype or x.dtype, copy=dtype is not None).requires_grad_()
    outs = _as_tuple(fn(xl, t, weight, **kw))
    outs[0].backward(dy.to(outs[0].dtype) if dy is not None else None)
    return outs, xl.grad


def _ours(x, t, weight, dy, kw):
    with poisoned():
        outs, grad = _run(cross_entropy, x, t, weight, dy, kw)
    assert all(o.dtype == torch.float32 for o in outs)
    assert grad.dtype == x.dtype and grad.shape == x.shape
    return outs, grad


def _assert_close(out, ref, dtype, kind, what=""):
    tol = TOL[dtype].fwd if kind == "fwd" else TOL[dtype].bwd
    err = rel_norm_error(out, ref)
    assert err <= tol, f"{what} {kind} {dtype}: rel-norm error {err:.3e} > {tol:.1e}"


def _check(x, t, weight=None, *, dy="random", seed=0, **kw):
    """Our loss (every returned part) and logits gradient vs the fp64 reference and vs PyTorch
    in fp64, under the same upstream gradient; all outputs poisoned first."""
    ref_fn = functools.partial(cross_entropy_ref, dtype=F64)
    loss_shape = t.shape if kw.get("reduction") == "none" else ()
    if isinstance(dy, str) and dy == "random":
        dy = _upstream(torch.empty(loss_shape), seed)
    elif isinstance(dy, str) and dy == "ones":  # implicit for a scalar loss, else all ones
        dy = None if not loss_shape else torch.ones(loss_shape, device=DEVICE)
    outs, grad = _ours(x, t, weight, dy, kw)
    dy64 = dy.to(F64) if dy is not None else None
    for name, fn in [("ref", ref_fn), ("torch", torch_ce)]:
        r_outs, r_grad = _run(fn, x, t, weight, dy64, kw, dtype=F64)
        assert len(outs) == len(r_outs)
        for i, (o, r) in enumerate(zip(outs, r_outs, strict=True)):
            assert o.shape == r.shape, (name, i, o.shape, r.shape)
            _assert_close(o, r, x.dtype, "fwd", f"{name} out{i}")
        _assert_close(grad, r_grad, x.dtype, "bwd", name)
    return outs, grad


# --------------------------------------------------------------------------- vs the references


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lead,V", SHAPES, ids=str)
def test_matches_reference_and_torch(lead, V, dtype, reduction):
    x = _logits(lead, V, dtype, 0)
    _check(x, _targets(lead, V, 0), reduction=reduction, seed=1)


OPTIONS = {
    "ignore_index_3": dict(ignore_index=3),  # a real class index, ignored
    "smoothing": dict(label_smoothing=0.1),
    "smoothing_weights": dict(label_smoothing=0.25, weight=True),
    "weights": dict(weight=True),
    "z_loss": dict(lse_square_scale=1e-2),
    "z_loss_returned": dict(lse_square_scale=1e-2, return_z_loss=True),
    "z_part_without_z_loss": dict(return_z_loss=True),  # z part all zeros
    "softcap": dict(softcap=4.0),  # std-3 logits: the cap bends most of them
    "num_items_int": dict(num_items_in_batch=23),
    "num_items_tensor": dict(num_items_in_batch="tensor"),
    "everything": dict(
        ignore_index=-1,
        label_smoothing=0.1,
        weight=True,
        lse_square_scale=1e-3,
        return_z_loss=True,
        softcap=5.0,
        num_items_in_batch=19,
    ),
}


def _options(name, V, seed):
    kw = dict(OPTIONS[name])
    weight = _class_weight(V, seed) if kw.pop("weight", False) else None
    if kw.get("num_items_in_batch") == "tensor":
        kw["num_items_in_batch"] = torch.tensor(17, device=DEVICE)
    return weight, kw


def _check_options(name, reduction, path, dtype):
    V = OPT_VS[PATHS.index(path)]
    weight, kw = _options(name, V, 2)
    x = _logits(OPT_LEAD, V, dtype, 3)
    t = _targets(OPT_LEAD, V, 3, ignore_index=kw.get("ignore_index", -100))
    outs, _ = _check(x, t, weight, reduction=reduction, seed=4, **kw)
    if kw.get("return_z_loss"):
        z = outs[1]
        assert not z.requires_grad
        if kw.get("lse_square_scale", 0.0) == 0.0:
            assert torch.equal(z, torch.zeros_like(z))
        else:
            assert (z != 0).any()


# num_items_in_batch is the denominator of reduction="mean" only
OPTION_CASES = [
    (name, reduction)
    for name in OPTIONS
    for reduction in REDUCTIONS
    if reduction == "mean" or "num_items_in_batch" not in OPTIONS[name]
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name,reduction", OPTION_CASES, ids=[f"{n}-{r}" for n, r in OPTION_CASES])
def test_options(name, reduction, path):
    _check_options(name, reduction, path, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", list(OPTIONS))
def test_options_half_precision(name, path, dtype):
    # per-token losses ("none") carry the most information; "mean"/"sum" are in the main grid
    reduction = "mean" if "num_items_in_batch" in OPTIONS[name] else "none"
    _check_options(name, reduction, path, dtype)


def test_more_seeds():
    for seed in (5, 6, 7):
        for V in OPT_VS:
            weight, kw = _options("everything", V, seed)
            t = _targets(OPT_LEAD, V, seed, ignore_index=-1)
            _check(_logits(OPT_LEAD, V, torch.float32, seed), t, weight, seed=seed, **kw)


def test_reference_matches_torch_formulas_exactly():
    # The fp64 reference and the F.cross_entropy composition are two independent derivations:
    # they must agree to fp64 rounding, so either one is a valid oracle for the kernel.
    V = 37
    x = _logits((4, 5), V, F64, 8)
    for name in OPTIONS:
        weight, kw = _options(name, V, 8)
        t = _targets((4, 5), V, 8, ignore_index=kw.get("ignore_index", -100))
        for reduction in REDUCTIONS:
            if "num_items_in_batch" in kw and reduction != "mean":
                continue
            a = _as_tuple(cross_entropy_ref(x, t, weight, reduction=reduction, dtype=F64, **kw))
            b = _as_tuple(torch_ce(x, t, weight, reduction=reduction, **kw))
            for u, v in zip(a, b, strict=True):
                assert rel_norm_error(u, v) < 1e-12, (name, reduction)


@pytest.mark.parametrize("layout", ["row_strided", "transposed"])
@pytest.mark.parametrize("path", PATHS)
def test_non_contiguous_logits_and_targets(path, layout):
    V = OPT_VS[PATHS.index(path)]
    for lead in [(11,), (2, 5)]:
        x = _logits(lead, V, torch.float32, 9, layout=layout)
        assert not x.is_contiguous()
        # targets: every other element of a wider int32 tensor (stride 2)
        wide = torch.stack([_targets(lead, V, 9), _targets(lead, V, 10)], dim=-1)
        t = wide.to(torch.int32)[..., 0]
        assert not t.is_contiguous()
        for reduction in REDUCTIONS:
            _check(x, t, reduction=reduction, seed=11)
    # transposed targets for a rank-2 lead
    t = _targets((5, 2), V, 12).t()
    _check(_logits((2, 5), V, torch.bfloat16, 12, layout=layout), t, reduction="none", seed=12)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("path", PATHS)
def test_int32_targets(path, dtype):
    V = OPT_VS[PATHS.index(path)]
    t = _targets(OPT_LEAD, V, 13, dtype=torch.int32)
    weight = _class_weight(V, 13)
    for reduction in REDUCTIONS:
        _check(_logits(OPT_LEAD, V, dtype, 13), t, weight, reduction=reduction, seed=14)


def test_eager_provider_agrees():
    x = _logits((3, 7), 300, torch.bfloat16, 15)
    t = _targets((3, 7), 300, 15)
    assert rel_norm_error(cross_entropy(x, t), cross_entropy_eager(x, t)) < 1e-6


# --------------------------------------------------------------------------- issue numerics


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_bf16_large_vocab_fp32_accumulation(reduction):
    # (a) bf16 logits at Llama 3's vocabulary: lse accumulates in fp32 over 128256 classes (a
    # bf16 running sum would be ~1e-2 off); the loss stays within 1e-3 of fp64 (in fact ~1e-7).
    lead = (BIG_ROWS,)
    x = _logits(lead, LLAMA3_V, torch.bfloat16, 16, std=2.0)
    t = _targets(lead, LLAMA3_V, 16)
    outs, _ = _check(x, t, reduction=reduction, seed=17)
    ref = cross_entropy_ref(x, t, reduction=reduction, dtype=F64)
    valid = (t != -100).view(ref.shape) if reduction == "none" else torch.tensor(True)
    rel = ((outs[0].double() - ref).abs() / ref.abs().clamp_min(1e-30))[valid]
    assert rel.max().item() < 1e-3


@pytest.mark.parametrize("path", PATHS)
def test_none_with_ignore_index(path):
    # (b) per-token losses and gradients; ignored rows: loss exactly 0 and gradient row exactly 0,
    # under a random upstream gradient, a unit one and an expanded (stride-0) one.
    V = OPT_VS[PATHS.index(path)]
    for ignore_index in (-100, 7):
        x = _logits(OPT_LEAD, V, torch.bfloat16, 18)
        t = _targets(OPT_LEAD, V, 18, ignore_index=ignore_index, frac=0.4)
        ign = t == ignore_index
        assert ign.any() and (~ign).any()
        for dy in ("random", "ones", "expanded"):
            if dy == "expanded":
                xl = x.detach().clone().requires_grad_()
                with poisoned():
                    loss = cross_entropy(xl, t, reduction="none", ignore_index=ignore_index)
                    (loss.sum() * 0.37).backward()  # grad_loss: 0.37 expanded, stride 0
                xr = x.detach().to(F64).requires_grad_()
                ref = cross_entropy_ref(xr, t, reduction="none", ignore_index=ignore_index)
                (ref.sum() * 0.37).backward()
                _assert_close(loss, ref.detach(), torch.bfloat16, "fwd")
                _assert_close(xl.grad, xr.grad, torch.bfloat16, "bwd")
                grad = xl.grad
            else:
                (loss, *_), grad = _check(
                    x, t, reduction="none", ignore_index=ignore_index, dy=dy, seed=19
                )
            assert torch.equal(loss[ign], torch.zeros_like(loss[ign]))
            assert (loss[~ign] > 0).all()
            assert torch.equal(grad[ign], torch.zeros_like(grad[ign]))
            assert (grad[~ign] != 0).any(dim=-1).all()


@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "class_weights"])
@pytest.mark.parametrize("num_items_kind", ["int", "tensor"])
def test_gradient_accumulation_with_num_items(num_items_kind, weighted):
    # (c) Two micro-batches with num_items_in_batch = the non-ignored count of both give the
    # summed loss and the accumulated gradient of one batch of both with reduction="mean".
    # With class weights the batch "mean" divides by the summed weight of its targets instead.
    V = OPT_VS[0]
    x = _logits((2, 9), V, torch.float32, 20)
    t = _targets((2, 9), V, 20, frac=0.3)
    t[0, 1] = t[1, 2] = -100  # each micro-batch has ignored rows
    weight = _class_weight(V, 20) if weighted else None
    n = weight[t[t != -100]].sum().item() if weighted else int((t != -100).sum())
    n = torch.tensor(n, device=DEVICE) if num_items_kind == "tensor" else n
    xa = x.detach().clone().requires_grad_()
    total = sum(cross_entropy(xa[i], t[i], weight, num_items_in_batch=n) for i in range(2))
    total.backward()
    xb = x.detach().clone().requires_grad_()
    whole = cross_entropy(xb.reshape(-1, V), t.reshape(-1), weight)
    whole.backward()
    assert rel_norm_error(total, whole) < 1e-6
    assert rel_norm_error(xa.grad, xb.grad) < 1e-6
    # and both equal PyTorch's mean over the whole batch
    xr = x.detach().to(F64).requires_grad_()
    w64 = weight.double() if weighted else None
    torch_loss = F.cross_entropy(xr.reshape(-1, V), t.reshape(-1), w64)
    torch_loss.backward()
    assert rel_norm_error(total, torch_loss.detach()) < 1e-6
    assert rel_norm_error(xa.grad, xr.grad) < 1e-6


@pytest.mark.parametrize("path", PATHS)
def test_all_rows_ignored(path):
    # (d) No crash. "sum" / "none": 0 and zero gradients. "mean": 0 / 0 = NaN exactly as in
    # PyTorch (its gradient is all zeros, ours too). With num_items_in_batch > 0: 0.
    V = OPT_VS[PATHS.index(path)]
    x = _logits(OPT_LEAD, V, torch.float32, 21)
    t = torch.full(OPT_LEAD, -100, dtype=torch.int64, device=DEVICE)
    for reduction, kw in [
        ("sum", {}),
        ("none", {}),
        ("mean", {}),
        ("mean", dict(num_items_in_batch=8)),
        ("mean", dict(label_smoothing=0.1, lse_square_scale=1e-2, return_z_loss=True)),
    ]:
        xl = x.detach().clone().requires_grad_()
        with poisoned():
            outs = _as_tuple(cross_entropy(xl, t, reduction=reduction, **kw))
            outs[0].backward(_upstream(outs[0], 22))
        xt = x.detach().to(F64).requires_grad_()
        ref = _as_tuple(torch_ce(xt, t, reduction=reduction, **kw))
        ref[0].backward(_upstream(ref[0], 22).to(F64))
        assert torch.equal(xl.grad, torch.zeros_like(x))
        assert torch.equal(xt.grad, torch.zeros_like(xt))
        for o, r in zip(outs, ref, strict=True):
            if reduction == "mean" and "num_items_in_batch" not in kw:
                assert torch.isnan(r).all() and torch.isnan(o).all()
            else:
                assert torch.equal(o, torch.zeros_like(o)) and torch.equal(r, torch.zeros_like(r))


# --------------------------------------------------------------------------- upstream gradients


@pytest.mark.parametrize("path", PATHS)
def test_upstream_gradients(path):
    # A unit gradient (the kernel skips the multiply), 0.37, per-row random ("none"), a stride-0
    # expanded one and a transposed (non-contiguous) one.
    V = OPT_VS[PATHS.index(path)]
    x = _logits(OPT_LEAD, V, torch.float32, 23)
    t = _targets(OPT_LEAD, V, 23)
    for reduction in ("mean", "sum"):
        for dy in ("ones", torch.tensor(0.37, device=DEVICE), "random"):
            _check(x, t, reduction=reduction, dy=dy, label_smoothing=0.1, seed=24)
    for dy in ("ones", "random"):
        _check(x, t, reduction="none", dy=dy, seed=25)
    ones_but_one = torch.ones(OPT_LEAD, device=DEVICE)
    ones_but_one[1, 2] = -2.0  # the kernel skips rows whose gradient is exactly 1
    _check(x, t, reduction="none", dy=ones_but_one)
    # expanded (stride 0) and transposed gradients, through autograd
    for make in (
        lambda loss: loss.sum() * 0.37,
        lambda loss: (loss.t() * _upstream(loss.t(), 26)).sum(),
    ):
        xl = x.detach().clone().requires_grad_()
        with poisoned():
            make(cross_entropy(xl, t, reduction="none")).backward()
        xr = x.detach().to(F64).requires_grad_()
        make(cross_entropy_ref(xr, t, reduction="none", dtype=F64)).backward()
        _assert_close(xl.grad, xr.grad, torch.float32, "bwd")


# --------------------------------------------------------------------------- in place


def test_in_place_forward_writes_the_gradient_over_the_logits():
    # in_place=True: the same loss, and the logits buffer now holds dloss/dlogits (already
    # divided by the "mean" denominator) -- the caller must not read the logits afterwards.
    for path, V in zip(PATHS, OPT_VS, strict=True):
        a = _logits(OPT_LEAD, V, torch.bfloat16, 27).requires_grad_()
        t = _targets(OPT_LEAD, V, 27)
        logits = a * 2.0  # non-leaf, saved by nothing
        before = logits.detach().clone()
        loss = cross_entropy(logits, t, in_place=True, label_smoothing=0.1)
        ref_x = before.to(F64).requires_grad_()
        ref = cross_entropy_ref(ref_x, t, label_smoothing=0.1, dtype=F64)
        ref.backward()
        _assert_close(loss, ref.detach(), torch.bfloat16, "fwd", path)
        _assert_close(logits.detach(), ref_x.grad, torch.bfloat16, "bwd", path)


@pytest.mark.parametrize("layout", ["contiguous", "row_strided", "rank3"])
def test_in_place_backward_matches(layout):
    # The same gradients as out of place, for the logits of a graph (a * 1.5 saves nothing),
    # row-strided logits (written in place through their row stride) and rank-3 logits.
    V = OPT_VS[1]
    t = _targets((6,), V, 28)
    width = V + 3 if layout == "row_strided" else V
    a0 = _logits((6,), width, torch.float32, 28)
    for reduction, dy in (("mean", None), ("sum", 0.37), ("none", "random")):
        grads = []
        for a in (a0.detach().clone().requires_grad_(), a0.detach().to(F64).requires_grad_()):
            logits, tt = (a * 1.5)[:, :V], t
            if layout == "rank3":
                logits, tt = logits.view(2, 3, V), t.view(2, 3)
            if a.dtype == F64:
                loss = cross_entropy_ref(logits, tt, reduction=reduction, dtype=F64)
            else:
                loss = cross_entropy(logits, tt, reduction=reduction, in_place=True)
                assert logits.stride(-2) == width  # the layout the kernel writes through
            g = _upstream(loss, 29) if dy == "random" else dy
            loss.backward(torch.as_tensor(g, dtype=loss.dtype) if g is not None else None)
            grads.append(a.grad)
        _assert_close(grads[0], grads[1], torch.float32, "bwd", f"{layout} {reduction}")


def test_in_place_caught_by_the_version_check():
    # tanh saves its output: the kernel overwrote it with the gradient, so autograd's version
    # check must refuse tanh's backward (not compute a wrong gradient silently).
    a = _logits((5,), 300, torch.float32, 30).requires_grad_()
    t = _targets((5,), 300, 30)
    cross_entropy(a.tanh() * 1.0, t, in_place=True).backward()  # nothing else saved them: fine
    loss = cross_entropy(a.tanh(), t, in_place=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.parametrize("view", [False, True])
def test_in_place_refuses_a_leaf_that_requires_grad(view):
    # as PyTorch's in-place ops do: the leaf's values would be lost to the gradient
    a = _logits((5,), 300, torch.float32, 33).requires_grad_()
    before = a.detach().clone()
    logits = a[1:] if view else a
    t = _targets((5,), 300, 33)[1 if view else 0 :]
    with pytest.raises(RuntimeError, match="in_place=True would write over 'logits', "
                       + ("a view of " if view else "") + "a leaf"):  # fmt: skip
        cross_entropy(logits, t, in_place=True)
    assert torch.equal(a.detach(), before)
    cross_entropy(logits, t).backward()  # out of place: fine


def test_in_place_with_aliased_rows():
    V = 300
    row = _logits((1,), V, torch.float32, 31).requires_grad_()
    t = torch.tensor([3, 7, 11, 200], device=DEVICE)
    logits = (row * 1.0).expand(4, V)  # stride (0, 1): four views of one row
    assert logits.stride(0) == 0
    ref = cross_entropy_ref(logits.detach(), t, reduction="none", dtype=F64)
    loss = cross_entropy(logits, t, reduction="none", in_place=True)
    _assert_close(loss.detach(), ref, torch.float32, "fwd")


# --------------------------------------------------------------------------- misuse, bad data


def test_second_backward_raises():
    x = _logits(OPT_LEAD, 300, torch.float32, 32).requires_grad_()
    t = _targets(OPT_LEAD, 300, 32)
    loss = cross_entropy(x * 1.0, t)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="cross_entropy: backward ran twice through the same"):
        loss.backward()


@pytest.mark.skipif(ON_GPU, reason="on a GPU a device-side assert (its own process: below)")
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32], ids=str)
@pytest.mark.parametrize(
    "bad,ignore_index", [(300, -100), (-5, -100), (-1, -100), (-100, 7)], ids=str
)
def test_out_of_range_target_raises(bad, ignore_index, dtype):
    # A target outside [0, V) that is not ignore_index is an error naming the value, its
    # position, V and ignore_index (before: a silent NaN loss). Off the GPU the check is
    # synchronous; on it a device-side assert (test_out_of_range_target_asserts_on_the_gpu).
    V = 300
    x = _logits((2, 5), V, torch.float32, 33).requires_grad_()
    t = _targets((2, 5), V, 33, ignore_index=ignore_index, dtype=dtype)
    t[1, 3] = bad
    pattern = rf"target\[1, 3\] = {bad} .*V = {V} .*ignore_index \({ignore_index}\)"
    for reduction in ("mean", "sum", "none"):
        with pytest.raises(ValueError, match=pattern):
            cross_entropy(x, t, ignore_index=ignore_index, reduction=reduction)
    with pytest.raises(ValueError, match=pattern):
        CrossEntropyLoss(ignore_index=ignore_index)(x, t)
    t[1, 3] = ignore_index  # the same targets with the bad one ignored: no error
    cross_entropy(x, t, ignore_index=ignore_index).backward()
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("n", [0, 0.0, -3, "tensor0", "tensor_neg"], ids=str)
def test_num_items_in_batch_must_be_positive(n):
    # num_items_in_batch is the mean's denominator: 0 gave an infinite loss (or NaN). A CPU
    # tensor is checked at once on any device (a GPU tensor is a device-side assert).
    if isinstance(n, str):
        n = torch.tensor(0 if n == "tensor0" else -2.0)
    x = _logits((6,), 50, torch.float32, 34)
    t = _targets((6,), 50, 34)
    with pytest.raises(ValueError, match="num_items_in_batch must be > 0"):
        cross_entropy(x, t, num_items_in_batch=n)
    with pytest.raises(ValueError, match="num_items_in_batch must be one number"):
        cross_entropy(x, t, num_items_in_batch=torch.ones(2, device=DEVICE))
    assert torch.isfinite(cross_entropy(x, t, num_items_in_batch=torch.tensor(3)))


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "class_weights"])
@pytest.mark.parametrize("path", PATHS)
def test_out_of_range_target_poisons_its_row_in_the_kernel(path, weighted):
    # The kernel's own guard, under the public check: a target outside [0, V) that is not
    # ignore_index gives that row a NaN loss and NaN gradient row (never a read out of
    # bounds); every other row is unaffected.
    V = OPT_VS[PATHS.index(path)]
    x = _logits((9,), V, torch.float32, 33)
    weight = _class_weight(V, 33) if weighted else None
    t = _targets((9,), V, 33)
    bad = torch.zeros(9, dtype=torch.bool, device=DEVICE)
    bad[[2, 5]] = True
    t[2], t[5] = V, -5
    good_t = torch.where(bad, -100, t)
    loss, lse = torch.empty(9, device=DEVICE), torch.empty(9, device=DEVICE)
    grad = torch.empty_like(x)
    w = weight.float() if weighted else None
    with poisoned():
        cross_entropy_fwd_launch(
            x, t, loss, lse, weight=w, weight_sum=w.sum().reshape(1) if weighted else None,
            grad=grad, label_smoothing=0.1,
        )  # fmt: skip
    assert torch.isnan(grad[bad]).all() and torch.isnan(loss[bad]).all()
    assert torch.isfinite(grad[~bad]).all()
    xr = x.detach().to(F64).requires_grad_()
    ref = cross_entropy_ref(xr, good_t, weight, reduction="none", label_smoothing=0.1, dtype=F64)
    ref.sum().backward()
    _assert_close(loss[~bad], ref[~bad].detach(), torch.float32, "fwd")
    _assert_close(grad[~bad], xr.grad[~bad], torch.float32, "bwd")


@pytest.mark.compile
@pytest.mark.skipif(ON_GPU, reason="on a GPU a device-side assert (its own process: below)")
def test_out_of_range_target_under_torch_compile():
    # Under torch.compile the checks are device-side asserts in the graph (no data-dependent
    # branch); on the CPU they raise at once with the message.
    torch._dynamo.reset()
    x = _logits((4,), 40, torch.float32, 35)
    t = _targets((4,), 40, 35)
    compiled = torch.compile(lambda x, t: cross_entropy(x, t), fullgraph=True)
    assert torch.isfinite(compiled(x, t))
    t[1] = 40
    with pytest.raises(RuntimeError, match=r"a target is outside \[0, 40\)"):
        compiled(x, t)


@pytest.mark.gpu
def test_out_of_range_target_asserts_on_the_gpu():
    # On a GPU a device-side assert stops the run at its next sync, without a host sync of its
    # own (it leaves the CUDA context unusable, so it runs in a process of its own).
    code = (
        "import torch\n"
        "from kernelwright.ops.cross_entropy import cross_entropy\n"
        "x = torch.randn(8, 64, device='cuda')\n"
        "t = torch.randint(0, 64, (8,), device='cuda')\n"
        "assert torch.isfinite(cross_entropy(x, t)).item()\n"
        "t[3] = 64\n"
        "cross_entropy(x, t).item()\n"
        "print('no error')\n"
    )
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode != 0 and "no error" not in proc.stdout
    assert "device-side assert" in proc.stderr or "a target is outside" in proc.stderr


@pytest.mark.parametrize("path", PATHS)
def test_poisoned_outputs_fully_written(path):
    # Every loss / z / lse / gradient element is written on every path (ignored rows included):
    # under poisoning an unwritten element would be NaN.
    V = OPT_VS[PATHS.index(path)]
    x = _logits(OPT_LEAD, V, torch.bfloat16, 35)
    t = _targets(OPT_LEAD, V, 35, frac=0.5)
    M = t.numel()
    x2, t2 = x.reshape(M, V), t.reshape(M)
    with poisoned():
        loss = CE.empty((M,), dtype=torch.float32, device=DEVICE)
        lse, z = torch.full_like(loss, float("nan")), torch.full_like(loss, float("nan"))
        grad = torch.full_like(x2, float("nan"))
        assert torch.isnan(loss).all()  # poisoning is on
        cross_entropy_fwd_launch(
            x2, t2, loss, lse, z_loss=z, grad=grad, lse_square_scale=1e-3, label_smoothing=0.1
        )
    for out in (loss, lse, z, grad):
        assert torch.isfinite(out).all()
    ign = t2 == -100
    assert torch.equal(lse[ign], torch.zeros_like(lse[ign]))
    assert torch.equal(z[ign], torch.zeros_like(z[ign]))
    ref_lse = torch.logsumexp(x2.double(), -1)
    assert rel_norm_error(lse[~ign], ref_lse[~ign]) < 1e-6
    # forward without a gradient never touches the logits
    before = x2.clone()
    cross_entropy_fwd_launch(x2, t2, loss, lse)
    assert torch.equal(x2, before)


def _large_magnitude_case(V, dtype, mean):
    x = _logits((6,), V, dtype, 36, mean=mean, std=30.0)
    t = _targets((6,), V, 36)
    dy = _upstream(torch.empty(6), 37)
    kw = dict(reduction="none")
    (loss,), grad = _ours(x, t, None, dy, kw)
    ref_fn = functools.partial(cross_entropy_ref, dtype=F64)
    (ref,), ref_grad = _run(ref_fn, x, t, None, dy.to(F64), kw, dtype=F64)
    (pt,), pt_grad = _run(torch_ce, x, t, None, dy, kw, dtype=torch.float32)
    lse = torch.logsumexp(x.to(F64), -1)
    return loss, grad, ref, ref_grad, pt, pt_grad, lse, t != -100


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")  # masked lanes
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_large_magnitude_logits(dtype):
    # Logits around +-1e4: exp would overflow without the max shift. The kernel keeps
    # lse = m + log(d) in fp32 and forms lse - z_t and exp(z - lse) from it, so the error is
    # about one ulp of |lse| (6e-4 at 1e4) absolute in the loss and relative in the gradient
    # (measured: loss 2.6e-4 absolute, gradient 2.2e-4 relative in fp32). Bound: two ulps.
    for V in OPT_VS:
        for mean in (1e4, -1e4):
            loss, grad, ref, ref_grad, _, _, lse, valid = _large_magnitude_case(V, dtype, mean)
            assert torch.isfinite(loss).all() and torch.isfinite(grad).all()
            ulp = 2.0**-23 * lse.abs()
            assert ((loss.double() - ref).abs() <= 2 * ulp * valid).all()
            bound = 2 * ulp.max().item() + TOL[dtype].bwd
            assert rel_norm_error(grad, ref_grad) <= bound


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
def test_large_magnitude_as_accurate_as_torch_fp32():
    loss, grad, ref, ref_grad, pt, pt_grad, _, _ = _large_magnitude_case(300, torch.float32, 1e4)
    assert rel_norm_error(loss, ref) <= 2 * rel_norm_error(pt, ref) + 1e-7
    assert rel_norm_error(grad, ref_grad) <= 2 * rel_norm_error(pt_grad, ref_grad) + 1e-7


@pytest.mark.parametrize("path", PATHS)
def test_minus_inf_logits(path):
    # Masked vocabulary entries (-inf logits) get probability 0 and gradient 0.
    V = OPT_VS[PATHS.index(path)]
    x = _logits((6,), V, torch.float32, 38)
    t = _targets((6,), V, 38)
    lo, hi = V // 3, V // 2
    x[:, lo:hi] = float("-inf")
    t = torch.where((t >= lo) & (t < hi), V - 1, t)  # a masked target would give loss +inf
    t[1] = lo - 1
    _check(x, t, reduction="none", seed=39)


def test_every_kernel_path_agrees():
    # The same rows through one block (padded and exact) and looped blocks (with and without a
    # partial last block) with every option on must agree; also the backward scale kernel.
    V = 700
    x = _logits((13,), V, torch.float32, 40)
    t = _targets((13,), V, 40)
    t[3] = V - 1
    w = _class_weight(V, 40)
    wsum = w.sum().reshape(1)
    s = _upstream(torch.empty(13), 41)
    kw = dict(label_smoothing=0.1, lse_square_scale=1e-3, softcap=5.0)
    results = []
    for cfg in [
        LaunchConfig(block_n=1024),  # one block, padded
        LaunchConfig(block_n=4096, num_warps=8),
        LaunchConfig(block_n=HOLD_FROM),  # one block, the row held in its dtype (fp32 here)
        LaunchConfig(block_n=128),  # looped: 5 blocks and 60
        LaunchConfig(block_n=256),
        LaunchConfig(block_n=64, num_warps=2),
        # the L2 flags: the gradient pass from the row's end (the partial block first at 256)
        LaunchConfig(block_n=128, evict_hints=True, reverse_pass=True),
        LaunchConfig(block_n=256, reverse_pass=True),
        LaunchConfig(block_n=256, evict_hints=True),
    ]:
        with poisoned():
            outs = [torch.full((13,), float("nan"), device=DEVICE) for _ in range(3)]
            grad = torch.full_like(x, float("nan"))
            cross_entropy_fwd_launch(
                x,
                t,
                outs[0],
                outs[1],
                weight=w,
                weight_sum=wsum,
                z_loss=outs[2],
                grad=grad,
                config=cfg,
                **kw,
            )
            cross_entropy_scale_launch(grad, s, config=cfg)
        results.append((*outs, grad))
    for res in results[1:]:
        for a, b in zip(res, results[0], strict=True):
            assert rel_norm_error(a, b) < 1e-6
    xr = x.to(F64).requires_grad_()
    ref = cross_entropy_ref(xr, t, w, reduction="none", dtype=F64, **kw)
    ref.backward(s.to(F64))
    assert rel_norm_error(results[0][0], ref.detach()) < TOL[torch.float32].fwd
    assert rel_norm_error(results[0][3], xr.grad) < TOL[torch.float32].bwd


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_one_block_holds_16bit_rows(dtype):
    # From HOLD_FROM columns one block keeps the row in its 16-bit dtype and converts it at
    # each pass (ops/_held.py). With every option on, loss, lse, z-loss and gradient must match
    # the looped kernel's (the same fp32 math on the same values; the gradient one rounding
    # apart at most). Rows: random, all logits negative (max < 0), an ignored target.
    V = 700
    x = _logits((9,), V, torch.float32, 44)
    x[1] = -x[1].abs() - 3.0
    x = x.to(dtype)
    t = _targets((9,), V, 44)
    t[4] = -100
    w = _class_weight(V, 44)
    kw = dict(label_smoothing=0.1, lse_square_scale=1e-3, softcap=5.0)
    results = []
    for cfg in (LaunchConfig(block_n=HOLD_FROM), LaunchConfig(block_n=128)):
        with poisoned():
            outs = [torch.full((9,), float("nan"), device=DEVICE) for _ in range(3)]
            grad = torch.full_like(x, float("nan"))
            cross_entropy_fwd_launch(x, t, outs[0], outs[1], weight=w,
                                     weight_sum=w.sum().reshape(1), z_loss=outs[2], grad=grad,
                                     config=cfg, **kw)  # fmt: skip
        results.append((*outs, grad))
    held, looped = results
    for a, b in zip(held[:3], looped[:3], strict=True):
        assert rel_norm_error(a, b) < 1e-5
    ulp = torch.finfo(dtype).eps
    g, ref = held[3].float(), looped[3].float()
    assert torch.isfinite(g).all() and (g[4] == 0).all()
    assert ((g - ref).abs() <= ulp * ref.abs() + 1e-12).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_int64_offsets(dtype):
    # Row 2 of the logits starts past 2^31 elements: an int32 row offset would wrap.
    for V in OPT_VS:
        x = large_offset_rows(V, 3, dtype, DEVICE, gen=generator(42))
        t = _targets((3,), V, 42)
        t[2] = V // 2  # the far row is not ignored
        _check(x, t, reduction="none", seed=43)


def test_no_gradient_requested():
    # Logits that do not require grad: the forward writes no gradient.
    calls = []
    orig = CE.cross_entropy_fwd_launch
    x = _logits(OPT_LEAD, 300, torch.float32, 44)
    t = _targets(OPT_LEAD, 300, 44)
    try:
        CE.cross_entropy_fwd_launch = lambda *a, **k: (calls.append(k["grad"]), orig(*a, **k))
        loss = cross_entropy(x, t)
    finally:
        CE.cross_entropy_fwd_launch = orig
    assert calls == [None] and not loss.requires_grad
    assert rel_norm_error(loss, cross_entropy_ref(x, t, dtype=F64)) < TOL[torch.float32].fwd


def test_no_gradient_under_no_grad(monkeypatch):
    calls = []
    orig = CE.cross_entropy_fwd_launch
    monkeypatch.setattr(
        CE, "cross_entropy_fwd_launch", lambda *a, **k: (calls.append(k["grad"]), orig(*a, **k))
    )
    x = _logits(OPT_LEAD, 300, torch.float32, 45).requires_grad_()
    t = _targets(OPT_LEAD, 300, 45)
    with torch.no_grad():
        loss = cross_entropy(x, t)
    assert not loss.requires_grad
    assert rel_norm_error(loss, cross_entropy_ref(x.detach(), t, dtype=F64)) < 1e-6
    assert calls == [None]


def test_zero_rows():
    x = torch.empty(2, 0, 300, device=DEVICE).requires_grad_()
    t = torch.empty(2, 0, dtype=torch.int64, device=DEVICE)
    loss = cross_entropy(x, t, reduction="sum")
    loss.backward()
    assert loss.item() == 0.0 and x.grad.shape == x.shape
    assert cross_entropy(x.detach(), t, reduction="none").shape == (2, 0)
    assert torch.isnan(cross_entropy(x.detach(), t))  # 0 / 0, as F.cross_entropy


# --------------------------------------------------------------------------- errors


def _bad_input_cases():
    x = _logits((4,), 10, torch.float32, 46)
    t = _targets((4,), 10, 46)
    return {
        "float_target": (
            (x, t.float()),
            {},
            TypeError,
            "'target' must hold class indices as int64 or int32",
        ),
        "target_not_tensor": ((x, [1, 2, 3, 4]), {}, TypeError, "'target' must be a torch.Tensor"),
        "target_count": (
            (x, t[:3]),
            {},
            ValueError,
            r"one class index per row of logits \(4\), got shape \(3,\)",
        ),
        "target_shape": (
            (x.view(2, 2, 10), t),
            {},
            ValueError,
            r"logits' leading shape \(2, 2\), got \(4,\)",
        ),
        "reduction": ((x, t), dict(reduction="avg"), ValueError, "reduction must be one of"),
        "smoothing_high": (
            (x, t),
            dict(label_smoothing=1.5),
            ValueError,
            r"label_smoothing must be in \[0, 1\]",
        ),
        "smoothing_neg": (
            (x, t),
            dict(label_smoothing=-0.1),
            ValueError,
            r"label_smoothing must be in \[0, 1\]",
        ),
        "z_scale": (
            (x, t),
            dict(lse_square_scale=-1e-4),
            ValueError,
            "lse_square_scale must be >= 0",
        ),
        "softcap_zero": ((x, t), dict(softcap=0.0), ValueError, "softcap must be > 0"),
        "softcap_neg": ((x, t), dict(softcap=-30.0), ValueError, "softcap must be > 0"),
        "num_items_sum": (
            (x, t),
            dict(reduction="sum", num_items_in_batch=4),
            ValueError,
            "num_items_in_batch replaces the denominator of reduction='mean'",
        ),
        "num_items_none": (
            (x, t),
            dict(reduction="none", num_items_in_batch=4),
            ValueError,
            "reduction='none'",
        ),
        "weight_len": (
            (x, t, torch.ones(11, device=DEVICE)),
            {},
            ValueError,
            r"class weights must have shape \(10,\)",
        ),
        "weight_2d": ((x, t, torch.ones(1, 10, device=DEVICE)), {}, ValueError, r"got \(1, 10\)"),
        "weight_int": (
            (x, t, torch.ones(10, dtype=torch.int64, device=DEVICE)),
            {},
            TypeError,
            "'weight' must have dtype",
        ),
        "int_logits": (
            (torch.ones(4, 10, dtype=torch.int64, device=DEVICE), t),
            {},
            TypeError,
            "'logits' must have dtype in",
        ),
        "empty_vocab": (
            (torch.ones(4, 0, device=DEVICE), t),
            {},
            ValueError,
            "empty class dimension",
        ),
        "scalar_logits": (
            (torch.tensor(1.0, device=DEVICE), t),
            {},
            ValueError,
            "at least 1 dimension",
        ),
    }


@pytest.mark.parametrize("case", list(_bad_input_cases()))
def test_bad_input_errors(case):
    args, kwargs, exc, match = _bad_input_cases()[case]
    args = tuple(a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args)
    with pytest.raises(exc, match=match):
        cross_entropy(*args, **kwargs)


def test_harness_catches_a_wrong_kernel():
    # A test that cannot fail is a defect: a kernel that drops label smoothing, one off by a
    # temperature of 1%, and one that forgets the z-loss in the gradient all fail the checks.
    x = _logits(OPT_LEAD, 300, torch.float32, 47)
    t = _targets(OPT_LEAD, 300, 47)

    def fails(fn, **kw):
        ref = functools.partial(cross_entropy_ref, dtype=F64)
        r = check_op(
            fn, ref, {"logits": x}, kwargs=dict(target=t, **kw), tolerances=TOL, ref_dtype=F64
        )
        return not r.ok

    assert not fails(cross_entropy, label_smoothing=0.1)
    assert fails(lambda logits, target, **kw: cross_entropy(logits, target), label_smoothing=0.1)
    assert fails(lambda logits, target: cross_entropy(logits * 1.01, target))

    def z_loss_without_gradient(logits, target, lse_square_scale):
        z = cross_entropy_ref(logits.detach(), target, lse_square_scale=lse_square_scale)
        return cross_entropy(logits, target) + (z - cross_entropy_ref(logits.detach(), target))

    assert fails(z_loss_without_gradient, lse_square_scale=1e-2)


# --------------------------------------------------------------------------- module, compile


def test_module_matches_function():
    V = 300
    w = _class_weight(V, 48)
    x = _logits(OPT_LEAD, V, torch.float32, 48)
    t = _targets(OPT_LEAD, V, 48, ignore_index=-1)
    opts = dict(ignore_index=-1, reduction="sum", label_smoothing=0.1)
    extra = dict(lse_square_scale=1e-3, return_z_loss=True, softcap=20.0)
    mod = CrossEntropyLoss(w, **opts, **extra)
    a, b = mod(x, t), cross_entropy(x, t, w, **opts, **extra)
    for u, v in zip(a, b, strict=True):
        assert torch.equal(u, v)
    mean = CrossEntropyLoss()
    t = _targets(OPT_LEAD, V, 48)
    assert torch.equal(mean(x, t, num_items_in_batch=7), cross_entropy(x, t, num_items_in_batch=7))
    assert (
        rel_norm_error(mean(x, t), torch.nn.CrossEntropyLoss()(x.reshape(-1, V), t.reshape(-1)))
        < 1e-6
    )
    assert repr(CrossEntropyLoss()) == (
        "CrossEntropyLoss(ignore_index=-100, reduction='mean', label_smoothing=0.0, "
        "lse_square_scale=0.0, softcap=None)"
    )
    assert "softcap=20.0" in repr(mod) and "reduction='sum'" in repr(mod)
    assert torch.equal(mod.weight, w) and "weight" in dict(mod.named_buffers())


@pytest.mark.compile
def test_torch_compile_fullgraph():
    # The custom ops make forward and backward one graph; compare with eager.
    torch._dynamo.reset()
    V = 300
    x0 = _logits((2, 6), V, torch.float32, 49)
    t = _targets((2, 6), V, 49)
    w = _class_weight(V, 49)

    def step(x):
        loss, z = cross_entropy(
            x * 2.0, t, w, label_smoothing=0.1, lse_square_scale=1e-3, return_z_loss=True
        )
        rows = cross_entropy(x.sin(), t, reduction="none", softcap=3.0)
        return loss + (rows * rows).sum() + z

    compiled = torch.compile(step, fullgraph=True)
    x = x0.detach().requires_grad_()
    out = compiled(x)
    out.backward()
    xr = x0.detach().requires_grad_()
    out_r = step(xr)
    out_r.backward()
    assert rel_norm_error(out, out_r) < 1e-6
    assert rel_norm_error(x.grad, xr.grad) < 1e-5


def test_one_block_holds_at_most_128_kb_of_a_row(monkeypatch):
    # A one-block row of 32768 fp32 logits (128 KB) is held; with a table that also held
    # 65536-class rows, fp32 logits there (256 KB) would take the looped row instead, 16-bit
    # ones the one block. An explicit config is taken as given.
    from kernelwright.runtime.tables import cross_entropy as table

    monkeypatch.setattr(CE, "device_info", lambda device=None: H100)

    def cfg(v, dtype, config=None):
        return CE.forward_config(torch.empty(2, v, dtype=dtype), config)

    assert cfg(32768, torch.float32).block_n == 32768
    rows = table.TABLE["fwd"]["default"]
    wide = [(65536, LaunchConfig(block_n=65536, num_warps=32)), rows[-1]]
    monkeypatch.setitem(table.TABLE["fwd"], "default", rows[:-1] + wide)
    assert cfg(65536, torch.bfloat16).block_n == 65536
    assert cfg(65536, torch.float32) == rows[-1][1]
    explicit = LaunchConfig(block_n=65536, num_warps=32)
    assert cfg(65536, torch.float32, explicit) is explicit
