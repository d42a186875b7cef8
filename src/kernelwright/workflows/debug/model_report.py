"""What `kernelwright debug MODEL` writes beside its profile: `error_growth.png` (every module
call's error in order, with the tolerances and the first divergence) and `report.md`."""

from __future__ import annotations

import math
from pathlib import Path

from kernelwright.profiles.debug import ModelDebugProfile


def plot_growth(profile: ModelDebugProfile, path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        profile.notes.append("matplotlib is not installed: no error_growth.png")
        return None
    floor = 1e-12

    def curve(values: list[tuple[int, float | None]]) -> tuple[list[int], list[float]]:
        kept = [(i, v) for i, v in values if v is not None]
        return [i for i, _ in kept], [max(v, floor) if math.isfinite(v) else 1e3 for _, v in kept]

    fig, ax = plt.subplots(figsize=(11, 4.5))
    mods = profile.modules
    lines = [
        ("output", [(m.index, m.forward_error) for m in mods], "-"),
        ("gradient of the output", [(m.index, m.grad_error) for m in mods], "-"),
    ]
    if any(m.fp32 is not None for m in mods):
        lines += [
            ("output vs fp32", [(m.index, m.fp32 and m.fp32.forward) for m in mods], "-"),
            (f"unpatched {profile.dtype} output vs fp32",
             [(m.index, m.fp32 and m.fp32.forward_unpatched) for m in mods], "--"),
        ]  # fmt: skip
    for label, values, style in lines:
        xs, ys = curve(values)
        ax.plot(xs, ys, style, marker=".", linewidth=1, label=label)
    ax.axhline(profile.tolerance.fwd, color="C0", linestyle=":", label="forward tolerance")
    ax.axhline(profile.tolerance.bwd, color="C1", linestyle=":", label="gradient tolerance")
    d = profile.divergence
    if d is not None:
        hit = next((m.index for m in mods if m.name == d.module), None)
        if hit is not None:
            ax.axvline(hit, color="red", linewidth=1, label=f"first divergence: {d.module}")
    layers = [m for m in mods if m.name.count(".") == 2 and ".layers." in m.name]
    ax.set_xticks([m.index for m in layers], [f"layer {m.name.split('.')[-1]}" for m in layers])
    ax.set_xlabel("module calls in the order they finish (ticks: where each decoder layer ends)")
    ax.set_yscale("log")
    ax.set_ylabel(f"relative-norm error vs the reference (0 drawn at {floor:g})")
    ax.set_title(f"{profile.architecture} {profile.dtype}: patched vs unpatched, per module")
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _fmt(e: float | None) -> str:
    return "-" if e is None else f"{e:.2e}"


def write_model_report(profile: ModelDebugProfile, ws: Path) -> Path:
    d = profile.divergence
    t = profile.tolerance
    two = profile.loss_fp32 is not None
    losses = f"reference {profile.loss_reference:.6f}, patched {profile.loss_patched:.6f}"
    if two:
        losses += f", unpatched in fp32 {profile.loss_fp32:.6f}"
    lines = [
        f"# debug {profile.target}",
        "",
        f"{profile.architecture} ({profile.model_type}), {profile.dtype}, batch {profile.batch} "
        f"x {profile.seq} tokens, seed {profile.seed}, on {profile.device}: the patched model "
        f"against the same model unpatched. Loss: {losses}.",
        "",
        f"Weights: {'loaded from ' + profile.weights if profile.weights else 'initialised'}.",
        "",
        f"Patched modules: {', '.join(profile.patched) or 'none'}.",
        "",
    ]
    if two:
        twice = ""
        if profile.fp32_base_factor != 1.0:
            twice = (f", x{profile.fp32_base_factor:g}: Triton's interpreter truncates casts to "
                     f"{profile.dtype} where a GPU rounds to nearest")  # fmt: skip
        lines += [
            f"Two views: against the unpatched model in {profile.dtype} (within the tolerance), "
            "and against it in fp32 (within the tolerance plus the unpatched "
            f"{profile.dtype} model's own error there{twice}). The verdict is the "
            f"{'fp32' if profile.reference_dtype == 'float32' else profile.dtype} view's "
            "(`--reference-dtype`).",
            "",
        ]
        for view, label in (("same", profile.dtype), ("float32", "fp32")):
            v = profile.divergences.get(view)
            verdict = "no divergence" if v is None else f"diverged ({v.pass_name}) at {v.module}"
            lines.append(f"- against {label}: {verdict}")
        lines.append("")
    if d is None:
        lines += [
            f"**No divergence**: every module's output within {t.fwd:g} and every gradient "
            f"within {t.bwd:g} (relative-norm error, {profile.tolerance_source})"
            + (" on top of the unpatched model's own error against fp32" if two and
               profile.reference_dtype == "float32" else "") + ".",
            "",
        ]  # fmt: skip
    else:
        lines += [f"**Diverged ({d.pass_name}) at {d.module}.** {d.summary}.", ""]
        lines += [
            "Next: bisect the op behind it with `kernelwright debug OP` (forward vs each "
            "gradient, dtype, shapes, layouts, values, launch configs).",
            "",
        ]
    if profile.plot:
        lines += [f"![per-module error]({profile.plot})", ""]
    head = "| # | module | class | patched | output | output grad | input grad |"
    rule = "|---|---|---|---|---|---|---|"
    if two:
        head += " output vs fp32 | unpatched vs fp32 | input grad vs fp32 | unpatched |"
        rule += "---|---|---|---|"
    lines += [head, rule]
    for m in profile.modules:
        row = (
            f"| {m.index} | {m.name} | {m.cls} | {'yes' if m.patched else ''} | "
            f"{_fmt(m.forward_error)} | {_fmt(m.grad_error)} | {_fmt(m.input_grad_error)} |"
        )
        if two:
            v = m.fp32
            row += (
                f" {_fmt(v and v.forward)} | {_fmt(v and v.forward_unpatched)} | "
                f"{_fmt(v and v.input_grad)} | {_fmt(v and v.input_grad_unpatched)} |"
            )
        lines.append(row)
    bad = [q for q in profile.params if not q.ok]
    lines += ["", f"Parameter gradients: {len(profile.params) - len(bad)} of "
              f"{len(profile.params)} within their bound."]  # fmt: skip
    lines += [f"- {q.name}: {q.error:.3g}" + (f" (vs fp32 {q.fp32_error:.3g}, unpatched "
              f"{_fmt(q.fp32_unpatched_error)})" if q.fp32_error is not None else "")
              for q in bad]  # fmt: skip
    lines += [f"- note: {n}" for n in profile.notes]
    path = ws / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
