"""The gated family's shared kernels (ops/_gated.py), driven directly through its launchers:
every activation against its op's fp32 reference on row-strided views inside poisoned
buffers, each activation reading its own op's launch table, and the errors of the launchers."""

import math

import pytest
import torch
import torch.nn.functional as F

from kernelwright.ops import _gated as family
from kernelwright.ops.geglu import geglu_ref
from kernelwright.ops.relu_squared import relu_squared_ref
from kernelwright.ops.swiglu import swiglu_ref
from kernelwright.ops.swiglu_clamped import swiglu_clamped_ref
from kernelwright.runtime.launch import LaunchConfig
from kernelwright.runtime.tables.geglu import TABLE as GEGLU_TABLE
from kernelwright.runtime.tables.relu_squared import TABLE as RELU_SQUARED_TABLE
from kernelwright.runtime.tables.swiglu import TABLE as SWIGLU_TABLE
from kernelwright.testing import generator, rand, rel_norm_error

# Relative-norm error bounds vs the fp32 reference (the ops' own tables: the interpreter
# truncates fp32 -> bf16, about twice the error of rounding to nearest).
TOL = {torch.float32: 1e-6, torch.bfloat16: 1.2e-2}

# activation -> its fp32 reference, as the op's module writes it (None: no up operand)
REFS = {
    "silu": lambda a, b: swiglu_ref(a, b),
    "gelu_tanh": lambda a, b: geglu_ref(a, b, approximate="tanh"),
    "gelu_erf": lambda a, b: geglu_ref(a, b, approximate="none"),
    "relu_squared": lambda a, b: relu_squared_ref(a),
    "silu_clamped": lambda a, b: swiglu_clamped_ref(a, b, alpha=1.702, limit=1.0, up_offset=1.0),
}
# silu_clamped's runtime (alpha, limit, offset); limit 1 puts N(0, 1) inputs on both sides
SCALARS = {"silu_clamped": (1.702, 1.0, 1.0)}


def _strided(full: torch.Tensor, n: int) -> torch.Tensor:
    # columns [3, 3 + n) of a wider buffer: row stride != n, and elements on both sides that a
    # kernel must not touch
    return full[:, 3 : 3 + n]


def _buffers(m, n, dtype, device, count, fill=math.nan):
    return [torch.full((m, n + 7), fill, dtype=dtype, device=device) for _ in range(count)]


@pytest.mark.parametrize("activation", list(family.ACTIVATIONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_activation_matches_its_reference(activation, dtype, device):
    m, n = 37, 300  # odd: a partial row block and a partial column tile
    gated = activation in family.GATED
    gen = generator(5)
    a = _strided(rand((m, n + 7), dtype, device, gen=gen), n)
    b = _strided(rand((m, n + 7), dtype, device, gen=gen), n) if gated else None
    dc = _strided(rand((m, n + 7), dtype, device, gen=gen), n)

    a32 = a.float().requires_grad_()
    b32 = b.float().requires_grad_() if gated else None
    ref = REFS[activation](a32, b32)
    ref_grads = torch.autograd.grad(ref, [t for t in (a32, b32) if t is not None], dc.float())

    out_full, da_full, db_full = _buffers(m, n, dtype, device, 3)
    out, da, db = (_strided(t, n) for t in (out_full, da_full, db_full))
    sc = SCALARS.get(activation)
    family.gated_fwd_launch(activation, a, b, out, scalars=sc)
    family.gated_bwd_launch(activation, dc, a, b, da, db if gated else None, scalars=sc)

    assert rel_norm_error(out, ref) < TOL[dtype]
    assert rel_norm_error(da, ref_grads[0]) < TOL[dtype]
    if gated:
        assert rel_norm_error(db, ref_grads[1]) < TOL[dtype]
    else:
        assert db.isnan().all()  # no up: no second gradient written
    for full in (out_full, da_full, db_full):  # nothing outside the [M, N] views
        assert full[:, :3].isnan().all() and full[:, 3 + n :].isnan().all()


def test_fused_form_equals_two_views(device):
    # [gate | up] in one tensor runs the same kernels on its two halves.
    gen = generator(6)
    x = rand((19, 2 * 260), torch.float32, device, gen=gen)
    dc = rand((19, 260), torch.float32, device, gen=gen)
    for activation in family.GATED:
        sc = SCALARS.get(activation)
        c_fused, c_split = (torch.full_like(dc, math.nan) for _ in range(2))
        family.gated_fused_fwd_launch(activation, x, c_fused, scalars=sc)
        family.gated_fwd_launch(activation, x[:, :260], x[:, 260:], c_split, scalars=sc)
        assert torch.equal(c_fused, c_split)
        dx = torch.full_like(x, math.nan)
        da, db = (torch.full_like(dc, math.nan) for _ in range(2))
        family.gated_fused_bwd_launch(activation, dc, x, dx, scalars=sc)
        family.gated_bwd_launch(activation, dc, x[:, :260], x[:, 260:], da, db, scalars=sc)
        assert torch.equal(dx, torch.cat([da, db], dim=1))
    # interleaved (silu_clamped): the even/odd columns, read and written with column stride 2
    sc = SCALARS["silu_clamped"]
    c_fused, c_split = (torch.full_like(dc, math.nan) for _ in range(2))
    family.gated_fused_fwd_launch("silu_clamped", x, c_fused, scalars=sc, interleaved=True)
    family.gated_fwd_launch("silu_clamped", x[:, 0::2], x[:, 1::2], c_split, scalars=sc)
    assert torch.equal(c_fused, c_split)
    dx = torch.full_like(x, math.nan)
    family.gated_fused_bwd_launch("silu_clamped", dc, x, dx, scalars=sc, interleaved=True)
    ref = torch.full_like(x, math.nan)
    family.gated_bwd_launch(
        "silu_clamped", dc, x[:, 0::2], x[:, 1::2], ref[:, 0::2], ref[:, 1::2], scalars=sc
    )
    assert torch.equal(dx, ref) and not dx.isnan().any()


def test_activations_differ(device):
    # The switch reaches the kernel: each activation gives its own result on the same inputs.
    gen = generator(7)
    a, b = (rand((4, 64), torch.float32, device, gen=gen) for _ in range(2))
    outs = {}
    for activation in family.ACTIVATIONS:
        out = torch.empty_like(a)
        b_in = b if activation in family.GATED else None
        family.gated_fwd_launch(activation, a, b_in, out, scalars=SCALARS.get(activation))
        outs[activation] = out
    assert torch.allclose(outs["silu"], F.silu(a) * b, rtol=1e-6, atol=1e-6)
    names = list(outs)
    for i, x in enumerate(names):
        for y in names[i + 1 :]:
            assert not torch.equal(outs[x], outs[y]), (x, y)


@pytest.mark.parametrize(
    ("activation", "table"),
    [
        ("silu", SWIGLU_TABLE),
        ("gelu_tanh", GEGLU_TABLE),
        ("gelu_erf", GEGLU_TABLE),
        ("relu_squared", RELU_SQUARED_TABLE),
        ("silu_clamped", SWIGLU_TABLE),  # swiglu's pass with one more input: its table
    ],
)
def test_each_activation_reads_its_own_table(activation, table, device, monkeypatch):
    # The optimize workflow retunes one op by replacing entries in that op's TABLE dict: the
    # launch must follow that dict and no other op's.
    gated = activation in family.GATED
    gen = generator(8)
    a = rand((3, 200), torch.float32, device, gen=gen)
    b = rand((3, 200), torch.float32, device, gen=gen) if gated else None
    for kernel, marker in (("fwd", 32), ("bwd", 64)):
        rows = [(2**31 - 1, LaunchConfig(block_n=marker, rows=2))]
        for arch in ("default", "interpreter", family.device_info(a.device).arch):
            monkeypatch.setitem(table[kernel], arch, rows)
    seen = []
    real_grid = family.elementwise_grid

    def grid(op, m, n, cfg):
        seen.append((op, cfg.block_n))
        return real_grid(op, m, n, cfg)

    monkeypatch.setattr(family, "elementwise_grid", grid)
    sc = SCALARS.get(activation)
    family.gated_fwd_launch(activation, a, b, torch.empty_like(a), scalars=sc)
    family.gated_bwd_launch(
        activation,
        a,
        a,
        b,
        torch.empty_like(a),
        torch.empty_like(a) if gated else None,
        scalars=sc,
    )
    assert seen == [(family.ACTIVATIONS[activation], 32), (family.ACTIVATIONS[activation], 64)]


def test_unknown_activation(device):
    a = torch.ones(2, 8, device=device)
    with pytest.raises(ValueError, match=r"unknown activation 'gelu'; one of \('silu'"):
        family.gated_fwd_launch("gelu", a, a, torch.empty_like(a))
