"""Per-call-site selection (compile/select.py) over a fixture results database: capability
rejections with their reasons, the fastest measured implementation per shape bucket, the
documented default where nothing is measured, determinism, GPU-only and host-inclusive timings
never compared with each other, bad databases as errors naming the file, and the CLI.
The timings are made up (rows written by hand, as a GPU run would record them)."""

from __future__ import annotations

import json
import sqlite3

import pytest
import torch
from typer.testing import CliRunner

from kernelwright import registry
from kernelwright.bench.db import ResultsDB, ResultsDBError, new_run_id
from kernelwright.bench.harness import BenchRow
from kernelwright.cli import app
from kernelwright.compile.select import INSERTABLE, Bucket, bucket_of, choose, pow2, row_bucket
from kernelwright.registry.entry import INDUCTOR, Capability, Impl, OpEntry, unsupported

HOST = "cuda_events_demote_flush"
GPU_ONLY = "cuda_events_gpu_only_demote_flush"
SITE = {"dtype": "bfloat16", "shape": (8192, 4096), "device": "cuda", "arch": "sm_90"}


def _row(provider, ms, *, shape="8192x4096", mode="full", timing=GPU_ONLY, op="rms_norm",
         dtype="bfloat16", arch="sm_90", error=""):  # fmt: skip
    tokens, hidden = (int(s) for s in shape.split("x"))
    return BenchRow(
        op=op, mode=mode, provider=provider, x_name="hidden", x_value=hidden, shape=shape,
        dtype=dtype, ms_p20=ms * 0.9, ms_p50=ms, ms_p80=ms * 1.1, host_ms=0.01, timing=timing,
        gpu="NVIDIA H100 80GB HBM3", arch=arch, error=error,
        dims=json.dumps({"tokens": tokens, "hidden": hidden}),
    )  # fmt: skip


def _write(path, rows) -> ResultsDB:
    db = ResultsDB(path)
    db.append(rows, source="bench", run_id=new_run_id(), command="test")
    return db


@pytest.fixture
def db(tmp_path):
    """rms_norm on sm_90, bf16: Liger fastest at 8192x4096, kernelwright at 1024x16384."""
    return _write(
        tmp_path / "results.db",
        [
            _row("kernelwright", 1.0),
            _row("liger", 0.8),
            _row("torch_compile", 1.5),
            _row("torch", 2.0),  # eager: times no implementation
            _row("kernelwright", 0.5, shape="1024x16384"),
            _row("liger", 0.7, shape="1024x16384"),
        ],
    )


# --------------------------------------------------------------------------- capability


def test_capability_is_a_pure_check_with_reasons():
    cap = Capability(dtypes=("bfloat16",), min_rank=2, max_rank=3, max_row=16384,
                     devices=("cuda",), archs=("sm_90",))  # fmt: skip
    ok = {"dtype": "bfloat16", "shape": (4, 128), "device": "cuda", "arch": "sm_90"}
    assert unsupported(cap, **ok) is None
    cases = {
        "dtype float32 not in bfloat16": {"dtype": "float32"},
        "rank 1 < 2": {"shape": (128,)},
        "rank 4 > 3": {"shape": (1, 2, 3, 4)},
        "last dim 32768 > 16384": {"shape": (4, 32768)},
        "device cpu-interpreter not in cuda": {"device": "cpu-interpreter"},
        "GPU arch sm_80 not in sm_90": {"arch": "sm_80"},
        "the last dim is not contiguous": {"last_dim_contiguous": False},
    }
    for why, change in cases.items():
        assert unsupported(cap, **(ok | change)) == why
    assert unsupported(INDUCTOR.capability, **(ok | {"dtype": "float64", "shape": ()})) is None


def test_rejections_carry_their_reasons(db):
    c = choose("l2_norm", dtype="bf16", shape=(8, 32768), device="cuda", arch="sm_90", db=db.path)
    assert c.impl == "inductor" and not c.measured
    assert dict(c.rejected) == {"kernelwright": "last dim 32768 > 16384"}
    assert c.fn() is None  # the original graph is left alone
    c = choose("rms_norm", dtype="bf16", shape=(8, 128), device="cpu-interpreter", db=db.path)
    assert dict(c.rejected) == {"liger": "device cpu-interpreter not in cuda"}
    c = choose("rope", **(SITE | {"shape": (8192, 4096)}), db=db.path)
    assert dict(c.rejected)["kernelwright"] == "rank 2 < 4"


# --------------------------------------------------------------------------- buckets


def test_bucket_rounds_rows_and_n_to_the_nearest_power_of_two():
    assert pow2(5700) == 4096 and pow2(5900) == 8192 and pow2(1) == 1 and pow2(0) == 1
    assert bucket_of((4, 1000, 4096)) == Bucket(4096, 4096)
    assert bucket_of((7000, 2800)) == Bucket(8192, 2048)
    assert str(Bucket(8192, 4096)) == "rows~8192 n~4096"
    rope = registry.get("rope")
    row = {"dims": json.dumps({"tokens": 4096, "heads": 32, "kv_heads": 8, "head_dim": 128})}
    assert row_bucket(rope, row) == Bucket(4096 * 32, 128)
    assert row_bucket(registry.get("softmax"), {"dims": "", "shape": "100x1000"}) == Bucket(
        128, 1024
    )


# --------------------------------------------------------------------------- measured choices


def test_fastest_measured_wins_per_bucket(db):
    c = choose("rms_norm", **SITE, db=db.path)
    assert (c.impl, c.measured, c.bucket) == ("liger", True, Bucket(8192, 4096))
    assert dict(c.timings) == {"liger": 0.8, "kernelwright": 1.0, "inductor": 1.5}
    assert "fastest measured in rows~8192 n~4096" in c.reason and "full, GPU-only" in c.reason
    # a site of another shape in the same bucket reads the same rows
    assert choose("rms_norm", **(SITE | {"shape": (2, 3500, 4000)}), db=db.path).impl == "liger"
    c = choose("rms_norm", **(SITE | {"shape": (1024, 16384)}), db=db.path)
    assert (c.impl, c.measured) == ("kernelwright", True)


def test_unmeasured_bucket_gets_the_documented_default(db):
    c = choose("rms_norm", **(SITE | {"shape": (64, 128)}), db=db.path)
    assert (c.impl, c.measured) == ("kernelwright", False)
    assert c.reason == (
        "no measurement for rows~64 n~128: default; `kernelwright registry bench rms_norm "
        f"--shape 64x128 --dtype bf16 --db {db.path}` fills it"
    )
    # another arch or dtype is another key
    assert not choose("rms_norm", **(SITE | {"arch": "sm_100"}), db=db.path).measured
    assert not choose("rms_norm", **(SITE | {"dtype": "float16"}), db=db.path).measured


def test_missing_database_is_no_measurement(tmp_path):
    c = choose("rms_norm", **SITE, db=tmp_path / "none.db")
    assert c.impl == "kernelwright" and not c.measured
    assert c.reason.startswith(f"no results database at {tmp_path / 'none.db'}: default")


def test_same_database_same_choice_and_ties_go_to_the_fixed_order(tmp_path):
    rows = [_row("liger", 1.0), _row("kernelwright", 1.0), _row("torch_compile", 1.0)]
    first = _write(tmp_path / "a.db", rows)
    second = _write(tmp_path / "b.db", rows[::-1])
    picks = {choose("rms_norm", **SITE, db=d.path) for d in (first, first, second)}
    assert len({(c.impl, c.reason, c.timings) for c in picks}) == 1
    assert picks.pop().impl == "kernelwright"


def test_gpu_only_and_host_inclusive_timings_are_never_compared(tmp_path):
    # GPU-only rows exist: the faster host-inclusive Liger row is not read
    db = _write(tmp_path / "a.db", [
        _row("kernelwright", 1.0), _row("liger", 1.2), _row("liger", 0.1, timing=HOST),
    ])  # fmt: skip
    c = choose("rms_norm", **SITE, db=db.path)
    assert c.impl == "kernelwright" and dict(c.timings) == {"kernelwright": 1.0, "liger": 1.2}
    # each provider timed one way only: the GPU-only ones are compared, the others dropped
    db = _write(tmp_path / "b.db", [_row("kernelwright", 1.0), _row("liger", 0.1, timing=HOST)])
    c = choose("rms_norm", **SITE, db=db.path)
    assert c.impl == "kernelwright" and dict(c.timings) == {"kernelwright": 1.0}
    # host-inclusive alone decides when it is all there is
    db = _write(tmp_path / "c.db", [_row("kernelwright", 1.0, timing=HOST),
                                    _row("liger", 0.5, timing=HOST)])  # fmt: skip
    c = choose("rms_norm", **SITE, db=db.path)
    assert c.impl == "liger" and "host-inclusive" in c.reason


def test_training_timings_first_and_failed_or_interpreter_rows_ignored(tmp_path):
    db = _write(tmp_path / "a.db", [
        _row("kernelwright", 1.0), _row("liger", 2.0),
        _row("liger", 0.1, mode="forward"),
        _row("liger", 0.1, error="out of memory"),
        _row("liger", 0.1, timing="interpreter"),
    ])  # fmt: skip
    c = choose("rms_norm", **SITE, db=db.path)
    assert c.impl == "kernelwright" and dict(c.timings) == {"kernelwright": 1.0, "liger": 2.0}
    db = _write(tmp_path / "b.db", [_row("kernelwright", 1.0, mode="forward"),
                                    _row("liger", 0.5, mode="forward")])  # fmt: skip
    c = choose("rms_norm", **SITE, db=db.path)
    assert c.impl == "liger" and "forward, GPU-only" in c.reason


def test_interpreter_device_defaults_to_kernelwright(tmp_path):
    db = _write(tmp_path / "a.db", [
        _row("kernelwright", 50.0, timing="interpreter", arch="cpu-interpreter", shape="4x64"),
        _row("torch_compile", 1.0, timing="interpreter", arch="cpu-interpreter", shape="4x64"),
    ])  # fmt: skip
    c = choose("rms_norm", dtype="bf16", shape=(4, 64), device="cpu", db=db.path)
    assert (c.impl, c.measured) == ("kernelwright", False)
    # the advice is a GPU's: the interpreter's own rows never count
    assert "interpreter timings are not speeds; on a GPU, `kernelwright registry bench" in c.reason
    # an op no benchmark spec times gets no command that would fail
    moe = choose("moe_experts", dtype="bf16", shape=(64, 128), device="cpu", db=db.path)
    assert moe.reason.endswith("default; no benchmark spec times its implementations"), moe.reason
    from kernelwright.ops.rms_norm import rms_norm

    assert c.fn() is rms_norm


def test_the_pass_chooses_among_what_it_can_insert(db, tmp_path):
    # Liger fastest: the fastest of kernelwright / Inductor wins, and the reason says why
    c = choose("rms_norm", **SITE, db=db.path, among=INSERTABLE)
    assert (c.impl, c.measured) == ("kernelwright", True)
    assert c.reason.startswith(
        "liger measured fastest; not insertable by the pass; chose kernelwright, the fastest it"
        " can insert measured in rows~8192 n~4096 on sm_90 bfloat16 (full, GPU-only): liger"
    )
    assert dict(c.timings) == {"liger": 0.8, "kernelwright": 1.0, "inductor": 1.5}
    # Inductor faster than kernelwright, Liger fastest: Inductor
    faster = _write(tmp_path / "a.db", [_row("liger", 0.5), _row("kernelwright", 2.0),
                                        _row("torch_compile", 1.0)])  # fmt: skip
    c = choose("rms_norm", **SITE, db=faster.path, among=INSERTABLE)
    assert c.impl == "inductor" and "chose inductor" in c.reason
    # only Liger measured: the default, said so
    alone = _write(tmp_path / "b.db", [_row("liger", 0.5)])
    c = choose("rms_norm", **SITE, db=alone.path, among=INSERTABLE)
    assert (c.impl, c.measured) == ("kernelwright", False)
    assert c.reason == (
        "liger measured fastest; not insertable by the pass; chose kernelwright, the default "
        "(not measured in rows~8192 n~4096)"
    )
    # the fastest insertable wins without comment
    c = choose("rms_norm", **(SITE | {"shape": (1024, 16384)}), db=db.path, among=INSERTABLE)
    assert c.impl == "kernelwright" and c.reason.startswith("fastest measured")


def test_jagged_mean_rows_land_in_their_workloads_bucket(tmp_path):
    """A bench row of segments x max_len lands in the bucket of the values [total, D] its
    inputs hold, which is what a call site of the same workload measures."""
    from kernelwright.bench.specs import get_spec

    entry, spec = registry.get("jagged_mean"), get_spec("jagged_mean")
    shape = {"segments": 4096, "max_len": 512, "d": 1}
    values = spec.make_inputs(shape, torch.float32, "cpu")["values"]  # [total, 1]
    row = {"dims": json.dumps(shape)}
    assert row_bucket(entry, row) == bucket_of(values.shape) == Bucket(1 << 20, 1)
    assert Bucket(pow2(4096 * 512), 1) != bucket_of(values.shape)  # segments x max_len: not it
    dims = json.dumps(shape | {"d": 256})
    rows = [
        BenchRow(op="jagged_mean", mode="full", provider=p, x_name="d", x_value=256,
                 shape="4096x512x256", dtype="bfloat16", ms_p20=ms, ms_p50=ms, ms_p80=ms,
                 host_ms=0.01, timing=GPU_ONLY, gpu="H100", arch="sm_90", dims=dims)
        for p, ms in (("kernelwright", 0.3), ("torch_compile", 0.9))
    ]  # fmt: skip
    db = _write(tmp_path / "j.db", rows)
    site = {"dtype": "bf16", "device": "cuda", "arch": "sm_90", "db": db.path}
    c = choose("jagged_mean", shape=(values.shape[0], 256), **site)
    assert (c.impl, c.measured, c.bucket) == ("kernelwright", True, Bucket(1 << 20, 256))


# --------------------------------------------------------------------------- bad databases


def test_corrupt_database_is_an_error_naming_the_file(tmp_path):
    bad = tmp_path / "corrupt.db"
    bad.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(ResultsDBError, match="corrupt.db"):
        choose("rms_norm", **SITE, db=bad)


def test_foreign_sqlite_file_is_an_error_naming_the_file(tmp_path):
    foreign = tmp_path / "foreign.db"
    con = sqlite3.connect(foreign)
    con.execute("CREATE TABLE results (op TEXT, ms REAL)")
    con.execute("INSERT INTO results VALUES ('rms_norm', 0.1)")
    con.commit()
    con.close()
    with pytest.raises(ResultsDBError, match="foreign.db is not a kernelwright results database"):
        choose("rms_norm", **SITE, db=foreign)


# --------------------------------------------------------------------------- registry data


def test_every_op_lists_its_implementations_own_kernel_first_inductor_last():
    for e in registry.entries():
        names = [i.name for i in e.impls]
        assert names[0] in ("kernelwright", "created") and names[-1] == "inductor", e.name
        assert len(names) == len(set(names)), e.name
        assert e.impls[0].function.startswith(f"{e.module}:"), e.name
        assert callable(e.impls[0].load()), e.name
        for impl in e.impls:
            if impl.name == "liger":
                assert impl.function.startswith("liger_kernel.ops.") and impl.provider == "liger"
                assert impl.capability.devices == ("cuda",)
    assert registry.get("rms_norm").impl("liger").function == (
        "liger_kernel.ops.rms_norm:LigerRMSNormFunction"
    )
    assert registry.get("l2_norm").impl("kernelwright").capability.max_row == 16384


def test_a_created_op_defaults_to_its_created_kernel():
    entry = OpEntry("kwtest_op", "generated", "kernelwright.ops.generated.kwtest_op",
                    generated=True)  # fmt: skip
    assert [i.name for i in entry.impls] == ["created", "inductor"]
    own = entry.impl("created")
    assert own == Impl("created", "kernelwright", "kernelwright.ops.generated.kwtest_op:kwtest_op")
    with pytest.raises(registry.UnknownOpError, match="no implementation of kwtest_op 'liger'"):
        entry.impl("liger")


# --------------------------------------------------------------------------- CLI


def _cli(*args):
    # a wide page: rich wraps tables and messages at the terminal's width (80 in CI)
    return CliRunner().invoke(app, ["registry", *[str(a) for a in args]], env={"COLUMNS": "400"})


def test_cli_list_shows_implementations_and_capabilities():
    got = _cli("list", "l2_norm")
    assert got.exit_code == 0, got.output
    assert "kernelwright.ops.l2_norm:l2_norm" in got.output and "n <= 16384" in got.output
    assert "inductor" in got.output
    assert _cli("list", "rms_nrom").exit_code != 0


def test_cli_choose_prints_the_choice_and_why(db, tmp_path):
    args = ("choose", "rms_norm", "--shape", "8192x4096", "--dtype", "bf16", "--device", "cuda")
    got = _cli(*args, "--arch", "sm_90", "--db", db.path)
    assert got.exit_code == 0, got.output
    assert "liger" in got.output and "fastest measured in rows~8192 n~4096" in got.output
    got = _cli(*args, "--arch", "sm_90", "--db", db.path, "--pass")
    assert got.exit_code == 0, got.output
    assert "cuda: kernelwright" in got.output and "not insertable by the pass" in got.output
    got = _cli(*args[:3], "64x128", *args[4:], "--arch", "sm_90", "--db", db.path)
    assert "no measurement for rows~64 n~128" in got.output
    bad = tmp_path / "corrupt.db"
    bad.write_bytes(b"garbage" * 200)
    got = _cli(*args, "--arch", "sm_90", "--db", bad)
    assert got.exit_code == 1 and "corrupt.db" in got.output
    # a shape of no positive sizes, a device that is neither: refused, not bucketed or echoed
    for shape in ("0x4096", "-5x4096", "8192x", "abc"):
        got = _cli("choose", "rms_norm", "--shape", shape, "--db", db.path)
        assert got.exit_code == 2 and "write it as positive sizes" in got.output, shape
    got = _cli("choose", "rms_norm", "--shape", "8192x4096", "--device", "tpu", "--db", db.path)
    assert got.exit_code == 2 and "'tpu': cuda or cpu-interpreter" in got.output


def test_cli_choose_and_bench_take_every_dtype_spelling(db):
    from kernelwright.cli_registry import _bench_jobs

    where = ("--shape", "8192x4096", "--device", "cuda", "--arch", "sm_90", "--db", db.path)
    want = _cli("choose", "rms_norm", *where, "--dtype", "bf16")
    assert want.exit_code == 0 and "liger" in want.output, want.output
    got = _cli("choose", "rms_norm", *where, "--dtype", "bfloat16")
    assert got.exit_code == 0 and got.output == want.output
    assert "on cuda: kernelwright" in _cli("choose", "rms_norm", *where, "--dtype", "float").output
    bad = _cli("choose", "rms_norm", *where, "--dtype", "fp64")  # not Inductor's, silently
    assert bad.exit_code == 2 and "bf16/bfloat16" in bad.output
    # `registry bench`'s jobs keep the short name the bench CSVs use
    jobs = _bench_jobs("rms_norm", "full", "bfloat16", lambda module: True)
    assert [j.dtype for j in jobs] == ["bf16"]
    assert _bench_jobs("rms_norm", "full", "half", lambda module: True)[0].dtype == "fp16"


def test_cli_bench_appends_the_implementations_timings(tmp_path):
    from conftest import ON_GPU

    db = tmp_path / "r.db"
    got = _cli("bench", "l2_norm", "--db", db, "--out", tmp_path / "out")
    assert got.exit_code == 0, got.output
    rows = ResultsDB.existing(db).query()
    assert rows and {r["op"] for r in rows} == {"l2_norm"}
    assert {r["mode"] for r in rows} == {"full"}
    # eager `torch` times no implementation: never run
    assert "kernelwright" in {r["provider"] for r in rows} and "torch" not in {
        r["provider"] for r in rows
    }
    if not ON_GPU:
        assert {r["provider"] for r in rows} == {"kernelwright"}
        assert "not speeds" in got.output
        # interpreter rows never decide a choice
        c = choose("l2_norm", dtype="bf16", shape=(16, 4, 64), device="cpu", db=db)
        assert not c.measured
    got = _cli("bench", "moe_experts", "--db", db)
    assert got.exit_code == 1 and "no benchmark spec" in got.output
