"""softmax's split rows (past 32768 columns): chunks of equal length against tiles of `block_n`
and a short last chunk, forward and backward, one process (prints, CSV to $OUT).

NOTES 60. A row's chunks were `block_n` wide, the last taking the rest (at 152064 columns nine
forward chunks of 16384 and one of 4736); the library now gives each `ceil(n / splits)` rounded
up to 64 values (`_split.chunk_len`). `tiles` is the library with that switched off (the chunk
is the tile). Both kernels alone, bf16, 4096 rows, `--rounds` alternating rounds, medians, each
result checked against fp32 first.

    python benchmarks/softmax_balance_probe.py [--rounds 5] [--splits]

With `--splits` (NOTES 61): the library's chunks of equal length at forced split counts
instead, 152064 and 131072 columns, forward and backward.
"""

from __future__ import annotations

import functools

import torch
from _probe import gpu_setup, rounds_args, rounds_summary, write_csv

from kernelwright.ops import softmax as sm

WIDTHS = (65536, 128256, 131072, 152064, 256000, 262144)
FORMS = ("equal", "tiles")


def _form(name: str):
    """Run a launch in the named form."""
    original = sm.chunk_len

    def run(fn):
        sm.chunk_len = original if name == "equal" else (lambda n, splits, block_n: block_n)
        try:
            return fn()
        finally:
            sm.chunk_len = original

    return run


# (width, mode, split counts) of --splits: the library's counts are 10 / 19 at 152064 and 8 / 16
# at 131072 (tiles of 16384 forward, 8192 backward)
SPLIT_SWEEP = (
    (152064, "fwd", (10, 11, 12, 16, 20, 22, 24)),
    (131072, "fwd", (8, 9, 10, 11, 12, 16)),
    (152064, "bwd", (19, 20, 22, 24, 32)),
    (131072, "bwd", (16, 19, 20, 22, 24, 32)),
)


def _forced(launch, splits: int) -> None:
    """`launch()` with its rows split `splits` ways (`sm._split_count` patched; the chunks then
    `ceil(n / splits)` rounded up to 64)."""
    original = sm._split_count
    sm._split_count = lambda t, cfg: splits
    try:
        launch()
    finally:
        sm._split_count = original


def _splits_sweep(args, timer, copy) -> list[dict]:
    """The library at forced split counts (`_forced`), alternating rounds."""
    rows = []
    m = 4096
    for n, mode, counts in SPLIT_SWEEP:
        gen = torch.Generator(device="cuda").manual_seed(n)
        x = torch.randn(m, n, device="cuda", generator=gen).mul_(4).bfloat16()
        dy = torch.randn(m, n, device="cuda", generator=gen).bfloat16()
        y, dx = torch.empty_like(x), torch.empty_like(x)
        sm.softmax_fwd_launch(x, y, False)
        launch = (functools.partial(sm.softmax_fwd_launch, x, y, False) if mode == "fwd"
                  else functools.partial(sm.softmax_bwd_launch, dy, y, dx, False))  # fmt: skip
        if mode == "fwd":
            ref = torch.softmax(x.float(), -1)
        else:
            s = (dy.float() * y.float()).sum(-1, keepdim=True)
            ref = y.float() * (dy.float() - s)
        out = y if mode == "fwd" else dx

        calls = {s: functools.partial(_forced, launch, s) for s in counts}
        ts = {s: [] for s in counts}
        errs = {}
        for s, call in calls.items():
            if mode == "fwd":
                out.fill_(float("nan"))
            else:
                sm.softmax_fwd_launch(x, y, False)
                out.fill_(float("nan"))
            call()
            torch.cuda.synchronize()
            errs[s] = (out.float() - ref).abs().max().item()
        del ref
        for _ in range(args.rounds):
            for s, call in calls.items():
                ts[s].append(timer(call, lambda: None)[1])
        gb = (2 if mode == "fwd" else 3) * m * n * 2 / 1e9
        block_n = (sm.forward_config if mode == "fwd" else sm.backward_config)(x).block_n
        for s in counts:
            chunk = sm.chunk_len(n, s, block_n)
            summary = rounds_summary(f"{m}x{n} {mode} {s:2d} splits of {chunk:5d}", ts[s])
            pct = gb / (summary["ms"] * 1e-3) / copy * 100
            ns_col = summary["ms"] * 1e6 / n
            print(f"    {pct:5.1f}% of copy, {ns_col:.3f} ns a column, max err {errs[s]:.3g}")
            rows.append(dict(shape=f"{m}x{n}", mode=mode, splits=s, chunk=chunk,
                             ms=summary["ms"], spread_ms=summary["spread"], pct_copy=pct,
                             max_err=errs[s]))  # fmt: skip
        del x, dy, y, dx
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    import sys

    sweep = "--splits" in sys.argv
    if sweep:
        sys.argv.remove("--splits")
    args = rounds_args()
    timer, _, copy = gpu_setup()
    if sweep:
        write_csv(args.out, "softmax_splits_probe.csv", _splits_sweep(args, timer, copy))
        return
    rows = []
    m = 4096
    for n in WIDTHS:
        gen = torch.Generator(device="cuda").manual_seed(n)
        x = torch.randn(m, n, device="cuda", generator=gen).mul_(4).bfloat16()
        dy = torch.randn(m, n, device="cuda", generator=gen).bfloat16()
        y, dx = torch.empty_like(x), torch.empty_like(x)
        ref_y = torch.softmax(x.float(), -1)
        for mode in ("fwd", "bwd"):
            launch = (functools.partial(sm.softmax_fwd_launch, x, y, False) if mode == "fwd"
                      else functools.partial(sm.softmax_bwd_launch, dy, y, dx, False))  # fmt: skip
            out = y if mode == "fwd" else dx
            calls = {form: functools.partial(_form(form), launch) for form in FORMS}
            results = {}
            for form, call in calls.items():
                sm.softmax_fwd_launch(x, y, False)
                out.fill_(float("nan"))
                call()
                torch.cuda.synchronize()
                if mode == "fwd":
                    err = (y.float() - ref_y).abs().max().item()
                else:
                    s = (dy.float() * y.float()).sum(-1, keepdim=True)
                    err = (dx.float() - y.float() * (dy.float() - s)).abs().max().item()
                results[form] = dict(err=err, ts=[])
            for _ in range(args.rounds):
                for form, call in calls.items():
                    results[form]["ts"].append(timer(call, lambda: None)[1])
            gb = (2 if mode == "fwd" else 3) * m * n * 2 / 1e9
            cfg = (sm.forward_config if mode == "fwd" else sm.backward_config)(x)
            splits = -(-n // cfg.block_n)
            print(f"{m}x{n} {mode}: {splits} chunks of {sm.chunk_len(n, splits, cfg.block_n)} "
                  f"(tiles: last {n - (splits - 1) * cfg.block_n} of {cfg.block_n})")  # fmt: skip
            for form in FORMS:
                r = results[form]
                summary = rounds_summary(f"{m}x{n} {mode} {form:6s}", r["ts"])
                pct = gb / (summary["ms"] * 1e-3) / copy * 100
                print(f"    {pct:5.1f}% of copy, max err {r['err']:.3g}")
                rows.append(dict(shape=f"{m}x{n}", mode=mode, form=form, ms=summary["ms"],
                                 spread_ms=summary["spread"], pct_copy=pct,
                                 max_err=r["err"]))  # fmt: skip
            eq, ti = (next(r["ms"] for r in rows[-2:] if r["form"] == f) for f in FORMS)
            print(f"    equal / tiles: {eq / ti - 1:+.1%}", flush=True)
        del x, dy, y, dx, ref_y
        torch.cuda.empty_cache()
    write_csv(args.out, "softmax_balance_probe.csv", rows)


if __name__ == "__main__":
    main()
