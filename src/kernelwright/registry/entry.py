"""What an op declares (`OpEntry`, `DemoCase`, `HFPattern`, `Impl` + `Capability`) and the
one resolver.

Entries are data: module and function names are strings, imported only when something asks
for the callable (`entry.fn()`, `resolve(...)`), so reading the registry — the CLI's help, a
list of ops — imports no kernel.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

Shape = tuple[int, ...]


class UnknownOpError(KeyError, ValueError):
    """An op name the registry does not know; the message lists the known ones."""

    def __str__(self) -> str:  # KeyError would print the message quoted
        return str(self.args[0]) if self.args else ""


def unknown_op(name: str, known: Iterable[str], what: str = "op") -> UnknownOpError:
    known = sorted(known)
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return UnknownOpError(f"no {what} {name!r}.{hint} Known: {', '.join(known)}.")


def import_module(name: str) -> ModuleType:
    """`importlib.import_module(name)`, with the current directory importable as `python -m`
    makes it: a console script (`kernelwright ...`) starts with its own folder on sys.path, not
    the user's, so `mypkg.ops` beside them would not import. The directory is tried only when
    `name` (or a package above it) is not found otherwise, and is on sys.path for that import
    alone: installed packages keep precedence, and the process's path is left as it was."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        missing = e.name or ""
        if not (name == missing or name.startswith(f"{missing}.")):
            raise  # a module that `name` itself imports is missing: its own error
        cwd = os.getcwd()
        if cwd in sys.path or "" in sys.path:
            raise
    sys.path.insert(0, cwd)
    importlib.invalidate_caches()  # a folder made since the last import is seen
    try:
        return importlib.import_module(name)
    finally:
        # the imported modules keep their absolute __path__, so their submodules still import
        if cwd in sys.path:
            sys.path.remove(cwd)


def resolve(target: str, attr: str | None = None) -> Any:
    """The object at `target`: "package.module:attr.sub" (or `target` a module and `attr` a
    dotted attribute path), or the module itself when no attribute is named."""
    module, _, dotted = target.partition(":")
    if attr:
        dotted = f"{dotted}.{attr}" if dotted else attr
    obj: Any = import_module(module)
    for part in filter(None, dotted.split(".")):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AttributeError(f"{module} has no {dotted!r} (missing {part!r})") from None
    return obj


@dataclass(frozen=True)
class DemoCase:
    """One row group of `kernelwright demo`'s correctness table.

    `inputs` names an inputs maker of `kernelwright.testing.cases` (fresh random tensors for a
    shape, dtype, device and seed). `shapes` are (GPU shapes, CPU shapes) in the maker's own
    convention; None means the default x-like [..., N] shapes. `function` / `reference` name
    another function of the op's module (log_softmax in softmax's module) — default the op's.
    """

    label: str
    inputs: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    shapes: tuple[tuple[Shape, ...], tuple[Shape, ...]] | None = None
    grad_inputs: tuple[str, ...] | None = None  # default: every float input
    function: str | None = None
    reference: str | None = None
    # inputs the reference takes as int64 indices (the check hands it fp32 copies of every
    # tensor, class targets included)
    index_inputs: tuple[str, ...] = ()


@dataclass(frozen=True)
class HFPattern:
    """One kind of Hugging Face module (or function) the op replaces, as data.

    kind: "norm" | "mlp" | "rope" | "loss" | "moe" — which analyser decision it feeds.
    classes: a regular expression over class names where such modules are found (a hint for
        readers and tools; the analyser proves each class from its forward, never its name).
    decision: the profile value that selects this op ("rms_norm", "swiglu", "geglu_tanh"...).
    config_values: for MLPs, the `hidden_act` values of a config that select `decision`.
    kwargs: the op's options for this decision (geglu's approximate="tanh").
    fused: the module's function taking the projections concatenated ([gate | up]).
    """

    kind: str
    classes: str
    decision: str
    config_values: tuple[str, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    fused: str | None = None


DTYPES = ("float32", "bfloat16", "float16")
DEVICES = ("cuda", "cpu-interpreter")  # "cpu-interpreter": Triton's interpreter on the CPU
# every command's --dtype takes each of these spellings; parse_dtype gives the torch name
DTYPE_SPELLINGS = {
    "float32": ("fp32", "float32", "float"),
    "bfloat16": ("bf16", "bfloat16"),
    "float16": ("fp16", "float16", "half"),
}
SHORT_DTYPE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}  # file names, labels


def parse_dtype(text: str, allowed: Iterable[str] = DTYPES) -> str:
    """The torch name ("bfloat16") of a dtype as a user writes it: bf16 or bfloat16; fp16,
    float16 or half; fp32, float32 or float (any case, "torch." before it allowed).

    Raises ValueError, naming the accepted spellings, for another dtype or one not in
    `allowed` (torch names)."""
    allowed = tuple(allowed)
    key = text.strip().lower().removeprefix("torch.")
    name = next((n for n, spelled in DTYPE_SPELLINGS.items() if key in spelled), None)
    if name is None or name not in allowed:
        ways = ", ".join("/".join(DTYPE_SPELLINGS[n]) for n in allowed)
        raise ValueError(f"{text!r}: one of {ways}")
    return name


@dataclass(frozen=True)
class Capability:
    """What an implementation can run, as data; `unsupported` checks a call site against it.

    dtypes: the input dtypes by torch name ("bfloat16"). min_rank / max_rank: the main input's
    rank (None: no bound). last_dim_contiguous: the kernel reads rows with stride 1.
    max_row: the longest last dim it takes (None: any). devices: "cuda", "cpu-interpreter"
    (() = any device). archs: the GPU archs it runs on ("sm_90"; () = any).
    """

    dtypes: tuple[str, ...] = DTYPES
    min_rank: int = 1
    max_rank: int | None = None
    last_dim_contiguous: bool = True
    max_row: int | None = None
    devices: tuple[str, ...] = DEVICES
    archs: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line for listings: "bfloat16/float16/float32, rank >= 2, n <= 16384, ..."."""
        parts = ["/".join(self.dtypes) or "any dtype"]
        rank = f"rank >= {self.min_rank}" if self.min_rank > 1 else ""
        if self.max_rank is not None:
            rank = f"rank {self.min_rank}..{self.max_rank}"
        parts += [rank] if rank else []
        parts += ["last dim contiguous"] if self.last_dim_contiguous else []
        parts += [f"n <= {self.max_row}"] if self.max_row is not None else []
        parts.append("/".join(self.devices) if self.devices else "any device")
        parts += ["/".join(self.archs)] if self.archs else []
        return ", ".join(parts)


# Inductor takes whatever the graph holds
ANY = Capability(dtypes=(), min_rank=0, last_dim_contiguous=False, devices=())


def unsupported(
    cap: Capability,
    *,
    dtype: str,
    shape: Shape,
    device: str,
    arch: str | None = None,
    last_dim_contiguous: bool = True,
) -> str | None:
    """None when `cap` covers the call site, else why not (one phrase). Pure: no torch call."""
    if cap.dtypes and dtype not in cap.dtypes:
        return f"dtype {dtype} not in {'/'.join(cap.dtypes)}"
    rank = len(shape)
    if rank < cap.min_rank:
        return f"rank {rank} < {cap.min_rank}"
    if cap.max_rank is not None and rank > cap.max_rank:
        return f"rank {rank} > {cap.max_rank}"
    if cap.last_dim_contiguous and not last_dim_contiguous:
        return "the last dim is not contiguous"
    if cap.max_row is not None and shape and shape[-1] > cap.max_row:
        return f"last dim {shape[-1]} > {cap.max_row}"
    if cap.devices and device not in cap.devices:
        return f"device {device} not in {'/'.join(cap.devices)}"
    if cap.archs and device == "cuda" and arch not in cap.archs:
        return f"GPU arch {arch or 'unknown'} not in {'/'.join(cap.archs)}"
    return None


@dataclass(frozen=True)
class Impl:
    """One implementation of an op.

    name: "kernelwright" | "created" | "liger" | "inductor" (what a choice names).
    provider: the benchmark provider whose rows in the results database time it (Inductor's
        are `torch_compile`'s: the eager form compiled).
    function: "package.module:attr.path" of the callable; "" for Inductor (the original graph
        is left alone).
    inputs: a created implementation's arguments, as the op's input names in its order (the
        op's benchmark inputs, its matched site's tensors); () for the op's own convention.
    computes: a created implementation's call of the op with its constants baked in, as
        `compile.generated.site_options` writes it: it takes only the sites that make the same
        call; "" takes every site of the op.
    """

    name: str
    provider: str
    function: str
    capability: Capability = Capability()
    inputs: tuple[str, ...] = ()
    computes: str = ""

    def load(self) -> Any:
        """The callable, imported now; None for Inductor."""
        return resolve(self.function) if self.function else None

    def unsupported(self, **site: Any) -> str | None:
        return unsupported(self.capability, **site)


INDUCTOR = Impl("inductor", "torch_compile", "", ANY)


@dataclass(frozen=True)
class OpEntry:
    """Everything the tools need to know about one op, in one place.

    Functions are attribute names in `module`; `function` defaults to the op's name and
    `reference` to `<op>_ref`. `table` is the launch-config table module the optimize workflow
    rewrites, `bench` the name of its benchmark spec (the spec lives in `kernelwright.bench`),
    `tests` its test file relative to the repository root.

    `impls`: the implementations a call site chooses among, in the order that breaks ties
    (kernelwright's kernel first, Inductor last); default: the op's kernel and Inductor.
    `bucket`: how a bench row's named dims map onto a call site's (rows, n) — the dims whose
    product is the rows and the row length's dim; default: every dim but the last, the last.
    """

    name: str
    family: str
    module: str
    summary: str = ""  # one line, for listings
    function: str = ""
    reference: str = ""
    module_class: str | None = None
    eager: str | None = None  # the eager PyTorch form (the benchmark's `torch` provider)
    table: str | None = None
    bench: str | None = None
    tests: str = ""
    demo: tuple[DemoCase, ...] = ()
    test_shapes: tuple[Shape, ...] = ()
    replaces: tuple[HFPattern, ...] = ()
    generated: bool = False  # written by `kernelwright create --into-library`
    # a generated op made with `--implements OP`: also the "created" implementation of OP
    implements: str | None = None
    impls: tuple[Impl, ...] = ()
    bucket: tuple[tuple[str, ...], str] | None = None

    def __post_init__(self) -> None:
        defaults = {
            "function": self.name,
            "reference": f"{self.name}_ref",
            "tests": f"tests/test_{self.name}.py",
        }
        for key, value in defaults.items():
            if not getattr(self, key):
                object.__setattr__(self, key, value)
        if not self.impls:
            name = "created" if self.generated else "kernelwright"
            own = Impl(name, "kernelwright", f"{self.module}:{self.function}")
            object.__setattr__(self, "impls", (own, INDUCTOR))

    def impl(self, name: str) -> Impl:
        for i in self.impls:
            if i.name == name:
                return i
        raise unknown_op(name, [i.name for i in self.impls], f"implementation of {self.name}")

    def load(self) -> ModuleType:
        """The op's module, imported."""
        return resolve(self.module)

    def attr(self, name: str) -> Any:
        return resolve(self.module, name)

    def fn(self) -> Any:
        return self.attr(self.function)

    def ref(self) -> Any:
        return self.attr(self.reference)

    def cls(self) -> type | None:
        return self.attr(self.module_class) if self.module_class else None

    def table_module(self) -> ModuleType | None:
        return resolve(self.table) if self.table else None
