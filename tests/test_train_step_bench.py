"""CPU smoke test of benchmarks/train_step.py: tiny models, one warm-up and one timed step.

The benchmark is a script, not a package module, so it is loaded from its path. Besides the
CSV's schema and values, this checks the loss guard (a patch that changes the numbers is
flagged) and that a provider's module-level monkey patch does not leak into the next provider.
"""

import csv
import math
from pathlib import Path

import pytest
from conftest import ON_GPU
from script_module import script_module

import kernelwright

# On a GPU machine kernelwright's kernels run only on CUDA tensors, so this --device cpu smoke
# test cannot patch there; the GPU run is the benchmark itself (benchmarks/results/h200-issue5).
pytestmark = pytest.mark.skipif(ON_GPU, reason="CPU smoke test (--device cpu) of train_step.py")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "train_step.py"
ARGS = ["--seq", "16", "--warmup", "1", "--steps", "1", "--batch", "2", "--device", "cpu"]


@pytest.fixture(scope="module")
def bench():
    with script_module(SCRIPT, "train_step_bench") as module:
        yield module


def _read(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _check_row(bench, r: dict) -> None:
    assert r["error"] == "", r["error"]
    assert (r["model"], r["batch"], r["seq"]) == ("tiny-llama", "2", "16")
    assert r["tokens_per_step"] == "32" and r["steps"] == "1"
    assert float(r["ms_per_step"]) > 0
    assert float(r["tokens_per_s"]) == pytest.approx(32e3 / float(r["ms_per_step"]), rel=1e-4)
    assert math.isnan(float(r["peak_mem_mib"]))  # no memory stats on CPU
    # a tiny random-init model over 256 tokens: the loss is near ln(256) ~ 5.5
    assert 4.5 < float(r["loss_first"]) < 7.0
    assert math.isfinite(float(r["loss_last"]))
    assert len(r["losses"].split()) == 2  # warm-up + timed
    assert r["loss_ok"] == "True"
    assert r["device"] == "cpu" and r["gpu"] == "cpu" and r["torch"] and r["transformers"]


def test_csv_schema_and_values(bench, tmp_path):
    argv = ["--model", "tiny-llama", "--providers", "hf", "--out", str(tmp_path), *ARGS]
    bench.main(argv)
    rows = _read(tmp_path / "train_step.csv")
    assert tuple(rows[0].keys()) == bench.COLUMNS
    assert (tmp_path / "train_step.png").stat().st_size > 0
    assert len(rows) == 1 and rows[0]["provider"] == "hf"
    _check_row(bench, rows[0])
    assert float(rows[0]["speedup_vs_hf"]) == 1.0


def test_kernelwright_row(bench, tmp_path):
    try:
        from kernelwright import patch  # noqa: F401
    except ImportError as e:
        pytest.skip(f"kernelwright.patch is not importable: {e}")
    argv = ["--model", "tiny-llama", "--providers", "hf,kernelwright", "--out", str(tmp_path)]
    bench.main([*argv, *ARGS, "--no-plot"])
    hf, kw = _read(tmp_path / "train_step.csv")
    if kw["error"].startswith("ImportError"):  # the patcher is there, a part it needs is not
        pytest.skip(kw["error"])
    _check_row(bench, hf)
    _check_row(bench, kw)  # includes the first-step loss agreeing with hf's
    assert float(kw["speedup_vs_hf"]) > 0
    assert (tmp_path / "profile_tiny-llama.yaml").exists()


def test_missing_provider_gets_an_error_row(bench, tmp_path):
    argv = ["--model", "tiny-llama", "--providers", "hf,liger", "--out", str(tmp_path), *ARGS]
    rows = bench.main([*argv, "--no-plot"])
    assert rows[0].get("error") is None
    assert "CUDA" in rows[1]["error"]  # liger is skipped on CPU, with the reason in its row


def test_wrong_patch_is_flagged_and_does_not_leak(bench, tmp_path, monkeypatch):
    # A "patch" that monkey-patches the modeling module globally (as Liger does) with a wrong
    # norm: its row must be flagged, and the hf run after it must see the original module.
    from transformers.models.llama import modeling_llama

    original = modeling_llama.LlamaRMSNorm.forward

    def wrong_patch(model):
        modeling_llama.LlamaRMSNorm.forward = lambda self, x: 2.0 * original(self, x)

    monkeypatch.setattr(kernelwright, "patch", wrong_patch, raising=False)
    argv = ["--model", "tiny-llama", "--providers", "hf,kernelwright,hf", "--out", str(tmp_path)]
    rows = bench.main([*argv, *ARGS, "--no-plot"])
    assert modeling_llama.LlamaRMSNorm.forward is original
    hf, kw, hf_again = rows
    assert kw["loss_ok"] is False and kw["loss_diff_vs_ref"] > 0.05
    assert hf_again["loss_first"] == hf["loss_first"]


def test_vlm_rows_with_images(bench, tmp_path, monkeypatch):
    # tiny Qwen2.5-VL: the vision tower and the text decoder trained on a batch with one image a
    # sample; hf and kernelwright must agree on the first loss, and the M-RoPE positions must
    # come from the model's get_rope_index (transformers 5 falls back to 1-D positions silently
    # when the batch lacks what it needs).
    try:
        from kernelwright import patch
        from kernelwright.integrations.transformers.analysis import analyze
    except ImportError as e:
        pytest.skip(f"kernelwright.patch is not importable: {e}")
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel

    # the analyser's numerical model check (test_autopatch_vlm's subject) would dominate here
    monkeypatch.setattr(kernelwright, "patch", lambda m: patch(m, analyze(m, check=False)))
    positions = []
    rope_index = Qwen2_5_VLModel.get_rope_index

    def spy(self, *a, **kw):
        out = rope_index(self, *a, **kw)
        positions.append(out[0])
        return out

    monkeypatch.setattr(Qwen2_5_VLModel, "get_rope_index", spy)
    argv = ["--model", "tiny-qwen2.5-vl", "--providers", "hf,kernelwright", "--out", str(tmp_path)]
    argv += ["--seq", "12", "--warmup", "0", "--steps", "1", "--batch", "1", "--device", "cpu"]
    hf, kw = bench.main([*argv, "--no-plot"])
    for r in (hf, kw):
        assert r.get("error") is None, r["error"]
        assert r["inputs"] == "1 image 8x8 (16 patches -> 4 of the 12 tokens)"
        assert r["tokens_per_step"] == 12
        assert all(math.isfinite(x) for x in (r["loss_first"], r["loss_last"]))
        assert 4.5 < r["loss_first"] < 7.0  # near ln(256): a random tiny model
    assert kw["loss_ok"] is True and kw["loss_diff_vs_ref"] < 0.02
    # the text decoder's MLP and attention (rope) classes, and the vision tower's MLP
    assert all(c in kw["notes"] for c in ("Qwen2MLP", "Qwen2_5_VLAttention", "Qwen2_5_VLMLP"))
    # one step per provider; the image's 2x2 merged tokens (positions 5..8): one temporal
    # position, heights 0 0 1 1 and widths 0 1 0 1 from its start
    assert len(positions) == 2
    t, h, w = positions[0][:, 0, 5:9]
    assert t.unique().numel() == 1 and (h - h[0]).tolist() == [0, 0, 1, 1]
    assert (w - w[0]).tolist() == [0, 1, 0, 1]
