"""benchmarks/create_corpus.py: a reference stopped past its timeout keeps the rows it timed
(phase 2 writes each row as it lands; the parent reads them back with `kept_rows`)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from script_module import script_module

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "create_corpus.py"

# a stand-in for a generated package's bench: two rows land, then the peer stalls (raises here)
FAKE_BENCH = """
from kernelwright.bench.harness import BenchRow


def run(quick=True, source="", on_row=None):
    for provider, ms in (("kernelwright", 0.5), ("torch", 1.5)):
        on_row(BenchRow(op="fake", mode="forward", provider=provider, x_name="rows",
                        x_value=8, shape="8x96", dtype="bfloat16", ms_p20=ms, ms_p50=ms,
                        ms_p80=ms, timing="cuda_events_gpu_only"))
    raise TimeoutError("torch.compile still compiling")
"""


@pytest.fixture
def corpus():
    with script_module(SCRIPT, "create_corpus_script") as module:
        yield module


def test_a_stopped_reference_keeps_the_rows_it_timed(corpus, tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "fake").mkdir(parents=True)
    (pkg / "fake" / "__init__.py").write_text("")
    (pkg / "fake" / "bench_fake.py").write_text(textwrap.dedent(FAKE_BENCH))
    partial = tmp_path / "partial" / "fake.csv"
    partial.parent.mkdir()
    partial.write_text("stale rows of an earlier run\n")  # replaced, never read back
    with pytest.raises(TimeoutError):
        corpus.phase2(("fake", str(pkg), False, "ref.py", str(partial)))
    rows, kept = corpus.kept_rows(partial)
    assert [(r.provider, r.ms_p50) for r in rows] == [("kernelwright", 0.5), ("torch", 1.5)]
    assert kept == "2 rows kept at 8x96; no torch_compile rows"


def test_a_row_cut_off_by_the_stop_is_dropped(corpus, tmp_path):
    from kernelwright.bench.harness import BenchRow
    from kernelwright.bench.report import write_csv

    partial = tmp_path / "fake.csv"
    row = BenchRow(op="fake", mode="forward", provider="kernelwright", x_name="rows", x_value=8,
                   shape="8x96", dtype="bfloat16", ms_p20=0.5, ms_p50=0.5, ms_p80=0.5)  # fmt: skip
    write_csv([row, row], partial)
    text = partial.read_text()
    partial.write_text(text[: text.rindex("\n", 0, len(text) - 1) + 20])  # the last row cut
    rows, kept = corpus.kept_rows(partial)
    assert len(rows) == 1 and kept.startswith("1 rows kept at 8x96; no torch, torch_compile")
    assert corpus.kept_rows(tmp_path / "missing.csv") == ([], "no rows")
