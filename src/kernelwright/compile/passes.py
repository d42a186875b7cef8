"""The graph pass: in each graph Dynamo captures, replace the patterns of `patterns.py` by
calls to kernelwright's public functions, then hand the graph to Inductor (or another backend).

The rewrite runs on the Dynamo graph — torch-level calls, before AOT autograd — so the inserted
functions are traced by AOT autograd like any other call: their autograd Functions supply the
backward and their kernels appear as the custom ops `kernelwright::*` (one opaque node each),
which Inductor leaves alone while it fuses everything around them.

Each site that matches is checked (dtype, device, static last dimension, the op's own argument
rules), then the selection (`compile/select.py`) says which implementation to use, among those
the pass can insert (the op's own kernel, Inductor, and Liger's function where liger_kernel is
installed and `compile/liger.py` takes the site: a site where Liger measured fastest but cannot
be called gets the fastest of the others, and the reason says why); a site is replaced when it
names the op's own kernel: "kernelwright", or "created" for an op that `create --into-library`
made (its site comes from its generated pattern, compile/generated.py), or "liger". A library
op's site may also get the created kernel that implements the op (`create --implements`), when
the site makes the call of the op that kernel was made from; otherwise the report says why not.
Every site goes into the report with the reason.
A call with several results (fused add + RMSNorm: the norm and the sum) goes before the first
node reading any of them, each result replacing its node through `operator.getitem`.
"""

from __future__ import annotations

import logging
import operator
import os
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import GraphModule, Node

from kernelwright import registry
from kernelwright.compile import liger
from kernelwright.compile.generated import created_match, created_unfit, generated_matches
from kernelwright.compile.matchers import MATCHERS
from kernelwright.compile.patterns import Match, value
from kernelwright.compile.select import INSERTABLE, check_db, choose  # per site: which, and why
from kernelwright.registry.entry import Impl
from kernelwright.runtime.device import interpreter_mode

log = logging.getLogger("kernelwright.compile")

# --------------------------------------------------------------------------- report

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass
class Site:
    """One matched site of one captured graph."""

    graph: int  # which captured graph (0, 1, ... in capture order); -1: rewritten in the source
    pattern: str
    op: str
    nodes: tuple[str, ...]  # the replaced (or left) nodes, output last
    shapes: dict[str, tuple]  # input name -> shape
    dtypes: dict[str, str]
    impl: str  # the implementation chosen ("kernelwright", "inductor", ...); "" when not asked
    reason: str
    replaced: bool

    @property
    def key(self) -> str:
        """The site's name in `rewrite(only=...)`: its graph and its output node ("0:mul_3")."""
        return f"{self.graph}:{self.nodes[-1]}"

    def line(self) -> str:
        shapes = ", ".join(
            f"{k}={list(s)}:{self.dtypes[k]}" for k, s in self.shapes.items() if k in self.dtypes
        )
        done = "replaced by" if self.graph >= 0 else "rewritten to call"  # source: a loop
        verdict = f"{done} {self.impl}" if self.replaced else "left to the backend"
        where = f"graph {self.graph}" if self.graph >= 0 else "source"
        shapes = f" ({shapes})" if shapes else ""
        return f"{where}: {self.pattern} at {self.nodes[-1]}{shapes}: {verdict} — {self.reason}"


class CompileReport(list):
    """The sites of every graph compiled so far (a list of `Site`), and how many graphs.

    Filled as graphs compile, i.e. on the first call of the compiled model (and again on a
    recompile). More than one graph means Dynamo broke the program into several; each is
    rewritten on its own.
    """

    def __init__(self, *args):
        super().__init__(*args)
        self.graphs = 0
        self.breaks: list[str] = []  # one line per graph break: where, and Dynamo's reason
        # what was done to the model's output before Dynamo (compile's `logits=` option): one
        # line per case met while tracing, e.g. "LlamaForCausalLM: logits=None in the output"
        self.notes: list[str] = []

    def replaced(self) -> list[Site]:
        return [s for s in self if s.replaced]

    def summary(self) -> str:
        head = (
            f"kernelwright.compile: {self.graphs} graph(s), {len(self)} site(s), "
            f"{len(self.replaced())} replaced"
        )
        lines = [head] + ["  " + s.line() for s in self]
        return "\n".join(lines + ["  " + b for b in (*self.breaks, *self.notes)])


def _logging_requested() -> bool:
    words = os.environ.get("KERNELWRIGHT_LOG", "").replace(",", " ").split()
    return "registry" in words or "all" in words


def ensure_log_handler() -> None:
    """With KERNELWRIGHT_LOG=registry, sites are logged at INFO even where nothing configured
    logging; a handler the application set up is used as it is."""
    if not _logging_requested():
        return
    if log.level == logging.NOTSET or log.level > logging.INFO:
        log.setLevel(logging.INFO)
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        log.addHandler(handler)


# --------------------------------------------------------------------------- checks


def _hint(d: Any) -> int | None:
    """A dimension's size: its value, or the size it had when traced when it is symbolic."""
    if isinstance(d, int):
        return d
    try:
        return int(d.node.hint)
    except (AttributeError, TypeError):
        return None


def _capability(m: Match) -> str | None:
    """Why the kernel cannot take this site (None when it can)."""
    vals = {name: value(n) for name, n in m.tensors.items()}
    devices = set()
    for name, v in vals.items():
        if not isinstance(v, torch.Tensor):
            return f"{name} has no traced tensor value"
        if name == "target":  # cross_entropy's class indices
            dt = str(v.dtype).replace("torch.", "")
            if v.is_floating_point():
                return f"target is {dt}: class probabilities; the kernel takes class indices"
            if v.dtype not in (torch.int64, torch.int32):
                return f"target is {dt}: the kernel takes int64 or int32 class indices"
            devices.add(v.device)
            continue
        if v.dtype not in _DTYPES:
            dt = str(v.dtype).replace("torch.", "")
            return f"{name} is {dt}: the kernel takes float32, float16 or bfloat16"
        if v.dim() == 0 and m.scalars_ok:
            devices.add(v.device)
            continue
        if v.dim() == 0:
            return f"{name} is a scalar"
        if not isinstance(v.shape[-1], int):
            return f"{name} has a dynamic last dimension"
        if v.shape[-1] == 0:
            return f"{name} has an empty last dimension"
        devices.add(v.device)
    (device,) = devices if len(devices) == 1 else (None,)
    if device is None:
        return "inputs on different devices"
    if device.type != "cuda" and not (device.type == "cpu" and interpreter_mode()):
        return f"on {device.type}: the kernels run on CUDA (or on CPU under TRITON_INTERPRET=1)"
    if m.op in ("swiglu", "geglu"):
        gate, up = vals["gate"], vals["up"]
        if gate.dtype != up.dtype:
            return "gate and up have different dtypes (eager promotes)"
        if tuple(gate.shape) != tuple(up.shape):
            return "gate and up have different shapes (eager broadcasts)"
    if m.op == "fused_add_rms_norm":
        x, residual = vals["x"], vals["residual"]
        if x.dtype != residual.dtype or tuple(x.shape) != tuple(residual.shape):
            return "x and residual differ in shape or dtype (eager broadcasts or promotes)"
    if m.op in ("rms_norm", "fused_add_rms_norm", "layer_norm"):
        for name in ("weight", "bias"):
            p = vals.get(name)
            if p is not None and tuple(p.shape) != (vals["x"].shape[-1],):
                return f"{name} is not [N] for the last dimension N of x"
            if p is not None and p.dtype not in (vals["x"].dtype, torch.float32):
                return f"{name}'s dtype is neither x's nor float32 (the kernel rounds otherwise)"
    return None


def _shared(m: Match) -> Node | None:
    """An intermediate node of the match also read outside it (replacing would compute it
    twice), or None."""
    inside = set(m.nodes)
    for n in m.nodes[:-1]:
        if n in m.shared_ok or n in m.outputs:
            continue
        if any(u not in inside for u in n.users):
            return n
    return None


# --------------------------------------------------------------------------- the pass


_OWN = ("kernelwright", "created")  # implementations the pass inserts: the op's own function


def rewrite(
    gm: GraphModule,
    report: list | None = None,
    *,
    graph: int = 0,
    db=None,
    only: Collection[str] | None = None,
) -> list[Site]:
    """Replace the patterns in `gm` (a Dynamo graph) in place; returns the sites (also appended
    to `report`). `db` is handed to the selection (None: its default results database).
    `only`: the keys (`Site.key`) of the sites that may be replaced; every other site is left to
    the backend (None: every site). `kernelwright debug --compiled` bisects with it."""
    g = gm.graph
    sites: list[Site] = []
    done: set[Node] = set()  # nodes consumed by a replacement (erased, or kept for others)
    generated = generated_matches(gm)  # the created ops' patterns, found before any rewrite
    for node in list(g.nodes):
        if node in done or node.op != "call_function" and node.op != "call_method":
            continue
        m = next((m for f in MATCHERS if (m := f(node)) is not None), None) or generated.get(node)
        if m is not None and m.fallback is not None and any(n in done for n in m.nodes):
            m = m.fallback
        if m is None or any(n in done for n in m.nodes):
            continue
        where, reason = _fit(g, m)
        if reason is not None and m.fallback is not None:  # e.g. the norm without the add
            m, why_not = m.fallback, reason
            where, reason = _fit(g, m)
            reason = reason or f"{why_not}: not fused"
        if where is not None and only is not None and f"{graph}:{m.nodes[-1].name}" not in only:
            where, reason = None, "not among the sites asked for (only=): left to the backend"
        impl = ""
        if where is not None:
            x = value(next(iter(m.tensors.values())))
            created = _created(m)
            why_not = created_unfit(m, created) if created is not None else None
            unfit = {"created": why_not} if why_not else {}
            peer = liger.unsupported(m)  # None: Liger's function can be called here
            choice = choose(
                m.op,
                dtype=x.dtype,
                shape=tuple(_hint(d) for d in x.shape),
                device=x.device,
                db=db,
                among=INSERTABLE if peer else (*INSERTABLE, "liger"),
                ruled_out=unfit,
                why_not={"liger": peer} if peer else None,
            )
            impl, reason = choice.impl, (f"{reason}; " if reason else "") + choice.reason
            reason += "".join(f"; not created: {why}" for why in unfit.values())
            if impl == "created" and created is not None:
                m = created_match(m, created)
            if impl == "liger":
                reason += f"; {liger.note(m.op)}"
                m = liger.site(m)
        replaced = impl in _OWN or impl == "liger"
        if replaced:
            _replace(g, m, where)
            done.update(m.nodes)
        vals = {k: value(n) for k, n in m.tensors.items()}
        site = Site(
            graph=graph,
            pattern=m.pattern,
            op=m.op,
            nodes=tuple(n.name for n in m.nodes),
            shapes={k: tuple(_hint(d) for d in v.shape) for k, v in vals.items() if v is not None},
            dtypes={
                k: str(v.dtype).replace("torch.", "") for k, v in vals.items() if v is not None
            },
            impl=impl,
            reason=reason,
            replaced=replaced,
        )
        sites.append(site)
        log.info(site.line())
    if any(s.replaced for s in sites):
        g.lint()
        gm.recompile()
    if report is not None:
        report.extend(sites)
    return sites


def _created(m: Match) -> Impl | None:
    """The created implementation of a library site's op (`create --implements`), or None (no
    such kernel, or a created op's own site, which calls its kernel already)."""
    entry = registry.get(m.op)
    if entry.generated:
        return None
    return next((i for i in entry.impls if i.name == "created"), None)


def _fit(g: torch.fx.Graph, m: Match) -> tuple[Node, None] | tuple[None, str]:
    """(where to insert the call, None) when the kernel can take the site as it stands in the
    graph; else (None, why not)."""
    reason = m.problem or _capability(m)
    if reason is None and (shared := _shared(m)) is not None:
        reason = f"{shared.name} is also used outside the pattern"
    if reason is not None:
        return None, reason
    return _placement(g, m)


_META = ("example_value", "val", "stack_trace", "nn_module_stack", "source_fn_stack")


def _placement(g: torch.fx.Graph, m: Match) -> tuple[Node, None] | tuple[None, str]:
    """(the node to insert the call before, None), or (None, why it has no place).

    One output: before it. Several (fused add + norm returns the sum too): before the first
    node that will read any of them, which must come after every input of the call."""
    if not m.outputs:
        return m.output, None
    order = {n: i for i, n in enumerate(g.nodes)}
    inside = set(m.nodes)
    kept = {n for n in m.shared_ok if any(u not in inside for u in n.users)}  # not erased
    readers = [u for o in m.outputs for u in o.users if u not in inside or u in kept]
    readers.append(m.output)
    first = min(readers, key=order.__getitem__)
    flat: list[Node] = []
    torch.fx.node.map_arg((m.args, m.kwargs), flat.append)
    late = [a for a in flat if order[a] >= order[first]]
    if late:
        return None, f"{first.name} reads the result before {late[0].name} is computed"
    return first, None


def _replace(g: torch.fx.Graph, m: Match, where: Node) -> None:
    """Insert the call before `where`; its result (or its items) replaces the output(s)."""
    with g.inserting_before(where):
        new = g.call_function(m.fn, m.args, m.kwargs)
        items = [g.call_function(operator.getitem, (new, i)) for i in range(len(m.outputs))]
    outs = list(m.outputs) or [m.output]
    results = items or [new]
    for result, out in zip(results, outs, strict=True):
        result.meta.update({k: out.meta[k] for k in _META if k in out.meta})
    if items:  # the call itself: the tuple of values, where the graph of the site came from
        for key in ("example_value", "val"):
            if all(key in o.meta for o in outs):
                new.meta[key] = tuple(o.meta[key] for o in outs)
        new.meta.update({k: m.output.meta[k] for k in _META[2:] if k in m.output.meta})
    for out, result in zip(outs, results, strict=True):
        out.replace_all_uses_with(result)
    for n in reversed(m.nodes):  # users first; a shared cast stays for its other users
        if not n.users:
            g.erase_node(n)


# --------------------------------------------------------------------------- backends


def _inner_compiler(backend: str | Callable, kwargs: dict) -> Callable:
    """The compiler the rewritten graph goes to, with torch.compile's mode/options."""
    if backend == "inductor":
        # What torch.compile(backend="inductor", mode=..., options=...) builds.
        return torch._TorchCompileInductorWrapper(kwargs.get("mode"), kwargs.get("options"), None)
    fn = torch._dynamo.lookup_backend(backend) if isinstance(backend, str) else backend
    return (lambda gm, ex: fn(gm, ex, **kwargs)) if kwargs else fn


def _break_counts() -> dict:
    from torch._dynamo.utils import counters

    return dict(counters["graph_break"])


def _last_location(gm: GraphModule) -> str:
    """file:line of the last user source line recorded in the graph (where it stops)."""
    for node in reversed(list(gm.graph.nodes)):
        trace = node.meta.get("stack_trace") or ""
        frames = [ln.strip() for ln in trace.splitlines() if ln.strip().startswith("File ")]
        frames = [f for f in frames if f"{os.sep}torch{os.sep}" not in f] or frames  # user code
        if frames:
            parts = frames[-1].split('"')
            line = frames[-1].split("line ")[-1].split(",")[0]
            return f"{parts[1] if len(parts) > 2 else '?'}:{line}"
    return "an unknown line"


def _site_keys(only: Collection[str]) -> frozenset[str]:
    """`only` as a set of site keys ("graph:output node", `Site.key`); anything else (an op
    name, a typo) is a ValueError now rather than a compile that silently replaces nothing."""
    keys = frozenset([only] if isinstance(only, str) else only)
    wrong = sorted(k for k in keys if not re.fullmatch(r"\d+:\S+", str(k)))
    if wrong:
        raise ValueError(
            f"only=: not a site key: {', '.join(map(repr, wrong))}. It takes the keys of graph "
            "sites, 'graph:output node' as `Site.key` gives them (e.g. '0:mul_3'); compile "
            "once without only= and read `[s.key for s in report]` for the known ones"
        )
    return keys


def make_backend(
    backend: str | Callable = "inductor",
    *,
    report: list | None = None,
    db=None,
    only: Collection[str] | None = None,
) -> Callable:
    """A Dynamo backend: the pass on each captured graph, then `backend` on the result (`only`:
    the sites that may be replaced, as `rewrite` takes it). A results database that is not one
    raises `ResultsDBError` naming the file here, not inside Dynamo's BackendCompilerFailed;
    so do a backend Dynamo does not know (as torch.compile's own check) and an `only` key that
    is not a site key. A key that names a graph's index but none of its sites raises
    `ValueError` (wrapped by Dynamo) when that graph compiles: its sites are known only then."""
    check_db(db)
    if isinstance(backend, str):
        if backend != "inductor":  # Inductor is built by `_inner_compiler` with its options
            torch._dynamo.lookup_backend(backend)  # raises InvalidBackend for an unknown name
    elif not callable(backend):
        raise TypeError(f"backend must be a backend's name or a callable, got {backend!r}")
    only = None if only is None else _site_keys(only)
    ensure_log_handler()
    counter = [0]
    seen = dict(_break_counts())  # graph breaks Dynamo counted before this backend existed

    def kernelwright_backend(gm: GraphModule, example_inputs, **kwargs):
        index = counter[0]
        counter[0] += 1
        if isinstance(report, CompileReport):
            report.graphs = counter[0]
            # Dynamo counts a break, then compiles the graph that ends there: new reasons now
            # are this graph's end.
            now = _break_counts()
            new = [r for r, n in now.items() if n > seen.get(r, 0)]
            seen.update(now)
            if new:
                reason = [r.strip() for r in str(new[0]).strip().splitlines() if r.strip()]
                why = next((r for r in reason if r.startswith("Explanation:")), "")
                why = f" ({why.removeprefix('Explanation:').strip()})" if why else ""
                at = _last_location(gm)
                line = f"graph break after graph {index} at {at}: {reason[0]}{why}"
                report.breaks.append(line)
                log.info(line)
        sites = rewrite(gm, report, graph=index, db=db, only=only)
        unknown = sorted(k for k in only or () if k.split(":")[0] == str(index))
        unknown = [k for k in unknown if k not in {s.key for s in sites}]
        if unknown:
            raise ValueError(
                f"only=: no site {', '.join(unknown)} in graph {index}; its sites: "
                + (", ".join(s.key for s in sites) or "none")
            )
        return _inner_compiler(backend, kwargs)(gm, example_inputs)

    return kernelwright_backend
