"""Memoized launch plans (softmax, the gated family, rope): a plan is kept per shape, and a launch
after an in-place swap of its table's rows (how the optimize workflow measures a variant) takes
the swapped rows, not the plan kept from before."""

import torch
from conftest import DEVICE

from kernelwright.ops import _gated as family
from kernelwright.ops import rope as rope_module
from kernelwright.ops import softmax as softmax_module
from kernelwright.ops.relu_squared import relu_squared, relu_squared_ref
from kernelwright.ops.rope import rope
from kernelwright.ops.softmax import log_softmax, log_softmax_ref, softmax_ref
from kernelwright.runtime import LaunchConfig
from kernelwright.runtime.tables.relu_squared import TABLE as RELU_SQUARED_TABLE
from kernelwright.runtime.tables.rope import TABLE as ROPE_TABLE
from kernelwright.runtime.tables.softmax import TABLE as SOFTMAX_TABLE
from kernelwright.testing import generator, poisoned, rand, rel_norm_error


class _Recorded:
    """A kernel whose launches are recorded (name, grid), then run."""

    def __init__(self, name: str, seen: list):
        self.kernel, self.name, self.seen = getattr(softmax_module, name), name, seen

    def __getitem__(self, grid):
        self.seen.append((self.name, grid))
        return self.kernel[grid]


def _swap(monkeypatch, table, kernel: str, cfg: LaunchConfig) -> None:
    arch = softmax_module.device_info(torch.device(DEVICE)).arch
    for key in {arch, "default"}:
        monkeypatch.setitem(table[kernel], key, [(2**31 - 1, cfg)])


def test_softmax_plans_follow_a_table_swap(monkeypatch):
    gen = generator(40)
    x = rand((3, 300), torch.float32, DEVICE, gen=gen, std=3.0)
    dy = rand((3, 300), torch.float32, DEVICE, gen=gen)

    def run(is_log):
        with poisoned():
            y, dx = torch.empty_like(x), torch.empty_like(x)
            softmax_module.softmax_fwd_launch(x, y, is_log)
            softmax_module.softmax_bwd_launch(dy, y, dx, is_log)
        return y, dx

    before = {is_log: run(is_log) for is_log in (False, True)}  # plans kept: one-row kernels
    seen = []
    fwd, bwd = "_softmax_fwd_looped_kernel", "_softmax_bwd_looped_kernel"
    for name in (fwd, bwd):
        monkeypatch.setattr(softmax_module, name, _Recorded(name, seen))
    looped = LaunchConfig(block_n=128, rows=1)  # 3 chunks of a 300 row, the last partial
    _swap(monkeypatch, SOFTMAX_TABLE, "fwd", looped)
    _swap(monkeypatch, SOFTMAX_TABLE, "bwd", looped)
    for is_log in (False, True):
        y, dx = run(is_log)
        ref = (log_softmax_ref if is_log else softmax_ref)(x)
        assert rel_norm_error(y, ref) < 1e-5
        assert rel_norm_error(y, before[is_log][0]) < 1e-6
        assert rel_norm_error(dx, before[is_log][1]) < 1e-5
    assert seen == [(fwd, (3,)), (bwd, (3,))] * 2


def test_softmax_split_rows_of_a_contiguous_3d_input(monkeypatch):
    # A contiguous input of any rank is launched on without [M, N] views, except by the split
    # rows, which take them: the table swapped to split rows (3 chunks of a 300 row).
    _swap(monkeypatch, SOFTMAX_TABLE, "fwd", LaunchConfig(block_n=128, split_row=True))
    _swap(monkeypatch, SOFTMAX_TABLE, "bwd", LaunchConfig(block_n=128, split_row=True))
    gen = generator(42)
    x = rand((2, 3, 300), torch.float32, DEVICE, gen=gen, std=3.0)
    dy = rand((2, 3, 300), torch.float32, DEVICE, gen=gen)
    for op, ref in ((softmax_module.softmax, softmax_ref), (log_softmax, log_softmax_ref)):
        xk, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
        with poisoned():
            y = op(xk)
            y.backward(dy)
        yr = ref(xr)
        yr.backward(dy)
        assert rel_norm_error(y, yr) < 1e-5 and rel_norm_error(xk.grad, xr.grad) < 1e-5


def test_gated_plans_follow_a_table_swap(monkeypatch):
    x = rand((4, 96), torch.float16, DEVICE, gen=generator(41)).requires_grad_()
    relu_squared(x).sum().backward()  # plans kept for [4, 96]
    grids = []
    real_grid = family.elementwise_grid

    def grid(op, m, n, cfg):
        grids.append((cfg.block_n, cfg.rows))
        return real_grid(op, m, n, cfg)

    monkeypatch.setattr(family, "elementwise_grid", grid)
    _swap(monkeypatch, RELU_SQUARED_TABLE, "fwd", LaunchConfig(block_n=32, rows=2))
    _swap(monkeypatch, RELU_SQUARED_TABLE, "bwd", LaunchConfig(block_n=64, rows=4))
    x.grad = None
    with poisoned():
        out = relu_squared(x)
        out.backward(torch.ones_like(out))
    assert grids == [(32, 2), (64, 4)]
    xr = x.detach().float().requires_grad_()
    ref = relu_squared_ref(xr)
    ref.backward(torch.ones_like(ref))
    assert rel_norm_error(out, ref) < 1e-3 and rel_norm_error(x.grad, xr.grad) < 1e-3


def test_rope_plans_follow_a_table_swap(monkeypatch):
    gen = generator(43)
    q = rand((1, 2, 5, 16), torch.float32, DEVICE, gen=gen)
    k = rand((1, 1, 5, 16), torch.float32, DEVICE, gen=gen)
    cos = rand((1, 5, 16), torch.float32, DEVICE, gen=gen)
    sin = rand((1, 5, 16), torch.float32, DEVICE, gen=gen)
    want = rope(q, k, cos, sin)  # the plan kept for these shapes
    rows = []
    real_grid = rope_module._grid

    def grid(b, s, cfg):
        rows.append(cfg.rows)
        return real_grid(b, s, cfg)

    monkeypatch.setattr(rope_module, "_grid", grid)
    _swap(monkeypatch, ROPE_TABLE, "fwd", LaunchConfig(block_n=64, rows=2))
    with poisoned():
        got = rope(q, k, cos, sin)
    assert rows == [2]
    assert all(rel_norm_error(g, w) < 1e-6 for g, w in zip(got, want, strict=True))
