"""Numerical checks: the ORIGINAL module/function against what the patcher will run.

Each "patch" decision for a norm, an MLP or the RoPE function is run on the tiny instance with
random, non-default weights and random inputs, through the same builders the patcher uses
(`kernelwright.integrations.transformers.replacements`). fp32 confirms the math (offset, weight,
layout, gate half, rotation); for RMSNorm an fp16 run also confirms the casting mode, which fp32
cannot see: the decided mode must reproduce the module bit for bit where the other modes do not.
A failed check flips the decision to "unsupported" with the measured difference.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from kernelwright.integrations.transformers.analysis.source import check_evidence
from kernelwright.integrations.transformers.replacements import (
    mlp_forward,
    norm_forward,
    rope_function,
)
from kernelwright.profiles.model import Decision, MLPDecision, NormDecision, RopeDecision
from kernelwright.runtime import device_info

# fp32 bound on max |patched - original|, relative to max(1, max |original|): the kernels
# accumulate in fp32 like the modules, so only reassociation differences remain (~1e-7)
ATOL_FP32 = 1e-5
# fp16 casting check: the share of elements the decided mode may round differently (a wrong
# mode rounds 20-45% of them differently; the right one none, or a few where rsqrt differs)
MAX_MISMATCH_FP16 = 0.01
BATCH, SEQ = 2, 5


@dataclass(frozen=True)
class CheckResult:
    passed: bool
    max_abs_diff: float
    detail: str  # what was measured, for the Evidence or the reason


def _device() -> torch.device:
    return device_info().torch_device


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randomized(module: nn.Module, seed: int, dtype=torch.float32) -> nn.Module:
    """A copy with fresh random weights: norm scales and biases around 0.3 (the ones/zeros of
    their initialisation would hide a wrong offset or weight), matrices ~ N(0, 1/fan_in)."""
    m = copy.deepcopy(module).to(device=_device(), dtype=dtype).eval()
    g = _gen(seed)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() >= 2:
                r = torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5
            else:
                r = torch.randn(p.shape, generator=g) * 0.5 + 0.3
            p.copy_(r.to(p.dtype))
    return m


def _compare(name: str, ref, out, shape) -> CheckResult:
    refs = ref if isinstance(ref, tuple | list) else (ref,)
    outs = out if isinstance(out, tuple | list) else (out,)
    diff, scale = 0.0, 1.0
    for r, o in zip(refs, outs, strict=True):
        if r.shape != o.shape:
            shapes = f"{tuple(o.shape)} != {tuple(r.shape)}"
            return CheckResult(False, float("inf"), f"{name}: output shape {shapes}")
        diff = max(diff, (o.float() - r.float()).abs().max().item())
        scale = max(scale, r.float().abs().max().item())
    ok = diff <= ATOL_FP32 * scale
    return CheckResult(
        ok,
        diff,
        f"{name} fp32 on {list(shape)}: max |patched - original| = {diff:.2e}"
        + ("" if ok else f" > {ATOL_FP32 * scale:.1e}"),
    )


def check_norm(d: NormDecision, module: nn.Module, *, seed: int = 0) -> CheckResult:
    """The module's forward vs `norm_forward(d)` in fp32 (random weight, bias and input)."""
    m = _randomized(module, seed)
    dim = _norm_dim(m, d)
    x = (torch.randn(BATCH, SEQ, dim, generator=_gen(seed + 1)) * 2 + 0.5).to(_device())
    with torch.no_grad():
        ref = m(x)
        out = norm_forward(d)(m, x)
    return _compare(f"norm {d.class_name}", ref, out, x.shape)


def check_norm_casting(d: NormDecision, module: nn.Module, *, seed: int = 0) -> CheckResult:
    """fp16: the decided casting mode must round like the module; the others must not fit better."""
    m = _randomized(module, seed, dtype=torch.float16)
    dim = _norm_dim(m, d)
    x = (torch.randn(4, 7, dim, generator=_gen(seed + 1)) * 2).to(_device(), torch.float16)
    with torch.no_grad():
        ref = m(x)
        share = {}
        for mode in ("llama", "gemma", "none"):
            out = norm_forward(d.model_copy(update={"casting_mode": mode}))(m, x)
            if out.dtype != ref.dtype:
                share[mode] = 1.0
                continue
            share[mode] = (out != ref).float().mean().item()
    mine = share[d.casting_mode]
    best = min(share, key=share.get)
    ok = mine <= MAX_MISMATCH_FP16 and mine <= share[best]
    shares = ", ".join(f"{k} {v:.1%}" for k, v in share.items())
    return CheckResult(
        ok,
        mine,
        f"norm {d.class_name} fp16 casting: elements rounded differently from the module per "
        f"mode: {shares} (decided {d.casting_mode!r})",
    )


def _norm_dim(m: nn.Module, d: NormDecision) -> int:
    w = getattr(m, d.weight_attribute or "weight", None)
    if isinstance(w, torch.Tensor):
        return w.shape[-1]
    shape = getattr(m, "normalized_shape", None)
    if shape:
        return tuple(shape)[-1]
    raise ValueError(
        f"{d.class_name} has no tensor attribute {d.weight_attribute!r} (weight_attribute) and "
        "no normalized_shape: fix weight_attribute in the profile"
    )


def check_mlp(d: MLPDecision, module: nn.Module, *, seed: int = 0) -> CheckResult:
    """The module's forward vs `mlp_forward(d)` in fp32 (random projections and input)."""
    m = _randomized(module, seed)
    first = d.gate_attribute or d.gate_up_attribute or d.up_attribute
    hidden = getattr(m, first).in_features
    x = torch.randn(BATCH, SEQ, hidden, generator=_gen(seed + 1)).to(_device())
    with torch.no_grad():
        ref = m(x)
        out = mlp_forward(d)(m, x)
    return _compare(f"mlp {d.class_name}", ref, out, x.shape)


def check_rope(
    d: RopeDecision,
    original: Callable,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    heads: int,
    kv_heads: int,
    head_dim: int,
    q_dim: int | None = None,
    seed: int = 0,
) -> CheckResult:
    """The modeling file's rotary function vs `rope_function(d)` on random q, k (fp32).

    q_dim: the width the function receives (the rotated dims when the attention slices q to
    them before the call, as Phi does); default head_dim.
    """
    width = q_dim or head_dim
    dev = _device()
    cos, sin = cos.to(dev, torch.float32), sin.to(dev, torch.float32)
    b, s = cos.shape[0], cos.shape[-2]
    g = _gen(seed)
    if d.unsqueeze_dim == 2:  # [batch, seq, heads, head_dim]
        q_shape, k_shape = (b, s, heads, width), (b, s, kv_heads, width)
    else:  # [batch, heads, seq, head_dim]
        q_shape, k_shape = (b, heads, s, width), (b, kv_heads, s, width)
    q, k = torch.randn(q_shape, generator=g), torch.randn(k_shape, generator=g)
    q, k = q.to(dev), k.to(dev)
    kwargs = {}
    if "unsqueeze_dim" in inspect.signature(original).parameters:
        kwargs["unsqueeze_dim"] = d.unsqueeze_dim
    with torch.no_grad():
        ref = original(q, k, cos, sin, **kwargs)
        out = rope_function(d)(q, k, cos, sin, unsqueeze_dim=d.unsqueeze_dim)
    res = _compare(f"rope {d.call_name}", tuple(ref), tuple(out), q.shape)
    rot = cos.shape[-1] * (2 if d.variant == "half_table" else 1)  # a half table: one angle a pair
    # the rotary embedding's own tables must have the width the partial factor promises
    width_ok = abs(rot - head_dim * d.partial_rotary_factor) < 1
    detail = f"{res.detail}, rotary dims {rot}/{head_dim}"
    if not width_ok:
        expected = head_dim * d.partial_rotary_factor
        detail += f" (partial_rotary_factor {d.partial_rotary_factor} expects {expected:g})"
    return CheckResult(res.passed and width_ok, res.max_abs_diff, detail)


def record(decision: Decision, result: CheckResult) -> None:
    """Add the measurement as evidence, or flip the decision to unsupported with it."""
    if result.passed:
        decision.evidence.append(check_evidence(result.detail))
    else:
        decision.reason = f"numerical check failed: {result.detail}"
        decision.status = "unsupported"


def run_check(decision: Decision, fn: Callable[..., CheckResult], *args, **kwargs) -> None:
    """Run one check; an exception flips only this decision, with its text as the reason."""
    if decision.status != "patch":
        return
    try:
        result = fn(decision, *args, **kwargs)
    except Exception as e:  # recorded as the decision's reason, never dropped
        decision.reason = f"numerical check raised {type(e).__name__}: {e}"
        decision.status = "unsupported"
        return
    record(decision, result)
