"""create: generated ops that must refuse, or get right, what a plain broadcast or dtype rule
would get silently wrong — an input reduced along the row on its own passed broadcast, an
output cast to a fixed dtype, integer arithmetic beyond fp32's exact range, a parameter's
starting value, a bool input. Each reference is generated here and its op run under the
interpreter on tiny shapes."""

from __future__ import annotations

import importlib
import importlib.util
import textwrap
from pathlib import Path

import pytest
import torch

from kernelwright.workflows.create import understand
from kernelwright.workflows.create.codegen import write

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the kernels run where torch does


def _profile(tmp_path: Path, name: str, body: str):
    path = tmp_path / f"{name}.py"
    path.write_text("import torch\nfrom torch import nn\n\n" + textwrap.dedent(body))
    return understand(str(path))


def _module(tmp_path: Path, name: str, body: str, tier: int | None = None):
    """The generated op module of the reference `body` (imports added)."""
    profile = _profile(tmp_path, name, body)
    assert profile.tier != 3, profile.unsupported_reason
    assert tier is None or profile.tier == tier
    write(profile, tmp_path)
    spec = importlib.util.spec_from_file_location(f"gen_{name}", tmp_path / name / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


MASKED_MSE = """
    class Model(nn.Module):
        def forward(self, pred, target, weight, mask):
            return (weight * mask * (pred - target) ** 2).sum() / mask.sum()

    def get_inputs():
        return [torch.randn(4, 8), torch.randn(4, 8), torch.rand(4, 8), torch.rand(4, 8)]
"""
MASKED_MEAN = """
    def masked_mean(x, m):
        return (x * m).sum(-1) / m.sum(-1).clamp(min=1.0)

    def get_inputs():
        return [torch.randn(4, 8), (torch.rand(4, 8) > 0.3).float()]
"""


def test_an_input_reduced_on_its_own_is_refused_broadcast_along_the_row(tmp_path):
    g = torch.Generator().manual_seed(0)
    p, t, w = (torch.randn(3, 5, generator=g).to(DEVICE) for _ in range(3))
    mask = (torch.rand(3, 5, generator=g) > 0.3).float().to(DEVICE)
    mse = _module(tmp_path, "masked_mse", MASKED_MSE).masked_mse
    want = (w * mask * (p - t) ** 2).sum() / mask.sum()
    torch.testing.assert_close(mse(p, t, w, mask), want)
    # mask.sum() of a [3, 1] mask counts 3 elements; the kernel would count 15
    with pytest.raises(ValueError, match=r"mask has shape \(3, 1\).*traced as \[4, 8\] \(full\)"):
        mse(p, t, w, mask[:, :1])
    # the other inputs are reduced together with pred, which spans the row: a weight per column
    # broadcast over rows is the reference's result
    w1 = w[:1]
    torch.testing.assert_close(mse(p, t, w1, mask), (w1 * mask * (p - t) ** 2).sum() / mask.sum())

    mean = _module(tmp_path, "masked_mean", MASKED_MEAN).masked_mean
    x, m = torch.randn(3, 5, generator=g).to(DEVICE), mask
    with pytest.raises(ValueError, match=r"m has shape \(3, 1\).*\[4, 8\] \(full\)"):
        mean(x, m[:, :1])
    # broadcast over rows only: each row still sums the mask's own row
    m1 = m[:1]
    torch.testing.assert_close(mean(x, m1), (x * m1).sum(-1) / m1.sum(-1).clamp(min=1.0))


UPCAST = """
    def upcast(logits):
        return torch.log_softmax(logits.float(), dim=-1)

    def get_inputs():
        return [torch.randn(4, 8)]
"""


def test_an_output_cast_to_float32_is_float32_for_any_input_dtype(tmp_path, monkeypatch):
    mod = _module(tmp_path, "upcast", UPCAST, tier=2)
    assert mod.OUT_DTYPES[0] is torch.float32
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(0)).to(DEVICE, torch.bfloat16)
    x.requires_grad_(True)
    y = mod.upcast(x)
    assert y.dtype == torch.float32  # the reference's, not the input's bfloat16
    ref = x.detach().clone().requires_grad_(True)
    y_ref = torch.log_softmax(ref.float(), dim=-1)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    (g,) = torch.autograd.grad(y, x, dy)
    (g_ref,) = torch.autograd.grad(y_ref, ref, dy)
    assert g.dtype == torch.bfloat16
    torch.testing.assert_close(g, g_ref, atol=2e-2, rtol=2e-2)
    # no element: the reference's result, in the same dtype
    assert mod.upcast(x[:0].detach()).dtype == torch.float32
    # and the generated test checks the reference's dtype, and passes
    monkeypatch.syspath_prepend(str(tmp_path))
    test = importlib.import_module("upcast.test_upcast")
    assert test.OUT_DTYPES[0] is torch.float32
    test._check((3, 5), torch.bfloat16, True)


@pytest.mark.parametrize(
    "body, node, reason",
    [
        ("def f(x):\n    return (x * torch.sigmoid(x)).to(torch.bfloat16)\n",
         "y", "cast to a fixed dtype (torch.bfloat16"),
        ("def f(ids):\n    return (ids * 3 + 1) % 1000\n",
         "y (aten.remainder.Scalar)", "integer arithmetic on an integer input"),
        ("def f(x, ids):\n    return x * (ids * 3).float()\n",
         "mul (aten.mul.Tensor)", "integer arithmetic on an integer input"),
    ],
)  # fmt: skip
def test_what_fp32_tiles_cannot_hold_stops_saying_why(tmp_path, body, node, reason):
    ints = "torch.randint(0, 1000, (4, 8))"
    args = ints if "(ids)" in body else f"torch.randn(4, 8), {ints}" if "ids" in body else ""
    args = args or "torch.randn(4, 8)"
    profile = _profile(tmp_path, "fixed", body + f"def get_inputs():\n    return [{args}]\n")
    assert profile.tier == 3
    assert profile.unsupported_node == node
    assert reason in profile.unsupported_reason


def test_index_arithmetic_and_counts_stay_generated(tmp_path):
    # an index wrapped into the row (take_along_dim's remainder), an int count as a divisor and a
    # bool count are exact on fp32 tiles: still generated
    body = """
    def f(x, t, c):
        return torch.take_along_dim(x, t.unsqueeze(-1), -1).squeeze(-1) / c + (x > 0).sum(-1)

    def get_inputs():
        return [torch.randn(4, 8), torch.randint(0, 8, (4,)), torch.randint(1, 9, (4,))]
    """
    assert _profile(tmp_path, "indexed", body).tier == 2


GEMMA = """
    class Gemma(nn.Module):
        def __init__(self, hidden=8):
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(hidden))
            self.bias = nn.Parameter(torch.full((hidden,), 0.5))
            self.gain = nn.Parameter(torch.randn(hidden))

        def forward(self, x):
            out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
            return out * (1.0 + self.weight) * self.gain + self.bias

    def get_inputs():
        return [torch.randn(4, 8)]
"""


def test_the_module_starts_its_parameters_where_the_reference_does(tmp_path):
    mod = _module(tmp_path, "gemma", GEMMA)
    module = mod.Gemma(8)
    assert torch.equal(module.weight, torch.zeros(8))  # not ones: 1 + weight scales by 1
    assert torch.equal(module.bias, torch.full((8,), 0.5))
    # a random init cannot be repeated: it starts at ones, and the docstring says so
    assert torch.equal(module.gain, torch.ones(8))
    assert "gain starts at ones, not at the" in mod.Gemma.__doc__


WHERE_MASK = """
    def where_mask(x, mask):
        return torch.where(mask, x * 2, torch.full_like(x, -1e4))

    def get_inputs():
        return [torch.randn(4, 8), torch.rand(4, 8) > 0.5]
"""


def test_a_bool_input_takes_bool_tensors_only(tmp_path, monkeypatch):
    mod = _module(tmp_path, "where_mask", WHERE_MASK, tier=1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, generator=g).to(DEVICE)
    mask = (torch.rand(3, 5, generator=g) > 0.5).to(DEVICE)
    torch.testing.assert_close(mod.where_mask(x, mask), torch.where(mask, x * 2, -1e4))
    # an int64 mask selects by nonzero where torch.where raises: refused, naming it
    with pytest.raises(TypeError, match="mask is torch.int64; the reference takes a bool"):
        mod.where_mask(x, torch.randint(0, 8, (3, 5), generator=g).to(DEVICE))
    # the generated tests draw bools for it (the reference itself raises on integers)
    monkeypatch.syspath_prepend(str(tmp_path))
    test = importlib.import_module("where_mask.test_where_mask")
    xs = test._inputs((3, 5), torch.float32)
    assert xs[1].dtype == torch.bool
    test._check((3, 5), torch.float32, True)  # forward and backward against the reference


@pytest.mark.parametrize(
    "lines, says",
    [
        # a chunk of an input is generated (the parts form); of a computed tensor it stops
        (
            ["a, b = (x * 2).chunk(2, -1)", "return torch.nn.functional.silu(a) * b"],
            "pass the parts",
        ),
        (["return x[..., :4] * 2"], "pass the part as an input"),
        (["return x + torch.arange(x.shape[-1], dtype=x.dtype)"], "pass it as an input"),
    ],
    ids=["chunk", "slice", "arange"],
)
def test_a_stop_says_what_to_pass_instead(tmp_path, lines, says):
    body = "".join(f"    {line}\n" for line in lines)
    ref = f"def part(x):\n{body}\n\ndef get_inputs():\n    return [torch.randn(4, 8)]\n"
    profile = _profile(tmp_path, "part", ref)
    assert profile.tier == 3 and says in profile.unsupported_reason, profile.unsupported_reason
