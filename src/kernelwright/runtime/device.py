"""Where kernels run: a CUDA GPU, or Triton's CPU interpreter when there is none.

`ensure_backend()` runs when kernelwright is imported: on a machine without a GPU it sets
`TRITON_INTERPRET=1` before any kernel is decorated, so the same kernels run (slowly, on CPU
tensors) through the interpreter. `device_info()` describes the device a kernel will run on;
the launch-config tables are keyed by its `arch`.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass

import torch

# Compute-capability major → architecture name used as a key in the launch-config tables.
_ARCH_BY_MAJOR = {8: "ampere", 9: "hopper", 10: "blackwell", 12: "blackwell"}


def interpreter_mode() -> bool:
    """True when Triton kernels run through the CPU interpreter (`TRITON_INTERPRET=1`)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def ensure_backend() -> None:
    """Select the interpreter on machines without a CUDA GPU, before kernels are defined.

    Triton reads `TRITON_INTERPRET` when a `@triton.jit` function is decorated, so this must
    run before `kernelwright.ops` is imported. An explicit setting of the variable is kept.
    Triton may have been imported already (by the user, or by a library such as peft): its own
    `@triton.jit` helpers (`tl.sum`, `tl.max`, ...) were then decorated for the GPU, and
    `_interpret_jit_calls` lets interpreted kernels call them.
    """
    if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    if interpreter_mode() and "triton.language" in sys.modules:
        _interpret_jit_calls()
    if interpreter_mode():
        _scalar_index()
        _patch_lang_once_a_launch()
        _skip_unreported_overflow_checks()
        _quiet_masked_lanes()


def _scalar_index() -> None:
    """Let the interpreter use a scalar argument as a loop bound under any NumPy.

    The interpreter holds a kernel's scalar arguments as 1-element arrays. Where its Triton
    converts one to an int with `int(array)`, a NumPy that refuses that for an array of one
    dimension makes every kernel that loops to a runtime bound (`range(0, M, BLOCK)`) fail
    ("only 0-dimensional arrays can be converted to Python scalars"). This converts the array's
    single element instead, as Triton itself does where it has no such `int(array)`.
    """
    import inspect

    from triton.runtime import interpreter

    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if patch is None or getattr(patch, "_kernelwright", False):
        return
    try:
        fixed = "int(self.handle.data)" not in inspect.getsource(patch)
    except (OSError, TypeError):
        fixed = True
    if fixed:
        return

    def _patch_lang_tensor(tensor, scope):
        patch(tensor, scope)
        # set after Triton's own: the scope restores its changes last-in first-out
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    _patch_lang_tensor._kernelwright = True
    interpreter._patch_lang_tensor = _patch_lang_tensor


def _patch_lang_once_a_launch() -> None:
    """Let a device-function call reuse the language patch of the launch that runs it.

    The interpreter swaps `triton.language`'s builtins for interpreted ones when a kernel is
    launched, and again at every call of a `@triton.jit` helper inside it, scanning every member
    of the language modules each time, which dominates a kernel built from helpers.
    The patch is the same each time, so within one launch a helper whose language modules are
    already patched skips it; one that sees a module the launch has not patched yet patches it
    as before. The launch's own patch and its restore at the end are untouched.
    """
    import inspect
    import threading

    import triton.language as tl
    from triton.runtime import interpreter

    patch = getattr(interpreter, "_patch_lang", None)
    executor = getattr(interpreter, "GridExecutor", None)
    scope_type = getattr(interpreter, "_LangPatchScope", None)
    if patch is None or executor is None or scope_type is None:
        return  # another Triton's interpreter: left as it is
    if getattr(patch, "_kernelwright", False):
        return
    launch_call = executor.__call__
    running = threading.local()  # .langs: the language modules the running launch patched
    seen: dict = {}  # a jitted function -> the language modules its globals hold

    def _patch_lang(fn):
        langs = seen.get(fn)
        if langs is None:
            mods = (v for v in fn.__globals__.values() if inspect.ismodule(v))
            langs = seen[fn] = frozenset(id(m) for m in mods if m is tl or m is tl.core)
        patched = getattr(running, "langs", None)
        if patched is not None and langs and langs <= patched:
            return scope_type()  # nothing to patch: an empty scope restores nothing
        scope = patch(fn)
        if patched is not None:
            patched |= langs
        return scope

    def __call__(self, *args, **kwargs):
        outer = getattr(running, "langs", None)
        running.langs = set()
        try:
            return launch_call(self, *args, **kwargs)
        finally:
            running.langs = outer

    _patch_lang._kernelwright = True
    interpreter._patch_lang = _patch_lang
    executor.__call__ = __call__


def _quiet_masked_lanes() -> None:
    """Keep numpy's floating-point warnings out of interpreted launches.

    The interpreter computes every lane of a tile with numpy, masked ones included: a lane a
    load filled with `other` takes exp(-inf - -inf), 0 / 0 or log(0) there, and numpy warns
    ("invalid value encountered in subtract") where a GPU computes the same lanes silently, and
    the masks then discard them: correct results (softmax of a row holding -inf, a cross-entropy
    whose targets are all ignored) would come with warnings. Within a launch they are off; the
    values are unchanged.
    """
    import numpy as np
    from triton.runtime import interpreter

    executor = getattr(interpreter, "GridExecutor", None)
    if executor is None or getattr(executor.__call__, "_kernelwright_quiet", False):
        return
    launch_call = executor.__call__

    def __call__(self, *args, **kwargs):
        with np.errstate(all="ignore"):
            return launch_call(self, *args, **kwargs)

    __call__._kernelwright_quiet = True
    executor.__call__ = __call__


def _skip_unreported_overflow_checks() -> None:
    """Skip the interpreter's int32 overflow checks when it could never report one.

    With `sanitize_overflow` set (its default), every integer add, sub and mul in an interpreted
    kernel is redone in int64 and compared with the int32 range, and the result goes to
    `device_assert`, which the interpreter drops unless its options say `debug` (off by
    default): the work is done and never reported. Where the installed Triton drops it so, the
    checks are turned off; with `debug` on they are kept.
    """
    import dataclasses
    import inspect

    from triton.language.semantic import TritonSemantic
    from triton.runtime import interpreter

    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if not dataclasses.is_dataclass(options) or not getattr(options, "sanitize_overflow", False):
        return
    if getattr(options, "debug", True):
        return
    try:
        dropped = "if not self.builder.options.debug:" in inspect.getsource(
            TritonSemantic.device_assert
        )
    except (OSError, TypeError, AttributeError):
        dropped = False
    if dropped:
        builder.options = dataclasses.replace(options, sanitize_overflow=False)


def _interpret_jit_calls() -> None:
    """Run a GPU-decorated `@triton.jit` function through the interpreter when a kernel calls it.

    Without this, importing triton before kernelwright on a CPU machine makes every kernel fail
    inside the interpreter ("Cannot call @triton.jit'd outside of the scope of a kernel"): the
    helpers triton defines at import are JITFunctions, which only a GPU compile can call.
    """
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    if getattr(JITFunction.__call__, "_kernelwright", False):
        return
    interpreted: dict = {}  # the Python function -> its InterpretedFunction

    def __call__(self, *args, **kwargs):
        f = interpreted.get(self.fn)
        if f is None:
            f = interpreted[self.fn] = InterpretedFunction(self.fn)
        return f(*args, **kwargs)

    __call__._kernelwright = True
    JITFunction.__call__ = __call__


@dataclass(frozen=True)
class DeviceInfo:
    backend: str  # "cuda" | "interpreter"
    name: str  # e.g. "NVIDIA H100 80GB HBM3"
    arch: str  # "interpreter" | "ampere" | "ada" | "hopper" | "blackwell" | "unknown"
    capability: tuple[int, int] | None
    sm_count: int
    l2_bytes: int
    total_memory_bytes: int

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cuda" if self.backend == "cuda" else "cpu")


def _arch_name(major: int, minor: int) -> str:
    if (major, minor) == (8, 9):
        return "ada"
    return _ARCH_BY_MAJOR.get(major, "unknown")


@functools.cache
def _cuda_info(index: int) -> DeviceInfo:
    p = torch.cuda.get_device_properties(index)
    return DeviceInfo(
        backend="cuda",
        name=p.name,
        arch=_arch_name(p.major, p.minor),
        capability=(p.major, p.minor),
        sm_count=p.multi_processor_count,
        l2_bytes=int(getattr(p, "L2_cache_size", 0)),
        total_memory_bytes=int(p.total_memory),
    )


# The interpreter runs program instances one after another on the CPU: a "device" with few
# streaming multiprocessors keeps persistent grids (and so test run times) small.
_INTERPRETER = DeviceInfo(
    backend="interpreter",
    name="Triton interpreter (CPU)",
    arch="interpreter",
    capability=None,
    sm_count=4,
    l2_bytes=0,
    total_memory_bytes=0,
)


# cuda devices with an index -> their DeviceInfo (fixed for the process)
_BY_DEVICE: dict[torch.device, DeviceInfo] = {}


def device_info(device: torch.device | str | None = None) -> DeviceInfo:
    """Describe the device that kernels for tensors on `device` run on."""
    known = _BY_DEVICE.get(device) if isinstance(device, torch.device) else None
    if known is not None:
        return known  # a tensor's device, seen before: the common call, kept cheap
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cuda" and dev.index is not None:
        return _BY_DEVICE.setdefault(dev, _cuda_info(dev.index))
    if dev is not None and dev.type == "cuda":
        return _cuda_info(dev.index if dev.index is not None else torch.cuda.current_device())
    if dev is None and torch.cuda.is_available() and not interpreter_mode():
        return _cuda_info(torch.cuda.current_device())
    return _INTERPRETER


def default_device() -> torch.device:
    """The device kernelwright's demo, tests and benchmarks put their tensors on."""
    if torch.cuda.is_available() and not interpreter_mode():
        return torch.device("cuda")
    return torch.device("cpu")
