"""Planted bugs in a bf16 training run: the loss curve leaves the clean one only after some
steps; does `kernelwright debug` localise each?

A Llama-shaped model built from its config (4 layers, hidden 512, vocabulary 32000; bf16 on the
GPU) trains with AdamW (fp32 master weights) on one seeded stream of token batches (a bigram
language over `--alphabet` tokens, so that the loss falls within the run), from the same
initial weights, once per run:

- `unpatched`: the Hugging Face model as it is;
- `clean`: `kernelwright.patch`ed;
- one run per planted bug (`--bugs`, benchmarks/debug_training_bugs.py): patched, with the bug
  in force for the whole run. Each bug wraps one launcher of the library while its `with`
  lasts; nothing of it is shipped.

The clean band at step t is `--band-factor` (2) x the largest |clean - unpatched| up to step
t (+ `--window` steps ahead, 0), plus `--band-floor` (0.01 nats: a difference no loss plot
shows): how far a correct patch has wandered from the unpatched model by then. A bug's curve
leaves the band at the first step from which |bug - clean| stays above it for `--persist` (5)
steps, or to the end of the run if fewer remain.

Then, per run (clean, and each bug with the bug in force): `debug_model`, the API of
`kernelwright debug MODEL`, in the run's dtype on the run's last batch, twice: from the config
(the initial weights) and from the run's last weights (a checkpoint folder). Per bug, on the op
behind the first module it names, `kernelwright debug OP`: its plan, cut at the review
checkpoint to the run's dtype, two shapes and contiguous normal inputs (on a GPU every probe
compiles), then resumed; it writes `repro.py`, which is run with the bug (it must fail) and
without it (it must pass).

    python benchmarks/debug_training.py                       # GPU; into $OUT or
                                                              # kernelwright-runs/debug-training
    python benchmarks/debug_training.py --device cpu --tiny   # CPU smoke run (interpreter)

Writes into --out: `curves.csv` (every run's loss at every step, and the band),
`loss_curves.png`, `summary.md`, `summary.json`, `model/config.json`, and per run
`debug/<run>/initial/` and `debug/<run>/trained/` (debug MODEL's profile.yaml, report.md,
error_growth.png), per bug `debug/<bug>/op/` (debug OP's profile.yaml, report.md, repro.py).
The checkpoints are deleted at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import json
import math
import os
import runpy
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
try:
    import kernelwright  # noqa: F401  (selects the interpreter on machines without a GPU)
except ImportError:  # run from a checkout without `pip install -e .` (the GPU machine)
    sys.path.insert(0, str(ROOT / "src"))
    import kernelwright  # noqa: F401

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the planted bugs beside this file
from debug_training_bugs import OPS, PLANTED, PlantedBug  # noqa: E402

from kernelwright.runtime import default_device  # noqa: E402

DEFAULT_BUGS = ("swiglu_dgate_saturated", "cross_entropy_grad_on_ignored")

Progress = Callable[[str], None]

# --------------------------------------------------------------------------- the band


def clean_band(
    unpatched: list[float], clean: list[float], *, window: int, factor: float, floor: float
) -> list[float]:
    """Per step t: factor x max |clean - unpatched| over steps 0 .. t + window, plus floor."""
    noise = [
        abs(c - u) if math.isfinite(c - u) else math.inf
        for c, u in zip(clean, unpatched, strict=True)
    ]
    band, worst = [], 0.0
    for t in range(len(clean)):
        worst = max([worst, *noise[t : t + window + 1]])
        band.append(factor * worst + floor)
    return band


def divergence_step(
    clean: list[float], bugged: list[float], band: list[float], *, persist: int
) -> int | None:
    """The first step from which |bugged - clean| stays above the band for `persist` steps (or
    to the end of the run, if fewer remain); None if it never does. A non-finite loss is out."""
    out = [not abs(b - c) <= w for b, c, w in zip(bugged, clean, band, strict=True)]
    n = len(out)
    for t in range(n):
        if all(out[t : min(n, t + persist)]):
            return t
    return None


# --------------------------------------------------------------------------- training


def build_config(tiny: bool, args):
    from kernelwright.testing.model_configs import tiny_config

    if tiny:
        return tiny_config("llama")
    return tiny_config(
        "llama",
        size="gpu",
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64,
        num_key_value_heads=args.hidden // 128,
        head_dim=64,
        vocab_size=32000,
    )


def train(model, batches, *, lr: float, warmup: int) -> list[float]:
    """Forward and backward in the model's dtype; AdamW (betas 0.9 / 0.95, weight decay 0.1) on
    fp32 master weights, copied back after every step (a bf16 weight near 1 cannot take a step
    of 1e-3 itself); linear warm-up; gradients clipped at 1."""
    params = [p for p in model.parameters() if p.requires_grad]
    master = [p.detach().float().clone().requires_grad_(True) for p in params]
    opt = torch.optim.AdamW(master, lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    losses = []
    for step, (ids, labels) in enumerate(batches):
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / warmup)
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        for m, p in zip(master, params, strict=True):
            m.grad, p.grad = (p.grad.float() if p.grad is not None else None), None
        torch.nn.utils.clip_grad_norm_(master, 1.0)
        opt.step()
        with torch.no_grad():
            for m, p in zip(master, params, strict=True):
                p.copy_(m)
        losses.append(loss.detach().float())
    return [float(v) for v in torch.stack(losses).cpu()]  # one sync, at the end


def run_training(config, args, device, checkpoints: Path, progress: Progress):
    """Every run from the same weights on the same batches; each run's last weights are saved
    as a checkpoint (config.json + model.safetensors) under `checkpoints/<run>`. Every patched
    run takes the profile the clean run's `patch` made, on the library without a bug: the
    analyser's own numerical checks (fp32, tiny shapes) would refuse a module whose planted bug
    shows there, and a bug that slipped past them is the case in point. Returns the loss
    curves, the batches and that profile."""
    from transformers import AutoModelForCausalLM

    from kernelwright import patch
    from kernelwright.testing.convergence import make_batches

    torch.manual_seed(args.seed)
    base = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    base = base.to(device=device, dtype=getattr(torch, args.dtype))
    # make_batches draws its tokens from the first eighth of the vocabulary it is given
    data = make_batches(
        8 * args.alphabet, count=args.steps, batch=args.batch, seq=args.seq, seed=args.seed + 1
    )
    batches = [(ids.to(device), labels.to(device)) for ids, labels in data]
    runs = {"unpatched": None, "clean": contextlib.nullcontext}
    runs.update({b.name: b.plant for b in args.bugs})
    curves, profile = {}, None
    for name, plant in runs.items():
        model = copy.deepcopy(base).train()
        start = time.perf_counter()
        if plant is not None:
            profile = patch(model, profile)
        with plant() if plant else contextlib.nullcontext():
            curves[name] = train(model, batches, lr=args.lr, warmup=args.warmup)
        c = curves[name]
        progress(
            f"[train] {name}: loss {c[0]:.4f} -> {c[-1]:.4f} in {len(c)} steps, "
            f"{time.perf_counter() - start:.1f} s"
        )
        model.save_pretrained(checkpoints / name)  # the state dict: patching never changes it
        del model
    return curves, batches, profile


# --------------------------------------------------------------------------- debugging


def _class_of(profile, module: str) -> str:
    """The class of `module` in the profile (a divergence found from a parameter's gradient
    names the module, not its class)."""
    return next((m.cls for m in profile.modules if m.name == module), "")


def debug_model_run(
    bug: PlantedBug | None, target: Path, ws: Path, inputs, profile, args, progress
) -> dict:
    """debug MODEL (`target`: the config's folder, or a checkpoint) with `bug` in force, on
    `inputs` (a training batch), patching with the clean library's `profile`."""
    from kernelwright import patch
    from kernelwright.workflows.debug.model import debug_model

    name = bug.name if bug else "clean"
    start = time.perf_counter()
    with bug.plant() if bug else contextlib.nullcontext():
        result = debug_model(
            str(target),
            workspace=ws,
            dtype=args.dtype,
            seed=args.seed,
            inputs=inputs,
            name=name,
            patch_fn=lambda model: patch(model, profile),
        )
    p, d = result.profile, result.profile.divergence
    row = {
        "verdict": p.verdict,
        "weights": "trained" if p.weights else "initial",
        "seconds": round(time.perf_counter() - start, 1),
    }
    if d is not None:
        row.update(
            module=d.module,
            cls=d.cls or _class_of(p, d.module),
            pass_name=d.pass_name,
            evidence=d.evidence,
            error=d.error,
            tol=d.tol,
            view=d.view,
            summary=d.summary,
        )
        row["views"] = {v: x and f"{x.module} ({x.pass_name})" for v, x in p.divergences.items()}
    if bug is not None:
        row["localised"] = (
            d is not None
            and d.pass_name == bug.pass_name
            and bool({d.module, row["cls"]} & set(bug.modules))
        )
    found = f" at {d.module} ({row['cls']}), {d.pass_name}: {d.evidence}" if d else ""
    progress(f"[debug model] {name}, {row['weights']} weights: {p.verdict}{found}")
    return row


def debug_op_of(bug: PlantedBug, op: str, ws: Path, args, progress) -> dict:
    """`kernelwright debug OP` on `op` with the bug in force: the plan, cut at the review
    checkpoint to the run's dtype, the base and many-rows shapes and contiguous normal inputs
    (on a GPU each probe compiles), then resumed; the repro is run with and without the bug."""
    from kernelwright.profiles.debug import DebugProfile
    from kernelwright.workflows.debug import DebugOptions, debug_op

    start = time.perf_counter()
    with bug.plant():
        debug_op(DebugOptions(op, workspace=ws, name=op, seed=args.seed, force=True))
        path = ws / "profile.yaml"
        plan = DebugProfile.load(path)  # the review checkpoint: the plan, cut
        plan.cases = plan.cases[:1]
        plan.dtypes, plan.shapes, plan.layouts = [args.dtype], ["pow2", "many_rows"], ["contiguous"]
        plan.values, plan.configs = ["normal"], []
        plan.save(path)
        result = debug_op(
            DebugOptions(op, workspace=ws, name=op, seed=args.seed, resume=True, yes=True), progress
        )
        d = result.profile.divergence
        row = {"op": op, "verdict": result.profile.verdict}
        if d is not None:
            row.update(
                pass_name=d.pass_name,
                shape=d.shape,
                minimal_shape=d.minimal_shape,
                dtype=d.dtype,
                error=d.error,
                tol=d.tol,
                summary=d.summary,
                localised=op == bug.op and d.pass_name in bug.op_passes,
            )
        if result.repro is not None:
            row["repro"] = str(result.repro)
            row["repro_with_bug"] = _run_repro(result.repro)
    if result.repro is not None:
        row["repro_without_bug"] = _run_repro(result.repro)
    row["seconds"] = round(time.perf_counter() - start, 1)
    progress(
        f"[debug op] {op} with {bug.name}: {row['verdict']}"
        + (
            f", {row['pass_name']}; repro {row.get('repro_with_bug')} with the bug, "
            f"{row.get('repro_without_bug')} without"
            if d
            else ""
        )
    )
    return row


def _run_repro(path: Path) -> str:
    """The repro run as a script: "fails" (its assertion), "passes", or "broken: ..." (another
    exception)."""
    try:
        with contextlib.redirect_stdout(None):
            runpy.run_path(str(path), run_name="__main__")
    except AssertionError:
        return "fails"
    except Exception as e:  # a broken repro is a result to report, not a crash of the run
        return f"broken: {type(e).__name__}: {e}"
    return "passes"


# --------------------------------------------------------------------------- outputs


def write_csv(path: Path, curves: dict[str, list[float]], band: list[float]) -> None:
    names = list(curves)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", *names, "band"])
        for t in range(len(band)):
            w.writerow([t, *(f"{curves[n][t]:.6f}" for n in names), f"{band[t]:.6f}"])


def plot(
    path: Path,
    curves: dict[str, list[float]],
    band: list[float],
    steps: dict[str, int | None],
    title: str,
) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(10, 7.5), sharex=True, gridspec_kw={"height_ratios": [3, 2]}
    )
    x = range(len(band))
    clean = curves["clean"]
    styles = {"unpatched": ("black", "--"), "clean": ("C0", "-")}
    for i, (name, ys) in enumerate(curves.items()):
        color, style = styles.get(name, (f"C{i + 1}", "-"))
        top.plot(x, ys, style, color=color, linewidth=1.2, label=name)
        if name in steps:
            bottom.plot(
                x,
                [max(abs(a - b), 1e-6) for a, b in zip(ys, clean, strict=True)],
                color=color,
                linewidth=1,
                label=f"|{name} - clean|",
            )
            if steps[name] is not None:
                for ax in (top, bottom):
                    ax.axvline(steps[name], color=color, linestyle=":", linewidth=1.2)
                top.annotate(
                    f"leaves the band: step {steps[name]}",
                    (steps[name], ys[steps[name]]),
                    xytext=(8, 12),
                    textcoords="offset points",
                    color=color,
                    fontsize=8,
                )
    bottom.plot(
        x,
        [max(abs(a - b), 1e-6) for a, b in zip(curves["unpatched"], clean, strict=True)],
        color="black",
        linestyle="--",
        linewidth=1,
        label="|unpatched - clean|",
    )
    bottom.plot(x, band, color="grey", linewidth=1.5, label="clean band")
    bottom.set_yscale("log")
    bottom.set_xlabel("step")
    bottom.set_ylabel("|loss difference| (nats)")
    top.set_ylabel("training loss")
    top.set_title(title)
    top.legend(fontsize=8)
    bottom.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_summary(path: Path, result: dict) -> None:
    a = result["settings"]
    ahead = f" + {a['window']}" if a["window"] else ""
    lines = [
        "# Planted bugs in a bf16 training run",
        "",
        f"{a['model']}, {a['dtype']} on {a['device']}; {a['steps']} AdamW steps (fp32 master "
        f"weights) of {a['batch']} x {a['seq']} tokens from a bigram language over "
        f"{a['alphabet']} tokens, lr {a['lr']:g}; seed {a['seed']}. Clean band at step t: "
        f"{a['band_factor']:g} x max |clean - unpatched| up to step t{ahead}, plus "
        f"{a['band_floor']:g}; a curve leaves it when out for {a['persist']} steps.",
        "",
        "| run | loss at step 0 | last loss | max abs diff vs clean | leaves the band at |",
        "|---|---|---|---|---|",
    ]
    curves, clean = result["curves"], result["curves"]["clean"]
    for name, ys in curves.items():
        diff = max(abs(a - b) for a, b in zip(ys, clean, strict=True))
        step = result["divergence_steps"].get(name, "-")
        lines.append(
            f"| {name} | {ys[0]:.4f} | {ys[-1]:.4f} | {diff:.4g} | "
            f"{'never' if step is None else step} |"
        )
    if result["plot"]:
        lines += ["", f"![loss curves]({Path(result['plot']).name})"]
    lines += [
        "",
        "## kernelwright debug MODEL (one batch; the initial weights, and the run's last ones)",
        "",
        "| run | weights | verdict | module (class) | pass | evidence | localised | s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, rows in result["debug"].items():
        for row in rows["model"]:
            where = f"{row['module']} ({row['cls']})" if "module" in row else "-"
            lines.append(
                f"| {name} | {row['weights']} | {row['verdict']} | {where} | "
                f"{row.get('pass_name', '-')} | {row.get('evidence', '-')} | "
                f"{row.get('localised', '-')} | {row['seconds']} |"
            )
    ops = {n: r["op"] for n, r in result["debug"].items() if r.get("op")}
    if ops:
        lines += [
            "",
            f"## kernelwright debug OP on the op behind that module ({a['dtype']} probes)",
            "",
            "| bug | op | verdict | pass | shape -> smallest | localised | repro with "
            "the bug | without | s |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for name, r in ops.items():
            shape = f"{r['shape']} -> {r['minimal_shape']}" if "shape" in r else "-"
            lines.append(
                f"| {name} | {r['op']} | {r['verdict']} | {r.get('pass_name', '-')} | "
                f"{shape} | {r.get('localised', '-')} | {r.get('repro_with_bug', '-')} | "
                f"{r.get('repro_without_bug', '-')} | {r['seconds']} |"
            )
    lines += ["", "Bugs:", ""] + [f"- `{n}`: {PLANTED[n].what}" for n in a["bugs"]]
    lines += ["", f"Total {result['seconds']} s."]
    path.write_text("\n".join(lines) + "\n")


# --------------------------------------------------------------------------- main


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Planted bugs in a bf16 training run, and debug")
    ap.add_argument("--device", choices=["cuda", "cpu"], default=default_device().type)
    ap.add_argument("--tiny", action="store_true", help="the tiny Llama, a few steps (CPU smoke)")
    ap.add_argument("--steps", type=int, help="default 200 (tiny: 3)")
    ap.add_argument("--batch", type=int, help="default 8 (tiny: 2)")
    ap.add_argument("--seq", type=int, help="default 256 (tiny: 16)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--intermediate", type=int, default=1408)
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument(
        "--alphabet", type=int, help="tokens of the bigram language (default 512; tiny: 32)"
    )
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--bugs",
        default=",".join(DEFAULT_BUGS),
        help=f"planted bugs to run, of: {', '.join(PLANTED)}",
    )
    ap.add_argument("--band-factor", type=float, default=2.0)
    ap.add_argument("--band-floor", type=float, default=0.01)
    ap.add_argument("--window", type=int, default=0, help="steps the band looks ahead")
    ap.add_argument("--persist", type=int, default=5)
    ap.add_argument("--no-debug", action="store_true", help="the training runs only")
    ap.add_argument(
        "--out",
        type=Path,
        default=Path(os.environ.get("OUT") or "kernelwright-runs/debug-training"),
    )
    args = ap.parse_args(argv)
    tiny = dict(steps=3, batch=2, seq=16, alphabet=32)
    defaults = tiny if args.tiny else dict(steps=200, batch=8, seq=256, alphabet=512)
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    unknown = [n for n in args.bugs.split(",") if n not in PLANTED]
    if unknown:
        ap.error(f"--bugs: unknown {', '.join(unknown)}; known: {', '.join(PLANTED)}")
    args.bugs = [PLANTED[n] for n in args.bugs.split(",")]
    return args


def debug_all(args, checkpoints: Path, inputs, profile, progress: Progress) -> dict:
    """Per run (clean and each bug): debug MODEL at the initial weights and at the run's last
    ones, on the run's last batch; per bug, debug OP on the op behind the module named
    (at the trained weights when both name one)."""
    out = {}
    for bug in (None, *args.bugs):
        name = bug.name if bug else "clean"
        ws = args.out / "debug" / name
        rows = [
            debug_model_run(bug, target, ws / label, inputs, profile, args, progress)
            for label, target in (("initial", args.out / "model"), ("trained", checkpoints / name))
        ]
        out[name] = {"model": rows}
        # the trained weights' verdict first: a dormant bug acts there, while at the initial
        # weights a small head error may first cross a tolerance downstream (a norm's weight)
        named = next((r for r in reversed(rows) if "module" in r), None)
        if bug is not None and named is not None:
            op = OPS.get(named["module"]) or OPS.get(named["cls"])
            out[name]["op"] = debug_op_of(bug, op, ws / "op", args, progress) if op else None
    return out


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    device = default_device()
    if device.type != args.device:
        raise SystemExit(
            f"--device {args.device}: kernelwright's kernels run on {device.type} "
            "here (Triton's interpreter on a machine without a GPU)"
        )
    t0 = time.monotonic()

    def progress(line: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {line}", flush=True)

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # checkpoints are written and read four times a run
    args.out.mkdir(parents=True, exist_ok=True)
    config = build_config(args.tiny, args)
    config.save_pretrained(args.out / "model")
    model = "tiny Llama" if args.tiny else f"Llama {args.layers} x {args.hidden}"
    model += f", vocabulary {config.vocab_size}"
    progress(f"[start] {model}, {args.dtype} on {device}; {args.steps} steps")
    with tempfile.TemporaryDirectory() as tmp:  # the checkpoints: not kept
        checkpoints = Path(tmp)
        curves, batches, profile = run_training(config, args, device, checkpoints, progress)
        band = clean_band(
            curves["unpatched"],
            curves["clean"],
            window=args.window,
            factor=args.band_factor,
            floor=args.band_floor,
        )
        steps = {
            b.name: divergence_step(curves["clean"], curves[b.name], band, persist=args.persist)
            for b in args.bugs
        }
        for name, step in steps.items():
            left = "never leaves the band" if step is None else f"leaves the band at step {step}"
            progress(f"[band] {name}: {left}")
        write_csv(args.out / "curves.csv", curves, band)
        title = f"{model}, {args.dtype}: training loss with planted bugs"
        png = plot(args.out / "loss_curves.png", curves, band, steps, title)
        debug = (
            {} if args.no_debug else debug_all(args, checkpoints, batches[-1], profile, progress)
        )
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    settings["bugs"] = [b.name for b in args.bugs]
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "cpu (Triton interpreter)"
    settings.update(model=model, device=gpu)
    result = {
        "settings": settings,
        "curves": curves,
        "band": band,
        "divergence_steps": steps,
        "debug": debug,
        "plot": str(png) if png else None,
        "seconds": round(time.monotonic() - t0, 1),
    }
    (args.out / "summary.json").write_text(json.dumps(result, indent=1, default=str))
    write_summary(args.out / "summary.md", result)
    progress(f"[done] {args.out / 'summary.md'}")
    return result


if __name__ == "__main__":
    main()
