"""Understand (trace the loss, find its log-prob sites) and Act (rewrite, emit, test files)."""

from __future__ import annotations

import inspect
import operator
import re
import subprocess
import sys
import types
from pathlib import Path

import torch
import torch.fx

from kernelwright.losses.logprobs import fused_linear_logprobs
from kernelwright.profiles.loss import LossInput, LossProfile
from kernelwright.profiles.reviewed import edited
from kernelwright.workflows.create.load import ReferenceError, load_reference
from kernelwright.workflows.losses.sites import find_sites

# The generated loss passes its gather indices as they are: no id is ignored, as in the
# original, whose gather would fail on one.
NO_IGNORE = -(2**62)
_REDUCTIONS = {"sum", "mean", "logsumexp", "amax", "amin", "max", "min", "prod", "norm"}


class LossGenError(ValueError):
    """The loss cannot be read or generated; the message says why."""


def _load(source: str, name: str | None):
    try:
        ref = load_reference(source, name=name)
    except ReferenceError as e:
        raise LossGenError(str(e)) from e
    if ref.input_form != "function":
        raise LossGenError(
            f"{source}: `losses new` takes a plain function of the logits (and labels, masks, "
            f"reference log-probs ...), not an nn.Module"
        )
    return ref


def _trace(ref) -> torch.fx.GraphModule:
    params = list(inspect.signature(ref.function).parameters)
    concrete = {params[i]: v for i, v in ref.constants.items() if i < len(params)}
    try:
        return torch.fx.symbolic_trace(ref.function, concrete_args=concrete or None)
    except Exception as e:
        raise LossGenError(
            f"tracing {ref.source} failed ({type(e).__name__}: {e}); a loss here is straight-line "
            "tensor code: no Python branch on tensor values"
        ) from e


def understand(source: str, *, name: str | None = None, logits_arg: str = "logits") -> LossProfile:
    """Trace the loss at `source` (a file or module:function, with get_inputs()) into a
    LossProfile; `stop` is set when it cannot be expressed on the primitive."""
    ref = _load(source, name)
    if logits_arg not in ref.input_names:
        raise LossGenError(
            f"{source}: no tensor argument named {logits_arg!r} (arguments: "
            f"{', '.join(ref.input_names)}); pass --logits NAME"
        )
    logits = ref.example_inputs[ref.input_names.index(logits_arg)]
    if not logits.is_floating_point() or logits.dim() < 2:
        raise LossGenError(f"{logits_arg} must be a float tensor [..., V] in get_inputs()")
    gm = _trace(ref)
    sites, entropies, stop = find_sites(gm, logits_arg, logits.dim())
    inputs = [
        LossInput(name=n, role="logits" if n == logits_arg else "tensor", shape=list(t.shape),
                  dtype=str(t.dtype).replace("torch.", ""))
        for n, t in zip(ref.input_names, ref.example_inputs, strict=True)
    ]  # fmt: skip
    params = list(inspect.signature(ref.function).parameters)
    inputs += [LossInput(name=params[i], role="constant") for i in sorted(ref.constants)]
    # by name (a method's target is its name; a function's repr holds its address, which
    # would change the profile's bytes from run to run)
    reductions = [
        name for n in gm.graph.nodes
        if n.op in ("call_method", "call_function")
        and (name := getattr(n.target, "__name__", n.target)) in _REDUCTIONS
    ]  # fmt: skip
    return LossProfile(
        name=ref.name, source=ref.source, logits_arg=logits_arg, vocab=int(logits.shape[-1]),
        inputs=inputs, sites=sites, entropies=entropies, reductions=reductions, stop=stop,
    )  # fmt: skip


def rewrite(profile: LossProfile) -> torch.fx.GraphModule:
    """The traced loss with (hidden, weight) in place of the logits and the primitive at each
    of the profile's sites."""
    if profile.stop:
        raise LossGenError(f"{profile.name}: {profile.stop}")
    ref = _load(profile.source, profile.name)
    gm = _trace(ref)
    graph = gm.graph
    nodes = {n.name: n for n in graph.nodes}
    _check_nodes(profile, nodes)
    logits = nodes[profile.logits_arg]
    with graph.inserting_before(logits):
        hidden = graph.placeholder("hidden")
        weight = graph.placeholder("weight")
    shared = _entropies(profile, graph, nodes, hidden, weight)
    for site in profile.sites:
        node = nodes[site.node]
        with graph.inserting_before(node):
            lp = shared.get(site.node)
            if lp is None:
                kw = {"temperature": site.temperature, "ignore_index": NO_IGNORE}
                lp = graph.call_function(
                    fused_linear_logprobs, (hidden, weight, nodes[site.target]), kw
                )
            if site.keepdim:
                lp = graph.call_method("unsqueeze", (lp, -1))
        node.replace_all_uses_with(lp)
    graph.eliminate_dead_code()
    if logits.users:
        raise LossGenError(f"the logits still reach {[u.name for u in logits.users]} after the "
                           "rewrite: the profile's sites do not cover every use")  # fmt: skip
    graph.erase_node(logits)
    graph.lint()
    gm.recompile()
    return gm


def _node_fields(profile: LossProfile) -> dict[str, str]:
    """The profile's fields that name a node of the traced loss: field -> node name."""
    fields = {"logits_arg": profile.logits_arg}
    for i, s in enumerate(profile.sites):
        fields[f"sites[{i}].node"], fields[f"sites[{i}].target"] = s.node, s.target
    for i, e in enumerate(profile.entropies):
        fields[f"entropies[{i}].node"] = e.node
    return fields


def check_profile(profile: LossProfile, path: Path | None = None) -> None:
    """Every node the profile (loaded from `path`) names exists in its traced source; else a
    LossGenError naming the bad field, or saying that the source changed (`_check_nodes`)."""
    graph = _trace(_load(profile.source, profile.name)).graph
    _check_nodes(profile, {n.name: n for n in graph.nodes}, path)


def _check_nodes(profile: LossProfile, nodes: dict, path: Path | None = None) -> None:
    """A node the profile names that the traced source lacks comes from a changed source when
    the profile at `path` is as kernelwright wrote it (its digest, profiles/reviewed.py);
    from an edit of the profile when the source, traced afresh, names the same nodes in every
    other field; else from a changed source."""
    fields = _node_fields(profile)
    bad = {k: v for k, v in fields.items() if v not in nodes}
    if not bad:
        return
    listed = ", ".join(f"{k} = {v!r}" for k, v in bad.items())
    rerun = f"`kernelwright losses new {profile.source}`"
    if "logits_arg" in bad:
        args = ", ".join(n for n, node in nodes.items() if node.op == "placeholder")
        raise LossGenError(f"profile of {profile.name}: logits_arg = {profile.logits_arg!r} is "
                           f"not an argument of {profile.source} ({args})")  # fmt: skip
    try:
        now = _node_fields(understand(profile.source, name=profile.name,
                                      logits_arg=profile.logits_arg))  # fmt: skip
    except LossGenError:
        now = None
    unedited = path is not None and not edited(path)
    if (
        not unedited
        and now is not None
        and now.keys() == fields.keys()
        and all(now[k] == v for k, v in fields.items() if k not in bad)
    ):
        traced_as = ", ".join(f"{k} = {now[k]!r}" for k in bad)
        raise LossGenError(
            f"profile of {profile.name}: {listed} names no node of the traced loss "
            f"{profile.source} (tracing it gives {traced_as}); correct the field, or write a "
            f"fresh profile with {rerun}"
        )
    raise LossGenError(f"{profile.source} changed since its profile was written ({listed} "
                       f"names no node of it now): run {rerun} again")  # fmt: skip


def _entropies(profile, graph, nodes, hidden, weight) -> dict[str, torch.fx.Node]:
    """One fused_linear_logprobs(..., return_entropy=True) per temperature with an entropy
    site, its entropy in place of each; it also gives the log-probs of the first log-prob site
    at that temperature whose ids exist before the first entropy (returned: site node -> the
    log-probs), else it scores token 0 (unused: only the entropy's gradient flows)."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    shared = {}
    for temperature in sorted({e.temperature for e in profile.entropies}):
        group = [e for e in profile.entropies if e.temperature == temperature]
        first = min((nodes[e.node] for e in group), key=order.get)
        partner = next((s for s in profile.sites if s.temperature == temperature
                        and order[nodes[s.target]] < order[first]), None)  # fmt: skip
        at = first if partner is None else min(first, nodes[partner.node], key=order.get)
        with graph.inserting_before(at):
            if partner is None:
                shape = graph.call_function(getattr, (hidden, "shape"))
                lead = graph.call_function(operator.getitem, (shape, slice(None, -1)))
                target = graph.call_method("new_zeros", (hidden, lead), {"dtype": torch.long})
            else:
                target = nodes[partner.target]
            kw = {"temperature": temperature, "ignore_index": NO_IGNORE, "return_entropy": True}
            call = graph.call_function(fused_linear_logprobs, (hidden, weight, target), kw)
            entropy = graph.call_function(operator.getitem, (call, 1))
            if partner is not None:
                shared[partner.node] = graph.call_function(operator.getitem, (call, 0))
        for e in group:
            node = nodes[e.node]
            with graph.inserting_before(node):
                value = entropy
                if e.over == "all":
                    value = graph.call_method("sum", (value,))
                elif e.keepdim:
                    value = graph.call_method("unsqueeze", (value, -1))
                if e.negated:
                    value = graph.call_function(operator.neg, (value,))
            node.replace_all_uses_with(value)
    return shared


def _imports(globals_: dict) -> list[str]:
    lines = []
    for key, value in sorted(globals_.items()):
        if key in ("inf", "nan"):
            lines.append(f"from math import {key}")
        elif key == "NoneType":
            lines.append("NoneType = type(None)")
        elif isinstance(value, types.ModuleType):
            lines.append(f"import {key}" if key == value.__name__ else
                         f"import {value.__name__} as {key}")  # fmt: skip
        elif isinstance(value, type) or callable(value):
            mod, qual = getattr(value, "__module__", None), getattr(value, "__qualname__", "")
            if not mod or "." in qual or "<" in qual:
                raise LossGenError(f"the rewritten loss refers to {value!r}, which cannot be "
                                   "imported by name")  # fmt: skip
            lines.append(f"from {mod} import {qual}" + ("" if qual == key else f" as {key}"))
        else:
            raise LossGenError(f"the rewritten loss holds a constant {key} = {value!r}")
    return lines


def emit(profile: LossProfile) -> str:
    """The generated module's source: the loss on (hidden, weight, ...)."""
    gm = rewrite(profile)
    code = gm.graph.python_code(root_module="self")
    body = code.src.strip("\n").replace("def forward(self, ", f"def {profile.name}_fused(", 1)
    used = {k: v for k, v in code.globals.items() if re.search(rf"\b{re.escape(k)}\b", body)}
    header = [
        f'"""{profile.name}_fused: {profile.source} on the fused log-prob primitive.',
        "",
        "Generated by `kernelwright losses new` from its LossProfile; do not edit by hand.",
        f"The logits argument `{profile.logits_arg}` [..., {profile.vocab}] becomes hidden",
        "[..., H] and weight [V, H] (logits = hidden @ weight.T, never materialised).",
        '"""',
        "",
        *_imports(used),
        "",
        "",
    ]
    return "\n".join(header) + body + "\n"


_TEST = '''"""Tests of {name}_fused against the original loss on full logits (generated)."""

import pytest
import torch

import kernelwright  # noqa: F401  (the interpreter on machines without a GPU)
from kernelwright.workflows.create.load import load_reference

from {name}_fused import {name}_fused

SOURCE = {source!r}
LOGITS = {logits!r}
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _case(seed, hidden_size=16):
    torch.manual_seed(seed)
    ref = load_reference(SOURCE, name={name!r})
    args = [a.to(DEVICE) for a in ref.example_inputs]
    i = ref.input_names.index(LOGITS)
    lead, vocab = args[i].shape[:-1], args[i].shape[-1]
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(*lead, hidden_size, generator=g).to(DEVICE).requires_grad_()
    weight = (torch.randn(vocab, hidden_size, generator=g) * 0.5).to(DEVICE).requires_grad_()
    others = args[:i] + args[i + 1:]
    return ref, i, hidden, weight, others, args


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_the_loss_on_full_logits(seed):
    ref, i, hidden, weight, others, args = _case(seed)
    logits_args = args[:i] + [hidden @ weight.T] + args[i + 1:]
    want = ref.call(*logits_args)
    got = {name}_fused(hidden, weight, *others)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    if want.requires_grad:
        dy = torch.randn_like(want)
        g_want = torch.autograd.grad(want, [hidden, weight], dy)
        g_got = torch.autograd.grad(got, [hidden, weight], dy)
        for a, b in zip(g_got, g_want, strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_the_comparison_can_fail():
    # another weight gives another loss: the test above is not vacuous
    ref, i, hidden, weight, others, args = _case(0)
    want = ref.call(*(args[:i] + [hidden @ weight.T] + args[i + 1:]))
    got = {name}_fused(hidden, weight.detach() * 1.5, *others)
    assert not torch.allclose(got, want, atol=1e-5, rtol=1e-4)
'''

_BENCH = '''"""Peak memory and time of {name}_fused against the original loss (generated).

    python3 bench_{name}_fused.py [--hidden 4096] [--vocab 128256] [--scale 1]

The original's other inputs come from get_inputs(); --scale repeats them along dim 0.
"""

import argparse
import time

import torch

from kernelwright.workflows.create.load import load_reference
from {name}_fused import {name}_fused

SOURCE = {source!r}
LOGITS = {logits!r}


def run(fn):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    fn().backward()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3, (torch.cuda.max_memory_allocated() - base) / 2**20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--scale", type=int, default=1)
    a = ap.parse_args()
    ref = load_reference(SOURCE, name={name!r})
    args = [torch.cat([x] * a.scale) if x.dim() else x for x in ref.example_inputs]
    args = [x.cuda() for x in args]
    i = ref.input_names.index(LOGITS)
    lead = args[i].shape[:-1]
    hidden = torch.randn(*lead, a.hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(a.vocab, a.hidden, device="cuda", dtype=torch.bfloat16) * a.hidden**-0.5
    weight.requires_grad_()
    others = args[:i] + args[i + 1:]
    def unfused():
        return ref.call(*(args[:i] + [hidden @ weight.T] + args[i + 1:]))

    def fused():
        return {name}_fused(hidden, weight, *others)

    for label, fn in (("unfused", unfused), ("fused", fused)):
        run(fn)
        ms, mib = run(fn)
        print(f"{{label:8s}} {{ms:8.2f}} ms  {{mib:9.1f}} MiB peak above the inputs")


if __name__ == "__main__":
    main()
'''


def generate(profile: LossProfile, out: Path) -> list[Path]:
    """Write <name>_fused.py, its tests and its benchmark into `out`; the profile too."""
    out.mkdir(parents=True, exist_ok=True)
    fields = dict(name=profile.name, source=str(Path(profile.source).resolve())
                  if Path(profile.source.split(":")[0]).exists() else profile.source,
                  logits=profile.logits_arg)  # fmt: skip
    files = {
        out / f"{profile.name}_fused.py": emit(profile),
        out / f"test_{profile.name}_fused.py": _TEST.format(**fields),
        out / f"bench_{profile.name}_fused.py": _BENCH.format(**fields),
    }
    for path, text in files.items():
        path.write_text(text)
    return list(files)


def verify(out: Path, name: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run the generated tests in a subprocess (their folder on the import path)."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"test_{name}_fused.py"],
        cwd=out, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
