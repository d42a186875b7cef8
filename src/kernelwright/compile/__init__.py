"""torch.compile with kernelwright's kernels swapped into the captured graph.

    import kernelwright
    report = kernelwright.compile.CompileReport()
    model = kernelwright.compile(model, report=report)      # torch.compile's arguments pass on
    loss = model(batch).sum(); loss.backward()               # compiles: the report fills
    print(report.summary())

    # a Hugging Face model trained with labels: logits=None, the lm-head + loss fused
    model = kernelwright.compile(hf_model, logits="drop_with_labels")

    # the same pass, with torch.compile called yourself:
    model = torch.compile(model, backend=kernelwright.compile_backend())
    # or as Inductor's own pre-grad pass:
    pre_grad = kernelwright.compile.inductor_pass()
    model = torch.compile(model, options={"pre_grad_custom_pass": pre_grad})

Patterns written the way models write them (HF-style RMSNorm, and the residual add before it
as fused add + RMSNorm; LayerNorm; `silu(gate) * up`, `gelu(gate) * up`, `relu(x) ** 2`;
softmax / log_softmax over the last dimension; HF's rotate_half RoPE; `F.cross_entropy` on
logits, HF's upcast and flatten included; jagged mean pooling: Python loops over segments,
rewritten in the source before Dynamo runs, `torch.segment_reduce(x, "mean", ...)`,
`zeros.index_add_(0, ids, x)` or `zeros.scatter_add_(0, ids[:, None].expand(-1, D), x)`
divided by the counts, `scatter_reduce` / `index_reduce` "mean" with include_self=False) are
replaced by kernelwright's public functions where the site passes the kernel's checks and
the selection picks kernelwright among what the pass can insert (or by Liger Kernel's function,
where it is installed, measured fastest and computes the site: compile/liger.py); everything
else stays with Inductor. `KERNELWRIGHT_LOG=registry` logs one line per site (logger
"kernelwright.compile"), and a rewritten loop's first fallback to the loop as written for each
reason.

This package sits above bench/ and registry/, below workflows/ and the CLI. The module itself
is callable — `kernelwright.compile(model)` — so that its name can be both the function users
call and the package its parts live in (`kernelwright.compile.passes`, `.patterns`, `.select`).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Collection
from dataclasses import dataclass

from kernelwright.compile import logits as logits_option
from kernelwright.compile import loops
from kernelwright.compile.passes import (
    CompileReport,
    Site,
    ensure_log_handler,
    log,
    make_backend,
    rewrite,
)
from kernelwright.compile.select import check_db

__all__ = ["CompileReport", "Site", "compile", "compile_backend", "inductor_pass", "rewrite"]


def compile_backend(
    backend: str | Callable = "inductor", *, report: list | None = None, db=None
) -> Callable:
    """A Dynamo backend for `torch.compile(m, backend=kernelwright.compile_backend())`.

    Args:
        backend: what compiles each graph after the rewrite: "inductor" (torch.compile's
            default; `mode=` / `options=` given to torch.compile reach it), another backend's
            name ("aot_eager", ...) or a backend callable.
        report: a `CompileReport` (or any list) that receives one `Site` per matched site.
        db: the results database the selection reads (None: its default).
    """
    return make_backend(backend, report=report, db=db)


def inductor_pass(*, report: list | None = None, db=None) -> Callable:
    """The graph pass as an Inductor pre-grad custom pass, for those who keep Inductor as
    torch.compile's backend and set its options themselves:

        pre_grad = kernelwright.compile.inductor_pass()
        torch.compile(model, options={"pre_grad_custom_pass": pre_grad})

    Inductor runs it on each Dynamo graph before AOT autograd, where the backend runs it. Loops
    over jagged segments are not captured this way (that happens before Dynamo, in `compile`).
    """
    check_db(db)
    ensure_log_handler()
    counter = [0]

    def kernelwright_pre_grad_pass(graph) -> None:
        index = counter[0]
        counter[0] += 1
        if isinstance(report, CompileReport):
            report.graphs = counter[0]
        rewrite(graph.owning_module, report, graph=index, db=db)

    return kernelwright_pre_grad_pass


def compile(
    model_or_fn=None,
    *,
    report: list | None = None,
    backend: str | Callable = "inductor",
    db=None,
    capture_loops: bool = True,
    only: Collection[str] | None = None,
    logits: str = "keep",
    **torch_compile_kwargs,
):
    """`torch.compile(model_or_fn, **torch_compile_kwargs)` with kernelwright's graph pass.

    Args:
        model_or_fn: an nn.Module or a function (None: returns a decorator, as torch.compile).
        report: a `CompileReport` (or any list) filled with the matched sites as graphs compile.
        backend: the compiler after the rewrite (see `compile_backend`).
        db: the results database the selection reads (None: its default).
        capture_loops: first rewrite Python loops over jagged segments (`compile/loops.py`) in
            the forward of each submodule (on the instance) or in the function.
        only: the keys (`Site.key`, "graph:node") of the graph sites that may be replaced;
            the others are left to the backend (None: every site). For bisecting a divergence.
            Anything but a site key raises ValueError, as does a key of a graph without
            that site when the graph compiles.
        logits: "keep" (the output as the model returns it) or "drop_with_labels": a Hugging
            Face model called with labels and grad enabled returns `logits=None` beside its
            loss (set on the instance's forward, `compile/logits.py`), so its lm-head and loss
            become fused linear cross-entropy and the [tokens, vocab] logits are never stored.
            Calls without labels, under no_grad, with `logits_to_keep` or `return_dict=False`
            keep them; `report.notes` says which happened.
        **torch_compile_kwargs: fullgraph, dynamic, mode, options, ... as torch.compile takes.
    """
    import torch

    if model_or_fn is None:
        return lambda m: compile(
            m, report=report, backend=backend, db=db, capture_loops=capture_loops, only=only,
            logits=logits, **torch_compile_kwargs,
        )  # fmt: skip
    logits_option.check(logits, model_or_fn)  # before anything is changed
    mode = torch_compile_kwargs.get("mode")
    if mode is not None:  # torch.compile checks it only for its own inductor backend
        from torch._inductor import list_mode_options

        if mode not in list_mode_options():
            raise ValueError(f"kernelwright.compile: mode {mode!r} is not one of torch.compile's "
                             f"modes: {', '.join(list_mode_options())}")  # fmt: skip
    # checks the database, the backend and `only` now, as torch.compile checks its backend
    be = make_backend(backend, report=report, db=db, only=only)
    ensure_log_handler()  # before the loop sites are logged
    if capture_loops:
        model_or_fn, captures = loops.capture(model_or_fn)
        sites = [loop_site(c) for c in captures]
        for site in sites:
            log.info(site.line())
        if report is not None:
            report.extend(sites)
    if logits == "drop_with_labels":
        logits_option.drop_with_labels(model_or_fn, report, log)
    return torch.compile(model_or_fn, backend=be, **torch_compile_kwargs)


@dataclass
class LoopSite(Site):
    """A loop rewritten in the source before Dynamo (`compile/loops.py`): `replaced` means the
    source was rewritten; how its calls went at run time (the kernel, or the loop as written
    and why) is read from its `capture` each time the line is written."""

    capture: loops.Capture | None = None

    def line(self) -> str:
        runs = self.capture.runs() if self.capture is not None else ""
        return super().line() + (f"; {runs}" if runs else "")


def loop_site(c: loops.Capture) -> Site:
    """The report's line for a loop rewritten before Dynamo (`compile/loops.py`)."""
    return LoopSite(
        graph=-1,
        pattern=f"segment-mean {c.spelling}",
        op="jagged_mean",
        nodes=(f"{c.where}:{c.line}",),
        shapes={},
        dtypes={},
        impl="kernelwright",
        reason=(
            "rewritten in the source before Dynamo: one jagged_mean launch instead of the loop; "
            "falls back to the loop as written where the kernel would differ (an empty segment, "
            "bounds out of order, a dtype or device it does not take)"
        ),
        replaced=True,
        capture=c,
    )


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        return compile(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
