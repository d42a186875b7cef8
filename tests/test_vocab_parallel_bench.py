"""CPU smoke run of benchmarks/vocab_parallel.py: 2 gloo processes, one tiny shape per op with
an uneven split (V = 51 over 2 ranks). Every provider that runs on CPU must match the unsplit
op (loss and gradients), and Liger's rows must say why they did not run."""

import csv
import sys
from pathlib import Path

import pytest
from conftest import ON_GPU

# On a GPU machine kernelwright's kernels take only CUDA tensors, so the unsplit op of this
# --device cpu run cannot run there; the GPU run is the benchmark itself.
pytestmark = pytest.mark.skipif(ON_GPU, reason="CPU smoke test (--device cpu) of vocab_parallel.py")

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def test_smoke_run_matches_the_unsplit_op(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # the spawned ranks import the script by name
    import vocab_parallel as bench

    argv = "--device cpu --world 2 --tokens 16 --vocabs 51 --hidden 16 --warmup 0 --reps 1"
    try:
        assert bench.main([*argv.split(), "--out", str(tmp_path)]) == 0
    finally:
        sys.modules.pop("vocab_parallel", None)
    with open(tmp_path / "vocab_parallel.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["op"], r["provider"]) for r in rows] == [
        (op, p) for op in bench.OPS for p in bench.PROVIDERS
    ]
    for r in rows:
        assert (r["tokens"], r["vocab"], r["world"], r["device"]) == ("16", "51", "2", "cpu")
        if r["provider"] == "liger":  # never faked: no time, a reason
            assert r["available"] == "False" and r["ms"] == "" and "CUDA" in r["note"], r
            continue
        assert r["available"] == "True" and r["error"] == "", r
        assert float(r["ms"]) > 0 and r["reps"] == "1"
        scale = float(r["grad_ref_max"])
        assert scale > 1e-3
        assert float(r["loss_diff"]) < 1e-3, r
        assert float(r["grad_diff"]) < 0.02 * scale, r  # bf16 gradients: a few ulps
        if r["op"] == "flce":
            assert 0 <= float(r["wgrad_diff"]) < 0.05, r
    text = (tmp_path / "vocab_parallel.md").read_text()
    assert "| 16 | 51 | torch_loss_parallel |" in text and "- liger, flce (16x51): " in text
