"""fused_add_rms_norm's backward with dW parked in ds (no partial rows) and without, in one
process (prints, CSV to $OUT). NOTES 47.

For each shape: the backward launcher alone and forward+backward through autograd, parking
on (the launcher's choice, `_park_programs`) and off (`_park_programs` answering 0: fp32
partial rows, or the few-rows column kernel), alternating over several rounds; the backward's
peak memory above its inputs and outputs; ds bit for bit and dW against the partial-row
form. GPU time (host hidden), the reading flush before each rep.

    python benchmarks/park_probe.py [--rounds 5]
"""

from __future__ import annotations

import torch
from _probe import gpu_setup, rounds_args, rounds_summary, write_csv

import kernelwright as kw
from kernelwright.ops import fused_add_rms_norm as far

SHAPES = [(1024, 4096), (2048, 4096), (4096, 4096), (8192, 4096), (4096, 3584), (8192, 3584)]


def _off(*args, **kwargs) -> int:
    return 0


def backward_calls(m: int, n: int) -> tuple:
    """(bwd, full, ds, dw) at m x n bf16: the backward launcher alone (writing ds and dW) and
    autograd's forward+backward, on fresh inputs with both upstream gradients."""
    gen = torch.Generator(device="cuda").manual_seed(m + n)
    x, r, dy, dres = (
        torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4)
    )
    w = (1 + 0.5 * torch.randn(n, device="cuda", generator=gen)).to(torch.bfloat16)
    y, s, rstd = torch.empty_like(x), torch.empty_like(x), torch.empty(m, device="cuda")
    far.fused_add_rms_norm_fwd_launch(x, r, w, y, s, rstd, 1e-6, 0.0, "llama")
    ds, dw = torch.empty_like(x), torch.empty_like(w)
    xg, rg, wg = (t.clone().requires_grad_() for t in (x, r, w))

    def bwd():
        far.fused_add_rms_norm_bwd_launch(dy, dres, s, w, rstd, ds, dw, 0.0, "llama")

    def full():
        xg.grad = rg.grad = wg.grad = None
        out, res = kw.fused_add_rms_norm(xg, rg, wg)
        torch.autograd.backward((out, res), (dy, dres))

    return bwd, full, ds, dw


def probe(m: int, n: int, timer, rounds: int) -> list[dict]:
    real = far._park_programs
    bwd, full, ds, dw = backward_calls(m, n)
    results = {}
    try:
        for on in (True, False):
            far._park_programs = real if on else _off
            ds.fill_(float("nan"))
            dw.fill_(float("nan"))
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            bwd()
            torch.cuda.synchronize()
            extra = (torch.cuda.max_memory_allocated() - base) / 2**20
            results[on] = (ds.clone(), dw.float().clone(), extra)
        same_ds = torch.equal(results[True][0], results[False][0])
        diff = results[True][1] - results[False][1]
        dw_err = (diff.norm() / results[False][1].norm()).item()
        print(f"{m}x{n}: ds bit-identical {same_ds}, dW rel err {dw_err:.2e}, workspace"
              f" {results[True][2]:.2f} MB parked / {results[False][2]:.2f} MB not",
              flush=True)  # fmt: skip
        times: dict[tuple[str, bool], list[float]] = {}
        for _ in range(rounds):
            for on in (True, False):
                far._park_programs = real if on else _off
                for mode, fn in (("backward", bwd), ("full", full)):
                    times.setdefault((mode, on), []).append(timer(fn, lambda: None)[1])
    finally:
        far._park_programs = real
    rows = []
    for (mode, on), ts in times.items():
        stats = rounds_summary(f"{m}x{n} {mode:8s} parked={on!s:5s}", ts)
        rows.append(dict(shape=f"{m}x{n}", mode=mode, parked=on, **stats,
                         workspace_mb=results[on][2], ds_identical=same_ds,
                         dw_rel_err=dw_err))  # fmt: skip
    return rows


def main() -> None:
    args = rounds_args()
    timer, _, _ = gpu_setup()
    rows = []
    for m, n in SHAPES:
        rows += probe(m, n, timer, args.rounds)
    write_csv(args.out, "park_probe.csv", rows)


if __name__ == "__main__":
    main()
