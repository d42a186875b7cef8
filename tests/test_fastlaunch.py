"""The direct re-launch path (runtime/fastlaunch.py): a hit launches what Triton would have."""

import pytest
import torch
import triton
import triton.language as tl

from kernelwright.runtime.device import interpreter_mode
from kernelwright.runtime.fastlaunch import FastKernel, fast, jit_function

ON_GPU = torch.cuda.is_available() and not interpreter_mode()


@triton.jit
def _scale_kernel(x_ptr, y_ptr, n, scale, BLOCK: tl.constexpr, SQUARE: tl.constexpr = False):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = x * x * scale if SQUARE else x * scale
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def test_interpreter_keeps_the_kernel():
    if ON_GPU:
        assert isinstance(fast(_scale_kernel), FastKernel)
    else:
        assert fast(_scale_kernel) is _scale_kernel  # the interpreter keeps Triton's own path
    assert jit_function(fast(_scale_kernel)) is _scale_kernel


@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU (the interpreter keeps Triton's path)")
def test_hits_launch_the_right_binary():
    k = FastKernel(_scale_kernel)

    def launch(x, scale, **kw):
        y = torch.full_like(x, float("nan"))
        k[(triton.cdiv(x.numel(), 128),)](x, y, x.numel(), scale, BLOCK=128, **kw)
        return y

    base = torch.randn(1001, device="cuda", dtype=torch.float16)
    want = (base.float() * 3.0).half()
    for _ in range(3):  # a miss, then hits
        torch.testing.assert_close(launch(base, 3.0), want)
    assert len(k._hits) == 1
    # a float argument is not part of the signature: a new value reuses the binary
    torch.testing.assert_close(launch(base, 0.5), (base.float() * 0.5).half())
    assert len(k._hits) == 1
    # a 2-byte offset breaks 16-byte alignment, a new n changes the int: new signatures
    off = base[1:]
    torch.testing.assert_close(launch(off, 3.0), (off.float() * 3.0).half())
    torch.testing.assert_close(launch(off, 3.0), (off.float() * 3.0).half())
    assert len(k._hits) == 2
    # a constexpr given and one left to its default are distinct signatures
    sq = launch(base, 2.0, SQUARE=True)
    torch.testing.assert_close(sq, (base.float() ** 2 * 2.0).half())
    torch.testing.assert_close(launch(base, 2.0, SQUARE=True), sq)
    # another dtype, and an int of 1 (which Triton specializes), compile their own binaries
    b32 = base.float()
    torch.testing.assert_close(launch(b32, 3.0), b32 * 3.0)
    one = base[:1]
    torch.testing.assert_close(launch(one, 3.0), (one.float() * 3.0).half())
    torch.testing.assert_close(launch(one, 3.0), (one.float() * 3.0).half())


@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU (the interpreter keeps Triton's path)")
def test_launch_hooks_take_tritons_path(monkeypatch):
    from triton import knobs

    k = FastKernel(_scale_kernel)
    x = torch.randn(300, device="cuda")
    y = torch.empty_like(x)
    k[(3,)](x, y, 300, 2.0, BLOCK=128)
    seen = []
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda *a: seen.append(1))
    y.fill_(float("nan"))
    k[(3,)](x, y, 300, 2.0, BLOCK=128)
    torch.testing.assert_close(y, x * 2.0)
    assert seen, "a profiler's launch hook must still see the launch"
