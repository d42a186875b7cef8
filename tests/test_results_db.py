"""The results database: rows of real harness runs land with every column; filters, the
listing's formats, CSV import/export, the README blocks, run selection, concurrent appends, and
the hooks of bench, optimize and create. Timings under the interpreter are not speeds: rows that
stand for GPU measurements are written by hand with made-up numbers."""

from __future__ import annotations

import csv
import io
import json
import math
import sqlite3
import threading
from dataclasses import fields, replace

import pytest
import torch
from conftest import DEVICE
from typer.testing import CliRunner

from kernelwright.bench import db_views as views
from kernelwright.bench.db import (
    ENV_VAR,
    SCHEMA_VERSION,
    Filters,
    ResultsDB,
    ResultsDBError,
    as_bench_row,
    columns,
    db_path,
    import_csv,
    new_run_id,
    record,
)
from kernelwright.bench.harness import COLUMNS, BenchRow, make_context, run_spec
from kernelwright.bench.report import write_csv
from kernelwright.bench.specs import RMS_NORM, Sweep
from kernelwright.cli import app

H100 = "NVIDIA H100 80GB HBM3"
H200 = "NVIDIA H200"
HOST = "cuda_events_demote_flush"
GPU_ONLY = "cuda_events_gpu_only_demote_flush"


TS = "2026-11-20T10:00:00+00:00"


def _row(provider="kernelwright", ms=1.0, *, op="rms_norm", shape="4096x4096", mode="full",
         gpu=H100, timing=HOST, nbytes=100, host_ms=0.05, dtype="bfloat16", ts=TS):  # fmt: skip
    return BenchRow(
        op=op, mode=mode, provider=provider, x_name="hidden", x_value=int(shape.split("x")[-1]),
        shape=shape, dtype=dtype, ms_p20=ms * 0.9, ms_p50=ms, ms_p80=ms * 1.1, peak_mem_mb=64.0,
        host_ms=host_ms, bytes=nbytes, gbps=nbytes / ms, pct_copy_bw=50.0, copy_gbps=3000.0,
        timing=timing, gpu=gpu, torch="2.11.0", triton="3.6.0", commit="abc1234",
        timestamp=ts, arch="sm_90",
    )  # fmt: skip


def _cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture
def db(tmp_path):
    return ResultsDB(tmp_path / "results.db")


# --------------------------------------------------------------------------- rows of a real run


def test_rows_of_a_real_run_land_with_every_column(db):
    one = (Sweep("hidden", (64,), {"tokens": 4}),)
    spec = replace(RMS_NORM, sweeps=one, quick_sweeps=one, interpreter_sweeps=one)
    ctx = make_context(DEVICE, copy_gbps=100.0)
    rows = run_spec(spec, providers=["kernelwright", "torch"], modes=["forward", "full"], ctx=ctx)
    assert len(rows) == 4 and all(r.ok for r in rows), [r.error for r in rows]
    run_id = new_run_id()
    assert db.append(rows, source="bench", run_id=run_id) == 4
    got = db.query()
    assert len(got) == 4
    for r, d in zip(rows, got, strict=True):
        for col in COLUMNS:
            a, b = getattr(r, col), d[col]
            if isinstance(a, float) and math.isnan(a):
                assert math.isnan(b), col
            elif col == "commit" and a == "unknown":
                assert b == "", col  # stored as NULL outside a git checkout
            else:
                assert a == b, col
        back = as_bench_row(d)
        for f in fields(r):  # NaN-aware: NaN != NaN
            a, b = getattr(back, f.name), getattr(r, f.name)
            if f.name == "commit" and b == "unknown":
                assert a == "", f.name  # stored as NULL outside a git checkout
                continue
            assert a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)), f.name
        assert d["run_id"] == run_id and d["source"] == "bench" and d["tag"] == ""
    first = got[0]
    assert json.loads(first["dims"]) == {"tokens": 4, "hidden": 64}
    assert first["shape"] == "4x64" and first["dtype"] == "bfloat16"
    assert first["ms_p20"] <= first["ms_p50"] <= first["ms_p80"] and first["ms_p50"] > 0
    assert first["gbps"] > 0 and first["pct_copy_bw"] > 0 and first["bytes"] > 0
    assert first["torch"] == torch.__version__ and first["triton"]
    if DEVICE.type == "cuda":
        assert first["arch"].startswith("sm_") and math.isfinite(first["host_inclusive_ms"])
    else:  # interpreter times are not speeds: no host-inclusive figure
        assert first["arch"] == "cpu-interpreter" and first["timing"] == "interpreter"
        assert math.isnan(first["host_inclusive_ms"])
    with sqlite3.connect(db.path) as con:
        meta = dict(con.execute("SELECT key, value FROM meta"))
        cols = [r[1] for r in con.execute("PRAGMA table_info(results)")]
    assert meta["schema_version"] == str(SCHEMA_VERSION)
    assert cols == ["id", *columns()]
    assert {"host_inclusive_ms", "cpu_us_per_call", "run_id", "source", *COLUMNS} <= set(cols)


def test_host_figures_follow_the_timing(db):
    rows = [
        _row("kernelwright", 0.4, timing=HOST, host_ms=0.05),
        _row("liger", 0.3, timing=GPU_ONLY, host_ms=0.02),
        _row("torch", 2.0, timing="interpreter"),
        replace(_row("torch_compile", 1.0), error="OOM: out of memory", ms_p50=math.nan),
    ]
    db.append(rows, source="bench", run_id="r1")
    got = {d["provider"]: d for d in db.query()}
    assert got["kernelwright"]["host_inclusive_ms"] == pytest.approx(0.4)
    assert got["kernelwright"]["cpu_us_per_call"] == pytest.approx(50.0)
    assert got["liger"]["cpu_us_per_call"] == pytest.approx(20.0)
    for p in ("liger", "torch", "torch_compile"):  # GPU-only, interpreter, failed: none
        assert math.isnan(got[p]["host_inclusive_ms"]), p
    assert got["torch_compile"]["error"].startswith("OOM")


def test_an_append_is_one_transaction(db):
    db.append([_row()], source="bench", run_id="good")
    bad = [_row("liger"), replace(_row("torch"), op=object())]  # the second cannot be stored
    with pytest.raises(sqlite3.Error):
        db.append(bad, source="bench", run_id="bad")
    assert [d["run_id"] for d in db.query()] == ["good"]
    assert [r["run_id"] for r in db.runs()] == ["good"]
    with pytest.raises(ValueError, match="source"):
        db.append([_row()], source="lab", run_id="x")


def test_concurrent_appends_all_land(tmp_path):
    path = tmp_path / "shared.db"  # not yet created: the writers race to create it too
    n, per = 6, 25
    start = threading.Barrier(n)
    errors = []

    def writer(i):
        try:
            start.wait()
            rows = [_row(f"p{i}", 1.0 + k) for k in range(per)]
            ResultsDB(path).append(rows, source="bench", run_id=f"run{i}")
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    db = ResultsDB.existing(path)
    rows = db.query()
    assert len(rows) == n * per and len(db.runs()) == n
    for i in range(n):  # every run's rows are contiguous: one transaction each
        ids = [d["id"] for d in rows if d["run_id"] == f"run{i}"]
        assert ids == list(range(ids[0], ids[0] + per))
    with sqlite3.connect(path) as con:
        got = con.execute("SELECT COUNT(*) FROM meta WHERE key='schema_version'").fetchone()
    assert got == (1,)


def _append_in_child(path, i, per):
    ResultsDB(path).append([_row(f"c{i}", 1.0 + k) for k in range(per)], source="bench",
                           run_id=f"child{i}")  # fmt: skip


def test_concurrent_appends_from_processes(tmp_path):
    # SQLite's file lock between processes (threads above share one process's locks)
    import multiprocessing

    path, n, per = tmp_path / "procs.db", 4, 20
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_in_child, args=(path, i, per)) for i in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * n
    db = ResultsDB.existing(path)
    assert len(db.query()) == n * per and sorted(r["run_id"] for r in db.runs()) == [
        f"child{i}" for i in range(n)
    ]


# --------------------------------------------------------------------------- queries


@pytest.fixture
def filled(db):
    db.append(
        [_row("kernelwright", 0.4), _row("liger", 0.5), _row("kernelwright", 0.2, mode="forward")],
        source="bench",
        run_id="20261120T100000Z-aaaaaa",
    )
    db.append(
        [_row("kernelwright", 0.3, gpu=H200, op="softmax", ts="2026-11-25T10:00:00+00:00"),
         _row("kernelwright", 0.35, gpu="NVIDIA GH200 480GB", ts="2026-11-25T10:00:00+00:00")],
        source="optimize", run_id="20261125T100000Z-bbbbbb", tag="v1",
    )  # fmt: skip
    return db


def test_filters(filled):
    def providers(**kw):
        return [(d["op"], d["provider"], d["mode"]) for d in filled.query(Filters(**kw))]

    assert len(filled.query()) == 5
    assert providers(provider="liger") == [("rms_norm", "liger", "full")]
    assert providers(mode="forward") == [("rms_norm", "kernelwright", "forward")]
    assert providers(op="softmax") == [("softmax", "kernelwright", "full")]
    assert len(filled.query(Filters(source="optimize"))) == 2
    assert len(filled.query(Filters(gpu="h100"))) == 3  # part of the name, any case
    assert len(filled.query(Filters(gpu="H200"))) == 2  # H200 and GH200: a name part
    assert len(filled.query(Filters(gpu="sm_90"))) == 5  # the arch
    assert len(filled.query(Filters(dtype="bfloat16", since="2026-11-24"))) == 2
    assert len(filled.query(Filters(since="2026-11-20T10:00"))) == 5
    assert filled.query(Filters(source="optimize"))[0]["tag"] == "v1"


def test_unknown_filter_values_list_the_known_ones(filled):
    with pytest.raises(ResultsDBError, match="known: rms_norm, softmax"):
        filled.query(Filters(op="rmsnorm"))
    with pytest.raises(ResultsDBError, match="known: kernelwright, liger"):
        filled.query(Filters(provider="triton"))
    with pytest.raises(ResultsDBError, match="known: .*H100"):
        filled.query(Filters(gpu="a100"))
    with pytest.raises(ResultsDBError, match="known: bench, optimize"):
        filled.query(Filters(source="create"))
    with pytest.raises(ResultsDBError, match="latest runs: 20261125T100000Z-bbbbbb"):
        filled.query(Filters(run="nope"))
    with pytest.raises(ResultsDBError, match="age"):
        filled.query(Filters(since="last tuesday"))
    res = _cli("results", "--db", filled.path, "--mode", "fwd")
    assert res.exit_code == 1 and "known: forward, full" in res.output
    res = _cli("results", "--db", filled.path, "--op", "softmax", "--mode", "forward")
    assert res.exit_code == 0 and "No rows" in res.output  # known values, no such combination


def test_cli_dtype_filter_takes_every_spelling(filled):
    # rows hold torch's name ("bfloat16"); the short one, as bench takes it, finds them too
    want = _cli("results", "--db", filled.path, "--dtype", "bfloat16", "--csv")
    assert want.exit_code == 0 and len(list(csv.DictReader(io.StringIO(want.output)))) == 5
    got = _cli("results", "--db", filled.path, "--dtype", "bf16", "--csv")
    assert got.exit_code == 0 and got.output == want.output, got.output
    res = _cli("results", "--db", filled.path, "--dtype", "fp32")
    assert res.exit_code == 1 and "'float32'" in res.output and "known: bfloat16" in res.output
    res = _cli("results", "--db", filled.path, "--dtype", "int8")  # the database's own message
    assert res.exit_code == 1 and "'int8'" in res.output and "known: bfloat16" in res.output


def test_cli_limit_is_not_negative(filled):
    res = _cli("results", "--db", filled.path, "--limit", "-1")
    assert res.exit_code == 2 and "--limit" in res.output
    assert _cli("results", "--db", filled.path, "--limit", "0").exit_code == 0
    res = _cli("results", "--db", filled.path, "--csv", "--markdown")
    assert res.exit_code == 2 and "one of --csv and --markdown" in res.output
    readme = filled.path.parent / "README.md"  # never written: the mode is refused first
    res = _cli("results", "readme", readme, "--db", filled.path, "--mode", "sideways")
    assert res.exit_code == 2 and "'sideways': forward, backward or full" in res.output


def test_the_table_fits_a_terminal_and_keeps_its_numbers(db):
    # on 100 columns the run, source, ... columns are left out (named in the title), never the
    # times; an error is a numbered note under the table, not an ellipsis or a tall row
    from rich.console import Console

    err = "RuntimeError: " + "a long message " * 12
    db.append([_row("kernelwright", 0.123456), replace(_row("liger", math.nan), error=err)],
              source="bench", run_id="20261120T100000Z-aaaaaa")  # fmt: skip
    heads, body = views.listing(db.query())
    console = Console(record=True, width=100)
    console.print(views.rich_table("rows", heads, body, width=100))
    text = console.export_text()
    assert all(len(line) <= 100 for line in text.splitlines())
    assert "0.1235" in text and "…" not in text
    assert "source, run" in text and "left out" in text
    assert "[1] RuntimeError: a long message" in text


def test_run_latest_picks_the_second_run(db):
    first, second = new_run_id(), new_run_id()
    assert first != second
    db.append([_row(ms=1.0)], source="bench", run_id=first)
    db.append([_row(ms=2.0), _row("liger", ms=3.0)], source="bench", run_id=second)
    latest = db.query(Filters(run="latest"))
    assert [d["ms_p50"] for d in latest] == [2.0, 3.0] and {d["run_id"] for d in latest} == {second}
    # "latest" among the runs with rows matching the other filters; a unique prefix works too
    assert db.query(Filters(run="latest", provider="kernelwright"))[0]["run_id"] == second
    assert [d["ms_p50"] for d in db.query(Filters(run=first))] == [1.0]
    res = _cli("results", "--db", db.path, "--run", "latest", "--csv")
    assert res.exit_code == 0, res.output
    got = list(csv.DictReader(io.StringIO(res.output)))
    assert [r["run_id"] for r in got] == [second, second]


def test_a_missing_database_says_how_to_make_one(tmp_path, monkeypatch):
    missing = tmp_path / "none.db"
    with pytest.raises(ResultsDBError, match="kernelwright bench"):
        ResultsDB.existing(missing)
    res = _cli("results", "--db", missing)
    assert res.exit_code == 1
    assert "no results database" in res.output and "kernelwright bench" in res.output
    assert not missing.exists()  # a query does not create one
    (tmp_path / "junk.db").write_text("not sqlite")
    with pytest.raises(ResultsDBError, match="not a results database"):
        ResultsDB.existing(tmp_path / "junk.db")
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "env.db"))
    assert db_path() == tmp_path / "env.db" and db_path(missing) == missing
    monkeypatch.delenv(ENV_VAR)
    assert str(db_path()) == "kernelwright-runs/results.db"


# --------------------------------------------------------------------------- output formats


def test_markdown_csv_table_and_best(filled):
    res = _cli("results", "--db", filled.path, "--markdown", "--gpu", "h100")
    assert res.exit_code == 0, res.output
    lines = res.output.strip().splitlines()
    assert lines[0].startswith("| run | source | gpu | op | shape | mode |")
    assert lines[1].startswith("|---|") and len(lines) == 2 + 3
    liger = "| H100 80GB HBM3 | rms_norm | 4096x4096 | full | bfloat16 | liger | 0.5000 |"
    assert liger in res.output
    res = _cli("results", "--db", filled.path, "--csv")
    got = list(csv.DictReader(io.StringIO(res.output)))
    assert len(got) == 5 and list(got[0]) == list(columns())
    assert float(got[0]["ms_p50"]) == 0.4 and got[3]["tag"] == "v1"
    res = _cli("results", "--db", filled.path, "--csv", "--limit", "2")  # given: honoured
    newest = list(csv.DictReader(io.StringIO(res.stdout)))
    assert [r["ms_p50"] for r in newest] == [r["ms_p50"] for r in got[-2:]]
    res = _cli("results", "--db", filled.path)  # the rich table
    assert res.exit_code == 0 and "5 result rows" in res.output and "liger" in res.output
    res = _cli("results", "--db", filled.path, "--best", "--markdown", "--op", "rms_norm")
    assert res.exit_code == 0, res.output
    head, _, *body = res.output.strip().splitlines()
    assert "best" in head and "liger/kernelwright" in head
    full = next(line for line in body if "| full |" in line and "H100" in line)
    # kernelwright 0.4 ms beats liger's 0.5: ratio 1.25
    assert "| kernelwright | 0.4000 | 0.4000 | 1.25 |" in full


def test_best_compares_only_like_timings():
    rows = [_row("kernelwright", 0.4, timing=HOST), _row("liger", 0.3, timing=GPU_ONLY)]
    dicts = [_as_dict(r) for r in rows]
    pts = views.points(dicts)
    assert len(pts) == 2 and {p.timing for p in pts} == {"host-incl.", "gpu-only"}
    # the newest row of a provider wins
    newer = _as_dict(_row("kernelwright", 0.2))
    (pt,) = views.points([dicts[0], newer])
    assert pt.ms("kernelwright") == 0.2


def _as_dict(r: BenchRow, **extra) -> dict:
    d = {c: getattr(r, c) for c in COLUMNS}
    d |= {"run_id": "r", "source": "bench", "tag": "", "cpu_us_per_call": r.host_ms * 1e3}
    d["host_inclusive_ms"] = r.ms_p50 if r.host_inclusive else math.nan
    return d | extra


# --------------------------------------------------------------------------- import, export


def test_import_of_bench_csvs(tmp_path, db):
    rows = [_row("kernelwright", 0.4, shape="64x256"), _row("torch", 0.9, shape="64x256")]
    rows += [replace(_row("kernelwright", 0.5), timestamp="2026-11-21T09:00:00+00:00")]
    path = write_csv(rows, tmp_path / "bench" / "rms_norm.csv")
    # a CSV of the schema before dims and arch: both are filled in on import
    old = tmp_path / "old.csv"
    keep = [c for c in COLUMNS if c not in ("dims", "arch")]
    with path.open() as src, old.open("w", newline="") as dst:
        w = csv.DictWriter(dst, fieldnames=keep, extrasaction="ignore")
        w.writeheader()
        w.writerows(csv.DictReader(src))
    (tmp_path / "probe.csv").write_text("shape,variant,ms\n64x256,a,1.0\n")

    got = import_csv(db, old)
    assert (got.rows, got.runs) == (3, 2)  # two bench invocations (timestamps) in one file
    again = import_csv(db, old)
    assert again.rows == 0 and "already imported" in again.skipped
    assert "not a bench CSV" in import_csv(db, tmp_path / "probe.csv").skipped
    back = db.query()
    assert len(back) == 3 and all(d["source"] == "bench" for d in back)
    assert back[0]["arch"] == "sm_90" and back[0]["tag"] == "imported from old.csv"
    assert json.loads(back[0]["dims"]) == {"tokens": 64, "hidden": 256}
    assert [d["ms_p50"] for d in back] == [0.4, 0.9, 0.5]

    # through the command line: folders are searched; an export reads back into a fresh DB
    other = tmp_path / "other.db"
    res = _cli("results", "import", tmp_path / "bench", "--db", other)
    assert res.exit_code == 0 and "3 rows added" in res.output, res.output
    out = tmp_path / "export.csv"
    res = _cli("results", "export", "--csv", out, "--db", other)
    assert res.exit_code == 0, res.output
    fresh = ResultsDB(tmp_path / "fresh.db")
    assert import_csv(fresh, out).rows == 3
    a, b = ResultsDB(other).query(), fresh.query()
    for x, y in zip(a, b, strict=True):
        for col in columns():
            if isinstance(x[col], float) and math.isnan(x[col]):
                assert math.isnan(y[col]), col
            else:
                assert x[col] == y[col], col
    assert _cli("results", "import", tmp_path / "nope.csv", "--db", other).exit_code == 1
    # create's bench CSVs have the same columns: the command line says whose they are
    res = _cli("results", "import", path, "--source", "create", "--db", tmp_path / "c.db")
    assert res.exit_code == 0, res.output
    assert {d["source"] for d in ResultsDB(tmp_path / "c.db").query()} == {"create"}


# --------------------------------------------------------------------------- README blocks

README = """# kernelwright

Intro text stays.

<!-- results:h100 -->
old H100 table
<!-- /results:h100 -->

Between the blocks.

<!-- results:h200 -->
old H200 table
<!-- /results:h200 -->
The end.
"""


def test_readme_blocks_are_regenerated_from_bench_rows(tmp_path, db):
    rows = []
    for shape, nbytes, kw, tc, lg in (
        ("4096x4096", 1, 0.40, 0.30, 0.50),
        ("8192x4096", 2, 0.50, 0.60, 0.55),
        ("16384x4096", 3, 0.80, 1.00, 0.88),
    ):
        for prov, ms in (("kernelwright", kw), ("torch_compile", tc), ("liger", lg)):
            rows.append(_row(prov, ms, shape=shape, nbytes=nbytes, timing=GPU_ONLY))
            rows.append(_row(prov, ms + 0.1, shape=shape, nbytes=nbytes, timing=HOST))
    rows.append(_row("kernelwright", 9.0, mode="forward"))  # not in the default mode
    db.append(rows, source="bench", run_id="bench1")
    # rows that must not reach the tables: optimize's, the interpreter's, a GH200's
    db.append([_row("kernelwright", 7.0)], source="optimize", run_id="opt1", tag="v2")
    db.append([_row("kernelwright", 7.0, timing="interpreter")], source="bench", run_id="cpu")
    db.append([_row("kernelwright", 7.0, gpu="NVIDIA GH200 480GB")], source="bench", run_id="gh")
    readme = tmp_path / "README.md"
    readme.write_text(README)
    res = _cli("results", "readme", readme, "--db", db.path)
    assert res.exit_code == 0, res.output
    assert "h100: regenerated" in res.output and "h200: no bench rows" in res.output
    text = readme.read_text()
    assert text.startswith("# kernelwright\n\nIntro text stays.\n\n<!-- results:h100 -->\n")
    assert "old H100 table" not in text
    assert "<!-- results:h200 -->\nold H200 table\n<!-- /results:h200 -->\nThe end.\n" in text
    block = text.split("<!-- results:h100 -->")[1].split("<!-- /results:h100 -->")[0]
    assert "H100 80GB HBM3 (sm_90)" in block and "commit abc1234" in block
    # one row per op and mode: its smallest and largest shape; the middle one only with
    # --all-shapes (a row per shape)
    row = (
        "| rms_norm · fwd+bwd | 4096x4096 … 16384x4096 | 0.400 … 0.800 | 0.300 … 1.000 "
        "| 0.500 … 0.880 | 0.75× … 1.10× | 0.80× … 1.09× |"
    )
    assert row in block
    assert "8192x4096" not in block and "fwd ·" not in block and "7.000" not in block
    assert _cli("results", "readme", readme, "--db", db.path).exit_code == 0
    assert readme.read_text() == text  # regenerating again changes nothing
    _cli("results", "readme", readme, "--db", db.path, "--all-shapes", "--mode", "full,forward")
    block = readme.read_text().split("<!-- /results:h100 -->")[0]
    assert "| rms_norm · 8192x4096 · fwd+bwd | 0.500 | 0.600 | 0.550 | 1.10× | 1.08× |" in block
    assert "rms_norm · 4096x4096 · fwd | 9.000" in block
    (tmp_path / "plain.md").write_text("no markers\n")
    res = _cli("results", "readme", tmp_path / "plain.md", "--db", db.path)
    assert res.exit_code == 1 and "no results blocks" in res.output


def test_gpu_keys_match_whole_names():
    assert views.gpu_matches_key(H100, "h100") and views.gpu_matches_key("NVIDIA H100 PCIe", "H100")
    assert not views.gpu_matches_key("NVIDIA GH200 480GB", "h200")
    assert views.gpu_matches_key(H200, "h200") and not views.gpu_matches_key(H200, "h20")


# --------------------------------------------------------------------------- the hooks


def test_cli_bench_appends_to_the_database(tmp_path):
    path = tmp_path / "bench.db"
    args = ["bench", "rms_norm", "--quick", "--providers", "kernelwright,torch", "--mode", "full"]
    args += ["--no-plots", "--out", tmp_path / "out", "--db", path]
    for _ in range(2):
        res = _cli(*args)
        assert res.exit_code == 0, res.output
    db = ResultsDB.existing(path)
    runs = db.runs()
    assert len(runs) == 2 and all(r["source"] == "bench" and r["n_rows"] > 0 for r in runs)
    latest = db.query(Filters(run="latest"))
    assert {d["run_id"] for d in latest} == {runs[1]["run_id"]}
    assert {d["provider"] for d in latest} == {"kernelwright", "torch"}
    assert {d["mode"] for d in latest} == {"full"} and all(d["dims"] for d in latest)


def test_optimize_records_measured_variants_and_skips_placeholders(tmp_path, monkeypatch):
    from kernelwright.workflows.optimize import OptimizeOptions
    from kernelwright.workflows.optimize import loop as loop_mod
    from kernelwright.workflows.optimize.measure import Bench
    from kernelwright.workflows.optimize.setup import preflight
    from kernelwright.workflows.optimize.tables import arch_rows

    path = tmp_path / "opt.db"
    monkeypatch.setenv(ENV_VAR, str(path))
    shapes = [{"tokens": 64, "hidden": 256}]
    setup = preflight(OptimizeOptions("rms_norm", workspace=tmp_path / "ws", dry_run=True,
                                      gpu="hopper", shapes=shapes, ncu=False))  # fmt: skip
    setup.workspace.mkdir(parents=True, exist_ok=True)
    table = arch_rows(setup.table, setup.kernels, setup.arch)
    loop_mod.measure_rows(setup, table, lambda _: None, "v0")  # the dry run's placeholders
    assert not path.exists()

    def timer(fn, setup_fn):  # measured, not modelled; nothing runs (execute=False)
        return 0.1, 0.2, 0.3

    setup.bench = Bench(setup.spec, ctx=setup.ctx, timer=timer, dtype=setup.dtype, execute=False)
    loop_mod.measure_rows(setup, table, lambda _: None, "v1")
    got = ResultsDB.existing(path).query()
    assert got and {(d["source"], d["tag"], d["run_id"]) for d in got} == {
        ("optimize", "v1", setup.bench.run_id)
    }
    assert all(d["ms_p50"] == 0.2 and json.loads(d["dims"])["hidden"] == 256 for d in got)
    assert record([replace(_row(), timing="placeholder")], source="optimize", run_id="x") == 0


def test_create_records_its_benchmark(tmp_path, monkeypatch):
    from kernelwright.workflows.create import bench as B

    path = tmp_path / "create.db"
    monkeypatch.setenv(ENV_VAR, str(path))
    inputs = [B.BenchInput("x", "full", (4, 96), True)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # run() insists on a GPU
    monkeypatch.setattr(B, "load_user_reference", lambda source: (lambda x: x * 2, ""))
    ctx = make_context(DEVICE, copy_gbps=100.0)
    monkeypatch.setattr(B, "make_context", lambda **kw: ctx)
    points = [{"rows": 4, "cols": 96}]
    rows = B.run("double", lambda x: x * 2, inputs, 1, points, "ref.py", quick=False)
    got = ResultsDB.existing(path).query()
    assert len(got) == len(rows) > 0 and {d["source"] for d in got} == {"create"}
    assert {d["op"] for d in got} == {"double"} and {d["provider"] for d in got} >= {"kernelwright"}


def test_the_readme_tables_are_the_bench_of_record(tmp_path):
    # The README's performance blocks are generated from benchmarks/results/ (never edited by
    # hand): importing the committed CSVs and regenerating must change nothing.
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    db = tmp_path / "bor.db"
    folders = [root / "benchmarks" / "results" / gpu for gpu in ("h100", "h200")]
    assert _cli("results", "import", *folders, "--db", db).exit_code == 0
    readme = tmp_path / "README.md"
    readme.write_text((root / "README.md").read_text())
    res = _cli("results", "readme", readme, "--db", db)
    assert res.exit_code == 0, res.output
    assert readme.read_text() == (root / "README.md").read_text(), (
        "README.md's results blocks differ from benchmarks/results/: run "
        "`kernelwright results readme` (docs/benchmarks.md)"
    )
