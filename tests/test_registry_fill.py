"""`registry bench OP --shape`: a call site's shape becomes a bench shape of the op's spec in
the site's bucket, the rows land there, and `registry choose` then reads a measurement; an
unmeasured site's reason names that command. The bench runs on the interpreter here; its rows
are labelled as GPU-only timings (a context made to say so) so that the selection reads them."""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import DEVICE
from typer.testing import CliRunner

from kernelwright import registry
from kernelwright.bench.db import ResultsDB
from kernelwright.cli import app
from kernelwright.compile.fill import SiteShapeError, bench_dims
from kernelwright.compile.select import bucket_of, choose, row_bucket

GPU_ONLY = "cuda_events_gpu_only_demote_flush"


def _cli(*args):
    return CliRunner().invoke(app, ["registry", *[str(a) for a in args]], env={"COLUMNS": "400"})


@pytest.mark.parametrize(
    ("op", "site", "interpreter", "want"),
    [
        ("rms_norm", (8192, 4096), False, {"tokens": 8192, "hidden": 4096}),
        ("rms_norm", (4, 1000, 4096), False, {"tokens": 4000, "hidden": 4096}),
        ("l2_norm", (16, 4, 64), True, {"tokens": 16, "heads": 4, "head_dim": 64}),
        # q [B, H, S, D]: the rows over the spec's heads, kv_heads as its sweep has them
        ("rope", (2, 32, 1024, 128), False,
         {"tokens": 2048, "heads": 32, "kv_heads": 8, "head_dim": 128}),
        ("fused_linear_cross_entropy", (8, 1024, 4096), True,
         {"tokens": 8192, "hidden": 4096, "vocab": 300}),
    ],
)  # fmt: skip
def test_a_site_shape_becomes_a_bench_shape_in_its_bucket(op, site, interpreter, want):
    dims = bench_dims(op, site, interpreter=interpreter)
    assert dims == want
    assert row_bucket(registry.get(op), {"dims": json.dumps(dims)}) == bucket_of(site)


def test_a_derived_bucket_dim_is_reached_and_an_unreachable_one_said():
    # jagged_mean's rows are the total its drawn lengths hold: segments are scaled to reach it
    dims = bench_dims("jagged_mean", (1000, 64), interpreter=True)
    entry = registry.get("jagged_mean")
    assert row_bucket(entry, {"dims": json.dumps(dims)}) == bucket_of((1000, 64))
    assert dims["d"] == 64 and dims["segments"] > 8  # more than the interpreter sweep's 8
    with pytest.raises(SiteShapeError, match="no benchmark spec"):
        bench_dims("moe_experts", (64, 128), interpreter=True)


def test_bench_at_a_site_shape_fills_its_bucket(tmp_path, monkeypatch):
    import kernelwright.bench as bench

    real = bench.make_context
    monkeypatch.setattr(bench, "make_context", lambda **kw: dataclasses.replace(
        real(copy_gbps=1.0), timing=GPU_ONLY))  # fmt: skip
    db = tmp_path / "r.db"
    # on a GPU every installed provider is timed there, at this GPU's arch
    where = "cuda" if DEVICE.type == "cuda" else "cpu-interpreter"
    site = ("--shape", "3x5x64", "--dtype", "fp32", "--device", where, "--db", db)
    before = _cli("choose", "rms_norm", *site)
    assert before.exit_code == 0, before.output
    command = f"kernelwright registry bench rms_norm --shape 3x5x64 --dtype fp32 --db {db}"
    assert f"`{command}` fills it" in before.output

    got = _cli("bench", "rms_norm", "--shape", "3x5x64", "--dtype", "fp32", "--db", db,
               "--out", tmp_path / "out")  # fmt: skip
    assert got.exit_code == 0, got.output
    rows = ResultsDB.existing(db).query()
    assert {(r["mode"], r["dims"]) for r in rows} == {
        ("full", json.dumps({"tokens": 15, "hidden": 64}))
    }
    assert "kernelwright" in {r["provider"] for r in rows}
    after = _cli("choose", "rms_norm", *site)
    assert after.exit_code == 0, after.output
    assert "fastest measured in rows~16 n~64" in after.output and "fills it" not in after.output
    c = choose("rms_norm", dtype="fp32", shape=(15, 64), device=DEVICE.type, db=db)
    assert c.measured and "kernelwright" in dict(c.timings)


def test_bench_shape_errors_say_what_to_write(tmp_path):
    got = _cli("bench", "rms_norm,swiglu", "--shape", "8x64", "--db", tmp_path / "r.db")
    assert got.exit_code != 0 and "one op" in got.output
    got = _cli("bench", "rms_norm", "--shape", "8by64", "--db", tmp_path / "r.db")
    assert got.exit_code != 0 and "8192x4096" in got.output
    assert not (tmp_path / "r.db").exists()


def test_a_malformed_shape_is_a_usage_error_naming_the_form(tmp_path):
    # choose and bench read --shape alike: positive sizes joined by x, nothing else (a size
    # of 0 or below, a sign, a digit separator, an empty size), exit 2 before any work
    db = tmp_path / "r.db"
    malformed = ("0x4096", "-1x5", "abc", "", "8192x", "8192x4096x0", "+5x3", "1_000x5")
    for text in malformed:
        for command in ("choose", "bench"):
            got = _cli(command, "rms_norm", f"--shape={text}", "--db", db)
            assert got.exit_code == 2, (command, text, got.output)
            said = f"{text!r}: write it as positive sizes joined by x, the main input's shape"
            assert said in got.output, got.output
    assert not db.exists()
    # more dims are a main input of more dims: every one before the last counts rows, said
    for text, read in (("8192x4096x2x3", "67108864 rows of 3"), ("4096", "1 row of 4096")):
        got = _cli("choose", "rms_norm", "--shape", text, "--db", db, "--device", "cpu")
        assert got.exit_code == 0 and f"({read})" in got.output, got.output
