"""Autopatch's Verify stage: every supported architecture, analysed and patched, trains like the
unpatched model (kernelwright.testing.convergence), a wrong patch does not, a partial patch
still does, and the emitted per-model test runs.

CPU: tiny configs through Triton's interpreter, fp32 for every architecture and bf16 for two.
GPU (`-m gpu`): the "gpu" size configs, RUNS["gpu"] steps, fp32 and bf16.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from conftest import DEVICE, ON_GPU  # noqa: E402

from kernelwright.integrations.transformers import patch, patch_record  # noqa: E402
from kernelwright.integrations.transformers.analysis import analyze  # noqa: E402
from kernelwright.testing.convergence import (  # noqa: E402
    ARCHITECTURES,
    RUNS,
    TOLERANCES,
    run_convergence,
    tiny_config,
)
from kernelwright.workflows.autopatch.emit import (  # noqa: E402
    emit_convergence_test,
    render_convergence_test,
)

# What the patcher is expected to leave alone in each architecture's tiny model (kind -> why).
# Everything else the profile marks "patch" must be patched: an empty patch converges trivially.
# architectures where a part the profile marks "patch" is known to be left alone (none now)
KNOWN_SKIPS: dict[str, set[str]] = {}


def _patch_and_keep(store: dict):
    """A patch_fn for run_convergence that also keeps the patched model for inspection."""

    def patch_fn(model, *, profile=None, **kwargs):
        store["model"] = model
        return patch(model, profile, **kwargs)

    return patch_fn


def _expected_kinds(profile) -> set[str]:
    kinds = {"norm"} if any(n.patched for n in profile.norms) else set()
    if any(m.patched for m in profile.mlps):
        kinds.add("mlp")
    if profile.rope.patched:
        kinds.add("rope")
    if profile.output.patched:
        kinds.add("causal_lm")
    if profile.moe.patched and profile.moe.expert_layout == "stacked":
        kinds.add("moe_experts")  # silu experts (qwen3_moe, mixtral): kernelwright.moe_experts
    return kinds


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_tiny_config_keeps_the_math_knobs(model_type):
    c = tiny_config(model_type)
    assert (c.hidden_size, c.num_hidden_layers, c.vocab_size) == (64, 2, 256)
    assert c._attn_implementation == "eager"
    assert all(v == 0.0 for k, v in c.to_dict().items() if "dropout" in k and isinstance(v, float))
    knobs = {
        "gemma2": lambda: c.final_logit_softcapping == 30.0 and c.attn_logit_softcapping == 50.0,
        "granite": lambda: c.logits_scaling != 1.0 and c.embedding_multiplier != 1.0,
        "nemotron": lambda: c.rope_parameters["partial_rotary_factor"] == 0.5,
        "phi3": lambda: c.rope_parameters["partial_rotary_factor"] == 0.75,
        "qwen3_moe": lambda: (c.num_experts, c.num_experts_per_tok) == (4, 2),
        "mixtral": lambda: (c.num_local_experts, c.num_experts_per_tok) == (4, 2),
        "smollm3": lambda: c.no_rope_layers == [1, 0],
        "gemma3_text": lambda: c.layer_types == ["sliding_attention", "full_attention"],
    }
    assert knobs.get(model_type, lambda: True)()
    g = tiny_config(model_type, size="gpu")
    assert (g.hidden_size, g.vocab_size, g.head_dim) == (1024, 32000, 128)


# --------------------------------------------------------------------------- CPU suite

# One architecture per kind of patch decision runs in `make test`: plain (llama), offset norms,
# soft-capping and GeGLU (gemma2), MoE experts and q/k norms (qwen3_moe), a fused gate_up and
# partial rotary (phi3), logit and residual scalings (granite). The others are marked slow;
# `make test-all` and the GPU suite (every architecture, fp32 and bf16) run them.
REPRESENTATIVE = ("llama", "gemma2", "qwen3_moe", "phi3", "granite")
TINY_FP32 = [a if a in REPRESENTATIVE else pytest.param(a, marks=pytest.mark.slow)
             for a in ARCHITECTURES]  # fmt: skip


@pytest.mark.parametrize("model_type", TINY_FP32)
def test_converges_tiny_fp32(model_type):
    kept = {}
    result = run_convergence(
        model_type, dtype=torch.float32, device=DEVICE, patch_fn=_patch_and_keep(kept)
    )
    result.assert_close()
    # the analyser ran (no profile was given) and the patch really replaced modules
    record = patch_record(kept["model"])
    patched = {m.kind for m in record.modules}
    skipped = KNOWN_SKIPS.get(model_type, set())
    assert patched == _expected_kinds(result.profile) - skipped, record.skipped


@pytest.mark.parametrize("model_type", ["llama", pytest.param("gemma2", marks=pytest.mark.slow)])
def test_converges_tiny_bf16(model_type):
    result = run_convergence(model_type, dtype=torch.bfloat16, device=DEVICE)
    result.assert_close()


def _offset_one(profile):
    profile.norms[0].offset = 1.0  # scale (1 + w) where the model uses w


def _interleaved_rope(profile):
    profile.rope.variant = "interleaved"  # pairs (0,1),(2,3).. where the model rotates halves


@pytest.mark.parametrize("tamper", [_offset_one, _interleaved_rope], ids=["offset", "rope"])
def test_wrong_patch_fails(tamper):
    """The check can fail: a profile with one wrong decision does not converge."""
    profile = analyze(tiny_config("llama"))
    tamper(profile)
    result = run_convergence("llama", dtype=torch.float32, device=DEVICE, profile=profile)
    problems = result.check()
    # both errors start at the first step, before any training chaos
    assert any("loss differs at step 0" in p for p in problems), problems
    assert any("step-0 gradients differ" in p for p in problems), problems
    with pytest.raises(AssertionError, match="does not train like the unpatched one"):
        result.assert_close()


def test_partial_patch_converges():
    """An MLP the analyser cannot prove (gelu_new has no kernel) stays as it is; the rest is
    patched and the model still trains like the unpatched one."""
    config = tiny_config("llama", hidden_act="gelu_new")
    kept = {}
    result = run_convergence(config, device=DEVICE, patch_fn=_patch_and_keep(kept))
    result.assert_close()
    assert [what for what, _ in result.profile.unsupported()] == ["mlp LlamaMLP"]
    model = kept["model"]
    kinds = {m.kind for m in patch_record(model).modules}
    assert kinds == {"norm", "rope", "causal_lm"}
    mlps = [m for m in model.modules() if type(m).__name__ == "LlamaMLP"]
    assert mlps and all("forward" not in vars(m) for m in mlps)  # the class's own forward


# --------------------------------------------------------------------------- emit


def test_emitted_test_runs(tmp_path):
    profile = analyze("llama")
    path = emit_convergence_test(profile, tmp_path)
    assert path == tmp_path / "test_convergence_llama.py"
    source = path.read_text()
    assert source == render_convergence_test(profile)  # one profile, one file, byte for byte
    assert "model_type: llama" in source and "test_llama_tiny_fp32_converges" in source
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    # the subprocess runs in tmp_path: relative PYTHONPATH entries (`src` on the GPU machine)
    # must name the same directories from there
    paths = env.get("PYTHONPATH", "").split(os.pathsep)
    env["PYTHONPATH"] = os.pathsep.join(str(Path(p).resolve()) for p in paths if p)
    if not ON_GPU:
        env["TRITON_INTERPRET"] = "1"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    expected = "3 passed" if ON_GPU else "1 passed, 2 skipped"
    assert expected in run.stdout, run.stdout[-2000:]


# --------------------------------------------------------------------------- GPU suite


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", sorted(TOLERANCES, key=str), ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_converges_gpu(model_type, dtype):
    config = tiny_config(model_type, size="gpu")
    profile = analyze(tiny_config(model_type))  # the analyser's checks run on a tiny instance
    result = run_convergence(config, dtype=dtype, device="cuda", profile=profile, **RUNS["gpu"])
    result.assert_close()
