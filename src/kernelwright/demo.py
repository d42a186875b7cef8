"""`kernelwright demo`: verify every library kernel against its reference, then benchmark.

On a GPU both run there (benchmarks at real model shapes, all providers); without one, the
kernels run through Triton's interpreter on small shapes and the benchmark table only shows
that the harness works end to end — interpreter timings say nothing about GPU speed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from rich.console import Console
from rich.table import Table

from kernelwright.ops.cross_entropy import cross_entropy, cross_entropy_ref
from kernelwright.ops.fused_add_rms_norm import fused_add_rms_norm, fused_add_rms_norm_ref
from kernelwright.ops.fused_linear_cross_entropy import (
    fused_linear_cross_entropy,
    fused_linear_cross_entropy_ref,
)
from kernelwright.ops.geglu import geglu, geglu_ref
from kernelwright.ops.jagged_mean import jagged_mean, jagged_mean_ref
from kernelwright.ops.layer_norm import layer_norm, layer_norm_ref
from kernelwright.ops.relu_squared import relu_squared, relu_squared_ref
from kernelwright.ops.rms_norm import rms_norm, rms_norm_ref
from kernelwright.ops.rope import rope, rope_ref
from kernelwright.ops.softmax import log_softmax, log_softmax_ref, softmax, softmax_ref
from kernelwright.ops.swiglu import swiglu, swiglu_fused, swiglu_fused_ref, swiglu_ref
from kernelwright.runtime import default_device, device_info
from kernelwright.testing import check_op, class_targets, generator, rand


@dataclass(frozen=True)
class VerifyCase:
    op: str
    fn: Callable
    ref: Callable
    make: Callable[[tuple[int, ...], torch.dtype, torch.device, int], dict]
    kwargs: dict
    # Shapes in the case's own convention, (GPU shapes, CPU shapes); default: x-like [..., N].
    shapes: tuple[list[tuple[int, ...]], list[tuple[int, ...]]] | None = None
    grad_inputs: tuple[str, ...] | None = None  # default: every float input


def _rms_inputs(shape, dtype, device, seed):
    gen = generator(seed)
    x = rand(shape, dtype, device, gen=gen)
    return {"x": x, "weight": rand(shape[-1:], dtype, device, gen=gen, mean=1.0, std=0.5)}


def _swiglu_inputs(shape, dtype, device, seed):
    gen = generator(seed)
    return {"gate": rand(shape, dtype, device, gen=gen), "up": rand(shape, dtype, device, gen=gen)}


def _fused_add_inputs(shape, dtype, device, seed):
    inputs = _rms_inputs(shape, dtype, device, seed)
    inputs["residual"] = rand(shape, dtype, device, gen=generator(seed + 1))
    return inputs


def _layer_norm_inputs(shape, dtype, device, seed):
    inputs = _rms_inputs(shape, dtype, device, seed)
    inputs["bias"] = rand(shape[-1:], dtype, device, gen=generator(seed + 1), std=0.1)
    return inputs


def _jagged_inputs(shape, dtype, device, seed):
    # shape's last dim is D; the leading dims' product is the row total, cut into segments
    # of lengths 0..7 (empty ones included)
    *lead, d = shape
    total = 1
    for s in lead:
        total *= s
    gen = generator(seed)
    lengths = torch.randint(0, 8, (total,), generator=gen)
    cut = torch.cumsum(lengths, 0)
    cut = cut[cut < total]
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), cut, torch.tensor([total])])
    return {"values": rand((total, d), dtype, device, gen=gen), "offsets": offsets.to(device)}


def _one_input(shape, dtype, device, seed):
    return {"x": rand(shape, dtype, device, gen=generator(seed))}


def _rope_inputs(shape, dtype, device, seed):
    # shape = (B, S, Hq, Hk, D, R): q, k as HF's transposed [B, H, S, D] views, random cos/sin
    # [1, S, R] in fp32 (every channel's cos and sin distinct, not just a real table)
    b, s, hq, hk, d, r = shape
    gen = generator(seed)
    return {
        "q": rand((b, s, hq, d), dtype, device, gen=gen).transpose(1, 2),
        "k": rand((b, s, hk, d), dtype, device, gen=gen).transpose(1, 2),
        "cos": rand((1, s, r), torch.float32, device, gen=gen),
        "sin": rand((1, s, r), torch.float32, device, gen=gen),
    }


# (B, S, Hq, Hk, D, R): Llama-3-8B's heads on the GPU; GQA 3:1 and partial rotary on the CPU
_ROPE_SHAPES = ([(2, 2048, 32, 8, 128, 128), (1, 4096, 64, 8, 128, 64)],
                [(2, 7, 6, 2, 64, 64), (1, 9, 5, 3, 96, 32)])  # fmt: skip


def _swiglu_fused_inputs(shape, dtype, device, seed):
    *lead, n = shape
    return {"x": rand((*lead, 2 * n), dtype, device, gen=generator(seed))}


def _targets(lead, v, gen, device):
    # class indices in [0, V) of shape `lead`, about 1 in 8 of them ignore_index (-100)
    return class_targets(lead, v, gen, device, ignore_fraction=0.125)


def _ce_inputs(shape, dtype, device, seed):
    # shape = (..., V): logits of std 4 (a trained lm-head's spread) and their targets
    gen = generator(seed)
    return {
        "logits": rand(shape, dtype, device, gen=gen, std=4.0),
        "target": _targets(shape[:-1], shape[-1], gen, device),
    }


def _flce_inputs(shape, dtype, device, seed):
    # shape = (..., H, V): hidden [..., H], lm-head weight [V, H] scaled for logits of std ~3
    *lead, h, v = shape
    gen = generator(seed)
    return {
        "hidden": rand((*lead, h), dtype, device, gen=gen),
        "weight": rand((v, h), dtype, device, gen=gen, std=3.0 / h**0.5),
        "target": _targets(lead, v, gen, device),
    }


# check_op hands the reference fp32 copies of every input tensor, the targets included.
def _ce_ref(logits, target, **kwargs):
    return cross_entropy_ref(logits, target.long(), **kwargs)


def _flce_ref(hidden, weight, target, **kwargs):
    return fused_linear_cross_entropy_ref(hidden, weight, target.long(), **kwargs)


# (..., V): Llama-3's vocabulary on the GPU; on the CPU a one-block and a looped row (V > 4096)
_CE_SHAPES = ([(4, 1000, 32768), (2048, 128256)], [(3, 5, 300), (7, 5000)])
# (..., H, V): Llama-3-8B's lm-head on the GPU. chunk_size=32 (options case): several chunks
_FLCE_SHAPES = ([(4, 1024, 4096, 128256), (1000, 2048, 32000)], [(2, 9, 32, 300), (45, 40, 130)])
_CE_OPTIONS = {"label_smoothing": 0.1, "softcap": 30.0, "lse_square_scale": 1e-4}

CASES = [
    VerifyCase("rms_norm (llama)", rms_norm, rms_norm_ref, _rms_inputs, {}),
    VerifyCase(
        "rms_norm (gemma)",
        rms_norm,
        rms_norm_ref,
        _rms_inputs,
        {"casting_mode": "gemma", "offset": 1.0},
    ),
    VerifyCase(
        "fused_add_rms_norm",
        fused_add_rms_norm,
        fused_add_rms_norm_ref,
        _fused_add_inputs,
        {},
    ),
    VerifyCase("layer_norm", layer_norm, layer_norm_ref, _layer_norm_inputs, {}),
    VerifyCase("swiglu", swiglu, swiglu_ref, _swiglu_inputs, {}),
    VerifyCase("geglu (tanh)", geglu, geglu_ref, _swiglu_inputs, {"approximate": "tanh"}),
    VerifyCase("geglu (erf)", geglu, geglu_ref, _swiglu_inputs, {"approximate": "none"}),
    VerifyCase("relu_squared", relu_squared, relu_squared_ref, _one_input, {}),
    VerifyCase("softmax", softmax, softmax_ref, _one_input, {}),
    VerifyCase("log_softmax", log_softmax, log_softmax_ref, _one_input, {}),
    VerifyCase("jagged_mean", jagged_mean, jagged_mean_ref, _jagged_inputs, {}),
    VerifyCase("swiglu_fused", swiglu_fused, swiglu_fused_ref, _swiglu_fused_inputs, {}),
    VerifyCase("rope", rope, rope_ref, _rope_inputs, {}, _ROPE_SHAPES, ("q", "k")),
    VerifyCase(
        "rope (interleaved)",
        rope,
        rope_ref,
        _rope_inputs,
        {"interleaved": True},
        _ROPE_SHAPES,
        ("q", "k"),
    ),
    VerifyCase("cross_entropy", cross_entropy, _ce_ref, _ce_inputs, {}, _CE_SHAPES),
    VerifyCase(
        "cross_entropy (smoothing, softcap, z-loss)",
        cross_entropy,
        _ce_ref,
        _ce_inputs,
        {**_CE_OPTIONS, "return_z_loss": True},
        _CE_SHAPES,
    ),
    VerifyCase(
        "fused_linear_cross_entropy",
        fused_linear_cross_entropy,
        _flce_ref,
        _flce_inputs,
        {},
        _FLCE_SHAPES,
    ),
    VerifyCase(
        "fused_linear_cross_entropy (options, fp32 dW)",
        fused_linear_cross_entropy,
        _flce_ref,
        _flce_inputs,
        {**_CE_OPTIONS, "accum_dtype": torch.float32, "chunk_size": 32},
        _FLCE_SHAPES,
    ),
]

# Tolerances on the relative-norm error, as in the test suite's tables.
_TOL = {torch.float32: (1e-5, 1e-4), torch.float16: (2e-3, 4e-3), torch.bfloat16: (1.4e-2, 1.6e-2)}


def verify(console: Console, device: torch.device) -> bool:
    """Forward and backward of every case against its fp32 reference; prints a table."""
    from kernelwright.testing import Tolerance

    tols = {dt: Tolerance(*t) for dt, t in _TOL.items()}
    shapes = [(4, 1000, 4096), (2048, 16384)] if device.type == "cuda" else [(3, 5, 300), (7, 1500)]
    table = Table(title=f"Correctness against the fp32 reference ({device_info(device).name})")
    for col in ("op", "dtype", "shape", "max output err", "max grad err", "result"):
        table.add_column(col)
    all_ok = True
    for case in CASES:
        case_shapes = shapes
        if case.shapes is not None:
            case_shapes = case.shapes[0 if device.type == "cuda" else 1]
        for dtype in (torch.float32, torch.bfloat16):
            for shape in case_shapes:
                report = check_op(
                    case.fn,
                    case.ref,
                    case.make(shape, dtype, device, 0),
                    kwargs=case.kwargs,
                    grad_inputs=case.grad_inputs,
                    tolerances=tols,
                    dtype=dtype,
                )
                out = max(r.error for r in report.rows if r.kind == "output")
                grad = max((r.error for r in report.rows if r.kind == "grad"), default=0.0)
                all_ok &= report.ok
                table.add_row(
                    case.op,
                    str(dtype).replace("torch.", ""),
                    "x".join(map(str, shape)),
                    f"{out:.2e}",
                    f"{grad:.2e}",
                    "[green]ok" if report.ok else "[red]FAIL",
                )
    console.print(table)
    return all_ok


def run_demo(console: Console | None = None) -> bool:
    from kernelwright.bench.harness import make_context, run_spec
    from kernelwright.bench.report import print_summary
    from kernelwright.bench.specs import SPECS

    console = console or Console()
    device = default_device()
    info = device_info(device)
    console.print(
        f"[bold]kernelwright demo[/] on {info.name} ({info.arch}); torch {torch.__version__}"
    )
    ok = verify(console, device)
    # GPU time alone: at these sizes a Triton call's launch costs as much CPU time as the
    # kernel takes, and timing the CPU would compare launchers, not kernels.
    ctx = make_context(hide_host=True)
    if device.type != "cuda":
        console.print(
            "[yellow]No GPU: the benchmark below runs through the interpreter on tiny shapes; "
            "its times show the harness works, not how fast anything is."
        )
    rows = []
    for spec in SPECS.values():
        rows += run_spec(spec, modes=("forward", "full"), quick=True, ctx=ctx)
    print_summary(rows, console=console)
    if not ok:
        console.print("[red bold]Some kernels do not match their reference (table above).")
    return ok
