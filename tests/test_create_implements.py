"""`create --into-library --implements OP`: a created kernel registered as the "created"
implementation of a library op, end to end on the CPU — the declaration checked (an unknown op
lists the ops, another signature says what differs), the registry entry, the op's benchmark
timing it (`registry bench OP --shape`), the selection picking it where the database says it
is faster, and kernelwright.compile inserting it at the op's sites with eager's values and
gradients. Like tests/test_create_library.py, the op is written into this checkout and removed
again; its generated tests (the library gate) are not run here."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import DEVICE, written_op
from typer.testing import CliRunner

import kernelwright
from kernelwright import registry
from kernelwright.bench.db import ResultsDB, new_run_id
from kernelwright.bench.harness import BenchRow
from kernelwright.cli import app
from kernelwright.compile import CompileReport, select
from kernelwright.compile.generated import created_unfit, site_options
from kernelwright.compile.patterns import match_rms_norm
from kernelwright.registry.entry import Impl
from kernelwright.workflows.create import library as L
from kernelwright.workflows.create.implements import ImplementsError, library_op
from kernelwright.workflows.create.run import understand_source

ROOT = Path(__file__).resolve().parents[1]
NAME = "kwtest_relu_sq_impl"  # a name no real op has: the test writes into this checkout
GPU_ONLY = "cuda_events_gpu_only_demote_flush"


@pytest.fixture(scope="module")
def profile():
    return understand_source(str(ROOT / "examples" / "create" / "relu_squared.py"), NAME)


def _passing_gate(cmd, **kw):
    return subprocess.CompletedProcess(cmd, 0, "1 passed", "")


def test_unknown_op_or_another_signature_is_a_clear_error(profile, tmp_path):
    with pytest.raises(ImplementsError, match=r"no op 'rms_nrom'\. Did you mean 'rms_norm'\? "
                       r"Known: .*relu_squared, rms_norm"):  # fmt: skip
        library_op("rms_nrom")
    with pytest.raises(ImplementsError, match="no benchmark spec"):
        library_op("moe_experts")
    with written_op(NAME) as paths:
        with pytest.raises(ImplementsError, match=(
            r"swiglu takes 2 tensor input\(s\) \(gate, up\); the created kernel "
            rf"{NAME} takes 1 \(x\)"
        )):  # fmt: skip
            L.into_library(profile, tmp_path / "log", implements="swiglu")
        assert not any(p.exists() for p in paths)  # checked before anything is written


def test_a_created_kernel_for_a_site_with_other_constants_is_ruled_out(fresh_dynamo):
    """The created kernel bakes its reference's constants in: a site of the op whose call
    differs (eps here) is not given to it, and the reason says what differs."""
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w

    torch.compile(norm, backend=keep, fullgraph=True)(torch.randn(4, 16), torch.randn(16))
    rsqrt = next(n for n in graphs[0].graph.nodes if n.target is torch.rsqrt)
    m = match_rms_norm(rsqrt)
    assert site_options(m) == "rms_norm(x, weight, 1e-05, casting_mode='none')"
    made = Impl("created", "created_x", "m:f", inputs=("x", "weight"),
                computes="rms_norm(x, weight, 1e-06, casting_mode='none')")  # fmt: skip
    assert created_unfit(m, made) == (
        "the created kernel computes rms_norm(x, weight, 1e-06, casting_mode='none'), "
        "this site rms_norm(x, weight, 1e-05, casting_mode='none')"
    )
    same = dataclasses.replace(made, computes=site_options(m))
    assert created_unfit(m, same) is None
    # the pass hands such a reason to the selection, which rejects as a capability check does
    c = select.choose("rms_norm", dtype="fp32", shape=(4, 16), device="cpu",
                      ruled_out={"kernelwright": "its eps differs"})  # fmt: skip
    assert c.impl == "inductor" and ("kernelwright", "its eps differs") in c.rejected


def _rows(arch: str, timings: dict[tuple[int, int], dict[str, float]]) -> list[BenchRow]:
    return [
        BenchRow(op="relu_squared", mode="full", provider=p, x_name="intermediate", x_value=n,
                 shape=f"{m}x{n}", dtype="float32", ms_p20=ms, ms_p50=ms, ms_p80=ms, host_ms=0.01,
                 timing=GPU_ONLY, gpu="test", arch=arch,
                 dims=json.dumps({"tokens": m, "intermediate": n}))
        for (m, n), by in timings.items() for p, ms in by.items()
    ]  # fmt: skip


def test_created_implementation_is_benched_chosen_and_inserted(
    profile, tmp_path, monkeypatch, fresh_dynamo
):
    import kernelwright.bench as bench

    provider = f"created_{NAME}"
    with written_op(NAME):
        with monkeypatch.context() as m:  # subprocess.run is global: Triton's compiles use it
            m.setattr(L.subprocess, "run", _passing_gate)
            result = L.into_library(profile, tmp_path / "log", implements="relu_squared")
        assert result.passed
        source = (L.checkout_paths()[0] / "ops" / "generated" / f"{NAME}.py").read_text()
        assert "IMPLEMENTS = {'op': 'relu_squared', 'inputs': ('x',)" in source

        # the registry: the op's implementations, its created kernel after kernelwright's
        entry = registry.get("relu_squared")
        assert [i.name for i in entry.impls] == ["kernelwright", "created", "liger", "inductor"]
        made = entry.impl("created")
        assert (made.provider, made.inputs, made.computes) == (provider, ("x",), "relu_squared(x)")
        assert registry.get(NAME).implements == "relu_squared"
        got = CliRunner().invoke(app, ["registry", "list", "relu_squared"],
                                 env={"COLUMNS": "400"})  # fmt: skip
        function = registry.get(NAME).function  # the reference's name: relu_squared
        assert f"kernelwright.ops.generated.{NAME}:{function}" in got.output

        # the op's benchmark times it, at a call site's shape
        real = bench.make_context
        monkeypatch.setattr(bench, "make_context", lambda **kw: dataclasses.replace(
            real(copy_gbps=1.0), timing=GPU_ONLY))  # fmt: skip
        db = tmp_path / "bench.db"
        args = ["registry", "bench", "relu_squared", "--shape", "4x16", "--dtype", "fp32",
                "--db", str(db), "--out", str(tmp_path / "out")]  # fmt: skip
        got = CliRunner().invoke(app, args, env={"COLUMNS": "400"})
        assert got.exit_code == 0, got.output
        # (on a GPU the installed peers are timed beside them)
        assert {"kernelwright", provider} <= {r["provider"] for r in ResultsDB.existing(db).query()}
        c = select.choose("relu_squared", dtype="fp32", shape=(4, 16), device=DEVICE.type, db=db,
                          among=select.INSERTABLE)  # fmt: skip
        assert c.measured and {"kernelwright", "created"} <= dict(c.timings).keys()

        # the pass: created where measured faster (rows~4), kernelwright where it is (rows~64)
        arch = select._arch(select._device_name(DEVICE), None)
        db = ResultsDB(tmp_path / "made.db")
        db.append(_rows(arch, {(4, 16): {"kernelwright": 1.0, provider: 0.5},
                               (64, 16): {"kernelwright": 0.5, provider: 1.0}}),
                  source="bench", run_id=new_run_id(), command="test")  # fmt: skip
        generated = registry.get(NAME).load()
        calls = []
        kernel = getattr(generated, function)
        monkeypatch.setattr(generated, function, lambda *a: calls.append(1) or kernel(*a))

        def fn(a, b):
            return torch.relu(a) ** 2, torch.square(torch.relu(b))

        torch.manual_seed(0)
        inputs = [torch.randn(4, 16, device=DEVICE, requires_grad=True),
                  torch.randn(64, 16, device=DEVICE, requires_grad=True)]  # fmt: skip
        report = CompileReport()
        compiled = kernelwright.compile(fn, report=report, db=db.path, backend="aot_eager")
        outs = compiled(*inputs)
        assert [(s.op, s.impl, s.replaced) for s in report] == [
            ("relu_squared", "created", True),
            ("relu_squared", "kernelwright", True),
        ], report.summary()
        assert "fastest measured in rows~4 n~16" in report[0].reason and calls
        want = fn(*inputs)
        dys = [torch.randn_like(o) for o in outs]
        got_grads = torch.autograd.grad(outs, inputs, dys)
        want_grads = torch.autograd.grad(want, inputs, dys)
        for a, b in zip((*outs, *got_grads), (*want, *want_grads), strict=True):
            torch.testing.assert_close(a, b)
    assert "created" not in [i.name for i in registry.get("relu_squared").impls]
