"""kernelwright.losses and `kernelwright losses new` on bad arguments: each is an error naming
the argument (or the profile field), never a silent broadcast or a raw PyTorch error; and the
unfused reference agrees with the fused primitive when called with the same arguments."""

from __future__ import annotations

import inspect
import re
import shutil
from pathlib import Path

import pytest
import torch
from conftest import DEVICE
from typer.testing import CliRunner

from kernelwright import skills
from kernelwright.cli import app
from kernelwright.losses import (
    cpo_loss,
    dpo_loss,
    fused_linear_distill,
    fused_linear_logprob_stats,
    fused_linear_logprobs,
    fused_linear_logprobs_ref,
    grpo_loss,
    kto_loss,
    sequence_logprobs,
)

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "losses"
B, T, H, V = 2, 3, 8, 11


def _head(seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=g).to(DEVICE)
    weight = (torch.randn(V, H, generator=g) * 0.3).to(DEVICE)
    target = torch.randint(0, V, (B, T), generator=g).to(DEVICE)
    return hidden, weight, target


def _grpo_inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(B, T, generator=g), torch.randn(B, generator=g), torch.ones(B, T)


@pytest.mark.parametrize(
    "name, value, extra",
    [
        ("old_logps", torch.randn(T), {}),
        ("ref_logps", torch.randn(1, T), {"beta": 0.1}),
        ("importance_sampling_ratio", torch.rand(T), {}),
        ("entropies", torch.rand(5), {"top_entropy_quantile": 0.5}),
        ("sampling_logps", torch.randn(B, 1), {"off_policy_mask_threshold": 0.5}),
    ],
)
def test_grpo_rejects_a_per_token_input_of_another_shape(name, value, extra):
    logps, adv, mask = _grpo_inputs()
    shape = re.escape(str(tuple(value.shape)))
    with pytest.raises(ValueError, match=rf"grpo_loss: {name} must be \[B, T\].*\(2, 3\).*{shape}"):
        grpo_loss(logps, adv, mask, **{name: value}, **extra)


@pytest.mark.parametrize(
    "option, value",
    [
        ("top_entropy_quantile", 1.5),
        ("top_entropy_quantile", -0.1),
        ("gradient_accumulation_steps", 0),
        ("max_completion_length", 0),
    ],
)
def test_grpo_rejects_an_option_out_of_its_range(option, value):
    # before: inf (a division by 0), a quantile above 1 silently kept every token, one below 0
    # was torch.quantile's error
    logps, adv, mask = _grpo_inputs()
    extra = {"entropies": torch.rand(B, T)} if option == "top_entropy_quantile" else {}
    loss_type = "dr_grpo" if option == "max_completion_length" else "grpo"
    with pytest.raises(ValueError, match=rf"^grpo_loss: {option} must be .*got {value}"):
        grpo_loss(logps, adv, mask, loss_type=loss_type, **{option: value}, **extra)


@pytest.mark.parametrize("mask_shape", [(T,), (B, T + 1), (1, T)])
def test_sequence_logprobs_rejects_a_mask_of_another_shape(mask_shape):
    # a [T] mask broadcast over the batch silently; an unshifted [B, T + 1] one was a raw
    # PyTorch size error
    with pytest.raises(ValueError, match=r"^sequence_logprobs: mask shape"):
        sequence_logprobs(torch.randn(B, T), torch.ones(mask_shape, dtype=torch.bool))


def test_grpo_takes_a_sequence_level_importance_ratio():
    logps, adv, mask = _grpo_inputs()
    ratio = torch.rand(B, 1) + 0.5
    got, _ = grpo_loss(logps, adv, mask, importance_sampling_ratio=ratio)
    want, _ = grpo_loss(logps, adv, mask, importance_sampling_ratio=ratio.expand(B, T))
    torch.testing.assert_close(got, want)


def test_kto_rejects_a_kl_that_is_not_a_scalar():
    c, r = torch.randn(3), torch.randn(2)
    with pytest.raises(ValueError, match=r"kto_loss: kl must be a scalar.*\(3,\)"):
        kto_loss(c, r, c.clone(), r.clone(), kl=torch.rand(3))


@pytest.mark.parametrize(
    "fn, loss_type", [(dpo_loss, "ipo"), (cpo_loss, "ipo"), (cpo_loss, "simpo")]
)
def test_a_beta_that_divides_must_be_positive(fn, loss_type):
    c, r = torch.randn(3), torch.randn(3)
    with pytest.raises(ValueError, match=rf"{fn.__name__}: beta must be > 0 .*{loss_type}"):
        fn(c, r, beta=0.0, loss_type=loss_type)


def test_the_reference_agrees_with_the_primitive_called_with_the_same_arguments():
    hidden, weight, target = _head()
    target[0, 1] = -100
    kw = dict(return_entropy=True, chunk_size=2, backward="stored", entropy_grad=False)
    logps, ent = fused_linear_logprobs(hidden, weight, target, **kw)
    ref_logps, ref_ent = fused_linear_logprobs_ref(hidden, weight, target, **kw)
    assert ent[0, 1] == 0 and ref_ent[0, 1] == 0
    torch.testing.assert_close(logps, ref_logps, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=1e-5)


def _chunk_calls():
    hidden, weight, target = _head()
    return {
        "plain": lambda c: fused_linear_logprobs(hidden, weight, target, chunk_size=c),
        "entropy": lambda c: fused_linear_logprobs(
            hidden, weight, target, chunk_size=c, return_entropy=True
        ),
        "stored": lambda c: fused_linear_logprobs(
            hidden, weight, target, chunk_size=c, backward="stored"
        ),
        "stats": lambda c: fused_linear_logprob_stats(hidden, weight, target, chunk_size=c),
        "distill": lambda c: fused_linear_distill(
            hidden, weight, hidden, weight, target, chunk_size=c
        ),  # fmt: skip
    }


@pytest.mark.parametrize("path", ["plain", "entropy", "stored", "stats", "distill"])
@pytest.mark.parametrize("chunk_size", [0, -1, 2.5])
def test_one_chunk_size_rule_everywhere(path, chunk_size):
    call = _chunk_calls()[path]
    with pytest.raises(ValueError, match=r"chunk_size must be None \(chosen from the sizes\) or an "
                       r"int >= 1, got " + re.escape(repr(chunk_size))):  # fmt: skip
        call(chunk_size)
    call(None), call(1)


def test_hidden_states_must_be_floating_point():
    hidden, weight, target = _head()
    for kw in ({}, {"return_entropy": True}):
        with pytest.raises(TypeError, match="fused_linear_logprobs: argument 'hidden' must have"):
            fused_linear_logprobs(hidden.long(), weight, target, **kw)


@pytest.mark.parametrize(
    "arg, bad, match",
    [
        ("teacher_weight", torch.randn(V, H + 1), r"teacher_weight must be \[V, 8\].*\(11, 9\)"),
        ("student_weight", torch.randn(V, H + 1), r"student_weight must be \[V, 8\].*\(11, 9\)"),
        ("student_bias", torch.randn(V + 1), r"student_bias must have shape \(11,\).*\(12,\)"),
        ("teacher_bias", torch.randn(V - 1), r"teacher_bias must have shape \(11,\).*\(10,\)"),
    ],
)
def test_distill_checks_each_head(arg, bad, match):
    hidden, weight, target = _head()
    kw = dict(student_hidden=hidden, student_weight=weight, teacher_hidden=hidden,
              teacher_weight=weight, labels=target)  # fmt: skip
    kw[arg] = bad.to(DEVICE)
    with pytest.raises(ValueError, match="fused_linear_distill: " + match):
        fused_linear_distill(**kw)


@pytest.mark.parametrize("ignore_index", [-(2**62), 2**32])
def test_int32_targets_with_an_ignore_index_beyond_int32_score_every_token(ignore_index):
    # TRL's adapter passes ignore_index -(2**62); PyTorch wraps it to 0 against an int32
    # tensor, which ignored every target 0
    hidden, weight, target = _head()
    target[:, 0] = 0
    t32 = target.int()
    want = fused_linear_logprobs_ref(hidden, weight, target)
    for return_entropy in (False, True):
        got = fused_linear_logprobs(hidden, weight, t32, ignore_index=ignore_index,
                                    return_entropy=return_entropy)  # fmt: skip
        got = got[0] if return_entropy else got
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    ref = fused_linear_logprobs_ref(hidden, weight, t32, ignore_index=ignore_index)
    torch.testing.assert_close(ref, want)
    kd = dict(student_hidden=hidden, student_weight=weight, teacher_hidden=hidden * 0.5,
              teacher_weight=weight, ignore_index=ignore_index)  # fmt: skip
    torch.testing.assert_close(fused_linear_distill(labels=t32, **kd),
                               fused_linear_distill(labels=target, **kd))  # fmt: skip


@pytest.mark.parametrize("return_entropy", [False, True])
def test_a_bad_target_is_named_by_its_place_in_the_callers_tensor(return_entropy):
    hidden, weight, target = _head()
    target[0, 1] = -100
    target[1, 2] = 50
    kw = dict(return_entropy=return_entropy)
    with pytest.raises(ValueError, match=r"^fused_linear_logprobs: target\[1, 2\] = 50 is "
                       r"outside \[0, 11\)"):  # fmt: skip
        fused_linear_logprobs(hidden, weight, target, **kw)
    for t in (torch.zeros(2, 2, dtype=torch.long), target.reshape(-1).clamp(0, V - 1)):
        shape = re.escape(str(tuple(t.shape)))
        with pytest.raises(ValueError, match=rf"^fused_linear_logprobs: target shape {shape} "
                           r"must equal hidden's leading shape \(2, 3\)"):  # fmt: skip
            fused_linear_logprobs(hidden, weight, t.to(DEVICE), **kw)


def test_a_missing_profile_is_a_clean_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["losses", "new", "--from-profile", "nothere.yaml"])
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.output
    assert "nothere.yaml does not exist" in res.output


def _profile(tmp_path, monkeypatch) -> tuple[Path, Path]:
    monkeypatch.chdir(tmp_path)
    source = tmp_path / "grpo_paper.py"
    shutil.copy(EXAMPLES / "grpo_paper.py", source)
    assert CliRunner().invoke(app, ["losses", "new", str(source)]).exit_code == 0
    return source, tmp_path / "kernelwright-runs" / "losses" / "grpo_paper" / "profile.yaml"


def test_an_invalid_profile_field_is_named(tmp_path, monkeypatch):
    _, profile = _profile(tmp_path, monkeypatch)
    text = profile.read_text()
    assert "target: completion_ids" in text
    profile.write_text(text.replace("target: completion_ids", "target: nonexist"))
    res = CliRunner().invoke(app, ["losses", "new", "--from-profile", str(profile)])
    assert res.exit_code == 2, res.output
    out = " ".join(res.output.split())
    assert "sites[0].target = 'nonexist'" in out and "changed since" not in out, out
    assert "sites[0].target = 'completion_ids'" in out  # what the source gives there


def test_a_changed_source_is_told_apart_from_an_edited_profile(tmp_path, monkeypatch):
    source, profile = _profile(tmp_path, monkeypatch)
    source.write_text(source.read_text().replace("completion_ids", "ids"))
    res = CliRunner().invoke(app, ["losses", "new", "--from-profile", str(profile)])
    assert res.exit_code == 2, res.output
    assert "changed since its profile was written" in " ".join(res.output.split())


def test_the_skill_names_every_option_of_the_primitive():
    text = " ".join(skills.load("losses").text.split())
    sig = re.search(r"`fused_linear_logprobs\(hidden, weight, target, \*, ([^)]*)\)`", text)
    assert sig, "the skill states fused_linear_logprobs' signature"
    params = inspect.signature(fused_linear_logprobs).parameters
    keywords = [n for n, p in params.items() if p.kind is p.KEYWORD_ONLY]
    assert sig.group(1).split(", ") == keywords
