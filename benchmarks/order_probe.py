"""The bench's provider-order effect on rope's forward (NOTES 51; prints only).

In `kernelwright bench rope` the provider timed soon after the torch providers at a shape of
<= 8K tokens runs faster than the same provider timed elsewhere (Liger in the default order,
our in-place kernel when moved there), up to 3.4 TB/s on an H100. This runs the harness itself
over the tokens sweep (forward) in several provider orders, each with and without the caching
allocator emptied before every provider (`_free`), to tell whether the allocator's placement of
the next provider's tensors is what does it.

Then (`--flush`) the suspect that fits: torch.compile's kernels load with evict_last, their
lines survive the timer's read flush (plain loads cannot evict them), and the next provider's
copies of the inputs land on the same addresses (the caching allocator hands the same blocks
back). Flush variants: the timer's (`read`), a Triton read of the buffer with evict_last loads
(`read_last`: the buffer's lines take over every evict_last slot), that followed by a plain
read (`read_last_normal`), and the evict_last read followed by
`applypriority.global.L2::evict_normal` on every line of the buffer (`read_last_demote`, now
the harness's `flush="demote"`; its kernels are bench/_l2's, which the logs' runs had as copies
in this file with 32-bit program offsets).

    python benchmarks/order_probe.py [--flush | --l2-reuse]
"""

from __future__ import annotations

import sys

import torch
import triton

from kernelwright.bench import harness
from kernelwright.bench._l2 import _read_evict_last_kernel, demote_l2
from kernelwright.bench.specs import ROPE

ORDERS = {
    "default": None,
    "torch_first": ["torch", "torch_compile", "liger", "kernelwright_inplace", "kernelwright"],
    "eager_first": ["torch", "liger", "kernelwright_inplace", "kernelwright"],
    "no_torch": ["liger", "kernelwright_inplace", "kernelwright"],
}


def flush_timer(kind: str):
    """harness.cuda_timer with the flush replaced by `kind` (see the docstring)."""
    buf = torch.ones(2**26, dtype=torch.float32, device="cuda")  # 256 MB, the timer's size
    out = torch.zeros((), dtype=torch.float32, device="cuda")
    timer = harness.cuda_timer(hide_host=True)

    def time_fn(fn, setup):
        def setup_and_flush():
            setup()
            if kind in ("read_last", "read_last_normal"):
                _read_evict_last_kernel[(triton.cdiv(buf.numel(), 4096),)](
                    buf, out, buf.numel(), 4096
                )
            if kind == "read_last_demote":
                demote_l2(buf, out)  # the same read, then applypriority on every line
            if kind == "read_last_normal":
                torch.sum(buf, dim=0, out=out)

        return timer(fn, setup_and_flush)  # then the timer's own read flush, as always

    return time_fn


def print_rows(prefix: str, rows) -> None:
    for tokens in (1024, 4096, 8192, 16384):
        times = {
            r.provider: f"{r.ms_p50 * 1e3:.1f}"
            for r in rows
            if r.x_value == tokens and r.provider != "torch"
        }
        print(f"{prefix} {tokens:6d} {times}", flush=True)


def flush_main() -> None:
    ctx = harness.make_context(hide_host=True)
    print(f"{torch.cuda.get_device_name()}  copy {ctx.copy_gbps:.0f} GB/s", flush=True)
    for kind in ("read", "read_last_demote"):
        timer = flush_timer(kind)
        rows = harness.run_spec(ROPE, modes=("forward",), sweep="tokens",
                                providers=ORDERS["torch_first"], ctx=ctx, timer=timer)  # fmt: skip
        print_rows(f"flush={kind:16s} torch_first", rows)


def l2_reuse_main() -> None:
    """Whether a flush variant leaves L2 smaller for the timed kernel: layer_norm's backward at
    8192 x 16384 reads x and dy a second time from L2 (its co-running column programs, NOTES
    48), so stale evict_last lines left by the flush would slow it."""
    from kernelwright.ops.layer_norm import layer_norm_bwd_launch

    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    m, n = 8192, 16384
    x, dy = (torch.randn(m, n, device="cuda", dtype=torch.bfloat16) for _ in "ab")
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    mean, rstd = x.float().mean(-1), torch.ones(m, device="cuda")
    dx, dw, db = torch.empty_like(x), torch.empty_like(w), torch.empty_like(w)
    kinds = ("read", "read_last", "read_last_normal", "read_last_demote")
    timers = {kind: flush_timer(kind) for kind in kinds}
    for rnd in range(3):
        for kind, timer in timers.items():
            p50 = timer(lambda: layer_norm_bwd_launch(dy, x, w, mean, rstd, dx, dw, db),
                        lambda: None)[1]  # fmt: skip
            print(f"round {rnd} flush={kind:16s} layer_norm bwd {m}x{n} {p50 * 1e3:7.1f} us",
                  flush=True)  # fmt: skip


def main() -> None:
    if "--l2-reuse" in sys.argv:
        l2_reuse_main()
        return
    if "--flush" in sys.argv:
        flush_main()
        return
    ctx = harness.make_context(hide_host=True)
    print(f"{torch.cuda.get_device_name()}  copy {ctx.copy_gbps:.0f} GB/s", flush=True)
    measure = harness.measure
    for free_each in (False, True):
        for tag, providers in ORDERS.items():

            def measured(*args, free_each=free_each, **kwargs):
                if free_each:
                    harness._free(ctx.device)
                return measure(*args, **kwargs)

            harness.measure = measured
            try:
                rows = harness.run_spec(
                    ROPE, modes=("forward",), sweep="tokens", providers=providers, ctx=ctx
                )
            finally:
                harness.measure = measure
            print_rows(f"free_each={int(free_each)} {tag:12s}", rows)


if __name__ == "__main__":
    main()
