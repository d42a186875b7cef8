"""repro.py: the divergence as a stand-alone script that fails while it is there.

The script builds the smallest failing input (the maker, the value regime and the layout of
the failing probe, the same seed), serves the launch config that probe forced (if any), runs
the op and its reference and asserts that every pass agrees within the tolerance. It carries a
copy of the probe's numerics (`numerics.py`), so it compares exactly as the probe did; it
imports only torch, kernelwright's allocation switch and the op, reference and inputs maker.
"""

from __future__ import annotations

import dataclasses
import inspect
import textwrap
from pathlib import Path

from kernelwright.profiles.debug import DebugProfile
from kernelwright.runtime.launch import LaunchConfig
from kernelwright.workflows.debug import numerics
from kernelwright.workflows.debug.target import BENCH_PREFIX

TEMPLATE = '''"""Repro written by `kernelwright debug {target}` (report.md beside it):

{summary}

Stand-alone: it builds the smallest failing input with a fixed seed, runs the op and its fp32
reference and asserts that they agree within the tolerance. It fails while the divergence is
there and passes once the op matches its reference again:

    python {path}
"""

import contextlib
import math
import sys

{paths}import torch

import kernelwright  # noqa: F401  (selects Triton's interpreter on a machine without a GPU)
from kernelwright.runtime.alloc import poisoned
{imports}
SEED = {seed}
DTYPE = torch.{dtype}
SHAPE = {shape}
VALUES = {values!r}
LAYOUT = {layout!r}
KWARGS = {kwargs}
GRAD_INPUTS = {grad_inputs!r}
# {tol_source}, {dtype}
TOL = {{"fwd": {fwd!r}, "bwd": {bwd!r}}}
PASS = {pass_name!r}  # the pass that diverged
ROWS = {rows!r}  # inputs the reference takes in chunks of rows (a huge input), or None


# ------------------------------------------- copied from kernelwright.workflows.debug.numerics
{numerics}

# ------------------------------------------- the repro


{forced}

def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    inputs = make_inputs(SHAPE, DTYPE, device, SEED)
    inputs = with_layout(with_values(inputs, VALUES, SEED), LAYOUT)
    with launch_config():
        passes, skipped = compare(
            op, reference, inputs, KWARGS, GRAD_INPUTS, TOL, SEED, poisoned, rows=ROWS
        )
    assert not skipped, skipped
    for p in passes:
        mark = "ok  " if p["ok"] else "FAIL"
        err, tol = p["error"], p["tol"]
        print(f"{{mark}} {{p['name']:16s}} rel-err {{err:.3e}}  tol {{tol:.1e}}  {{p['detail']}}")
    bad = [f"{{p['name']}} (rel-err {{p['error']:.2e}} > tol {{p['tol']:.1e}})"
           for p in passes if not p["ok"]]
    assert not bad, (
        f"the op differs from its fp32 reference beyond the {{str(DTYPE)[6:]}} tolerance in: "
        f"{{', '.join(bad)}}. This repro checks the forward output and every input's gradient "
        f"and passes once all of them agree; debug reported the {{PASS}} pass as the divergence"
    )
    print("the op matches its reference on this input")


if __name__ == "__main__":
    main()
'''


def _import(target: str, alias: str) -> str:
    module, _, attr = target.partition(":")
    head, _, rest = attr.partition(".")
    if rest:  # a nested attribute: import the first, then read the rest
        return f"from {module} import {head}\n{alias} = {head}.{rest}\n"
    return f"from {module} import {attr} as {alias}\n"


def _forced_source(profile: DebugProfile, forced: list[tuple[str, LaunchConfig]]) -> str:
    """`launch_config()`: serves the failing probe's forced config while the repro runs."""
    if not forced:
        return "launch_config = contextlib.nullcontext  # the launch table as it is\n"
    lines = [
        "@contextlib.contextmanager",
        "def launch_config():",
        "    # the launch config the failing probe served for every row length",
        "    from kernelwright.runtime import device_info",
        "    from kernelwright.runtime.launch import LaunchConfig",
        "",
        f"    table = __import__({profile.launch_table!r}, fromlist=['TABLE']).TABLE",
        "    arch = device_info().arch",
        "    saved = []",
    ]
    for kernel, cfg in forced:
        fields = ", ".join(f"{f.name}={getattr(cfg, f.name)!r}" for f in dataclasses.fields(cfg))
        lines += [
            f"    rows = table[{kernel!r}]",
            '    key = arch if arch in rows else "default"',
            "    saved.append((rows, key, rows[key]))",
            f"    rows[key] = [(2**31 - 1, LaunchConfig({fields}))]",
        ]
    lines += [
        "    try:",
        "        yield",
        "    finally:",
        "        for rows, key, old in saved:",
        "            rows[key] = old",
    ]
    return "\n".join(lines) + "\n"


def write_repro(
    profile: DebugProfile,
    path: Path,
    forced: list[tuple[str, LaunchConfig]],
    case_index: int,
) -> Path:
    d = profile.divergence
    assert d is not None
    case = profile.cases[case_index]
    tol = profile.tolerances[d.dtype]
    paths = "".join(f"sys.path.insert(0, {p!r})\n" for p in profile.sys_path)
    if paths:
        paths += "\n"
    imports = _import(case.function, "op") + _import(case.reference, "reference")
    if case.inputs.startswith(BENCH_PREFIX):
        module = case.inputs[len(BENCH_PREFIX) :]
        imports += (
            "from kernelwright.workflows.debug.target import bench_maker\n\n"
            f"make_inputs = bench_maker({module!r})\n"
        )
    else:
        imports += _import(case.inputs, "make_inputs")
    source = inspect.getsource(numerics)
    body = source[source.index("# Names of inputs") :]
    text = TEMPLATE.format(
        target=profile.target,
        summary=textwrap.fill(d.summary, 96),
        path=path,
        paths=paths,
        imports=imports,
        seed=profile.seed,
        dtype=d.dtype,
        shape=tuple(d.minimal_shape),
        values=d.values,
        layout=d.layout,
        kwargs=_kwargs_source(case.kwargs),
        grad_inputs=case.grad_inputs,
        tol_source=profile.tolerance_source,
        fwd=tol.fwd,
        bwd=tol.bwd,
        pass_name=d.pass_name,
        rows=d.rows,
        numerics=body.rstrip() + "\n",
        forced=_forced_source(profile, forced),
    )
    path.write_text(text)
    return path


def _kwargs_source(kwargs: dict) -> str:
    items = []
    for k, v in kwargs.items():
        if isinstance(v, str) and v.startswith("torch.") and v[6:].isidentifier():
            items.append(f"{k!r}: {v}")
        else:
            items.append(f"{k!r}: {v!r}")
    return "{" + ", ".join(items) + "}"
