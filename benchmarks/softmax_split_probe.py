"""Softmax probe: where the split-row forward's time goes (NOTES 31, 34).

Prints only (and a CSV to $OUT); the benchmark of record is `kernelwright bench softmax`.

The library splits rows past 32768 columns over programs of one 16384-wide chunk each; every
program takes a ticket (an atomic), reduces its chunk, publishes its statistics, counts itself
in on the row's counter, waits for the row's other chunks, merges and writes. It reaches ~80%
of copy where the one-row kernel of 16384 columns reaches ~90%. This probe times a copy of the
split kernel with parts of that protocol taken out, in one process at the same shape:

- `lib`: the library's launch (the table's split row);
- `ticket_wait`: the copy, whole (should equal `lib`); `ticket_wait_cg`: its partials read with
  ld.global.cg (cached at L2 only) instead of ld.volatile; `ticket_wait_rel`: the count a
  release add whose result is not waited for, only the spin reading the counter;
- `pid_wait`: (row, chunk) from the program id instead of a ticket (unsafe in general: it
  assumes programs start in order; timed only);
- `ticket_nowait` / `pid_nowait`: no counter and no wait — the partials are still stored and
  read back, so the merge reads whatever is there (wrong output; timed only);
- `local`: no partials at all, each chunk normalized by its own statistics (wrong; timed only);
- `onerow_16384`: the library's one-row kernel over the same bytes as [rows·n/16384, 16384];
- `rowsR`: each program its chunk of R rows in turn, the next row's chunk loaded between
  this row's arrive and its spin (NOTES 35).

Which of these close the gap says what the split costs: the ticket, the wait, or the partials.

    python benchmarks/softmax_split_probe.py [--cols 65536,131072,262144] [--rows 4096]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
from pathlib import Path

import torch
import triton
import triton.language as tl
from _probe import gpu_setup, write_csv

from kernelwright.ops._held import HOLD_FROM, again
from kernelwright.ops._split import arrive_and_wait, ticket
from kernelwright.ops.softmax import softmax_fwd_launch


@triton.jit
def _arrive_release_then_wait(count_ptr, SPLITS: tl.constexpr):
    # As _split.arrive_and_wait, but the count is a release add whose result is not used (a
    # reduction the program need not wait for), and only the spin reads the counter.
    tl.debug_barrier()
    tl.atomic_add(count_ptr, 1, sem="release")
    arrived = tl.atomic_add(count_ptr, 0, sem="acquire")
    while arrived < SPLITS:
        arrived = tl.atomic_add(count_ptr, 0, sem="acquire")
    tl.debug_barrier()


@triton.jit
def _split_fwd_probe(
    x_ptr, y_ptr, part_ptr, sync_ptr, M, N, stride_x, stride_y,
    BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr,
    TICKET: tl.constexpr, WAIT: tl.constexpr, EXCHANGE: tl.constexpr, CG: tl.constexpr,
    REL: tl.constexpr,
):  # fmt: skip
    t = ticket(sync_ptr) if TICKET else tl.program_id(0)
    row = (t // SPLITS).to(tl.int64)
    j = t % SPLITS
    cols = j * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    hold: tl.constexpr = BLOCK_N >= HOLD_FROM
    x = tl.load(x_ptr + row * stride_x + cols, mask=col_mask, other=-float("inf"))
    m = tl.max(x.to(tl.float32), axis=0)
    shift = tl.where(m == -float("inf"), 0.0, m)
    d = tl.sum(tl.exp(again(x, shift, hold).to(tl.float32) - shift), axis=0)
    if EXCHANGE:
        part = part_ptr + (row * SPLITS) * 2
        tl.store(part + j * 2, m)
        tl.store(part + j * 2 + 1, d)
        if WAIT and REL:
            _arrive_release_then_wait(sync_ptr + 1 + row, SPLITS)
        elif WAIT:
            arrive_and_wait(sync_ptr + 1 + row, SPLITS)
        k = tl.arange(0, SPLITS_P2)
        if CG:  # read at L2 (ld.global.cg) instead of ld.volatile
            ms = tl.load(part + k * 2, mask=k < SPLITS, other=-float("inf"), cache_modifier=".cg")
            ds = tl.load(part + k * 2 + 1, mask=k < SPLITS, other=0.0, cache_modifier=".cg")
        else:
            ms = tl.load(part + k * 2, mask=k < SPLITS, other=-float("inf"), volatile=True)
            ds = tl.load(part + k * 2 + 1, mask=k < SPLITS, other=0.0, volatile=True)
        m_row = tl.max(ms, axis=0)
        d_row = tl.sum(ds * tl.exp(ms - m_row), axis=0)
    else:
        m_row = m
        d_row = d
    xf = again(x, d_row, hold).to(tl.float32)
    y = tl.exp(xf - m_row) * (1.0 / d_row)
    tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=col_mask)


@triton.jit
def _split_fwd_rows_probe(
    x_ptr, y_ptr, part_ptr, sync_ptr, M, N, stride_x, stride_y,
    BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    # NOTES 35: each program its chunk of ROWS consecutive rows in turn (M a multiple of ROWS),
    # the next row's chunk loaded after this row's arrive (whose release would otherwise wait
    # for it) and before the spin, so the load is in flight during the wait.
    t = ticket(sync_ptr)
    j = t % SPLITS
    first = (t // SPLITS).to(tl.int64) * ROWS
    cols = j * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    hold: tl.constexpr = BLOCK_N >= HOLD_FROM
    k = tl.arange(0, SPLITS_P2)
    x = tl.load(x_ptr + first * stride_x + cols, mask=col_mask, other=-float("inf"))
    for i in tl.static_range(ROWS):
        row = first + i
        m = tl.max(x.to(tl.float32), axis=0)
        shift = tl.where(m == -float("inf"), 0.0, m)
        d = tl.sum(tl.exp(again(x, shift, hold).to(tl.float32) - shift), axis=0)
        part = part_ptr + (row * SPLITS) * 2
        tl.store(part + j * 2, m)
        tl.store(part + j * 2 + 1, d)
        tl.debug_barrier()
        tl.atomic_add(sync_ptr + 1 + row, 1, sem="release")
        if i + 1 < ROWS:
            x_next = tl.load(x_ptr + (row + 1) * stride_x + cols, mask=col_mask, other=0.0)
        else:
            x_next = x
        arrived = tl.atomic_add(sync_ptr + 1 + row, 0, sem="acquire")
        while arrived < SPLITS:
            arrived = tl.atomic_add(sync_ptr + 1 + row, 0, sem="acquire")
        tl.debug_barrier()
        ms = tl.load(part + k * 2, mask=k < SPLITS, other=-float("inf"), volatile=True)
        ds = tl.load(part + k * 2 + 1, mask=k < SPLITS, other=0.0, volatile=True)
        m_row = tl.max(ms, axis=0)
        d_row = tl.sum(ds * tl.exp(ms - m_row), axis=0)
        xf = again(x, d_row, hold).to(tl.float32)
        y = tl.exp(xf - m_row) * (1.0 / d_row)
        tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=col_mask)
        x = x_next


def _rows_launch(x, y, block_n, warps, rows):
    m, n = x.shape
    splits = triton.cdiv(n, block_n)
    part = torch.empty(m, splits, 2, device=x.device, dtype=torch.float32)
    sync = torch.zeros(1 + m, device=x.device, dtype=torch.int32)
    _split_fwd_rows_probe[(m // rows * splits,)](
        x, y, part, sync, m, n, x.stride(0), y.stride(0),
        BLOCK_N=block_n, SPLITS=splits, SPLITS_P2=triton.next_power_of_2(splits), ROWS=rows,
        num_warps=warps,
    )  # fmt: skip


def _probe_launch(x, y, block_n, warps, ticket_on, wait, exchange, cg=False, rel=False):
    m, n = x.shape
    splits = triton.cdiv(n, block_n)
    part = torch.empty(m, splits, 2, device=x.device, dtype=torch.float32)
    sync = torch.zeros(1 + m, device=x.device, dtype=torch.int32)
    _split_fwd_probe[(m * splits,)](
        x, y, part, sync, m, n, x.stride(0), y.stride(0),
        BLOCK_N=block_n, SPLITS=splits, SPLITS_P2=triton.next_power_of_2(splits),
        TICKET=ticket_on, WAIT=wait, EXCHANGE=exchange, CG=cg, REL=rel, num_warps=warps,
    )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cols", default="65536,131072,262144")
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    args = ap.parse_args()
    timer, _, copy = gpu_setup()
    rows = []
    m = args.rows
    for n in (int(v) for v in args.cols.split(",")):
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16) * 4
        y = torch.empty_like(x)
        ref = torch.softmax(x.float(), -1)
        gb = 2 * m * n * 2 / 1e9
        flat = x.view(-1, 16384)
        variants = {
            "lib": (functools.partial(softmax_fwd_launch, x, y, False), True),
            "onerow_16384": (
                functools.partial(softmax_fwd_launch, flat, y.view(-1, 16384), False),
                False,
            ),
        }
        for (tk, wait, exch), warps in itertools.product(
            [(True, True, True), (False, True, True), (True, False, True), (False, False, True),
             (False, False, False)],
            (8, 16),
        ):  # fmt: skip
            name = {
                (True, True, True): "ticket_wait",
                (False, True, True): "pid_wait",
                (True, False, True): "ticket_nowait",
                (False, False, True): "pid_nowait",
                (False, False, False): "local",
            }[(tk, wait, exch)]
            fn = functools.partial(_probe_launch, x, y, 16384, warps, tk, wait, exch)
            variants[f"{name}_w{warps}"] = (fn, tk and wait)
            if tk and wait:
                fn = functools.partial(_probe_launch, x, y, 16384, warps, True, True, True, True)
                variants[f"ticket_wait_cg_w{warps}"] = (fn, True)
                fn = functools.partial(
                    _probe_launch, x, y, 16384, warps, True, True, True, False, True
                )
                variants[f"ticket_wait_rel_w{warps}"] = (fn, True)
        for rows_each, warps in itertools.product((1, 2, 4, 8), (8, 16)):
            fn = functools.partial(_rows_launch, x, y, 16384, warps, rows_each)
            variants[f"rows{rows_each}_w{warps}"] = (fn, True)
        for name, (fn, exact) in variants.items():
            y.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            err = (
                ((y.float() - ref).abs() / (ref.abs() + 1e-6)).max().item()
                if exact
                else float("nan")
            )
            if exact and not err < 1e-2:
                print(f"{n:6d} {name:18s} WRONG max rel err {err:.3g}")
            p50 = timer(fn, lambda: None)[1]
            pct = gb / (p50 * 1e-3) / copy * 100
            rows.append(dict(rows=m, cols=n, variant=name, ms=p50, pct_copy=pct, max_rel_err=err))
            print(f"{n:6d} {name:18s} {p50 * 1e3:8.1f} us {pct:5.1f}%  err {err:.2g}", flush=True)
        del x, y, ref
    write_csv(args.out, "softmax_split_probe.csv", rows)


if __name__ == "__main__":
    main()
