"""The norms' final partial-row reduction: fp32 sums over programs, cast once, one launch."""

import pytest
import torch
from conftest import DEVICE, ON_GPU

from kernelwright.ops._partials import sum_partials
from kernelwright.testing import generator, rand

# One ulp of the output dtype: the fp32 sum is cast once. The interpreter truncates
# fp32 -> bf16 instead of rounding (INTERPRETER.md), so bf16 is exact only on the GPU.
ULP = {torch.float32: 1e-6, torch.float16: 2**-10, torch.bfloat16: 2**-7}


@pytest.mark.parametrize("p", [1, 5, 300], ids=lambda p: f"P{p}")  # 300: two load steps
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_sums_every_partial_row_and_casts_once(p, dtype):
    gen = generator(p)
    n = 77  # not a multiple of the column tile
    a, b = (rand((p, n), torch.float32, DEVICE, gen=gen) for _ in range(2))
    for with_b in (True, False):
        out_a, out_b = (torch.full((n,), float("nan"), dtype=dtype, device=DEVICE) for _ in "ab")
        sum_partials(a, out_a, b if with_b else None, out_b if with_b else None)
        assert torch.isnan(out_b).all() != with_b  # written exactly when asked
        for partial, out in ((a, out_a), (b, out_b))[: 1 + with_b]:
            expect = partial.double().sum(0)
            # the cast's ulp plus fp32 summation error (P terms, each off by <= 2^-24 of |sum|)
            bound = ULP[dtype] * expect.abs() + p * 2**-23 * partial.double().abs().sum(0)
            assert ((out.double() - expect).abs() <= bound).all()
            if dtype != torch.float32 and (dtype == torch.float16 or ON_GPU):
                # fp32 sum then one round-to-nearest: at most the rounding of fp32's own error
                assert (out != expect.float().to(dtype)).float().mean().item() < 0.05
