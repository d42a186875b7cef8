"""The norms' final partial-row reduction: fp32 sums over programs, cast once, one launch."""

import pytest
import torch
from conftest import DEVICE, H100, ON_GPU

from kernelwright.ops._partials import sum_partials
from kernelwright.ops.fused_add_rms_norm import fused_add_rms_norm_bwd_launch
from kernelwright.ops.layer_norm import layer_norm_bwd_launch
from kernelwright.ops.rms_norm import rms_norm_bwd_launch
from kernelwright.runtime import DeviceInfo, device_info
from kernelwright.runtime.launch import pdl_args, use_pdl
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


def test_pdl_only_on_sm90_cuda_and_not_when_turned_off(monkeypatch):
    hopper = H100
    ampere = DeviceInfo("cuda", "A100", "ampere", (8, 0), 108, 40 << 20, 80 << 30)
    monkeypatch.delenv("KERNELWRIGHT_PDL", raising=False)
    assert use_pdl(hopper)
    assert not use_pdl(ampere)  # griddepcontrol is sm_90+
    assert not use_pdl(device_info(torch.device("cpu")))  # the interpreter
    assert pdl_args(hopper) == {"GDC_WAIT": True, "launch_pdl": True}
    assert pdl_args(ampere) == {"GDC_WAIT": False}  # no launch_pdl argument at all
    monkeypatch.setattr(torch.version, "hip", "6.2")  # ROCm: no griddepcontrol
    assert not use_pdl(hopper)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setenv("KERNELWRIGHT_PDL", "0")
    assert not use_pdl(hopper)


def _norm_backwards(m, n, gen):
    """(name, call) for each norm's backward launcher; each call returns its outputs. Each call
    first rewrites dy (zeroed, then copied in): the backward kernel, launched with PDL, must
    wait for that copy kernel before it reads dy."""
    x, dy_values = (rand((m, n), torch.bfloat16, DEVICE, gen=gen, std=2.0) for _ in range(2))
    dy = torch.empty_like(dy_values)
    w = rand((n,), torch.bfloat16, DEVICE, gen=gen)
    xf = x.float()
    mean, var = xf.mean(-1), xf.var(-1, unbiased=False)
    rstd, rstd_rms = torch.rsqrt(var + 1e-5), torch.rsqrt(xf.pow(2).mean(-1) + 1e-6)

    def ln():
        dy.zero_()
        dy.copy_(dy_values)
        dx, dw, db = torch.empty_like(x), torch.empty_like(w), torch.empty_like(w)
        layer_norm_bwd_launch(dy, x, w, mean, rstd, dx, dw, db)
        return dx, dw, db

    def rms():
        dy.zero_()
        dy.copy_(dy_values)
        dx, dw = torch.empty_like(x), torch.empty_like(w)
        rms_norm_bwd_launch(dy, x, w, rstd_rms, dx, dw, 0.0, "llama")
        return dx, dw

    def fused_add():
        dy.zero_()
        dy.copy_(dy_values)
        ds, dw = torch.empty_like(x), torch.empty_like(w)
        fused_add_rms_norm_bwd_launch(dy, dy, x, w, rstd_rms, ds, dw, 0.0, "llama")
        return ds, dw

    return [("layer_norm", ln), ("rms_norm", rms), ("fused_add_rms_norm", fused_add)]


# 16384 columns: layer_norm's split dW/dB kernel; 3000: odd width, several rows per program;
# 70000: the looped kernels
@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4096, 3000), (1031, 4096), (512, 16384), (33, 70000)], ids=str)
def test_norm_backwards_same_with_pdl_and_under_cuda_graphs(shape, monkeypatch):
    # With PDL the backward kernel's launch overlaps the copy that writes dy, and the sum
    # kernel's the backward kernel; their griddepcontrol.wait is all that orders their loads
    # after those stores: without it they could read dy or the partial rows half-written. Every
    # output must match plain launches bit for bit, rep after rep, and under CUDA graph replay
    # (the dependencies captured as programmatic edges).
    if not use_pdl(device_info(DEVICE)):
        pytest.skip("PDL needs an sm_90+ GPU")
    for name, call in _norm_backwards(*shape, generator(7)):
        monkeypatch.setenv("KERNELWRIGHT_PDL", "0")
        expect = call()
        monkeypatch.setenv("KERNELWRIGHT_PDL", "1")
        for _ in range(20):
            for got, ref in zip(call(), expect, strict=True):
                assert torch.equal(got, ref), name
        call()  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = call()
        for _ in range(5):
            for o in outs:
                o.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            for got, ref in zip(outs, expect, strict=True):
                assert torch.equal(got, ref), name
