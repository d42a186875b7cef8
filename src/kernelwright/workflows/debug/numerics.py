"""The numerics of one probe: how its inputs are transformed and how the op is compared.

Each function here uses only `torch` and `math` (and `poisoned`, passed in), because
`repro.py` carries a copy of their source: the repro builds the same inputs and compares the
same way as the probe that failed, without importing the debug workflow.

The value and layout regimes change the *data* inputs only: floating tensors that are not
parameters or tables (weights, biases, cos/sin), so a regime means the same for every op.
"""

from __future__ import annotations

import math

import torch

# Names of inputs that are parameters or tables, not data: the regimes leave them alone.
NOT_DATA = ("weight", "bias", "w", "b", "cos", "sin", "class_weight")


def data_names(inputs):
    """The data inputs of `inputs` ({name: tensor}): floating, at least 1-D, not a parameter."""
    out = []
    for name, t in inputs.items():
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dim() < 1:
            continue
        if name in NOT_DATA or name.endswith(("_weight", "_proj")):
            continue
        out.append(name)
    return out


def with_values(inputs, regime, seed):
    """`inputs` with the data inputs' values in `regime`: normal (as made); large (x 1000:
    scale-invariant ops must not overflow); all_equal (each row one value, a multiple of 1/8,
    so that row sums and means are exact); inf / nan (-inf or NaN at about 1 in 8 positions,
    never a row's first element)."""
    if regime == "normal":
        return dict(inputs)
    gen = torch.Generator().manual_seed(seed + 7)
    out = dict(inputs)
    for name in data_names(inputs):
        t = inputs[name]
        x = t.detach().float().cpu()
        if regime == "large":
            x = x * 1000.0
        elif regime == "all_equal":
            c = torch.round(x[..., :1] * 8) / 8
            c = torch.where(c == 0, torch.full_like(c, 0.125), c)
            x = c.expand(x.shape).clone()
        elif regime in ("inf", "nan"):
            hit = torch.rand(x.shape, generator=gen) < 0.125
            if x.dim() >= 1 and x.shape[-1] > 1:
                hit[..., 0] = False
            x = x.masked_fill(hit, -math.inf if regime == "inf" else math.nan)
        else:
            raise ValueError(f"unknown value regime {regime!r}")
        out[name] = x.to(device=t.device, dtype=t.dtype)
    return out


def with_layout(inputs, layout):
    """`inputs` with the data inputs of 2 or more dims in `layout`, the same values:
    contiguous; row_strided (a slice of rows 3 elements wider, the padding NaN, so a kernel
    that ignores the row stride reads NaN); transposed (the last dim not contiguous)."""
    if layout == "contiguous":
        return dict(inputs)
    out = dict(inputs)
    for name in data_names(inputs):
        t = inputs[name]
        if t.dim() < 2:
            continue
        if layout == "row_strided":
            n = t.shape[-1]
            wide = torch.full((*t.shape[:-1], n + 3), math.nan, dtype=t.dtype, device=t.device)
            wide[..., :n] = t
            out[name] = wide[..., :n]
        elif layout == "transposed":
            out[name] = t.transpose(-1, -2).contiguous().transpose(-1, -2)
        else:
            raise ValueError(f"unknown layout {layout!r}")
    return out


def _pieces(x):
    return list(x) if isinstance(x, (tuple, list)) else [x]


def _finite_error(out, ref):
    """(relative-norm error, max |out - ref|) over the elements where `ref` is finite; inf
    when `out` is not finite at one of them; None when no element of `ref` is finite."""
    if tuple(out.shape) != tuple(ref.shape):
        return math.inf, math.inf
    o = out.detach().double().cpu()
    r = ref.detach().double().cpu()
    keep = torch.isfinite(r)
    if not bool(keep.any()):
        return None
    o, r = o[keep], r[keep]
    if not bool(torch.isfinite(o).all()):
        return math.inf, math.inf
    diff = o - r
    num, den = diff.norm().item(), r.norm().item()
    return (num / den if den > 0 else num), diff.abs().max().item()


def compare(fn, ref, inputs, kwargs, grad_inputs, tol, seed, poisoned):
    """Run `fn` (outputs poisoned with NaN) and `ref` (on fp32 copies) on `inputs`, forward
    and backward under the same random output gradients. Returns (passes, skipped): passes
    is a list of dicts {name, detail, error, max_abs, tol, ok} ("forward" per output,
    "grad:<input>" per gradient, "backward" when the backward raised); skipped is why the
    probe says nothing (the reference raised, or its result does not fit the dtype), else "".
    An exception of `fn` itself is a failing pass, not an error of the probe."""
    floats = [k for k, v in inputs.items() if isinstance(v, torch.Tensor) and v.is_floating_point()]
    wanted = floats if grad_inputs is None else [k for k in grad_inputs if k in inputs]
    k_in, r_in = dict(inputs), dict(inputs)
    for k in floats:
        v = inputs[k]
        k_in[k] = v.detach().requires_grad_(k in wanted)
        r_in[k] = v.detach().to(torch.float32, copy=True).requires_grad_(k in wanted)
    try:
        refs = _pieces(ref(**r_in, **kwargs))
    except Exception as e:  # noqa: BLE001  the reference does not take this input
        return [], f"the reference raised {type(e).__name__}: {e}"
    try:
        with poisoned():
            outs = _pieces(fn(**k_in, **kwargs))
    except Exception as e:  # noqa: BLE001  a crash of the op is a divergence
        return [_row("forward", f"raised {type(e).__name__}: {e}", math.inf, tol["fwd"])], ""
    if len(outs) != len(refs):
        detail = f"{len(outs)} outputs, the reference has {len(refs)}"
        return [_row("forward", detail, math.inf, tol["fwd"])], ""
    for o, r in zip(outs, refs, strict=True):
        if isinstance(o, torch.Tensor) and o.is_floating_point() and isinstance(r, torch.Tensor):
            big = torch.finfo(o.dtype).max
            finite = r.detach()[torch.isfinite(r.detach())]
            if finite.numel() and float(finite.abs().max()) > big:
                return [], f"the reference's output does not fit {str(o.dtype)[6:]}"
    passes = []
    for i, (o, r) in enumerate(zip(outs, refs, strict=True)):
        got = _finite_error(o, r)
        if got is not None:
            passes.append(_row("forward", f"out{i}", got[0], tol["fwd"], got[1]))
    pairs = [
        (o, r)
        for o, r in zip(outs, refs, strict=True)
        if isinstance(r, torch.Tensor) and r.requires_grad
    ]
    if not wanted or not pairs:
        return passes, ""
    if any(not o.requires_grad for o, _ in pairs):
        return passes + [_row("backward", "an output is detached", math.inf, tol["bwd"])], ""
    gen = torch.Generator().manual_seed(seed + 1000)
    dys = [torch.randn(o.shape, generator=gen).to(o.device, o.dtype) for o, _ in pairs]
    try:
        with poisoned():
            k_grads = torch.autograd.grad(
                [o for o, _ in pairs], [k_in[k] for k in wanted], [d.clone() for d in dys],
                allow_unused=True,
            )  # fmt: skip
    except Exception as e:  # noqa: BLE001
        return passes + [
            _row("backward", f"raised {type(e).__name__}: {e}", math.inf, tol["bwd"])
        ], ""
    r_grads = torch.autograd.grad(
        [r for _, r in pairs], [r_in[k] for k in wanted], [d.float() for d in dys],
        allow_unused=True,
    )  # fmt: skip
    for name, kg, rg in zip(wanted, k_grads, r_grads, strict=True):
        if kg is None or rg is None:
            err = 0.0 if kg is None and rg is None else math.inf
            passes.append(_row(f"grad:{name}", "no gradient", err, tol["bwd"]))
            continue
        got = _finite_error(kg, rg)
        if got is None:
            continue
        err, max_abs = got
        detail = ""
        if kg.dtype != inputs[name].dtype:
            err, detail = math.inf, f"returned in {kg.dtype}, not the input's {inputs[name].dtype}"
        passes.append(_row(f"grad:{name}", detail, err, tol["bwd"], max_abs))
    return passes, ""


def _row(name, detail, error, tol, max_abs=None):
    max_abs = error if max_abs is None else max_abs
    # agreement: the relative-norm error within tol, or every difference within tol (a
    # reference near zero, where a relative error says nothing); NaN compares False: it fails
    ok = bool(error <= tol or max_abs <= tol)
    return {
        "name": name,
        "detail": detail,
        "error": error,
        "max_abs": max_abs,
        "tol": tol,
        "ok": ok,
    }
