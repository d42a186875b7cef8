"""benchmarks/host_cost.py: a user's eager loop timed per provider; CPU smoke run on the
interpreter (its times are not speeds, the rows and the ranking are what is checked)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
from script_module import script_module

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "host_cost.py"


@pytest.fixture
def host_cost():
    with script_module(SCRIPT, "host_cost_bench") as module:
        yield module


def test_rows_per_provider_with_loop_and_issue_times(host_cost, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KERNELWRIGHT_RESULTS_DB", str(tmp_path / "results.db"))
    argv = ["--out", str(tmp_path), "--ops", "relu_squared", "--providers", "kernelwright,torch",
            "--rows", "2", "--rounds", "3", "--calls", "2"]  # fmt: skip
    assert host_cost.main(argv) == 0
    rows = list(csv.DictReader((tmp_path / "host_cost.csv").open()))
    assert [r["provider"] for r in rows] == ["kernelwright", "torch"]
    for r in rows:
        assert r["mode"] == "full" and r["timing"] == "wall_loop" and r["shape"] == "2x14336"
        p20, p50, p80 = (float(r[k]) for k in ("ms_p20", "ms_p50", "ms_p80"))
        assert 0 < p20 <= p50 <= p80 and math.isfinite(float(r["host_ms"]))
    assert "peer/kw" in capsys.readouterr().out
    from kernelwright.bench.db import Filters, ResultsDB

    got = ResultsDB(tmp_path / "results.db").query(Filters(op="relu_squared"))
    assert {r["provider"] for r in got} == {"kernelwright", "torch"}


def test_a_failing_provider_is_an_error_row(host_cost, tmp_path, monkeypatch):
    """A provider that cannot run (Liger off CUDA, or not installed) gives a row with its error;
    the others are still timed."""
    import torch

    monkeypatch.setenv("KERNELWRIGHT_RESULTS_DB", str(tmp_path / "results.db"))
    argv = ["--out", str(tmp_path), "--ops", "relu_squared", "--providers", "kernelwright,liger",
            "--rows", "2", "--rounds", "1", "--calls", "1"]  # fmt: skip
    assert host_cost.main(argv) == 0
    rows = {r["provider"]: r for r in csv.DictReader((tmp_path / "host_cost.csv").open())}
    assert set(rows) == {"kernelwright", "liger"}
    assert rows["kernelwright"]["error"] == "" and float(rows["kernelwright"]["ms_p50"]) > 0
    if not torch.cuda.is_available():
        assert rows["liger"]["error"] and rows["liger"]["ms_p50"] == "nan"


def test_unknown_op_names_the_ops(host_cost, tmp_path, capsys):
    with pytest.raises(SystemExit):
        host_cost.main(["--out", str(tmp_path), "--ops", "no_such_op"])
    err = capsys.readouterr().err
    assert "unknown op(s) no_such_op" in err and "rms_norm" in err
