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

import importlib
import importlib.util
import inspect
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import torch
from torch import nn

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


def _merge_constants(tensors: list[Any], constants: dict[int, Any]) -> list[Any]:
    out: list[Any] = []
    it = iter(tensors)
    for i in range(len(tensors) + len(constants)):
        out.append(constants[i] if i in constants else next(it))
    return out


def snake_case(name: str) -> str:
    s = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name)
    return re.sub(r"[^0-9a-zA-Z]+", "_", s).strip("_").lower()


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
        raise ReferenceError(
            f"{where} defines no reference: add a function, an nn.Module subclass, or the "
            "KernelBench layout (class Model, get_inputs(), get_init_inputs())"
        )
    names = ", ".join(o.__name__ for o in objs)
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
    inputs = list(get_inputs())
    if not any(isinstance(t, torch.Tensor) for t in inputs):
        raise ReferenceError(f"{where}: get_inputs() returned no tensor")
    return inputs


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
    or d plus another input's name). Those get "_in" appended (the generated function takes
    them positionally, in order). A traced node named like an input is renamed instead
    (trace.py)."""
    import re

    out: list[str] = []
    for n in names:
        own, others = n, set(names) - {n}
        while (
            re.fullmatch(r"d?y\d*", own)
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
            module = importlib.import_module(mod_part)
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
    op_name = name or (stem if form == "kernelbench" or path is not None else snake_case(target))

    if form == "function":
        names = _arg_names(obj, len(raw))
        names = _own_names([n for i, n in enumerate(names) if i not in constants])
        return Reference(op_name, source, form, names, inputs, function=obj, constants=constants)

    init = getattr(module, "get_init_inputs", None)
    init_args = list(init()) if callable(init) else []
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
