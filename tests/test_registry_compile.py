"""kernelwright.compile reading a results database end to end: measured choices respected per
site and the same on a second compile, Liger's speed never leaving a site to a slower
Inductor, dynamic shapes left with their reason, bad databases as errors naming the file.
The timings are made up (rows written by hand, keyed to the suite's device)."""

import json
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICE

import kernelwright
from kernelwright.bench.db import ResultsDB, ResultsDBError, new_run_id
from kernelwright.bench.harness import BenchRow
from kernelwright.compile import CompileReport, passes, select
from kernelwright.ops import _gated
from kernelwright.ops import softmax as softmax_mod

pytestmark = [pytest.mark.compile, pytest.mark.usefixtures("fresh_dynamo")]

GPU_ONLY = "cuda_events_gpu_only_demote_flush"
ROWS, N = 4, 16  # every site's main input: [4, 16]


@pytest.fixture
def launches(monkeypatch):
    counts = {"swiglu": 0, "softmax": 0}

    def counting(module, name, key):
        real = getattr(module, name)

        def wrapper(*args, **kwargs):
            counts[key] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    counting(_gated, "gated_fwd_launch", "swiglu")
    counting(softmax_mod, "softmax_fwd_launch", "softmax")
    return counts


def _db(path, timings: dict[str, dict[str, float]], arch: str) -> ResultsDB:
    """op -> provider -> ms at [ROWS, N] on `arch`, bf16-free: float32 as the sites are."""
    rows = [
        BenchRow(op=op, mode="full", provider=p, x_name="n", x_value=N, shape=f"{ROWS}x{N}",
                 dtype="float32", ms_p20=ms, ms_p50=ms, ms_p80=ms, host_ms=0.01, timing=GPU_ONLY,
                 gpu="test", arch=arch, dims=json.dumps({"rows": ROWS, "n": N}))
        for op, by in timings.items() for p, ms in by.items()
    ]  # fmt: skip
    db = ResultsDB(path)
    db.append(rows, source="bench", run_id=new_run_id(), command="test")
    return db


def fn(x, g, u):
    return torch.softmax(x, -1) * (F.silu(g) * u)


def _inputs():
    torch.manual_seed(0)
    return [torch.randn(ROWS, N, device=DEVICE, requires_grad=True) for _ in range(3)]


def _run(compiled, inputs):
    out = compiled(*inputs)
    torch.testing.assert_close(out, fn(*inputs))
    dy = torch.randn_like(out)
    got = torch.autograd.grad(out, inputs, dy)
    want = torch.autograd.grad(fn(*inputs), inputs, dy)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


def test_measured_choices_are_respected_and_the_same_on_a_second_compile(tmp_path, launches):
    arch = select._arch(select._device_name(DEVICE), None)  # the key the sites read
    db = _db(tmp_path / "r.db", {
        "softmax": {"kernelwright": 2.0, "torch_compile": 1.0},  # Inductor measured faster
        "swiglu": {"kernelwright": 1.0, "torch_compile": 3.0},
    }, arch)  # fmt: skip
    inputs = _inputs()
    choices = []
    for _ in range(2):
        torch._dynamo.reset()
        report = CompileReport()
        compiled = kernelwright.compile(fn, report=report, db=db.path, backend="aot_eager")
        _run(compiled, inputs)
        choices.append([(s.key, s.op, s.impl, s.replaced, s.reason) for s in report])
    assert choices[0] == choices[1]
    assert [c[1:4] for c in choices[0]] == [
        ("softmax", "inductor", False),
        ("swiglu", "kernelwright", True),
    ]
    assert "fastest measured in rows~4 n~16" in choices[0][0][4]
    assert launches == {"softmax": 0, "swiglu": 2}  # one forward per compile


def test_liger_fastest_leaves_no_site_to_a_slower_inductor(tmp_path, launches, monkeypatch):
    """Sites read as on an sm_90 GPU, where Liger is capable and its rows count; liger_kernel
    not importable (where it is, the pass calls it: tests/test_compile_liger.py)."""
    for name in [n for n in sys.modules if n.startswith("liger_kernel")] + ["liger_kernel"]:
        monkeypatch.setitem(sys.modules, name, None)
    real = select.choose
    monkeypatch.setattr(
        passes, "choose", lambda op, **kw: real(op, **(kw | {"device": "cuda", "arch": "sm_90"}))
    )
    db = _db(tmp_path / "r.db", {
        "softmax": {"liger": 0.5, "kernelwright": 2.0, "torch_compile": 1.0},
        "swiglu": {"liger": 0.5, "kernelwright": 1.0, "torch_compile": 3.0},
    }, "sm_90")  # fmt: skip
    report = CompileReport()
    compiled = kernelwright.compile(fn, report=report, db=db.path, backend="aot_eager")
    _run(compiled, _inputs())
    assert [(s.op, s.impl, s.replaced) for s in report] == [
        ("softmax", "inductor", False),
        ("swiglu", "kernelwright", True),
    ]
    for site in report:
        want = (
            "liger measured fastest; not insertable here (liger_kernel is not installed); "
            f"chose {site.impl}"
        )
        assert want in site.reason
    assert launches == {"softmax": 0, "swiglu": 1}


def test_dynamic_shapes_run_and_the_report_says_why(launches):
    report = CompileReport()
    compiled = kernelwright.compile(fn, report=report, backend="aot_eager", dynamic=True)
    _run(compiled, _inputs())
    torch.manual_seed(1)
    other = [torch.randn(3, 24, device=DEVICE, requires_grad=True) for _ in range(3)]
    _run(compiled, other)  # another shape, the same dynamic graph
    assert report.graphs == 1 and [s.op for s in report] == ["softmax", "swiglu"]
    for site in report:
        assert not site.replaced and "has a dynamic last dimension" in site.reason
        assert "left to the backend" in site.line()
    assert launches == {"softmax": 0, "swiglu": 0}


def test_a_corrupt_database_is_an_error_naming_the_file(tmp_path):
    bad = tmp_path / "corrupt.db"
    bad.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(ResultsDBError, match="corrupt.db is not a results database"):
        kernelwright.compile(fn, db=bad)
    with pytest.raises(ResultsDBError, match="corrupt.db"):
        kernelwright.compile_backend(db=bad)
    with pytest.raises(ResultsDBError, match="corrupt.db"):
        kernelwright.compile.inductor_pass(db=bad)
    # a file spoiled after the compile call: Dynamo wraps the error, which still names it
    later = tmp_path / "later.db"
    compiled = kernelwright.compile(fn, db=later, backend="aot_eager")
    later.write_bytes(b"garbage" * 300)
    with pytest.raises(Exception, match="later.db is not a results database") as err:
        compiled(*_inputs())
    assert isinstance(err.value, torch._dynamo.exc.BackendCompilerFailed)
