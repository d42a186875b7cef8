# ruff: noqa: E501  (a throwaway probe)
"""Probe (prints only, not a benchmark of record): can fused_linear_cross_entropy beat Liger at
Liger's memory by splitting each chunk's vocabulary in two?

At a fixed logits buffer of B bytes, chunk c tokens x V classes: the grad_weight update
(read + write of the whole [V, H] gradient) runs once per c tokens and is memory-bound below
~400 tokens. Splitting the vocabulary in halves doubles the tokens per chunk at the same buffer
(2c x V/2) and halves the grad_weight traffic, at the cost of computing one half's logits twice
(the lse needs both halves before either half's gradient): 1.5x the logits matmul.

Schedules timed here with cuBLAS and the cross_entropy kernel as a traffic proxy for the
split-row CE (the numbers are timings, the values are not a loss):
  s1(c)        today's schedule, c tokens, grad_weight zero-filled then accumulated
  s1b0(c)      the same with the first chunk written with beta = 0 (no zero fill)
  s2(c)        2c tokens per chunk in two vocab halves, same buffer as s1(c)
and the op itself at c and 2c, and Liger, in one process.

    python benchmarks/flce_split_probe.py [T H V [c]]        all of the above, twice
    python benchmarks/flce_split_probe.py T H V parts        each step of one chunk alone,
                                                             under cuBLAS and cuBLASLt
    python benchmarks/flce_split_probe.py T H V [c] ab       s1(c) and s2(2c) alternated 5x
"""

import sys

import torch
import triton
from triton.testing import do_bench

from kernelwright.ops.cross_entropy import cross_entropy_fwd_launch
from kernelwright.ops.fused_linear_cross_entropy import fused_linear_cross_entropy as flce

dev = torch.device("cuda")
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
T, H, V = (int(x) for x in (sys.argv[1:4] or ["8192", "4096", "128256"]))
c = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[4].isdigit() else 256
dt = torch.bfloat16
g = torch.Generator(device=dev).manual_seed(0)
h = (torch.randn(T, H, device=dev, generator=g) * 0.5).to(dt)
W = (torch.randn(V, H, device=dev, generator=g) * 0.02).to(dt)
t = torch.randint(0, V // 2 - 1, (T,), device=dev, generator=g)
loss = torch.empty(T, device=dev)
lse = torch.empty(T, device=dev)
inv = torch.full((1,), 1.0 / T, device=dev)


def s1(chunk, beta0):
    gw = (
        torch.empty(V, H, dtype=dt, device=dev)
        if beta0
        else torch.zeros(V, H, dtype=dt, device=dev)
    )
    gh = torch.empty(T, H, dtype=dt, device=dev)
    buf = torch.empty(chunk, V, dtype=dt, device=dev)
    for s in range(0, T, chunk):
        hc = h[s : s + chunk]
        torch.mm(hc, W.t(), out=buf)
        cross_entropy_fwd_launch(
            buf, t[s : s + chunk], loss[s : s + chunk], lse[s : s + chunk], grad=buf, scale=inv
        )
        if beta0 and s == 0:
            torch.mm(buf.t(), hc, out=gw)
        else:
            gw.addmm_(buf.t(), hc)
        torch.mm(buf, W, out=gh[s : s + chunk])
    return gw, gh


def s2(chunk, beta0):
    # chunk tokens, vocab halves [:va] and [va:]; buffer [chunk, va] = s1(chunk / 2)'s bytes
    va = (V + 1) // 2
    gw = (
        torch.empty(V, H, dtype=dt, device=dev)
        if beta0
        else torch.zeros(V, H, dtype=dt, device=dev)
    )
    gh = torch.empty(T, H, dtype=dt, device=dev)
    buf = torch.empty(chunk, va, dtype=dt, device=dev)
    Wa, Wb = W[:va], W[va:]
    bb = buf[:, : V - va]
    for s in range(0, T, chunk):
        hc, tc, lc, ec = h[s : s + chunk], t[s : s + chunk], loss[s : s + chunk], lse[s : s + chunk]
        torch.mm(hc, Wa.t(), out=buf)
        cross_entropy_fwd_launch(buf, tc, lc, ec)  # stats of half a (proxy: one read)
        torch.mm(hc, Wb.t(), out=bb)
        cross_entropy_fwd_launch(bb, tc, lc, ec, grad=bb, scale=inv)  # stats + gradient of b
        if beta0 and s == 0:
            torch.mm(bb.t(), hc, out=gw[va:])
        else:
            gw[va:].addmm_(bb.t(), hc)
        torch.mm(bb, Wb, out=gh[s : s + chunk])
        torch.mm(hc, Wa.t(), out=buf)  # half a again
        cross_entropy_fwd_launch(buf, tc, lc, ec, grad=buf, scale=inv)
        if beta0 and s == 0:
            torch.mm(buf.t(), hc, out=gw[:va])
        else:
            gw[:va].addmm_(buf.t(), hc)
        gh[s : s + chunk].addmm_(buf, Wa)
    return gw, gh


def op(chunk):
    hh = h.detach().requires_grad_()
    WW = W.detach().requires_grad_()

    def run():
        flce(hh, WW, t, chunk_size=chunk).backward()
        hh.grad = WW.grad = None

    return run


def liger():
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

    hh = h.detach().requires_grad_()
    WW = W.detach().requires_grad_()

    def run():
        LigerFusedLinearCrossEntropyFunction.apply(hh, WW, t)[0].backward()
        hh.grad = WW.grad = None

    return run


def measure(name, fn):
    fn()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    ms = do_bench(fn, warmup=5, rep=60, return_mode="median")
    print(f"{name:24s} {ms:8.3f} ms  peak +{peak:7.1f} MiB", flush=True)
    return ms


print(f"T={T} H={H} V={V} c={c}")
for _round in range(0 if {"parts", "ab"} & set(sys.argv) else 2):
    measure("liger", liger())
    measure(f"op chunk {c}", op(c))
    measure(f"op chunk {2 * c}", op(2 * c))
    measure(f"s1({c})", lambda: s1(c, False))
    measure(f"s1b0({c})", lambda: s1(c, True))
    measure(f"s2({2 * c}) halves", lambda: s2(2 * c, False))
    measure(f"s2b0({2 * c}) halves", lambda: s2(2 * c, True))
    measure(f"s1b0({2 * c})", lambda: s1(2 * c, True))


def parts(chunk):
    """Each step of one chunk alone (median of many), per BLAS backend."""
    hc = h[:chunk]
    buf = torch.empty(chunk, V, dtype=dt, device=dev)
    gw = torch.zeros(V, H, dtype=dt, device=dev)
    gh = torch.empty(chunk, H, dtype=dt, device=dev)
    torch.mm(hc, W.t(), out=buf)
    steps = {
        "logits mm": lambda: torch.mm(hc, W.t(), out=buf),
        "grad_w addmm": lambda: gw.addmm_(buf.t(), hc),
        "grad_w mm (beta 0)": lambda: torch.mm(buf.t(), hc, out=gw),
        "grad_h mm": lambda: torch.mm(buf, W, out=gh),
        "ce in place": lambda: cross_entropy_fwd_launch(
            buf, t[:chunk], loss[:chunk], lse[:chunk], grad=buf, scale=inv
        ),
    }
    for name, fn in steps.items():
        print(
            f"  c={chunk:5d} {name:20s} {do_bench(fn, warmup=10, rep=100, return_mode='median'):.4f} ms",
            flush=True,
        )


if "parts" in sys.argv:
    for lib in ("cublas", "cublaslt"):
        torch.backends.cuda.preferred_blas_library(lib)
        print("blas:", torch.backends.cuda.preferred_blas_library())
        for ch in (256, 512):
            parts(ch)
        measure(f"op chunk 256 [{lib}]", op(256))
        measure(f"op chunk 512 [{lib}]", op(512))
        measure(f"liger [{lib}]", liger())

if "ab" in sys.argv:
    # s1(c) against s2(2c) alternated, so slow drifts of the clock hit both alike
    va = (V + 1) // 2
    hc = h[: 2 * c]
    buf = torch.empty(2 * c, va, dtype=dt, device=dev)
    gw = torch.zeros(V, H, dtype=dt, device=dev)
    print(
        f"  half logits mm  {do_bench(lambda: torch.mm(hc, W[:va].t(), out=buf), warmup=10, rep=100, return_mode='median'):.4f} ms"
    )
    print(
        f"  half grad_w     {do_bench(lambda: gw[:va].addmm_(buf.t(), hc), warmup=10, rep=100, return_mode='median'):.4f} ms"
    )
    ghc = torch.empty(2 * c, H, dtype=dt, device=dev)
    print(
        f"  half grad_h acc {do_bench(lambda: ghc.addmm_(buf, W[:va]), warmup=10, rep=100, return_mode='median'):.4f} ms"
    )
    a, b = [], []
    for _ in range(5):
        a.append(measure(f"s1({c})", lambda: s1(c, False)))
        b.append(measure(f"s2({2 * c})", lambda: s2(2 * c, False)))
    print(f"s2/s1 per round: {[round(y / x, 3) for x, y in zip(a, b, strict=True)]}")
