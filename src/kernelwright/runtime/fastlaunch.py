"""A cheaper host path for launching a compiled Triton kernel again.

`kernel[grid](*args, **constexprs)` goes through `JITFunction.run` on every call: it binds the
arguments, specializes each one, builds a cache key and looks the compiled kernel up. In an
eager training loop at moderate sizes the GPU finishes before the host has issued the next
launch, so that Python is the step's cost. `fast(kernel)` wraps a launched kernel: the first
call with a given argument signature goes through Triton as usual and keeps the compiled kernel
it returns; later calls with the same signature call that kernel's launcher directly.

The signature covers everything Triton specializes on, so a hit launches exactly the binary
Triton would have chosen: each tensor's dtype, device and 16-byte alignment; each integer's
value (a superset of Triton's classes: 1, multiple of 16, 32/64-bit); None; the constexprs and
launch options. Float arguments are not specialized by Triton and stay out of the key.

The direct call is the last step of `JITFunction.run` (launch metadata and launch hooks
included, so profilers still see every launch), used only where it is known to match: a GPU
backend (not the interpreter), Triton's `CompiledKernel.run` calling convention (3.3 and
later), and a kernel whose parameters are the positional arguments followed by the
constexprs. Anything else, and `KERNELWRIGHT_FAST_LAUNCH=0`, takes Triton's path.
"""

from __future__ import annotations

import inspect
import os

import torch

from kernelwright.runtime.device import interpreter_mode

_LIMIT = 1024  # signatures kept per kernel; cleared when full (shapes that never repeat)


def _triton_launch_api():
    """(knobs, driver) of a Triton with the calling convention below (3.3 and later), or None
    where the direct path must stay off: the interpreter, an older Triton, or
    KERNELWRIGHT_FAST_LAUNCH=0."""
    if interpreter_mode() or os.environ.get("KERNELWRIGHT_FAST_LAUNCH", "1") == "0":
        return None
    try:
        from triton import knobs
        from triton.runtime import driver
    except ImportError:
        return None
    return knobs, driver


class FastKernel:
    """A launched `@triton.jit` kernel with a direct re-launch path (see the module doc). Reads
    as the kernel it wraps: attributes other than `[grid]` are the JITFunction's."""

    def __init__(self, kernel):
        self.kernel = kernel
        self._hits: dict = {}
        params = kernel.params
        self._names = [p.name for p in params]
        self._constexpr = [p.is_constexpr for p in params]
        self._defaults = {p.name: p.default for p in params}

    def __getattr__(self, name):
        return getattr(self.kernel, name)

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.run(grid, args, kwargs)

    def _signature(self, args, kwargs):
        key = []
        for a in args:
            if isinstance(a, torch.Tensor):
                key.append(a.dtype)
                key.append(a.device.index)
                key.append(a.data_ptr() & 15)
            elif type(a) is float:
                key.append(float)
            elif type(a) is bool:
                key.append((bool, a))  # True == 1 as a key, but Triton types them apart
            else:
                key.append(a)
        if kwargs:
            key.append(tuple(kwargs.items()))
        return tuple(key)

    def _tail(self, n_args: int, kwargs: dict):
        """The constexpr values in parameter order after the `n_args` positional arguments, or
        None where the kernel's parameters are not laid out that way."""
        if any(self._constexpr[:n_args]) or not all(self._constexpr[n_args:]):
            return None
        tail = []
        for name in self._names[n_args:]:
            if name in kwargs:
                tail.append(kwargs[name])
            else:
                default = self._defaults[name]
                if default is _EMPTY:
                    return None
                tail.append(default)
        return tuple(tail)

    def run(self, grid, args, kwargs):
        knobs, driver = _API
        device = driver.active.get_current_device()  # Triton compiles and launches per device
        key = (device, *self._signature(args, kwargs))
        hit = self._hits.get(key)
        if hit is None:
            compiled = self.kernel[grid](*args, **kwargs)
            tail = self._tail(len(args), kwargs)
            if compiled is not None and tail is not None:
                if len(self._hits) >= _LIMIT:
                    self._hits.clear()
                self._hits[key] = (compiled, tail)
            return compiled
        compiled, tail = hit
        n = len(grid)
        stream = driver.active.get_current_stream(device)
        # The end of JITFunction.run, unchanged: launch hooks (profilers) see every launch.
        bound = (*args, *tail)
        runtime = knobs.runtime
        compiled.run(
            grid[0],
            grid[1] if n > 1 else 1,
            grid[2] if n > 2 else 1,
            stream,
            compiled.function,
            compiled.packed_metadata,
            compiled.launch_metadata(grid, stream, *bound),
            runtime.launch_enter_hook,
            runtime.launch_exit_hook,
            *bound,
        )
        return compiled


_EMPTY = inspect.Parameter.empty  # a parameter without a default
_API = _triton_launch_api()


def jit_function(kernel):
    """The `@triton.jit` function behind `kernel` (itself when it is not wrapped)."""
    return kernel.kernel if isinstance(kernel, FastKernel) else kernel


def fast(kernel):
    """`kernel` with the direct re-launch path where it applies (see the module doc)."""
    return FastKernel(kernel) if _API is not None else kernel
