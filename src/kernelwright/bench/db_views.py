"""Views of the results database: the row listing (a rich table, Markdown or CSV), the best
provider per (op, shape, mode), and the README's performance blocks.

Ratios are peer time / kernelwright time: >= 1.00 means kernelwright is faster. Rows are only
compared with rows of the same timing class — "host-incl." (the default timer: the host's
launch cost included, as a user's eager loop sees it), "gpu-only" (`--hide-host`) or "interp."
(the CPU interpreter, whose times are not speeds) — and the newest row of each provider wins.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

OURS = "kernelwright"
PEERS = ("torch_compile", "liger")  # the README's peers, as in bench.report
PEER_LABEL = {"torch_compile": "torch.compile", "liger": "Liger", "torch": "torch"}
README_MODES = ("full",)  # forward+backward: what a training step runs
_MODE_LABEL = {"forward": "fwd", "backward": "bwd", "full": "fwd+bwd"}


def timing_class(timing: str) -> str:
    if timing.startswith("cuda_events_gpu_only"):
        return "gpu-only"
    if timing.startswith("cuda_events"):
        return "host-incl."
    return "interp." if timing == "interpreter" else timing


def _fmt(v: float, spec: str) -> str:
    return format(v, spec) if isinstance(v, (int, float)) and math.isfinite(v) else "—"


def _spread(lo: float, hi: float) -> str:
    """ "0.900–1.100"; one dash when either end is missing (an error row has neither)."""
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (lo, hi)):
        return "—"
    return f"{lo:.3f}–{hi:.3f}"


def _ok(r: dict) -> bool:
    return not r["error"] and math.isfinite(r["ms_p50"])


def _ratio(num: float, den: float) -> float:
    if not (math.isfinite(num) and math.isfinite(den)) or den <= 0:
        return math.nan
    return num / den


def short_gpu(name: str) -> str:
    return name.removeprefix("NVIDIA ")


# --------------------------------------------------------------------------- the listing

LISTING = (
    # (header, how a row shows in it)
    ("run", lambda r: r["run_id"]),
    ("source", lambda r: r["source"] + (f" {r['tag']}" if r["tag"] else "")),
    ("gpu", lambda r: short_gpu(r["gpu"])),
    ("op", lambda r: r["op"]),
    ("shape", lambda r: r["shape"]),
    ("mode", lambda r: r["mode"]),
    ("dtype", lambda r: r["dtype"]),
    ("provider", lambda r: r["provider"]),
    ("ms p50", lambda r: _fmt(r["ms_p50"], ".4f")),
    ("p20–p80", lambda r: _spread(r["ms_p20"], r["ms_p80"])),
    ("GB/s", lambda r: _fmt(r["gbps"], ",.0f")),
    ("%copy", lambda r: _fmt(r["pct_copy_bw"], ".0f")),
    ("peak MB", lambda r: _fmt(r["peak_mem_mb"], ",.0f")),
    ("host ms", lambda r: _fmt(r["host_inclusive_ms"], ".4f")),
    ("CPU µs/call", lambda r: _fmt(r["cpu_us_per_call"], ".0f")),
    ("timing", lambda r: timing_class(r["timing"])),
    ("error", lambda r: r["error"]),
)


def listing(rows: Sequence[dict]) -> tuple[list[str], list[list[str]]]:
    """Headers and cells of the rows; a column empty in every row (no errors, no peak memory
    on the CPU) is left out."""
    body = [[cell(r) for _, cell in LISTING] for r in rows]
    keep = [i for i in range(len(LISTING)) if any(row[i] not in ("", "—") for row in body)]
    keep = keep if body else list(range(len(LISTING)))
    return [LISTING[i][0] for i in keep], [[row[i] for i in keep] for row in body]


def markdown_table(heads: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    def esc(text: str) -> str:
        return str(text).replace("|", "\\|")

    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


# the columns left out on a narrow terminal, in that order; the others (the row's key, its time,
# bandwidth and error note) always show in full
_YIELDING = ("source", "run", "timing", "gpu", "p20–p80", "CPU µs/call", "host ms", "peak MB",
             "dtype")  # fmt: skip


def rich_table(
    title: str, heads: Sequence[str], body: Sequence[Sequence[str]], width: int | None = None
):
    """A rich Table of the cells, fitted to `width` columns of text by leaving out the
    `_YIELDING` columns (named in the title); an `error` column becomes numbered notes below
    the table (a `rich.console.Group`), so a long message neither hides behind an ellipsis nor
    stretches its row over many lines."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    heads, body, notes = list(heads), [list(r) for r in body], []
    if "error" in heads:
        i = heads.index("error")
        for row in body:
            if row[i]:
                notes.append(row[i])
                row[i] = f"[{len(notes)}]"
    widths = [max([len(h), *(len(row[i]) for row in body)]) for i, h in enumerate(heads)]
    dropped = []
    for h in _YIELDING:
        if width is None or sum(w + 3 for w in widths) + 1 <= width:
            break
        if h in heads:
            i = heads.index(h)
            dropped.append(h)
            del heads[i], widths[i]
            for row in body:
                del row[i]
    if dropped:
        title += f" ({', '.join(dropped)} left out: a wider terminal or --csv shows them)"
    table = Table(title=title, title_justify="left")
    for h, w in zip(heads, widths, strict=True):
        numeric = h.endswith(("ms", "p50", "p80", "GB/s", "copy", "MB", "call")) or "/" in h
        table.add_column(h, justify="right" if numeric else "left", no_wrap=True, min_width=w)
    for row in body:
        table.add_row(*row)
    if not notes:
        return table
    return Group(table, *(Text(f"[{k}] {text}") for k, text in enumerate(notes, 1)))


# --------------------------------------------------------------------------- best provider


@dataclass
class Point:
    """One (gpu, dtype, op, shape, mode, timing class) and the newest ok row per provider."""

    gpu: str
    dtype: str
    op: str
    shape: str
    mode: str
    timing: str
    rows: dict[str, dict] = field(default_factory=dict)  # provider -> row

    def ms(self, provider: str) -> float:
        r = self.rows.get(provider)
        return r["ms_p50"] if r else math.nan

    @property
    def best(self) -> str:
        return min(self.rows, key=lambda p: self.rows[p]["ms_p50"]) if self.rows else ""

    def vs_ours(self, provider: str) -> float:
        return _ratio(self.ms(provider), self.ms(OURS))

    def faster_peer(self, peers: Sequence[str] = PEERS) -> str:
        have = [p for p in peers if p in self.rows]
        return min(have, key=self.ms) if have else ""


def points(rows: Sequence[dict]) -> list[Point]:
    """Group `rows` (in append order) into points; failed rows are left out."""
    out: dict[tuple, Point] = {}
    for r in rows:
        if not _ok(r):
            continue
        key = (r["gpu"], r["dtype"], r["op"], r["shape"], r["mode"], timing_class(r["timing"]))
        out.setdefault(key, Point(*key)).rows[r["provider"]] = r  # the newest row wins
    return list(out.values())


def best_table(rows: Sequence[dict]) -> tuple[list[str], list[list[str]]]:
    pts = points(rows)
    others = sorted({p for pt in pts for p in pt.rows} - {OURS})
    heads = ["gpu", "op", "shape", "mode", "dtype", "timing", "best", "best ms", f"{OURS} ms"]
    heads += [f"{p}/{OURS}" for p in others]
    body = []
    for pt in pts:
        best = pt.best
        cells = [short_gpu(pt.gpu), pt.op, pt.shape, pt.mode, pt.dtype, pt.timing, best]
        cells += [_fmt(pt.ms(best), ".4f"), _fmt(pt.ms(OURS), ".4f")]
        cells += [_fmt(pt.vs_ours(p), ".2f") for p in others]
        body.append(cells)
    return heads, body


# --------------------------------------------------------------------------- README blocks

_BLOCK = re.compile(
    r"(?P<open><!-- results:(?P<key>[\w.-]+) -->)[ \t]*\n?(?P<body>.*?)"
    r"(?P<close><!-- /results:(?P=key) -->)",
    re.S,
)


_OPENING = re.compile(r"<!-- results:(?P<key>[\w.-]+) -->")


def readme_keys(text: str) -> list[str]:
    return [m.group("key") for m in _BLOCK.finditer(text)]


def unclosed_markers(text: str) -> list[tuple[str, int]]:
    """(marker, line number) of each opening marker with no closing one after it (a block
    would not be found, or would swallow it)."""
    starts = {m.start("open") for m in _BLOCK.finditer(text)}
    return [
        (m.group(0), text.count("\n", 0, m.start()) + 1)
        for m in _OPENING.finditer(text)
        if m.start() not in starts
    ]


def gpu_matches_key(gpu: str, key: str) -> bool:
    """ "h100" matches "NVIDIA H100 80GB HBM3" but "h200" not "NVIDIA GH200"."""
    return re.search(rf"(?<![a-z0-9]){re.escape(key.lower())}(?![a-z0-9])", gpu.lower()) is not None


def _shape_order(pt: Point) -> tuple:
    r = pt.rows[OURS]
    return (r["bytes"], r["shape"])


def span(cells: Sequence[str]) -> str:
    """One README cell for several shapes: "smallest … largest"."""
    return " … ".join(cells)


def readme_block(
    rows: Sequence[dict],
    key: str,
    *,
    modes: Sequence[str] = README_MODES,
    all_shapes: bool = False,
) -> str | None:
    """The Markdown between `<!-- results:KEY -->` markers: bench rows on GPUs matching KEY,
    per (op, shape, mode) kernelwright's p50 against torch.compile's and Liger's, the faster
    peer's over ours, and the time as a user's eager loop sees it. Per op and mode, the
    smallest and the largest shape measured (`all_shapes`: every one). None: no such rows."""
    mine = [
        r
        for r in rows
        if r["source"] == "bench"
        and r["timing"].startswith("cuda_events")
        and r["mode"] in modes
        and gpu_matches_key(r["gpu"], key)
    ]
    pts = [p for p in points(mine) if OURS in p.rows]
    if not pts:
        return None
    by_key: dict[tuple, dict[str, Point]] = {}
    for p in pts:
        by_key.setdefault((p.dtype, p.op, p.shape, p.mode), {})[p.timing] = p
    groups: dict[tuple, list[dict[str, Point]]] = {}  # (dtype, op, mode) -> shapes
    for (dtype, op, _, mode), classes in by_key.items():
        groups.setdefault((dtype, op, mode), []).append(classes)
    dtypes = sorted({k[0] for k in groups})
    any_host = any("host-incl." in c for shapes in groups.values() for c in shapes)
    lines = [_readme_header(mine, dtypes, modes), ""]
    heads = ["op · mode" if not all_shapes else "op · shape · mode"]
    heads += [] if all_shapes else ["shapes (smallest … largest)"]
    heads += [f"{OURS} ms", "torch.compile ms", "Liger ms", "faster peer / kw"]
    heads += ["host-incl. peer / kw"] if any_host else []
    body = []
    for (dtype, op, mode), shapes in groups.items():
        shapes.sort(key=lambda c: _shape_order(c.get("gpu-only") or c["host-incl."]))
        if not all_shapes and len(shapes) > 2:
            shapes = [shapes[0], shapes[-1]]
        tail = _MODE_LABEL.get(mode, mode) + (f" · {dtype}" if len(dtypes) > 1 else "")
        # one row per shape (all_shapes), else one row per op and mode: "smallest … largest"
        for cols in [[c] for c in shapes] if all_shapes else [shapes]:
            mains = [c.get("gpu-only") or c["host-incl."] for c in cols]
            hosts = [c.get("host-incl.") for c in cols]

            cells = [f"{op} · {mains[0].shape} · {tail}" if all_shapes else f"{op} · {tail}"]
            if not all_shapes:
                cells.append(span([m.shape for m in mains]))
            cells.append(span([_fmt(m.ms(OURS), ".3f") for m in mains]))
            cells += [span([_fmt(m.ms(p), ".3f") for m in mains]) for p in PEERS]
            ratios = []
            for m in mains:
                peer = m.faster_peer()
                ratios.append(_fmt(m.vs_ours(peer), ".2f") + "×" if peer else "—")
            cells.append(span(ratios))
            if any_host:
                hr = []
                for h in hosts:
                    hpeer = h.faster_peer() if h is not None else ""
                    hr.append(_fmt(h.vs_ours(hpeer), ".2f") + "×" if hpeer else "—")
                cells.append(span(hr))
            body.append(cells)
    lines.append(markdown_table(heads, body))
    lines += [
        "",
        "Median ms; ratio = the faster of torch.compile and Liger over kernelwright (≥ 1.00×: "
        "kernelwright is faster)"
        + ("; host-incl.: timed as a user's eager loop sees it." if any_host else "."),
    ]
    return "\n".join(lines)


def _readme_header(rows: Sequence[dict], dtypes: Sequence[str], modes: Sequence[str]) -> str:
    def values(col: str) -> str:
        return ", ".join(sorted({str(r[col]) for r in rows if r[col]})) or "?"

    newest = max(rows, key=lambda r: r["timestamp"])
    commits = {r["commit"] for r in rows if r["commit"]}
    commit = f"commit {newest['commit'] or '?'}"
    if len(commits) > 1:
        commit = f"{len(commits)} commits, the newest {newest['commit'] or '?'}"
    first, last = min(r["timestamp"] for r in rows)[:10], newest["timestamp"][:10]
    gpu = ", ".join(sorted({short_gpu(r["gpu"]) for r in rows}))
    return (
        f"{gpu} ({values('arch')}) · {', '.join(dtypes)} · torch {values('torch')} · "
        f"triton {values('triton')} · {commit} · measured "
        f"{first if first == last else f'{first} to {last}'} · "
        "generated by `kernelwright results readme`"
    )


def update_readme(
    text: str,
    rows: Sequence[dict],
    *,
    modes: Sequence[str] = README_MODES,
    all_shapes: bool = False,
) -> tuple[str, dict[str, bool]]:
    """`text` with every `<!-- results:KEY -->` block regenerated from `rows`; a block whose
    GPU has no bench rows is left as it was. Returns (text, {key: regenerated})."""
    done: dict[str, bool] = {}

    def fill(m: re.Match) -> str:
        key = m.group("key")
        block = readme_block(rows, key, modes=modes, all_shapes=all_shapes)
        done[key] = block is not None
        if block is None:
            return m.group(0)
        return f"{m.group('open')}\n{block}\n{m.group('close')}"

    return _BLOCK.sub(fill, text), done


def regenerate_readme(path: str | Path, rows: Sequence[dict], **kwargs) -> dict[str, bool]:
    """Rewrite the results blocks of the README at `path` (see `update_readme`)."""
    path = Path(path)
    text = path.read_text()
    if unclosed := unclosed_markers(text):
        marker, line = unclosed[0]
        closing = marker.replace("<!-- results:", "<!-- /results:")
        raise ValueError(
            f"{path}:{line}: `{marker}` is not closed: put a `{closing}` line where its table ends"
        )
    if not readme_keys(text):
        raise ValueError(
            f"{path} has no results blocks: put `<!-- results:h100 -->` and "
            "`<!-- /results:h100 -->` lines (any GPU name) where a table belongs"
        )
    new, done = update_readme(text, rows, **kwargs)
    if new != text:
        path.write_text(new)
    return done
