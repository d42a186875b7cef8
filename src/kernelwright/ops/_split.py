"""Rows split across programs that wait for each other (softmax's rows past 32768 columns).

A row too wide to hold in one program's registers is read twice by a looped kernel: once for
its statistics, once to write the output, and rows of 128K-256K values do not stay in L2
between the two. Split instead: the row's `splits` chunks go to `splits` programs; each holds
its chunk, reduces it, stores the partial result to an fp32 slot and counts itself in on the
row's counter (`arrive_and_wait`); once the row's every chunk is in, each merges the slots and
writes its own chunk. One read and one write of the row.

Waiting on other programs is safe only if they are running or can start. Programs do not take
their (row, chunk) from their program id but from a ticket (`ticket`, one atomic counter), so
tickets are handed out in the order programs start: while the lowest unfinished row still has
a chunk without a ticket, every running program belongs to that row (all earlier rows are done,
no later ticket is out), so fewer than `splits` programs are resident and another one can
start. The only condition: `splits` programs fit on the GPU at once (`MAX_SPLITS`, well under
one per SM).

The grid barrier further down (`arrive`, `wait_until`, `grid_counter`) serves a different
case: every program of a launch waits for all the others (fused_add_rms_norm's parked dW),
which is safe only when the launch is cooperative (every program has an SM before any starts).

The Triton interpreter runs program instances one after another, so nothing may wait there:
the same kernel runs as two launches instead (`PHASE` 1: statistics, `PHASE` 2: merge and
write; `phases`), which the CPU tests cover; the waiting form is tested on the GPU.

The exchange in the output (`OUT_WORDS`, softmax): the slots and counters need no memory of
their own. A row's words — the launch's ticket (used in the last row only) and the row's
arrivals, then, a line further, each chunk's slots — sit at the start of the row's own output,
in chunk 0 (`out_words`, `out_slots`); one strided fill zeroes the counters before the launch.
The split kernel writes every value of the row but those over the words; a second, small
kernel of the op's then merges each row's slots again and writes those values (`launch`
returns their count): cheaper than a wait in the split kernel (chunk 0 writing them once its
siblings had read the slots). An output that overlaps another tensor of the launch (in place),
does not start 4-byte aligned, or whose chunk 0 is too short for the words takes the workspace
instead (`exchange_values`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernelwright.runtime import device_info
from kernelwright.runtime.alias import disjoint
from kernelwright.runtime.alloc import empty
from kernelwright.runtime.device import DeviceInfo
from kernelwright.runtime.launch import LaunchConfig, cdiv, next_pow2

# At most this many programs share a row: far fewer than any GPU's SMs (the ticket argument
# above needs `splits` programs resident at once, and a chunk program fits on any SM).
MAX_SPLITS = 32

# The exchange in the output: a row's words are the launch's ticket (the last row's only) and
# the row's arrivals counter (HEADER of them); its slots start SLOTS_AT words in, on the next
# 128-byte line, away from the counter the row's programs poll (the slots' stores would
# otherwise contend with the polling on one line).
HEADER = tl.constexpr(2)
SLOTS_AT = tl.constexpr(32)


@triton.jit
def ticket(sync_ptr):
    """This program's place in start order: 0, 1, 2, ... over the launch (sync_ptr[0])."""
    return tl.atomic_add(sync_ptr, 1, sem="relaxed")


# A grid barrier on a counter that is never reset (`grid_counter`): a launch adds GENERATION
# to it in all (program 0 adds GENERATION - (P - 1), every other program 1), so each launch
# finds it at a multiple of GENERATION and waits for the next. No zeroing launch before it,
# and CUDA graph replays find the counter as the last launch left it.
GENERATION = tl.constexpr(2**20)  # more than any grid's programs
_COUNTERS: dict[tuple[int, int], torch.Tensor] = {}


@triton.jit
def arrive(count_ptr, programs, GEN: tl.constexpr):
    """Count this program in on a generation counter; returns the count to wait for. The
    barrier first orders every thread's stores before the (acq_rel) count."""
    tl.debug_barrier()
    first = tl.program_id(0) == 0
    add = tl.where(first, GEN - (programs - 1), 1).to(tl.int64)
    old = tl.atomic_add(count_ptr, add, sem="acq_rel")
    return (old // GEN + 1) * GEN


@triton.jit
def wait_until(count_ptr, expected):
    """Spin until the counter reaches `expected`; the barrier after holds every thread until
    then, so their loads come after it."""
    arrived = tl.atomic_add(count_ptr, 0, sem="acquire")
    while arrived < expected:
        arrived = tl.atomic_add(count_ptr, 0, sem="acquire")
    tl.debug_barrier()


def grid_counter(device: torch.device) -> torch.Tensor:
    """The int64 generation counter of `device`'s current stream (one per stream: launches on one
    stream run one after another, and a launch waits for the one before it, PDL included).
    While a CUDA graph is being captured: a fresh zeroed one, its zeroing part of the graph."""
    if torch.cuda.is_current_stream_capturing():
        return torch.zeros(1, dtype=torch.int64, device=device)
    key = (device.index, torch.cuda.current_stream(device).cuda_stream)
    counter = _COUNTERS.get(key)
    if counter is None:
        counter = _COUNTERS[key] = torch.zeros(1, dtype=torch.int64, device=device)
    return counter


@triton.jit
def arrive_and_wait(count_ptr, expected):
    """Count this program in on its row's counter, then spin until `expected` are in (as CUDA's
    grid sync does: barrier, one thread's fenced atomic and spin, barrier)."""
    tl.debug_barrier()
    arrived = tl.atomic_add(count_ptr, 1, sem="acq_rel") + 1
    while arrived < expected:
        arrived = tl.atomic_add(count_ptr, 0, sem="acquire")
    tl.debug_barrier()


@triton.jit
def out_words(out_ptr, row, stride):
    """int32 pointer to `row`'s exchange words at the start of its output (`out_ptr` 4-byte
    aligned): a 16-bit row that starts at an odd value begins them one value in."""
    start = row.to(tl.int64) * stride
    if out_ptr.dtype.element_ty.primitive_bitwidth == 16:
        start += start % 2
    return (out_ptr + start).to(tl.pointer_type(tl.int32))


@triton.jit
def out_slots(out_ptr, row, stride):
    """fp32 pointer to `row`'s slots in its output (`out_words`)."""
    return (out_words(out_ptr, row, stride) + SLOTS_AT).to(tl.pointer_type(tl.float32))


@triton.jit
def prefetch_l2(ptr):
    """Start bringing `ptr`'s line into L2 (nothing waits for it)."""
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptr], dtype=tl.int32,
        is_pure=False, pack=1,
    )  # fmt: skip


@triton.jit
def exchange(
    out_ptr, part_ptr, sync_ptr, row, stride, ROW_SLOTS: tl.constexpr, OUT_WORDS: tl.constexpr,
    PREFETCH: tl.constexpr = False,
):  # fmt: skip
    """`row`'s fp32 slots (ROW_SLOTS of them) and its arrivals counter: in the row's output
    words (OUT_WORDS > 0) or in the workspace (`workspace`). With PREFETCH the counter's line
    is brought into L2 now (`LaunchConfig.split_prefetch`, `launch`)."""
    if OUT_WORDS > 0:
        if PREFETCH:
            prefetch_l2(out_words(out_ptr, row, stride) + 1)
        return out_slots(out_ptr, row, stride), out_words(out_ptr, row, stride) + 1
    else:
        return part_ptr + row * ROW_SLOTS, sync_ptr + 1 + row


def split_count(n: int, block_n: int, m: int, device: DeviceInfo) -> int:
    """How many programs share each of `m` rows of `n` values at `block_n` per program, or 0
    where the split form must not be used: a single chunk (nothing to split), more than
    `MAX_SPLITS` (or than the device's SMs), or more programs than a grid's int32 tickets."""
    splits = cdiv(n, block_n)
    limit = min(MAX_SPLITS, device.sm_count) if device.backend == "cuda" else MAX_SPLITS
    if splits < 2 or splits > limit or m * splits >= 2**31:
        return 0
    return splits


def phases(device: DeviceInfo) -> tuple[int, ...]:
    """The kernel's `PHASE` per launch: (0,) waits in one launch (a GPU); (1, 2) is two launches,
    statistics then write (the interpreter, where programs run one after another)."""
    return (0,) if device.backend == "cuda" else (1, 2)


def workspace(m: int, splits: int, slots: int, device: torch.device, counters: int | None = None):
    """The split kernels' scratch: fp32 partials [m, splits, slots] (each written before it is
    read) and int32 counters [1 + counters], zeroed: the ticket, then one per row (`counters`
    defaults to m), or per block of rows where a program's step covers several."""
    partials = empty((m, splits, slots), dtype=torch.float32, device=device)
    sync = torch.zeros(1 + (m if counters is None else counters), dtype=torch.int32, device=device)
    return partials, sync


def exchange_values(out: torch.Tensor, others, block_n: int, splits: int, slots: int) -> int:
    """How many values at the start of each row of `out` ([M, N]) the exchange's words and slots
    take (16-bit rows one more: they may start one value in, `out_words`), rounded up to 16 (a
    store masked at a multiple of 16 stays vectorized; at other counts the stores go one value
    at a time), or 0 where they cannot live in `out`: it overlaps a tensor of `others`, it does
    not start 4-byte aligned, or they do not fit in chunk 0 (`block_n`)."""
    size = out.element_size()
    if size not in (2, 4) or out.data_ptr() % 4:
        return 0
    values = (SLOTS_AT.value + splits * slots) * 4 // size + (1 if size == 2 else 0)
    values = cdiv(values, 16) * 16
    if values > min(block_n, out.shape[1]) or not all(disjoint(out, t) for t in others):
        return 0
    return values


def launch(
    kernel,
    tensors,
    scalars,
    cfg: LaunchConfig,
    splits: int,
    slots: int,
    *,
    programs: int,
    counters: int | None = None,
    out: torch.Tensor | None = None,
    **constexprs,
) -> int:
    """Launch a split-row kernel over `tensors` (then its partials and counters, then `scalars`,
    the first of them M): `programs` programs, `splits` per row, in one launch that waits (a
    GPU) or in two that do not (the interpreter), with `slots` fp32 partials per chunk and
    `counters` row counters (`workspace`). A kernel with an `OUT_WORDS` constexpr names the
    output its rows' exchange may live in (`out`, one of `tensors`, one row per kernel row):
    where it can (`exchange_values`), OUT_WORDS is the values the words take, the counters are
    zeroed and no workspace is allocated; elsewhere 0. Returns OUT_WORDS: the values at the
    start of each row of `out` the caller's second kernel has to write. `cfg.split_prefetch`
    (a kernel with a `PREFETCH` constexpr, its exchange in `out`, a GPU): each program
    prefetches its row's counter line into L2 after its loads. The fill zeroed every row's
    counter before the launch, and by the time a row's programs count in, the rows before it
    have pushed that line out of L2: without the prefetch the first count waits on a DRAM
    read."""
    device = tensors[0].device
    words = 0
    if out is not None:
        others = [t for t in tensors if t is not out]
        words = exchange_values(out, others, cfg.block_n, splits, slots)
        constexprs["OUT_WORDS"] = words
        if cfg.split_prefetch and words:  # (the interpreter has no inline PTX)
            constexprs["PREFETCH"] = device_info(device).backend == "cuda"
    if words:
        # the ticket and counter (16-bit rows: and the one value they may start after); the
        # slots are written before they are read
        size = out.element_size()
        out[:, : HEADER.value * 4 // size + (1 if size == 2 else 0)].zero_()
        partials = sync = out  # not read as such: the kernel finds its words in out
    else:
        partials, sync = workspace(scalars[0], splits, slots, device, counters)
    for phase in phases(device_info(device)):
        kernel[(programs,)](
            *tensors,
            partials,
            sync,
            *scalars,
            BLOCK_N=cfg.block_n,
            SPLITS=splits,
            SPLITS_P2=next_pow2(splits),
            PHASE=phase,
            num_warps=cfg.num_warps,
            **constexprs,
        )
    return words
