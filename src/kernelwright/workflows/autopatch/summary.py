"""One line per decision of a ModelProfile: what, status, value, evidence count, reason.

The CLI prints these as a table; reports and reviews can use the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernelwright.profiles.model import ModelProfile


@dataclass(frozen=True)
class Row:
    what: str
    status: str
    value: str
    evidence: int
    reason: str


def _norm_value(n) -> str:
    if n.kind is None:
        return ""
    head = n.kind + (f" {n.casting_mode}" if n.casting_mode else "")
    head += f" offset={n.offset:g} eps={n.eps_attribute}"
    uses = ", ".join(
        f"{u.attribute}({u.role}{', in-place' if u.in_place_safe else ''})" for u in n.uses
    )
    return f"{head}; {uses}" if uses else head


def _mlp_value(m) -> str:
    if m.layout is None:
        return ""
    if m.layout == "fused_gate_up":
        proj = f"{m.gate_up_attribute}->{m.down_attribute}"
    elif m.layout == "separate":
        proj = f"{m.gate_attribute},{m.up_attribute}->{m.down_attribute}"
    else:
        proj = f"{m.up_attribute}->{m.down_attribute}"
    return f"{m.activation or m.hidden_act} {m.layout} {proj}"


def rows(profile: ModelProfile) -> list[Row]:
    """The table of decisions, in the profile's order."""
    p = profile
    out = [
        Row(f"norm {n.class_name}", n.status, _norm_value(n), len(n.evidence), n.reason)
        for n in p.norms
    ]
    d = p.decoder
    layers = "; ".join(f"{k}: {', '.join(v)}" for k, v in d.norm_attributes.items())
    out.append(
        Row(
            f"decoder {d.class_name}",
            d.status,
            f"{d.num_layers} x {d.layers_attribute}; {layers}",
            len(d.evidence),
            d.reason,
        )
    )
    out += [
        Row(f"mlp {m.class_name}", m.status, _mlp_value(m), len(m.evidence), m.reason)
        for m in p.mlps
    ]
    moe = p.moe
    moe_value = (
        f"{moe.block_class}: {moe.num_experts} experts ({moe.expert_layout}), top-{moe.top_k}"
        f"{', aux ' + moe.aux_loss_function if moe.aux_loss_function else ''}"
        if moe.is_moe
        else "dense"
    )
    out.append(Row("moe", moe.status, moe_value, len(moe.evidence), moe.reason))
    out += [
        Row(f"component {c.name}", c.status, c.class_name, len(c.evidence), c.reason)
        for c in p.components
    ]
    r = p.rope
    sites = []
    for site in [r, *r.other_sites]:
        if site.call_name:
            value = f"{site.call_name} in {site.attention_class}: {site.variant or '?'}"
            if site.partial_rotary_factor != 1.0:
                value += f", partial {site.partial_rotary_factor:g}"
            sites.append(value)
    n_evidence = len(r.evidence) + sum(len(s.evidence) for s in r.other_sites)
    out.append(Row("rope", r.status, "; ".join(sites), n_evidence, r.reason))
    o = p.output
    out.append(
        Row(
            "output",
            o.status,
            f"{o.causal_lm_class} -> {o.output_class}; self.{o.base_model_attribute}."
            f"{o.hidden_state_field}, self.{o.lm_head_attribute}, vocab {o.vocab_size}",
            len(o.evidence),
            o.reason,
        )
    )
    lg = p.logits
    parts = []
    if lg.scale_op:
        parts.append(f"{lg.scale_op} by {lg.scale:g} ({lg.scale_config_key})")
    if lg.softcap is not None:
        parts.append(f"softcap {lg.softcap:g} ({lg.softcap_config_key})")
    out.append(Row("logits", lg.status, "; ".join(parts), len(lg.evidence), lg.reason))
    h = p.lm_head
    head_value = ("tied" if h.tied else "separate") + (", bias" if h.bias else "")
    out.append(Row("lm_head", h.status, head_value, len(h.evidence), h.reason))
    return out
