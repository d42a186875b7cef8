"""The analyser that autopatch and `patch(model)` run: a HF causal LM or image-text-to-text
model (its `*ForConditionalGeneration`) in, a ModelProfile out.

    profile = analyze("qwen3")                 # a model type, a directory / config.json,
    profile = analyze(model)                   # a modeling_*.py, a PretrainedConfig, a model
    profile.save("profile.yaml")

The analyser builds a tiny CPU instance of the architecture (no weights are downloaded), reads
the source of the classes it holds (`ast` of their forwards, their `__init__` and the module
globals they call) and the config, and writes one decision per component with the evidence
that fixed it. Every "patch" decision for a norm, an MLP or the RoPE function is then confirmed
numerically (`checks.py`): the original module against exactly what the patcher will run. Last,
the whole tiny model patched with the profile is compared with itself unpatched in train() and
eval() (`parity.py`), on a batch with images where the model takes them (`pixels.py`): what
fails there is demoted too. Anything not proven is "unsupported" with the reason; the patcher
leaves it alone.

In a VLM the text decoder is analysed as a causal LM's; the norm and MLP classes of the vision
tower and projector get their own decisions (vision config for the activation), confirmed by
the model check only where its batch runs them; audio towers are listed and left alone.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable

import torch
from torch import nn

from kernelwright.integrations.transformers.analysis import checks as C
from kernelwright.integrations.transformers.analysis import source as S
from kernelwright.integrations.transformers.analysis.context import Context, text_config
from kernelwright.integrations.transformers.analysis.load import build_tiny, resolve
from kernelwright.integrations.transformers.analysis.mlp import analyze_mlp_class
from kernelwright.integrations.transformers.analysis.norms import analyze_norm_class
from kernelwright.integrations.transformers.analysis.output import (
    analyze_lm_head,
    analyze_logits,
    analyze_output,
)
from kernelwright.integrations.transformers.analysis.rope import analyze_rope, rotary_tables
from kernelwright.integrations.transformers.analysis.uses import CallGraph, norm_use
from kernelwright.profiles.model import (
    ComponentDecision,
    DecoderDecision,
    MLPDecision,
    ModelProfile,
    MoEDecision,
    NormDecision,
    RopeDecision,
)

# non-text parts by class or attribute name; the text path never holds these words
_COMPONENT = re.compile(r"vision|visual|image|audio|speech|projector|siglip|whisper", re.I)
# components whose norms and MLPs are not analysed: no check batch runs them (no audio inputs)
_AUDIO = re.compile(r"audio|speech|whisper", re.I)
_NUM_EXPERTS_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
_TOP_K_KEYS = ("num_experts_per_tok", "top_k", "moe_topk")


def analyze(source, *, check: bool = True) -> ModelProfile:
    """The ModelProfile of `source`; see the module docstring for what `source` may be.

    check: run the numerical checks (default). Without them every decision rests on source and
    config evidence alone; do not patch from an unchecked profile without reviewing it.
    """
    # The tiny instance and the check inputs are built on the CPU and moved explicitly; a
    # caller's default-device context (`with torch.device("cuda")`) must not leak into them.
    # Building the tiny instance and the checks draw from torch's generators (the CPU's, and a
    # GPU's where a check runs there): fork them, so that a patched training run draws the same
    # dropout masks and shuffles as an unpatched one.
    gpus = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=gpus), torch.device("cpu"):
        return _analyze(source, check=check)


def _analyze(source, *, check: bool) -> ModelProfile:
    import transformers

    target = resolve(source)
    tiny, _tiny_cfg, notes = build_tiny(target.model_cls, target.config)
    text_cfg = text_config(target.config)
    prefix = ""
    if text_cfg is not target.config:
        prefix = next(
            (f"{k}." for k, v in vars(target.config).items() if v is text_cfg), "text_config."
        )
    ctx = Context(target, tiny, text_cfg, prefix, notes=[*target.notes, *notes])

    components = _components(ctx)
    skip = tuple(f"{c.name}." for c in components)
    ctx.modules = {
        p: m
        for p, m in tiny.named_modules()
        if p and not (p.startswith(skip) or p in {c.name for c in components})
    }
    ctx.component_modules = {
        p: m
        for c in components
        if not _AUDIO.search(c.name) and not _AUDIO.search(c.class_name)
        for p, m in tiny.named_modules()
        if p == c.name or p.startswith(f"{c.name}.")
    }
    ctx.text_model_path = _text_model_path(tiny)

    rope, attention_classes, rope_fns = analyze_rope(ctx)
    norms = _norms(ctx)
    mlps = _mlps(ctx)
    moe = _moe(ctx)
    decoder = _decoder(ctx, norms, attention_classes)
    graph = CallGraph(
        attention_classes=attention_classes,
        mlp_classes={m.class_name for m in mlps} | {moe.block_class} - {None},
        proven_mlp_classes={m.class_name for m in mlps if m.layout}
        | {moe.block_class if moe.status == "patch" else None} - {None},
        norm_classes={n.class_name for n in norms},
        rope_call=rope.call_name,
    )
    _norm_uses(ctx, norms, decoder, graph)
    _shared_with_components(ctx, components, [*norms, *mlps])
    output = analyze_output(ctx)
    logits = analyze_logits(ctx, output)
    lm_head = analyze_lm_head(ctx)

    if check:
        _run_checks(ctx, norms, mlps, rope, rope_fns)
    else:
        ctx.notes.append("numerical checks skipped (check=False): decisions rest on source only")

    profile = ModelProfile(
        model_type=target.model_type,
        architecture=target.model_cls.__name__,
        transformers_version=transformers.__version__,
        modeling_file=target.modeling_file,
        config_source=target.config_source,
        norms=norms,
        decoder=decoder,
        mlps=mlps,
        moe=moe,
        components=components,
        rope=rope,
        output=output,
        logits=logits,
        lm_head=lm_head,
        notes=ctx.notes,
    )
    if check:
        _confirm_model(ctx, profile)
    return profile


# ----------------------------------------------------------------------------- structure


def _text_model_path(model: nn.Module) -> str:
    """Path of the module that owns the input embedding (the text decoder stack)."""
    emb = model.get_input_embeddings()
    for path, m in model.named_modules():
        if any(child is emb for child in m.children()):
            return path
    raise ValueError(f"{type(model).__name__}: input embedding owner not found")


def _components(ctx: Context) -> list[ComponentDecision]:
    """Top-most non-text modules (vision tower, audio encoder, projector): never patched."""
    model = ctx.target.instance or ctx.tiny
    text = _text_model_path(model)
    out: list[ComponentDecision] = []
    for path, m in model.named_modules():
        if not path or any(path.startswith(c.name + ".") for c in out):
            continue
        if text == path or text.startswith(path + "."):
            continue  # holds the text decoder (Whisper's decoder wrapper): not a component
        last = path.rsplit(".", 1)[-1]
        if _COMPONENT.search(last) or _COMPONENT.search(type(m).__name__):
            evidence = []
            for key, value in vars(ctx.target.config).items():
                sub_config = key.endswith("_config") and key != "text_config" and value is not None
                if sub_config and _COMPONENT.search(key):
                    evidence.append(S.config_evidence(key, type(value).__name__))
            found = S.class_node(type(m))
            if found is not None:
                evidence.append(S.evidence(found[1], found[0]))
            out.append(
                ComponentDecision(
                    name=path,
                    class_name=type(m).__name__,
                    status="unsupported",
                    reason="non-text component: only its norm and MLP classes are patched "
                    "(each with its own decision, confirmed where the check batch runs it); "
                    "its attention, convolutions and rotary embedding are left as they are",
                    evidence=evidence,
                )
            )
    return out


def _shared_with_components(ctx: Context, components, decisions) -> None:
    """Record on each norm/MLP decision the components holding its class (the patcher matches
    by class, so it replaces them there too), and note the text classes among them."""
    model = ctx.target.instance or ctx.tiny
    text = {type(m).__name__ for m in ctx.modules.values()}
    for c in components:
        inside = {type(m).__name__ for m in model.get_submodule(c.name).modules()}
        for d in decisions:
            if d.class_name not in inside:
                continue
            d.components.append(c.name)
            if d.status == "patch" and d.class_name in text:
                ctx.notes.append(
                    f"{d.class_name} is also used inside {c.name}; patching by class replaces "
                    "it there too (same math; the model check runs it there when its batch "
                    "has images)"
                )


# ----------------------------------------------------------------------------- norms (1-4, 12)


def _norms(ctx: Context) -> list[NormDecision]:
    out = []
    for _name, found in ctx.classes(components=True).items():
        d = analyze_norm_class(found[0][1])
        if d is not None:
            out.append(d)
    return out


def _owner_kind(ctx: Context, owner_path: str, owner: nn.Module, decoder: DecoderDecision, graph):
    if owner_path == ctx.text_model_path:
        return "base"
    if type(owner).__name__ == decoder.class_name:
        return "decoder"
    if type(owner).__name__ in graph.attention_classes:
        return "attention"
    return "other"


def _norm_uses(ctx: Context, norms: list[NormDecision], decoder: DecoderDecision, graph) -> None:
    by_class = {n.class_name: n for n in norms}
    seen: set[tuple[str, str]] = set()
    for path, m in {**ctx.modules, **ctx.component_modules}.items():
        d = by_class.get(type(m).__name__)
        if d is None:
            continue
        owner_path, _, attr = path.rpartition(".")
        owner = ctx.tiny.get_submodule(owner_path) if owner_path else ctx.tiny
        key = (type(owner).__name__, attr)
        if key in seen:
            continue
        seen.add(key)
        kind = _owner_kind(ctx, owner_path, owner, decoder, graph)
        d.uses.append(norm_use(owner, attr, kind, graph))


# ----------------------------------------------------------------------------- decoder (12)


def _decoder(ctx: Context, norms: list[NormDecision], attention: set[str]) -> DecoderDecision:
    text = ctx.tiny.get_submodule(ctx.text_model_path) if ctx.text_model_path else ctx.tiny
    n_tiny = getattr(text_config(ctx.tiny.config), "num_hidden_layers", None)

    def score(item) -> tuple:
        # the decoder stack: one entry per layer, each holding an attention module
        name, child = item
        has_attn = any(type(m).__name__ in attention for m in child[0].modules())
        return (has_attn, len(child) == n_tiny, name in ("layers", "h", "blocks"), len(child))

    lists = [
        (n, c) for n, c in text.named_children() if isinstance(c, nn.ModuleList) and len(c) > 0
    ]
    layers_attr, layers = max(lists, key=score) if lists else (None, None)
    n_layers = ctx.cfg("num_hidden_layers")
    if layers is None:
        return DecoderDecision(
            class_name="?",
            status="unsupported",
            reason=f"no ModuleList of decoder layers on {type(text).__name__}",
        )
    cls = type(layers[0])
    base_prefix = ctx.text_model_path.split(".")[0]
    rel = ctx.text_model_path
    if rel == base_prefix:
        rel_attr = layers_attr
    elif rel.startswith(base_prefix + "."):
        rel_attr = f"{rel[len(base_prefix) + 1 :]}.{layers_attr}"
    else:
        rel_attr = f"{rel}.{layers_attr}" if rel else layers_attr
    found = S.class_node(cls)
    evidence = [S.evidence(found[1], found[0])] if found else []
    evidence.append(ctx.cfg_ev("num_hidden_layers"))
    d = DecoderDecision(
        class_name=cls.__name__,
        layers_attribute=rel_attr,
        num_layers=int(n_layers or len(layers)),
        evidence=evidence,
    )
    norm_classes = {n.class_name for n in norms}
    # the caller's own instance has every layer; the tiny one keeps one of each layer kind
    real = ctx.target.instance
    source_layers = layers
    if real is not None:
        real_text = real.get_submodule(ctx.text_model_path) if ctx.text_model_path else real
        source_layers = getattr(real_text, layers_attr, layers)
    per_layer = [_layer_norm_attrs(layer, norm_classes) for layer in source_layers]
    if real is None and len(set(map(tuple, per_layer))) == 1 and d.num_layers > len(per_layer):
        d.norm_attributes = {f"0-{d.num_layers - 1}": per_layer[0]}
        d.evidence.append(
            S.check_evidence(
                f"the {len(per_layer)} tiny layers (one per layer kind) hold the same norms"
            )
        )
    else:
        d.norm_attributes = _group(per_layer)
    return d


def _layer_norm_attrs(layer: nn.Module, norm_classes: set[str]) -> list[str]:
    fwd = S.method(type(layer), "forward")
    order = {a: i for i, (a, _) in enumerate(S.self_calls(fwd.node))} if fwd else {}
    names = [p for p, m in layer.named_modules() if p and type(m).__name__ in norm_classes]
    return sorted(names, key=lambda p: (order.get(p.split(".")[0], 10**6), names.index(p)))


def _group(per_layer: list[list[str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    start = 0
    for i in range(1, len(per_layer) + 1):
        if i == len(per_layer) or per_layer[i] != per_layer[start]:
            key = f"{start}-{i - 1}" if i - 1 > start else str(start)
            out[key] = per_layer[start]
            start = i
    return out


# ----------------------------------------------------------------------------- MLP, MoE (5, 6)


def _mlps(ctx: Context) -> list[MLPDecision]:
    out = []
    for _name, found in ctx.classes(components=True).items():
        path, module = found[0]
        d = analyze_mlp_class(module, _config_of(ctx, path))
        if d is not None:
            out.append(d)
    return out


def _config_of(ctx: Context, path: str):
    """The config a module was built from: the text config on the text path, in a component
    the `config` of the nearest enclosing model (the vision tower's vision_config)."""
    if path in ctx.modules:
        return ctx.text_config
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        cfg = getattr(ctx.tiny.get_submodule(".".join(parts[:i])), "config", None)
        if cfg is not None:
            return cfg
    return ctx.text_config


def _first_key(ctx: Context, keys: Iterable[str]) -> tuple[str | None, int | None]:
    for k in keys:
        v = ctx.cfg(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return k, v
    return None, None


def _moe(ctx: Context) -> MoEDecision:
    n_key, n_experts = _first_key(ctx, _NUM_EXPERTS_KEYS)
    k_key, top_k = _first_key(ctx, _TOP_K_KEYS)
    tiny_cfg = text_config(ctx.tiny.config)
    n_tiny = getattr(tiny_cfg, n_key, None) if n_key else None
    block = experts = layout = None
    if n_tiny:
        for path, m in ctx.modules.items():
            own = m.parameters(recurse=False)
            stacked = [p for p in own if p.dim() == 3 and p.shape[0] == n_tiny]
            if stacked:
                layout, experts = "stacked", (path, m)
                parent = path.rpartition(".")[0]
                block = (parent, ctx.tiny.get_submodule(parent))
                break
            for name, child in m.named_children():
                same = isinstance(child, nn.ModuleList) and len({type(e) for e in child}) == 1
                if same and len(child) == n_tiny:
                    layout, experts = "module_list", (f"{path}.{name}", child[0])
                    block = (path, m)
                    break
            if block:
                break
    if block is None:
        if n_experts:
            return MoEDecision(
                status="unsupported",
                reason=f"config {n_key}={n_experts} but no expert container found in the model",
                evidence=[ctx.cfg_ev(n_key)],
            )
        return MoEDecision(status="absent")
    d = MoEDecision(
        is_moe=True,
        block_class=type(block[1]).__name__,
        expert_layout=layout,
        experts_class=type(experts[1]).__name__,
        num_experts=n_experts,
        top_k=top_k,
    )
    for cls in (type(block[1]), type(experts[1])):
        found = S.class_node(cls)
        if found:
            d.evidence.append(S.evidence(found[1], found[0]))
    d.evidence += [ctx.cfg_ev(n_key)] + ([ctx.cfg_ev(k_key)] if k_key else [])
    d.evidence.append(
        S.check_evidence(
            f"tiny instance: {n_tiny} experts in {experts[0]} ({layout}) under {block[0]}"
        )
    )
    if layout == "stacked":
        fwd = S.method(type(experts[1]), "forward")
        if fwd is not None:
            for call in S.calls(fwd.node):
                if S.self_attr(call.func) and isinstance(
                    getattr(experts[1], S.self_attr(call.func), None), nn.Module
                ):
                    d.evidence.append(fwd.ev(call))
                    break
        ctx.notes.append(
            f"{d.experts_class}: stacked expert weights (3-D parameters); `patch` gives each "
            "instance its guards accept moe_experts (SwiGLU without bias) or the clamped-gate "
            "kernel, and lists any other it leaves alone with the reason"
        )
    fwd = S.method(ctx.target.model_cls, "forward")
    if fwd is not None:
        for node in ast.walk(fwd.node):
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name)
                and any(isinstance(t, ast.Name) and "aux" in t.id for t in node.targets)
            ):
                d.aux_loss_function = node.value.func.id
                d.evidence.append(fwd.ev(node))
                break
    if top_k is None:
        d.reason = f"no top-k config key among {_TOP_K_KEYS}"
        d.status = "unsupported"
    return d


# ----------------------------------------------------------------------------- checks


def _run_checks(ctx: Context, norms, mlps, rope: RopeDecision, rope_fns) -> None:
    classes = ctx.classes(components=True)
    for d in norms:
        module = classes[d.class_name][0][1]
        C.run_check(d, C.check_norm, module)
        if d.kind == "rms_norm":
            C.run_check(d, C.check_norm_casting, module)
    for d in mlps:
        C.run_check(d, C.check_mlp, classes[d.class_name][0][1])
    if rope.status == "patch":
        try:
            cos, sin = rotary_tables(ctx)
            attn = classes[rope.attention_class][0][1]
            tcfg = text_config(ctx.tiny.config)
            heads = tcfg.num_attention_heads
            kv = getattr(tcfg, "num_key_value_heads", None) or heads
            head_dim = (
                getattr(attn, "head_dim", None)
                or getattr(tcfg, "head_dim", None)
                or tcfg.hidden_size // heads
            )
        except Exception as e:  # recorded as the decision's reason, never dropped
            rope.reason = f"numerical check could not start: {type(e).__name__}: {e}"
            rope.status = "unsupported"
            return
        # every site rotates by the one rotary embedding's tables; each is checked against its
        # own function (the shapes only need to be ones the function takes)
        for site, fn in zip([rope, *rope.other_sites], rope_fns, strict=True):
            rotated = cos.shape[-1] * (2 if site.variant == "half_table" else 1)
            C.run_check(
                site,
                C.check_rope,
                fn.fn,
                cos,
                sin,
                heads=heads,
                kv_heads=kv,
                head_dim=head_dim,
                q_dim=rotated if fn.caller_slices else head_dim,
            )
            if site is not rope and site.status != "patch":
                rope.status = "unsupported"
                rope.reason = f"{site.attention_class} calls {site.call_name}: {site.reason}"


def _confirm_model(ctx: Context, profile: ModelProfile) -> None:
    """The whole tiny model patched with `profile` against itself unpatched (`parity.py`):
    loss, gradients and log-probs in train() and eval(). What the per-module checks cannot
    see (the loss conventions, the wiring, train-only branches) shows here; a decision that
    fails is demoted to unsupported with the measurement."""
    from kernelwright.integrations.transformers import parity

    if not parity.units(profile):
        return
    from kernelwright.integrations.transformers.pixels import check_batch

    model = ctx.tiny.to(C._device())
    parity.spread_vectors(model)
    # with images where the model takes them (its vision tower's patches are checked only then)
    batch = check_batch(model, batch=2, seq=8)
    if batch.note:
        profile.notes.append(f"model check batch: {batch.note}")
    try:
        reference = parity.measure(model, batch)
    except Exception as e:  # nothing can be confirmed on a model that does not run
        why = f"model check: the unpatched tiny model raised {parity.error_text(e)}"
        for u in parity.units(profile):
            d = u.decision(profile)
            d.status, d.reason = "unsupported", why
        return
    conf = parity.confirm(model, profile, batch=batch, reference=reference, what="model check")
    for u, why in conf.demoted:
        profile.notes.append(f"model check demoted {u.label}: {why}")
