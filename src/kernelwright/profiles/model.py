"""ModelProfile: autopatch's decision matrix for one Hugging Face causal-LM architecture.

The analyser (`kernelwright.integrations.transformers.analysis`) writes it; a person reviews
the YAML; the patcher (`kernelwright.integrations.transformers.patch`) applies it. Every decision
carries the evidence that fixed it (a source line of the modeling file, a config key, or a
numerical check on a tiny instance). A decision the analyser could not establish has status
"unsupported" and a reason, and the patcher leaves that part of the model as it is: a wrong
patch silently ruins a training run, an unpatched module only misses a speed-up.

The patcher matches modules by class name (never by attribute path), so one profile applies to
the bare model, a PEFT/LoRA-wrapped one and any number of layers.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from kernelwright.profiles.base import Strict, YamlProfile

SCHEMA_VERSION = 1

# "patch": established with evidence, the patcher applies it.
# "unsupported": the analyser could not prove it (reason says why); left as it is.
# "absent": the model has no such component (no evidence needed beyond the search).
Status = Literal["patch", "unsupported", "absent"]


class Evidence(Strict):
    """Where a decision came from."""

    source: str  # "transformers/models/llama/modeling_llama.py:64", "config:hidden_act", "check"
    detail: str  # the source line, the config value, or what a numerical check measured


class Decision(Strict):
    status: Status = "patch"
    reason: str = ""  # why; required when unsupported
    evidence: list[Evidence] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unsupported_needs_reason(self):
        if self.status == "unsupported" and not self.reason.strip():
            raise ValueError(
                "an 'unsupported' decision needs a reason: one sentence on why it is left alone"
            )
        return self

    @property
    def patched(self) -> bool:
        return self.status == "patch"


NormRole = Literal[
    "input",  # before attention (pre-norm)
    "post_attention",  # after attention: pre-MLP in pre-norm models, on the output in post-norm
    "pre_feedforward",
    "post_feedforward",
    "final",  # the base model's last norm
    "q_norm",
    "k_norm",
    "other",
]


class NormUse(Strict):
    """One norm attribute as a module uses it."""

    attribute: str  # attribute name on its owner ("input_layernorm", "q_norm", "norm")
    owner_class: str  # class that owns and calls it ("LlamaDecoderLayer", "LlamaModel")
    role: NormRole
    # True when the norm's output feeds only further computation, so its backward may write dx
    # over dy; False when the output also joins a residual sum (post-norm/sandwich layouts), whose
    # gradient tensor other branches still read.
    in_place_safe: bool = False
    evidence: list[Evidence] = Field(default_factory=list)


class NormDecision(Decision):
    """One norm class (1–3): type, casting mode and weight offset, and where it is used (12)."""

    class_name: str
    kind: Literal["rms_norm", "layer_norm"] | None = None
    # rms_norm only: "llama" casts x_hat to the input dtype before the weight multiply,
    # "gemma" multiplies in fp32 then casts, "none" never leaves the input dtype.
    casting_mode: Literal["llama", "gemma", "none"] | None = None
    offset: float = 0.0  # the scale is (offset + weight); 1.0 for zero-initialised weights
    eps_attribute: str | None = None  # "variance_epsilon", "eps"
    weight_attribute: str | None = "weight"
    bias_attribute: str | None = None  # layer_norm with a bias
    uses: list[NormUse] = Field(default_factory=list)
    # non-text components (vision tower, projector) holding instances of this class: the model
    # check confirms the class there only when its batch runs them (images)
    components: list[str] = Field(default_factory=list)


class DecoderDecision(Decision):
    """The decoder layer class and the norm attributes of each layer (12)."""

    class_name: str
    layers_attribute: str = "layers"  # on the base model
    num_layers: int = 0
    # attribute names of the norms each layer owns, in call order; layers with identical
    # attributes are grouped as "first-last" index ranges
    norm_attributes: dict[str, list[str]] = Field(default_factory=dict)


MLPActivation = Literal["swiglu", "geglu_tanh", "geglu_erf", "relu_squared"]


class MLPDecision(Decision):
    """One MLP class (5): activation and layout, and the projection attribute names."""

    class_name: str
    activation: MLPActivation | None = None
    layout: Literal["separate", "fused_gate_up", "non_gated"] | None = None
    gate_attribute: str | None = None  # separate layout
    up_attribute: str | None = None  # separate and non-gated layouts
    gate_up_attribute: str | None = None  # fused layout: [gate | up] along the last dim
    down_attribute: str | None = None
    hidden_act: str | None = None  # the config value the activation was resolved from
    components: list[str] = Field(default_factory=list)  # as NormDecision.components


class MoEDecision(Decision):
    """Dense vs mixture-of-experts (6). Status "absent" for dense models."""

    is_moe: bool = False
    block_class: str | None = None  # the sparse block ("MixtralSparseMoeBlock")
    expert_layout: Literal["module_list", "stacked"] | None = None
    experts_class: str | None = None
    num_experts: int | None = None
    top_k: int | None = None
    # the function the causal-LM forward calls for the router auxiliary loss, if any
    aux_loss_function: str | None = None


class ComponentDecision(Decision):
    """A non-text component (7): vision tower, audio encoder, projector. Not patched as a whole:
    the norm and MLP classes inside a vision tower or projector have their own decisions."""

    name: str  # attribute path on the model
    class_name: str


class RopeDecision(Decision):
    """The rotary embedding the attention really calls (8).

    One decision per model: the fields describe the first attention class (by name) whose
    forward calls a rotary function; `other_sites` holds one decision of the same shape for each
    further class (DeepSeek-V3.2's indexer, which calls a half-split function beside MLA's
    interleaved one). The rope is patched only where every site is proven; the patcher applies
    each site to its own class."""

    attention_class: str | None = None
    function: str | None = None  # "transformers.models.llama.modeling_llama.apply_rotary_pos_emb"
    call_name: str | None = None  # the global name the attention forward calls
    # deinterleave: interleaved pairs in, half-split out (DeepSeek-V3's rope_interleave);
    # half_table: half-split with cos/sin one angle a pair, [.., R/2] (GPT-OSS)
    variant: Literal["half_split", "interleaved", "deinterleave", "half_table"] | None = None
    partial_rotary_factor: float = 1.0
    unsqueeze_dim: int = 1
    other_sites: list[RopeDecision] = Field(default_factory=list)


class OutputDecision(Decision):
    """The causal-LM class, its output class and how the final hidden state is reached (9)."""

    causal_lm_class: str
    output_class: str | None = None  # "CausalLMOutputWithPast", "MoeCausalLMOutputWithPast"
    base_model_attribute: str | None = None  # "model"
    hidden_state_field: str = "last_hidden_state"
    lm_head_attribute: str | None = "lm_head"
    vocab_size: int | None = None
    ignore_index: int = -100


class LogitsDecision(Decision):
    """Logit soft-capping and scaling (10): logits = softcap * tanh(scale(z) / softcap)."""

    softcap: float | None = None
    softcap_config_key: str | None = None
    # z * scale ("multiply") or z / scale ("divide"); None when the model does neither
    scale_op: Literal["multiply", "divide"] | None = None
    scale: float | None = None
    scale_config_key: str | None = None


class LMHeadDecision(Decision):
    """Tied or separate lm-head (11)."""

    tied: bool = False
    bias: bool = False


class ModelProfile(YamlProfile):
    """The reviewed decisions for one architecture; YAML on disk."""

    REGENERATE: ClassVar[str] = "kernelwright autopatch"

    schema_version: int = SCHEMA_VERSION
    model_type: str
    architecture: str  # the causal-LM class
    transformers_version: str
    modeling_file: str  # relative to the transformers package, or the path given
    config_source: str  # "model_type:llama", a config.json path, a modeling file path
    norms: list[NormDecision] = Field(default_factory=list)
    decoder: DecoderDecision
    mlps: list[MLPDecision] = Field(default_factory=list)
    moe: MoEDecision
    components: list[ComponentDecision] = Field(default_factory=list)
    rope: RopeDecision
    output: OutputDecision
    logits: LogitsDecision
    lm_head: LMHeadDecision
    notes: list[str] = Field(default_factory=list)

    def __repr__(self) -> str:
        # one line, not every field of every decision: the YAML (`to_yaml()`) holds those
        left = len(self.unsupported())
        return (
            f"ModelProfile({self.model_type}: {self.architecture}, {len(self._decisions())} "
            f"decisions, {left} left alone; to_yaml() for all of them)"
        )

    def unsupported(self) -> list[tuple[str, str]]:
        """(what, why) for every decision the patcher will leave alone."""
        out = []
        for label, d in self._decisions():
            if d.status == "unsupported":
                out.append((label, d.reason))
        return out

    def _decisions(self) -> list[tuple[str, Decision]]:
        items: list[tuple[str, Decision]] = [(f"norm {n.class_name}", n) for n in self.norms]
        items.append((f"decoder {self.decoder.class_name}", self.decoder))
        items += [(f"mlp {m.class_name}", m) for m in self.mlps]
        items.append(("moe", self.moe))
        items += [(f"component {c.name}", c) for c in self.components]
        items += [("rope", self.rope), ("output", self.output), ("logits", self.logits)]
        items.append(("lm_head", self.lm_head))
        return items
