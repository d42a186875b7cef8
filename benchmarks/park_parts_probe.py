"""Where the parking backward's extra time goes (NOTES 47), in one process, alternating over
rounds (prints, CSV to $OUT): fused_add_rms_norm's backward launcher alone and autograd's
forward+backward, with dW parked in ds at several program counts P (each program sums N / P
columns; the launcher picks the largest divisor of N up to the SMs), parked without the
cooperative launch attribute, and with fp32 partial rows.

    python benchmarks/park_parts_probe.py [--rounds 5]
"""

from __future__ import annotations

import torch
from _probe import gpu_setup, rounds_args, rounds_summary, write_csv
from park_probe import backward_calls

from kernelwright.ops import fused_add_rms_norm as far

CASES = {(4096, 4096): (128, 64), (4096, 3584): (128, 112, 64, 56), (2048, 4096): (128,)}


def probe(m: int, n: int, counts, timer, rounds: int) -> list[dict]:
    bwd, full, ds, _ = backward_calls(m, n)
    real, coop = far._park_programs, far.COOPERATIVE

    def setting(programs: int, cooperative: bool = True):
        def apply():
            far._park_programs = lambda *a, **k: programs
            far.COOPERATIVE = cooperative

        return apply

    settings = {f"park P={p}": setting(p) for p in counts}
    settings[f"park P={counts[0]} not cooperative"] = setting(counts[0], False)
    settings["partials"] = setting(0)
    rows, ref = [], None
    try:
        for name, apply in settings.items():
            apply()
            ds.fill_(float("nan"))
            bwd()
            torch.cuda.synchronize()
            ref = ds.clone() if ref is None else ref
            print(f"{m}x{n} {name}: ds bit-identical {torch.equal(ds, ref)}", flush=True)
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(rounds):
            for name, apply in settings.items():
                apply()
                for mode, fn in (("backward", bwd), ("full", full)):
                    times.setdefault((name, mode), []).append(timer(fn, lambda: None)[1])
    finally:
        far._park_programs, far.COOPERATIVE = real, coop
    for (name, mode), ts in times.items():
        stats = rounds_summary(f"{m}x{n} {name:28s} {mode:8s}", ts)
        rows.append(dict(shape=f"{m}x{n}", variant=name, mode=mode, **stats))
    return rows


def main() -> None:
    args = rounds_args()
    timer, _, _ = gpu_setup()
    rows = []
    for (m, n), counts in CASES.items():
        rows += probe(m, n, counts, timer, args.rounds)
    write_csv(args.out, "park_parts_probe.csv", rows)


if __name__ == "__main__":
    main()
