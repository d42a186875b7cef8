"""create: a generated op on inputs that hold no element — rows of length 0, or no rows — gives
what its PyTorch reference gives (a sum over an empty row is 0, a softmax of one is empty,
gradients of per-feature parameters over no rows are 0), or, where the reference has no value (a
max over an empty dim), a ValueError naming the input and the dim. Each reference is generated
here and its op run under the interpreter."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kernelwright.workflows.create import understand
from kernelwright.workflows.create.codegen import write

REFS = {  # name -> (its expression of x (and w, b), get_inputs(), PyTorch's own)
    "e_sum": ("torch.sum(x, dim=-1)", "[torch.randn(4, 96)]", lambda x: x.sum(-1)),
    "e_softmax": ("torch.softmax(x, dim=-1)", "[torch.randn(4, 96)]",
                  lambda x: torch.softmax(x, -1)),
    "e_logsumexp": ("torch.logsumexp(x, dim=-1)", "[torch.randn(4, 96)]",
                    lambda x: torch.logsumexp(x, -1)),
    "e_sum_dim1": ("torch.sum(x, dim=1)", "[torch.randn(4, 24, 40)]", lambda x: x.sum(1)),
    "e_amax_dim1": ("torch.amax(x, dim=1)", "[torch.randn(4, 16, 50)]", lambda x: x.amax(1)),
    "e_layer_norm": ("F.layer_norm(x, (x.shape[-1],), w, b)",
                     "[torch.randn(4, 96), torch.randn(96), torch.randn(96)]",
                     lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b)),
}  # fmt: skip


def _op(tmp_path: Path, name: str):
    expr, inputs, _ = REFS[name]
    args = "x, w, b" if "w" in expr else "x"
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(f"""\
        import torch
        import torch.nn.functional as F


        def {name}({args}):
            return {expr}


        def get_inputs():
            return {inputs}
        """))  # fmt: skip
    profile = understand(str(path))
    assert profile.tier == 2, profile.unsupported_reason
    write(profile, tmp_path)
    spec = importlib.util.spec_from_file_location(f"gen_{name}", tmp_path / name / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, name)


@pytest.mark.parametrize(
    "name, shape",
    [("e_sum", (4, 0)), ("e_sum", (0, 5)), ("e_sum", (2, 3, 0)), ("e_softmax", (4, 0)),
     ("e_softmax", (0, 5)), ("e_logsumexp", (3, 0)), ("e_sum_dim1", (2, 0, 3)),
     ("e_sum_dim1", (0, 3, 4)), ("e_amax_dim1", (0, 3, 4)), ("e_layer_norm", (0, 96)),
     ("e_layer_norm", (3, 0))],
)  # fmt: skip
def test_an_empty_input_gives_what_pytorch_gives(name, shape, tmp_path):
    fn, want = _op(tmp_path, name), REFS[name][2]
    xs = [torch.randn(shape)]
    if name == "e_layer_norm":  # per-feature parameters: their gradient sums over no rows
        xs += [torch.randn(shape[-1]), torch.randn(shape[-1])]
    xs = [x.requires_grad_(True) for x in xs]
    refs = [x.detach().clone().requires_grad_(True) for x in xs]
    y, y_ref = fn(*xs), want(*refs)
    torch.testing.assert_close(y, y_ref, equal_nan=True)
    dy = torch.randn(y.shape)
    for g, r in zip(torch.autograd.grad(y, xs, dy), torch.autograd.grad(y_ref, refs, dy),
                    strict=True):  # fmt: skip
        torch.testing.assert_close(g, r)


def test_a_max_over_an_empty_dim_names_the_input_and_the_dim(tmp_path):
    fn = _op(tmp_path, "e_amax_dim1")
    with pytest.raises(IndexError):  # PyTorch's own has no value there either
        torch.amax(torch.randn(2, 0, 3), dim=1)
    with pytest.raises(
        ValueError, match=r"e_amax_dim1: x has size 0 in dim 1 \(shape \(2, 0, 3\)\)"
    ):
        fn(torch.randn(2, 0, 3))
