"""The losses' host-side kernels (runtime/index_kernels.py): the targets' check with the "mean"
denominator, the per-row losses' sum, against torch on fresh random rows of odd lengths; and
the eager cross-entropy issuing no torch op around its kernels but autograd's own."""

import pytest
import torch
from conftest import DEVICE

from kernelwright.ops.cross_entropy import cross_entropy
from kernelwright.ops.fused_linear_cross_entropy import fused_linear_cross_entropy
from kernelwright.runtime.index_kernels import BLOCK, sum_rows_launch, targets_launch
from kernelwright.testing import generator, poisoned


@pytest.mark.parametrize("M", [1, 7, BLOCK, BLOCK + 3, 2 * BLOCK + 517])
@pytest.mark.parametrize("ignore_index", [-100, 3], ids=str)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32], ids=str)
def test_targets_kernel_checks_and_counts(M, ignore_index, dtype):
    V = 50
    g = generator(M)
    t = torch.randint(0, V, (M,), generator=g).to(DEVICE, dtype)
    t[torch.rand(M, generator=g).to(DEVICE) < 0.3] = ignore_index
    with poisoned():
        ok = torch.full((1,), -7, dtype=torch.int32, device=DEVICE)
        inv = torch.full((1,), float("nan"), device=DEVICE)
    kept = int((t != ignore_index).sum())
    targets_launch(t, ok, inv, V, ignore_index, None, True)
    assert int(ok) == 1
    assert float(inv) == pytest.approx(1.0 / kept if kept else float("inf"), rel=1e-6)
    targets_launch(t, ok, inv, V, ignore_index, 12.5, True)  # a given denominator wins
    assert int(ok) == 1 and float(inv) == pytest.approx(1 / 12.5, rel=1e-7)
    # any one bad target anywhere (the last row of the last block too) clears the flag
    for pos, bad in [(0, V), (M - 1, -1), (M // 2, V + 1000)]:
        if bad == ignore_index:
            continue
        u = t.clone()
        u[pos] = bad
        targets_launch(u, ok, inv, V, ignore_index, None, False)
        assert int(ok) == 0, (pos, bad)


def test_targets_kernel_all_ignored_gives_nan_mean_as_torch():
    t = torch.full((9,), -100, dtype=torch.int64, device=DEVICE)
    x = torch.randn(9, 20, device=DEVICE)
    ref = torch.nn.functional.cross_entropy(x, t)
    assert torch.isnan(ref) and torch.isnan(cross_entropy(x, t))


@pytest.mark.parametrize("M", [1, 5, BLOCK - 1, 3 * BLOCK + 11])
def test_sum_rows_kernel(M):
    rows = torch.randn(M, generator=generator(M + 1)).to(DEVICE) * 3
    inv = torch.tensor([0.37], device=DEVICE)
    with poisoned():
        out = torch.full((), float("nan"), device=DEVICE)
    sum_rows_launch(rows, None, out)
    ref = rows.double().sum()
    assert float(out) == pytest.approx(float(ref), rel=1e-5, abs=1e-5)
    sum_rows_launch(rows, inv, out)
    assert float(out) == pytest.approx(float(ref) * 0.37, rel=1e-5, abs=1e-5)


class _TorchOps(torch.utils._python_dispatch.TorchDispatchMode):
    """The aten ops a block runs, less the allocations, views and copies Triton's interpreter
    issues to run a kernel on the CPU."""

    LAUNCH = ("empty", "new_empty", "set_", "copy_", "view", "detach", "_local_scalar_dense")

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name not in self.LAUNCH:
            self.ops.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_eager_cross_entropy_runs_no_torch_op_around_its_kernels(reduction):
    # In an eager training loop at moderate sizes every launch is host time: the targets'
    # check, the mean's denominator and the sum of the rows are one kernel each, not the
    # dozen small torch ops they were. Only autograd's own ones_like (the loss's gradient) is
    # left around the kernels.
    x = torch.randn(6, 50, device=DEVICE, requires_grad=True)
    t = torch.randint(0, 50, (6,), device=DEVICE)
    t[2] = -100
    with _TorchOps() as seen:
        loss = cross_entropy(x, t, reduction=reduction)
        loss.backward()
    # on a GPU the check's verdict is one device-side assert (no host sync)
    asserts = ["_assert_async"] if x.is_cuda else []
    assert sorted(seen.ops) == sorted(["ones_like", *asserts]), seen.ops
    ref = torch.nn.functional.cross_entropy(x.detach().double(), t, reduction=reduction)
    assert float(loss) == pytest.approx(float(ref), rel=1e-5)
    with _TorchOps() as seen:
        fused_linear_cross_entropy(x, torch.randn(50, 50, device=DEVICE), t)
    assert "ne" not in seen.ops and "reciprocal" not in seen.ops, seen.ops


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32], ids=str)
def test_index_range_check_is_one_launch(dtype):
    # A generated op's index check (one_hot's classes): one kernel, no torch op around it; a
    # bad index anywhere is still caught (off the GPU a ValueError naming it).
    from kernelwright.runtime.checks import check_index_range

    t = torch.randint(0, 96, (3, BLOCK + 5), generator=generator(9)).to(DEVICE, dtype)
    with _TorchOps() as seen:
        check_index_range("op", "target", t, 96)
    assert sorted(seen.ops) == (["_assert_async"] if t.is_cuda else []), seen.ops
    if t.is_cuda:
        return
    for pos, bad in [((2, BLOCK + 4), 96), ((0, 0), -1), ((1, 7), 0 - 2**20)]:
        u = t.clone()
        u[pos] = bad
        where = f"target\\[{pos[0]}, {pos[1]}\\] = {bad} is outside \\[0, 96\\)"
        with pytest.raises(ValueError, match=where):
            check_index_range("op", "target", u, 96)
    check_index_range("op", "target", t[:, ::2], 96)  # a strided view: copied, then checked
