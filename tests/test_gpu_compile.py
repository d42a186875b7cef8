"""Every launch-table config of every kernel compiles for sm_90 (Hopper), checked on the CPU.

The interpreter runs code that the GPU compiler rejects; this catches it before the GPU does.
"""

import os
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl
from conftest import H100, ON_GPU

from kernelwright.ops import rms_norm as rms
from kernelwright.ops import rope as rp
from kernelwright.ops import softmax as sm
from kernelwright.ops import swiglu as sw
from kernelwright.ops.cross_entropy import cross_entropy_fwd_launch
from kernelwright.runtime.launch import LaunchConfig
from kernelwright.runtime.tables import rms_norm as RMS_TABLES
from kernelwright.runtime.tables.rms_norm import TABLE as RMS_TABLE
from kernelwright.runtime.tables.rope import TABLE as ROPE_TABLE
from kernelwright.runtime.tables.swiglu import TABLE as SWIGLU_TABLE
from kernelwright.testing import gpu_compile
from kernelwright.testing.gpu_compile import capture_launches, check_compiles

pytestmark = pytest.mark.skipif(ON_GPU, reason="the GPU run compiles these for real")


def _row_lengths(table, kernel):
    # One row length per table row: its upper bound, capped so the host tensors stay small
    # (the last, looped row gets a length past the previous bound).
    bounds = [max_n for max_n, _ in table[kernel]["default"]]
    return [min(b, bounds[-2] + 7) for b in bounds], [cfg for _, cfg in table[kernel]["default"]]


def _assert_all_compiled(results):
    failures = [
        f"{r.launch.name} {dict(r.launch.constexprs)}: {r.error}" for r in results if not r.ok
    ]
    assert not failures, "\n".join(failures)


def test_rms_norm_kernels_compile_for_hopper(monkeypatch):
    def run():
        for kernel in ("fwd", "bwd"):
            for n, cfg in zip(*_row_lengths(RMS_TABLE, kernel), strict=False):
                for mode in rms.CASTING_MODES:
                    x = torch.randn(2, n, dtype=torch.bfloat16)
                    w = torch.randn(n, dtype=torch.bfloat16) if mode != "none" else None
                    y, rstd = torch.empty_like(x), torch.empty(2)
                    if kernel == "fwd":
                        rms.rms_norm_fwd_launch(x, w, y, rstd, 1e-6, 0.0, mode, config=cfg)
                    else:
                        rstd.fill_(1.0)
                        dw = torch.empty_like(w) if w is not None else None
                        rms.rms_norm_bwd_launch(y, x, w, rstd, x.clone(), dw, 0.0, mode, config=cfg)

    # Two rows are "few" (_partials.few_rows) from 4096 columns: once with dW in the fused
    # kernels everywhere, once as the table has it (the dw kernel there).
    monkeypatch.setattr(RMS_TABLES, "PARTIALS_SHARE", float("inf"))
    results = check_compiles(run)
    monkeypatch.undo()
    few = check_compiles(run)
    _assert_all_compiled(results + few)
    assert len(results) >= 20
    assert any(r.launch.name == "_norm_dw_kernel" for r in few)


@pytest.mark.slow
def test_swiglu_kernels_compile_for_hopper():
    def run():
        for kernel in ("fwd", "bwd"):
            for n, cfg in zip(*_row_lengths(SWIGLU_TABLE, kernel), strict=True):
                for dtype in (torch.bfloat16, torch.float32):
                    a, b = torch.randn(2, n, dtype=dtype), torch.randn(2, n, dtype=dtype)
                    if kernel == "fwd":
                        sw.swiglu_fwd_launch(a, b, torch.empty_like(a), config=cfg)
                    else:
                        da, db = torch.empty_like(a), torch.empty_like(a)
                        sw.swiglu_bwd_launch(a.clone(), a, b, da, db, config=cfg)

    results = check_compiles(run)
    _assert_all_compiled(results)
    assert len(results) >= 8


@pytest.mark.slow
def test_rope_kernels_compile_for_hopper():
    # Head configs landing in each table row (keyed by (heads + kv_heads) * head_dim: 384,
    # 2560, 5120, and 17408, Llama-3.1-405B's, several head tiles per token), both pairings,
    # full and partial rotary, bf16 q/k with cos/sin in bf16 and in fp32.
    head_configs = [(4, 2, 64), (32, 8, 64), (32, 8, 128), (128, 8, 128)]

    def run():
        for kernel in ("fwd", "bwd"):
            launch = rp.rope_fwd_launch if kernel == "fwd" else rp.rope_bwd_launch
            rows = ROPE_TABLE[kernel]["default"]
            for hq, hk, d in head_configs:
                cfg = next(c for max_n, c in rows if (hq + hk) * d <= max_n)
                for interleaved in (False, True):
                    for r, table_dtype in ((d, torch.bfloat16), (d // 2, torch.float32)):
                        q = torch.randn(1, 2, hq, d, dtype=torch.bfloat16).transpose(1, 2)
                        k = torch.randn(1, 2, hk, d, dtype=torch.bfloat16).transpose(1, 2)
                        cos = torch.randn(1, 2, r, dtype=table_dtype)
                        outs = [torch.empty_like(q), torch.empty_like(k)]
                        launch(q, k, cos, cos, *outs, 1, interleaved, config=cfg)

    results = check_compiles(run)
    _assert_all_compiled(results)
    assert len(results) >= 32


@pytest.mark.slow
def test_two_pass_kernels_compile_with_their_l2_flags():
    # softmax's looped kernels and cross-entropy's forward with every L2 flag setting: the
    # eviction policies are constexpr strings the interpreter ignores, the GPU compiler does not
    flags = [(e, r) for e in (False, True) for r in (False, True)]

    def run():
        x = torch.randn(2, 700, dtype=torch.bfloat16)
        t = torch.tensor([3, 699])
        for ev, rev in flags:
            cfg = LaunchConfig(block_n=256, num_warps=4, evict_hints=ev, reverse_pass=rev)
            y = torch.empty_like(x)
            sm.softmax_fwd_launch(x, y, False, config=cfg)
            sm.softmax_bwd_launch(x, y, torch.empty_like(x), True, config=cfg)
            loss, lse = torch.empty(2), torch.empty(2)
            cross_entropy_fwd_launch(x, t, loss, lse, grad=torch.empty_like(x), config=cfg)

    results = check_compiles(run)
    _assert_all_compiled(results)
    assert len(results) == 3 * len(flags)


@pytest.mark.slow
def test_split_row_kernels_compile_for_hopper(monkeypatch):
    # softmax's split rows in their waiting form (PHASE 0, which the interpreter never runs),
    # their exchange in the output (and its words kernels; the backward's counter prefetched,
    # inline PTX the interpreter cannot run) and in the workspace (a bf16 output view 2 bytes
    # in; fp32's, 4 bytes in, is aligned: the same launch again), bf16 rows and fp32
    # (ops/_split.py). Recorded only, not run: nothing may wait under the interpreter.
    from kernelwright.ops import _split

    monkeypatch.setattr(_split, "device_info", lambda device=None: H100)  # waits, prefetches

    def run():
        for dtype in (torch.bfloat16, torch.float32):
            x = torch.randn(2, 700, dtype=dtype)
            cfg = LaunchConfig(block_n=256, num_warps=4, split_row=True)
            for y in (torch.empty_like(x), torch.empty(2, 701, dtype=dtype)[:, 1:]):
                sm.softmax_fwd_launch(x, y, False, config=cfg)
                sm.softmax_bwd_launch(x, x, y, True, config=cfg.with_(split_prefetch=True))

    results = check_compiles(run)
    _assert_all_compiled(results)
    split = [r for r in results if "split" in r.launch.name]
    in_out = sorted(dict(r.launch.constexprs)["OUT_WORDS"] > 0 for r in split)
    assert len(split) == 6 and in_out == [False] * 2 + [True] * 4
    assert all(dict(r.launch.constexprs)["PHASE"] == 0 for r in split)
    prefetched = [r.launch.name for r in split if dict(r.launch.constexprs).get("PREFETCH")]
    assert prefetched == ["_softmax_bwd_split_kernel"] * 2
    # and each in-output launch's words kernel (the values over the words)
    assert sorted(r.launch.name for r in results if "words" in r.launch.name) == [
        "_softmax_bwd_words_kernel", "_softmax_bwd_words_kernel",
        "_softmax_fwd_words_kernel", "_softmax_fwd_words_kernel",
    ]  # fmt: skip


@pytest.mark.slow
def test_the_timers_l2_reset_kernels_compile_for_hopper():
    # bench/_l2's kernels: an evict_last read and inline PTX (applypriority), which the
    # interpreter cannot run, so their launches are described here rather than captured.
    from kernelwright.testing.gpu_compile import Launch, compile_launches

    launches = [
        Launch("kernelwright.bench._l2", "_read_evict_last_kernel",
               (("x_ptr", "*fp32"), ("out_ptr", "*fp32"), ("n", "i32"), ("BLOCK", "constexpr")),
               (("BLOCK", 4096),), 4, 3),
        Launch("kernelwright.bench._l2", "_demote_kernel",
               (("x_ptr", "*fp32"), ("n", "i32"), ("BLOCK", "constexpr"),
                ("LINE_WORDS", "constexpr")),
               (("BLOCK", 4096), ("LINE_WORDS", 32)), 4, 3),
    ]  # fmt: skip
    _assert_all_compiled(compile_launches(launches))


# --------------------------------------------------------------------------- the checker itself

_SCALE = 2.0  # a plain global: the interpreter reads it, the GPU compiler refuses to


@triton.jit
def _double_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0, mask=mask)


@triton.jit
def _global_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) * _SCALE, mask=mask)


def test_capture_records_launches_and_runs_them_only_when_asked():
    x = torch.ones(8)
    with capture_launches(execute=False) as launches:
        _double_kernel[(1,)](x, 8, BLOCK=8)
    assert torch.equal(x, torch.ones(8))  # recorded, not run
    assert [(la.name, dict(la.constexprs)) for la in launches] == [("_double_kernel", {"BLOCK": 8})]
    with capture_launches() as launches:
        _double_kernel[(1,)](x, 8, BLOCK=8)
    assert torch.equal(x, torch.full((8,), 2.0)) and len(launches) == 1


def test_a_kernel_the_gpu_compiler_rejects_is_reported_as_itself(monkeypatch):
    # Good and bad launches interleaved: the compile processes (one per core, the launches
    # dealt out in turn) must hand each result back to its own launch.
    tests_dir = str(Path(__file__).parent)  # the compile processes import this module
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([tests_dir, os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setattr(gpu_compile, "_workers", lambda launches: min(launches, 2))

    def run():
        x = torch.ones(64)
        for kernel, block in [(_double_kernel, 16), (_global_kernel, 16), (_double_kernel, 32),
                              (_double_kernel, 64), (_global_kernel, 32)]:  # fmt: skip
            kernel[(1,)](x, 64, BLOCK=block)

    results = check_compiles(run)
    got = [(r.launch.name, dict(r.launch.constexprs)["BLOCK"], r.ok) for r in results]
    assert got == [("_double_kernel", 16, True), ("_global_kernel", 16, False),
                   ("_double_kernel", 32, True), ("_double_kernel", 64, True),
                   ("_global_kernel", 32, False)]  # fmt: skip
    assert all("_SCALE" in r.error for r in results if not r.ok), [r.error for r in results]
