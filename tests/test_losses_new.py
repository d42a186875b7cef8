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


@pytest.mark.parametrize("example", ["dpo_paper", "grpo_paper", "grpo_entropy_paper"])
def test_a_paper_loss_becomes_the_same_loss_on_the_primitive(tmp_path, example):
    source = str(EXAMPLES / f"{example}.py")
    profile = understand(source)
    assert profile.stop is None and len(profile.sites) == 1
    assert [i.role for i in profile.inputs][0] == "logits"
    if example == "dpo_paper":
        assert profile.sites[0].temperature == pytest.approx(0.9)
    assert len(profile.entropies) == (example == "grpo_entropy_paper")
    files = generate(profile, tmp_path)
    text = files[0].read_text()
    assert "fused_linear_logprobs" in text and "log_softmax" not in text
    # the entropy comes from the log-probs' own call (one pass over the logits)
    assert text.count("fused_linear_logprobs(") == 1
    assert ("return_entropy = True" in text) == bool(profile.entropies)
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
    "entropy_mean": "p = torch.softmax(logits, -1)\n"
    "    return (p * torch.log_softmax(logits, -1)).mean(-1).sum()",
    "entropy_from_logsumexp": "p = torch.softmax(logits, -1)\n"
    "    return (torch.logsumexp(logits, -1) - (p * logits).sum(-1)).sum()",
    "probability_of_the_token": "p = torch.softmax(logits, -1)\n"
    "    return p.gather(-1, ids.unsqueeze(-1)).sum()",
    "max": "return torch.log_softmax(logits, -1).gather(-1, ids.unsqueeze(-1)).sum() + "
    "logits.max()",
    "tensor_temperature": "return torch.log_softmax(logits / ids.float().unsqueeze(-1), -1).sum()",
    "other_dim": "return torch.log_softmax(logits, 0).gather(-1, ids.unsqueeze(-1)).sum()",
}
WHY = {
    "entropy_mean": "only their sum over the vocabulary",
    "entropy_from_logsumexp": "multiplies the logits by softmax",
    "probability_of_the_token": "softmax of the logits reaches `%gather",
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


ENTROPY_SPELLINGS = {  # (body, calls of the primitive in the generated loss)
    "softmax_times_log_softmax_over_everything": (
        "p = torch.softmax(logits, -1)\n    return -(p * torch.log_softmax(logits, -1)).sum()",
        1,
    ),
    "exp_of_log_softmax_beside_the_log_probs": (
        "lp = torch.log_softmax(logits.float() / 0.7, dim=-1)\n"
        "    tok = lp.gather(-1, ids.unsqueeze(-1)).squeeze(-1)\n"
        "    ent = -(lp.exp() * lp).sum(-1)\n    return (tok * ent).mean()",
        1,
    ),
    "entr_keeping_the_dim": (
        "p = torch.softmax(logits * 2.0, dim=-1)\n"
        "    h = torch.special.entr(p).sum(dim=-1, keepdim=True)\n"
        "    return (h.exp() * ids.unsqueeze(-1)).mean()",
        1,
    ),
    "p_log_p_of_log_softmax_at_another_temperature": (
        "tok = torch.log_softmax(logits, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)\n"
        "    p = torch.softmax(logits / 1.5, -1)\n"
        "    return (tok * torch.sum(p * p.log(), dim=-1)).sum()",
        2,
    ),
}


@pytest.mark.parametrize("case", sorted(ENTROPY_SPELLINGS))
def test_an_entropy_becomes_the_primitives_entropy(tmp_path, case):
    body, calls = ENTROPY_SPELLINGS[case]
    src = tmp_path / f"{case}.py"
    src.write_text(
        f"import torch\n\n\ndef {case}(logits, ids):\n    {body}\n\n\n"
        "def get_inputs():\n    return [torch.randn(2, 5, 9) * 2, torch.randint(0, 9, (2, 5))]\n"
    )
    profile = understand(str(src))
    assert profile.stop is None and len(profile.entropies) == 1, profile.stop
    files = generate(profile, tmp_path / "out")
    text = files[0].read_text()
    assert text.count("fused_linear_logprobs(") == calls and "softmax(" not in text
    _compare(str(src), _import(files[0], f"{case}_fused"))


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


def test_the_profile_is_the_same_bytes_each_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    source = str(EXAMPLES / "grpo_paper.py")
    profile = tmp_path / "kernelwright-runs" / "losses" / "grpo_paper" / "profile.yaml"
    assert runner.invoke(app, ["losses", "new", source]).exit_code == 0
    written = profile.read_bytes()
    assert runner.invoke(app, ["losses", "new", source]).exit_code == 0
    assert profile.read_bytes() == written
    # a function is named as a method is: its repr holds an address that differs per process
    assert b"0x" not in written and b"<" not in written
    assert LossProfile.load(profile).reductions == ["min", "sum", "sum", "mean"]


def test_an_edited_profile_is_kept_unless_forced(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    source = str(EXAMPLES / "grpo_paper.py")
    assert runner.invoke(app, ["losses", "new", source]).exit_code == 0
    profile = tmp_path / "kernelwright-runs" / "losses" / "grpo_paper" / "profile.yaml"
    written = profile.read_text()
    edited = written.replace("temperature: 1.0", "temperature: 0.7")
    assert edited != written
    profile.write_text(edited)
    res = runner.invoke(app, ["losses", "new", source, "--yes"])
    assert res.exit_code == 2 and "was edited since" in res.output, res.output
    assert profile.read_text() == edited
    assert (profile.parent / "profile.new.yaml").read_text() == written
    assert not (profile.parent / "grpo_paper_fused.py").exists()
    res = runner.invoke(app, ["losses", "new", source, "--force"])
    assert res.exit_code == 0, res.output
    assert profile.read_text() == written


def test_the_help_keeps_its_square_brackets():
    runner = CliRunner()
    for args in (["--help"], ["losses", "--help"]):
        res = runner.invoke(app, args, env={"COLUMNS": "400"})
        assert res.exit_code == 0 and "[tokens, vocab]" in res.output, res.output
