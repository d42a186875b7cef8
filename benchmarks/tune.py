"""Sweep launch configs of an op's kernels on the GPU and print the best per shape.

A development aid until the optimize workflow exists: `python benchmarks/tune.py rms_norm`.
Prints, per (kernel, shape), the configs sorted by median time with GB/s against the copy
bandwidth measured in the same run, and writes a CSV to $OUT (or the current directory).
"""

from __future__ import annotations

import csv
import itertools
import os
import sys
from functools import partial

import torch
import triton

import kernelwright  # noqa: F401
from kernelwright.runtime import LaunchConfig as C

DT = torch.bfloat16


def copy_gbps() -> float:
    src = torch.randn(2**28, device="cuda", dtype=DT)  # 512 MB
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=200)
    return 2 * src.numel() * src.element_size() / ms / 1e6


_TIMER = None


def bench(fn) -> float:
    # GPU time alone (host overhead hidden, see bench.harness.cuda_timer): small shapes run
    # for less time than the CPU takes to launch them.
    global _TIMER
    if _TIMER is None:
        from kernelwright.bench.harness import cuda_timer

        _TIMER = cuda_timer(warmup_ms=10, rep_ms=60, hide_host=True)
    return _TIMER(fn, lambda: None)[1]


def rms_norm_cases():
    from kernelwright.ops.rms_norm import rms_norm_bwd_launch, rms_norm_fwd_launch

    shapes = [(16384, 4096), (8192, 16384), (8192, 2048), (8192, 3584), (8192, 8192), (16384, 1024)]
    for m, n in shapes:
        x = torch.randn(m, n, device="cuda", dtype=DT)
        w = torch.randn(n, device="cuda", dtype=DT)
        y = torch.empty_like(x)
        rstd = torch.empty(m, device="cuda", dtype=torch.float32)
        dy = torch.randn_like(x)
        dx = torch.empty_like(x)
        dw = torch.empty_like(w)
        block = triton.next_power_of_2(n)
        rows_opts = [r for r in (1, 2, 4, 8) if r * block <= 16384]
        warps = [w_ for w_ in (4, 8, 16, 32) if w_ * 32 * 2 <= block * max(rows_opts)]
        for rows, nw in itertools.product(rows_opts, warps):
            cfg = C(block_n=block, rows=rows, num_warps=nw)
            fwd = partial(rms_norm_fwd_launch, x, w, y, rstd, 1e-6, 0.0, "llama", config=cfg)
            yield "fwd", (m, n), cfg, fwd, 2 * m * n * 2
            for pps in (1, 2, 4, 8):
                cfgb = cfg.with_(programs_per_sm=pps)
                bwd = partial(
                    rms_norm_bwd_launch, dy, x, w, rstd, dx, dw, 0.0, "llama", config=cfgb
                )
                yield "bwd", (m, n), cfgb, bwd, 3 * m * n * 2


def swiglu_cases():
    from kernelwright.ops import swiglu as sw

    for m, n in [(16384, 14336), (8192, 18944)]:
        a = torch.randn(m, n, device="cuda", dtype=DT)
        b = torch.randn_like(a)
        c = torch.empty_like(a)
        dc = torch.randn_like(a)
        da = torch.empty_like(a)
        db = torch.empty_like(a)
        for block, rows, nw in itertools.product((512, 1024, 2048, 4096), (1, 2, 4), (4, 8, 16)):
            if block * rows > 8192 or nw * 32 * 4 > block * rows:
                continue
            cfg = C(block_n=block, rows=rows, num_warps=nw)
            fwd = partial(sw.swiglu_fwd_launch, a, b, c, config=cfg)
            yield "fwd", (m, n), cfg, fwd, 3 * m * n * 2
            bwd = partial(sw.swiglu_bwd_launch, dc, a, b, da, db, config=cfg)
            yield "bwd", (m, n), cfg, bwd, 5 * m * n * 2


def rms_norm_fwd_cases():
    # The forward alone against Liger's, in the same process (Liger rows have block_n = 0).
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    from kernelwright.ops.rms_norm import rms_norm_fwd_launch

    shapes = [(1024, 4096), (2048, 4096), (4096, 4096), (8192, 2048), (8192, 4096)]
    shapes += [(8192, 8192), (16384, 4096), (32768, 4096), (8192, 16384)]
    for m, n in shapes:
        x = torch.randn(m, n, device="cuda", dtype=DT)
        w = torch.randn(n, device="cuda", dtype=DT)
        y = torch.empty_like(x)
        rstd = torch.empty(m, device="cuda", dtype=torch.float32)
        liger = partial(LigerRMSNormFunction.apply, x, w, 1e-6, 0.0, "llama", False)
        yield "fwd", (m, n), C(block_n=0), liger, 2 * m * n * 2
        block = triton.next_power_of_2(n)
        for rows, nw in itertools.product((1, 2), (4, 8, 16)):
            cfg = C(block_n=block, rows=rows, num_warps=nw)
            fwd = partial(rms_norm_fwd_launch, x, w, y, rstd, 1e-6, 0.0, "llama", config=cfg)
            yield "fwd", (m, n), cfg, fwd, 2 * m * n * 2


def _norm_configs(n: int, bwd: bool):
    block = triton.next_power_of_2(n)
    for rows in (1, 2, 4, 8):
        if rows * block > 16384 or (rows > 1 and block > 8192):
            continue
        for nw in (4, 8, 16, 32):
            if nw * 32 * 4 > block * rows * 2 or (nw == 32 and block < 8192):
                continue
            cfg = C(block_n=block, rows=rows, num_warps=nw)
            if not bwd:
                yield cfg
                continue
            for pps in (1, 2, 4):
                yield cfg.with_(programs_per_sm=pps)


NORM_SHAPES = [(8192, 2048), (8192, 3584), (8192, 4096), (8192, 8192), (8192, 16384)]
NORM_SHAPES += [(16384, 4096), (2048, 4096)]


def _bwd_stage_configs(n: int):
    # The persistent backward with and without the next row block prefetched (num_stages=2).
    block = triton.next_power_of_2(n)
    for rows, nw, pps, stages in itertools.product((1, 2, 4, 8), (4, 8, 16, 32), (1, 2), (1, 2)):
        if rows * block > 16384 or (rows > 1 and block > 8192):
            continue
        if nw * 32 * 4 > block * rows * 2 or (nw == 32 and block < 8192):
            continue
        yield C(block_n=block, rows=rows, num_warps=nw, programs_per_sm=pps, num_stages=stages)


BWD_SHAPES = NORM_SHAPES + [(32768, 4096)]
_NORMS = ("rms_norm", "fused_add_rms_norm", "layer_norm")


def norm_bwd_stage_cases(op: str, shapes=BWD_SHAPES):
    # One norm's backward kernel with and without the prefetch (benchmarks/NOTES 17).
    from kernelwright.ops import fused_add_rms_norm as fa
    from kernelwright.ops import layer_norm as ln
    from kernelwright.ops import rms_norm as rn

    for m, n in shapes:
        x, dy, dr, dx = (torch.randn(m, n, device="cuda", dtype=DT) for _ in range(4))
        w, b, dw, db = (torch.randn(n, device="cuda", dtype=DT) for _ in range(4))
        mean, rstd = (torch.rand(m, device="cuda", dtype=torch.float32) for _ in range(2))
        launch, nbytes = {
            "rms_norm": (partial(rn.rms_norm_bwd_launch, dy, x, w, rstd, dx, dw, 0.0, "llama"), 3),
            "fused_add_rms_norm": (
                partial(fa.fused_add_rms_norm_bwd_launch, dy, dr, x, w, rstd, dx, dw, 0.0, "llama"),
                4,
            ),
            "layer_norm": (partial(ln.layer_norm_bwd_launch, dy, x, w, mean, rstd, dx, dw, db), 3),
        }[op]
        for cfg in _bwd_stage_configs(n):
            yield "bwd", (m, n), cfg, partial(launch, config=cfg), nbytes * m * n * 2
        del x, dy, dr, dx


def norm_bwd_looped_cases():
    # 16384 columns: the one-program-per-row backward spills (NOTES 10, 17); the looped kernel
    # (row walked in block_n chunks, dW/dB partial rows read-modify-written) for comparison.
    from kernelwright.ops import fused_add_rms_norm as fa
    from kernelwright.ops import layer_norm as ln

    m, n = 8192, 16384
    x, dy, dr, dx = (torch.randn(m, n, device="cuda", dtype=DT) for _ in range(4))
    w, b, dw, db = (torch.randn(n, device="cuda", dtype=DT) for _ in range(4))
    mean, rstd = (torch.rand(m, device="cuda", dtype=torch.float32) for _ in range(2))
    launches = {
        "layer_norm_bwd": (partial(ln.layer_norm_bwd_launch, dy, x, w, mean, rstd, dx, dw, db), 3),
        "fused_add_bwd": (
            partial(fa.fused_add_rms_norm_bwd_launch, dy, dr, x, w, rstd, dx, dw, 0.0, "llama"),
            4,
        ),
    }
    for kernel, (launch, nbytes) in launches.items():
        for block, nw, pps in itertools.product((2048, 4096, 8192, 16384), (4, 8, 16), (1, 2, 4)):
            cfg = C(block_n=block, num_warps=nw, programs_per_sm=pps)
            yield kernel, (m, n), cfg, partial(launch, config=cfg), nbytes * m * n * 2


def _layer_norm_tensors(m: int, n: int) -> tuple:
    """x, dy [m, n]; w, b [n]; y, dx like x; dw, db like w; mean, rstd [m] fp32 (all on the GPU)."""
    x, dy = (torch.randn(m, n, device="cuda", dtype=DT) for _ in range(2))
    w, b = (torch.randn(n, device="cuda", dtype=DT) for _ in range(2))
    y, dx = torch.empty_like(x), torch.empty_like(x)
    dw, db = torch.empty_like(w), torch.empty_like(b)
    mean, rstd = (torch.empty(m, device="cuda", dtype=torch.float32) for _ in range(2))
    return x, dy, w, b, y, dx, dw, db, mean, rstd


def layer_norm_wide_cases():
    # Wide rows, where the fused backward holds w, dW and dB as three fp32 rows (NOTES issue-3
    # 21): the forward's warps; the backward fused (ln.SPLIT_DWDB_FROM raised past n) and
    # split (dx alone, then the dwdb kernel); each part of the split alone.
    from kernelwright.ops import layer_norm as ln

    def fused(launch, cfg):
        def run():
            saved, ln.SPLIT_DWDB_FROM = ln.SPLIT_DWDB_FROM, 2**31
            try:
                launch(config=cfg)
            finally:
                ln.SPLIT_DWDB_FROM = saved

        return run

    for m, n in ((8192, 16384), (4096, 32768)):
        x, dy = (torch.randn(m, n, device="cuda", dtype=DT) for _ in range(2))
        w, b = (torch.randn(n, device="cuda", dtype=DT) for _ in range(2))
        y, dx = torch.empty_like(x), torch.empty_like(x)
        dw, db = torch.empty_like(w), torch.empty_like(b)
        mean, rstd = (torch.rand(m, device="cuda", dtype=torch.float32) for _ in range(2))
        for nw in (4, 8, 16, 32):
            cfg = C(block_n=n, num_warps=nw)
            f = partial(ln.layer_norm_fwd_launch, x, w, b, y, mean, rstd, 1e-5, config=cfg)
            yield "fwd", (m, n), cfg, f, 2 * m * n * 2
        bwd = partial(ln.layer_norm_bwd_launch, dy, x, w, mean, rstd, dx)
        for nw, pps, stages in itertools.product((8, 16, 32), (1, 2), (1, 2)):
            cfg = C(block_n=n, num_warps=nw, programs_per_sm=pps, num_stages=stages)
            yield "bwd_dx_only", (m, n), cfg, partial(bwd, None, None, config=cfg), 3 * m * n * 2
            yield "bwd_split", (m, n), cfg, partial(bwd, dw, db, config=cfg), 3 * m * n * 2
            yield "bwd_fused", (m, n), cfg, fused(partial(bwd, dw, db), cfg), 3 * m * n * 2
        # the dwdb kernel alone: layer_norm_dwdb_one (its split form swept here is gone)
        del x, dy, y, dx


def layer_norm_small_m_cases(shapes=((1024, 4096), (2048, 4096), (4096, 4096), (2048, 8192))):
    # Few rows (NOTES issue-3 41): the fused backward's fp32 partial rows (one per program) are
    # a third of the peak at 1024 x 4096. Against it: dx alone, then the dwdb kernel (one
    # program per column block, no partials; the first sweep, tune_small_m_1/2, also had 2-4
    # row splits with partials), reading x and dy a second time.
    from kernelwright.ops import layer_norm as ln

    for m, n in shapes:
        x, dy, w, b, y, dx, dw, db, mean, rstd = _layer_norm_tensors(m, n)
        ln.layer_norm_fwd_launch(x, w, b, y, mean, rstd, 1e-5)
        nbytes = 3 * m * n * 2
        bwd = partial(ln.layer_norm_bwd_launch, dy, x, w, mean, rstd, dx)
        yield "table", (m, n), C(block_n=0), partial(bwd, dw, db), nbytes
        yield "dx_only", (m, n), C(block_n=0), partial(bwd, None, None), nbytes
        dwdb = partial(ln.layer_norm_dwdb_launch, dy, x, mean, rstd, dw, db)
        sweep = itertools.product((16, 32, 64), (64, 128, 256), (2, 4, 8), (2, 3, 4))
        for bn, rows, nw, stages in sweep:
            if nw * 32 > rows * bn // 4 or rows * bn * stages * 2 * 2 > 96 * 1024:
                continue  # too few elements per thread; staged x and dy tiles past 96 KB
            cfg = C(block_n=bn, rows=rows, num_warps=nw, num_stages=stages)
            both = _chain(partial(bwd, None, None), partial(dwdb, config=cfg))
            yield "dx+dwdb", (m, n), cfg, both, nbytes


def layer_norm_dwdb_one_cases(shapes=((8192, 16384), (4096, 32768), (8192, 8192))):
    # dW and dB alone at wide rows (the 16384 row's split path): the table's dwdb against other
    # configs (the first run, tune_dwdb_one.log, had the earlier split form with fp32 partial
    # rows, 4 MB at 8192 x 16384, as "table").
    from kernelwright.ops import layer_norm as ln

    for m, n in shapes:
        x, dy, w, b, y, dx, dw, db, mean, rstd = _layer_norm_tensors(m, n)
        ln.layer_norm_fwd_launch(x, w, b, y, mean, rstd, 1e-5)
        dwdb = partial(ln.layer_norm_dwdb_launch, dy, x, mean, rstd, dw, db)
        yield "table", (m, n), C(block_n=0), dwdb, 2 * m * n * 2
        for bn, rows, nw, stages in itertools.product(
            (32, 64, 128), (16, 32, 64), (4, 8), (2, 3, 4)
        ):
            if nw * 32 > rows * bn // 4 or rows * bn * stages * 2 * 2 > 96 * 1024:
                continue
            cfg = C(block_n=bn, rows=rows, num_warps=nw, num_stages=stages)
            yield "one_split", (m, n), cfg, partial(dwdb, config=cfg), 2 * m * n * 2


def _chain(*fns):
    def run():
        for fn in fns:
            fn()

    return run


def layer_norm_split_cases(shapes=((8192, 16384), (8192, 8192), (4096, 32768))):
    # The backward with rows split over programs that exchange their chunk sums (split_row,
    # ops/_split.py): one read of x and dy where the table's 16384 row (dx, then the dwdb
    # kernel) reads them twice. "lib" rows: the table's config, timed in the same run.
    # layer_norm_split_wide: the rows where it won (32768) at other row counts, and past 32768
    # (the looped kernel's rows, up to 32 chunks of 4096).
    from kernelwright.ops import layer_norm as ln

    for m, n in shapes:
        x, dy, w, b, y, dx, dw, db, mean, rstd = _layer_norm_tensors(m, n)
        ln.layer_norm_fwd_launch(x, w, b, y, mean, rstd, 1e-5)
        bwd = partial(ln.layer_norm_bwd_launch, dy, x, w, mean, rstd, dx, dw, db)
        nbytes = 3 * m * n * 2
        yield "lib", (m, n), C(block_n=0), bwd, nbytes
        wide = n == 16384
        tiles = ((2048, 1), (2048, 2), (2048, 4), (4096, 1), (4096, 2), (8192, 1))
        for (block, rows), nw, pps in itertools.product(
            tiles if wide else ((4096, 1), (4096, 2)), (4, 8, 16), (1, 2, 4) if wide else (1, 2)
        ):
            if block >= n or nw * 32 * 8 > block * rows:
                continue
            cfg = C(block_n=block, rows=rows, num_warps=nw, programs_per_sm=pps, split_row=True)
            yield "split", (m, n), cfg, partial(bwd, config=cfg), nbytes
        del x, dy, y, dx


def fused_add_rms_norm_cases():
    from kernelwright.ops import fused_add_rms_norm as fa

    for m, n in NORM_SHAPES:
        x, r, dy, dr = (torch.randn(m, n, device="cuda", dtype=DT) for _ in range(4))
        w = torch.randn(n, device="cuda", dtype=DT)
        y, s, ds = (torch.empty_like(x) for _ in range(3))
        dw = torch.empty_like(w)
        rstd = torch.empty(m, device="cuda", dtype=torch.float32)
        for cfg in _norm_configs(n, bwd=False):
            f = partial(fa.fused_add_rms_norm_fwd_launch, x, r, w, y, s, rstd, 1e-6, 0.0, "llama")
            yield "fwd", (m, n), cfg, partial(f, config=cfg), 4 * m * n * 2
        for cfg in _norm_configs(n, bwd=True):
            f = partial(fa.fused_add_rms_norm_bwd_launch, dy, dr, s, w, rstd, ds, dw, 0.0, "llama")
            yield "bwd", (m, n), cfg, partial(f, config=cfg), 4 * m * n * 2


def layer_norm_cases():
    from kernelwright.ops import layer_norm as ln

    for m, n in NORM_SHAPES:
        x, dy, w, b, y, dx, dw, db, mean, rstd = _layer_norm_tensors(m, n)
        for cfg in _norm_configs(n, bwd=False):
            f = partial(ln.layer_norm_fwd_launch, x, w, b, y, mean, rstd, 1e-5, config=cfg)
            yield "fwd", (m, n), cfg, f, 2 * m * n * 2
        for cfg in _norm_configs(n, bwd=True):
            f = partial(ln.layer_norm_bwd_launch, dy, x, w, mean, rstd, dx, dw, db, config=cfg)
            yield "bwd", (m, n), cfg, f, 3 * m * n * 2


def layer_norm_fwd_looped_cases():
    # 8192-65536 columns, forward: the one-row kernel against the looped one (two reads since
    # the Welford change, with and without the L2 flags; torch.compile's forward is such a
    # two-read kernel with evict_last / evict_first), and torch.compile's as the peer row
    # (block_n=0).
    from kernelwright.ops import layer_norm as ln

    compiled = torch.compile(
        lambda x, w, b: torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, 1e-5)
    )
    for m, n in [(8192, 16384), (8192, 8192), (4096, 32768), (2048, 65536)]:
        x = torch.randn(m, n, device="cuda", dtype=DT)
        w, b = (torch.randn(n, device="cuda", dtype=DT) for _ in range(2))
        y = torch.empty_like(x)
        mean, rstd = (torch.empty(m, device="cuda", dtype=torch.float32) for _ in range(2))
        nbytes = 2 * m * n * 2
        yield "fwd", (m, n), C(block_n=0), partial(compiled, x, w, b), nbytes
        cfgs = [C(block_n=n, num_warps=nw) for nw in (8, 16, 32) if n // (nw * 32) <= 64]
        for bn, nw, flags in itertools.product(
            (1024, 2048, 4096, 8192), (2, 4, 8, 16), ((0, 0), (1, 0), (1, 1))
        ):
            if bn < n and nw * 32 * 4 <= bn:
                cfgs.append(C(block_n=bn, num_warps=nw, evict_hints=bool(flags[0]),
                              reverse_pass=bool(flags[1])))  # fmt: skip
        for cfg in cfgs:
            f = partial(ln.layer_norm_fwd_launch, x, w, b, y, mean, rstd, 1e-5, config=cfg)
            yield "fwd", (m, n), cfg, f, nbytes
        del x, y


def layer_norm_fwd_warps_cases():
    # NOTES 57: the looped forward (row length a constexpr since NOTES 42) at 16 and 32 warps and
    # chunks up to 8192, where 42's sweeps stopped at 16 warps; softmax's looped backward gained
    # 1.5% at 16384 from 32 warps (NOTES 56). The table's config (block_n=-2), torch.compile
    # (-1) and Liger (0) in the same process.
    from liger_kernel.ops.layer_norm import LigerLayerNormFunction

    from kernelwright.ops import layer_norm as ln

    compiled = torch.compile(ln.layer_norm_eager, dynamic=False)
    for m, n in [(8192, 16384), (16384, 16384), (4096, 32768)]:
        x, _, w, b, y, _, _, _, mean, rstd = _layer_norm_tensors(m, n)
        nb = 2 * m * n * 2
        yield "fwd", (m, n), C(block_n=0), partial(LigerLayerNormFunction.apply, x, w, b, 1e-5), nb
        yield "fwd", (m, n), C(block_n=-1), partial(compiled, x, w, b, 1e-5), nb
        table = partial(ln.layer_norm_fwd_launch, x, w, b, y, mean, rstd, 1e-5)
        yield "fwd", (m, n), C(block_n=-2), table, nb
        for bn, nw, rev in itertools.product((2048, 4096, 8192), (16, 32), (False, True)):
            cfg = C(block_n=bn, num_warps=nw, evict_hints=True, reverse_pass=rev)
            yield "fwd", (m, n), cfg, partial(table, config=cfg), nb
        del x, y


def softmax_cases():
    from kernelwright.ops import softmax as sm

    m = 4096
    for n in (4096, 8192, 16384, 32768, 65536, 131072, 128256, 262144):
        x = torch.randn(m, n, device="cuda", dtype=DT)
        y, dx = torch.empty_like(x), torch.empty_like(x)
        fused = triton.next_power_of_2(n)
        blocks = [b for b in (2048, 4096, 8192, 16384) if b < n]
        blocks += [fused] if fused <= 65536 else []
        for block in blocks:
            for nw in (4, 8, 16, 32):
                if nw * 32 * 8 > block or (nw == 32 and block < 16384):
                    continue
                for rows in (1, 2, 4) if block >= n else (1,):
                    if rows * block > 16384 and rows > 1:
                        continue
                    cfg = C(block_n=block, rows=rows, num_warps=nw)
                    f = partial(sm.softmax_fwd_launch, x, y, False, config=cfg)
                    yield "fwd", (m, n), cfg, f, 2 * m * n * 2
                    f = partial(sm.softmax_bwd_launch, x, y, dx, False, config=cfg)
                    yield "bwd", (m, n), cfg, f, 3 * m * n * 2
        del x, y, dx


def softmax_mid_cases():
    # 32768 and 65536 columns: the fused kernel (a row in registers: 64-128 fp32 per thread)
    # against the looped one with and without the L2 flags that made it faster past 65536.
    from kernelwright.ops import softmax as sm

    m = 4096
    for n in (32768, 65536):
        x = torch.randn(m, n, device="cuda", dtype=DT)
        y, dx = torch.empty_like(x), torch.empty_like(x)
        cfgs = [C(block_n=n, num_warps=nw) for nw in (8, 16, 32)]
        for block, nw, flag in itertools.product((2048, 4096, 8192, 16384), (8, 16, 32), (0, 1)):
            if nw * 32 * 8 <= block:
                cfgs.append(
                    C(block_n=block, num_warps=nw, evict_hints=bool(flag), reverse_pass=bool(flag))
                )
        for cfg in cfgs:
            yield (
                "fwd",
                (m, n),
                cfg,
                partial(sm.softmax_fwd_launch, x, y, False, config=cfg),
                (2 * m * n * 2),
            )
            yield (
                "bwd",
                (m, n),
                cfg,
                partial(sm.softmax_bwd_launch, x, y, dx, False, config=cfg),
                (3 * m * n * 2),
            )
        del x, y, dx


def softmax_split_cases():
    # Past 32768 columns: the row split over programs that wait for each other (ops/_split.py,
    # NOTES 31) at several chunk widths and warp counts, against the table's rows (block_n=0;
    # when this ran first, a881506: the held one-row forward at 65536, looped kernels past it).
    from kernelwright.ops import softmax as sm

    m = 4096
    for n in (65536, 131072, 262144):
        x = torch.randn(m, n, device="cuda", dtype=DT).mul_(4.0)
        y, dx = torch.empty_like(x), torch.empty_like(x)
        dy = torch.randn_like(x)
        sm.softmax_fwd_launch(x, y, False)
        fwd = [C(block_n=0)] + [
            C(block_n=b, num_warps=w, split_row=True)
            for b, w in itertools.product((8192, 16384, 32768), (4, 8, 16, 32))
            if 16 <= b // (w * 32) <= 128
        ]
        bwd = [C(block_n=0)] + [
            C(block_n=b, num_warps=w, split_row=True)
            for b, w in itertools.product((4096, 8192, 16384), (4, 8, 16, 32))
            if 8 <= b // (w * 32) <= 64
        ]
        for cfg in fwd:
            c = None if cfg.block_n == 0 else cfg
            f = partial(sm.softmax_fwd_launch, x, y, False, config=c)
            yield "fwd", (m, n), cfg, f, 2 * m * n * 2
        sm.softmax_fwd_launch(x, y, False)
        for cfg in bwd:
            c = None if cfg.block_n == 0 else cfg
            f = partial(sm.softmax_bwd_launch, dy, y, dx, False, config=c)
            yield "bwd", (m, n), cfg, f, 3 * m * n * 2
        del x, y, dx, dy


def softmax_bwd_small_cases():
    # 4096-16384 columns, backward: the one-pass kernel (row in registers) against the looped
    # two-pass one with the L2 flags, which is how torch.compile's kernel works there (a read
    # pass with evict_last, a write pass with evict_first); the compiled aten backward as the
    # peer row (block_n=0).
    from kernelwright.ops import softmax as sm

    m = 4096
    compiled = torch.compile(lambda dy, y: torch.ops.aten._softmax_backward_data(dy, y, -1, DT))
    for n in (4096, 8192, 16384):
        y = torch.softmax(torch.randn(m, n, device="cuda"), -1).to(DT)
        dy, dx = torch.randn_like(y), torch.empty_like(y)
        nbytes = 3 * m * n * 2
        yield "bwd", (m, n), C(block_n=0), partial(compiled, dy, y), nbytes
        cfgs = [C(block_n=n, num_warps=nw) for nw in (4, 8, 16)]
        for block, nw, hints, rev in itertools.product(
            (512, 1024, 2048), (2, 4, 8), (False, True), (False, True)
        ):
            if block < n and nw * 32 * 4 <= block:
                cfgs.append(C(block_n=block, num_warps=nw, evict_hints=hints, reverse_pass=rev))
        for cfg in cfgs:
            f = partial(sm.softmax_bwd_launch, dy, y, dx, False, config=cfg)
            yield "bwd", (m, n), cfg, f, nbytes
        del y, dy, dx


def _elementwise_cases(fwd_launch, bwd_launch, two_inputs: bool):
    for m, n in [(16384, 14336), (8192, 18944), (8192, 8192), (2048, 14336)]:
        a = torch.randn(m, n, device="cuda", dtype=DT)
        b = torch.randn_like(a)
        c, dc, da, db = (torch.empty_like(a) for _ in range(4))
        dc.normal_()
        nf, nb = (3, 5) if two_inputs else (2, 3)
        for block, rows, nw in itertools.product((1024, 2048, 4096, 8192), (1, 2, 4), (4, 8, 16)):
            if block * rows > 8192 or nw * 32 * 4 > block * rows:
                continue
            cfg = C(block_n=block, rows=rows, num_warps=nw)
            if two_inputs:
                fwd = partial(fwd_launch, a, b, c, config=cfg)
                bwd = partial(bwd_launch, dc, a, b, da, db, config=cfg)
            else:
                fwd = partial(fwd_launch, a, c, config=cfg)
                bwd = partial(bwd_launch, dc, a, da, config=cfg)
            yield "fwd", (m, n), cfg, fwd, nf * m * n * 2
            yield "bwd", (m, n), cfg, bwd, nb * m * n * 2


def geglu_cases():
    from kernelwright.ops import geglu as g

    yield from _elementwise_cases(g.geglu_fwd_launch, g.geglu_bwd_launch, two_inputs=True)


def relu_squared_cases():
    from kernelwright.ops import relu_squared as r

    yield from _elementwise_cases(r.relu_squared_fwd_launch, r.relu_squared_bwd_launch, False)


def _jagged_offsets() -> tuple[torch.Tensor, int]:
    # the bench's batch: 4096 segments of random lengths 1..512 (~1.05M rows); offsets on the GPU
    gen = torch.Generator().manual_seed(77)
    lengths = torch.randint(1, 513, (4096,), generator=gen)
    offsets = torch.zeros(4097, dtype=torch.int64)
    offsets[1:] = lengths.cumsum(0)
    return offsets.cuda(), int(offsets[-1])


def jagged_mean_cases():
    from kernelwright.ops import jagged_mean as jm

    offsets, total = _jagged_offsets()
    for d in (64, 256, 1024):
        v = torch.randn(total, d, device="cuda", dtype=DT)
        dv = torch.empty_like(v)
        out = torch.empty(4096, d, device="cuda", dtype=DT)
        dout = torch.randn_like(out)
        nbytes = total * d * 2 + 4096 * d * 2
        for block in (64, 128, 256, 512, 1024):
            if block > d:
                continue
            for rows, nw, st in itertools.product((4, 8, 16, 32, 64), (2, 4, 8), (1, 2, 3)):
                if block * rows > 32768 or block * rows < 512 or nw * 32 * 2 > block * rows:
                    continue
                cfg = C(block_n=block, rows=rows, num_warps=nw, num_stages=st)
                fwd = partial(jm.jagged_mean_fwd_launch, v, offsets, out, config=cfg)
                yield "fwd", (total, d), cfg, fwd, nbytes
                if st == 1:
                    bwd = partial(jm.jagged_mean_bwd_launch, dout, offsets, dv, config=cfg)
                    yield "bwd", (total, d), cfg, bwd, nbytes


def jagged_mean_balance_cases():
    # D = 64 forward (65% of copy where D >= 256 reaches 95-105%): is it the tail of long
    # segments, or each program's own latency? The same ~1.05M rows as 4096 segments of random
    # lengths 1..512 (the bench's), of equal lengths, and of the random lengths sorted longest
    # first (the order a GPU would want to schedule them in). "kernel" names the layout.
    from kernelwright.ops import jagged_mean as jm

    gen = torch.Generator().manual_seed(77)
    rand_len = torch.randint(1, 513, (4096,), generator=gen)
    total = int(rand_len.sum())
    equal = torch.full((4096,), total // 4096, dtype=torch.int64)
    equal[: total - int(equal.sum())] += 1
    layouts = {"random": rand_len, "equal": equal, "sorted": rand_len.sort(descending=True)[0]}
    d = 64
    v = torch.randn(total, d, device="cuda", dtype=DT)
    out = torch.empty(4096, d, device="cuda", dtype=DT)
    nbytes = total * d * 2 + 4096 * d * 2
    for name, lengths in layouts.items():
        offsets = torch.zeros(4097, dtype=torch.int64)
        offsets[1:] = lengths.cumsum(0)
        assert int(offsets[-1]) == total
        offsets = offsets.cuda()
        for rows, nw, st in itertools.product((16, 32, 64, 128), (2, 4, 8), (2, 3, 4)):
            if nw * 32 * 2 > 64 * rows:
                continue
            cfg = C(block_n=64, rows=rows, num_warps=nw, num_stages=st)
            fwd = partial(jm.jagged_mean_fwd_launch, v, offsets, out, config=cfg)
            yield f"fwd_{name}", (total, d), cfg, fwd, nbytes


def jagged_mean_staged_cases():
    # The forward's row-chunk loop staged (tl.range num_stages: the next chunks' loads go to
    # shared memory by cp.async while this one is summed). Stages 1 is the loop unstaged, the
    # kernel as it was. D = 64 sat at 67% of copy with 2 loads' latency per program exposed.
    from kernelwright.ops import jagged_mean as jm

    offsets, total = _jagged_offsets()
    grid = {  # D: (column tiles, rows per chunk, warps, stages); 256 and 1024 already ~copy
        64: ((64,), (16, 32, 64, 128), (1, 2, 4, 8), (1, 2, 3, 4, 5)),
        256: ((128,), (16, 32, 64), (2, 4, 8), (1, 3, 4)),
        1024: ((512,), (8, 16, 32), (4, 8), (1, 3, 4)),
    }
    for d, (blocks, rows_list, warps, stages) in grid.items():
        v = torch.randn(total, d, device="cuda", dtype=DT)
        out = torch.empty(4096, d, device="cuda", dtype=DT)
        nbytes = total * d * 2 + 4096 * d * 2
        for block, rows, nw, st in itertools.product(blocks, rows_list, warps, stages):
            if block * rows > 16384 or nw * 32 * 2 > block * rows:
                continue
            cfg = C(block_n=block, rows=rows, num_warps=nw, num_stages=st)
            fwd = partial(jm.jagged_mean_fwd_launch, v, offsets, out, config=cfg)
            yield "fwd", (total, d), cfg, fwd, nbytes


def rope_cases():
    # q, k as HF attention hands them over: [B, H, S, D] transposes of [B, S, H, D] projections.
    from kernelwright.ops import rope as rp

    try:
        from liger_kernel.transformers.rope import liger_rotary_pos_emb
    except ImportError:
        liger_rotary_pos_emb = None
    heads = [(32, 8, 128), (28, 4, 128), (16, 8, 256), (32, 8, 64), (128, 8, 128)]
    shapes = [(8192, *h) for h in heads] + [
        (16384, 32, 8, 128),
        (2048, 32, 8, 128),
        (1024, 32, 8, 128),
    ]
    for s, hq, hk, d in shapes:
        q = torch.randn(1, s, hq, d, device="cuda", dtype=DT).transpose(1, 2)
        k = torch.randn(1, s, hk, d, device="cuda", dtype=DT).transpose(1, 2)
        cos, sin = rp.rope_tables(s, d, dtype=DT, device="cuda")  # [1, S, D]
        qo, ko = torch.empty_like(q), torch.empty_like(k)
        nbytes = 2 * (q.numel() + k.numel()) * 2
        shape = (s, (hq + hk) * d)
        if liger_rotary_pos_emb is not None:
            liger = partial(liger_rotary_pos_emb, q, k, cos, sin)
            yield "fwd", shape, C(block_n=0), liger, nbytes
        for block, rows, nw in itertools.product(
            (1024, 2048, 4096, 8192, 16384), (1, 2), (2, 4, 8)
        ):
            if nw * 32 * 8 > block:
                continue
            cfg = C(block_n=block, rows=rows, num_warps=nw)
            fwd = partial(rp.rope_fwd_launch, q, k, cos, sin, qo, ko, 1, False, config=cfg)
            yield "fwd", shape, cfg, fwd, nbytes


def small_m_cases():
    # Forwards at few rows, where the table's config (swept at 8192+ rows) may leave programs
    # waiting for a second wave: every warp count at 1024-8192 rows, Liger and torch.compile
    # alongside (peer rows: block_n 0 = Liger, -1 = torch.compile; the bench's references).
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    from liger_kernel.transformers.rope import liger_rotary_pos_emb

    from kernelwright.ops import fused_add_rms_norm as fa
    from kernelwright.ops import layer_norm as ln
    from kernelwright.ops import rms_norm as rn
    from kernelwright.ops import rope as rp

    n = 4096
    for m in (1024, 2048, 4096, 8192):
        # the residual r random like dy, the residual output s empty like dx
        x, r, w, b, y, s, _, _, mean, rstd = _layer_norm_tensors(m, n)
        ref = torch.compile(partial(rn.rms_norm_eager, eps=1e-6), dynamic=False)
        nb = 2 * m * n * 2
        yield (
            "rms_fwd",
            (m, n),
            C(block_n=0),
            partial(LigerRMSNormFunction.apply, x, w, 1e-6, 0.0, "llama", False),
            nb,
        )
        yield "rms_fwd", (m, n), C(block_n=-1), partial(ref, x, w), nb
        lref = torch.compile(
            lambda x, w, b: torch.nn.functional.layer_norm(x, (n,), w, b, 1e-5), dynamic=False
        )
        yield "ln_fwd", (m, n), C(block_n=-1), partial(lref, x, w, b), nb
        for rows, nw in itertools.product((1, 2, 4), (1, 2, 4, 8, 16)):
            cfg = C(block_n=n, rows=rows, num_warps=nw)
            f = partial(rn.rms_norm_fwd_launch, x, w, y, rstd, 1e-6, 0.0, "llama", config=cfg)
            yield "rms_fwd", (m, n), cfg, f, nb
            f = partial(ln.layer_norm_fwd_launch, x, w, b, y, mean, rstd, 1e-5, config=cfg)
            yield "ln_fwd", (m, n), cfg, f, nb
            f = partial(fa.fused_add_rms_norm_fwd_launch, x, r, w, y, s, rstd, 1e-6, 0.0, "llama")
            yield "fa_fwd", (m, n), cfg, partial(f, config=cfg), 2 * nb
    for tokens in (1024, 2048, 4096):
        q = torch.randn(1, tokens, 32, 128, device="cuda", dtype=DT).transpose(1, 2)
        k = torch.randn(1, tokens, 8, 128, device="cuda", dtype=DT).transpose(1, 2)
        cos, sin = rp.rope_tables(tokens, 128, dtype=DT, device="cuda")
        qo, ko = torch.empty_like(q), torch.empty_like(k)
        nb = 2 * (q.numel() + k.numel()) * 2
        shape = (tokens, 5120)
        yield "rope_fwd", shape, C(block_n=0), partial(liger_rotary_pos_emb, q, k, cos, sin), nb
        for block, nw in itertools.product((4096, 8192, 16384), (1, 2, 4, 8, 16)):
            cfg = C(block_n=block, rows=1, num_warps=nw)
            fwd = partial(rp.rope_fwd_launch, q, k, cos, sin, qo, ko, 1, False, config=cfg)
            yield "rope_fwd", shape, cfg, fwd, nb


def norm_fwd_cases():
    # The three norms' forwards re-swept with the reading flush (NOTES 37: the tables' sweeps
    # used the zeroing one, whose orderings were not re-checked), at the bench's shapes, with
    # torch.compile (block_n -1) and Liger (block_n 0) in the same process; the looped
    # layer_norm forward (row length a constexpr since NOTES 42) at 8192+ columns.
    from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
    from liger_kernel.ops.layer_norm import LigerLayerNormFunction
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    from kernelwright.ops import fused_add_rms_norm as fa
    from kernelwright.ops import layer_norm as ln
    from kernelwright.ops import rms_norm as rn

    shapes = NORM_SHAPES + [(1024, 4096), (4096, 4096), (32768, 4096), (4096, 32768)]
    for m, n in shapes:
        # the residual r random like dy, the residual output s empty like dx
        x, r, w, b, y, s, _, _, mean, rstd = _layer_norm_tensors(m, n)
        nb = 2 * m * n * 2
        peers = {
            "rms_norm": (
                partial(LigerRMSNormFunction.apply, x, w, 1e-6, 0.0, "llama", False),
                partial(torch.compile(rn.rms_norm_eager, dynamic=False), x, w, 1e-6),
            ),
            "layer_norm": (
                partial(LigerLayerNormFunction.apply, x, w, b, 1e-5),
                partial(torch.compile(ln.layer_norm_eager, dynamic=False), x, w, b, 1e-5),
            ),
            "fused_add_rms_norm": (
                partial(LigerFusedAddRMSNormFunction.apply, x, r, w, 1e-6, 0.0, "llama", False),
                partial(torch.compile(fa.fused_add_rms_norm_eager, dynamic=False), x, r, w, 1e-6),
            ),
        }
        for op, (liger, compiled) in peers.items():
            k = f"{op}_fwd"
            mult = 2 if op == "fused_add_rms_norm" else 1
            yield k, (m, n), C(block_n=0), liger, mult * nb
            yield k, (m, n), C(block_n=-1), compiled, mult * nb
        cfgs = list(_norm_configs(n, bwd=False))
        looped = [
            C(block_n=bn, num_warps=nw, evict_hints=True, reverse_pass=rev)
            for bn, nw, rev in itertools.product((2048, 4096), (8, 16), (False, True))
        ]
        for cfg in cfgs + (looped if n >= 8192 else []):
            f = partial(ln.layer_norm_fwd_launch, x, w, b, y, mean, rstd, 1e-5, config=cfg)
            yield "layer_norm_fwd", (m, n), cfg, f, nb
        for cfg in cfgs:
            f = partial(rn.rms_norm_fwd_launch, x, w, y, rstd, 1e-6, 0.0, "llama", config=cfg)
            yield "rms_norm_fwd", (m, n), cfg, f, nb
            f = partial(fa.fused_add_rms_norm_fwd_launch, x, r, w, y, s, rstd, 1e-6, 0.0, "llama")
            yield "fused_add_rms_norm_fwd", (m, n), cfg, partial(f, config=cfg), 2 * nb
        del x, r, y, s


def _with_constant(module, name: str, value, fn):
    # fn run with module.name set to value (a launcher reads it at each call)
    def call():
        old = getattr(module, name)
        setattr(module, name, value)
        try:
            fn()
        finally:
            setattr(module, name, old)

    return call


def norm_affine_cases():
    # The one-row forwards with w (and b) loaded before x ("early") or after the statistics
    # ("late", kernels *_late): EARLY_WEIGHT_MAX_N / EARLY_AFFINE_MAX_N at 0 or unbounded. Peers as
    # in norm_fwd (block_n 0 = Liger, -1 = torch.compile).
    from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    from kernelwright.ops import fused_add_rms_norm as fa
    from kernelwright.ops import layer_norm as ln
    from kernelwright.ops import rms_norm as rn

    shapes = [(8192, 3584), (8192, 4096), (16384, 4096), (1024, 4096), (8192, 8192), (8192, 2048)]
    for m, n in shapes:
        # the residual r random like dy, the residual output s empty like dx
        x, r, w, b, y, s, _, _, mean, rstd = _layer_norm_tensors(m, n)
        nb = 2 * m * n * 2
        rms_c = torch.compile(rn.rms_norm_eager, dynamic=False)
        fa_l = partial(LigerFusedAddRMSNormFunction.apply, x, r, w, 1e-6, 0.0, "llama", False)
        yield "fused_add_rms_norm_fwd", (m, n), C(block_n=0), fa_l, 2 * nb
        rms_l = partial(LigerRMSNormFunction.apply, x, w, 1e-6, 0.0, "llama", False)
        yield "rms_norm_fwd", (m, n), C(block_n=0), rms_l, nb
        yield "rms_norm_fwd", (m, n), C(block_n=-1), partial(rms_c, x, w, 1e-6), nb
        block = triton.next_power_of_2(n)
        for rows, nw in itertools.product((1, 2, 4), (4, 8, 16)):
            if rows * block > 16384:
                continue
            cfg = C(block_n=block, rows=rows, num_warps=nw)
            for late in (False, True):
                limit = 0 if late else 2**31 - 1
                tag = "_late" if late else ""
                f = partial(ln.layer_norm_fwd_launch, x, w, b, y, mean, rstd, 1e-5, config=cfg)
                f = _with_constant(ln, "EARLY_AFFINE_MAX_N", limit, f)
                yield f"layer_norm_fwd{tag}", (m, n), cfg, f, nb
                f = partial(rn.rms_norm_fwd_launch, x, w, y, rstd, 1e-6, 0.0, "llama", config=cfg)
                f = _with_constant(rn, "EARLY_WEIGHT_MAX_N", limit, f)
                yield f"rms_norm_fwd{tag}", (m, n), cfg, f, nb
                f = partial(
                    fa.fused_add_rms_norm_fwd_launch, x, r, w, y, s, rstd, 1e-6, 0.0, "llama",
                    config=cfg,
                )  # fmt: skip
                f = _with_constant(fa, "EARLY_WEIGHT_MAX_N", limit, f)
                yield f"fused_add_rms_norm_fwd{tag}", (m, n), cfg, f, 2 * nb
        del x, r, y, s


def elementwise_small_m_cases():
    # relu_squared and geglu forwards at 1024-8192 tokens of intermediate 14336: the table's
    # rows were swept at 2048+ tokens, and relu_squared's forward at 1024 tokens was 0.96x the
    # peers in the read-flush bench (17.1 us, 80% of copy). Liger (block_n 0) and torch.compile
    # (block_n -1) alongside.
    from liger_kernel.ops.geglu import LigerGELUMulFunction
    from liger_kernel.ops.relu_squared import LigerReLUSquaredFunction

    from kernelwright.ops import geglu as g
    from kernelwright.ops import relu_squared as r

    n = 14336
    for m in (1024, 2048, 8192):
        a, b = (torch.randn(m, n, device="cuda", dtype=DT) for _ in range(2))
        c = torch.empty_like(a)
        r_c = torch.compile(r.relu_squared_eager, dynamic=False)
        g_c = torch.compile(g.geglu_eager, dynamic=False)
        yield (
            "relu_squared_fwd",
            (m, n),
            C(block_n=0),
            partial(LigerReLUSquaredFunction.apply, a),
            2 * m * n * 2,
        )
        yield "relu_squared_fwd", (m, n), C(block_n=-1), partial(r_c, a), 2 * m * n * 2
        yield (
            "geglu_fwd",
            (m, n),
            C(block_n=0),
            partial(LigerGELUMulFunction.apply, a, b),
            3 * m * n * 2,
        )
        yield "geglu_fwd", (m, n), C(block_n=-1), partial(g_c, a, b), 3 * m * n * 2
        for block, rows, nw in itertools.product(
            (512, 1024, 2048, 4096, 8192), (1, 2, 4), (2, 4, 8, 16)
        ):
            if block * rows > 16384 or nw * 32 * 2 > block * rows:
                continue
            cfg = C(block_n=block, rows=rows, num_warps=nw)
            yield (
                "relu_squared_fwd",
                (m, n),
                cfg,
                partial(r.relu_squared_fwd_launch, a, c, config=cfg),
                2 * m * n * 2,
            )
            yield (
                "geglu_fwd",
                (m, n),
                cfg,
                partial(g.geglu_fwd_launch, a, b, c, config=cfg),
                3 * m * n * 2,
            )
        del a, b, c


def _ce_forward(m: int, v: int, device: str = "cuda"):
    """cross_entropy_fwd_launch on fresh [m, v] logits (std 4, a logits-like spread), ~5% of
    the targets ignored, the gradient scaled by 1 / m: call it with config=."""
    from kernelwright.ops.cross_entropy import cross_entropy_fwd_launch

    x = torch.randn(m, v, device=device, dtype=DT).mul_(4)
    t = torch.randint(0, v, (m,), device=device)
    t[torch.rand(m, device=device) < 0.05] = -100
    loss, lse = (torch.empty(m, device=device, dtype=torch.float32) for _ in range(2))
    scale = torch.full((1,), 1.0 / m, device=device)
    return partial(cross_entropy_fwd_launch, x, t, loss, lse, grad=torch.empty_like(x), scale=scale)


def cross_entropy_cases():
    # The forward as training runs it: loss, lse and the gradient (scaled by 1 / token count)
    # in one launch, ~5% of the targets ignored. Bytes: read the logits, write the gradient.

    m = 8192
    for v in (32000, 128256, 262144):
        f = _ce_forward(m, v)
        nbytes = 2 * m * v * 2 + m * 8
        blocks = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
        for block, nw in itertools.product(blocks, (4, 8, 16, 32)):
            if nw * 32 * 4 > block:  # under 4 elements a thread
                continue
            cfg = C(block_n=block, num_warps=nw)
            yield "fwd", (m, v), cfg, partial(f, config=cfg), nbytes
        del f


def cross_entropy_hold_cases():
    # Vocabularies of 16K-64K: the looped 2048-column form against one block with the row held
    # in its own dtype (ops/_held.py), forward with the gradient as cross_entropy_cases.

    m = 8192
    looped = C(block_n=2048, num_warps=8, evict_hints=True, reverse_pass=True)
    for v in (16384, 32000, 32768, 50257, 65536):
        f = _ce_forward(m, v)
        block = triton.next_power_of_2(v)
        for cfg in [looped] + [C(block_n=block, num_warps=nw) for nw in (8, 16, 32)]:
            yield "fwd", (m, v), cfg, partial(f, config=cfg), 2 * m * v * 2 + m * 8
        del f


def l2_hint_cases():
    # The two-pass kernels' L2 flags (LaunchConfig.evict_hints, reverse_pass) on the rows that
    # take the looped path: softmax past 65536 columns, cross-entropy's forward with gradient.
    from kernelwright.ops import softmax as sm

    flags = list(itertools.product((False, True), (False, True)))
    m = 4096
    for n in (131072, 152064, 262144):
        x = torch.randn(m, n, device="cuda", dtype=DT)
        y, dx = torch.empty_like(x), torch.empty_like(x)
        for (block, nw), (ev, rev) in itertools.product(
            ((4096, 16), (8192, 16), (16384, 16), (16384, 32)), flags
        ):
            cfg = C(block_n=block, num_warps=nw, evict_hints=ev, reverse_pass=rev)
            f = partial(sm.softmax_fwd_launch, x, y, False, config=cfg)
            yield "fwd", (m, n), cfg, f, 2 * m * n * 2
            f = partial(sm.softmax_bwd_launch, x, y, dx, False, config=cfg)
            yield "bwd", (m, n), cfg, f, 3 * m * n * 2
        del x, y, dx
    m = 8192
    for v in (32000, 128256, 262144):
        f = _ce_forward(m, v)
        for (block, nw), (ev, rev) in itertools.product(
            ((2048, 8), (4096, 8), (4096, 16), (8192, 16)), flags
        ):
            cfg = C(block_n=block, num_warps=nw, evict_hints=ev, reverse_pass=rev)
            yield "ce_fwd", (m, v), cfg, partial(f, config=cfg), 2 * m * v * 2 + m * 8
        del f


CASES = {
    "rms_norm": rms_norm_cases,
    "rms_norm_fwd": rms_norm_fwd_cases,
    "cross_entropy_hold": cross_entropy_hold_cases,
    "swiglu": swiglu_cases,
    "fused_add_rms_norm": fused_add_rms_norm_cases,
    "layer_norm": layer_norm_cases,
    "norm_bwd_looped": norm_bwd_looped_cases,
    "layer_norm_wide": layer_norm_wide_cases,
    "layer_norm_split": layer_norm_split_cases,
    "layer_norm_small_m": layer_norm_small_m_cases,
    "layer_norm_dwdb_one": layer_norm_dwdb_one_cases,
    "layer_norm_split_wide": partial(
        layer_norm_split_cases,
        ((1024, 32768), (4096, 32768), (8192, 32768), (4096, 20000), (2048, 65536), (1024, 131072)),
    ),
    **{f"{op}_bwd_stages": partial(norm_bwd_stage_cases, op) for op in _NORMS},
    # the 4096-column row alone, after PDL (NOTES 30, 34)
    "layer_norm_bwd_4096": partial(
        norm_bwd_stage_cases, "layer_norm", [(m, 4096) for m in (2048, 8192, 16384, 32768)]
    ),
    "softmax": softmax_cases,
    "softmax_mid": softmax_mid_cases,
    "softmax_split": softmax_split_cases,
    "softmax_bwd_small": softmax_bwd_small_cases,
    "jagged_mean_balance": jagged_mean_balance_cases,
    "jagged_mean_staged": jagged_mean_staged_cases,
    "layer_norm_fwd_looped": layer_norm_fwd_looped_cases,
    "layer_norm_fwd_warps": layer_norm_fwd_warps_cases,
    "geglu": geglu_cases,
    "relu_squared": relu_squared_cases,
    "jagged_mean": jagged_mean_cases,
    "rope": rope_cases,
    "small_m": small_m_cases,
    "norm_fwd": norm_fwd_cases,
    "norm_affine": norm_affine_cases,
    "elementwise_small_m": elementwise_small_m_cases,
    "cross_entropy": cross_entropy_cases,
    "l2_hints": l2_hint_cases,
}


def main() -> None:
    ops = sys.argv[1:] or list(CASES)
    bw = copy_gbps()
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}")
    print(f"copy bandwidth {bw:.0f} GB/s")
    out = os.environ.get("OUT", ".")
    rows = []
    for op in ops:
        best: dict = {}
        for kernel, shape, cfg, fn, nbytes in CASES[op]():
            try:
                ms = bench(fn)
            except Exception as e:  # a config that does not compile or run: skip it, say why
                print(f"  skip {op} {kernel} {shape} {cfg}: {type(e).__name__}: {str(e)[:80]}")
                continue
            gbps = nbytes / ms / 1e6
            rows.append(
                [
                    op,
                    kernel,
                    *shape,
                    cfg.block_n,
                    cfg.rows,
                    cfg.num_warps,
                    cfg.programs_per_sm,
                    cfg.num_stages,
                    int(cfg.evict_hints),
                    int(cfg.reverse_pass),
                    int(cfg.split_row),
                    f"{ms:.5f}",
                    f"{gbps:.0f}",
                    f"{100 * gbps / bw:.1f}",
                ]
            )
            best.setdefault((kernel, shape), []).append((ms, gbps, cfg))
        for (kernel, shape), res in best.items():
            res.sort(key=lambda r: r[0])
            print(f"{op} {kernel} {shape}:")
            shown = res[:4] + [r for r in res[4:] if r[2].block_n <= 0]  # peer rows always
            for ms, gbps, cfg in shown:
                print(f"   {ms:.4f} ms {gbps:6.0f} GB/s {100 * gbps / bw:5.1f}%  {cfg}")
    with open(os.path.join(out, f"tune_{'_'.join(ops)}.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "op",
                "kernel",
                "m",
                "n",
                "block_n",
                "rows",
                "num_warps",
                "programs_per_sm",
                "num_stages",
                "evict_hints",
                "reverse_pass",
                "split_row",
                "ms",
                "gbps",
                "pct_copy_bw",
            ]
        )
        w.writerows(rows)


if __name__ == "__main__":
    main()
