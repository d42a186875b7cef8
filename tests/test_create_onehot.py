"""create: `F.one_hot(target, C)` as traced (with or without its range check) folds into one node
that a row kernel lowers as the mask `cols == target`; the range check stays (the generated
function raises, the kernel gives a bad row NaN); classes other than the row stop."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch._C import DispatchKey

from kernelwright.workflows.create import understand
from kernelwright.workflows.create.codegen import write

CORPUS = Path(__file__).resolve().parents[1] / "examples" / "create"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def cpp_one_hot():
    """one_hot traced through PyTorch's C++ kernel (fake tensors: the comparison alone, no
    range check), as a trace on a GPU has it, instead of the Python decomposition."""
    op = torch.ops.aten.one_hot.default
    # a CUDA build of torch may register no Python decomposition: it traces the C++ kernel
    kernel = op.py_kernels.pop(DispatchKey.CompositeImplicitAutograd, None)
    op._dispatch_cache.clear()
    yield
    if kernel is not None:
        op.py_kernels[DispatchKey.CompositeImplicitAutograd] = kernel
    op._dispatch_cache.clear()


def _ops(graph) -> list[str]:
    return [n.target.split(".")[1] for n in graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("form", ["decomposition", "cpp"])
def test_one_hot_folds_into_one_node(form, request):
    if form == "cpp":
        request.getfixturevalue("cpp_one_hot")
    p = understand(str(CORPUS / "cross_entropy_one_hot.py"))
    assert p.tier == 2, p.unsupported_reason
    for graph in (p.forward, p.backward):
        ops = _ops(graph)
        assert ops.count("one_hot") == 1
        assert not {"any", "_assert_async", "arange", "eq", "logical_not"} & set(ops)
    assert "one_hot = one_hot(target, 96)" in "\n".join(p.forward.readable)


def test_one_hot_classes_must_be_the_row(tmp_path):
    path = tmp_path / "one_hot_ten.py"
    path.write_text(
        "import torch\n\n\n"
        "def one_hot_ten(x, t):\n"
        "    return x * torch.nn.functional.one_hot(t, 10).to(x.dtype).sum(-1, keepdim=True)\n\n\n"
        "def get_inputs():\n"
        "    return [torch.randn(8, 64), torch.randint(0, 10, (8,))]\n"
    )
    p = understand(str(path))
    assert p.tier == 3 and "one_hot" in p.unsupported_node
    assert "10 classes against rows of 64" in p.unsupported_reason


def test_one_hot_cross_entropy_kernel_and_its_range_check(tmp_path, monkeypatch):
    write(understand(str(CORPUS / "cross_entropy_one_hot.py")), tmp_path)
    name = "cross_entropy_one_hot"
    spec = importlib.util.spec_from_file_location("gen_one_hot", tmp_path / name / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 37, generator=g).to(DEVICE)
    target = torch.randint(0, 37, (5,), generator=g).to(DEVICE)
    dy = torch.randn(5, generator=g).to(DEVICE)
    x, ref = logits.clone().requires_grad_(True), logits.clone().requires_grad_(True)
    want = F.cross_entropy(ref, target, reduction="none")
    (want_grad,) = torch.autograd.grad(want, ref, dy)
    for looped in (False, True):  # rows held whole, then the looped kernels
        if looped:
            tile = [(mod._LAST, mod.C(block_n=16, rows=2, num_warps=1))]
            for k in ("fwd", "bwd"):
                monkeypatch.setitem(mod.TABLE, k, {"default": tile})
        y = mod.cross_entropy_one_hot(x, target)
        torch.testing.assert_close(y, want, atol=1e-5, rtol=1e-5)
        (grad,) = torch.autograd.grad(y, x, dy)
        torch.testing.assert_close(grad, want_grad, atol=1e-5, rtol=1e-5)
    bad = target.clone()
    bad[2] = 37
    if DEVICE == "cpu":  # on a GPU a device-side assert, which ends the CUDA context
        with pytest.raises(ValueError, match=r"target\[2\] = 37 is outside \[0, 37\)"):
            mod.cross_entropy_one_hot(x, bad)
    monkeypatch.undo()  # rows held whole again
    if DEVICE == "cpu":
        # past the function's check, the forward kernel flags the index as it reads it
        with pytest.raises(ValueError, match=r"an index in 'target' is outside \[0, 37\)"):
            mod._CrossEntropyOneHotFunction.apply(x, bad)
        assert int(mod.index_flag(x.device)[0]) == 0  # reset for the next launch
    # the kernel gives the bad row NaN and leaves the others
    y = torch.empty(5, dtype=x.dtype, device=DEVICE)
    flag = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    mod._cross_entropy_one_hot_fwd_kernel[(5,)](
        x, x.stride(0), 1, bad, 1, 0, y, 1, flag, 5, 37, BLOCK_N=64, ROWS=1
    )
    assert torch.isnan(y[2]) and torch.isfinite(y[[0, 1, 3, 4]]).all() and int(flag[0]) == 1


def test_one_hot_reference_is_benchmarked_at_its_class_count(tmp_path):
    """The reference's `one_hot(target, 96)` runs on rows of 96 columns only: the benchmark
    keeps that width (a wider row gives it targets >= 96: on a GPU, a device-side assert that
    ends the worker) and runs no long rows."""
    p = understand(str(CORPUS / "cross_entropy_one_hot.py"))
    assert {pt["cols"] for pt in p.benchmark_sweep} == {96}
    assert len(p.benchmark_sweep) > 1
    write(p, tmp_path)
    name = "cross_entropy_one_hot"
    spec = importlib.util.spec_from_file_location("gen_one_hot_b", tmp_path / name / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert {pt["cols"] for pt in mod.BENCH["sweep"]} == {96}
    assert mod.BENCH["layout"][3] is False  # no 393,216-column sweep
    # a row op without a one_hot keeps the model-sized sweep and its long rows
    q = understand(str(CORPUS / "cross_entropy_gather.py"))
    assert len({pt["cols"] for pt in q.benchmark_sweep}) > 1
