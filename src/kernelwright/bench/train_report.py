"""The training-step benchmark's results (benchmarks/train_step.py): the ratios between
providers and the first-step loss guard, the console table, the CSV and the plot."""

from __future__ import annotations

import csv
import math
from pathlib import Path


def compare(rows: list[dict], *, atol: float, rtol: float) -> list[str]:
    """Ratios against hf and liger, and the first-step loss check; returns warning lines."""
    warnings = []
    for model in dict.fromkeys(r["model"] for r in rows):
        group = {r["provider"]: r for r in rows if r["model"] == model and not r.get("error")}
        ref = group.get("hf") or next(iter(group.values()), None)
        for r in group.values():
            for peer in ("hf", "liger"):
                p = group.get(peer)
                if p is None:
                    continue
                r[f"speedup_vs_{peer}"] = r["tokens_per_s"] / p["tokens_per_s"]
                if p["peak_mem_mib"] > 0:  # NaN on CPU compares False: ratio stays empty
                    r[f"mem_ratio_vs_{peer}"] = r["peak_mem_mib"] / p["peak_mem_mib"]
            diff = abs(r["loss_first"] - ref["loss_first"])
            r["loss_diff_vs_ref"] = diff
            r["loss_ok"] = diff <= atol + rtol * abs(ref["loss_first"])
            if not r["loss_ok"]:
                warnings.append(
                    f"WARNING {model}/{r['provider']}: first-step loss {r['loss_first']:.5f} "
                    f"differs from {ref['provider']}'s {ref['loss_first']:.5f} by {diff:.2e} "
                    f"(> {atol} + {rtol} x ref): its speed and memory are "
                    "not comparable until the patch is fixed"
                )
    return warnings


def fmt(v, spec: str) -> str:
    if v is None or v == "" or (isinstance(v, float) and math.isnan(v)):
        width = spec.split(".")[0]
        return format("-", f">{width}") if width else "-"
    return format(v, spec)


def print_table(rows: list[dict]) -> None:
    head = (
        f"{'model':22} {'provider':13} {'batch':>5} {'ms/step':>9} {'tokens/s':>10} "
        f"{'peak MiB':>9} {'1st MiB':>9} {'x hf':>6} {'mem/hf':>6} {'loss0':>9}  notes"
    )
    print("\n" + head + "\n" + "-" * len(head))
    for r in rows:
        if r.get("error"):
            print(f"{r['model']:22} {r['provider']:13} {r['batch']:>5}  error: {r['error']}")
            continue
        flag = "" if r.get("loss_ok", True) else " ! LOSS MISMATCH"
        print(
            f"{r['model']:22} {r['provider']:13} {r['batch']:>5} {fmt(r['ms_per_step'], '9.1f')} "
            f"{fmt(r['tokens_per_s'], '10.0f')} {fmt(r['peak_mem_mib'], '9.0f')} "
            f"{fmt(r.get('peak_mem_first_step_mib'), '9.0f')} "
            f"{fmt(r.get('speedup_vs_hf'), '6.2f')} {fmt(r.get('mem_ratio_vs_hf'), '6.2f')} "
            f"{fmt(r['loss_first'], '9.5f')}{flag}  {r.get('notes', '')}"
        )
    print("(peak MiB: max allocated over the timed steps; 1st MiB: over the first step)")


def write_csv(path: Path, rows: list[dict], columns) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({c: _csv_value(r.get(c, "")) for c in columns})
    return path


def _csv_value(v):
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.6g}"
    return v


def write_plot(path: Path, rows: list[dict]) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(2, len(models), figsize=(4.2 * len(models), 6.5), squeeze=False)
    for j, model in enumerate(models):
        group = [r for r in rows if r["model"] == model]
        names = [r["provider"] for r in group]
        for i, (key, label, scale) in enumerate(
            (("tokens_per_s", "tokens/s", 1.0), ("peak_mem_mib", "peak memory (GiB)", 1 / 1024))
        ):
            ax = axes[i][j]
            vals = [
                0.0 if r.get("error") or not _finite(r.get(key)) else r[key] * scale for r in group
            ]
            bars = ax.bar(names, vals, color=[_COLORS.get(n, "grey") for n in names])
            for b, r in zip(bars, group, strict=True):
                text = "error" if r.get("error") else ""
                ratio = r.get("speedup_vs_hf" if i == 0 else "mem_ratio_vs_hf")
                if not text and _finite(ratio):
                    text = f"{ratio:.2f}x"
                if not text and not r.get("loss_ok", True):
                    text = "loss!"
                xy = (b.get_x() + b.get_width() / 2, b.get_height())
                ax.annotate(text, xy, ha="center", va="bottom", fontsize=8)
            ax.set_ylabel(label)
            if i == 0:
                b = group[0]["batch"] if group else "?"
                ax.set_title(f"{model}\nbatch {b} x seq {group[0]['seq'] if group else '?'}")
    gpu = rows[0].get("gpu", "") if rows else ""
    fig.suptitle(f"training step (fwd+bwd+AdamW), bf16 — {gpu}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


_COLORS = {"hf": "#999999", "kernelwright": "#1f77b4", "liger": "#ff7f0e"}


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)
