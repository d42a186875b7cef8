"""create's element-wise lowering table against PyTorch's own op set: every pointwise op of the
core ATen IR is lowered or refused with a reason, and each lowering computes torch's values
(run through Triton, on the interpreter on CPU)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch
from conftest import DEVICE

from kernelwright.profiles.kernel import GraphNode
from kernelwright.workflows.create.lowering import (
    _IDENTITY,
    ELEMENTWISE,
    NOT_LOWERED,
    UnsupportedNode,
    _lower,
)


def _core_pointwise() -> dict[str, list[str]]:
    """{"aten.name": [overloads]} for every op PyTorch tags core and pointwise."""
    found: dict[str, list[str]] = {}
    for name in dir(torch.ops.aten):
        packet = getattr(torch.ops.aten, name, None)
        if packet is None or not hasattr(packet, "overloads"):
            continue
        for ov in packet.overloads():
            tags = getattr(getattr(packet, ov), "tags", ())
            if torch.Tag.core in tags and torch.Tag.pointwise in tags:
                found.setdefault(f"aten.{name}", []).append(ov)
    return found


def _try(base: str, ov: str) -> str | Exception:
    """`_lower` of the overload with tensor arguments named a, b, c and scalars 0.5."""
    schema = getattr(getattr(torch.ops.aten, base[5:]), ov)._schema
    code, raw = [], []
    for arg in schema.arguments:
        if arg.kwarg_only or arg.has_default_value():
            continue  # the required positional arguments only
        typ = str(arg.type)
        if "Tensor" in typ:
            name = "abc"[len([c for c in code if c in "abc"])]
            code.append(name)
            raw.append(name)
        elif "bool" in typ:
            code.append("0.0")
            raw.append(False)
        else:
            code.append("0.5")
            raw.append(0.5)
    dtype = "torch.bool" if "bitwise" in base or "logical" in base else "torch.float32"
    node = GraphNode(name="n", op="call_function", target=f"{base}.{ov}", args=raw, dtype=dtype)
    try:
        return _lower(node, code, raw, {})
    except UnsupportedNode as e:
        return e


def test_every_core_pointwise_op_is_lowered_or_refused_with_a_reason():
    ops = _core_pointwise()
    assert len(ops) > 50  # the enumeration itself works
    missing = []
    for base, overloads in sorted(ops.items()):
        if any(f"{base}.{ov}" in _IDENTITY for ov in overloads):
            continue
        results = [_try(base, ov) for ov in overloads]
        if any(isinstance(r, str) for r in results):
            continue
        if base in NOT_LOWERED:
            assert all(NOT_LOWERED[base] in str(r) for r in results), results
            continue
        missing.append(f"{base}: {results[0]}")
    assert not missing, "\n".join(missing)


def test_the_element_wise_list_is_what_lowers():
    """understand's tier-1 list (lowering.ELEMENTWISE) names only ops `_lower` lowers."""
    not_lowered = []
    for name in sorted(ELEMENTWISE):
        packet = getattr(torch.ops.aten, name, None)
        if packet is None:  # a prims op (convert_element_type): lowered by its target's name
            assert _lower(GraphNode(name="n", op="call_function",
                                    target=f"prims.{name}.default", args=["a", "torch.float32"]),
                          ["a"], ["a", "torch.float32"], {})  # fmt: skip
            continue
        overloads = packet.overloads()
        if any(f"aten.{name}.{ov}" in _IDENTITY for ov in overloads):
            continue
        if not any(isinstance(_try(f"aten.{name}", ov), str) for ov in overloads):
            not_lowered.append(name)
    assert not not_lowered


# (expression builder over tile names, torch function, input domain)
CASES = {
    "sign": ("aten.sign.default", torch.sign, (-3, 3)),
    "floor": ("aten.floor.default", torch.floor, (-5, 5)),
    "ceil": ("aten.ceil.default", torch.ceil, (-5, 5)),
    "trunc": ("aten.trunc.default", torch.trunc, (-5, 5)),
    "round": ("aten.round.default", torch.round, (-5, 5)),
    "log2": ("aten.log2.default", torch.log2, (0.1, 9)),
    "log10": ("aten.log10.default", torch.log10, (0.1, 9)),
    "tan": ("aten.tan.default", torch.tan, (-1.2, 1.2)),
    "sinh": ("aten.sinh.default", torch.sinh, (-4, 4)),
    "cosh": ("aten.cosh.default", torch.cosh, (-4, 4)),
    "asinh": ("aten.asinh.default", torch.asinh, (-30, 30)),
    "acosh": ("aten.acosh.default", torch.acosh, (1, 30)),
    "atanh": ("aten.atanh.default", torch.atanh, (-0.95, 0.95)),
    "erfc": ("aten.erfc.default", torch.erfc, (-2, 2)),
    "isnan": ("aten.isnan.default", lambda x: torch.isnan(x).float(), (-1, 1)),
    "isinf": ("aten.isinf.default", lambda x: torch.isinf(x).float(), (-1, 1)),
    "hardtanh": ("aten.hardtanh.default", torch.nn.functional.hardtanh, (-3, 3)),
    "leaky_relu": ("aten.leaky_relu.default", torch.nn.functional.leaky_relu, (-3, 3)),
    "elu": ("aten.elu.default", torch.nn.functional.elu, (-3, 3)),
    "logical_not": ("aten.logical_not.default", lambda x: (x == 0).float(), (-1, 1)),
    "pow_2.5": ("aten.pow.Tensor_Scalar", lambda x: torch.pow(x, 2.5), (-2, 3)),
    "pow_11": ("aten.pow.Tensor_Scalar", lambda x: torch.pow(x, 11), (-1.5, 1.5)),
    "pow_-3.5": ("aten.pow.Tensor_Scalar", lambda x: torch.pow(x, -3.5), (0.2, 3)),
}
_EXPONENTS = {"pow_2.5": 2.5, "pow_11": 11, "pow_-3.5": -3.5}

_KERNEL = """
import triton
import triton.language as tl


@triton.jit
def apply(x_ptr, y_ptr, out_ptr, n, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    offs = tl.arange(0, BLOCK_N)[None, :]
    mask = offs < n
    a = tl.load(x_ptr + offs, mask=mask, other=1.0).to(tl.float32)
    b = tl.load(y_ptr + offs, mask=mask, other=1.0).to(tl.float32)
    out = {expr}
    tl.store(out_ptr + offs, (out * 1.0).to(tl.float32), mask=mask)
"""


def _kernel_module(template: str, expr: str, tmp_path):
    """A module holding `template`'s `apply` kernel with `expr` in it (a file: Triton's jit
    reads the source)."""
    path = tmp_path / f"k{abs(hash((template, expr)))}.py"
    path.write_text(template.format(expr=expr))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(expr: str, x: torch.Tensor, y: torch.Tensor, tmp_path) -> torch.Tensor:
    module = _kernel_module(_KERNEL, expr, tmp_path)
    out = torch.full_like(x, float("nan"))
    module.apply[(1,)](x, y, out, x.numel(), ROWS=1, BLOCK_N=triton_block(x.numel()))
    return out


def triton_block(n: int) -> int:
    return 1 << (n - 1).bit_length()


@pytest.mark.parametrize("case", sorted(CASES))
def test_lowering_computes_torch_values(case, tmp_path):
    target, fn, (lo, hi) = CASES[case]
    gen = torch.Generator().manual_seed(0)
    x = (torch.rand(200, generator=gen) * (hi - lo) + lo).to(DEVICE)
    if case in ("round",):  # exact halves: torch rounds them to even
        x[:10] = torch.tensor([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 4.5, 0.0, -0.0])
    if case in ("isnan", "isinf", "sign", "hardtanh"):
        x[:4] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0])
    raw = ["a", _EXPONENTS[case]] if case in _EXPONENTS else ["a"]
    node = GraphNode(name="n", op="call_function", target=target, args=raw, dtype="torch.float32")
    code = ["a"] + [repr(float(v)) for v in raw[1:]]
    got = _run(_lower(node, code, raw, {}), x, x, tmp_path)
    torch.testing.assert_close(got, fn(x).float(), atol=1e-5, rtol=1e-5, equal_nan=True)


@pytest.mark.parametrize("op", ["and", "or", "xor"])
def test_mask_logic(op, tmp_path):
    x = torch.tensor([0.0, 1.0, 0.0, 1.0], device=DEVICE)
    y = torch.tensor([0.0, 0.0, 1.0, 1.0], device=DEVICE)
    for base in (f"aten.logical_{op}.default", f"aten.bitwise_{op}.Tensor"):
        node = GraphNode(name="n", op="call_function", target=base, args=["a", "b"],
                         dtype="torch.bool")  # fmt: skip
        got = _run(_lower(node, ["(a > 0.5)", "b"], ["a", "b"], {}), x, y, tmp_path)
        want = getattr(torch, f"logical_{op}")(x.bool(), y.bool()).float()
        torch.testing.assert_close(got, want)


def test_refusals_name_the_reason():
    node = GraphNode(name="n", op="call_function", target="aten.bitwise_and.Tensor",
                     args=["a", "b"], dtype="torch.int64")  # fmt: skip
    with pytest.raises(UnsupportedNode, match="only bool masks"):
        _lower(node, ["a", "b"], ["a", "b"], {})
    node = GraphNode(name="n", op="call_function", target="aten.fmod.Tensor", args=["a", "b"])
    with pytest.raises(UnsupportedNode, match="libdevice's fmod"):
        _lower(node, ["a", "b"], ["a", "b"], {})
    node = GraphNode(name="n", op="call_function", target="aten.round.decimals", args=["a", 2])
    with pytest.raises(UnsupportedNode, match="decimals"):
        _lower(node, ["a", "2.0"], ["a", 2], {})
    assert math.isfinite(len(NOT_LOWERED))


# ------------------------------------------------- inverse trigonometric functions, by fp32 ulps

_TRIG_KERNEL = """
import triton
import triton.language as tl


@triton.jit
def apply(x_ptr, y_ptr, out_ptr, n, BLOCK_N: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    mask = offs < n
    a = tl.load(x_ptr + offs, mask=mask, other=1.0)
    b = tl.load(y_ptr + offs, mask=mask, other=1.0)
    tl.store(out_ptr + offs, {expr}, mask=mask)
"""
INF, NAN = float("inf"), float("nan")
# points whose result is exact (as rounded to fp32), and points where a reduction switches range
_TRIG_EXACT = [0.0, -0.0, 1.0, -1.0, INF, -INF, NAN, 1e-30, -1e-30, 1.2e-38, 3e38, -3e38]
_TRIG_EDGES = [0.5, -0.5, 1 - 2**-24, -(1 - 2**-24), 1 + 2**-23, 0.41421356, 2.4142137, -2.4142137]


def _run_trig(expr: str, x: torch.Tensor, y: torch.Tensor, tmp_path) -> torch.Tensor:
    module = _kernel_module(_TRIG_KERNEL, expr, tmp_path)
    x, y = x.to(DEVICE), y.to(DEVICE)
    out = torch.full_like(x, NAN)
    block = 4096
    module.apply[(-(-x.numel() // block),)](x, y, out, x.numel(), BLOCK_N=block)
    return out.cpu()


def _normal_floats(n: int, lo_exp: int, hi_exp: int, gen) -> torch.Tensor:
    """Random normal fp32 numbers of both signs, exponents uniform in [lo_exp, hi_exp]."""
    mant = torch.rand(n, generator=gen) + 1.0
    exp = torch.randint(lo_exp, hi_exp + 1, (n,), generator=gen).float()
    sign = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0)
    return (sign * mant * torch.exp2(exp)).float()


def _ulps(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """|got - want| in units of fp32 spacing at want; 0 where both are NaN or equal."""
    spacing = torch.nextafter(want.abs(), torch.tensor(INF)) - want.abs()
    err = (got.double() - want.double()).abs() / spacing.double()
    err[(got == want) | (got.isnan() & want.isnan())] = 0.0
    return err


@pytest.mark.parametrize("op", ["atan", "asin", "acos", "atan2"])
def test_inverse_trig_within_a_few_ulps_of_torch(op, tmp_path):
    gen = torch.Generator().manual_seed(0)
    special, edges = torch.tensor(_TRIG_EXACT), torch.tensor(_TRIG_EDGES)
    if op == "atan2":  # (y, x): every pair of special points, magnitudes far apart, near 1
        sy, sx = torch.meshgrid(special, special, indexing="ij")
        near = torch.randn(8192, generator=gen)
        ey, ex = torch.meshgrid(edges, edges, indexing="ij")
        y = torch.cat([sy.flatten(), ey.flatten(), _normal_floats(32768, -60, 60, gen),
                       torch.randn(16384, generator=gen), near])  # fmt: skip
        x = torch.cat([sx.flatten(), ex.flatten(), _normal_floats(32768, -60, 60, gen),
                       torch.randn(16384, generator=gen),
                       near * (1 + 0.3 * torch.randn(8192, generator=gen))])  # fmt: skip
        want64 = torch.atan2(y.double(), x.double()).float()
        want = torch.atan2(y.to(DEVICE), x.to(DEVICE)).cpu()
        args = ["b", "a"]
        n_special = special.numel() ** 2
    else:  # every magnitude of a normal float, and dense around [-1, 1] and the reductions
        dense = [torch.linspace(-1.25, 1.25, 50001), torch.linspace(-4, 4, 20001)]
        x = torch.cat([special, edges, _normal_floats(65536, -126, 127, gen), *dense])
        y = x
        fn = getattr(torch, op)
        want64 = fn(x.double()).float()
        want = fn(x.to(DEVICE)).cpu()
        args = ["a"]
        n_special = special.numel()
    target = f"aten.{op}.default"
    node = GraphNode(name="n", op="call_function", target=target, args=args, dtype="torch.float32")
    got = _run_trig(_lower(node, args, args, {}), x, y, tmp_path)
    assert torch.equal(got.isnan(), want.isnan())
    assert _ulps(got, want).max() <= 4, "fp32 ulps from torch"
    assert _ulps(got, want64).max() <= 3, "fp32 ulps from the exact value"
    # special points: the exact value, rounded, and the sign of a zero
    got, want64 = got[:n_special], want64[:n_special]
    bad = got.nan_to_num(7.0) != want64.nan_to_num(7.0)
    assert not bad.any(), (y[:n_special][bad], x[:n_special][bad])
    keep = ~want64.isnan()
    assert torch.equal(got[keep].signbit(), want64[keep].signbit())


@pytest.mark.slow  # another family through the CLI: relu_squared's run is the representative
def test_cli_create_verifies_arctan_activation(tmp_path, monkeypatch):
    """atan forward and its backward (1 / (1 + x^2)) through the whole workflow: generated,
    then verified by the generated tests against torch."""
    from typer.testing import CliRunner

    from kernelwright.cli import app

    monkeypatch.chdir(tmp_path)
    ref = Path(__file__).resolve().parents[1] / "examples/create/arctan_activation.py"
    result = CliRunner().invoke(app, ["create", str(ref), "--yes", "--bench", "none"])
    assert result.exit_code == 0, result.output
    assert "verified: the generated tests pass" in result.output
    op = tmp_path / "kernelwright-runs/create/arctan_activation/pkg/arctan_activation"
    assert "tl.div_rn" in (op / "arctan_activation.py").read_text()


# ------------------------------------------ integer remainder (take_along_dim's index wrap)


@pytest.mark.parametrize("op", ["remainder", "fmod"])
def test_integer_remainder_is_exact_on_fp32_tiles(op, tmp_path):
    """An integer remainder on fp32 tiles (|a| + |b| <= 2^24, where tiles hold a, b and the
    multiple of b exactly): the IEEE-rounded quotient never rounds across an integer, so
    a - b * floor (trunc) is exact, both signs, dividends next to a multiple included."""
    gen = torch.Generator().manual_seed(0)
    top = 2**24 - 2**12
    b = torch.randint(1, 2**12, (256,), generator=gen) * torch.where(
        torch.rand(256, generator=gen) < 0.5, -1, 1
    )
    q = torch.randint(-(2**11), 2**11, (256,), generator=gen)
    a = torch.randint(-top, top, (256,), generator=gen)
    a[:128] = b[:128] * q[:128] + torch.tensor([-1, 0, 1, 2])[torch.arange(128) % 4]
    a[:4] = torch.tensor([top, -top, 0, -96])
    b[:4] = torch.tensor([96, 96, 7, 96])
    node = GraphNode(name="n", op="call_function", target=f"aten.{op}.Tensor", args=["a", "b"],
                     dtype="torch.int64")  # fmt: skip
    got = _run(_lower(node, ["a", "b"], ["a", "b"], {}), a.float().to(DEVICE),
               b.float().to(DEVICE), tmp_path)  # fmt: skip
    want = getattr(torch, op)(a, b).float()
    assert torch.equal(got.cpu(), want), (a[got.cpu() != want], b[got.cpu() != want])


def test_take_along_dim_wraps_negative_indices(tmp_path):
    """take_along_dim's index wrap (an integer remainder by the row length) lowers: a negative
    index counts from the row's end, at any row length, forward and backward."""
    from kernelwright.workflows.create import understand
    from kernelwright.workflows.create.codegen import write

    p = understand(
        str(Path(__file__).resolve().parents[1] / "examples/create/take_along_dim_rows.py")
    )
    assert p.tier == 2, p.unsupported_reason
    write(p, tmp_path)
    name = "take_along_dim_rows"
    spec = importlib.util.spec_from_file_location("gen_tad", tmp_path / name / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    g = torch.Generator().manual_seed(0)
    for shape in ((5, 37), (2, 3, 130)):
        x = torch.randn(shape, generator=g).to(DEVICE).requires_grad_(True)
        n = shape[-1]
        idx = torch.randint(-n, n, shape[:-1], generator=g).to(DEVICE)
        idx.view(-1)[:2] = torch.tensor([-n, n - 1])
        want = torch.take_along_dim(x, idx.unsqueeze(-1), dim=-1).squeeze(-1)
        y = mod.take_along_dim_rows(x, idx)
        torch.testing.assert_close(y, want, atol=0, rtol=0)
        dy = torch.randn(y.shape, generator=g).to(DEVICE)
        (got,) = torch.autograd.grad(y, x, dy)
        (ref,) = torch.autograd.grad(want, x, dy)
        torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-6)


def test_take_along_dim_reads_the_one_element_through_its_wrap(tmp_path):
    """The wrapped index (a remainder of the index input by N) is element-wise work on the index
    alone: the forward takes the pick form, computes the column from the index and reads that
    one element, at any row length (no row kernel, no looped kernels)."""
    from kernelwright.workflows.create import understand
    from kernelwright.workflows.create.codegen import write

    p = understand(
        str(Path(__file__).resolve().parents[1] / "examples/create/take_along_dim_rows.py")
    )
    write(p, tmp_path)
    name = "take_along_dim_rows"
    source = (tmp_path / name / f"{name}.py").read_text()
    assert f"_{name}_fwd_pick[" in source and "f_remainder" in source
    spec = importlib.util.spec_from_file_location("gen_tad_pick", tmp_path / name / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    # the forward has no row kernel to walk the row with, looped or not
    assert not hasattr(mod, f"_{name}_fwd_kernel") and not hasattr(mod, f"_{name}_fwd_part1")
    g = torch.Generator().manual_seed(1)
    n = 70001  # past every row the table holds whole
    x = torch.randn(3, n, generator=g).to(DEVICE)
    idx = torch.tensor([-1, -n, n - 2]).to(DEVICE)
    want = torch.take_along_dim(x, idx.unsqueeze(-1), dim=-1).squeeze(-1)
    torch.testing.assert_close(mod.take_along_dim_rows(x, idx), want, atol=0, rtol=0)
