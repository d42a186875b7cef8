"""The results database's file guards and messages: a file that is not a results database (another
SQLite database, or not SQLite at all) is refused by every command that would write into it,
before any work and without touching it; a new or empty file becomes one; the `results`
messages for empty databases, unclosed README markers and CSVs of another schema."""

from __future__ import annotations

import io
import math
import os
import sqlite3
import types

import pytest
from typer.testing import CliRunner

import kernelwright.bench
from kernelwright.bench import db_views as views
from kernelwright.bench.db import ENV_VAR, ResultsDB, ResultsDBError, record
from kernelwright.bench.harness import BenchRow
from kernelwright.bench.report import write_csv
from kernelwright.cli import app

TS = "2026-11-20T10:00:00+00:00"


def _row(ms=1.0, error=""):
    return BenchRow(
        op="rms_norm", mode="full", provider="kernelwright", x_name="hidden", x_value=64,
        shape="4x64", dtype="bfloat16", ms_p20=ms * 0.9, ms_p50=ms, ms_p80=ms * 1.1,
        bytes=100, timing="cuda_events_demote_flush", gpu="NVIDIA H100 80GB HBM3",
        commit="abc1234", timestamp=TS, arch="sm_90", error=error,
    )  # fmt: skip


def _cli(*args):
    """The result, its output with the console's line wrapping undone (a long path wraps)."""
    res = CliRunner().invoke(app, [str(a) for a in args])
    res.text = " ".join(res.output.split())
    return res


class Measured(Exception):
    """Raised where a benchmark would start measuring: the check came too late."""


def _stop_measuring(monkeypatch):
    def stop(*args, **kwargs):
        raise Measured

    monkeypatch.setattr(kernelwright.bench, "make_context", stop)
    monkeypatch.setattr("kernelwright.runtime.fanout.run_tasks", stop)


@pytest.fixture
def foreign(tmp_path):
    """Another program's SQLite database: one table `x`."""
    path = tmp_path / "o.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE x (a TEXT)")
    con.execute("INSERT INTO x VALUES ('keep me')")
    con.commit()
    con.close()
    return path


@pytest.fixture
def bench_csv(tmp_path):
    return write_csv([_row()], tmp_path / "bench" / "rms_norm.csv")


def test_another_sqlite_database_is_refused_by_every_write_path(
    tmp_path, foreign, bench_csv, monkeypatch
):
    _stop_measuring(monkeypatch)
    before = foreign.read_bytes()
    for args in (
        ("results", "import", bench_csv),
        ("bench", "rms_norm", "--quick", "--out", tmp_path / "out"),
        ("registry", "bench", "rms_norm", "--shape", "4x64", "--out", tmp_path / "out"),
    ):
        res = _cli(*args, "--db", foreign)
        assert res.exit_code == 2, (args, res.output)
        assert "o.db is not a kernelwright results database" in res.text, res.output
        assert "tables x" in res.text and "remove this one" in res.text
        assert "rows added" not in res.text and not isinstance(res.exception, Measured)
    with pytest.raises(ResultsDBError, match="not a kernelwright results database"):
        record([_row()], source="bench", run_id="r1", path=foreign)
    with pytest.raises(ResultsDBError, match="not a kernelwright results database"):
        ResultsDB(foreign).append([_row()], source="bench", run_id="r1")
    assert foreign.read_bytes() == before
    con = sqlite3.connect(foreign)
    tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    con.close()
    assert tables == ["x"]


def test_a_new_or_empty_file_becomes_a_results_database(tmp_path, bench_csv):
    for path in (tmp_path / "new.db", tmp_path / "empty.db"):
        if path.name == "empty.db":
            path.touch()  # 0 bytes
        res = _cli("results", "import", bench_csv, "--db", path)
        assert res.exit_code == 0 and "1 rows added" in res.text, res.output
        assert len(ResultsDB.existing(path).query()) == 1


def test_a_file_that_is_not_sqlite_is_refused_before_any_work(tmp_path, bench_csv, monkeypatch):
    _stop_measuring(monkeypatch)
    text = tmp_path / "t.db"
    text.write_text("hello")
    for args in (
        ("results", "import", bench_csv, "--db", text),
        ("bench", "rms_norm", "--quick", "--db", text, "--out", tmp_path / "out"),
        ("registry", "bench", "rms_norm", "--shape", "4x64", "--db", text),
    ):
        res = _cli(*args)
        assert res.exit_code == 2 and not isinstance(res.exception, Measured), (args, res.output)
        assert "t.db is not a results database (not an SQLite file" in res.text, res.output
    # $KERNELWRIGHT_RESULTS_DB: bench, optimize and (on a GPU) create check it up front too
    monkeypatch.setenv(ENV_VAR, str(text))
    res = _cli("bench", "rms_norm", "--quick", "--out", tmp_path / "out")
    assert res.exit_code == 2 and "t.db is not a results database" in res.text, res.output
    res = _cli("optimize", "rms_norm", "--out", tmp_path / "ws")
    assert res.exit_code == 2 and "t.db is not a results database" in res.text, res.output
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    res = _cli("create", tmp_path / "ref.py", "--yes")
    assert res.exit_code == 2 and "t.db is not a results database" in res.text, res.output
    assert text.read_text() == "hello"


# --------------------------------------------------------------------------- results messages


def test_results_messages_say_what_is_wrong(tmp_path):
    empty = tmp_path / "z.db"
    empty.touch()
    res = _cli("results", "--db", empty)
    assert res.exit_code == 1 and "z.db is empty: no rows yet" in res.text, res.output
    assert "not a kernelwright" not in res.text

    readme = tmp_path / "R.md"
    readme.write_text("# perf\n\n<!-- results:h100 -->\nold table\n")
    other = ResultsDB(tmp_path / "o.db")  # rows, but none of bench
    other.append([_row()], source="optimize", run_id="opt1", tag="v1", command="test")
    res = _cli("results", "readme", readme, "--db", other.path)
    assert res.exit_code == 1 and "has no bench rows yet" in res.text, res.output
    assert "kernelwright bench OP" in res.text and "source 'bench'" not in res.text
    other.append([_row()], source="bench", run_id="b1", command="test")
    res = _cli("results", "readme", readme, "--db", other.path)
    assert res.exit_code == 1 and "R.md:3: `<!-- results:h100 -->` is not closed" in res.text
    assert "no results blocks" not in res.text

    junk = tmp_path / "junk.csv"
    junk.write_text("a,b\n1,2\n")
    res = _cli("results", "import", junk, "--db", tmp_path / "i.db")
    assert res.exit_code == 2 and "junk.csv is not a bench CSV" in res.text, res.output
    assert "no column op, mode, provider" in res.text and "rows added" not in res.text
    assert not (tmp_path / "i.db").exists()


def test_a_db_that_is_a_folder_is_named_as_one_by_every_reader(tmp_path, monkeypatch):
    # a folder read as "no results database here: run bench", whose own check then refused it
    folder = tmp_path / "runs"
    folder.mkdir()
    for args in (
        ("results",),
        ("results", "export", "--csv", "-"),
        ("results", "readme", tmp_path / "R.md"),
        ("registry", "choose", "rms_norm", "--shape", "8x64", "--device", "cuda"),
    ):
        res = _cli(*args, "--db", folder)
        assert res.exit_code == 1, (args, res.output)
        assert "runs is a folder: --db takes a file" in res.text, (args, res.output)
        assert "no results database" not in res.text
    monkeypatch.setenv(ENV_VAR, str(folder))
    res = _cli("results")
    assert res.exit_code == 1 and "runs is a folder" in res.text, res.output


def test_a_db_path_that_cannot_be_written_is_refused_before_any_work(
    tmp_path, bench_csv, monkeypatch
):
    # before: accepted up front, then a FileExistsError traceback at the first append (after
    # a bench had measured everything)
    _stop_measuring(monkeypatch)
    a_file = tmp_path / "f.db"
    a_file.write_text("x")
    for db in (a_file / "x.db", a_file / "a" / "x.db"):
        for args in (
            ("results", "import", bench_csv),
            ("bench", "rms_norm", "--quick", "--out", tmp_path / "out"),
        ):
            res = _cli(*args, "--db", db)
            assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.output
            assert "f.db is a file, not a folder" in res.text, res.output
    access = os.access  # refuse writing alone (the command line checks the CSV is readable)
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: not mode & os.W_OK and access(p, mode))
    res = _cli("results", "import", bench_csv, "--db", tmp_path / "n" / "x.db")
    assert res.exit_code == 2 and "no write permission on" in res.text, res.output
    assert not (tmp_path / "n").exists()


def test_a_malformed_or_binary_csv_is_an_error_not_a_traceback(tmp_path, bench_csv):
    db = tmp_path / "r.db"
    lines = bench_csv.read_text().splitlines()
    head, good = lines[0].split(","), lines[1]
    bad = good.split(",")
    bad[head.index("ms_p50")] = "abc"
    bad[head.index("commit")] = "other"  # a second run: neither is added
    malformed = tmp_path / "m" / "bad.csv"
    malformed.parent.mkdir()
    malformed.write_text("\n".join([lines[0], good, ",".join(bad)]) + "\n")
    for where in (malformed, malformed.parent):
        res = _cli("results", "import", where, "--db", db)
        assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.output
        assert "bad.csv:3: ms_p50 is 'abc', not a number" in res.text, res.output
        assert not db.exists()  # the file's good run was not added either
    binary = tmp_path / "bin.csv"
    binary.write_bytes(bytes(range(128, 256)))
    res = _cli("results", "import", binary, "--db", db)
    assert res.exit_code == 2 and "bin.csv is not a bench CSV" in res.text, res.output


def test_export_and_readme_to_a_folder_are_errors_not_tracebacks(tmp_path):
    db = ResultsDB(tmp_path / "r.db")
    db.append([_row()], source="bench", run_id="b1", command="test")
    folder = tmp_path / "out"
    folder.mkdir()
    res = _cli("results", "export", "--csv", folder, "--db", db.path)
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    assert "cannot write" in res.text and "Is a directory" in res.text, res.output
    res = _cli("results", "readme", folder, "--db", db.path)
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    assert "Is a directory" in res.text, res.output


def test_query_errors_go_to_stderr_so_a_csv_on_stdout_stays_clean(tmp_path):
    db = ResultsDB(tmp_path / "r.db")
    db.append([_row()], source="bench", run_id="b1", command="test")
    for args in (("results", "--csv", "--op", "nope"), ("results", "export", "--csv", "-",
                                                        "--run", "nope")):  # fmt: skip
        res = CliRunner().invoke(app, [*args, "--db", str(db.path)])
        assert res.exit_code == 1 and res.stdout == "", (args, res.stdout)
        assert "error: no " in res.stderr and "'nope'" in res.stderr, res.stderr


def test_error_rows_show_one_dash_for_their_spread(tmp_path):
    db = ResultsDB(tmp_path / "r.db")
    bad = _row(ms=math.nan, error="OutOfMemoryError")
    db.append([_row(), bad], source="bench", run_id="r1", command="test")
    heads, body = views.listing(db.query())
    spread = [row[heads.index("p20–p80")] for row in body]
    assert spread == ["0.900–1.100", "—"]


def test_since_help_says_utc():
    res = _cli("results", "--help")
    assert res.exit_code == 0 and "UTC" in res.text


def test_bench_progress_off_a_terminal_counts_shapes(monkeypatch):
    from rich.console import Console

    from kernelwright import cli_bench
    from kernelwright.bench import harness

    def run_plan(p, *, on_row, **kwargs):
        for shape in ("64x256", "64x512"):
            for _ in range(len(p.providers) * len(p.modes)):
                on_row(types.SimpleNamespace(op="rms_norm", x_name="hidden", x_value=1,
                                             shape=shape, error=""))  # fmt: skip
        return []

    monkeypatch.setattr(harness, "run_plan", run_plan)
    out = io.StringIO()
    name = types.SimpleNamespace
    plan = name(spec=name(op="rms_norm"), providers=[name(name="a"), name(name="b")],
                modes=["forward"], points=[1, 2], size=4)  # fmt: skip
    measured = []
    cli_bench._run_with_progress(Console(file=out, width=200), plan, measured)
    assert len(measured) == 4  # every row kept as it arrives (what Ctrl-C writes out)
    lines = [ln.strip() for ln in out.getvalue().splitlines() if ln.strip()]
    assert lines == [
        "rms_norm hidden=1 (64x256): shape 1/2 done",
        "rms_norm hidden=1 (64x512): shape 2/2 done",
    ]
