"""Every "default" launch-table config of softmax / log_softmax compiles for sm_90 (Hopper).

The interpreter runs code that the GPU compiler rejects; this catches it before the GPU does.
"""

import pytest
import torch
from conftest import H100, ON_GPU

from kernelwright.ops import _split
from kernelwright.ops.softmax import softmax_bwd_launch, softmax_fwd_launch
from kernelwright.runtime.tables.softmax import TABLE
from kernelwright.testing.gpu_compile import check_compiles

pytestmark = pytest.mark.skipif(ON_GPU, reason="the GPU run compiles these for real")


@pytest.mark.slow
def test_softmax_kernels_compile_for_hopper(monkeypatch):
    # The split rows as on a GPU (their waiting form, the counter prefetch where the table's
    # row asks for it): recorded only, nothing runs.
    monkeypatch.setattr(_split, "device_info", lambda device=None: H100)

    def run():
        for kernel in ("fwd", "bwd"):
            rows = TABLE[kernel]["default"]
            for i, (max_n, cfg) in enumerate(rows):
                # one row length per table row; the looped row gets one chunk and a bit
                n = max_n if i < len(rows) - 1 else cfg.block_n + 7
                x = torch.randn(2, n, dtype=torch.bfloat16)
                for is_log in (False, True):
                    y = torch.empty_like(x)
                    if kernel == "fwd":
                        softmax_fwd_launch(x, y, is_log, config=cfg)
                    else:
                        softmax_bwd_launch(x, x.softmax(-1), y, is_log, config=cfg)

    results = check_compiles(run)
    failures = [
        f"{r.launch.name} {dict(r.launch.constexprs)}: {r.error}" for r in results if not r.ok
    ]
    assert not failures, "\n".join(failures)
    assert len(results) >= 24
    # The table's split rows: only the backward's programs prefetch their row's counter line
    # (`split_prefetch`), the forward's do not.
    split = [r.launch for r in results if "split" in r.launch.name]
    assert {la.name for la in split} == {"_softmax_fwd_split_kernel", "_softmax_bwd_split_kernel"}
    prefetched = {la.name for la in split if dict(la.constexprs).get("PREFETCH")}
    assert prefetched == {"_softmax_bwd_split_kernel"}
    assert [c.split_prefetch for _, c in TABLE["fwd"]["default"] if c.split_row] == [False]
    assert [c.split_prefetch for _, c in TABLE["bwd"]["default"] if c.split_row] == [True]
