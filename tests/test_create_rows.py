"""create: products along the row (cumprod, prod, a reversed cumprod) and their backward at zeros;
the gradient of a per-row input; a reduction over the row's dims and then over the rows (KL's
batchmean); a row of another dim than the last read in place; a gather of one value per row
read at its target column alone. Each reference is generated here and its op run under the
interpreter on tiny shapes against PyTorch's own forward and autograd."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kernelwright.runtime.launch import LaunchConfig
from kernelwright.workflows.create import understand
from kernelwright.workflows.create.codegen import render, write

CORPUS = Path(__file__).resolve().parents[1] / "examples" / "create"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the kernels run where torch does


def _op(tmp_path: Path, name: str, body: str | None = None, tier: int = 2):
    """The generated op module of a reference written here (or the corpus file `name`)."""
    path = CORPUS / f"{name}.py"
    if body is not None:
        path = tmp_path / f"{name}.py"
        path.write_text(textwrap.dedent(body))
    profile = understand(str(path))
    assert profile.tier == tier, profile.unsupported_reason
    write(profile, tmp_path)
    spec = importlib.util.spec_from_file_location(f"gen_{name}", tmp_path / name / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, getattr(mod, name)


def _zeros(shape) -> torch.Tensor:
    # rows with no zero, one at the start, two, one at the end; values that keep products small
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    x[1, 0] = x[2, 2] = x[2, 5] = x[3, -1] = 0.0
    return x


def _check(fn, ref, xs, dy_seed=1, tol=1e-5):
    xs = [x.to(DEVICE).requires_grad_(x.is_floating_point()) for x in xs]
    refs = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in xs]
    y, y_ref = fn(*xs), ref(*refs)
    torch.testing.assert_close(y, y_ref, atol=tol, rtol=tol)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(dy_seed)).to(y.device)
    got = torch.autograd.grad(y, [x for x in xs if x.requires_grad], dy)
    want = torch.autograd.grad(y_ref, [x for x in refs if x.requires_grad], dy)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=tol, rtol=tol)


@pytest.mark.parametrize("which", ["cumprod", "prod"])
def test_product_gradients_are_exact_at_zeros(which, tmp_path, monkeypatch):
    name = f"rows_{which}"
    mod, fn = _op(tmp_path, name, f"""
        import torch

        def {name}(x):
            return torch.{which}(x, dim=-1)

        def get_inputs():
            return [torch.randn(3, 8)]
        """)  # fmt: skip
    ref = getattr(torch, which)
    x = _zeros((4, 9))
    _check(fn, lambda t: ref(t, dim=-1), [x])
    # the looped kernels (rows longer than a program holds): 3 tiles per row, so the carries
    # (the product of the tiles before) and the chunks' partial products are exercised
    monkeypatch.setattr(mod, "_config", lambda kernel, n, device: (4, 1, 4))
    monkeypatch.setattr(mod, "LOOP_BLOCK", 4)
    _check(fn, lambda t: ref(t, dim=-1), [x])


def test_reversed_cumprod_is_exact_at_zeros(tmp_path, monkeypatch):
    # flip, scan, flip: a reversed tl.cumprod forward; the cumprod backward on the flipped row
    # (element-wise ops of the flip, reversed scans), with rows holding zeros
    mod, fn = _op(tmp_path, "rows_rcumprod", """
        import torch

        def rows_rcumprod(x):
            return torch.cumprod(x.flip(-1), dim=-1).flip(-1)

        def get_inputs():
            return [torch.randn(3, 8)]
        """)  # fmt: skip

    def ref(t):
        return torch.cumprod(t.flip(-1), dim=-1).flip(-1)

    x = _zeros((4, 9))
    _check(fn, ref, [x])
    # looped: 3 tiles per row, carries from the row's end
    monkeypatch.setattr(mod, "_config", lambda kernel, n, device: (4, 1, 4))
    monkeypatch.setattr(mod, "LOOP_BLOCK", 4)
    _check(fn, ref, [x])


@pytest.mark.parametrize("keep", [True, False], ids=["rows_1", "rows"])
def test_per_row_input_gradient(keep, tmp_path, monkeypatch):
    # softmax(x / t) with a temperature per row, [rows, 1] or [rows]: t's gradient is the row's
    # sum of a full-size value
    name = f"rows_temp_{int(keep)}"
    t_expr, t_shape = ("t", "(3, 1)") if keep else ("t[:, None]", "(3,)")
    mod, fn = _op(tmp_path, name, f"""
        import torch

        def {name}(x, t):
            return torch.softmax(x / {t_expr}, dim=-1)

        def get_inputs():
            return [torch.randn(3, 8), torch.rand{t_shape} + 0.5]
        """)  # fmt: skip

    def ref(a, t):
        return torch.softmax(a / (t if keep else t[:, None]), dim=-1)

    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 9, generator=g)
    t = torch.rand((5, 1) if keep else (5,), generator=g) + 0.5
    _check(fn, ref, [x, t])
    monkeypatch.setattr(mod, "_config", lambda kernel, n, device: (4, 1, 4))
    monkeypatch.setattr(mod, "LOOP_BLOCK", 4)
    _check(fn, ref, [x, t])


def test_kl_batchmean_divides_by_the_batch_at_run_time(tmp_path):
    # traced at [4, 6, 96]: the kernel sums each token's row, the tail sums the tokens and
    # divides by the batch read from the rows (not the traced 4, nor the token count)
    _, fn = _op(tmp_path, "kl_div_tokens")
    g = torch.Generator().manual_seed(2)
    for shape in ((3, 5, 33), (7, 40)):
        logits = torch.randn(shape, generator=g)
        teacher = torch.log_softmax(torch.randn(shape, generator=g), dim=-1)

        def ref(a, t):
            return F.kl_div(F.log_softmax(a, -1), t, reduction="batchmean", log_target=True)

        _check(fn, ref, [logits, teacher])


def _small_tiles(mod, monkeypatch):
    # every row longer than 4 takes the looped kernels in place, over [4, 4] tiles: B, N and
    # the row blocks are not multiples of a tile, and each row is cut into several chunks
    tile = [(mod._LAST, mod.C(block_n=4, rows=4, num_warps=1))]
    for k in ("fwd", "bwd"):
        monkeypatch.setitem(mod.TABLE, f"{k}_strided", {"default": tile})


def _no_copy(*args):
    raise AssertionError("the row was moved by a copy")


def test_a_row_of_another_dim_is_read_in_place(tmp_path, monkeypatch):
    # an RMS norm over dim 1 of [N, C, L] with a per-channel weight (its gradient summed over
    # rows inside the kernel): the row is strided by L and read in place, no copy
    mod, fn = _op(tmp_path, "rows_channel_norm", """
        import torch
        from torch import nn

        class RowsChannelNorm(nn.Module):
            def __init__(self):
                super().__init__()
                self.weight = nn.Parameter(torch.ones(6, 1))

            def forward(self, x):
                return x * torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True) + 1e-6) * self.weight

        def get_inputs():
            return [torch.randn(2, 6, 5)]
        """)  # fmt: skip
    g = torch.Generator().manual_seed(3)
    w = torch.randn(7, 1, generator=g)

    def ref(x, w):
        return x * torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True) + 1e-6) * w

    wide = torch.randn(3, 7, 22, generator=g)[..., ::2]  # odd sizes, inner stride 2
    x = torch.randn(3, 7, 11, generator=g)
    with monkeypatch.context() as m:
        m.setattr(mod, "_rows", _no_copy)
        _check(fn, ref, [wide, w], tol=1e-5)  # one tile holds each row
        # rows walked in tiles: the partial sums, the outputs tile by tile and the weight's
        # gradient as per-row-block column sums
        _small_tiles(mod, m)
        for t in (x, wide):
            _check(fn, ref, [t, w], tol=1e-5)
        xb, wb = x.to(torch.bfloat16), w.to(torch.bfloat16)
        _check(fn, lambda a, b: ref(a.float(), b.float()).to(a.dtype), [xb, wb], tol=2e-2)
    # B = 1: the rows are an [M, N] view (the row-major kernels)
    _check(fn, ref, [torch.randn(3, 7, 1, generator=g), w], tol=1e-5)


def test_softmax_of_another_dim_walks_the_row_in_place(tmp_path, monkeypatch):
    # two levels of reductions (the max, then the sum of exponentials) and a full-size output,
    # the row walked in [4, 4] tiles in place
    mod, fn = _op(tmp_path, "softmax_dim1")
    monkeypatch.setattr(mod, "_rows", _no_copy)
    _small_tiles(mod, monkeypatch)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 9, 6, generator=g) * 4
    _check(fn, lambda t: torch.softmax(t, dim=1), [x], tol=1e-5)
    _check(fn, lambda t: torch.softmax(t, dim=1), [torch.randn(2, 9, 12, generator=g)[..., 1::2]],
           tol=1e-5)  # fmt: skip


@pytest.mark.parametrize("name", ["softmax", "logsumexp"])
def test_online_sum_of_exp_in_the_looped_kernels(name, tmp_path, monkeypatch):
    # rows of 4 tiles in 2 chunks: the sum of exp(x - max) is rescaled inside a chunk as the
    # running max grows (values rising along the row) and across chunks by the launcher
    mod, fn = _op(tmp_path, name)
    monkeypatch.setattr(mod, "_config", lambda kernel, n, device: (4, 1, 4))
    monkeypatch.setattr(mod, "LOOP_BLOCK", 4)
    monkeypatch.setattr(mod, "_sm_count", lambda device: 3)  # 2 chunks for 6 rows
    ref = (lambda t: torch.softmax(t, -1)) if name == "softmax" else (lambda t: t.logsumexp(-1))
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 2, 13, generator=g) + torch.linspace(-30.0, 30.0, 13)
    x[1, 0] = x[1, 0].flip(-1)  # the max first, then falling
    _check(fn, ref, [x], tol=1e-5)
    if name == "logsumexp":  # rows of -inf, and one holding +inf: torch's values
        x = torch.randn(2, 13, generator=g)
        x[0] = -float("inf")
        x[1, 9] = float("inf")
        x = x.to(DEVICE)
        torch.testing.assert_close(fn(x), ref(x))


class _Passes:
    """Counts the full-size tensors the looped backward's kernels touch (x, dy, dx views; not a
    broadcast weight)."""

    def __init__(self, mod, name: str, numel: int, monkeypatch):
        self.count, self.numel = 0, numel
        kernels = [k for k in vars(mod) if k.startswith(f"_{name}_bwd_part") or
                   k == f"_{name}_bwd_last"]  # fmt: skip
        for k in kernels:
            monkeypatch.setattr(mod, k, self._spy(getattr(mod, k)))

    def _spy(self, kernel):
        outer = self

        class Spy:
            def __getitem__(self, grid):
                def launch(*args, **kw):
                    outer.count += sum(isinstance(a, torch.Tensor) and a.numel() == outer.numel
                                       and 0 not in a.stride() for a in args)  # fmt: skip
                    return kernel[grid](*args, **kw)

                return launch

        return Spy()


@pytest.mark.parametrize(
    "name,passes", [("softmax_dim1", 5), ("log_softmax_dim0", 4), ("layer_norm_chw", 7)]
)
def test_looped_backward_copies_the_forward_row_values(name, passes, tmp_path, monkeypatch):
    # the forward's looped launch keeps its row values (max and sum of exp, mean and rstd) and
    # the backward copies them: softmax reads (x, dy) twice and writes dx (5 full-size tensors,
    # 6 when it recomputed the statistics), log-softmax dy then (x, dy) (4, was 5), LayerNorm
    # over [C, H, W] (x, dy) twice, dx and the fp32 rows of dweight and dbias (7, was 10: the
    # mean and the variance were passes of x)
    mod, fn = _op(tmp_path, name)
    g = torch.Generator().manual_seed(6)
    if name == "layer_norm_chw":  # rows of the last three dims: the row-major looped kernels
        monkeypatch.setattr(mod, "_config", lambda kernel, n, device: (4, 1, 4))
        monkeypatch.setattr(mod, "LOOP_BLOCK", 4)
        monkeypatch.setattr(mod, "_sm_count", lambda device: 3)
        x = torch.randn(3, 2, 3, 10, generator=g)[..., ::2]  # odd sizes, not contiguous
        w, b = torch.randn(2, 3, 5, generator=g), torch.randn(2, 3, 5, generator=g)
        xs = [x * 3 + 1, w, b]

        def ref(x, w, b):
            return F.layer_norm(x, w.shape, w, b, 1e-5)
    else:
        _small_tiles(mod, monkeypatch)
        dim = 1 if name == "softmax_dim1" else 0
        xs = [torch.randn(5, 9, 14, generator=g)[..., 1::2] * 4]  # odd sizes, inner stride 2
        fn_ref = torch.softmax if name == "softmax_dim1" else torch.log_softmax

        def ref(x):
            return fn_ref(x, dim=dim)

    spy = _Passes(mod, name, xs[0].numel(), monkeypatch)
    _check(fn, ref, xs, tol=1e-5)
    assert spy.count == passes


def test_cosine_similarity_walks_a_long_row_once(tmp_path, monkeypatch):
    # the norms are taken out of the sum (sum(a b) / (|a| |b|), each norm clamped as PyTorch
    # clamps it): the three sums are one level, so the looped forward is one partial launch and
    # the backward one launch over (a, b, dy) with the forward's row values; a row of zeros
    # (a clamped norm) keeps PyTorch's value and gradients
    mod, fn = _op(tmp_path, "cosine_similarity_loss")
    assert hasattr(mod, "_cosine_similarity_loss_fwd_part1")
    assert not hasattr(mod, "_cosine_similarity_loss_fwd_part2")
    assert not any(k.startswith("_cosine_similarity_loss_bwd_part") for k in vars(mod))
    monkeypatch.setattr(mod, "_config", lambda kernel, n, device: (4, 1, 4))
    monkeypatch.setattr(mod, "LOOP_BLOCK", 4)
    monkeypatch.setattr(mod, "_sm_count", lambda device: 3)
    g = torch.Generator().manual_seed(8)
    a, b = torch.randn(3, 4, 22, generator=g), torch.randn(3, 4, 22, generator=g)
    a[1, 2] = 0.0

    def ref(a, b):
        return 1.0 - F.cosine_similarity(a, b, dim=-1).mean()

    spy = _Passes(mod, "cosine_similarity_loss", a.numel(), monkeypatch)
    _check_fp64(fn, ref, [a, b])
    assert spy.count == 4  # a, b, da, db: one walk of the row


@pytest.mark.parametrize("keep", [False, True])
def test_row_constants_leave_a_hand_written_sum(keep, tmp_path, monkeypatch):
    # normalise, multiply, sum over the row, written by hand (dim 1 of [A, N, B], a row of
    # another dim, here): the norms are factors of the summed product, so they leave the sum
    # and the looped forward is one partial launch; values and gradients are PyTorch's
    name = f"cos_hand_{int(keep)}"
    mod, fn = _op(tmp_path, name, f"""
        import torch
        import torch.nn.functional as F

        def {name}(a, b):
            return (F.normalize(a, dim=1) * 2.0 * F.normalize(b, dim=1)).sum(1, keepdim={keep})

        def get_inputs():
            return [torch.randn(3, 16, 5), torch.randn(3, 16, 5)]
        """)  # fmt: skip
    parts = [k for k in vars(mod) if k.startswith(f"_{name}_fwd_part")]
    assert parts == [f"_{name}_fwd_part1"], parts
    _small_tiles(mod, monkeypatch)
    g = torch.Generator().manual_seed(10)
    a, b = torch.randn(4, 22, 3, generator=g), torch.randn(4, 22, 3, generator=g)
    a[1, :, 2] = 0.0  # a row of zeros: a clamped norm

    def ref(a, b):
        return (F.normalize(a, dim=1) * 2.0 * F.normalize(b, dim=1)).sum(1, keepdim=keep)

    _check_fp64(fn, ref, [a, b])


@pytest.mark.parametrize("dim", [1, -1])
def test_dims_counted_from_the_first_bind_the_traced_rank(dim, tmp_path):
    # softmax(x, dim=1) of a 2-D x is the last dim's softmax at rank 2 only: at rank 3 the
    # reference normalises another dim, so the op refuses other ranks instead of flattening
    # them into rows; written with dim=-1 it runs any rank
    name = f"sm_dim_{'pos' if dim > 0 else 'neg'}"
    mod, fn = _op(tmp_path, name, f"""
        import torch

        def {name}(x):
            return torch.softmax(x, dim={dim})

        def get_inputs():
            return [torch.randn(4, 96)]
        """)  # fmt: skip
    g = torch.Generator().manual_seed(12)
    x = torch.randn(5, 7, generator=g).to(DEVICE)
    torch.testing.assert_close(fn(x), torch.softmax(x, dim), atol=1e-6, rtol=1e-5)
    x3 = torch.randn(2, 5, 9, generator=g).to(DEVICE)
    if dim > 0:
        with pytest.raises(ValueError, match="rank-2 inputs only"):
            fn(x3)
    else:
        torch.testing.assert_close(fn(x3), torch.softmax(x3, -1), atol=1e-6, rtol=1e-5)


def test_float64_and_integer_inputs_are_refused_not_rounded(tmp_path):
    # the kernels compute in fp32: a float64 or int64 tensor would come back rounded (an int64
    # around 2**30 off by tens), so the op says which input and what to do
    mod, fn = _op(tmp_path, "relu_squared", tier=1)
    x = torch.randn(3, 8, dtype=torch.float64, device=DEVICE)
    with pytest.raises(TypeError, match=r"x is torch.float64; the kernel takes float32"):
        fn(x)
    with pytest.raises(TypeError, match=r"x is torch.int64"):
        fn(torch.arange(24, device=DEVICE).view(3, 8) + 2**30)
    torch.testing.assert_close(fn(x.float()), torch.relu(x.float()) ** 2)


def _check_fp64(fn, ref, xs, tol=1e-4):
    """fn in fp32 against ref in fp64: a clamped norm's gradients are ~1/eps, where PyTorch's
    own fp32 gradient is ~1e-4 off the fp64 one; NaN anywhere fails."""
    xs = [x.to(DEVICE).requires_grad_() for x in xs]
    refs = [x.detach().double().requires_grad_() for x in xs]
    y, y_ref = fn(*xs), ref(*refs)
    torch.testing.assert_close(y, y_ref.float(), atol=1e-5, rtol=1e-5)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(y.device)
    got = torch.autograd.grad(y, xs, dy)
    want = torch.autograd.grad(y_ref, refs, dy.double())
    for g, w in zip(got, want, strict=True):
        assert g.isfinite().all()
        torch.testing.assert_close(g.double(), w, atol=1e-5, rtol=tol)


def test_a_row_of_zeros_has_pytorchs_norm_gradient(tmp_path):
    # the 2-norm's gradient at a vector of zeros is 0 in PyTorch (its backward masks the zero
    # norm), and the generated op's too: F.normalize's clamped norm (the cosine loss above is
    # the case where differentiating pow(sum(x^2), 0.5) gave 0 * inf = NaN for the row)
    mod, fn = _op(tmp_path, "l2_normalize")
    g = torch.Generator().manual_seed(9)
    x = torch.randn(4, 6, 40, generator=g)
    x[2, 3] = 0.0
    _check_fp64(fn, lambda t: F.normalize(t, dim=-1), [x])


def _gather(a, i):
    return torch.gather(a, -1, i.unsqueeze(-1)).squeeze(-1)


def test_a_gather_reads_only_the_picked_element(tmp_path):
    # gather_rows: the forward loads each row's index, then x at that column alone (no masked
    # sum over the row, no looped kernels for long rows)
    mod, fn = _op(tmp_path, "gather_rows")
    src = Path(mod.__file__).read_text()
    assert "def _fwd_looped" not in src and "def _gather_rows_fwd_kernel" not in src
    start = src.index("def _gather_rows_fwd_pick(")
    fwd = src[start : src.index("@triton.jit", start)]
    assert "tl.sum" not in fwd and "cols ==" not in fwd and "for " not in fwd
    g = torch.Generator().manual_seed(7)
    # column stride 2, rows out of order (a transpose): the [M, N] view's strides
    x = torch.randn(3, 5, 26, generator=g)[..., ::2].transpose(0, 1)
    idx = torch.randint(0, 13, (5, 3), generator=g)
    _check(fn, _gather, [x, idx])
    # an index outside [0, N) reads nothing and gives 0, as the masked row sum does
    bad = idx.clone()
    bad[0, 0], bad[1, 2], bad[4, 1] = -1, 13, 2**40
    ok = (bad >= 0) & (bad < 13)
    y = fn(x.to(DEVICE), bad.to(DEVICE)).cpu()
    assert (y[~ok] == 0).all()
    torch.testing.assert_close(y[ok], _gather(x, bad.clamp(0, 12))[ok])
    # log_softmax, then the gather: the row is needed whole, the masked row sum stays
    op = render(understand(str(CORPUS / "cross_entropy_gather.py")))
    op = op["cross_entropy_gather/cross_entropy_gather.py"]
    assert "_fwd_pick(" not in op and "tl.where(cols == f_unsqueeze" in op


@pytest.mark.parametrize("name", ["cross_entropy_mean", "cross_entropy_gather"])
def test_a_looped_gather_reads_only_the_picked_element(name, tmp_path, monkeypatch):
    # log_softmax, then a gather by the target: rows past one program take the looped kernels,
    # where the gather's level reads each row's element at its target column alone (no second
    # walk over the row after the max and the sum of exp)
    mod, fn = _op(tmp_path, name)
    src = Path(mod.__file__).read_text()
    parts = [src[i : src.index("@triton.jit", i)]
             for i in _starts(src, f"def _{name}_fwd_part")]  # fmt: skip
    walks = [p for p in parts if "for start in range" in p]
    picks = [p for p in parts if "for start in range" not in p]
    assert len(walks) == 1 and len(picks) == 1 and "cols ==" not in picks[0]
    monkeypatch.setattr(mod, "_config", lambda kernel, n, device: (4, 1, 4))
    monkeypatch.setattr(mod, "LOOP_BLOCK", 4)
    monkeypatch.setattr(mod, "_sm_count", lambda device: 2)  # 3 chunks a row
    g = torch.Generator().manual_seed(9)
    x = torch.randn(4, 38, generator=g)[:, ::2] * 3  # 19 columns, column stride 2
    t = torch.randint(0, 19, (4,), generator=g)
    t[0], t[1] = 0, 18  # the row's first and last columns: the first and last chunks

    def ref(x, t):
        lp = torch.log_softmax(x, -1)
        picked = torch.gather(lp, -1, t.unsqueeze(-1)).squeeze(-1)
        return -picked.mean() if name == "cross_entropy_mean" else -picked

    _check(fn, ref, [x, t])


def _starts(src: str, prefix: str) -> list[int]:
    out, i = [], src.find(prefix)
    while i >= 0:
        out.append(i)
        i = src.find(prefix, i + 1)
    return out


def test_a_gather_of_an_elementwise_expression_is_picked(tmp_path):
    # the gather's source is element-wise work on a full input, a per-feature weight and a
    # per-row shift, evaluated at the picked element only; more work on the picked value after
    mod, fn = _op(tmp_path, "rows_pick_expr", """
        import torch

        def rows_pick_expr(x, w, s, idx):
            y = torch.gather(torch.tanh(x) * w + s, -1, idx.unsqueeze(-1)).squeeze(-1)
            return 2.0 * y - 1.0

        def get_inputs():
            return [torch.randn(4, 96), torch.randn(96), torch.randn(4, 1),
                    torch.randint(0, 96, (4,))]
        """)  # fmt: skip
    assert "def _rows_pick_expr_fwd_pick(" in Path(mod.__file__).read_text()
    g = torch.Generator().manual_seed(8)
    x = torch.randn(6, 22, generator=g)[:, ::2]
    w, s = torch.randn(11, generator=g), torch.randn(6, 1, generator=g)
    idx = torch.randint(0, 11, (6,), generator=g)

    def ref(x, w, s, i):
        return 2.0 * _gather(torch.tanh(x) * w + s, i) - 1.0

    _check(fn, ref, [x, w, s, idx])


def test_looped_rows_split_over_sixteen_programs_per_sm(tmp_path):
    """The looped kernels cut rows into chunks, about sixteen programs per SM in all (each has
    one tile's loads in flight): a loss reducing every element is one row and takes all of
    them, two rows take half each."""
    mod, fn = _op(tmp_path, "mse_loss")
    sms = mod._sm_count(torch.device(DEVICE))
    n = 64 * sms * mod.LOOP_BLOCK  # enough tiles for any split
    chunk, chunks = mod._chunks(1, n, torch.device(DEVICE))
    assert chunks == 16 * sms and chunk * chunks >= n
    assert mod._chunks(2, n, torch.device(DEVICE))[1] == 8 * sms
    g = torch.Generator().manual_seed(3)
    a, b = (torch.randn(3, 5, 700, generator=g) for _ in range(2))
    _check(fn, torch.nn.functional.mse_loss, [a, b])  # still the reference's value


def test_in_place_looped_tiles_read_long_runs_of_b_neighbours(tmp_path):
    """A row of another dim longer than a tile holds is walked in tiles of up to 1024
    B-neighbours (2 KB runs of bf16) by 4 elements of the row; a narrow B caps the run and the
    tile grows along the row instead. About eight programs per SM in all."""
    mod, fn = _op(tmp_path, "mean_dim0")
    dev = torch.device(DEVICE)
    assert mod._plan("fwd", 960, 393216, 960, dev) == (4, 1024, 4, 960)
    assert mod._plan("bwd", 960, 393216, 960, dev) == (4, 1024, 4, 960)
    assert mod._plan("fwd", 1000, 393216, 40, dev) == (64, 64, 4, 40)
    sms = mod._sm_count(dev)
    for blocks in (1, 2, 3):
        # at most eight programs per SM over the blocks, each chunk a whole number of tiles
        target = -(-8 * sms // blocks)
        chunk, chunks = mod._chunks(blocks, 393216, 4, dev)
        assert chunk == -(-(393216 // 4) // target) * 4
        assert chunks == -(-393216 // chunk) <= target and chunk * chunks >= 393216
    # the table's own tiles (no test override): 600 B-neighbours in a run of 1024 lanes
    g = torch.Generator().manual_seed(11)
    x = torch.randn(2100, 1, 600, generator=g)
    _check(fn, lambda t: t.mean(0), [x], tol=1e-5)


@pytest.mark.parametrize("body", ["x + 3.0", "x + idx"])
def test_a_gradient_that_is_dy_itself_reaches_the_input(body, tmp_path):
    # the backward graph has no node to compute (dx = dy): the op still has a backward, the
    # gradient reaches x, an int input gets None, and the generated tests check the gradient
    name = "pass_add" if body == "x + 3.0" else "pass_add_int"
    mod, fn = _op(tmp_path, name, f"""
        import torch

        def {name}(x, idx):
            return {body}

        def get_inputs():
            return [torch.randn(4, 8), torch.arange(8)]
        """, tier=1)  # fmt: skip
    test_src = (tmp_path / name / f"test_{name}.py").read_text()
    assert f"{name}_ref_grads" in test_src
    g = torch.Generator().manual_seed(12)
    x = torch.randn(6, 16, generator=g)[:, ::2]  # not contiguous
    idx = torch.arange(8)
    _check(fn, lambda x, i: eval(body, {"x": x, "idx": i}), [x, idx])


def test_scan_references_run_in_fp64_when_given_fp64(tmp_path):
    # The generated tests hold a scan to an fp64 reference (an fp32 prefix product on a row of
    # mixed signs is itself off by more than the kernel's tolerance): the references must not
    # round fp64 inputs to fp32 on the way in.
    mod, _ = _op(tmp_path, "transmittance")
    a = torch.rand(5, 24, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    a[:, 20] = 1.0
    dy = torch.randn(a.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    x = a.clone().requires_grad_(True)
    want_y = torch.cumprod(1.0 - x, dim=1)
    (want_g,) = torch.autograd.grad(want_y, [x], dy)
    y = mod.transmittance_ref(a)
    (g,) = mod.transmittance_ref_grads([a], [dy])
    assert y.dtype == g.dtype == torch.float64
    torch.testing.assert_close(y, want_y.detach(), atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(g, want_g, atol=1e-12, rtol=1e-12)
    # fp32 and bf16 inputs still get the fp32 reference
    assert mod.transmittance_ref(a.to(torch.bfloat16)).dtype == torch.float32


def test_scan_tests_scale_their_tolerance_by_the_row(tmp_path, monkeypatch):
    # A scan's fp32 gradient at an element far smaller than its row (a sum that cancels) is off
    # by about an ulp of the row's largest value: the generated tests allow that much, and
    # still catch an element off by a fraction of that value.
    import importlib
    import sys

    _op(tmp_path, "transmittance")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.split(".")[0] == "transmittance"]:
        monkeypatch.delitem(sys.modules, name)  # restored after the test
    tests = importlib.import_module("transmittance.test_transmittance")
    b = torch.randn(4, 24, 3, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    b[2, :, 1] *= 400.0
    b[2, 20, 1] = -0.2263
    a = b.clone()
    a[2, 20, 1] += 3.6e-5  # 1.6e-4 relative, 9e-8 of the row's largest value
    tests._close(a.float(), b, tests.TOL[torch.float32], "ulp of the row")
    a[2, 20, 1] += 0.5
    with pytest.raises(AssertionError, match=r"at \(2, 20, 1\)"):
        tests._close(a.float(), b, tests.TOL[torch.float32], "a wrong element")
    for name in [m for m in sys.modules if m.split(".")[0] == "transmittance"]:
        del sys.modules[name]  # this test's package, not another's


def test_looped_variance_is_one_pass_without_cancellation(tmp_path, monkeypatch):
    """var over rows longer than a tile, one pass: each tile's mean and centered sum of squares
    merged by Chan's update into the chunk's, the chunks' by the launcher. Rows around 1000 with
    a spread of 0.01: E[x^2] - E[x]^2 in fp32 would lose the variance (1e-4 against 1e6), and an
    update that merged counts or means wrongly would miss it by far more than the tolerance.
    Odd lengths leave a short last tile and a short last chunk."""
    mod, fn = _op(tmp_path, "var_last")
    src = (tmp_path / "var_last" / "var_last.py").read_text()
    assert "acc1 += q_t0 + e_t0 * e_t0 * cnt0 * w_t0" in src  # the one-pass update
    tile = [(mod._LAST, mod.C(block_n=16, rows=1, num_warps=1))]
    for k in ("fwd", "bwd"):
        monkeypatch.setitem(mod.TABLE, k, {"default": tile})
    monkeypatch.setattr(mod, "LOOP_BLOCK", 16)
    g = torch.Generator().manual_seed(5)
    for n in (37, 301, 1000):  # one chunk of several tiles; several chunks
        x = (1000.0 + 0.01 * torch.randn(3, 4, n, generator=g, dtype=torch.float64)).float()
        want = x.double().var(dim=-1)  # of the fp32 values the kernel reads
        got = fn(x.to(DEVICE)).double().cpu()
        torch.testing.assert_close(got, want, rtol=1e-3, atol=0.0)


def test_an_eager_call_broadcasts_its_shapes_without_torch(tmp_path, monkeypatch):
    # torch.broadcast_shapes checks each size symbolically, tens to hundreds of µs a call: the
    # generated forward broadcasts concrete shapes in plain ints
    body = """
        import torch

        def rows_bcast(x, w):
            return torch.softmax(x * w, dim=-1)

        def get_inputs():
            return [torch.randn(4, 16), torch.randn(16)]
    """
    mod, fn = _op(tmp_path, "rows_bcast", body)

    def refuse(*shapes):
        raise AssertionError("torch.broadcast_shapes called in an eager forward")

    x, w = torch.randn(5, 24), torch.randn(24)
    want = torch.softmax(x * w, dim=-1)
    monkeypatch.setattr(torch, "broadcast_shapes", refuse)
    got = fn(x.to(DEVICE), w.to(DEVICE))
    torch.testing.assert_close(got.cpu(), want, atol=1e-5, rtol=1e-5)
    with pytest.raises(RuntimeError, match="do not broadcast"):
        fn(x.to(DEVICE), torch.randn(23).to(DEVICE))


def test_launch_plans_follow_a_swapped_table(tmp_path, monkeypatch):
    # the launchers memoize what they read from TABLE; optimize measures a variant by swapping
    # a kernel's rows in place, and the next call must launch with the variant's config
    mod, fn = _op(tmp_path, "sum_dim1")  # a row of another dim: "fwd_strided" when in place
    dev = torch.device(DEVICE)
    x = torch.randn(3, 40, 5, generator=torch.Generator().manual_seed(9))
    _check(fn, lambda t: t.sum(1), [x])
    # in place: 8 rows (b = 5, a power of 2 up), block_n grown to keep the 64 x 64 tile
    assert mod._plan("fwd", 15, 40, 5, dev)[:3] == (512, 8, 4)
    assert mod._plan("fwd", 15, 40, 0, dev)[:3] == (256, 16, 4)  # as [M, N] rows
    variant = [(2**31 - 1, LaunchConfig(block_n=16, rows=2, num_warps=2))]
    for kernel in ("fwd", "bwd", "fwd_strided", "bwd_strided"):
        monkeypatch.setitem(mod.TABLE[kernel], "default", variant)
    assert mod._plan("fwd", 15, 40, 5, dev)[:3] == (16, 2, 2)
    assert mod._plan("fwd", 15, 40, 0, dev)[:3] == (16, 2, 2)
    spy = _Passes(mod, "sum_dim1", x.numel(), monkeypatch)  # (spies on the backward only)
    _check(fn, lambda t: t.sum(1), [x])  # rows of 40 past block_n 16: the looped kernels
    assert spy.count == 1  # the looped backward's last kernel wrote dx
