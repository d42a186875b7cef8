"""Apply a ModelProfile to a model instance: one generic walker, no per-model code.

    profile = kernelwright.patch(model)            # analyse, then patch
    kernelwright.patch(model, "llama.yaml")        # a reviewed profile
    kernelwright.unpatch(model)                    # back to the original, bit for bit

Every change is an instance attribute `module.forward` (a bound method) on a module whose
class name the profile names; classes, modeling files and parameters are never touched, so
the state dict, the optimizer's parameter references and other instances of the same class
stay as they are, and `unpatch` only deletes what `patch` set. Matching by class name (not
attribute path) makes one profile fit the bare model, a PEFT/LoRA-wrapped one and any depth.

- norms: `replacements.norm_forward`, with the in-place backward only where every use of that
  norm instance (owner class + attribute name) is marked `in_place_safe` in the profile;
- MLPs: `replacements.mlp_forward`, after checking (`guards.py`) that the instance's activation
  module computes the profile's `hidden_act` (a profile made from another config is refused);
- MoE experts (stacked, SwiGLU, no bias): `replacements.experts_forward` (`ops.moe_experts`),
  which keeps one [tokens*top_k, 2I] tensor for the backward instead of five, after checking
  (`guards.py`) the instance's layout flags and that its act_fn computes silu; an experts
  class with its own clamped gate (GPT-OSS's `_apply_gate`) gets, instead, its `_apply_gate`
  replaced by `ops.swiglu_clamped` (an instance attribute too), once `guards.clamped_gate` has
  reproduced that gate on a sample input; the class's forward (or HF's grouped-mm path) calls it;
- RoPE: the attention class's own forward, re-created (`rebind.py`) with a globals dict in which
  the name it calls (`profile.rope.call_name`) is our kernel, bound to each attention instance;
  likewise each of `profile.rope.other_sites` (another class, its own function);
- the causal LM: `forward.causal_lm_forward` (fused linear cross-entropy when training).

A module that already carries an instance-level `forward` (another patcher, or accelerate's
mixed-precision wrapper on the causal LM) is left alone and listed in the record's `skipped`:
replacing it would drop that wrapper. Patch before `accelerator.prepare` / `Trainer.train`
(`KernelwrightCallback` does so from `on_init_end`).

Patching a patched model raises RuntimeError; call `unpatch` first. A patched model cannot be
pickled whole (`torch.save(model)`: the forwards are closures); save its state dict, which
patching never changes, or unpatch first.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import types
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import TrainerCallback

from kernelwright.integrations.transformers import guards, replacements
from kernelwright.integrations.transformers.forward import (
    NotStandardForward,
    causal_lm_forward,
    plan_causal_lm,
)
from kernelwright.integrations.transformers.rebind import rope_forward
from kernelwright.profiles.model import MLPDecision, ModelProfile
from kernelwright.runtime.checks import FLOAT_DTYPES

_RECORD = "_kernelwright_patch"  # instance attribute on the module `patch` was given
_LABEL = {"causal_lm": "fused_linear_cross_entropy"}  # a PatchedModule kind, as users know it
logger = logging.getLogger("kernelwright")


@dataclasses.dataclass
class PatchedModule:
    kind: str  # "norm", "mlp", "moe_experts", "rope", "causal_lm"
    name: str  # qualified name under the module `patch` was given ("" for itself)
    class_name: str
    module: torch.nn.Module
    forward: Callable  # the bound method installed
    detail: str = ""  # "in_place_backward=True", "swiglu/separate", ...
    attr: str = "forward"  # the instance attribute set ("_apply_gate" for a clamped gate)


@dataclasses.dataclass
class PatchRecord:
    """What `patch` did; kept on the model as `model._kernelwright_patch`."""

    profile: ModelProfile
    modules: list[PatchedModule] = dataclasses.field(default_factory=list)
    skipped: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (what, why)

    def count(self, kind: str) -> int:
        return sum(1 for p in self.modules if p.kind == kind)

    def patched(self) -> str:
        """'4 norm (LlamaRMSNorm), 2 mlp (LlamaMLP), ...': how many modules of which class."""
        counts = collections.Counter(
            (_LABEL.get(p.kind, p.kind), p.class_name) for p in self.modules
        )
        return ", ".join(f"{n} {kind} ({cls})" for (kind, cls), n in counts.items()) or "nothing"

    def summary(self) -> str:
        """What was patched, and each part left alone with the reason: a few readable lines."""
        p = self.profile
        lines = [f"kernelwright patched {p.architecture} ({p.model_type}): {self.patched()}"]
        lines += [f"  left alone: {what}: {why}" for what, why in self.skipped]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


# --------------------------------------------------------------------------- matching


def _class_name(module: torch.nn.Module) -> str:
    """The modeling class name, seen through FSDP2/replicate's dynamic wrapper classes."""
    cls = type(module)
    bases = cls.__bases__
    # fully_shard swaps the class for type(f"FSDP{name}", (FSDPModule, cls), {...})
    if (
        len(bases) == 2
        and bases[0].__module__.startswith("torch.distributed")
        and cls.__name__.endswith(bases[1].__name__)
    ):
        return bases[1].__name__
    return cls.__name__


def _modeling_class(module: torch.nn.Module, name: str) -> type:
    return next(c for c in type(module).__mro__ if c.__name__ == name)


def _hf_model(model: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face model inside a wrapper (PEFT's PeftModel/LoraModel), or model."""
    from transformers import PreTrainedModel

    return next((m for m in model.modules() if isinstance(m, PreTrainedModel)), model)


def _resolve_profile(model: torch.nn.Module, profile) -> ModelProfile:
    if profile is None:
        from kernelwright.integrations.transformers.analysis import analyze

        return analyze(_hf_model(model))
    if isinstance(profile, (str, Path)):
        return ModelProfile.load(profile)
    if isinstance(profile, ModelProfile):
        return profile
    raise TypeError(
        f"profile must be None, a ModelProfile or a path to its YAML, got {type(profile).__name__}"
    )


# --------------------------------------------------------------------------- patch / unpatch


def _check_dtype(model: torch.nn.Module) -> None:
    """Refuse a model whose floating parameters the kernels cannot take (float64): patching it
    would succeed and its first forward fail inside a kernel's argument check."""
    found = {p.dtype for p in model.parameters() if p.is_floating_point()}
    bad = sorted(str(d).removeprefix("torch.") for d in found - set(FLOAT_DTYPES))
    if bad:
        *first, last = (str(d).removeprefix("torch.") for d in FLOAT_DTYPES)
        names = f"{', '.join(first)} or {last}"
        raise TypeError(
            f"{type(model).__name__} has {' and '.join(bad)} parameters, but kernelwright's "
            f"kernels take {names} only: cast the model first (model.float(), or "
            "model.to(torch.bfloat16)) and patch it then"
        )


class _Patcher:
    def __init__(self, root: torch.nn.Module, profile: ModelProfile):
        self.root = root
        self.profile = profile
        self.record = PatchRecord(profile)
        self.names = {id(m): n for n, m in root.named_modules(remove_duplicate=False)}
        self.found: list[str] = []

    def skip(self, what: str, why: str, *, found: bool = False) -> None:
        # found: a reason discovered on this instance, not one the profile or a flag gave
        self.record.skipped.append((what, why))
        if found:
            self.found.append(f"{what}: {why}")

    def wrapped(self, kind: str, module, attr: str = "forward") -> bool:
        """True (and recorded) when the module's `attr` is already replaced on the instance."""
        if attr not in module.__dict__:
            return False
        self.skip(
            f"{kind} {self.names.get(id(module), '?')}",
            "it already has an instance-level forward (another wrapper); patch before "
            "other libraries wrap it",
            found=True,
        )
        return True

    def install(
        self, kind: str, module, fn: Callable, detail: str = "", attr: str = "forward"
    ) -> None:
        if self.wrapped(kind, module, attr):
            return
        fn.__kernelwright__ = kind  # is_patched recognises our forwards by this mark
        bound = types.MethodType(fn, module)
        setattr(module, attr, bound)
        name = self.names.get(id(module), "?")
        self.record.modules.append(
            PatchedModule(kind, name, _class_name(module), module, bound, detail, attr)
        )

    def norms(self, rms_norm: bool, layer_norm: bool) -> None:
        decisions = {}
        for d in self.profile.norms:
            what = f"norm {d.class_name}"
            if not d.patched:
                self.skip(what, f"{d.status}: {d.reason}")
            elif (d.kind == "rms_norm" and not rms_norm) or (
                d.kind == "layer_norm" and not layer_norm
            ):
                self.skip(what, f"{d.kind}=False")
            else:
                decisions[d.class_name] = d
        if not decisions:
            return
        # A norm instance may be reached through several (owner, attribute) pairs; the
        # in-place backward needs every one of them proven safe. Unknown owners (a PEFT
        # ModulesToSaveWrapper, a model the profile did not see) count as unsafe.
        found: dict[int, list] = {}
        for parent in self.root.modules():
            owner = _class_name(parent)
            for attr, child in parent.named_children():
                d = decisions.get(_class_name(child))
                if d is None:
                    continue
                safe = any(
                    u.owner_class == owner and u.attribute == attr and u.in_place_safe
                    for u in d.uses
                )
                entry = found.setdefault(id(child), [child, d, True])
                entry[2] = entry[2] and safe
        built: dict[tuple[str, bool], Callable] = {}
        for child, d, safe in found.values():
            key = (d.class_name, safe)
            if key not in built:
                built[key] = replacements.norm_forward(d, in_place_backward=safe)
            self.install("norm", child, built[key], f"in_place_backward={safe}")

    def mlps(self) -> None:
        decisions: dict[str, MLPDecision] = {}
        for d in self.profile.mlps:
            if d.patched:
                decisions[d.class_name] = d
            else:
                self.skip(f"mlp {d.class_name}", f"{d.status}: {d.reason}")
        built: dict[str, Callable] = {}
        for m in self.root.modules():
            d = decisions.get(_class_name(m))
            if d is None:
                continue
            why = guards.activation_matches(m, d.hidden_act)
            if why is not None:
                self.skip(f"mlp {self.names.get(id(m), '?')}", why, found=True)
                continue
            if d.class_name not in built:
                built[d.class_name] = replacements.mlp_forward(d)
            self.install("mlp", m, built[d.class_name], f"{d.activation}/{d.layout}")

    def moe_experts(self) -> None:
        d = self.profile.moe
        if d.status == "absent":
            return
        if not d.patched:
            self.skip("moe_experts", f"{d.status}: {d.reason}")
            return
        if d.expert_layout != "stacked" or not d.experts_class:
            self.skip(
                "moe_experts",
                f"expert_layout={d.expert_layout!r}: only stacked experts ([E, 2I, H] weights) "
                "are patched",
            )
            return
        gates: dict[tuple, Callable] = {}
        for m in self.root.modules():
            if _class_name(m) != d.experts_class:
                continue
            why = guards.experts_unsupported(m)
            if why is None:
                self.install("moe_experts", m, replacements.experts_forward, "swiglu/stacked")
                continue
            spec, evidence = guards.clamped_gate(m)
            if spec is None:
                self.skip(f"moe_experts {self.names.get(id(m), '?')}", why, found=True)
                continue
            key = (type(m), *spec.values())  # alpha/limit are read per instance
            gate = gates.get(key)
            if gate is None:
                gate = gates[key] = replacements.clamped_gate(spec)
            layout = "interleaved" if spec["interleaved"] else "halves"
            self.install("moe_experts", m, gate, f"swiglu_clamped/{layout}", attr="_apply_gate")

    def rope(self) -> None:
        d = self.profile.rope
        if not d.patched:
            self.skip("rope", f"{d.status}: {d.reason}")
            return
        # a site edited to unsupported in review is left alone on its own
        for s in d.other_sites:
            if not s.patched:
                self.skip(f"rope {s.attention_class}", f"{s.status}: {s.reason}")
        sites = [d, *(s for s in d.other_sites if s.patched)]
        if any(s.attention_class is None or s.call_name is None for s in sites):
            raise ValueError(
                f"profile {self.profile.architecture}: the rope decision is 'patch' but lacks "
                "attention_class or call_name; re-run the analyser or mark it unsupported"
            )
        # each site (attention class) gets its own function: DeepSeek-V3.2's MLA attention
        # and its indexer call different rotary functions
        site_of = {s.attention_class: s for s in sites}
        built: dict[type, Callable] = {}
        for m in self.root.modules():
            site = site_of.get(_class_name(m))
            if site is None:
                continue
            cls = _modeling_class(m, site.attention_class)
            if cls not in built:
                try:
                    built[cls] = rope_forward(cls, site)
                except NotStandardForward as e:
                    built[cls] = None
                    self.skip(f"rope {cls.__name__}", str(e), found=True)
            if built[cls] is not None:
                self.install("rope", m, built[cls], site.variant or "")

    def causal_lm(self) -> None:
        p = self.profile
        for label, d in (("output", p.output), ("logits", p.logits), ("lm_head", p.lm_head)):
            if d.status == "unsupported" or (label == "output" and not d.patched):
                self.skip("fused_linear_cross_entropy", f"{label} {d.status}: {d.reason}")
                return
        built: dict[type, Callable | None] = {}  # one generic forward per causal-LM class
        for m in self.root.modules():
            if _class_name(m) != p.output.causal_lm_class:
                continue
            cls = _modeling_class(m, p.output.causal_lm_class)
            if cls not in built:
                try:
                    built[cls] = causal_lm_forward(plan_causal_lm(cls, p))
                except NotStandardForward as e:
                    built[cls] = None
                    self.skip(f"fused_linear_cross_entropy {cls.__name__}", str(e), found=True)
            if built[cls] is not None:
                self.install("causal_lm", m, built[cls], p.output.output_class or "")

    def undo(self) -> None:
        for entry in reversed(self.record.modules):
            delattr(entry.module, entry.attr)


def _ours(module: torch.nn.Module) -> bool:
    for attr in ("forward", "_apply_gate"):
        fn = getattr(module.__dict__.get(attr), "__func__", None)
        if getattr(fn, "__kernelwright__", None) is not None:
            return True
    return False


def is_patched(model: torch.nn.Module) -> bool:
    """True when `patch` was applied to `model`, to a module inside it, or to one around it
    (then some of its modules carry our forwards)."""
    return any(_RECORD in m.__dict__ or _ours(m) for m in model.modules())


def patch_record(model: torch.nn.Module) -> PatchRecord | None:
    """The PatchRecord of the patch applied to `model` itself (None if it was not patched)."""
    return model.__dict__.get(_RECORD)


def patch(
    model: torch.nn.Module,
    profile: ModelProfile | str | Path | None = None,
    *,
    rms_norm: bool = True,
    layer_norm: bool = True,
    rope: bool = True,
    mlp: bool = True,
    moe_experts: bool = True,
    fused_linear_cross_entropy: bool = True,
) -> ModelProfile:
    """Patch `model` (a HF causal LM or image-text-to-text model, bare or PEFT-wrapped) in place
    with kernelwright kernels. In a VLM, the text decoder, the loss of its
    `*ForConditionalGeneration` head and the norm/MLP classes of its vision tower are patched.

    Args:
        model: the module to patch; every submodule whose class the profile names is patched.
        profile: a ModelProfile, a path to its YAML, or None to run the analyser on `model`.
        rms_norm, layer_norm, rope, mlp: patch those parts (decisions marked "unsupported" or
            "absent" in the profile are never applied).
        moe_experts: replace the forward of stacked SwiGLU experts (profile.moe "stacked") with
            `kernelwright.ops.moe_experts`: the same math, ~1/4 of the activation memory.
        fused_linear_cross_entropy: compute the training loss without materialising logits;
            the output's `logits` is then None (labels given and grad enabled only).

    Returns the profile applied. What was patched and what was skipped (and why) is logged as
    one line (logger "kernelwright", INFO) and kept in
    `kernelwright.integrations.transformers.patch_record(model)` (print it for a summary).

    Raises RuntimeError when `model` (or a module inside it) is already patched, TypeError when
    its floating parameters are not float32, float16 or bfloat16 (float64), ValueError when the
    profile does not belong to this model or lacks a field a "patch" decision needs.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"patch expects a torch.nn.Module, got {type(model).__name__}")
    if is_patched(model):
        raise RuntimeError(
            f"{type(model).__name__} is already patched by kernelwright; call "
            "kernelwright.unpatch(model) before patching it again"
        )
    _check_dtype(model)
    profile = _resolve_profile(model, profile)
    classes = {_class_name(m) for m in model.modules()}
    wanted = {profile.output.causal_lm_class, profile.architecture, profile.decoder.class_name}
    if not classes & wanted:
        raise ValueError(
            f"the profile is for {profile.architecture} ({profile.model_type}) but "
            f"{type(model).__name__} has no {sorted(wanted)} module; analyse this model "
            "(kernelwright autopatch) or pass its own profile"
        )
    p = _Patcher(model, profile)
    try:
        p.norms(rms_norm, layer_norm)
        if mlp:
            p.mlps()
        else:
            p.skip("mlp", "mlp=False")
        if moe_experts:
            p.moe_experts()
        elif profile.moe.status != "absent":
            p.skip("moe_experts", "moe_experts=False")
        if rope:
            p.rope()
        else:
            p.skip("rope", "rope=False")
        if fused_linear_cross_entropy:
            p.causal_lm()
        else:
            p.skip("fused_linear_cross_entropy", "fused_linear_cross_entropy=False")
    except BaseException:
        p.undo()  # all or nothing: a half-patched model is worse than either
        raise
    model.__dict__[_RECORD] = p.record
    left = "; ".join(f"{what} ({why})" for what, why in p.record.skipped) or "nothing"
    logger.info(
        "kernelwright.patch %s: patched %s; left alone: %s",
        type(model).__name__,
        p.record.patched(),
        left,
    )
    if p.found:
        # the profile said "patch" but this instance could not take it: say so, once
        warnings.warn(
            f"kernelwright.patch left {len(p.found)} part(s) of {type(model).__name__} "
            f"unpatched: {'; '.join(p.found[:4])}",
            stacklevel=2,
        )
    return profile


def unpatch(model: torch.nn.Module) -> ModelProfile:
    """Undo `patch` on `model` (or on the modules inside it that were patched).

    Deletes the instance-level forwards patch set, so every module runs its class's forward
    again: outputs are bit-identical to a never-patched model and the state dict never
    changed. Returns the profile that had been applied.
    """
    owners = [m for m in model.modules() if _RECORD in m.__dict__]
    if not owners:
        if is_patched(model):
            raise ValueError(
                f"{type(model).__name__} was patched as part of an enclosing module; call "
                "unpatch on the module that was given to patch"
            )
        raise ValueError(f"{type(model).__name__} is not patched by kernelwright (nothing to undo)")
    records: list[PatchRecord] = [m.__dict__[_RECORD] for m in owners]
    replaced = [
        e.name for r in records for e in r.modules if e.module.__dict__.get(e.attr) is not e.forward
    ]
    if replaced:
        raise RuntimeError(
            f"the forward of {replaced[:4]} was replaced after kernelwright patched it (by "
            "another wrapper); unpatching would drop that wrapper too. Unwrap it first"
        )
    for r in records:
        for e in reversed(r.modules):
            delattr(e.module, e.attr)
    for m in owners:
        del m.__dict__[_RECORD]
    return records[0].profile


def from_pretrained(
    name_or_path: str | Path,
    *args,
    profile: ModelProfile | str | Path | None = None,
    patch_kwargs: dict | None = None,
    **kwargs,
) -> torch.nn.Module:
    """AutoModelForCausalLM.from_pretrained(name_or_path, *args, **kwargs), then patch it; a
    checkpoint of an image-text-to-text type that is no causal LM loads with
    AutoModelForImageTextToText (the VLM: its text decoder and vision tower are patched).

    `patch_kwargs` go to `patch` (rms_norm=False, ...); the profile defaults to the analyser's.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    )

    auto = AutoModelForCausalLM
    config = kwargs.get("config")
    if config is None:
        hub = ("trust_remote_code", "revision", "token", "cache_dir", "local_files_only")
        config = AutoConfig.from_pretrained(
            name_or_path, **{k: v for k, v in kwargs.items() if k in hub}
        )
    model_type = getattr(config, "model_type", None)
    if (
        model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        and model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
    ):
        auto = AutoModelForImageTextToText
    model = auto.from_pretrained(name_or_path, *args, **kwargs)
    patch(model, profile, **(patch_kwargs or {}))
    return model


class KernelwrightCallback(TrainerCallback):
    """Patch the Trainer's model (transformers Trainer, TRL's SFTTrainer, ...).

        trainer = Trainer(model, args, ..., callbacks=[KernelwrightCallback()])

    Given to the constructor, it patches in `on_init_end`, before the Trainer hands the model to
    accelerate, so accelerate's mixed-precision wrapper wraps the patched forward. Added later
    (`trainer.add_callback`), it patches in `on_train_begin`; a forward that accelerate already
    wrapped then keeps its original loss (see `patch_record(model).skipped`). A model that is
    already patched is left as it is. `unpatch_on_end=True` restores the model after training.
    """

    def __init__(
        self,
        profile: ModelProfile | str | Path | None = None,
        *,
        unpatch_on_end: bool = False,
        **patch_kwargs,
    ):
        self.profile = profile
        self.unpatch_on_end = unpatch_on_end
        self.patch_kwargs = patch_kwargs
        self.applied: ModelProfile | None = None

    def _patch(self, model) -> None:
        if model is not None and not is_patched(model):
            self.applied = patch(model, self.profile, **self.patch_kwargs)

    def on_init_end(self, args, state, control, model=None, **kwargs):
        self._patch(model)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._patch(model)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if self.unpatch_on_end and model is not None and is_patched(model):
            unpatch(model)
