"""The few-rows overrides (runtime.launch.FewRows) on and off, in one process (prints, CSV to $OUT).

rms_norm's forward at 1024 x 4096 and relu_squared's at 1024 x 14336 take a few-rows config
(NOTES 42, 45). The bench of record at a93bfa2 had relu_squared's forward faster with it but
its forward+backward at 1024 tokens 40.8 -> 42.2 us against the run before: this times the
forward alone and forward+backward (autograd, `out.backward(dy)`) with the override and
without (`FEW_ROWS` emptied), alternating over several rounds, so the two are compared in one
process. GPU time (host hidden), the reading flush before each rep.

    python benchmarks/few_rows_probe.py [--rounds 5]
"""

from __future__ import annotations

import importlib

import torch
from _probe import gpu_setup, rounds_args, rounds_summary, write_csv

import kernelwright as kw

CASES = {  # op: (tokens, width, the op's call on x)
    "rms_norm": (1024, 4096, lambda x, w: kw.rms_norm(x, w)),
    "relu_squared": (1024, 14336, lambda x, w: kw.relu_squared(x)),
}


def main() -> None:
    args = rounds_args()
    timer, _, _ = gpu_setup()
    rows = []
    for op, (m, n, call) in CASES.items():
        tables = importlib.import_module(f"kernelwright.runtime.tables.{op}")
        saved = dict(tables.FEW_ROWS)
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)

        def fwd(call=call, x=x, w=w):
            with torch.no_grad():
                call(x, w)

        def full(call=call, x=x, w=w, dy=dy):
            x.grad = w.grad = None
            call(x, w).backward(dy)

        times: dict[tuple[str, bool], list[float]] = {}
        for _ in range(args.rounds):
            for override in (True, False):
                tables.FEW_ROWS.clear()
                if override:
                    tables.FEW_ROWS.update(saved)
                for mode, fn in (("forward", fwd), ("full", full)):
                    times.setdefault((mode, override), []).append(timer(fn, lambda: None)[1])
        tables.FEW_ROWS.clear()
        tables.FEW_ROWS.update(saved)
        for (mode, override), ts in times.items():
            label = f"{op} {m}x{n} {mode:8s} override={override!s:5s}"
            stats = rounds_summary(label, ts)
            rows.append(dict(op=op, shape=f"{m}x{n}", mode=mode, override=override, **stats))
    write_csv(args.out, "few_rows_probe.csv", rows)


if __name__ == "__main__":
    main()
