"""Load a PyTorch reference for `kernelwright create`: a file or `package.module:function`.

Three input forms, told apart by what the file defines:
- "kernelbench": a `Model` nn.Module class with `get_inputs()` and `get_init_inputs()`;
- "module": one nn.Module subclass (built with `get_init_inputs()` when present, else with no
  arguments); its parameters become kernel inputs with role "parameter";
- "function": one plain function.
`path.py:name` or `package.module:name` picks a name when a file defines several.

Example inputs always come from a `get_inputs()` beside the reference (the KernelBench
convention): the tracer needs real shapes, and a guess would silently fix the wrong ones.
Floating inputs and parameters are cast to fp32, the dtype every graph is traced in.
"""

from __future__ import annotations

import builtins
import importlib
import importlib.util
import inspect
import keyword
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from kernelwright.registry.entry import import_module

# Helpers the KernelBench layout defines next to the reference: never a reference themselves.
_HELPERS = {"get_inputs", "get_init_inputs"}


class ReferenceError(ValueError):
    """The reference cannot be loaded or run; the message says what to change."""


@dataclass
class Reference:
    name: str  # snake_case op name
    source: str  # as given: a path or package.module:function
    input_form: Literal["function", "module", "kernelbench"]
    input_names: list[str]  # the reference's tensor arguments, in order
    example_inputs: list[torch.Tensor]  # fp32 where floating
    param_names: list[str] = field(default_factory=list)  # module parameters, "." -> "_"
    params: list[torch.Tensor] = field(default_factory=list)
    module: nn.Module | None = None
    function: Callable[..., Any] | None = None
    # non-tensor arguments from get_inputs(), baked into the traced graph as constants
    constants: dict[int, Any] = field(default_factory=dict)

    def call(self, *tensors: torch.Tensor) -> Any:
        """Run the reference on (inputs..., params...) as flat tensors: what the tracer traces."""
        n = len(self.input_names)
        args = _merge_constants(list(tensors[:n]), self.constants)
        if self.module is None:
            return self.function(*args)
        # Parameters are passed in, not read from the module, so they become graph inputs.
        named = dict(zip(self._param_keys, tensors[n:], strict=True))
        return torch.func.functional_call(self.module, named, tuple(args))

    @property
    def _param_keys(self) -> list[str]:
        return [k for k, _ in self.module.named_parameters()]


def rank_bound(ref: Reference) -> bool:
    """Whether `ref` depends on its inputs' rank: given its example inputs with one more leading
    dim of size 1 (those of the main rank), does it give the same values? A reference written
    with dim=-1 does, and a loss over every row; softmax(x, dim=1) of a 2-D x then normalises
    another dim, and cross_entropy reads dim 1 as the classes (so a kernel that flattens the
    leading dims into rows would compute something else than the reference at that rank)."""
    rank = max((t.dim() for t in ref.example_inputs), default=0)
    if rank == 0:
        return False
    ins = [t.clone() for t in ref.example_inputs]
    main = next(t for t in ins if t.dim() == rank).shape
    # the main input and those shaped like its leading dims (a per-row index) get the new dim;
    # a weight broadcast from the right does not
    lifted = [t[None] if t.dim() and t.shape == main[: t.dim()] else t for t in ins]
    params = [t.clone() for t in ref.params]
    try:
        with torch.no_grad():
            outs = [_flat(ref.call(*x, *params)) for x in (ins, lifted)]
        for one, more in zip(*outs, strict=True):
            want = one[None] if one.dim() else one
            wide = torch.complex128 if more.is_complex() else torch.float64  # keep imag parts
            if more.shape != want.shape or not torch.allclose(
                more.to(wide), want.to(wide), rtol=1e-4, atol=1e-5, equal_nan=True
            ):
                return True
    except Exception:  # noqa: BLE001  a leading dim the reference does not accept: bound
        return True
    return False


def _flat(out) -> list[torch.Tensor]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def run_eagerly(ref: Reference) -> tuple[str, str] | None:
    """Run `ref` once on copies of its example inputs: (node, reason) where no kernel can do
    what it does — it writes an input in place, draws random numbers, or computes with gradients
    off (torch.no_grad, of which the traced graphs keep no mark) — else None. A reference that
    fails there is the user's to fix (a ReferenceError says how it failed), not a tier-3 op."""
    tensors = [t.clone() for t in ref.example_inputs + ref.params]
    names = ref.input_names + ref.param_names
    for n, t in zip(names, tensors, strict=True):
        if t.is_complex():  # traced as is, it would be generated as a real tensor
            return n, (
                f"{n} is {str(t.dtype).removeprefix('torch.')}: a generated kernel computes on "
                "real fp32 tiles; pass the real and imaginary parts as real tensors "
                "(torch.view_as_real)"
            )
    versions = [t._version for t in tensors]
    watch = _GradOff()
    draws = _Draws(watch)
    try:
        with watch, draws:
            ref.call(*tensors)
    except (Exception, SystemExit) as e:
        raise ReferenceError(
            f"the reference fails on the inputs of get_inputs() ({type(e).__name__}: "
            f"{_first_line(e)}){_cpu_hint(e)}: fix the reference or get_inputs() — they must "
            "run together in eager PyTorch"
        ) from e
    written = [n for n, t, v in zip(names, tensors, versions, strict=True) if t._version != v]
    if written:
        return written[0], (
            f"the reference writes {', '.join(written)} in place (an in-place op such as mul_ "
            "or a slice assignment on it): a kernel leaves its inputs as they are; compute a "
            "new tensor instead (x * 2, not x.mul_(2))"
        )
    if draws.call is not None:
        return draws.call, _random_reason(draws.call, draws.op)
    if watch.off:
        return "no_grad", (
            "the reference computes under torch.no_grad() (or with gradients off): the traced "
            "graphs keep no mark of it, so the kernel's gradients could not be checked; write "
            ".detach() on the values it makes instead"
        )
    return None


class _GradOff(torch.overrides.TorchFunctionMode):
    """Records a torch call made with gradients off: tracing keeps no trace of torch.no_grad, so
    the generated reference would differentiate what the reference does not. Also keeps the
    reference's torch call in progress (`call`), which names a random op (`_Draws`)."""

    off = False
    call: Any = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.off = self.off or not torch.is_grad_enabled()
        self.call = func  # calls inside it are not seen: the mode is off while it runs
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.call = None


class _Draws(TorchDispatchMode):
    """Records the first aten op of the reference that draws random numbers (`op`) and the name
    of the reference's torch call that ran it (`call`): an op PyTorch tags as seeded that takes
    a generator or advances the default one (seeded ops that draw nothing, such as dropout
    with p = 0 inside attention, are deterministic)."""

    def __init__(self, watch: _GradOff):
        super().__init__()
        self.watch, self.op, self.call = watch, None, None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.op is not None or torch.Tag.nondeterministic_seeded not in func.tags:
            return func(*args, **kwargs)
        before = torch.random.get_rng_state()
        out = func(*args, **kwargs)
        given = any(isinstance(a, torch.Generator) for a in (*args, *kwargs.values()))
        if given or not torch.equal(before, torch.random.get_rng_state()):
            self.op = func
            self.call = getattr(self.watch.call, "__name__", None) or func.overloadpacket.__name__
        return out


def _random_reason(call: str, op) -> str:
    """Why a reference that draws random numbers in `call` (aten `op`) stops, and what to do."""
    what = f"{call} ({op})"
    if "dropout" in call:
        what = f"{call} in training mode ({op})"
        fix = (
            "make the dropout the identity — model.eval() (self.eval() in the module's "
            "__init__), training=False or p=0 — or pass the mask as an input, drawn in "
            "get_inputs() (x * mask / (1 - p))"
        )
    else:
        fix = "draw the random tensor in get_inputs() and pass it as an input"
    return (
        f"the reference draws random numbers: {what}, which a generated kernel cannot "
        f"reproduce bit for bit (its tests compare it with the reference); {fix}"
    )


def _merge_constants(tensors: list[Any], constants: dict[int, Any]) -> list[Any]:
    out: list[Any] = []
    it = iter(tensors)
    for i in range(len(tensors) + len(constants)):
        out.append(constants[i] if i in constants else next(it))
    return out


def snake_case(name: str) -> str:
    s = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name)
    return re.sub(r"[^0-9a-zA-Z]+", "_", s).strip("_").lower()


# Names the generated package cannot take: it is a top-level package beside its tests (named
# like a module they import, it would shadow it) and its op module imports these names.
# fmt: off
_TAKEN = frozenset([
    "torch", "triton", "tl", "functorch", "numpy", "pytest", "_pytest", "pluggy", "kernelwright",
    "sympy", "networkx", "jinja2", "filelock", "fsspec", "typing_extensions", "mpmath", "yaml",
    "pydantic", "typer", "rich", "click", "packaging", "functools", "empty", "ensure_backend",
    "check_index_range", "device_info", "lookup", "traced", "poisoned",
])
# fmt: on


def name_problem(name: str) -> str | None:
    """Why `name` cannot name a generated op (its package, module, function and class), or
    None: it must be a lowercase Python identifier that shadows nothing the package imports."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        return f"op name {name!r} is not a lowercase Python identifier (a-z, 0-9, _)"
    camel = "".join(part[:1].upper() + part[1:] for part in name.split("_") if part)
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        return f"op name {name!r} is a Python keyword"
    if name.startswith("test"):
        return f"op name {name!r} starts with 'test': pytest would run its functions as tests"
    taken = _TAKEN | set(sys.stdlib_module_names) | set(dir(builtins))
    if name in taken or camel in taken or camel == "C":
        return (
            f"op name {name!r} (class {camel}) would shadow a module or name that the "
            "generated package uses"
        )
    return None


def op_identifier(name: str) -> str:
    """`name` made a usable op name (see name_problem): 'op_' before a leading digit or 'test',
    '_op' after a keyword or a shadowed name."""
    name = re.sub(r"[^a-z0-9_]+", "_", name.lower()).strip("_") or "op"
    if not name[0].isalpha() or name.startswith("test"):
        name = f"op_{name}"
    while name_problem(name):
        name += "_op"
    return name


def _import_file(path: Path) -> ModuleType:
    # A fresh module name per path keeps two references with the same stem apart.
    mod_name = "_kernelwright_ref_" + re.sub(r"\W", "_", str(path.resolve()))
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise ReferenceError(f"cannot import {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[mod_name]
        raise ReferenceError(f"importing {path} failed: {type(e).__name__}: {e}") from e
    return module


def _candidates(module: ModuleType) -> tuple[list[type], list[Callable]]:
    """nn.Module subclasses and plain functions defined in `module` itself (not imported)."""
    classes, functions = [], []
    for attr, obj in sorted(vars(module).items()):
        if attr.startswith("_") or attr in _HELPERS:
            continue
        if getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isclass(obj) and issubclass(obj, nn.Module):
            classes.append(obj)
        elif inspect.isfunction(obj):
            functions.append(obj)
    return classes, functions


def _pick(module: ModuleType, where: str, stem: str) -> tuple[Any, str]:
    """The reference object in `module` and its input form."""
    has_kb = callable(getattr(module, "get_inputs", None)) and callable(
        getattr(module, "get_init_inputs", None)
    )
    model = getattr(module, "Model", None)
    if has_kb and inspect.isclass(model) and issubclass(model, nn.Module):
        return model, "kernelbench"
    classes, functions = _candidates(module)
    objs = classes or functions
    if len(objs) > 1:
        # Several candidates: the one named like the file wins (softmax.py: def softmax).
        named = [o for o in objs if snake_case(o.__name__) == stem]
        objs = named or objs
    if len(objs) == 1:
        obj = objs[0]
        return obj, "module" if inspect.isclass(obj) else "function"
    if not objs:
        # a class of its own that is no nn.Module (a forward or __call__ is not enough)
        plain = [
            n for n, o in sorted(vars(module).items())
            if inspect.isclass(o) and getattr(o, "__module__", None) == module.__name__
        ]  # fmt: skip
        hint = f" (class {plain[0]} is not an nn.Module subclass)" if plain else ""
        raise ReferenceError(
            f"{where} defines no reference{hint}: add a function, an nn.Module subclass, or the "
            "KernelBench layout (class Model(nn.Module), get_inputs(), get_init_inputs())"
        )
    # the names the file binds them to (f = make(3.0) binds a closure named g to f)
    bound = {id(o): a for a, o in sorted(vars(module).items(), reverse=True)}
    names = ", ".join(sorted(bound.get(id(o), o.__name__) for o in objs))
    raise ReferenceError(
        f"{where} defines several candidates ({names}): pick one with {where}:<name>"
    )


def _example_inputs(module: ModuleType, where: str) -> list[Any]:
    get_inputs = getattr(module, "get_inputs", None)
    if not callable(get_inputs):
        raise ReferenceError(
            f"{where} has no get_inputs(): add `def get_inputs(): return [torch.randn(4, 8, "
            "96), ...]` returning one example per argument (small, odd sizes are best)"
        )
    inputs = _called(get_inputs, "get_inputs", where)
    for i, v in enumerate(inputs):
        # a tensor inside a list would be baked into the kernel as a constant, values and all
        held = v.values() if isinstance(v, dict) else v if isinstance(v, (list, tuple)) else []
        if any(isinstance(t, torch.Tensor) for t in held):
            raise ReferenceError(
                f"{where}: get_inputs() argument {i} is a {type(v).__name__} holding tensors: "
                "a kernel takes each tensor as an argument of its own; take them one by one "
                "(def f(x, a, b), get_inputs() returning [x, a, b])"
            )
    if not any(isinstance(t, torch.Tensor) for t in inputs):
        raise ReferenceError(f"{where}: get_inputs() returned no tensor")
    return inputs


def _called(fn: Callable, what: str, where: str) -> list[Any]:
    """The list that `what()` (get_inputs or get_init_inputs) returns: a list, a tuple or
    another iterable of the arguments, in order (a single tensor or a dict is not one)."""
    try:
        value = fn()
        if isinstance(value, (torch.Tensor, dict, str, bytes)) or value is None:
            raise TypeError(f"it returned a {type(value).__name__}")
        return list(value)
    except Exception as e:
        raise ReferenceError(
            f"{where}: {what}() failed ({type(e).__name__}: {_first_line(e)}){_cpu_hint(e)}; "
            f"{what}() must return a list of the arguments in order, e.g. [torch.randn(4, 96)]"
        ) from e


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def _cpu_hint(e: BaseException) -> str:
    """Where a CUDA-only call failed on a machine without one: what to change."""
    if "CUDA" in str(e) and not torch.cuda.is_available():
        return (
            " — there is no GPU here, and Understand traces on the CPU: make the reference and "
            "get_inputs() device-agnostic (no .cuda() or device='cuda')"
        )
    return ""


def _fp32(t: torch.Tensor) -> torch.Tensor:
    return t.detach().float() if t.is_floating_point() else t.detach()


def _arg_names(fn: Callable, count: int) -> list[str]:
    params = [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    names = [p.name for p in params[:count]]
    # *args references: x0, x1, ... for the arguments the signature does not name
    return names + [f"x{i}" for i in range(len(names), count)]


def _own_names(names: list[str]) -> list[str]:
    """The names the generated code gives the reference's tensors: their own, unless one is
    the name of another value of the traced graphs — an output (y, y0, ...) or a gradient (dy,
    or d plus another input's name) — or a name the generated code uses beside them (self,
    torch, a builtin, the eager reference's locals). Those get "_in" appended (the generated
    function takes them positionally, in order). A traced node named like an input is renamed
    instead (trace.py)."""
    taken = set(dir(builtins)) | {"torch", "math", "triton", "tl", "self", "ctx", "inputs",
                                  "dys", "_device", "_shape"}  # fmt: skip
    out: list[str] = []
    for n in names:
        own, others = n, set(names) - {n}
        while (
            re.fullmatch(r"d?y\d*", own)
            or own in taken
            or (own.startswith("d") and own[1:] in others)
            or own in out
            or (own != n and own in names)
        ):
            own += "_in"
        out.append(own)
    return out


def load_reference(source: str, *, name: str | None = None) -> Reference:
    """Load `source` (path.py, path.py:name or package.module:name) with its example inputs."""
    torch.manual_seed(0)  # parameters and example inputs are the same on every run
    target: str | None = None
    if source.endswith(".py") or Path(source).is_file():
        path = Path(source)
    elif ":" in source and source.split(":", 1)[0].endswith(".py"):
        file_part, target = source.split(":", 1)
        path = Path(file_part)
    elif ":" in source:
        mod_part, target = source.split(":", 1)
        path = None
    else:
        raise ReferenceError(
            f"reference {source!r} is neither a .py file nor package.module:function"
        )
    if path is not None:
        if not path.is_file():
            raise ReferenceError(f"reference file {path} does not exist")
        module = _import_file(path)
        where, stem = str(path), snake_case(path.stem)
    else:
        try:
            module = import_module(mod_part)
        except ImportError as e:
            raise ReferenceError(f"cannot import {mod_part!r} from {source!r}: {e}") from e
        where, stem = mod_part, snake_case(target)

    if target is not None:
        obj = getattr(module, target, None)
        if obj is None:
            raise ReferenceError(f"{where} has no attribute {target!r}")
        if inspect.isclass(obj) and issubclass(obj, nn.Module):
            form = (
                "kernelbench"
                if target == "Model" and hasattr(module, "get_init_inputs")
                else "module"
            )
        elif callable(obj):
            form = "function"
        else:
            raise ReferenceError(f"{where}:{target} is neither a function nor an nn.Module class")
    else:
        obj, form = _pick(module, where, stem)

    raw = _example_inputs(module, where)
    constants = {i: v for i, v in enumerate(raw) if not isinstance(v, torch.Tensor)}
    inputs = [_fp32(v) for v in raw if isinstance(v, torch.Tensor)]
    # named after the target picked (path.py:name), else the file; KernelBench's class is
    # always `Model`, so its file names it
    op_name = name or op_identifier(
        snake_case(target) if target is not None and form != "kernelbench" else stem
    )

    if form == "function":
        names = _arg_names(obj, len(raw))
        names = _own_names([n for i, n in enumerate(names) if i not in constants])
        return Reference(op_name, source, form, names, inputs, function=obj, constants=constants)

    init = getattr(module, "get_init_inputs", None)
    init_args = _called(init, "get_init_inputs", where) if callable(init) else []
    try:
        mod = obj(*init_args).float()
    except Exception as e:
        raise ReferenceError(
            f"building {obj.__name__}(*{init_args!r}) from {where} failed: {e}; add a "
            "get_init_inputs() returning its constructor arguments"
        ) from e
    names = _arg_names(mod.forward, len(raw))
    names = [n for i, n in enumerate(names) if i not in constants]
    own = _own_names(names + [k.replace(".", "_") for k, _ in mod.named_parameters()])
    names, param_names = own[: len(names)], own[len(names) :]
    params = [p.detach() for _, p in mod.named_parameters()]
    return Reference(
        op_name,
        source,
        form,
        names,
        inputs,
        param_names=param_names,
        params=params,
        module=mod,
        constants=constants,
    )
