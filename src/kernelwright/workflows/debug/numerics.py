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


# Errors are summed piece by piece, pieces of at most this many elements, on the tensors' own
# device: a tensor past 2^31 elements never goes whole to float64 or to the host.
PIECE = 2**24
# The row chunks of a chunked comparison (compare(..., rows=...)) hold about this many elements.
CHUNK = 2**26


def _parts(shape, limit=PIECE):
    """Index tuples cutting a tensor of `shape` into pieces of at most `limit` elements along
    its leading dims, in order."""
    shape = tuple(shape)
    if not shape or math.prod(shape) <= limit:
        return [()]
    inner = math.prod(shape[1:])
    if inner <= limit:
        step = max(1, limit // max(1, inner))
        return [(slice(a, min(a + step, shape[0])),) for a in range(0, shape[0], step)]
    return [(i, *rest) for i in range(shape[0]) for rest in _parts(shape[1:], limit)]


def _new_error():
    # sums of squared differences and references, the largest |difference|, elements where
    # the reference is finite, whether `out` is not finite at one of them or has another shape
    return {"num": 0.0, "den": 0.0, "max": 0.0, "count": 0, "bad": False}


def _add_error(acc, out, ref):
    """Adds `out` against `ref` to `acc`, over the elements where `ref` is finite."""
    if tuple(out.shape) != tuple(ref.shape):
        acc["bad"] = True
        return
    for idx in _parts(ref.shape):
        r = ref.detach()[idx].double()
        o = out.detach()[idx].to(device=r.device, dtype=torch.float64)
        keep = torch.isfinite(r)
        count = int(keep.sum())
        if not count:
            continue
        o, r = o[keep], r[keep]
        acc["count"] += count
        if not bool(torch.isfinite(o).all()):
            acc["bad"] = True
            continue
        diff = o - r
        acc["num"] += float((diff * diff).sum())
        acc["den"] += float((r * r).sum())
        acc["max"] = max(acc["max"], float(diff.abs().max()))


def _error_of(acc):
    """(relative-norm error, max |out - ref|) of `acc`; inf when `out` was not finite where
    `ref` is, or had another shape; None when no element of `ref` was finite."""
    if acc["bad"]:
        return math.inf, math.inf
    if not acc["count"]:
        return None
    num, den = math.sqrt(acc["num"]), math.sqrt(acc["den"])
    return (num / den if den > 0 else num), acc["max"]


def _finite_error(out, ref):
    """(relative-norm error, max |out - ref|) over the elements where `ref` is finite; inf
    when `out` is not finite at one of them; None when no element of `ref` is finite."""
    acc = _new_error()
    _add_error(acc, out, ref)
    return _error_of(acc)


def _absmax_finite(t):
    """The largest |value| among the finite elements of `t` (0.0 when none is)."""
    top = 0.0
    for idx in _parts(t.shape):
        x = t.detach()[idx]
        x = x[torch.isfinite(x)]
        if x.numel():
            top = max(top, float(x.abs().max()))
    return top


def _too_big(outs, refs):
    """Why the reference's outputs do not fit the op's dtype ("" when they do)."""
    for o, r in zip(outs, refs, strict=True):
        if not (isinstance(o, torch.Tensor) and o.is_floating_point()):
            continue
        if isinstance(r, torch.Tensor) and _absmax_finite(r) > torch.finfo(o.dtype).max:
            return f"the reference's output does not fit {str(o.dtype)[6:]}"
    return ""


def _raised(name, e, tol):
    return _row(name, f"raised {type(e).__name__}: {e}", math.inf, tol)


def _grad_row(name, kg, got, inputs, tol):
    err, max_abs = got
    detail = ""
    if kg.dtype != inputs[name].dtype:
        err, detail = math.inf, f"returned in {kg.dtype}, not the input's {inputs[name].dtype}"
    return _row(f"grad:{name}", detail, err, tol, max_abs)


def compare(fn, ref, inputs, kwargs, grad_inputs, tol, seed, poisoned, rows=None):
    """Run `fn` (outputs poisoned with NaN) and `ref` (on fp32 copies) on `inputs`, forward
    and backward under the same random output gradients. Returns (passes, skipped): passes
    is a list of dicts {name, detail, error, max_abs, tol, ok} ("forward" per output,
    "grad:<input>" per gradient, "backward" when the backward raised); skipped is why the
    probe says nothing (the reference raised, or its result does not fit the dtype), else "".
    An exception of `fn` itself is a failing pass, not an error of the probe; running out of
    device memory is neither, and propagates. `rows` (input names): compare chunk by chunk of
    rows (`_compare_rows`), for inputs too large for a whole fp32 reference."""
    if rows:
        return _compare_rows(fn, ref, inputs, kwargs, grad_inputs, tol, seed, poisoned, rows)
    floats = [k for k, v in inputs.items() if isinstance(v, torch.Tensor) and v.is_floating_point()]
    wanted = floats if grad_inputs is None else [k for k in grad_inputs if k in inputs]
    k_in, r_in = dict(inputs), dict(inputs)
    for k in floats:
        v = inputs[k]
        k_in[k] = v.detach().requires_grad_(k in wanted)
        r_in[k] = v.detach().to(torch.float32, copy=True).requires_grad_(k in wanted)
    try:
        refs = _pieces(ref(**r_in, **kwargs))
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception as e:  # noqa: BLE001  the reference does not take this input
        return [], f"the reference raised {type(e).__name__}: {e}"
    try:
        with poisoned():
            outs = _pieces(fn(**k_in, **kwargs))
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception as e:  # noqa: BLE001  a crash of the op is a divergence
        return [_raised("forward", e, tol["fwd"])], ""
    if len(outs) != len(refs):
        detail = f"{len(outs)} outputs, the reference has {len(refs)}"
        return [_row("forward", detail, math.inf, tol["fwd"])], ""
    too_big = _too_big(outs, refs)
    if too_big:
        return [], too_big
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
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception as e:  # noqa: BLE001
        return passes + [_raised("backward", e, tol["bwd"])], ""
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
        if got is not None:
            passes.append(_grad_row(name, kg, got, inputs, tol["bwd"]))
    return passes, ""


def _compare_rows(fn, ref, inputs, kwargs, grad_inputs, tol, seed, poisoned, rows):
    """compare() for an op computed row by row, on inputs too large for a whole fp32
    reference: the op runs on the whole inputs; the reference on chunks of rows (the inputs
    named in `rows` sliced along dim 0, the others whole), each chunk compared as it comes:
    the outputs and the row inputs' gradients slice by slice, the other inputs' gradients
    summed over the chunks (for such an op, dL/dw is the sum of each chunk's). Every element
    is compared; the errors are those of compare(). The output gradients are drawn chunk by
    chunk on the outputs' device (each output its own generator: the same numbers on the same
    device, not those compare() draws on the CPU), drawn again for the reference: the op's
    backward may overwrite them."""
    floats = [k for k, v in inputs.items() if isinstance(v, torch.Tensor) and v.is_floating_point()]
    wanted = floats if grad_inputs is None else [k for k in grad_inputs if k in inputs]
    m = inputs[rows[0]].shape[0]
    width = max(max(1, inputs[k][:1].numel()) for k in rows)
    step = max(1, CHUNK // width)
    spans = [(a, min(a + step, m)) for a in range(0, m, step)]

    def ref_inputs(a, b):
        out = {}
        for k, v in inputs.items():
            v = v[a:b] if k in rows else v
            if k in floats:
                v = v.detach().to(torch.float32, copy=True).requires_grad_(k in wanted)
            out[k] = v
        return out

    try:  # one row first: the reference's outputs, and which of them take a gradient
        first = _pieces(ref(**ref_inputs(0, 1), **kwargs))
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception as e:  # noqa: BLE001
        return [], f"the reference raised {type(e).__name__}: {e}"
    k_in = {k: v.detach().requires_grad_(k in wanted) if k in floats else v
            for k, v in inputs.items()}  # fmt: skip
    try:
        with poisoned():
            outs = _pieces(fn(**k_in, **kwargs))
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception as e:  # noqa: BLE001
        return [_raised("forward", e, tol["fwd"])], ""
    if len(outs) != len(first):
        detail = f"{len(outs)} outputs, the reference has {len(first)}"
        return [_row("forward", detail, math.inf, tol["fwd"])], ""
    grad_outs = [i for i, r in enumerate(first) if isinstance(r, torch.Tensor) and r.requires_grad]
    backward = bool(wanted and grad_outs)
    extra = []
    if backward and any(not outs[i].requires_grad for i in grad_outs):
        extra, backward = [_row("backward", "an output is detached", math.inf, tol["bwd"])], False

    def draws():
        return [torch.Generator(outs[i].device).manual_seed(seed + 1000 + i) for i in grad_outs]

    def dy_chunk(gen, i, a, b):
        o = outs[i]
        return torch.randn(o[a:b].shape, generator=gen, device=o.device).to(o.dtype)

    k_grads = None
    if backward:
        dys = []
        for gen, i in zip(draws(), grad_outs, strict=True):
            d = torch.empty(outs[i].shape, dtype=outs[i].dtype, device=outs[i].device)
            for a, b in spans:
                d[a:b] = dy_chunk(gen, i, a, b)
            dys.append(d)
        try:
            with poisoned():
                k_grads = torch.autograd.grad(
                    [outs[i] for i in grad_outs], [k_in[k] for k in wanted], dys,
                    allow_unused=True,
                )  # fmt: skip
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as e:  # noqa: BLE001
            extra = [_raised("backward", e, tol["bwd"])]
        del dys
    fwd = [_new_error() for _ in outs]
    bwd = {k: _new_error() for k in wanted}
    whole = {}  # gradients of the inputs not split by rows, summed over the chunks
    no_grad = {}  # input -> the reference's gradient is None
    gens = draws()
    for a, b in spans:
        r_in = ref_inputs(a, b)
        try:
            refs = _pieces(ref(**r_in, **kwargs))
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as e:  # noqa: BLE001
            return [], f"the reference raised {type(e).__name__} on rows {a}:{b}: {e}"
        parts = [o[a:b] if isinstance(o, torch.Tensor) and o.dim() else o for o in outs]
        too_big = _too_big(parts, refs)
        if too_big:
            return [], too_big
        for acc, o, r in zip(fwd, parts, refs, strict=True):
            if isinstance(o, torch.Tensor) and isinstance(r, torch.Tensor):
                _add_error(acc, o, r)
        if k_grads is None:
            continue
        dy = [dy_chunk(gen, i, a, b).float() for gen, i in zip(gens, grad_outs, strict=True)]
        r_grads = torch.autograd.grad([refs[i] for i in grad_outs], [r_in[k] for k in wanted],
                                      dy, allow_unused=True)  # fmt: skip
        for k, kg, rg in zip(wanted, k_grads, r_grads, strict=True):
            no_grad[k] = rg is None
            if kg is None or rg is None:
                continue
            if k in rows:
                _add_error(bwd[k], kg[a:b], rg)
            else:
                whole[k] = rg.detach() if k not in whole else whole[k] + rg.detach()
    passes = []
    for i, acc in enumerate(fwd):
        got = _error_of(acc)
        if got is not None:
            passes.append(_row("forward", f"out{i}", got[0], tol["fwd"], got[1]))
    if k_grads is not None:
        for k, kg in zip(wanted, k_grads, strict=True):
            if kg is None or no_grad[k]:
                err = 0.0 if kg is None and no_grad[k] else math.inf
                passes.append(_row(f"grad:{k}", "no gradient", err, tol["bwd"]))
                continue
            if k in whole:
                _add_error(bwd[k], kg, whole[k])
            got = _error_of(bwd[k])
            if got is not None:
                passes.append(_grad_row(k, kg, got, inputs, tol["bwd"]))
    return passes + extra, ""


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
