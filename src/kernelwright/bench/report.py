"""Benchmark results out: the CSV (one schema for every op), plots, and summary tables.

- `write_csv` / `read_csv`: the columns of `harness.BenchRow`, in its field order. Appending
  to a file of the same schema adds rows; a file of another schema is refused, not mixed.
- `write_plots`: per (op, sweep, mode) one PNG, time (p50, p20-p80 band) and peak memory
  against the swept dim, one line per provider.
- `summarize` / `print_summary` / `summary_markdown`: per op, mode and shape, every provider's
  p50 and peak memory, and how kernelwright compares with the best peer:
  speedup = best_of(torch_compile, liger) p50 / kernelwright p50 (>= 1.0: we are faster),
  mem_ratio = best_of(peers) peak / kernelwright peak (>= 1.0: we use no more memory).
  Ops with a FLOP model (compute-bound) get a TFLOP/s column beside %copy-bw.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from kernelwright.bench.harness import COLUMNS, BenchRow

OURS = "kernelwright"
PEERS = ("torch_compile", "liger")  # the baselines the speed-up is taken against

HOST_MARK = "†"
HOST_NOTE = (
    f"{HOST_MARK}: launch-bound — the CPU takes about as long to issue the call as the GPU to "
    "run it (host_ms in the CSV). Default timing then includes Python/launch overhead; "
    "`--hide-host` times GPU work alone."
)

# Annotations are strings under `from __future__ import annotations`; accept both forms.
_FIELD_TYPES = {f.name: getattr(f.type, "__name__", f.type) for f in fields(BenchRow)}


# --------------------------------------------------------------------------- CSV


def write_csv(rows: Iterable[BenchRow], path: str | Path, *, append: bool = False) -> Path:
    """Write `rows` to `path`; with `append`, add them to an existing file of the same schema."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    has_header = append and path.exists() and path.stat().st_size > 0
    if has_header:
        with path.open(newline="") as f:
            header = next(csv.reader(f), [])
        if tuple(header) != COLUMNS:
            raise ValueError(
                f"{path}: its columns differ from this version's CSV schema; write to a new "
                f"file (or move this one away) instead of mixing schemas.\n"
                f"  file:   {','.join(header)}\n  schema: {','.join(COLUMNS)}"
            )
    with path.open("a" if has_header else "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        if not has_header:
            writer.writeheader()
        for r in rows:
            writer.writerow(asdict(r))
    return path


def _parse(name: str, text: str):
    kind = _FIELD_TYPES.get(name)
    if kind == "float":
        return float(text) if text not in ("", "nan") else math.nan
    if kind == "int":
        return int(text)
    return text


def read_csv(path: str | Path) -> list[BenchRow]:
    """Rows of a CSV written by `write_csv`, with numbers parsed (NaN for failed rows)."""
    with Path(path).open(newline="") as f:
        return [BenchRow(**{k: _parse(k, v) for k, v in d.items()}) for d in csv.DictReader(f)]


# --------------------------------------------------------------------------- plots


def _groups(rows: Iterable[BenchRow], *keys: str) -> dict[tuple, list[BenchRow]]:
    out: dict[tuple, list[BenchRow]] = {}
    for r in rows:
        out.setdefault(tuple(getattr(r, k) for k in keys), []).append(r)
    return out


def write_plots(rows: Sequence[BenchRow], out_dir: str | Path) -> list[Path]:
    """One PNG per (op, sweep, mode): p50 ms and peak MB against x, a line per provider."""
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on the GPU machine or in CI
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for (op, x_name, mode), group in sorted(_groups(rows, "op", "x_name", "mode").items()):
        if not any(r.ok for r in group):
            continue
        fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12, 4.5))
        xs_all = sorted({r.x_value for r in group})
        for provider, prow in _groups(group, "provider").items():
            prow = sorted(prow, key=lambda r: r.x_value)
            xs = [r.x_value for r in prow]
            p50 = [r.ms_p50 for r in prow]
            style = {"marker": "o", "linewidth": 2.5 if provider[0] == OURS else 1.5}
            (line,) = ax_t.plot(xs, p50, label=provider[0], **style)
            ax_t.fill_between(
                xs,
                [r.ms_p20 for r in prow],
                [r.ms_p80 for r in prow],
                alpha=0.2,
                color=line.get_color(),
            )
            ax_m.plot(xs, [r.peak_mem_mb for r in prow], label=provider[0], **style)
        first = group[0]
        for ax, ylabel in ((ax_t, "time, p50 [ms] (band: p20-p80)"), (ax_m, "peak memory [MB]")):
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs_all, [str(x) for x in xs_all], rotation=30)
            ax.minorticks_off()
            ax.set_xlabel(f"{x_name}  (shapes {group_span(group)})")
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
        # Log time axis: eager and the fused kernels differ by up to ~10x, and equal ratios
        # read as equal distances.
        ax_t.set_yscale("log")
        if not any(math.isfinite(r.peak_mem_mb) for r in group):
            ax_m.set_xlim(ax_t.get_xlim())
            ax_m.text(
                0.5,
                0.5,
                "no peak-memory statistics on this device",
                ha="center",
                transform=ax_m.transAxes,
            )
        timing = " — INTERPRETER TIMINGS, NOT SPEEDS" if first.timing == "interpreter" else ""
        fig.suptitle(f"{op} {mode}, {first.dtype}, {first.gpu}{timing}", fontsize=10)
        fig.tight_layout()
        path = out_dir / f"{op}_{x_name}_{mode}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def group_span(group: Sequence[BenchRow]) -> str:
    """The first and last shape of a sweep, e.g. "8192x2048 .. 8192x16384"."""
    ordered = sorted(group, key=lambda r: r.x_value)
    lo, hi = ordered[0].shape, ordered[-1].shape
    return lo if lo == hi else f"{lo} .. {hi}"


# --------------------------------------------------------------------------- summary


@dataclass
class SummaryRow:
    op: str
    mode: str
    x: str  # e.g. "hidden=4096"
    shape: str
    ms: dict[str, float]  # provider -> p50
    mem_mb: dict[str, float]  # provider -> peak MB
    host_bound: dict[str, bool]  # provider -> the CPU, not the GPU, set the time (see BenchRow)
    speedup: float  # best peer p50 / ours p50
    best_peer: str
    mem_ratio: float  # best peer peak / ours peak (the lowest-memory peer)
    pct_copy_bw: float  # ours
    tflops: float = math.nan  # ours, for specs with a FLOP model


def ratio(num: float, den: float) -> float:
    """num / den, NaN where either is missing (an error row) or den is not positive."""
    if not (math.isfinite(num) and math.isfinite(den)) or den <= 0:
        return math.nan
    return num / den


def geomean(values: Sequence[float]) -> float:
    """The geometric mean; NaN when there is no value or one is not a finite positive number."""
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        return math.nan
    return math.exp(sum(math.log(v) for v in values) / len(values))


def summarize(
    rows: Iterable[BenchRow], *, ours: str = OURS, peers: Sequence[str] = PEERS
) -> list[SummaryRow]:
    """One row per (op, mode, shape), in first-seen order; shapes met in two sweeps once."""
    out = []
    for (op, mode, shape), group in _groups(rows, "op", "mode", "shape").items():
        by_p = {r.provider: r for r in group}
        ms = {p: r.ms_p50 for p, r in by_p.items()}
        mem = {p: r.peak_mem_mb for p, r in by_p.items()}
        host = {p: r.host_bound for p, r in by_p.items()}
        peer_ms = {p: ms[p] for p in peers if p in ms and math.isfinite(ms[p])}
        peer_mem = [mem[p] for p in peers if p in mem and math.isfinite(mem[p])]
        best_peer = min(peer_ms, key=peer_ms.get) if peer_ms else ""
        our = by_p.get(ours)
        our_ms = our.ms_p50 if our else math.nan
        our_mem = our.peak_mem_mb if our else math.nan
        out.append(
            SummaryRow(
                op=op,
                mode=mode,
                x=f"{group[0].x_name}={group[0].x_value}",
                shape=shape,
                ms=ms,
                mem_mb=mem,
                host_bound=host,
                speedup=ratio(peer_ms[best_peer], our_ms) if best_peer else math.nan,
                best_peer=best_peer,
                mem_ratio=ratio(min(peer_mem), our_mem) if peer_mem else math.nan,
                pct_copy_bw=our.pct_copy_bw if our else math.nan,
                tflops=our.tflops if our else math.nan,
            )
        )
    return out


def _fmt(v: float, spec: str) -> str:
    return format(v, spec) if math.isfinite(v) else "—"


def _cell(s: SummaryRow, provider: str) -> str:
    if provider not in s.ms:
        return ""
    mark = HOST_MARK if s.host_bound[provider] else ""
    return f"{_fmt(s.ms[provider], '.3f')}{mark} / {_fmt(s.mem_mb[provider], '.0f')}"


def _has_tflops(summary: Sequence[SummaryRow]) -> bool:
    return any(math.isfinite(s.tflops) for s in summary)


def _providers(summary: Sequence[SummaryRow]) -> list[str]:
    seen: dict[str, None] = {}
    for s in summary:
        seen.update(dict.fromkeys(s.ms))
    return list(seen)


def print_summary(rows: Sequence[BenchRow], console=None) -> None:
    """Rich tables, one per (op, mode): p50 ms / peak MB per provider and the ratios."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    summary = summarize(rows)
    interp = any(r.timing == "interpreter" for r in rows)
    errors = [r for r in rows if r.error]
    for (op, mode), group in _groups(summary, "op", "mode").items():
        providers = _providers(group)
        title = f"{op} · {mode} · p50 ms / peak MB"
        if interp:
            title += "  [interpreter timings: not speeds]"
        table = Table(title=title, title_justify="left")
        table.add_column("x")
        table.add_column("shape")
        for p in providers:
            table.add_column(p, justify="right")
        table.add_column("speedup", justify="right")
        table.add_column("mem ratio", justify="right")
        table.add_column("%copy-bw", justify="right")
        flops = _has_tflops(group)
        if flops:
            table.add_column("TFLOP/s", justify="right")
        for s in group:
            cells = [_cell(s, p) for p in providers]
            win = s.speedup >= 1.0 if math.isfinite(s.speedup) else None
            colour = {True: "green", False: "red", None: "white"}[win]
            speed = f"[{colour}]{_fmt(s.speedup, '.2f')}[/]" + (
                f" vs {s.best_peer}" if s.best_peer else ""
            )
            extra = [_fmt(s.tflops, ".1f")] if flops else []
            table.add_row(
                s.x,
                s.shape,
                *cells,
                speed,
                _fmt(s.mem_ratio, ".2f"),
                _fmt(s.pct_copy_bw, ".0f"),
                *extra,
            )
        console.print(table)
    if any(r.host_bound for r in rows):
        console.print(HOST_NOTE)
    if errors:
        console.print(f"[yellow]{len(errors)} row(s) with errors (see the CSV's error column):")
        for text in sorted({f"{r.op}/{r.provider}: {r.error}" for r in errors})[:10]:
            console.print(f"  {text}")


def summary_markdown(rows: Sequence[BenchRow]) -> str:
    """The summary as Markdown tables (for the README), one per (op, mode)."""
    summary = summarize(rows)
    first = rows[0] if rows else None
    lines = []
    if first is not None:
        lines.append(
            f"{first.gpu}, {first.dtype}, torch {first.torch}, triton {first.triton}, "
            f"commit {first.commit}; median ms / peak MB. speedup = best of "
            f"({', '.join(PEERS)}) / {OURS}; mem ratio likewise for peak memory."
        )
        lines.append("")
        if first.timing == "interpreter":
            lines += ["**Interpreter timings, not speeds**: Triton's interpreter on the CPU "
                      "runs every program one after another; these rows only show that the "
                      "harness works.", ""]  # fmt: skip
    for (op, mode), group in _groups(summary, "op", "mode").items():
        providers = _providers(group)
        lines.append(f"**{op} · {mode}**")
        lines.append("")
        flops = _has_tflops(group)
        head = ["shape", *providers, "speedup", "mem ratio", "%copy-bw"]
        head += ["TFLOP/s"] if flops else []
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for s in group:
            cells = [_cell(s, p) for p in providers]
            row = [s.shape, *cells, _fmt(s.speedup, ".2f"), _fmt(s.mem_ratio, ".2f")]
            row.append(_fmt(s.pct_copy_bw, ".0f"))
            row += [_fmt(s.tflops, ".1f")] if flops else []
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    if any(r.host_bound for r in rows):
        lines += [HOST_NOTE, ""]
    return "\n".join(lines)
