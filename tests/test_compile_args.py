"""`kernelwright.compile`'s arguments are checked when it is called, as torch.compile checks its
backend: an unknown backend or mode, and an `only` key that names no site."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kernelwright


def fn(x):
    return F.relu(torch.softmax(x, -1)) ** 2


def test_an_unknown_backend_is_refused_at_once():
    with pytest.raises(torch._dynamo.exc.InvalidBackend, match="nosuch"):
        kernelwright.compile(fn, backend="nosuch")
    with pytest.raises(torch._dynamo.exc.InvalidBackend, match="nosuch"):
        kernelwright.compile_backend("nosuch")
    with pytest.raises(TypeError, match="backend must be"):
        kernelwright.compile(fn, backend=3)
    kernelwright.compile(fn, backend="aot_eager")  # known names and callables pass
    kernelwright.compile(fn, backend=lambda gm, ex: gm)


def test_an_unknown_mode_is_refused_at_once():
    with pytest.raises(ValueError, match="mode 'nonsense' is not one of torch.compile's modes"):
        kernelwright.compile(fn, mode="nonsense")
    kernelwright.compile(fn, mode="max-autotune-no-cudagraphs")  # a real mode passes


def test_only_keys_that_name_no_site_are_refused(fresh_dynamo):
    with pytest.raises(ValueError, match=r"not a site key: 'zz'.*'0:mul_3'"):
        kernelwright.compile(fn, only=["zz"])
    with pytest.raises(ValueError, match="not a site key: 'softmax'"):
        kernelwright.compile(fn, only="softmax")
    # a well-formed key: checked against its graph's sites when that graph compiles
    compiled = kernelwright.compile(fn, backend="eager", only={"0:pow_1", "0:nope"})
    with pytest.raises(Exception, match="no site 0:nope in graph 0; its sites: 0:softmax, 0:pow_1"):
        compiled(torch.randn(2, 8))
