"""softmax's split rows (past 32768 columns): the exchange of statistics in the output's rows
against the workspace form, forward and backward, one process (prints, CSV to $OUT).

NOTES 59. The split kernels kept each chunk's statistics and the rows' counters in an fp32/int32
workspace, 0.14-0.52 MB over torch.compile's peak at 4096 rows. The library now keeps them at
the start of each row's own output; `workspace` is the library with that switched off
(`_split.exchange_values` -> 0). Both kernels alone, bf16, `--rounds` alternating rounds,
medians; then each form's peak memory above its inputs and outputs (the launches alone), and
the words kernels (the values over each row's words) alone at 16, 8, 4 and 1 warps.

    python benchmarks/softmax_exchange_probe.py [--rounds 5] [--no-words]

`no_prefetch` and `prefetch` (NOTES 63): in the output, with the prefetch of each row's counter
line in neither direction or in both (the library: the backward only). At 4344aa9 the library
prefetched in both, `no_prefetch` as now.
"""

from __future__ import annotations

import functools
import sys

import torch
from _probe import gpu_setup, rounds_args, rounds_summary, write_csv

from kernelwright.ops import _split
from kernelwright.ops import softmax as sm
from kernelwright.ops.softmax import softmax_bwd_launch, softmax_fwd_launch

SHAPES = [(4096, n) for n in (65536, 128256, 131072, 152064, 256000, 262144)]
FORMS = ("in_out", "workspace", "no_prefetch", "prefetch")


def _form(name: str):
    """Run a launch in the named form (`in_out`: the library's; `no_prefetch`: in the output,
    its counters not prefetched in either direction; `prefetch`: prefetched in both, NOTES 63)."""
    original = _split.exchange_values
    table = sm.PREFETCH_FWD, sm.PREFETCH_BWD

    def run(fn):
        _split.exchange_values = original if name != "workspace" else (lambda *args: 0)
        if name in ("no_prefetch", "prefetch"):
            sm.PREFETCH_FWD = sm.PREFETCH_BWD = name == "prefetch"
        try:
            return fn()
        finally:
            _split.exchange_values = original
            sm.PREFETCH_FWD, sm.PREFETCH_BWD = table

    return run


def _peak(fn) -> int:
    """Bytes allocated by `fn` above what existed before it."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def _words_kernels(timer, x, dy, y, dx, warps) -> list[dict]:
    """The words kernels alone (the values over each row's words, after the split kernel) at
    each of `warps`; they read whatever the words hold by then (timing only)."""
    import triton

    m, n = x.shape
    rows = []
    for mode, kernel in (
        ("fwd", sm._softmax_fwd_words_kernel),
        ("bwd", sm._softmax_bwd_words_kernel),
    ):
        cfg = (sm.forward_config if mode == "fwd" else sm.backward_config)(x)
        splits = triton.cdiv(n, cfg.block_n)
        words = _split.exchange_values(y if mode == "fwd" else dx, [x], cfg.block_n, splits,
                                       2 if mode == "fwd" else 1)  # fmt: skip
        consts = dict(IS_LOG=False, SPLITS=splits, SPLITS_P2=triton.next_power_of_2(splits),
                      OUT_WORDS=words, WORDS_P2=triton.next_power_of_2(words))  # fmt: skip
        for w in warps:
            if mode == "fwd":
                args = (x, y, x.stride(0), y.stride(0))
            else:
                args = (dy, y, dx, dy.stride(0), y.stride(0), dx.stride(0))
            fn = functools.partial(kernel[(m,)], *args, **consts, num_warps=w)
            t = timer(fn, lambda: None)[1]
            print(f"{m}x{n} {mode} words kernel, {words} values, {w:2d} warps: {t * 1e3:6.2f} us")
            rows.append(dict(shape=f"{m}x{n}", mode=mode, form=f"words_kernel_w{w}", ms=t))
    return rows


def main() -> None:
    words = "--no-words" not in sys.argv  # the words kernels alone too
    if not words:
        sys.argv.remove("--no-words")
    args = rounds_args()
    timer, _, copy = gpu_setup()
    rows = []
    for m, n in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(n)
        x = torch.randn(m, n, device="cuda", generator=gen).mul_(4).bfloat16()
        dy = torch.randn(m, n, device="cuda", generator=gen).bfloat16()
        y, dx = torch.empty_like(x), torch.empty_like(x)
        ref_y = torch.softmax(x.float(), -1)
        for mode in ("fwd", "bwd"):
            launch = (functools.partial(softmax_fwd_launch, x, y, False) if mode == "fwd"
                      else functools.partial(softmax_bwd_launch, dy, y, dx, False))  # fmt: skip
            out = y if mode == "fwd" else dx
            calls = {form: functools.partial(_form(form), launch) for form in FORMS}
            results = {}
            for form, call in calls.items():
                softmax_fwd_launch(x, y, False)
                out.fill_(float("nan"))
                call()
                torch.cuda.synchronize()
                if mode == "fwd":
                    err = (y.float() - ref_y).abs().max().item()
                else:
                    s = (dy.float() * y.float()).sum(-1, keepdim=True)
                    err = (dx.float() - y.float() * (dy.float() - s)).abs().max().item()
                results[form] = dict(err=err, peak=_peak(call), ts=[])
            for _ in range(args.rounds):
                for form, call in calls.items():
                    results[form]["ts"].append(timer(call, lambda: None)[1])
            gb = (2 if mode == "fwd" else 3) * m * n * 2 / 1e9
            for form in FORMS:
                r = results[form]
                summary = rounds_summary(f"{m}x{n} {mode} {form:9s}", r["ts"])
                pct = gb / (summary["ms"] * 1e-3) / copy * 100
                print(f"    {pct:5.1f}% of copy, peak +{r['peak']} B, max err {r['err']:.3g}")
                rows.append(dict(shape=f"{m}x{n}", mode=mode, form=form, ms=summary["ms"],
                                 spread_ms=summary["spread"], pct_copy=pct,
                                 peak_bytes=r["peak"], max_err=r["err"]))  # fmt: skip
        if words:
            rows += _words_kernels(timer, x, dy, y, dx, (16, 8, 4, 1))
        del x, dy, y, dx, ref_y
        torch.cuda.empty_cache()
    write_csv(args.out, "softmax_exchange_probe.csv", rows)


if __name__ == "__main__":
    main()
