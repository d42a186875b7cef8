"""kernelwright.losses against TRL 1.16's own loss code on random inputs: values, gradients and
metrics, for every option our functions expose.

TRL computes these losses inside trainer methods. Building a trainer takes seconds, so each test
calls the unbound method on a SimpleNamespace that holds only the attributes the method reads
(listed at each stub); the method's code is TRL's, unchanged; where a method calls the model
(DPO's and KTO's `_compute_loss`) the model is a function returning the fused head's
per-token outputs. Where TRL has no such code (DPO without a reference) tests/test_losses.py
compares with the papers' formulas.
"""

from __future__ import annotations

import types
import warnings
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

try:  # TRL's trainers need datasets, accelerate (the GPU machine has TRL's wheel alone)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # trl.experimental announces itself
        from trl.experimental.cpo import CPOTrainer
        from trl.experimental.orpo import ORPOTrainer
        from trl.trainer.dpo_trainer import DPOTrainer
        from trl.trainer.grpo_trainer import GRPOTrainer
        from trl.trainer.kto_trainer import KTOTrainer
except ImportError as e:
    pytest.skip(f"needs TRL's trainers: {e}", allow_module_level=True)

from kernelwright.losses import (  # noqa: E402
    CPO_LOSS_TYPES,
    DPO_LOSS_TYPES,
    KTO_LOSS_TYPES,
    cpo_loss,
    dpo_loss,
    grpo_loss,
    kto_loss,
    orpo_loss,
    sequence_logprobs,
    simpo_loss,
)


class _OneProcess:
    """accelerate's Accelerator as one CPU process sees it: gathers and reductions are no-ops."""

    device = torch.device("cpu")
    num_processes = 1

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x

    def pad_across_processes(self, x, dim=0, pad_index=0):
        return x


def _metrics():
    return defaultdict(lambda: defaultdict(list))


def _grads(loss, params):
    return torch.autograd.grad(loss, params, retain_graph=True)


# ---- DPO: DPOTrainer._compute_loss -----------------------------------------------------------


def _dpo_batch(seed: int, pairs: int = 3, T: int = 7):
    g = torch.Generator().manual_seed(seed)
    completion_mask = torch.zeros(2 * pairs, T, dtype=torch.long)
    for i, start in enumerate(torch.randint(1, 4, (2 * pairs,), generator=g).tolist()):
        completion_mask[i, start : T - i % 2] = 1  # a prompt, a completion, padding
    shift = completion_mask[:, 1:]
    logps = (-torch.rand(2 * pairs, T - 1, generator=g) * 3).requires_grad_()
    ref = sequence_logprobs(-torch.rand(2 * pairs, T - 1, generator=g) * 3, shift)
    inputs = {
        "input_ids": torch.randint(0, 50, (2 * pairs, T), generator=g),
        "attention_mask": torch.ones(2 * pairs, T, dtype=torch.long),
        "completion_mask": completion_mask,
        "ref_chosen_logps": ref[:pairs],
        "ref_rejected_logps": ref[pairs:],
    }
    return logps, shift, inputs


@pytest.mark.parametrize("loss_type", DPO_LOSS_TYPES)
@pytest.mark.parametrize("eps", [0.0, 0.2])
def test_dpo_loss_equals_dpo_trainers_compute_loss(loss_type, eps):
    """label_smoothing changes "robust" only: TRL 1.16 ignores it for sigmoid, hinge and ipo."""
    logps, shift, inputs = _dpo_batch(seed=len(loss_type) + int(eps * 10))
    beta = 0.3
    # the fused head's outputs: per-token log-probs (0 off the completion) and its statistics
    token_logps = logps * shift
    zeros = torch.zeros_like(logps.detach())
    outputs = SimpleNamespace(log_probs=token_logps, entropy=zeros, mean_logits=zeros,
                              is_top1=zeros.bool())  # fmt: skip
    # DPOTrainer._compute_loss reads: model.training, accelerator (device, gather,
    # gather_for_metrics), aux_loss_enabled, ld_alpha, precompute_ref_logps, f_divergence_type,
    # loss_types, loss_weights, beta, label_smoothing, use_weighting, _metrics,
    # _total_train_tokens, _tp_size; the model is called once (reference log-probs precomputed)
    stub = SimpleNamespace(
        model=SimpleNamespace(training=True), accelerator=_OneProcess(), aux_loss_enabled=False,
        ld_alpha=None, precompute_ref_logps=True, f_divergence_type="reverse_kl",
        loss_types=[loss_type], loss_weights=[1.0], beta=beta, label_smoothing=eps,
        use_weighting=False, args=SimpleNamespace(), _metrics=_metrics(), _total_train_tokens=0,
        _tp_size=1,
    )  # fmt: skip
    want = DPOTrainer._compute_loss(stub, lambda **kw: outputs, inputs, return_outputs=False)

    ipo = loss_type == "ipo"  # IPO on mean log-probs, the reference's too
    pol = sequence_logprobs(token_logps, shift, average=ipo)
    n = shift.sum(-1).clamp(min=1) if ipo else torch.ones(len(shift))
    ref = torch.cat([inputs["ref_chosen_logps"], inputs["ref_rejected_logps"]]) / n
    pc, pr = pol.chunk(2)
    rc, rr = ref.chunk(2)
    ignored = eps > 0 and loss_type != "robust"
    with pytest.warns(UserWarning, match="no effect") if ignored else warnings.catch_warnings():
        losses, chosen_rw, rejected_rw = dpo_loss(pc, pr, rc, rr, beta=beta, loss_type=loss_type,
                                                  label_smoothing=eps)  # fmt: skip
    got = losses.mean()
    torch.testing.assert_close(got, want)
    for a, b in zip(_grads(got, [logps]), _grads(want, [logps]), strict=True):
        torch.testing.assert_close(a, b)
    if ipo:  # our rewards are on the means we were given, TRL's on the sums
        return
    m = stub._metrics["train"]
    assert chosen_rw.mean().item() == pytest.approx(m["rewards/chosen"][0], rel=1e-5)
    assert rejected_rw.mean().item() == pytest.approx(m["rewards/rejected"][0], rel=1e-5)


# ---- CPO, SimPO, AlphaPO: CPOTrainer.cpo_loss; ORPO: ORPOTrainer.odds_ratio_loss -------------


def _pairs(seed: int, n: int = 6, scale: float = 3.0):
    g = torch.Generator().manual_seed(seed)
    return [(-torch.rand(n, generator=g) * scale - 0.02).requires_grad_() for _ in range(2)]


@pytest.mark.parametrize("loss_type", CPO_LOSS_TYPES)
@pytest.mark.parametrize("eps, alpha", [(0.0, 0.0), (0.1, 0.0), (0.1, 0.4)])
def test_cpo_loss_equals_cpo_trainers_cpo_loss(loss_type, eps, alpha):
    """Sums for sigmoid and hinge, means for ipo and simpo (as the trainer computes them); the
    trainer adds cpo_alpha·NLL itself; CPOConfig turns "alphapo" into "simpo"."""
    mean_logps = loss_type in ("ipo", "simpo", "alphapo")
    c, r = _pairs(seed=len(loss_type), scale=2.0 if mean_logps else 8.0)
    beta, gamma = 0.4, 0.3
    # CPOTrainer.cpo_loss reads: alpha, beta, loss_type, simpo_gamma, label_smoothing,
    # accelerator.device
    stub = SimpleNamespace(alpha=alpha, beta=beta, simpo_gamma=gamma, label_smoothing=eps,
                           loss_type="simpo" if loss_type == "alphapo" else loss_type,
                           accelerator=_OneProcess())  # fmt: skip
    want = CPOTrainer.cpo_loss(stub, c, r)
    ignored = eps > 0 and loss_type in ("hinge", "ipo")
    with pytest.warns(UserWarning, match="no effect") if ignored else warnings.catch_warnings():
        got = cpo_loss(c, r, beta=beta, loss_type=loss_type, label_smoothing=eps,
                       simpo_gamma=gamma, alpha=alpha)  # fmt: skip
    for a, b in zip(got, want, strict=True):  # losses, chosen and rejected rewards
        torch.testing.assert_close(a, b)
    for a, b in zip(_grads(got[0].sum(), [c, r]), _grads(want[0].sum(), [c, r]), strict=True):
        torch.testing.assert_close(a, b)
    if loss_type == "simpo" and alpha == 0:  # SimPO is CPO's "simpo"
        torch.testing.assert_close(
            simpo_loss(c, r, beta=beta, gamma=gamma, label_smoothing=eps)[0], want[0]
        )


def test_orpo_loss_equals_orpo_trainers_odds_ratio_loss():
    """Mean log-probs on both sides of -ln 2, where log(1 - e^x) switches its formula; TRL
    returns β·log σ(log_odds), which its trainer subtracts: ours is its negation."""
    c, r = _pairs(seed=9, n=12, scale=2.5)
    with torch.no_grad():
        c[:3] = torch.tensor([-1e-3, -0.3, -0.69])
    beta = 0.25
    # ORPOTrainer.odds_ratio_loss reads: beta, accelerator.device
    stub = SimpleNamespace(beta=beta, accelerator=_OneProcess())
    losses, chosen_rw, rejected_rw, mean_ratio, mean_log_odds = ORPOTrainer.odds_ratio_loss(
        stub, c, r
    )
    got, got_c, got_r, log_odds = orpo_loss(c, r, beta=beta)
    torch.testing.assert_close(got, -losses)
    torch.testing.assert_close(got_c, chosen_rw)
    torch.testing.assert_close(got_r, rejected_rw)
    torch.testing.assert_close(log_odds.mean(), mean_log_odds.detach())
    for a, b in zip(_grads(got.sum(), [c, r]), _grads(-losses.sum(), [c, r]), strict=True):
        torch.testing.assert_close(a, b)
        assert torch.isfinite(a).all()


# ---- KTO: KTOTrainer._compute_loss --------------------------------------------------------------


def _completions(g, B: int, T: int):
    """A prompt, a completion and padding per row; the fused head's per-token log-probs (0 off
    the completion, as it returns them) and the shifted completion mask."""
    mask = torch.zeros(B, T, dtype=torch.long)
    for i, start in enumerate(torch.randint(1, 3, (B,), generator=g).tolist()):
        mask[i, start : T - i % 2] = 1
    shift = mask[:, 1:]
    logps = (-torch.rand(B, T - 1, generator=g) * 3).requires_grad_()
    return logps, shift, mask


KTO_CASES = {  # loss_type, beta, desirable / undesirable weights, the KL estimate's sign, labels
    "kto": ("kto", 0.1, 1.0, 1.0, 1, "mixed"),
    "kto-weighted-kl-clamped": ("kto", 0.4, 1.3, 0.7, -1, "mixed"),
    "kto-desirable-only": ("kto", 0.2, 1.0, 1.5, 1, "desirable"),
    "apo_zero_unpaired-weighted": ("apo_zero_unpaired", 0.3, 0.8, 1.2, 1, "mixed"),
}


@pytest.mark.parametrize("case", list(KTO_CASES))
def test_kto_loss_equals_kto_trainers_compute_loss(case):
    """The reference log-probs and their KL batch precomputed (TRL's precompute_ref_log_probs);
    the KL estimate is the mean of the KL batch's policy - reference sums, clamped at 0 (a
    negative one is tested), no gradient; "apo_zero_unpaired" has none."""
    loss_type, beta, w_d, w_u, kl_sign, labels = KTO_CASES[case]
    g = torch.Generator().manual_seed(len(case))
    B, T, T_kl = 6, 7, 6
    logps, shift, mask = _completions(g, B, T)
    kl_logps, kl_shift, kl_mask = _completions(g, B, T_kl)
    label = torch.arange(B) % 3 != 0 if labels == "mixed" else torch.ones(B, dtype=torch.bool)
    token_logps, kl_token_logps = logps * shift, kl_logps.detach() * kl_shift
    ref = sequence_logprobs(-torch.rand(B, T - 1, generator=g) * 3, shift)
    kl_seq = sequence_logprobs(kl_token_logps, kl_shift)
    ref_kl = kl_seq - kl_sign * (0.5 + torch.rand(B, generator=g))  # a KL estimate of that sign
    zeros = torch.zeros_like(logps.detach())
    outputs = SimpleNamespace(log_probs=token_logps, entropy=zeros, mean_logits=zeros)
    kl_outputs = SimpleNamespace(log_probs=kl_token_logps)

    def model(input_ids, labels, fused_lm_head, **kw):  # the KL batch is the narrower one
        assert fused_lm_head
        return outputs if input_ids.shape[1] == T else kl_outputs

    inputs = {
        "input_ids": torch.randint(0, 50, (B, T), generator=g),
        "attention_mask": torch.ones(B, T, dtype=torch.long), "completion_mask": mask,
        "KL_input_ids": torch.randint(0, 50, (B, T_kl), generator=g),
        "KL_attention_mask": torch.ones(B, T_kl, dtype=torch.long), "KL_completion_mask": kl_mask,
        "label": label, "ref_logps": ref, "ref_KL_logps": ref_kl,
    }  # fmt: skip
    # KTOTrainer._compute_loss reads: model.training, accelerator (device, gather_for_metrics),
    # _compute_kl_logps (TRL's, bound to the stub: reads calculate_KL), aux_loss_enabled,
    # precompute_ref_logps, calculate_KL, loss_type, beta, desirable_weight,
    # undesirable_weight, _metrics, _total_train_tokens, _tp_size
    stub = SimpleNamespace(
        model=SimpleNamespace(training=True), accelerator=_OneProcess(), aux_loss_enabled=False,
        precompute_ref_logps=True, calculate_KL=loss_type == "kto", loss_type=loss_type,
        beta=beta, desirable_weight=w_d, undesirable_weight=w_u, _metrics=_metrics(),
        _total_train_tokens=0, _tp_size=1,
    )  # fmt: skip
    stub._compute_kl_logps = types.MethodType(KTOTrainer._compute_kl_logps, stub)
    want = KTOTrainer._compute_loss(stub, model, inputs, return_outputs=False)

    seq = sequence_logprobs(token_logps, shift)
    kl = (kl_seq - ref_kl).mean()
    assert (kl > 0) == (kl_sign > 0)
    losses, chosen_rw, rejected_rw = kto_loss(
        seq[label], seq[~label], ref[label], ref[~label], kl, beta=beta, desirable_weight=w_d,
        undesirable_weight=w_u, loss_type=loss_type,
    )  # fmt: skip
    got = losses.mean()
    torch.testing.assert_close(got, want)
    for a, b in zip(_grads(got, [logps]), _grads(want, [logps]), strict=True):
        torch.testing.assert_close(a, b)
    m = stub._metrics["train"]
    assert m["kl"][0] == pytest.approx(kl.clamp(min=0).item() if stub.calculate_KL else 0.0)
    assert chosen_rw.mean().item() == pytest.approx(m["rewards/chosen"][0], rel=1e-5)
    if labels == "mixed":
        assert rejected_rw.mean().item() == pytest.approx(m["rewards/rejected"][0], rel=1e-5)
    else:
        assert rejected_rw.numel() == 0 and "rewards/rejected" not in m


def test_kto_loss_types_are_trls():
    from trl import KTOConfig

    field = KTOConfig.__dataclass_fields__["loss_type"]
    assert tuple(field.metadata["choices"]) == KTO_LOSS_TYPES
    with pytest.raises(ValueError, match="loss_type must be one of"):
        kto_loss(*torch.zeros(4, 2), loss_type="bco")


# ---- GRPO: GRPOTrainer._compute_loss ----------------------------------------------------------


def _grpo_inputs(seed: int, B: int = 4, T: int = 6):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(B, T, dtype=torch.long)
    for i in range(B):
        mask[i, T - i :] = 0  # completions of different lengths
    logps = (-torch.rand(B, T, generator=g) * 2).requires_grad_()
    noise = lambda s: torch.randn(B, T, generator=g) * s  # noqa: E731
    data = {
        "advantages": torch.randn(B, generator=g),
        # a shift per sequence too, so that sequence-level ratios are clipped as well
        "old_per_token_logps": logps.detach() + noise(0.3) + torch.randn(B, 1, generator=g) * 0.3,
        "ref_per_token_logps": logps.detach() + noise(0.5),
        "sampling_per_token_logps": logps.detach() + noise(0.3),
        "importance_sampling_ratio": torch.rand(B, T, generator=g) + 0.5,
        "entropies": torch.rand(B, T, generator=g) * 3,
    }
    return logps, mask, data


# TRL's option → its value in each case; our grpo_loss takes the same names
GRPO_CASES = {
    "grpo": dict(loss_type="grpo", beta=0.04, epsilon_high=0.28),
    "grpo-on-policy": dict(loss_type="grpo", beta=0.1, on_policy=True),
    "bnpo-sequence": dict(loss_type="bnpo", beta=0.04, importance_sampling_level="sequence"),
    "dr_grpo-accumulated": dict(loss_type="dr_grpo", beta=0.04, max_completion_length=9,
                                current_gradient_accumulation_steps=2),
    "dapo-delta-2-processes": dict(loss_type="dapo", beta=0.04, delta=1.1, num_processes=2,
                                   current_gradient_accumulation_steps=2, steps_per_generation=4),
    "dapo-sequence-delta-no-bias-correction": dict(
        loss_type="dapo", beta=0.04, delta=1.05, importance_sampling_level="sequence",
        use_bias_correction_kl=False),
    "bnpo-entropy-off-policy-vllm": dict(loss_type="bnpo", beta=0.04, top_entropy_quantile=0.5,
                                         off_policy_mask_threshold=0.02,
                                         vllm_importance_sampling_correction=True),
}  # fmt: skip


@pytest.mark.parametrize("case", list(GRPO_CASES))
def test_grpo_loss_equals_grpo_trainers_compute_loss(case):
    cfg = dict(GRPO_CASES[case])
    logps, mask, data = _grpo_inputs(seed=len(case))
    B, T = logps.shape
    on_policy = cfg.pop("on_policy", False)
    vllm = cfg.pop("vllm_importance_sampling_correction", False)
    num_processes = cfg.pop("num_processes", 1)
    accumulation = cfg.pop("current_gradient_accumulation_steps", 1)
    per_generation = cfg.pop("steps_per_generation", 1)
    # the generation batch's active tokens over every process, as TRL counts them
    num_items = mask.sum() * num_processes * per_generation + 3

    # GRPOTrainer._compute_loss reads: _get_per_token_logps_and_entropies (stubbed: our log-probs
    # and entropies), aux_loss_enabled, top_entropy_quantile, get_high_entropy_mask (TRL's,
    # bound to the stub), off_policy_mask_threshold, get_off_policy_mask (TRL's),
    # importance_sampling_level, beta, loss_type, epsilon_low, epsilon_high, use_vllm,
    # vllm_importance_sampling_correction, max_completion_length, model.training,
    # current_gradient_accumulation_steps, _entropy_bonus_enabled, _metrics, accelerator
    # (num_processes, gather, reduce, pad_across_processes) and args (use_bias_correction_kl,
    # delta, steps_per_generation)
    accelerator = _OneProcess()
    accelerator.num_processes = num_processes
    stub = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logps, data["entropies"], None),
        aux_loss_enabled=False, top_entropy_quantile=cfg.get("top_entropy_quantile", 1.0),
        off_policy_mask_threshold=cfg.get("off_policy_mask_threshold"),
        get_off_policy_mask=GRPOTrainer.get_off_policy_mask,
        importance_sampling_level=cfg.get("importance_sampling_level", "token"),
        beta=cfg["beta"], loss_type=cfg["loss_type"], epsilon_low=0.2,
        epsilon_high=cfg.get("epsilon_high", 0.2), use_vllm=vllm,
        vllm_importance_sampling_correction=vllm,
        max_completion_length=cfg.get("max_completion_length"),
        model=SimpleNamespace(training=True), current_gradient_accumulation_steps=accumulation,
        _entropy_bonus_enabled=False, _metrics=_metrics(), accelerator=accelerator,
        args=SimpleNamespace(use_bias_correction_kl=cfg.get("use_bias_correction_kl", True),
                             delta=cfg.get("delta"), steps_per_generation=per_generation),
    )  # fmt: skip
    stub.get_high_entropy_mask = types.MethodType(GRPOTrainer.get_high_entropy_mask, stub)
    inputs = {
        "prompt_ids": torch.zeros(B, 2, dtype=torch.long),
        "prompt_mask": torch.ones(B, 2, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": data["advantages"],
        "ref_per_token_logps": data["ref_per_token_logps"],
        "num_items_in_batch": num_items,
        "sampling_per_token_logps": data["sampling_per_token_logps"],
        "importance_sampling_ratio": data["importance_sampling_ratio"],
    }
    if not on_policy:
        inputs["old_per_token_logps"] = data["old_per_token_logps"]
    want = GRPOTrainer._compute_loss(stub, None, inputs)

    if cfg["loss_type"] == "dapo":  # TRL's normaliser, as grpo_loss's docstring maps it
        cfg["num_items_in_batch"] = num_items / num_processes * accumulation / per_generation
    got, metrics = grpo_loss(
        logps, data["advantages"], mask, old_logps=inputs.get("old_per_token_logps"),
        ref_logps=data["ref_per_token_logps"], entropies=data["entropies"],
        sampling_logps=data["sampling_per_token_logps"],
        importance_sampling_ratio=data["importance_sampling_ratio"] if vllm else None,
        gradient_accumulation_steps=accumulation, **cfg,
    )  # fmt: skip
    torch.testing.assert_close(got, want)
    for a, b in zip(_grads(got, [logps]), _grads(want, [logps]), strict=True):
        torch.testing.assert_close(a, b)
    m = stub._metrics["train"]
    for ours, theirs in (("kl", "kl"), ("clip_ratio", "clip_ratio/region_mean"),
                         ("clip_ratio_low", "clip_ratio/low_mean"),
                         ("clip_ratio_high", "clip_ratio/high_mean")):  # fmt: skip
        assert metrics[ours].item() == pytest.approx(m[theirs][0], rel=1e-5, abs=1e-7), ours
    if not on_policy:
        assert m["clip_ratio/region_mean"][0] > 0  # some ratio is clipped: the clip is tested
