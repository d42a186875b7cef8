"""`kernelwright losses new`: a loss on full logits → its profile → the same loss on the fused
log-prob primitive, with tests that compare the two."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from conftest import DEVICE
from typer.testing import CliRunner

from kernelwright.cli import app
from kernelwright.profiles.loss import LossProfile
from kernelwright.workflows.create.load import load_reference
from kernelwright.workflows.losses import LossGenError, generate, understand
from kernelwright.workflows.losses.lossgen import verify

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "losses"


def _import(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(f"_gen_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return getattr(module, name)


def _compare(source: str, fused, seed: int = 0) -> None:
    torch.manual_seed(seed)
    ref = load_reference(source)
    args = [a.to(DEVICE) for a in ref.example_inputs]
    i = ref.input_names.index("logits")
    hidden = torch.randn(*args[i].shape[:-1], 8, device=DEVICE, requires_grad=True)
    weight = torch.randn(args[i].shape[-1], 8, device=DEVICE, requires_grad=True)
    want = ref.call(*(args[:i] + [hidden @ weight.T] + args[i + 1 :]))
    got = fused(hidden, weight, *(args[:i] + args[i + 1 :]))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    for a, b in zip(torch.autograd.grad(got, [hidden, weight]),
                    torch.autograd.grad(want, [hidden, weight]), strict=True):  # fmt: skip
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("example", ["dpo_paper", "grpo_paper"])
def test_a_paper_loss_becomes_the_same_loss_on_the_primitive(tmp_path, example):
    source = str(EXAMPLES / f"{example}.py")
    profile = understand(source)
    assert profile.stop is None and len(profile.sites) == 1
    assert [i.role for i in profile.inputs][0] == "logits"
    if example == "dpo_paper":
        assert profile.sites[0].temperature == pytest.approx(0.9)
    files = generate(profile, tmp_path)
    text = files[0].read_text()
    assert "fused_linear_logprobs" in text and "log_softmax" not in text
    fused = _import(files[0], f"{example}_fused")
    for seed in (0, 1):
        _compare(source, fused, seed)
    # deterministic: the same profile gives the same bytes
    again = generate(LossProfile.from_yaml(profile.to_yaml()), tmp_path / "again")
    assert [f.read_bytes() for f in files] == [f.read_bytes() for f in again]


def test_the_generated_tests_pass_and_catch_a_wrong_review(tmp_path):
    profile = understand(str(EXAMPLES / "dpo_paper.py"))
    generate(profile, tmp_path / "ok")
    result = verify(tmp_path / "ok", profile.name)
    assert result.returncode == 0, result.stdout[-2000:]
    # a reviewer's wrong temperature: the generated loss is no longer the paper's
    profile.sites[0].temperature = 1.0
    generate(profile, tmp_path / "bad")
    result = verify(tmp_path / "bad", profile.name)
    assert result.returncode != 0 and "test_matches_the_loss_on_full_logits" in result.stdout


BODIES = {
    "entropy": "p = torch.softmax(logits, -1)\n"
    "    return -(p * torch.log_softmax(logits, -1)).sum()",
    "max": "return torch.log_softmax(logits, -1).gather(-1, ids.unsqueeze(-1)).sum() + "
    "logits.max()",
    "tensor_temperature": "return torch.log_softmax(logits / ids.float().unsqueeze(-1), -1).sum()",
    "other_dim": "return torch.log_softmax(logits, 0).gather(-1, ids.unsqueeze(-1)).sum()",
}
WHY = {
    "entropy": "the logits reach",
    "max": "the logits reach",
    "tensor_temperature": "scaled by a tensor",
    "other_dim": "another dim",
}


@pytest.mark.parametrize("case", sorted(BODIES))
def test_what_cannot_be_expressed_stops_with_the_reason(tmp_path, case):
    src = tmp_path / f"{case}.py"
    src.write_text(
        "import torch\n\n\ndef loss(logits, ids):\n    " + BODIES[case] + "\n\n\n"
        "def get_inputs():\n    return [torch.randn(3, 5, 7), torch.randint(0, 7, (3, 5))]\n"
    )
    profile = understand(str(src))
    assert profile.stop and WHY[case] in profile.stop, profile.stop
    with pytest.raises(LossGenError):
        generate(profile, tmp_path / "out")


def test_a_gather_that_keeps_its_dim_and_a_fp32_cast(tmp_path):
    src = tmp_path / "keep.py"
    src.write_text(
        "import torch\n\n\ndef keep(logits, ids, w):\n"
        "    lp = torch.log_softmax(logits.float() * 2.0, dim=-1).gather(-1, ids.unsqueeze(-1))\n"
        "    return (lp * w).sum()\n\n\n"
        "def get_inputs():\n"
        "    return [torch.randn(2, 6, 11), torch.randint(0, 11, (2, 6)), torch.randn(2, 6, 1)]\n"
    )
    profile = understand(str(src))
    assert profile.sites[0].keepdim and profile.sites[0].temperature == pytest.approx(0.5)
    files = generate(profile, tmp_path / "out")
    _compare(str(src), _import(files[0], "keep_fused"))


def test_the_command_stops_for_review_then_generates_from_the_profile(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    res = runner.invoke(app, ["losses", "new", str(EXAMPLES / "grpo_paper.py")])
    assert res.exit_code == 0, res.output
    profile = tmp_path / "kernelwright-runs" / "losses" / "grpo_paper" / "profile.yaml"
    assert profile.exists() and "--from-profile" in res.output
    assert not (profile.parent / "grpo_paper_fused.py").exists()
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\n\n\ndef bad(logits):\n    return logits.max()\n\n\n"
                   "def get_inputs():\n    return [torch.randn(2, 5)]\n")  # fmt: skip
    res = runner.invoke(app, ["losses", "new", str(bad)])
    assert res.exit_code == 2 and "stopped" in res.output
    res = runner.invoke(app, ["losses", "new"])
    assert res.exit_code == 2
