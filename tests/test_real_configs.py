"""Real checkpoints' configs: the profile autopatch builds matches what each model computes.

tests/fixtures/configs/<org>__<name>.json hold the config.json of widely downloaded causal LMs
(config only, no weights; docs/autopatch.md says how they were written and how to add one).
Each is built as `from_pretrained` builds it (the model type's config class, from the dict),
analysed as `kw.patch(model)` analyses a model (`analyze`: a tiny instance of the model's own
classes from the analyser's shrunk config), and a tiny instance is patched with that profile:
what it patches is compared with EXPECTED, written from the modeling code of the pinned
transformers (5.17). The table is itself confirmed on the tiny instance before it is patched:
the norm's casting mode and offset in fp16, the logits transform (soft-cap, scaling) against
the lm-head's raw output, the tied weights and the rotary embedding's rope type, so it cannot
drift from the code it describes. The shrunk config must keep every key these decisions read.

The numerical checks of `analyze` (check=True: kernels through the Triton interpreter, seconds
a model) are off here; where the profile without them disagrees with the model, FINDINGS holds
the case as a strict xfail with the reason (what the default `kw.patch` path, with the checks,
does is noted there).
"""

import copy
import dataclasses
import functools
import json
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # noqa: E402

import kernelwright as kw  # noqa: E402
from kernelwright.integrations.transformers import patch_record  # noqa: E402
from kernelwright.integrations.transformers.analysis import analyze  # noqa: E402
from kernelwright.integrations.transformers.analysis.load import build_tiny, resolve  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "configs"
EPS_KEYS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon")
# config keys the decisions read: the analyser's shrunk config must keep each of them
DECISION_KEYS = (
    *EPS_KEYS,
    "tie_word_embeddings",
    "final_logit_softcapping",
    "attn_logit_softcapping",
    "logits_scaling",
    "logit_scale",
    "hidden_act",
    "hidden_activation",
    "activation_function",
    "partial_rotary_factor",
)


@dataclasses.dataclass(frozen=True)
class Want:
    """What the model computes, as the patch should see it (defaults: a Llama-style decoder)."""

    norm: str | None = "llama"  # rms_norm casting mode, "layer_norm", or None: left alone
    offset: float = 0.0  # scale = offset + weight
    mlp: str | None = "swiglu/separate"  # activation/layout of a patched MLP, None: none
    moe: bool = False  # stacked experts replaced by moe_experts
    rope: str | None = "half_split"  # variant of a patched rotary function, None: left alone
    partial: float = 1.0  # partial_rotary_factor
    rope_type: str | None = "default"  # the rotary embedding's rope_type (None: no RoPE)
    softcap: float | None = None  # final logit soft-cap
    scale: tuple[str, float] | None = None  # ("multiply" | "divide", constant) on the logits
    tied: bool = False  # lm_head.weight is the input embedding's
    fused_loss: bool = True  # the causal-LM forward replaced by the fused loss


PHI3 = {"mlp": "swiglu/fused_gate_up"}  # Phi3MLP: gate_up_proj, chunk(2) -> [gate | up]
# Gemma2/3RMSNorm: x * rsqrt(..) in fp32, * (1 + weight.float()), cast; GELU-tanh gated MLP
GEMMA = {"norm": "gemma", "offset": 1.0, "mlp": "geglu_tanh/separate", "tied": True}
# Each entry from the model's modeling_*.py in transformers 5.17. A Llama-style RMSNorm is
# `weight * (x.float() * rsqrt(..)).to(dtype)` ("llama" casting, offset 0); SwiGLU MLPs are
# down(silu(gate(x)) * up(x)); half-split RoPE is q * cos + rotate_half(q) * sin.
EXPECTED = {
    "meta-llama__Llama-3.1-8B-Instruct": Want(rope_type="llama3"),
    "meta-llama__Llama-3.2-1B-Instruct": Want(rope_type="llama3", tied=True),
    "meta-llama__Llama-3.2-3B-Instruct": Want(rope_type="llama3", tied=True),
    "meta-llama__Meta-Llama-3-8B-Instruct": Want(),
    "meta-llama__Llama-2-7b-hf": Want(),
    "TinyLlama__TinyLlama-1.1B-Chat-v1.0": Want(),
    "HuggingFaceTB__SmolLM2-1.7B-Instruct": Want(tied=True),
    "Qwen__Qwen2.5-0.5B": Want(tied=True),
    "Qwen__Qwen2.5-1.5B-Instruct": Want(tied=True),
    "Qwen__Qwen2.5-7B-Instruct": Want(),
    "deepseek-ai__DeepSeek-R1-Distill-Qwen-1.5B": Want(),  # Qwen2, but its own lm_head
    "Qwen__Qwen3-0.6B": Want(tied=True),  # q_norm / k_norm: the same Qwen3RMSNorm
    "Qwen__Qwen3-4B": Want(tied=True),
    "Qwen__Qwen3-8B": Want(),
    # stacked SwiGLU experts (Qwen3MoeExperts: act_fn(gate) * up, no bias); no dense MLP
    "Qwen__Qwen3-30B-A3B": Want(mlp=None, moe=True),
    "mistralai__Mistral-7B-v0.1": Want(),
    "mistralai__Mistral-7B-Instruct-v0.3": Want(),
    "mistralai__Mixtral-8x7B-Instruct-v0.1": Want(mlp=None, moe=True),
    "google__gemma-2-2b": Want(**GEMMA, softcap=30.0),  # tanh(z / 30) * 30
    "google__gemma-2-9b-it": Want(**GEMMA, softcap=30.0),
    "google__gemma-3-1b-it": Want(**GEMMA),  # final_logit_softcapping null: logits as they are
    "microsoft__Phi-3-mini-4k-instruct": Want(**PHI3),
    "microsoft__Phi-3.5-mini-instruct": Want(**PHI3, rope_type="longrope"),
    # LongRoPE on the first 3/4 of each head (the attention slices q[..., :rotary_dims])
    "microsoft__Phi-4-mini-instruct": Want(**PHI3, rope_type="longrope", partial=0.75, tied=True),
    "microsoft__phi-4": Want(**PHI3),
    # Olmo2RMSNorm: (weight * x_hat).to(dtype), the multiply in fp32: "gemma" casting, offset 0
    "allenai__OLMo-2-1124-7B-Instruct": Want(norm="gemma"),
    "ibm-granite__granite-3.3-8b-instruct": Want(scale=("divide", 16.0), tied=True),
    # CohereLayerNorm: a bias-free LayerNorm written by hand (left alone); rotate_half on
    # interleaved pairs; logits * logit_scale
    "CohereForAI__c4ai-command-r-v01": Want(
        norm=None, rope="interleaved", scale=("multiply", 0.0625), tied=True
    ),
    # MLA; YaRN rotary through apply_rotary_emb(q, k, freqs_cis) on complex numbers: no
    # (q, k, cos, sin) function to replace, the rotary is left alone
    "deepseek-ai__DeepSeek-V2-Lite-Chat": Want(moe=True, rope=None, rope_type="yarn"),
    # rope_interleave: apply_rotary_pos_emb_interleave reads (x0, x1) pairs and writes the
    # rotated evens then the rotated odds: the kernel's deinterleave pairing
    "deepseek-ai__DeepSeek-V3": Want(moe=True, rope="deinterleave", rope_type="yarn"),
    # GptOssRMSNorm casts after the multiply ("gemma", offset 0); experts with biases keep
    # HF's forward, their clamped `_apply_gate` becomes swiglu_clamped; rotary on torch.chunk
    # halves by cos/sin that hold each angle once ([.., D/2]): the kernel's half_table pairing
    "openai__gpt-oss-20b": Want(
        norm="gemma", mlp=None, moe=True, rope="half_table", rope_type="yarn"
    ),
    # nn.LayerNorm; Conv1D MLP with gelu_new (no kernel); learned positions, no RoPE
    "openai-community__gpt2": Want(
        norm="layer_norm", mlp=None, rope=None, rope_type=None, tied=True
    ),
}

# fixture -> (fields, why): the profile without the numerical checks disagrees with the model
FINDINGS: dict[str, tuple[tuple[str, ...], str]] = {}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    # The tiny models' ops are microseconds: a second torch thread only adds its wake-ups (tens
    # of ms a matmul on a loaded 2-core machine).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _config(name: str):
    data = json.loads((FIXTURES / f"{name}.json").read_text())
    return CONFIG_MAPPING[data["model_type"]].from_dict(data)


def _shrink_lost(config, tiny_config) -> list[str]:
    """The decision keys whose value the shrunk config changed (rope factors may be cut)."""

    def same(a, b) -> bool:
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, list) and isinstance(b, list):  # long/short factors: one per frequency
            return 0 < len(b) <= len(a) and a[: len(b)] == b
        return a == b

    keys = [*DECISION_KEYS, "rope_parameters"]
    return [k for k in keys if not same(getattr(config, k, None), getattr(tiny_config, k, None))]


def _casting_mismatch(module: torch.nn.Module, mode: str, offset: float) -> float:
    """Share of fp16 outputs of an RMSNorm module that `mode` rounds differently."""
    m = copy.deepcopy(module).half()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        m.weight.copy_(torch.randn(m.weight.shape, generator=g) * 0.5 + 0.3)
    x = (torch.randn(4, 7, m.weight.shape[-1], generator=g) * 2).half()
    eps = getattr(m, "variance_epsilon", getattr(m, "eps", None))
    xf = x.float()
    x_hat = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    with torch.no_grad():
        out = m(x)
        if mode == "llama":  # cast to the input dtype, then the weight multiply
            ref = (offset + m.weight) * x_hat.to(x.dtype)
        else:  # "gemma": the weight multiply in fp32, then the cast
            ref = (x_hat * (offset + m.weight.float())).to(x.dtype)
    return (out != ref).float().mean().item()


def _model_side(model: torch.nn.Module, norm_class: str | None, want: Want) -> list[str]:
    """Where the tiny instance (unpatched) computes something other than `want` describes."""
    wrong = []
    if want.norm in ("llama", "gemma"):
        module = next(m for m in model.modules() if type(m).__name__ == norm_class)
        other = "gemma" if want.norm == "llama" else "llama"
        mine = _casting_mismatch(module, want.norm, want.offset)
        theirs = _casting_mismatch(module, other, want.offset)
        if not (mine <= 0.01 < theirs):
            wrong.append(f"norm casting: {want.norm} {mine:.1%} vs {other} {theirs:.1%} differ")
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    if (head.weight is emb.weight) != want.tied:
        wrong.append(f"tied: lm_head.weight is the embedding's: {head.weight is emb.weight}")
    g = torch.Generator().manual_seed(1)
    raw = []  # the lm-head's own output, before the causal LM transforms it
    hook = head.register_forward_hook(lambda _m, _args, out: raw.append(out))
    with torch.no_grad():
        # logits of a few units, where a soft-cap of 30 is visible
        head.weight.copy_(torch.randn(head.weight.shape, generator=g))
        ids = torch.randint(0, head.weight.shape[0], (2, 8), generator=g)
        logits = model(input_ids=ids).logits
    hook.remove()
    (z,) = raw
    want_logits = z
    if want.scale is not None:
        op, k = want.scale
        want_logits = want_logits * k if op == "multiply" else want_logits / k
    if want.softcap is not None:
        want_logits = torch.tanh(want_logits / want.softcap) * want.softcap
    if not torch.allclose(logits, want_logits, rtol=1e-5, atol=1e-5):
        wrong.append(f"logits: max |model - table| = {(logits - want_logits).abs().max():.3g}")
    elif want.scale or want.softcap:
        assert (logits - z).abs().max() > 1e-2, "the logits transform is invisible here"
    types = set()
    for m in model.modules():
        t = getattr(m, "rope_type", None)
        types |= set(t.values()) if isinstance(t, dict) else {t} - {None}
    if types != ({want.rope_type} if want.rope_type else set()):
        wrong.append(f"rope_type: the rotary embedding uses {sorted(types)}")
    return wrong


def _profile_side(profile, record) -> dict:
    """The decisions as the patch applies them, in Want's fields."""
    applied = {m.kind for m in record.modules}
    patched = {(m.kind, m.class_name) for m in record.modules}
    norms = [d for d in profile.norms if ("norm", d.class_name) in patched]
    mlps = [d for d in profile.mlps if ("mlp", d.class_name) in patched]
    rope, logits = profile.rope, profile.logits
    rope_type = None
    if "rope" in applied:
        recorded = [e.detail for e in rope.evidence if e.source.endswith("rope_type")]
        rope_type = recorded[0] if recorded else "default"
    return {
        "norm": {(d.casting_mode or d.kind, d.offset) for d in norms},
        "mlp": {f"{d.activation}/{d.layout}" for d in mlps},
        "moe": "moe_experts" in applied,
        "rope": (rope.variant, rope.partial_rotary_factor) if "rope" in applied else None,
        "rope_type": rope_type,
        "softcap": logits.softcap,
        "scale": (logits.scale_op, logits.scale) if logits.scale_op else None,
        "tied": profile.lm_head.tied,
        "fused_loss": "causal_lm" in applied,
    }


def _wanted(want: Want) -> dict:
    return {
        "norm": {(want.norm, want.offset)} if want.norm else set(),
        "mlp": {want.mlp} if want.mlp else set(),
        "moe": want.moe,
        "rope": (want.rope, want.partial) if want.rope else None,
        "rope_type": want.rope_type if want.rope else None,
        "softcap": want.softcap,
        "scale": want.scale,
        "tied": want.tied,
        "fused_loss": want.fused_loss,
    }


@functools.cache
def _analysed(name: str) -> tuple[dict, list[str], list[str], list[str]]:
    """(profile-side decisions, model-side mismatches, lost config keys, eps mismatches)."""
    config = _config(name)
    profile = analyze(config, check=False)
    model, tiny_config, _ = build_tiny(resolve(config).model_cls, config)
    norm_class = next((d.class_name for d in profile.norms if d.patched), None)
    model_side = _model_side(model, norm_class, EXPECTED[name])
    eps = next(getattr(config, k) for k in EPS_KEYS if getattr(config, k, None) is not None)
    bad_eps = [
        f"{d.class_name}.{d.eps_attribute}={getattr(m, d.eps_attribute)} (config {eps})"
        for d in profile.norms
        if d.patched
        for m in model.modules()
        if type(m).__name__ == d.class_name and getattr(m, d.eps_attribute) != eps
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # what the instance refuses is in the record
        kw.patch(model, profile)
    got = _profile_side(profile, patch_record(model))
    return got, model_side, _shrink_lost(config, tiny_config), bad_eps


def _cases():
    names = sorted({p.stem for p in FIXTURES.glob("*.json")} | set(EXPECTED))
    for name in names:
        yield pytest.param(name, (), id=name)
        if name in FINDINGS:
            fields, why = FINDINGS[name]
            mark = pytest.mark.xfail(strict=True, reason=why)
            yield pytest.param(name, fields, id=f"{name}-finding", marks=mark)


@pytest.mark.parametrize(("name", "only"), list(_cases()))
def test_real_config_profile(name, only):
    assert (FIXTURES / f"{name}.json").exists(), f"EXPECTED names {name} but it has no fixture"
    assert name in EXPECTED, f"no EXPECTED entry for {name}.json: read its modeling code, add one"
    got, model_side, lost, bad_eps = _analysed(name)
    want = _wanted(EXPECTED[name])
    if not only:
        assert not model_side, f"the table does not describe the model: {model_side}"
        assert not lost, f"the shrunk config changed {lost}"
        assert not bad_eps, f"the norm's eps attribute is not the config's: {bad_eps}"
    skip = () if only else FINDINGS.get(name, ((), ""))[0]
    fields = only or [f for f in want if f not in skip]
    diffs = {f: {"profile": got[f], "model": want[f]} for f in fields if got[f] != want[f]}
    assert not diffs, f"{name}: {diffs}"
