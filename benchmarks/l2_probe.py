"""Second-read probe for the two-pass row kernels (prints and writes CSV; the benchmark of
record is `kernelwright bench`).

The looped softmax (rows past 65536) and cross-entropy kernels read each row twice: a
statistics pass, then a write pass. When the second read misses L2 they move 3/2 (softmax
forward, cross-entropy) or 5/3 (softmax backward) of the minimal bytes. This probe times
stand-alone copies of those kernels with three knobs that could keep the row in L2:

- `persist`: programs per SM of a persistent grid (0: one program per row, as the library
  does). Fewer rows in flight: a smaller L2 working set.
- `evict`: cache hints, evict_last on the first read, evict_first on the second and the store.
- `reverse`: the second pass walks the row backwards, so it starts on the chunks read last.

    python benchmarks/l2_probe.py [--out DIR]
"""

from __future__ import annotations

import argparse
import csv
import functools
import itertools
import os
from pathlib import Path

import torch
import triton
import triton.language as tl

from kernelwright.bench.harness import cuda_timer
from kernelwright.ops.cross_entropy import cross_entropy_fwd_launch
from kernelwright.ops.softmax import softmax_bwd_launch, softmax_fwd_launch


@triton.jit
def _sm_fwd(x_ptr, y_ptr, M, N, sx, sy, BLOCK_N: tl.constexpr, P1: tl.constexpr,
            P2: tl.constexpr, REVERSE: tl.constexpr):  # fmt: skip
    n_chunks = tl.cdiv(N, BLOCK_N)
    for row in range(tl.program_id(0), M, tl.num_programs(0)):
        x_row = x_ptr + tl.cast(row, tl.int64) * sx
        y_row = y_ptr + tl.cast(row, tl.int64) * sy
        m = tl.full([BLOCK_N], -float("inf"), dtype=tl.float32)
        d = tl.zeros([BLOCK_N], dtype=tl.float32)
        for c in range(0, n_chunks):
            cols = c * BLOCK_N + tl.arange(0, BLOCK_N)
            x = tl.load(x_row + cols, mask=cols < N, other=-float("inf"), eviction_policy=P1)
            x = x.to(tl.float32)
            m_new = tl.maximum(m, x)
            shift = tl.where(m_new == -float("inf"), 0.0, m_new)
            d = d * tl.exp(m - shift) + tl.exp(x - shift)
            m = m_new
        m_row = tl.max(m, axis=0)
        inv_d = 1.0 / tl.sum(d * tl.exp(m - m_row), axis=0)
        for c in range(0, n_chunks):
            cc = n_chunks - 1 - c if REVERSE else c
            cols = cc * BLOCK_N + tl.arange(0, BLOCK_N)
            mask = cols < N
            x = tl.load(x_row + cols, mask=mask, other=-float("inf"), eviction_policy=P2)
            y = tl.exp(x.to(tl.float32) - m_row) * inv_d
            tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask, eviction_policy=P2)


@triton.jit
def _sm_bwd(dy_ptr, y_ptr, dx_ptr, M, N, s, BLOCK_N: tl.constexpr, P1: tl.constexpr,
            P2: tl.constexpr, REVERSE: tl.constexpr):  # fmt: skip
    n_chunks = tl.cdiv(N, BLOCK_N)
    for row in range(tl.program_id(0), M, tl.num_programs(0)):
        off = tl.cast(row, tl.int64) * s
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for c in range(0, n_chunks):
            cols = c * BLOCK_N + tl.arange(0, BLOCK_N)
            mask = cols < N
            dy = tl.load(dy_ptr + off + cols, mask=mask, other=0.0, eviction_policy=P1)
            y = tl.load(y_ptr + off + cols, mask=mask, other=0.0, eviction_policy=P1)
            acc += dy.to(tl.float32) * y.to(tl.float32)
        tot = tl.sum(acc, axis=0)
        for c in range(0, n_chunks):
            cc = n_chunks - 1 - c if REVERSE else c
            cols = cc * BLOCK_N + tl.arange(0, BLOCK_N)
            mask = cols < N
            dy = tl.load(dy_ptr + off + cols, mask=mask, other=0.0, eviction_policy=P2)
            y = tl.load(y_ptr + off + cols, mask=mask, other=0.0, eviction_policy=P2)
            y = y.to(tl.float32)
            dx = y * (dy.to(tl.float32) - tot)
            tl.store(dx_ptr + off + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask,
                     eviction_policy=P2)  # fmt: skip


@triton.jit
def _ce_fwd(x_ptr, t_ptr, loss_ptr, g_ptr, M, V, s, inv_m, BLOCK_N: tl.constexpr,
            P1: tl.constexpr, P2: tl.constexpr, REVERSE: tl.constexpr):  # fmt: skip
    n_chunks = tl.cdiv(V, BLOCK_N)
    for row in range(tl.program_id(0), M, tl.num_programs(0)):
        x_row = x_ptr + tl.cast(row, tl.int64) * s
        g_row = g_ptr + tl.cast(row, tl.int64) * s
        t = tl.load(t_ptr + row).to(tl.int64)
        m = tl.full([BLOCK_N], -float("inf"), dtype=tl.float32)
        d = tl.zeros([BLOCK_N], dtype=tl.float32)
        for c in range(0, n_chunks):
            cols = c * BLOCK_N + tl.arange(0, BLOCK_N)
            x = tl.load(x_row + cols, mask=cols < V, other=-float("inf"), eviction_policy=P1)
            x = x.to(tl.float32)
            m_new = tl.maximum(m, x)
            shift = tl.where(m_new == -float("inf"), 0.0, m_new)
            d = d * tl.exp(m - shift) + tl.exp(x - shift)
            m = m_new
        m_row = tl.max(m, axis=0)
        lse = m_row + tl.log(tl.sum(d * tl.exp(m - m_row), axis=0))
        z_t = tl.load(x_row + t).to(tl.float32)
        tl.store(loss_ptr + row, lse - z_t)
        for c in range(0, n_chunks):
            cc = n_chunks - 1 - c if REVERSE else c
            cols = cc * BLOCK_N + tl.arange(0, BLOCK_N)
            mask = cols < V
            x = tl.load(x_row + cols, mask=mask, other=0.0, eviction_policy=P2).to(tl.float32)
            g = (tl.exp(x - lse) - tl.where(cols == t, 1.0, 0.0)) * inv_m
            tl.store(g_row + cols, g.to(g_ptr.dtype.element_ty), mask=mask, eviction_policy=P2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    timer = cuda_timer(hide_host=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows: list[dict] = []
    knobs = list(itertools.product((0, 1, 2), (False, True), (False, True)))  # persist, evict, rev

    def record(kernel, shape, cfg, ms, gb):
        r = dict(kernel=kernel, shape=shape, cfg=cfg, ms=round(ms, 4), tbps=round(gb / ms, 3))
        rows.append(r)
        print(r, flush=True)

    def grid(m, persist):
        return (m,) if persist == 0 else (min(m, sms * persist),)

    def pol(evict):
        return ("evict_last", "evict_first") if evict else ("", "")

    gen = torch.Generator(device="cuda").manual_seed(0)
    for n in (131072, 262144):
        m = 4096
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=gen) * 4
        y = torch.empty_like(x)
        gb = 2 * x.numel() * 2 / 1e9 / 1e3  # TB per ms -> printed as TB/s
        fn = functools.partial(softmax_fwd_launch, x, y, False)
        fn()
        ref = y.clone()
        record("softmax_fwd", f"{m}x{n}", "library", timer(fn, lambda: None)[1], gb)
        for block, warps in ((4096, 16), (16384, 16)):
            for persist, evict, rev in knobs:
                p1, p2 = pol(evict)
                fn = functools.partial(
                    _sm_fwd[grid(m, persist)], x, y, m, n, x.stride(0), y.stride(0),
                    BLOCK_N=block, P1=p1, P2=p2, REVERSE=rev, num_warps=warps,
                )  # fmt: skip
                y.fill_(float("nan"))
                fn()
                torch.testing.assert_close(y, ref, atol=1e-3, rtol=2e-2)
                cfg = f"b{block} w{warps} persist{persist} evict{int(evict)} rev{int(rev)}"
                record("softmax_fwd", f"{m}x{n}", cfg, timer(fn, lambda: None)[1], gb)
        dy = torch.randn_like(x)
        dx = torch.empty_like(x)
        gb = 3 * x.numel() * 2 / 1e9 / 1e3
        fn = functools.partial(softmax_bwd_launch, dy, ref, dx, False)
        fn()
        ref_dx = dx.clone()
        record("softmax_bwd", f"{m}x{n}", "library", timer(fn, lambda: None)[1], gb)
        for block, warps in ((16384, 16), (16384, 32)):
            for persist, evict, rev in knobs:
                p1, p2 = pol(evict)
                fn = functools.partial(
                    _sm_bwd[grid(m, persist)], dy, ref, dx, m, n, x.stride(0),
                    BLOCK_N=block, P1=p1, P2=p2, REVERSE=rev, num_warps=warps,
                )  # fmt: skip
                dx.fill_(float("nan"))
                fn()
                torch.testing.assert_close(dx, ref_dx, atol=1e-3, rtol=2e-2)
                cfg = f"b{block} w{warps} persist{persist} evict{int(evict)} rev{int(rev)}"
                record("softmax_bwd", f"{m}x{n}", cfg, timer(fn, lambda: None)[1], gb)
        del x, y, dy, dx, ref, ref_dx
    for m, v in ((8192, 128256), (8192, 262144)):
        x = torch.randn(m, v, device="cuda", dtype=torch.bfloat16, generator=gen)
        t = torch.randint(0, v, (m,), device="cuda", generator=gen)
        g = torch.empty_like(x)
        loss = torch.empty(m, device="cuda", dtype=torch.float32)
        lse = torch.empty(m, device="cuda", dtype=torch.float32)
        gb = 2 * x.numel() * 2 / 1e9 / 1e3
        scale = torch.full((1,), 1.0 / m, device="cuda", dtype=torch.float32)
        fn = functools.partial(cross_entropy_fwd_launch, x, t, loss, lse, grad=g, scale=scale)
        fn()
        ref_g = g.clone()
        record("ce_fwd_grad", f"{m}x{v}", "library", timer(fn, lambda: None)[1], gb)
        for block, warps in ((2048, 8), (8192, 16)):
            for persist, evict, rev in knobs:
                p1, p2 = pol(evict)
                fn = functools.partial(
                    _ce_fwd[grid(m, persist)], x, t, loss, g, m, v, x.stride(0), 1.0 / m,
                    BLOCK_N=block, P1=p1, P2=p2, REVERSE=rev, num_warps=warps,
                )  # fmt: skip
                g.fill_(float("nan"))
                fn()
                torch.testing.assert_close(g, ref_g, atol=1e-6, rtol=2e-2)
                cfg = f"b{block} w{warps} persist{persist} evict{int(evict)} rev{int(rev)}"
                record("ce_fwd_grad", f"{m}x{v}", cfg, timer(fn, lambda: None)[1], gb)
        del x, g
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"l2_probe_{torch.cuda.get_device_name().split()[1].lower()}.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[*rows[0], "gpu", "torch", "triton"])
        w.writeheader()
        for r in rows:
            w.writerow(dict(r, gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                            triton=triton.__version__))  # fmt: skip
    print("wrote", path)


if __name__ == "__main__":
    main()
