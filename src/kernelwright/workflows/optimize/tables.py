"""An op's launch-config table: read it, swap entries in-process, write one arch entry to disk.

Op modules import their table's `TABLE` dict by name and look configs up at call time, so a
variant is measured by replacing `TABLE[kernel][arch]` in that very dict (never rebinding it)
and restoring it afterwards. Only Finalize writes the table file, one arch entry per kernel,
through `rewrite_table_source`: the rest of the file — comments, other archs — stays as written.
"""

from __future__ import annotations

import ast
import runpy
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from types import ModuleType

from kernelwright import registry
from kernelwright.profiles.optimization import ConfigRow
from kernelwright.runtime.launch import LaunchConfig, Row, Table, table_rows

ArchRows = dict[str, list[Row]]  # kernel -> the rows of one architecture
MAX_N_OPEN = 2**31 - 1  # the "any longer row" bound the tables use
_DEFAULTS = {f.name: f.default for f in fields(LaunchConfig) if f.name != "block_n"}


def table_module(op: str) -> ModuleType:
    """The launch-config table module op `op`'s registry entry names."""
    entry = registry.get(op)
    if entry.table is None:
        raise ValueError(
            f"{op}: no launch-config table (its registry entry names none); the optimize "
            f"workflow retunes ops whose launch parameters live in a table: "
            f"{', '.join(registry.tuned())}"
        )
    return registry.resolve(entry.table)


def get_table(op: str) -> Table:
    mod = table_module(op)
    table = getattr(mod, "TABLE", None)
    if not isinstance(table, dict):
        raise ValueError(f"{mod.__name__} has no TABLE dict")
    return table


def rows_for(table: Table, kernel: str, arch: str) -> list[Row]:
    """The rows `lookup` uses for `arch`: its own entry, else "default" (a copy)."""
    return list(table_rows(table, kernel, arch))


def arch_rows(table: Table, kernels: list[str], arch: str) -> ArchRows:
    return {k: rows_for(table, k, arch) for k in kernels}


def regime_index(rows: list[Row], n: int) -> int:
    """Index of the row that serves row length `n` (as `lookup` picks it)."""
    for i, (max_n, _) in enumerate(rows):
        if n <= max_n:
            return i
    raise ValueError(f"row length {n} is past the table's last row ({rows[-1][0]})")


# --------------------------------------------------------------------------- in-process swaps


@contextmanager
def installed(table: Table, entries: ArchRows, archs: list[str]) -> Iterator[None]:
    """Serve `entries` for every arch in `archs` while the block runs, then restore."""
    saved = {(k, a): table[k].get(a) for k in entries for a in archs}
    try:
        for k, rows in entries.items():
            for a in archs:
                table[k][a] = list(rows)
        yield
    finally:
        for (k, a), old in saved.items():
            if old is None:
                table[k].pop(a, None)
            else:
                table[k][a] = old


def install(table: Table, entries: ArchRows, archs: list[str]) -> None:
    """Serve `entries` for `archs` from now on (Finalize, the planted regression)."""
    for k, rows in entries.items():
        for a in archs:
            table[k][a] = list(rows)


# --------------------------------------------------------------------------- conversions


def to_config_rows(rows: list[Row]) -> list[ConfigRow]:
    return [
        ConfigRow(
            max_n=m,
            block_n=c.block_n,
            num_warps=c.num_warps,
            rows=c.rows,
            num_stages=c.num_stages,
            programs_per_sm=c.programs_per_sm,
            evict_hints=c.evict_hints,
            reverse_pass=c.reverse_pass,
            split_row=c.split_row,
            split_prefetch=c.split_prefetch,
        )
        for m, c in rows
    ]


def from_config_rows(rows: list[ConfigRow]) -> list[Row]:
    out = []
    for r in rows:
        d = r.model_dump()
        out.append((d.pop("max_n"), LaunchConfig(**d)))
    return out


def to_profile(entries: ArchRows) -> dict[str, list[ConfigRow]]:
    return {k: to_config_rows(v) for k, v in entries.items()}


def from_profile(entries: Mapping[str, list[ConfigRow]]) -> ArchRows:
    return {k: from_config_rows(v) for k, v in entries.items()}


def describe_config(cfg: LaunchConfig) -> str:
    parts = [f"block_n={cfg.block_n}"]
    parts += [f"{k}={getattr(cfg, k)}" for k in _DEFAULTS if getattr(cfg, k) != _DEFAULTS[k]]
    if cfg.num_warps == _DEFAULTS["num_warps"]:
        parts.append(f"num_warps={cfg.num_warps}")
    return ", ".join(parts)


def max_n_label(max_n: int) -> str:
    return "2**31 - 1" if max_n == MAX_N_OPEN else str(max_n)


def diff(before: ArchRows, after: ArchRows) -> list[str]:
    """Readable edits: "fwd n<=4096: num_warps 8 -> 4, rows 1 -> 2"."""
    out = []
    for k, rows in after.items():
        old = dict(before.get(k, []))
        for max_n, cfg in rows:
            prev = old.get(max_n)
            if prev == cfg:
                continue
            if prev is None:
                out.append(f"{k} n<={max_n_label(max_n)}: new row {describe_config(cfg)}")
                continue
            changes = [
                f"{f.name} {getattr(prev, f.name)} -> {getattr(cfg, f.name)}"
                for f in fields(LaunchConfig)
                if getattr(prev, f.name) != getattr(cfg, f.name)
            ]
            out.append(f"{k} n<={max_n_label(max_n)}: " + ", ".join(changes))
    return out


# --------------------------------------------------------------------------- the table file


def render_config(cfg: LaunchConfig, alias: str) -> str:
    # num_warps always (as the hand-written tables do); other fields when not the default
    parts = [f"block_n={cfg.block_n}"]
    for name in ("rows", "num_warps", *(n for n in _DEFAULTS if n not in ("rows", "num_warps"))):
        value = getattr(cfg, name)
        if name == "num_warps" or value != _DEFAULTS[name]:
            parts.append(f"{name}={value}")
    return f"{alias}({', '.join(parts)})"


LINE_LENGTH = 100  # ruff's, as the project sets it


def render_entry(arch: str, rows: list[Row], indent: str, alias: str, comment: str) -> str:
    # one comment line, cut to the line length (a long GPU name must not break `ruff check`)
    comment = comment[: LINE_LENGTH - len(indent) - 2].rstrip()
    lines = [f"{indent}# {comment}"] if comment else []
    lines.append(f'{indent}"{arch}": [')
    for max_n, cfg in rows:
        lines.append(f"{indent}    ({max_n_label(max_n)}, {render_config(cfg, alias)}),")
    lines.append(f"{indent}],")
    return "\n".join(lines) + "\n"


def _config_alias(tree: ast.Module) -> str:
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            for a in node.names:
                if a.name == "LaunchConfig":
                    return a.asname or a.name
    raise ValueError("the table file does not import LaunchConfig")


def _table_dict(tree: ast.Module) -> ast.Dict:
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        is_table = any(isinstance(t, ast.Name) and t.id == "TABLE" for t in targets)
        if is_table and isinstance(node.value, ast.Dict):
            return node.value
    raise ValueError("the table file has no `TABLE = {...}` literal")


def _key_index(d: ast.Dict, key: str) -> int | None:
    for i, k in enumerate(d.keys):
        if isinstance(k, ast.Constant) and k.value == key:
            return i
    return None


COMMENT_PREFIX = "kernelwright optimize:"


def rewrite_table_source(source: str, arch: str, entries: ArchRows, comment: str = "") -> str:
    """`source` of a table module with `TABLE[kernel][arch]` set to `entries[kernel]`.

    An existing `arch` entry is replaced in place (with the comment line above it when it is
    one this function wrote); a new one goes after the kernel's last entry. Each entry is one
    line per row, in the hand-written tables' layout, which `ruff format` leaves as it is.
    """
    for kernel in entries:
        tree = ast.parse(source)
        alias = _config_alias(tree)
        table = _table_dict(tree)
        ki = _key_index(table, kernel)
        if ki is None:
            raise ValueError(f"the table has no kernel {kernel!r}")
        per_arch = table.values[ki]
        if not isinstance(per_arch, ast.Dict) or not per_arch.keys:
            raise ValueError(f"TABLE[{kernel!r}] is not a dict literal of arch entries")
        lines = source.splitlines(keepends=True)
        ai = _key_index(per_arch, arch)
        first_key = per_arch.keys[0]
        indent = " " * first_key.col_offset
        text = render_entry(
            arch, entries[kernel], indent, alias, f"{COMMENT_PREFIX} {comment}" if comment else ""
        )
        if ai is not None:
            start = per_arch.keys[ai].lineno - 1  # 0-based first line of the entry
            end = per_arch.values[ai].end_lineno  # exclusive, 0-based
            if start > 0 and lines[start - 1].strip().startswith(f"# {COMMENT_PREFIX}"):
                start -= 1
            lines[start:end] = [text]
        else:
            close = per_arch.end_lineno - 1  # the line holding the kernel dict's closing brace
            lines[close:close] = [text]
        source = "".join(lines)
    return source


def check_rewritten(source: str, arch: str, entries: ArchRows) -> None:
    """Execute the rewritten table source and confirm it holds exactly `entries` for `arch`.

    It runs from a file: a created op's table lives in its generated module beside its
    kernels, and Triton's jit reads a kernel's source from the file it is defined in."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rewritten_table.py"
        path.write_text(source)
        table = runpy.run_path(str(path))["TABLE"]
    for k, rows in entries.items():
        if list(table[k][arch]) != list(rows):
            raise ValueError(f"rewriting the table file gave other rows for {k}/{arch}")


def write_entry(path: Path, arch: str, entries: ArchRows, comment: str = "") -> str:
    """Rewrite the table file at `path` in place; returns the new source."""
    new = rewrite_table_source(path.read_text(), arch, entries, comment)
    check_rewritten(new, arch, entries)
    path.write_text(new)
    return new
