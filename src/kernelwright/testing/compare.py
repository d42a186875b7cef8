"""Forward and backward comparison of a kernel against its fp32 reference.

`check_op` runs the kernel on the given inputs (outputs poisoned, see runtime.alloc), the
reference on fp32 (or fp64) copies, and compares every output and the gradient of every
differentiable input under the same random output gradients. It returns a `CheckReport`; the
tests call `.assert_ok()`, the create and optimize workflows read `.ok` and `.rows`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from kernelwright.runtime.alloc import poisoned
from kernelwright.testing.inputs import generator, rand
from kernelwright.testing.tolerances import DEFAULT_TOLERANCES, Tolerance


def rel_norm_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in fp64; inf if out has a NaN/inf where ref is finite."""
    if tuple(out.shape) != tuple(ref.shape):
        raise AssertionError(f"shape mismatch: got {tuple(out.shape)}, expected {tuple(ref.shape)}")
    o = out.detach().to(torch.float64).cpu()
    r = ref.detach().to(torch.float64).cpu()
    bad = ~torch.isfinite(o) & torch.isfinite(r)
    if bool(bad.any()):
        return math.inf
    denom = r.norm().item()
    num = (o - r).norm().item()
    if denom == 0.0:
        return num
    return num / denom


@dataclass
class CheckRow:
    kind: str  # "output" | "grad"
    name: str
    error: float
    tol: float

    @property
    def ok(self) -> bool:
        return self.error <= self.tol


@dataclass
class CheckReport:
    label: str
    rows: list[CheckRow] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    def table(self) -> str:
        lines = [f"{self.label}:"]
        for r in self.rows:
            mark = "ok  " if r.ok else "FAIL"
            lines.append(
                f"  {mark} {r.kind:6s} {r.name:12s} rel-err {r.error:.3e}  tol {r.tol:.1e}"
            )
        return "\n".join(lines)

    def assert_ok(self) -> None:
        if not self.ok:
            raise AssertionError("kernel does not match its reference\n" + self.table())


def _as_tuple(x) -> tuple[torch.Tensor, ...]:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def check_op(
    fn: Callable[..., torch.Tensor | Sequence[torch.Tensor]],
    ref: Callable[..., torch.Tensor | Sequence[torch.Tensor]],
    inputs: Mapping[str, torch.Tensor | None],
    *,
    kwargs: Mapping[str, object] | None = None,
    grad_inputs: Sequence[str] | None = None,
    tolerances: Mapping[torch.dtype, Tolerance] = DEFAULT_TOLERANCES,
    dtype: torch.dtype | None = None,
    backward: bool = True,
    ref_dtype: torch.dtype = torch.float32,
    seed: int = 0,
    label: str = "",
) -> CheckReport:
    """Compare `fn(**inputs, **kwargs)` with `ref(...)` forward and, if `backward`, backward.

    `grad_inputs` names the inputs to differentiate (default: every floating tensor input).
    The tolerance row is taken for `dtype` (default: the first input's dtype). The kernel sees
    the inputs as given — non-contiguous views stay non-contiguous.
    """
    kwargs = dict(kwargs or {})
    tensors = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    if grad_inputs is None:
        grad_inputs = [k for k, v in tensors.items() if v.is_floating_point()] if backward else []
    dtype = dtype or next(iter(tensors.values())).dtype
    tol = tolerances[dtype]

    k_in = dict(inputs)
    r_in = dict(inputs)
    for k, v in tensors.items():
        # detach() keeps the view's strides, so the kernel sees the layout the test built
        k_in[k] = v.detach().requires_grad_(k in grad_inputs)
        # copy=True: an in-place kernel (backward over its inputs) must not touch the reference's
        r_in[k] = v.detach().to(ref_dtype, copy=True).requires_grad_(k in grad_inputs)

    with poisoned():
        outs = _as_tuple(fn(**k_in, **kwargs))
    refs = _as_tuple(ref(**r_in, **kwargs))
    if len(outs) != len(refs):
        raise AssertionError(f"{label}: kernel returned {len(outs)} outputs, reference {len(refs)}")
    report = CheckReport(label or getattr(fn, "__name__", "op"))
    for i, (o, r) in enumerate(zip(outs, refs, strict=True)):
        report.rows.append(CheckRow("output", f"out{i}", rel_norm_error(o, r), tol.fwd))

    if backward and grad_inputs:
        for i, (o, r) in enumerate(zip(outs, refs, strict=True)):
            if r.requires_grad and not o.requires_grad:
                # a detached output would otherwise drop out of the backward check silently
                report.rows.append(CheckRow("grad", f"out{i} detached", math.inf, tol.bwd))
        gen = generator(seed + 1000)
        pairs = [(o, r) for o, r in zip(outs, refs, strict=True) if o.requires_grad]
        dys = [rand(o.shape, o.dtype, o.device, gen=gen) for o, _ in pairs]
        with poisoned():
            k_grads = torch.autograd.grad(
                [o for o, _ in pairs],
                [k_in[k] for k in grad_inputs],
                [d.clone() for d in dys],  # an in-place backward may write over its dy
                allow_unused=True,
            )
        r_grads = torch.autograd.grad(
            [r for _, r in pairs],
            [r_in[k] for k in grad_inputs],
            [d.to(ref_dtype, copy=True) for d in dys],
            allow_unused=True,
        )
        for name, kg, rg in zip(grad_inputs, k_grads, r_grads, strict=True):
            if kg is None or rg is None:
                err = 0.0 if kg is None and rg is None else math.inf
            else:
                err = rel_norm_error(kg, rg)
                if kg.dtype != k_in[name].dtype:
                    err = math.inf  # a gradient must come back in its input's dtype
            report.rows.append(CheckRow("grad", name, err, tol.bwd))
    return report


def check_op_seeds(
    fn: Callable,
    ref: Callable,
    make_inputs: Callable[[int], Mapping[str, torch.Tensor | None]],
    *,
    seeds: Sequence[int] = (0, 1, 2),
    **options,
) -> list[CheckReport]:
    """`check_op` on fresh inputs for each seed; raises on the first failing seed."""
    reports = []
    for seed in seeds:
        label = f"{options.pop('label', getattr(fn, '__name__', 'op'))}"
        report = check_op(
            fn, ref, make_inputs(seed), seed=seed, label=f"{label} seed={seed}", **options
        )
        report.assert_ok()
        reports.append(report)
        options["label"] = label
    return reports
