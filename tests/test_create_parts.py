"""create: inputs read in equal parts of their last dim (a chunk, a split, GLU's halves).

The reference is generated over the parts; the public function takes the input whole, hands
the kernels its parts as views and writes their gradients into one tensor. Each case runs
under the interpreter on tiny shapes against PyTorch's own forward and autograd; the cuts the
parts form cannot take stop with the node and the reason."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kernelwright.workflows.create import understand
from kernelwright.workflows.create.codegen import write
from kernelwright.workflows.create.parts import public_inputs

CORPUS = Path(__file__).resolve().parents[1] / "examples" / "create"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _profile(tmp_path: Path, name: str, body: str | None = None):
    path = CORPUS / f"{name}.py"
    if body is not None:
        path = tmp_path / f"{name}.py"
        path.write_text(textwrap.dedent(body))
    return understand(str(path))


def _op(tmp_path: Path, name: str, body: str | None = None):
    profile = _profile(tmp_path, name, body)
    assert profile.tier in (1, 2), profile.unsupported_reason
    write(profile, tmp_path)
    spec = importlib.util.spec_from_file_location(f"gen_{name}", tmp_path / name / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return profile, mod, getattr(mod, name)


def _check(fn, ref, xs, tol=1e-5):
    xs = [x.to(DEVICE).requires_grad_(x.is_floating_point()) for x in xs]
    refs = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in xs]
    y, y_ref = fn(*xs), ref(*refs)
    torch.testing.assert_close(y, y_ref, atol=tol, rtol=tol)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(y.device)
    got = torch.autograd.grad(y, [x for x in xs if x.requires_grad], dy)
    want = torch.autograd.grad(y_ref, [x for x in refs if x.requires_grad], dy)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=tol, rtol=tol)


def test_glu_takes_x_whole_and_its_kernels_the_halves(tmp_path, monkeypatch):
    profile, mod, glu = _op(tmp_path, "glu")
    assert profile.input_parts == {"x": ["x_part0", "x_part1"]}
    assert [s.name for s in profile.inputs] == ["x_part0", "x_part1"]
    assert [(s.name, s.example_shape) for s in public_inputs(profile)] == [("x", [4, 8, 192])]
    x = torch.randn(3, 5, 14, generator=torch.Generator().manual_seed(0))
    _check(glu, lambda t: F.glu(t, dim=-1), [x])
    # not contiguous: every other column of a wider tensor (each part a view with stride 2)
    wide = torch.randn(4, 28, generator=torch.Generator().manual_seed(2))
    _check(glu, lambda t: F.glu(t, dim=-1), [wide[:, ::2]])
    # the backward writes both halves of dx in place, and x.grad is that tensor: nothing joins
    # the halves afterwards, and autograd does not copy it (as it does one held elsewhere)
    xg = x.detach().clone().to(DEVICE).requires_grad_(True)
    y = glu(xg)
    made = []

    def empty(*args, **kwargs):  # keeps the pointers only: a reference would make it copy
        t = torch.empty(*args, **kwargs)
        made.append((tuple(t.shape), t.data_ptr()))
        return t

    def no_cat(*args, **kwargs):
        raise AssertionError("the parts' gradients were joined by a copy")

    monkeypatch.setattr(mod, "empty", empty)
    monkeypatch.setattr(torch, "cat", no_cat)
    y.backward(torch.ones_like(y))
    assert (tuple(xg.shape), xg.grad.data_ptr()) in made


def test_a_part_the_reference_does_not_read_gets_a_zero_gradient(tmp_path):
    body = """
    import torch

    def first_half(x, w):
        h = x.shape[-1] // 2
        return torch.tanh(x[..., :h]) * w

    def get_inputs():
        return [torch.randn(6, 40), torch.randn(20)]
    """
    _, _, fn = _op(tmp_path, "first_half", body)
    x, w = torch.randn(5, 18), torch.randn(9)
    _check(fn, lambda a, b: torch.tanh(a[..., : a.shape[-1] // 2]) * b, [x, w])


def test_three_parts_and_another_input_and_a_row_reduction(tmp_path):
    body = """
    import torch

    def split3(x, y):
        a, b, c = x.split(x.shape[-1] // 3, dim=-1)
        return torch.softmax(a, dim=-1) * torch.sigmoid(b) + c * y

    def get_inputs():
        return [torch.randn(5, 4, 48), torch.randn(5, 4, 16)]
    """
    profile, _, fn = _op(tmp_path, "split3", body)
    assert profile.tier == 2 and len(profile.input_parts["x"]) == 3
    x, y = torch.randn(2, 3, 21), torch.randn(2, 3, 7)

    def ref(a, b):
        p, q, r = a.split(a.shape[-1] // 3, dim=-1)
        return torch.softmax(p, dim=-1) * torch.sigmoid(q) + r * b

    _check(fn, ref, [x, y])
    with pytest.raises(ValueError, match="x has shape .* 3 equal parts"):
        fn(torch.randn(2, 3, 20, device=DEVICE), torch.randn(2, 3, 7, device=DEVICE))
    # a dtype the kernels do not take: named as the caller passed it, not as a part
    with pytest.raises(TypeError, match="split3: x is torch.float64"):
        fn(torch.randn(2, 3, 21, device=DEVICE, dtype=torch.float64), y.to(DEVICE))


@pytest.mark.parametrize(
    "body, node, match",
    [
        ("return x[..., :4] * torch.sigmoid(x[..., 4:8])", "aten.slice", "does not scale"),
        ("a, b = x.chunk(2, dim=-1)\n    return (a * b).sum(-1, keepdim=True) + x", "aten.add",
         "whole and in parts"),
        ("a, b = x.chunk(2, dim=0)\n    return a * b", "aten.split", "another dim than the last"),
        ("a, b = x.split([2, 6], dim=-1)\n    return a.sum(-1, keepdim=True) * b",
         "aten.split", "not equal parts"),
        ("a, b = (x * 2).chunk(2, dim=-1)\n    return a * b", "aten.split", "a computed tensor"),
    ],
)  # fmt: skip
def test_cuts_the_parts_form_does_not_take_stop_with_a_reason(tmp_path, body, node, match):
    inputs = "def get_inputs():\n    return [torch.randn(4, 8)]\n"
    src = f"import torch\n\ndef cut(x):\n    {body}\n\n{inputs}"
    profile = _profile(tmp_path, "cut", src)
    assert profile.tier == 3 and node in profile.unsupported_node, profile.unsupported_node
    assert match in profile.unsupported_reason


def test_a_width_taken_from_another_dim_of_the_same_size_stops(tmp_path):
    # [8, 8]: x.shape[0] // 2 equals x.shape[-1] // 2 here, but not at other shapes
    src = """
    import torch

    def rowdep(x):
        h = x.shape[0] // 2
        return x[..., :h] * torch.sigmoid(x[..., h:])

    def get_inputs():
        return [torch.randn(8, 8)]
    """
    profile = _profile(tmp_path, "rowdep", src)
    assert profile.tier == 3 and "does not scale" in profile.unsupported_reason


def test_the_review_stop_says_which_input_is_read_in_parts(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "kernelwright.cli", "create", str(CORPUS / "glu.py")],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "x is read in 2 equal parts of its last dim" in proc.stdout
    profile = (tmp_path / "kernelwright-runs/create/glu/profile.yaml").read_text()
    assert "input_parts:\n  x:\n  - x_part0\n  - x_part1" in profile


def test_kernelwright_compile_takes_a_site_with_the_parts_shapes():
    # the generated pattern's site check counts a cut input at its parts' count times the
    # columns: GLU's [.., 2N] input and [.., N] result fit; a result of another width does not
    from torch.fx import Graph

    from kernelwright.compile.generated import _problem

    def node(g, shape):
        n = g.placeholder(f"t{len(g.nodes)}")
        n.meta["val"] = torch.empty(shape)
        return n

    g = Graph()
    x, w, y, wide = node(g, (3, 64)), node(g, (32,)), node(g, (3, 32)), node(g, (3, 64))
    assert _problem({"x": x, "w": w}, y, {0: 2}) is None
    assert "shape" in _problem({"x": x, "w": w}, wide, {0: 2})
    assert "shape" in _problem({"x": x, "w": w}, y)  # not cut: the result must be x's shape
    assert "w has shape" in _problem({"x": x, "w": node(g, (64,))}, y, {0: 2})
