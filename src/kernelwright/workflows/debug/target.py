"""Stage 1 (Plan): what to debug, against what, on which inputs, within which tolerances.

A target is
- a library op (a registry name): its registered cases (function, reference, inputs maker,
  options), its launch table, and the tolerance table its test file states;
- an op made by `kernelwright create`: added to the library (a registry name too) or left in
  its workspace (`kernelwright-runs/create/<name>/pkg/<name>/`); its inputs come from the
  benchmark data (`BENCH`) its module declares, its table is the module's `TABLE`;
- `package.module:function`, with a reference: `--ref` names a registry op (its cases, inputs,
  table and tolerances, with this function in place of the op's) or another function; by
  default `<function>_ref` beside it.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
from pathlib import Path
from typing import Any

import torch

import kernelwright
from kernelwright import registry
from kernelwright.profiles.debug import CaseSpec, DebugProfile, TolSpec
from kernelwright.registry.generated import entry_of
from kernelwright.runtime import default_device, device_info
from kernelwright.testing.cases import MAKERS
from kernelwright.testing.tolerances import DEFAULT_TOLERANCES, Tolerance
from kernelwright.workflows.debug import shapes as S

CASES = "kernelwright.testing.cases"
CREATED = Path("kernelwright-runs/create")
BENCH_PREFIX = "bench:"  # inputs from a created op's BENCH data: "bench:<module>"
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


class TargetError(ValueError):
    """A target, reference or inputs maker that cannot be resolved; the message says why."""


# --------------------------------------------------------------------------- kwargs in YAML


def encode(value: Any) -> Any:
    """An option as YAML holds it: torch dtypes as "torch.float32"."""
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, dict):
        return {k: encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    return value


def decode(value: Any) -> Any:
    if (
        isinstance(value, str)
        and value.startswith("torch.")
        and isinstance(getattr(torch, value[6:], None), torch.dtype)
    ):
        return getattr(torch, value[6:])
    if isinstance(value, dict):
        return {k: decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode(v) for v in value]
    return value


# --------------------------------------------------------------------------- tolerances


def repo_root() -> Path:
    return Path(kernelwright.__file__).resolve().parents[2]


def tolerances_of(tests: str | None) -> tuple[dict[str, TolSpec], str]:
    """The tolerance table an op's test file states at its top (`TOL = {dtype: Tolerance}`),
    read from the source checkout; else the project's defaults (testing/tolerances.py)."""
    path = repo_root() / tests if tests else None
    if path is not None and path.is_file():
        table = _table_in(path)
        if table is not None:
            return table, f"{tests}: TOL"
    defaults = {
        DTYPE_NAMES[d]: TolSpec(fwd=t.fwd, bwd=t.bwd) for d, t in DEFAULT_TOLERANCES.items()
    }
    return defaults, "kernelwright.testing.tolerances: DEFAULT_TOLERANCES"


def _table_in(path: Path) -> dict[str, TolSpec] | None:
    try:
        tree = ast.parse(path.read_text())
    except SyntaxError:
        return None
    names = {"torch": torch, "Tolerance": Tolerance, "ON_GPU": default_device().type == "cuda"}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)):
            continue
        if not any(isinstance(t, ast.Name) and t.id in ("TOL", "TOLERANCES") for t in node.targets):
            continue
        try:
            value = eval(compile(ast.Expression(node.value), str(path), "eval"), names)  # noqa: S307
        except Exception:  # noqa: BLE001  a table this reader does not understand: defaults
            return None
        if all(isinstance(k, torch.dtype) and isinstance(v, Tolerance) for k, v in value.items()):
            return {DTYPE_NAMES[k]: TolSpec(fwd=v.fwd, bwd=v.bwd) for k, v in value.items()}
    return None


# --------------------------------------------------------------------------- import paths


def importable(path: Path, module: str) -> str:
    """The folder to put on sys.path so that `module` (whose file is `path`) imports."""
    parts = module.split(".")
    root = path.resolve().parent
    depth = len(parts) - 1 + (path.name == "__init__.py")
    for _ in range(depth):
        root = root.parent
    return str(root)


def add_paths(paths: list[str]) -> None:
    for p in paths:
        if p not in sys.path:
            sys.path.insert(0, p)


def split_target(target: str) -> tuple[str, str]:
    module, _, attr = target.partition(":")
    if not module or not attr:
        raise TargetError(f"{target!r}: expected package.module:function")
    return module, attr


def load(target: str) -> Any:
    try:
        return registry.resolve(target)
    except (ImportError, AttributeError) as e:
        raise TargetError(f"cannot load {target!r}: {e}") from None


# --------------------------------------------------------------------------- cases


def _library_cases(entry: registry.OpEntry, fn: str | None = None) -> list[CaseSpec]:
    """The entry's registered cases; with `fn`, that function in place of the op's own (cases
    of the op's other functions, such as log_softmax beside softmax, are left out)."""
    out = []
    for case in entry.demo:
        function = case.function or entry.function
        if fn is not None and function != entry.function:
            continue
        ref = f"{entry.module}:{case.reference or entry.reference}"
        family = S.family_of(case.inputs)
        out.append(
            CaseSpec(
                label=case.label,
                function=fn or f"{entry.module}:{function}",
                reference=ref,
                inputs=f"{CASES}:{case.inputs}",
                family=family,
                kwargs=encode(dict(case.kwargs)),
                grad_inputs=list(case.grad_inputs) if case.grad_inputs is not None else None,
            )
        )
    return out


def _created_case(module: str, function: str, reference: str, label: str) -> CaseSpec:
    mod = importlib.import_module(module)
    bench = getattr(mod, "BENCH", None)
    if not isinstance(bench, dict):
        raise TargetError(
            f"{module} declares no BENCH (made before created ops carried their benchmark "
            "data); regenerate it with `kernelwright create --from-profile`"
        )
    traced, block = bench["layout"][0], bench["layout"][1]
    if tuple(block) != (len(traced) - 1,):
        raise TargetError(
            f"{module}: the kernel reduces dims {tuple(block)} of a rank-{len(traced)} input; "
            "debug takes created ops over the last dim (or element-wise) only"
        )
    grads = [i[0] for i in bench["inputs"] if i[3]]
    return CaseSpec(
        label=label,
        function=f"{module}:{function}",
        reference=f"{module}:{reference}",
        inputs=f"{BENCH_PREFIX}{module}",
        family="rows",
        grad_inputs=grads,
    )


def _maker_for(fn_target: str, inputs: str | None) -> tuple[str, str]:
    """(inputs maker "module:attr", family) for a function: `inputs` as given (a maker of
    kernelwright.testing.cases by name, or module:attr), else the maker whose argument names
    are the function's required arguments, else one x-like input per required argument."""
    if inputs:
        if ":" in inputs:
            load(inputs)
            return inputs, S.family_of(inputs.rpartition(":")[2])
        if inputs not in MAKERS:
            raise TargetError(f"--inputs {inputs!r}: no such maker; known: {', '.join(MAKERS)}")
        return f"{CASES}:{inputs}", S.family_of(inputs)
    fn = load(fn_target)
    required = [
        p.name
        for p in inspect.signature(fn).parameters.values()
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    for name, maker in MAKERS.items():
        shape = S.regime_shapes(S.family_of(name), S.DEFAULT_LONG_ROW)["tiny"]
        made = maker(shape, torch.float32, torch.device("cpu"), 0)
        if sorted(made) == sorted(required) or list(made) == required:
            return f"{CASES}:{name}", S.family_of(name)
    raise TargetError(
        f"{fn_target}: no inputs maker matches its arguments {required}; pass --inputs "
        f"(one of {', '.join(MAKERS)}, or package.module:maker taking (shape, dtype, device, "
        "seed) and returning {name: tensor})"
    )


# --------------------------------------------------------------------------- the plan


def op_like(target: str) -> bool:
    """Whether `target` names an op (not a model): a registry name, package.module:function
    or a created op's workspace."""
    return target in registry.names() or ":" in target or created_workspace(target) is not None


def created_workspace(target: str) -> Path | None:
    """The module of a created op left in its workspace: by name (kernelwright-runs/create/
    <name>/pkg/<name>/<name>.py), by its workspace folder, or by the module file itself."""
    path = Path(target)
    candidates = [path / "pkg" / path.name / f"{path.name}.py", path]
    if "/" not in target and not target.endswith(".py"):
        candidates.insert(0, CREATED / target / "pkg" / target / f"{target}.py")
    for c in candidates:
        if c.is_file() and c.suffix == ".py" and c.parent.parent.name == "pkg":
            return c
    return None


def plan(
    target: str,
    *,
    ref: str | None = None,
    inputs: str | None = None,
    seed: int = 0,
    name: str | None = None,
) -> DebugProfile:
    """The plan for `target` (see the module): every case, the tolerances, the shapes of
    every regime, and the launch table. Nothing runs yet."""
    device = device_info(default_device())
    table = None
    sys_path: list[str] = []
    tests: str | None = None
    notes: list[str] = []
    known = registry.names()
    if ":" not in target and (ref is not None or inputs is not None):
        given = "--ref" if ref is not None else "--inputs"
        raise TargetError(
            f"{given} applies to a package.module:function target; {target!r} carries its own "
            "reference and inputs"
        )
    if target in known and ref is None and inputs is None:
        entry = registry.get(target)
        kind = "created" if entry.generated else "library"
        if entry.demo:
            cases = _library_cases(entry)
        elif entry.generated:
            cases = [_created_case(entry.module, entry.function, entry.reference, entry.name)]
        else:
            raise TargetError(
                f"{target} registers no inputs (no demo case); debug it as "
                f"`{entry.module}:{entry.function}` with --inputs package.module:maker"
            )
        table = entry.table
        tests = None if entry.generated else entry.tests
    elif ":" not in target and created_workspace(target) is not None:
        path = created_workspace(target)
        op = path.stem
        sys_path = [str(path.parent.parent.resolve())]
        add_paths(sys_path)
        entry = entry_of(path, op)
        if entry is None:
            raise TargetError(f"{path} exports no {op}_ref: not a created op")
        kind = "created"
        cases = [_created_case(entry.module, entry.function, entry.reference, op)]
        table = entry.module if hasattr(entry.load(), "TABLE") else None
    elif ":" in target:
        kind = "function"
        module, attr = split_target(target)
        try:
            mod = registry.import_module(module)
        except ImportError as e:
            raise TargetError(f"cannot import {module!r}: {e}") from None
        path = Path(getattr(mod, "__file__", "") or "")
        if path.is_file() and not module.startswith("kernelwright."):
            sys_path = [importable(path, module)]
        load(target)
        if ref is not None and ":" not in ref:
            try:
                entry = registry.get(ref)
            except registry.UnknownOpError as e:  # its message lists the known ops
                raise TargetError(f"--ref: {e}") from None
            cases = _library_cases(entry, fn=target)
            if inputs is not None:
                maker, family = _maker_for(target, inputs)
                cases = [c.model_copy(update={"inputs": maker, "family": family}) for c in cases]
            if not cases:
                raise TargetError(f"--ref {ref}: the op registers no case of its own function")
            for c in cases:
                c.label = c.label.replace(entry.name, attr, 1)
            table, tests = entry.table, entry.tests
        else:
            reference = ref or f"{module}:{attr}_ref"
            load(reference)
            maker, family = _maker_for(target, inputs)
            cases = [CaseSpec(label=attr, function=target, reference=reference,
                              inputs=maker, family=family)]  # fmt: skip
            if isinstance(getattr(mod, "TABLE", None), dict):
                table = module
    elif Path(target).exists():  # a path, not an op's name: say what it lacks
        raise TargetError(
            f"{target} is neither a model (a config.json, or a directory holding one) nor a "
            f"created op's workspace (a directory holding pkg/<name>/<name>.py)"
        )
    else:
        created = sorted(p.name for p in CREATED.glob("*") if created_workspace(p.name))
        hint = f"; created ops in {CREATED}: {', '.join(created)}" if created else ""
        raise TargetError(
            str(registry.unknown_op(target, known))
            + f" Or give package.module:function (with --ref){hint}."
        )
    tolerances, source = tolerances_of(tests)
    table_mod = registry.resolve(table) if table else None
    arch_of = _arch_of(getattr(table_mod, "TABLE", None), device.arch)
    long_n = S.long_row(getattr(table_mod, "TABLE", None), arch_of)
    for c in cases:
        c.shapes = S.regime_shapes(c.family, long_n)
    if device.backend != "cuda":
        notes.append(
            "run through Triton's interpreter on the CPU: fp32 -> bf16 casts in kernels "
            "truncate there (the tolerance tables allow for it); GPU-only bugs (races that "
            "need programs to interleave, TF32) do not show, and the huge shape regime (past "
            "2^31 elements) is not tried"
        )
    return DebugProfile(
        name=name or _name_of(target),
        target=target,
        kind=kind,
        device=device.name,
        arch=device.arch,
        seed=seed,
        launch_table=table,
        sys_path=sys_path,
        tolerance_source=source,
        tolerances=tolerances,
        cases=cases,
        notes=notes,
    )


def _arch_of(table, arch: str):
    """kernel -> the table key `lookup` uses on this device (its arch, else "default")."""

    def of(kernel: str) -> str:
        return arch if table and arch in table[kernel] else "default"

    return of


def _name_of(target: str) -> str:
    created = created_workspace(target) if ":" not in target else None
    return created.stem if created is not None else target.replace(":", ".").rsplit("/", 1)[-1]


# --------------------------------------------------------------------------- loading a plan


def maker_of(spec: CaseSpec):
    """The case's inputs maker: (shape, dtype, device, seed) -> {name: tensor}."""
    if spec.inputs.startswith(BENCH_PREFIX):
        return bench_maker(spec.inputs[len(BENCH_PREFIX) :])
    return load(spec.inputs)


def bench_maker(module: str):
    """A maker from a created op's BENCH data: shape [..., cols] (the leading dims' product is
    the rows), each input full, per-row, per-column or scalar as the kernel reads it."""
    from kernelwright.bench.created import BenchInput, Layout, input_shape

    bench = importlib.import_module(module).BENCH
    specs = [BenchInput(*i) for i in bench["inputs"]]
    layout = Layout(*bench["layout"])

    def make(shape, dtype, device, seed):
        *lead, cols = shape
        rows = 1
        for s in lead:
            rows *= s
        gen = torch.Generator().manual_seed(seed)
        out = {}
        for i in specs:
            size = input_shape(i, rows, cols, layout)
            if i.dtype == "int":
                out[i.name] = torch.randint(0, cols, size, generator=gen).to(device)
                continue
            dt = torch.float32 if i.dtype == "fp32" else dtype
            t = torch.randn(size, generator=gen)
            t = torch.where(t == 0, torch.full_like(t, 0.0625), t)
            if i.broadcast == "full" and lead:
                t = t.reshape(*lead, cols)
            out[i.name] = t.to(device=device, dtype=dt)
        return out

    return make
