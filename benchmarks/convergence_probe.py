"""Which patched part makes mixtral fp32 diverge early on the GPU (issue-5 NOTES).

Runs `run_convergence` at the "gpu" size with one part of the patch on at a time and prints
each run's per-step |loss - loss_ref| next to the control's. Prints only.

    python benchmarks/convergence_probe.py [model_type] [dtype]
"""

from __future__ import annotations

import sys
import time

import torch

from kernelwright.testing.convergence import RUNS, run_convergence, tiny_config
from kernelwright.workflows.autopatch import analyze

PARTS = ("rms_norm", "rope", "moe_experts", "fused_linear_cross_entropy", "mlp")
EPS = {
    torch.float32: torch.finfo(torch.float32).eps,
    torch.bfloat16: torch.finfo(torch.bfloat16).eps,
}


def _steps(shape, device, dtype, gen):
    return torch.randint(-1, 2, shape, generator=gen).to(device, dtype)


class _GradJitter(torch.autograd.Function):
    """Identity forward; the gradient moved one rounding step per element."""

    @staticmethod
    def forward(ctx, x, gen):
        ctx.gen = gen
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * (1 + _steps(g.shape, g.device, g.dtype, ctx.gen) * EPS[g.dtype]), None


def _norms(model):
    return [m for m in model.modules() if "Norm" in type(m).__name__]


def jitter(kind, seed=5):
    """A patch_fn that perturbs the unpatched model by rounding steps, in one place."""

    def fn(model, *, profile=None, **kwargs):
        gen = torch.Generator().manual_seed(seed)
        if kind in ("norm_out_elements", "norm_out_rows"):
            rows = kind == "norm_out_rows"

            def hook(module, args, out):
                shape = (*out.shape[:-1], 1) if rows else out.shape
                return out * (1 + _steps(shape, out.device, out.dtype, gen) * EPS[out.dtype])

            for m in _norms(model):
                m.register_forward_hook(hook)
        elif kind == "norm_dx":
            for m in _norms(model):
                m.register_forward_pre_hook(lambda mod, args: (_GradJitter.apply(args[0], gen),))
        elif kind in ("norm_dw", "all_grads"):
            params = (
                [p for m in _norms(model) for p in m.parameters()]
                if kind == "norm_dw"
                else list(model.parameters())
            )
            for p in params:
                p.register_hook(
                    lambda g: g * (1 + _steps(g.shape, g.device, g.dtype, gen) * EPS[g.dtype])
                )
        elif kind == "norm_rows_and_grads":
            jitter("norm_out_rows", seed)(model)
            jitter("norm_dx", seed + 1)(model)
            jitter("all_grads", seed + 2)(model)
        else:
            raise ValueError(kind)
        return profile

    return fn


def _top(errors, n=6):
    return ", ".join(f"{k} {v:.2g}" for k, v in sorted(errors.items(), key=lambda kv: -kv[1])[:n])


def main() -> None:
    model_type = sys.argv[1] if len(sys.argv) > 1 else "mixtral"
    dtype = getattr(torch, sys.argv[2] if len(sys.argv) > 2 else "float32")
    config = tiny_config(model_type, size="gpu")
    profile = analyze(tiny_config(model_type))
    print(torch.cuda.get_device_name(), torch.__version__, model_type, dtype, flush=True)
    cases = {"all": ({}, None), "only_rms_norm": ({p: p == "rms_norm" for p in PARTS}, None)}
    kinds = ("norm_out_elements", "norm_out_rows", "norm_dx", "norm_dw", "all_grads")
    for kind in (*kinds, "norm_rows_and_grads"):
        for seed in (5, 6):
            cases[f"{kind}_{seed}"] = ({}, jitter(kind, seed))
    for name, (kwargs, patch_fn) in cases.items():
        t0 = time.perf_counter()
        r = run_convergence(
            config,
            dtype=dtype,
            device="cuda",
            profile=profile,
            patch_kwargs=kwargs,
            patch_fn=patch_fn,
            control=name == "all",
            **RUNS["gpu"],
        )
        p = r.patched
        first = next((i for i, d in enumerate(p.loss_diffs) if d > 1e-4), None)
        print(
            f"\n== {name}: {time.perf_counter() - t0:.1f} s; grads {p.grad_error:.3g}, "
            f"params {p.param_error:.3g}, logprobs {p.logprob_diff:.3g}, max loss diff "
            f"{max(p.loss_diffs):.2g}, first step > 1e-4: {first}",
            flush=True,
        )
        print("  step-0 grads:", _top(p.grad_errors))
        if r.control:
            c = r.control
            print(
                "  control: first > 1e-4:",
                next((i for i, d in enumerate(c.loss_diffs) if d > 1e-4), None),
                "grads",
                f"{c.grad_error:.3g}",
                _top(c.grad_errors),
            )
            print("  problems:", *r.check(), sep="\n    ")
        print(" ", " ".join(f"{i}:{d:.2g}" for i, d in enumerate(p.loss_diffs)))


if __name__ == "__main__":
    main()
