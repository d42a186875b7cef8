"""benchmarks/debug_training.py: the clean band and the step a curve leaves it, on made-up
curves; and (GPU) a run of the whole script on the tiny Llama, three steps, every debug stage.

The script is loaded from its path (benchmarks/ is no package). The whole run, even on the
tiny Llama, takes about a minute through the interpreter: it is tested on a GPU only (and run
by hand on the CPU with `--device cpu --tiny`).
"""

import csv
import math
from pathlib import Path

import pytest
import torch
from script_module import script_module

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "debug_training.py"


@pytest.fixture(scope="module")
def bench():
    with script_module(SCRIPT, "debug_training_bench") as module:
        yield module


def test_a_curve_leaves_the_band_where_it_stays_out(bench):
    gen = torch.Generator().manual_seed(0)
    n = 60
    unpatched = (5 - torch.linspace(0, 2, n)).tolist()
    noise = (1e-3 * torch.randn(n, generator=gen)).tolist()
    clean = [u + e for u, e in zip(unpatched, noise, strict=True)]
    band = bench.clean_band(unpatched, clean, window=5, factor=2.0, floor=1e-4)
    assert all(
        b <= a for a, b in zip(band[1:], band[:-1], strict=True)
    )  # a running max: it never narrows
    assert band[0] == pytest.approx(2 * max(abs(e) for e in noise[:6]) + 1e-4)
    # a drift that grows from step 30, with one early spike that must not count
    bugged = [c + (0.002 * (t - 30) if t > 30 else 0.0) for t, c in enumerate(clean)]
    bugged[10] += 1.0
    step = bench.divergence_step(clean, bugged, band, persist=5)
    gap = [abs(b - c) > w for b, c, w in zip(bugged, clean, band, strict=True)]
    assert step is not None and step > 30 and all(gap[step:]) and not gap[step - 1]
    assert bench.divergence_step(clean, clean, band, persist=5) is None
    # a NaN is out of the band; a run that leaves it in its last steps counts
    assert bench.divergence_step(clean, clean[:-1] + [math.nan], band, persist=5) == n - 1


@pytest.mark.gpu
def test_the_tiny_run_writes_curves_plot_summary_and_repros(bench, tmp_path):
    # the whole script on the tiny Llama (on the CPU it takes about a minute: run it by hand,
    # `python benchmarks/debug_training.py --device cpu --tiny`)
    result = bench.main(["--device", "cuda", "--tiny", "--out", str(tmp_path)])
    with (tmp_path / "curves.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    bugs = result["settings"]["bugs"]
    names = ["unpatched", "clean", *bugs]
    assert list(rows[0]) == ["step", *names, "band"] and len(rows) == 3
    # a tiny model over 256 tokens starts near ln(256); the bugs leave the forward as it is
    assert all(abs(float(rows[0][k]) - math.log(256)) < 1.0 for k in names)
    assert all(rows[0][b] == rows[0]["clean"] for b in bugs)
    assert (tmp_path / "loss_curves.png").stat().st_size > 10_000
    assert all(name in (tmp_path / "summary.md").read_text() for name in bugs)
    assert set(result["debug"]) == {"clean", *bugs}
    assert all(r["verdict"] == "no divergence" for r in result["debug"]["clean"]["model"])
    for name in bugs:
        for weights in ("initial", "trained"):
            assert (tmp_path / "debug" / name / weights / "profile.yaml").is_file()
        op = result["debug"][name].get("op")
        if op is not None and "repro" in op:
            # the repro fails while the bug is planted and passes on the library as it is
            assert (op["repro_with_bug"], op["repro_without_bug"]) == ("fails", "passes"), op
