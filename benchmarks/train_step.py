"""End-to-end training-step benchmark: unpatched Hugging Face vs kernelwright vs Liger.

For each model shape and provider, in ONE process and one provider after another, builds the
model from its config straight on the device in bf16 (same seed, same weights for all
providers), runs AdamW training steps on a fixed random batch, and records tokens/s, peak
memory and the per-step loss:

    python3 benchmarks/train_step.py --model llama3-8b-4l --providers hf,kernelwright,liger \
        --out DIR

Providers:
    hf            the model as transformers builds it (attn_implementation="sdpa")
    kernelwright  `kernelwright.patch(model)`: analyse the model, patch it from the profile
    liger         Liger Kernel's `apply_liger_kernel_to_<model>(model=model)`, its defaults
                  (`notes` lists names it set that the modeling module lacks: no effect)
    <p>+compile   any of the above, then `torch.compile(model)` (hf+compile, ...)
    kw.compile    the unpatched model under `kernelwright.compile(model,
                  logits="drop_with_labels")`: the registry's graph pass picks the kernels (no
                  per-model code); called with labels, the model returns logits=None (the step
                  reads only the loss), so its lm-head + loss is fused linear cross-entropy as
                  patch's is; its notes count the sites replaced and say what became of the logits

Compile time lands in `warmup_s` (the first steps compile). `--process-per-provider` runs each
provider in its own process (this script again, one provider each) and merges the rows, so that
one provider's compiled graphs, caches and allocator state cannot touch the next one's; with
`--batch auto` the batch search gets its own process too.

Batch: `--batch auto` (default) takes the largest candidate batch at which the UNPATCHED model's
step fits on the GPU and runs every provider at that same batch (side by side);
`--batch-per-provider` also searches each provider's own largest batch (a second table and
train_step_max_batch.csv).

Memory: `peak_mem_mib` is torch.cuda.max_memory_allocated over the timed steps (reset after
warm-up: the steady state, weights + gradients + AdamW state + activations) and is what the
table, the ratios and the plot use; `peak_mem_first_step_mib` covers the first step alone, where
AdamW allocates its state. Both count everything allocated, not an increment.

Vision-language shapes (qwen2.5-vl-7b-4l: Qwen2.5-VL-7B's 4 first text layers and 4 of its 32
vision blocks; tiny-qwen2.5-vl) train the whole model, vision tower included, on samples of
`--seq` tokens holding one image each (448x448 pixels: 1024 patches, 256 placeholder tokens; the
batch is kernelwright.bench.train_models'). tokens/s and `tokens_per_step` count the decoder's
positions, batch x seq, the image's tokens included; `inputs` says what a sample holds;
`--layers` cuts the text decoder only.

Correctness guard: every provider starts from identical weights and data, so the first-step
losses must agree within bf16 tolerance (--loss-atol/--loss-rtol); a provider that disagrees is
flagged (loss_ok False, "!" in the table), since a fast wrong patch must not look good. This
catches gross errors only; the convergence tests are the real check.

Outputs in --out: train_step.csv (one row per model x provider; failed providers get a row with
`error` set), train_step.png (tokens/s and peak memory bars), kernelwright profiles as YAML, and
train_step_max_batch.csv with --batch-per-provider. Works on CPU for smoke tests (tiny-* models;
memory stats are NaN there and Liger is skipped).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import gc
import importlib
import math
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
try:
    import kernelwright  # noqa: F401  (selects Triton's interpreter on CPU-only machines)
except ImportError:  # run from a checkout without `pip install -e .` (the GPU machine)
    sys.path.insert(0, str(ROOT / "src"))
    import kernelwright  # noqa: F401

from kernelwright.bench.context import package_version  # noqa: E402
from kernelwright.bench.train_models import (  # noqa: E402
    FULL_MODELS,
    MODELS,
    Shape,
    build_config,
    describe_inputs,
    make_batch,
)
from kernelwright.bench.train_report import (  # noqa: E402
    compare,
    fmt,
    print_table,
    write_csv,
    write_plot,
)

MIB = 2**20


# --------------------------------------------------------------------------- providers and columns

# Model shapes (MODELS), their configs and batches: kernelwright.bench.train_models.
# Liger's per-architecture entry points (present in Liger 0.8.x's liger_kernel.transformers).
LIGER_APPLY = {
    "llama": "apply_liger_kernel_to_llama",
    "gemma2": "apply_liger_kernel_to_gemma2",
    "qwen3": "apply_liger_kernel_to_qwen3",
    "deepseek_v3": "apply_liger_kernel_to_deepseek_v3",
    "qwen3_moe": "apply_liger_kernel_to_qwen3_moe",
    "qwen2_5_vl": "apply_liger_kernel_to_qwen2_5_vl",
}
# "+compile": the provider's model under torch.compile; "kw.compile": the unpatched model under
# kernelwright.compile (the registry's graph pass chooses the kernels, no per-model code; the
# logits dropped from the output of a step with labels, as patch drops them).
PROVIDERS = (
    "hf", "kernelwright", "liger", "hf+compile", "kernelwright+compile", "liger+compile",
    "kw.compile",
)  # fmt: skip

COLUMNS = (
    "model", "provider", "batch", "seq", "tokens_per_step", "steps", "ms_per_step",
    "tokens_per_s", "peak_mem_mib", "peak_mem_first_step_mib", "loss_first", "loss_last",
    "speedup_vs_hf", "mem_ratio_vs_hf", "gpu", "torch", "triton", "transformers", "liger",
    "kernelwright_commit",
    # beyond the required schema
    "error", "loss_ok", "loss_diff_vs_ref", "speedup_vs_liger", "mem_ratio_vs_liger",
    "ms_p50", "peak_reserved_mib", "weights_mib", "params_m", "setup_s", "warmup_s", "warmup",
    "device", "experts_impl", "notes", "losses", "inputs",
)  # fmt: skip
MAX_BATCH_COLUMNS = (
    "model", "provider", "seq", "max_batch", "tried", "ms_per_step", "tokens_per_s",
    "peak_mem_mib", "gpu", "error",
)  # fmt: skip


# --------------------------------------------------------------------------- providers


@contextlib.contextmanager
def restored_module(module_name: str):
    """Undo module-level monkey patches made inside the block (globals and class attributes).

    Liger patches transformers' modeling module in place (its RMSNorm class, rotary function,
    causal-LM forward), which would leak into every later model of the same architecture in
    this process; restoring the module keeps each provider's run independent of the order.
    """
    mod = sys.modules[module_name]
    before = dict(vars(mod))
    classes = {
        name: dict(vars(obj))
        for name, obj in before.items()
        if isinstance(obj, type) and obj.__module__ == module_name
    }
    try:
        yield
    finally:
        for name in set(vars(mod)) - set(before):
            delattr(mod, name)
        for name, obj in before.items():
            if vars(mod).get(name) is not obj:
                setattr(mod, name, obj)
        for name, attrs in classes.items():
            cls = before[name]
            for key in set(vars(cls)) - set(attrs):
                delattr(cls, key)
            for key, value in attrs.items():
                if vars(cls).get(key) is not value:
                    setattr(cls, key, value)


def apply_provider(provider: str, model, shape: Shape, device: torch.device):
    """Patch `model` in place for `provider`; returns (model to train, notes, kernelwright
    profile or None). Compiling providers return the compiled wrapper (same parameters)."""
    if provider == "kw.compile":
        import kernelwright

        report = kernelwright.compile.CompileReport()
        compiled = kernelwright.compile(model, report=report, logits="drop_with_labels")
        return compiled, "kernelwright.compile", report
    base, compiled = provider.removesuffix("+compile"), provider.endswith("+compile")
    notes, profile = patch_provider(base, model, shape, device)
    if compiled:
        model = torch.compile(model)
        notes = f"{notes}; torch.compile" if notes else "torch.compile"
    return model, notes, profile


def patch_provider(provider: str, model, shape: Shape, device: torch.device):
    """Patch `model` in place for an eager provider; returns (notes, profile or None)."""
    if provider == "hf":
        return "", None
    if provider == "kernelwright":
        try:
            from kernelwright import patch
            from kernelwright.integrations.transformers import patch_record
        except ImportError as e:
            dep = getattr(e, "name", None) or ""
            if isinstance(e, ModuleNotFoundError) and dep and not dep.startswith("kernelwright"):
                why = f"it needs {dep!r}, not installed here (pip install it, or carry its wheel)"
            else:
                why = f"{e}; the autopatch patcher must be in this checkout"
            raise ProviderUnavailable(f"kernelwright.patch is not importable: {why}") from e
        profile = patch(model)
        record = patch_record(model)  # what was patched, by kind and class
        notes = [f"patched {record.patched()}"] if record is not None else []
        unsupported = getattr(profile, "unsupported", None)
        if callable(unsupported):
            left = [what for what, _ in unsupported()]
            notes += ["unsupported: " + "; ".join(left) if left else "all decisions patched"]
        return "; ".join(notes), profile
    if provider == "liger":
        if device.type != "cuda":
            raise ProviderUnavailable("liger needs a CUDA GPU (skipped on CPU)")
        try:
            import liger_kernel.transformers as lkt
        except ImportError as e:
            raise ProviderUnavailable(f"liger_kernel is not installed ({e})") from e
        fn_name = LIGER_APPLY.get(shape.model_type)
        fn = getattr(lkt, fn_name, None) if fn_name else None
        if fn is None:
            raise ProviderUnavailable(
                f"liger_kernel {package_version('liger-kernel')} has no "
                f"{fn_name or 'entry point'} for model_type {shape.model_type!r}"
            )
        modeling = sys.modules[type(model).__module__]
        before = set(vars(modeling))
        fn(model=model)  # its defaults: rope, rms_norm, swiglu/geglu, fused linear CE
        # a name it sets that the modeling module did not have is one no code there calls
        unused = sorted(set(vars(modeling)) - before)
        if unused:
            return f"{fn_name}; not in this modeling module (no effect): {', '.join(unused)}", None
        return fn_name, None
    raise ValueError(f"unknown provider {provider!r}; choose from {', '.join(PROVIDERS)}")


class ProviderUnavailable(RuntimeError):
    """The provider cannot run here (not installed, no GPU); its row records why."""


# --------------------------------------------------------------------------- one run


def build(shape: Shape, args, device: torch.device, provider: str):
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    config = build_config(shape, layers=args.layers, seq=args.seq)
    auto = AutoModelForCausalLM if shape.vlm is None else AutoModelForImageTextToText
    kw = {}
    if args.experts_impl and shape.extra.get("num_experts"):
        kw["experts_implementation"] = args.experts_impl
    torch.manual_seed(args.seed)  # identical random init for every provider
    with device:
        model = auto.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa", **kw)
    model.config.get_text_config().use_cache = False
    model.train()
    model, notes, profile = apply_provider(provider, model, shape, device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=device.type == "cuda")
    return model, opt, notes, profile


def _batch_kw(args, device) -> dict:
    return {"seed": args.seed, "layers": args.layers, "device": device}


def train_step(model, opt, inputs: dict) -> torch.Tensor:
    # `inputs` holds the labels. Only the loss is kept (as a trainer does), so HF's logits are
    # freed once its loss is computed.
    loss = model(**inputs, use_cache=False).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_mib(device: torch.device) -> float:
    if device.type != "cuda":
        return math.nan
    return torch.cuda.max_memory_allocated() / MIB


def run_provider(name: str, shape: Shape, provider: str, batch: int, args, device) -> dict:
    """Warm-up and timed steps of one provider; a row for the CSV."""
    row = {"model": name, "provider": provider, "batch": batch, "seq": args.seq}
    row.update(tokens_per_step=batch * args.seq, steps=args.steps, warmup=args.warmup)
    row["inputs"] = describe_inputs(shape, args.seq, args.layers)
    model = opt = inputs = None
    module_name = f"transformers.models.{shape.model_type}.modeling_{shape.model_type}"
    importlib.import_module(module_name)
    try:
        with restored_module(module_name):
            free(device)
            t0 = time.perf_counter()
            model, opt, notes, profile = build(shape, args, device, provider)
            sync(device)  # random init runs asynchronously on the GPU
            row["setup_s"] = round(time.perf_counter() - t0, 2)
            row["notes"] = notes
            row["params_m"] = round(sum(p.numel() for p in model.parameters()) / 1e6, 1)
            if shape.extra.get("num_experts"):
                row["experts_impl"] = getattr(model.config, "_experts_implementation", "")
            if profile is not None and hasattr(profile, "save"):
                profile.save(Path(args.out) / f"profile_{name}.yaml")
            row["weights_mib"] = (
                torch.cuda.memory_allocated() / MIB if device.type == "cuda" else math.nan
            )
            inputs = make_batch(shape, batch, args.seq, **_batch_kw(args, device))

            losses, times = [], []
            for i in range(args.warmup + args.steps):
                if device.type == "cuda" and i in (0, args.warmup):
                    # step 0 alone (AdamW allocates its state there), then the steady state
                    torch.cuda.reset_peak_memory_stats()
                t = time.perf_counter()
                loss = train_step(model, opt, inputs)
                sync(device)
                times.append(time.perf_counter() - t)
                losses.append(loss.item())
                if i == 0:
                    row["peak_mem_first_step_mib"] = peak_mib(device)
                if not math.isfinite(losses[-1]):
                    raise FloatingPointError(f"loss is {losses[-1]} at step {i}")
            row["warmup_s"] = sum(times[: args.warmup])  # Triton compiles and autotunes here
            if hasattr(profile, "replaced"):  # kw.compile's report: what the pass swapped in
                ops = sorted({site.op for site in profile.replaced()})
                row["notes"] = (
                    f"{profile.graphs} graph(s), {len(profile.replaced())}/{len(profile)} sites "
                    f"replaced ({', '.join(ops) or 'none'}); {len(profile.breaks)} graph break(s)"
                )
                row["notes"] += "".join(f"; {n}" for n in getattr(profile, "notes", ()))
            timed = times[args.warmup :]
            total = sum(timed)
            row["ms_per_step"] = 1e3 * total / len(timed)
            row["ms_p50"] = 1e3 * sorted(timed)[len(timed) // 2]
            row["tokens_per_s"] = batch * args.seq * len(timed) / total
            row["peak_mem_mib"] = peak_mib(device)  # since the reset at step `warmup`
            if device.type == "cuda":  # what the allocator held: fragmentation shows here
                row["peak_reserved_mib"] = torch.cuda.max_memory_reserved() / MIB
            row["loss_first"], row["loss_last"] = losses[0], losses[-1]
            row["losses"] = " ".join(f"{x:.5f}" for x in losses)
    except torch.OutOfMemoryError:
        row["error"] = f"OOM at batch {batch} (peak {peak_mib(device):.0f} MiB)"
    except ProviderUnavailable as e:
        row["error"] = str(e)
    except Exception as e:  # one provider's failure is recorded in its row; the others still run
        traceback.print_exc()
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    finally:
        del model, opt, inputs
        free(device)
    return row


# --------------------------------------------------------------------------- batch search


def max_batch(name, shape, provider, candidates, args, device) -> dict:
    """The largest candidate batch whose step (two steps: AdamW state is made in the first)
    fits on the GPU for `provider`; ascending, stopping at the first out-of-memory."""
    out = {"model": name, "provider": provider, "seq": args.seq, "max_batch": 0, "tried": ""}
    module_name = f"transformers.models.{shape.model_type}.modeling_{shape.model_type}"
    importlib.import_module(module_name)
    tried = []
    model = opt = None
    try:
        with restored_module(module_name):
            free(device)
            model, opt, _, _ = build(shape, args, device, provider)
            for b in sorted(candidates):
                inputs = make_batch(shape, b, args.seq, **_batch_kw(args, device))
                ok = False
                try:
                    torch.cuda.reset_peak_memory_stats()
                    train_step(model, opt, inputs)
                    sync(device)
                    t = time.perf_counter()
                    train_step(model, opt, inputs)
                    sync(device)
                    dt = time.perf_counter() - t
                    ok = True
                except torch.OutOfMemoryError:
                    pass
                del inputs
                # after an OOM half-made gradients and graph tensors must go before a retry
                opt.zero_grad(set_to_none=True)
                peak = peak_mib(device)
                free(device)
                tried.append(f"{b}:{'ok' if ok else 'oom'}")
                print(f"  batch search {name}/{provider}: batch {b} {'fits' if ok else 'OOM'}")
                if not ok:
                    break
                out.update(max_batch=b, ms_per_step=1e3 * dt, peak_mem_mib=peak)
                out["tokens_per_s"] = b * args.seq / dt
    except ProviderUnavailable as e:
        out["error"] = str(e)
    except Exception as e:  # recorded in the row, the run goes on
        traceback.print_exc()
        out["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    finally:
        del model, opt
        free(device)
    out["tried"] = " ".join(tried)
    if out["max_batch"] == 0 and "error" not in out:
        out["error"] = f"no candidate batch fits ({out['tried']})"
    return out


# --------------------------------------------------------------------------- results


def environment(device: torch.device) -> dict:
    import transformers
    import triton

    from kernelwright.bench.harness import git_commit  # $KERNELWRIGHT_COMMIT wins, as in bench

    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    return {
        "gpu": gpu,
        "device": device.type,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "transformers": transformers.__version__,
        "liger": package_version("liger-kernel"),
        "kernelwright_commit": git_commit(ROOT),
    }


# --------------------------------------------------------------------------- CLI


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model",
        default="llama3-8b-4l",
        help=f"comma list of {', '.join(MODELS)}, or 'all' ({', '.join(FULL_MODELS)})",
    )
    p.add_argument(
        "--providers", default="hf,kernelwright,liger", help=f"comma list of {', '.join(PROVIDERS)}"
    )
    p.add_argument("--out", default=os.environ.get("OUT", "train_step_out"))
    p.add_argument("--batch", default="auto", help="an integer, or 'auto' (largest the hf fits)")
    p.add_argument("--batch-candidates", default="1,2,4,8,16,32,64")
    p.add_argument(
        "--batch-per-provider",
        action="store_true",
        help="also search each provider's own largest batch (second table)",
    )
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--layers", type=int, default=None, help="override the registry's layers")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    p.add_argument(
        "--experts-impl",
        default=None,
        help="transformers experts_implementation for MoE models (default: its own)",
    )
    p.add_argument("--loss-atol", type=float, default=0.02)
    p.add_argument("--loss-rtol", type=float, default=2e-3)
    p.add_argument("--no-plot", action="store_true")
    p.add_argument(
        "--process-per-provider",
        action="store_true",
        help="run each provider, and the batch search, in its own process",
    )
    p.add_argument("--search-only", action="store_true", help=argparse.SUPPRESS)  # its process
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        p.error("--steps must be >= 1 and --warmup >= 0")
    if args.process_per_provider and args.batch_per_provider:
        p.error("--process-per-provider does not take --batch-per-provider")
    return args


def run_in_subprocess(name: str, provider: str, batch, argv, out: Path, search=False) -> dict:
    """One provider's row, measured by this script in a fresh process; `search`: the row of
    its batch search (--batch auto) instead."""
    sub = out / f"_{name}_{'search' if search else provider}"
    rest = list(sys.argv[1:] if argv is None else argv)
    for flag in ("--model", "--providers", "--out", "--batch"):  # drop ours, set them below
        while flag in rest:
            i = rest.index(flag)
            del rest[i : i + 2]
        rest = [a for a in rest if not a.startswith(flag + "=")]
    rest = [a for a in rest if a != "--process-per-provider"]
    cmd = [sys.executable, __file__, "--model", name, "--providers", provider]
    cmd += ["--batch", str(batch), "--out", str(sub), "--no-plot", *rest]
    cmd += ["--search-only"] if search else []
    print(
        f"  {name}/{provider}: {'batch search' if search else 'run'} in its own process", flush=True
    )
    done = subprocess.run(cmd, check=False)
    path = sub / ("train_step_max_batch.csv" if search else "train_step.csv")
    if done.returncode != 0 or not path.exists():
        row = {
            "model": name,
            "provider": provider,
            "error": f"its process exited with {done.returncode}",
        }
        return row | ({"max_batch": 0} if search else {"batch": batch})
    with path.open() as f:
        row = next(csv.DictReader(f))
    return {k: _parse(v) for k, v in row.items() if v != ""}


def _parse(v: str):
    for kind in (int, float):
        try:
            return kind(v)
        except ValueError:
            pass
    return {"True": True, "False": False}.get(v, v)


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    names = list(FULL_MODELS) if args.model == "all" else args.model.split(",")
    for n in names:
        if n not in MODELS:
            raise SystemExit(f"unknown model {n!r}; choose from {', '.join(MODELS)} or 'all'")
    providers = args.providers.split(",")
    for pr in providers:
        if pr not in PROVIDERS:
            raise SystemExit(f"unknown provider {pr!r}; choose from {', '.join(PROVIDERS)}")
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    if device.type == "cpu" and any(not n.startswith("tiny-") for n in names):
        raise SystemExit("on CPU only the tiny-* models run (the others need a GPU's memory)")
    candidates = [int(c) for c in args.batch_candidates.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = environment(device)
    print(
        f"train_step: {env['gpu']} torch {env['torch']} triton {env['triton']} "
        f"transformers {env['transformers']} liger {env['liger'] or '-'} "
        f"kernelwright {env['kernelwright_commit'] or '-'}",
        flush=True,
    )

    rows, max_rows = [], []
    for name in names:
        shape = MODELS[name]
        if args.batch != "auto":
            batch = int(args.batch)
        elif device.type != "cuda":
            batch = min(candidates)  # no out-of-memory signal on CPU: smallest candidate
        else:
            if args.process_per_provider:
                found = run_in_subprocess(name, "hf", "auto", argv, out, search=True)
            else:
                found = max_batch(name, shape, "hf", candidates, args, device)
            max_rows.append(found)
            batch = found["max_batch"]
            if not batch:
                print(f"{name}: {found.get('error')}; skipping this model", flush=True)
                err = f"batch search: {found.get('error')}"
                for pr in providers:
                    rows.append({"model": name, "provider": pr, "batch": 0, "seq": args.seq})
                    rows[-1].update(env, error=err)
                continue
            if args.search_only:
                continue
        print(f"{name}: batch {batch} x seq {args.seq}", flush=True)
        for pr in providers:
            if args.process_per_provider:
                row = run_in_subprocess(name, pr, batch, argv, out)
            else:
                row = run_provider(name, shape, pr, batch, args, device)
            row.update(env)
            rows.append(row)
            if row.get("error"):
                print(f"  {name}/{pr}: error: {row['error']}", flush=True)
            else:
                peak = fmt(row["peak_mem_mib"], ".0f")
                print(
                    f"  {name}/{pr}: {row['ms_per_step']:.1f} ms/step, "
                    f"{row['tokens_per_s']:.0f} tokens/s, peak {peak} MiB, "
                    f"loss {row['loss_first']:.5f} -> {row['loss_last']:.5f}",
                    flush=True,
                )
        if args.batch_per_provider and device.type == "cuda":
            for pr in providers:
                if pr == "hf" and args.batch == "auto":
                    continue  # searched above
                max_rows.append(max_batch(name, shape, pr, candidates, args, device))

    warnings = compare(rows, atol=args.loss_atol, rtol=args.loss_rtol)
    print_table(rows)
    for w in warnings:
        print(w)
    path = write_csv(out / "train_step.csv", rows, COLUMNS)
    print(f"wrote {path}")
    if max_rows:
        for r in max_rows:
            r.setdefault("gpu", env["gpu"])
        mpath = write_csv(out / "train_step_max_batch.csv", max_rows, MAX_BATCH_COLUMNS)
        print("\nlargest batch per provider (searched over " + args.batch_candidates + "):")
        for r in max_rows:
            tail = r.get("error") or (
                f"{fmt(r.get('tokens_per_s'), '.0f')} tokens/s, "
                f"peak {fmt(r.get('peak_mem_mib'), '.0f')} MiB (one step)"
            )
            print(f"  {r['model']:22} {r['provider']:13} {r['max_batch']:>4}  {tail}")
        print(f"wrote {mpath}")
    if not args.no_plot:
        print(f"wrote {write_plot(out / 'train_step.png', rows)}")
    return rows


if __name__ == "__main__":
    main()
