"""Programmatic dependent launch (PDL, sm_90+) for kernels that consume the previous kernel's
output: the norms' backward kernels (after the forward, or whatever ran before them) and the
partial-row sum after them.

A kernel launched with `runtime.launch.pdl_args(device)` has its launch processed while the
kernel before it in the stream still runs; its first statement, `wait_for_inputs(GDC_WAIT)`,
then holds every load and store until that kernel has finished and its writes are visible.
Nothing is read or written before the wait, so any predecessor is safe, including one that
still reads what this kernel overwrites (dx over dy). The launch latency of a short kernel,
such as the partial-row sum after a norm backward, is then hidden behind the kernel before it.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def wait_for_inputs(ENABLED: tl.constexpr):
    """With ENABLED (the kernel was launched with PDL): wait for the previous kernel."""
    if ENABLED:
        tl.extra.cuda.gdc_wait()
