"""LossProfile: what `kernelwright losses new` read from a loss written on full logits, and
what it will generate from it (reviewed as YAML between the two)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from kernelwright.profiles.base import Strict, YamlProfile


class LossInput(Strict):
    """One argument of the loss function."""

    name: str
    role: Literal["logits", "tensor", "constant"]
    shape: list[int] = Field(default_factory=list)
    dtype: str = ""


class LogprobSite(Strict):
    """log_softmax(logits / temperature, -1) gathered at one index: a per-token log-prob the
    generated loss takes from fused_linear_logprobs instead."""

    node: str  # the traced node the log-probs replace (the gather, or the squeeze after it)
    target: str  # the traced node whose values are the gathered token ids
    temperature: float = 1.0
    keepdim: bool = False  # the gather's trailing size-1 dim is kept (no squeeze after it)


class EntropySite(Strict):
    """-(softmax(z) * log_softmax(z)).sum(-1), z = logits / temperature: each token's entropy,
    which the generated loss takes from fused_linear_logprobs(..., return_entropy=True)."""

    node: str  # the traced node the entropy replaces (the sum, or a negation after it)
    temperature: float = 1.0
    negated: bool = False  # the node holds minus the entropy (sum p log p)
    over: Literal["token", "all"] = "token"  # each token's, or summed over every token too
    keepdim: bool = False  # the sum keeps the vocabulary's dim (size 1)


class LossProfile(YamlProfile):
    REGENERATE: ClassVar[str] = "kernelwright losses new"

    schema_version: int = 1
    name: str
    source: str
    logits_arg: str
    vocab: int
    inputs: list[LossInput]
    sites: list[LogprobSite] = Field(default_factory=list)
    entropies: list[EntropySite] = Field(default_factory=list)
    # the reductions the loss applies after the log-probs (for the reviewer; informational)
    reductions: list[str] = Field(default_factory=list)
    # why the loss cannot be expressed on the primitive; generation stops when set
    stop: str | None = None
