"""Does the timer's L2 flush tax the kernel it times? (`python benchmarks/flush_probe.py`)

`cuda_timer` flushes L2 before each rep by zeroing a 256 MB buffer (do_bench's way). The zeros
are written back lazily: up to L2's size of dirty lines stays in L2, and the timed kernel pays
to write them to DRAM as it evicts them. Nsight Compute (which invalidates caches) timed
jagged_mean's D = 64 forward at 38.5 us where `kernelwright bench` has 47 us. Here each kernel
is timed with three flushes, in one process:

    zero   the timer's flush: zero 256 MB (dirty lines left in L2)
    read   read a 256 MB buffer instead (L2 left holding clean lines: nothing to write back)
    none   no flush (the kernel's own data may still be in L2)

Prints the GPU line and a table; writes flush_probe.csv to $OUT.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from _probe import write_csv

from kernelwright.bench.harness import _quantiles, _sleep_cycles_per_ms

FLUSH = 2**28


def timer(mode: str, fn, reps: int = 200) -> float:
    """Median GPU ms of fn with `mode`'s flush before each rep and the host hidden (sleep)."""
    dirty = torch.empty(FLUSH, dtype=torch.int8, device="cuda")
    clean = torch.ones(FLUSH // 4, dtype=torch.int32, device="cuda")
    sink = torch.empty((), dtype=torch.int64, device="cuda")

    def flush():
        if mode == "zero":
            dirty.zero_()
        elif mode == "read":
            torch.sum(clean, dim=0, dtype=torch.int64, out=sink)

    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    host = (time.perf_counter() - t0) * 1e3
    cycles = int((2 * host + 0.02) * _sleep_cycles_per_ms())
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        flush()
        torch.cuda._sleep(cycles)
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return _quantiles([s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)])[1]


def cases():
    from kernelwright.ops.jagged_mean import jagged_mean_fwd_launch
    from kernelwright.ops.rms_norm import rms_norm

    for mb in (16, 128, 1024):
        src = torch.randn(mb * 2**20 // 4, device="cuda", dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        yield f"copy {mb} MB", mb * 2**20, lambda s=src, d=dst: d.copy_(s)
    gen = torch.Generator().manual_seed(77)
    lengths = torch.randint(1, 513, (4096,), generator=gen)
    offsets = torch.zeros(4097, dtype=torch.int64)
    offsets[1:] = lengths.cumsum(0)
    v = torch.randn(int(offsets[-1]), 64, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(4096, 64, device="cuda", dtype=torch.bfloat16)
    offsets = offsets.cuda()
    yield (
        "jagged_mean fwd D=64",
        v.numel() * 2 + out.numel() * 2,
        lambda: jagged_mean_fwd_launch(v, offsets, out),
    )
    try:
        from liger_kernel.ops.rms_norm import rms_norm_forward
    except ImportError:
        rms_norm_forward = None
    for m in (1024, 16384):
        x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
        yield f"rms_norm fwd {m}x4096 kernelwright", 4 * x.numel(), lambda x=x, w=w: rms_norm(x, w)
        if rms_norm_forward is not None:
            yield (
                f"rms_norm fwd {m}x4096 liger",
                4 * x.numel(),
                (lambda x=x, w=w: rms_norm_forward(x, w, 1e-6, 0.0, "llama", None)),
            )


def flush_cost() -> None:
    """How long each flush itself runs on the GPU (without hide_host it overlaps the host's
    work, so a slow flush hides host time)."""
    a = torch.ones(FLUSH // 4, dtype=torch.int32, device="cuda")
    si = torch.empty((), dtype=torch.int64, device="cuda")
    f = torch.ones(FLUSH // 4, dtype=torch.float32, device="cuda")
    sf = torch.empty((), dtype=torch.float32, device="cuda")
    z = torch.empty(FLUSH, dtype=torch.int8, device="cuda")
    for name, fn in [
        ("int32 sum into int64", lambda: torch.sum(a, dim=0, dtype=torch.int64, out=si)),
        ("fp32 sum", lambda: torch.sum(f, dim=0, out=sf)),
        ("zero_", z.zero_),
    ]:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(50):
            fn()
        e.record()
        torch.cuda.synchronize()
        ms = s.elapsed_time(e) / 50
        print(f"flush {name}: {ms * 1e3:.1f} us, {FLUSH / ms / 1e6:.0f} GB/s", flush=True)


def main() -> None:
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}", flush=True)
    flush_cost()
    rows = []
    print(f"{'kernel':38s} {'zero':>9s} {'read':>9s} {'none':>9s}   GB/s zero / read")
    for name, nbytes, fn in cases():
        t = {mode: timer(mode, fn) for mode in ("zero", "read", "none")}
        gb = {m: nbytes / t[m] / 1e6 for m in t}
        print(f"{name:38s} {t['zero']*1e3:8.1f}u {t['read']*1e3:8.1f}u {t['none']*1e3:8.1f}u"
              f"   {gb['zero']:.0f} / {gb['read']:.0f}", flush=True)  # fmt: skip
        rows.append(
            {"kernel": name, "bytes": nbytes, **{f"us_{m}": f"{t[m] * 1e3:.2f}" for m in t}}
        )
    write_csv(Path(os.environ.get("OUT", ".")), "flush_probe.csv", rows)


if __name__ == "__main__":
    main()
