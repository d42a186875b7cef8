"""Every "default" launch-table config of softmax / log_softmax compiles for sm_90 (Hopper).

The interpreter runs code that the GPU compiler rejects; this catches it before the GPU does.
"""

import pytest
import torch
from conftest import ON_GPU

from kernelwright.ops.softmax import softmax_bwd_launch, softmax_fwd_launch
from kernelwright.runtime.tables.softmax import TABLE
from kernelwright.testing.gpu_compile import check_compiles

pytestmark = pytest.mark.skipif(ON_GPU, reason="the GPU run compiles these for real")


def test_softmax_kernels_compile_for_hopper():
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
