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
    <p>+compile   any of the above, then `torch.compile(model)` (hf+compile, ...)
    kw.compile    the unpatched model under `kernelwright.compile(model)`: the registry's graph
                  pass picks the kernels (no per-model code); its notes count the sites replaced

Compile time lands in `warmup_s` (the first steps compile). `--process-per-provider` runs each
provider in its own process (this script again, one provider each) and merges the rows, so that
one provider's compiled graphs, caches and allocator state cannot touch the next one's.

Batch: `--batch auto` (default) takes the largest candidate batch at which the UNPATCHED model's
step fits on the GPU and runs every provider at that same batch (side by side);
`--batch-per-provider` also searches each provider's own largest batch (a second table and
train_step_max_batch.csv).

Memory: `peak_mem_mib` is torch.cuda.max_memory_allocated over the timed steps (reset after
warm-up: the steady state, weights + gradients + AdamW state + activations) and is what the
table, the ratios and the plot use; `peak_mem_first_step_mib` covers the first step alone, where
AdamW allocates its state. Both count everything allocated, not an increment.

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
from dataclasses import dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
try:
    import kernelwright  # noqa: F401  (selects Triton's interpreter on CPU-only machines)
except ImportError:  # run from a checkout without `pip install -e .` (the GPU machine)
    sys.path.insert(0, str(ROOT / "src"))
    import kernelwright  # noqa: F401

from kernelwright.bench.context import package_version  # noqa: E402
from kernelwright.bench.models import BY_NAME, ModelConfig  # noqa: E402

MIB = 2**20


# --------------------------------------------------------------------------- model registry


@dataclass(frozen=True)
class Shape:
    model_type: str  # transformers' model_type
    hidden: int
    intermediate: int  # dense MLP inner size (MoE: the expert inner size, see extra)
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    layers: int
    rope_theta: float
    extra: dict = field(default_factory=dict)  # any other config keys, as transformers names them


def _cut(model_type: str, m: ModelConfig, layers: int, rope_theta: float, extra: dict) -> Shape:
    """A model of the shared registry (kernelwright.bench.models) cut to `layers` layers."""
    dims = (m.hidden, m.intermediate, m.heads, m.kv_heads, m.head_dim, m.vocab)
    return Shape(model_type, *dims, layers, rope_theta, extra)


# Real models' dims (the dense ones from the shared registry of config.json values; Qwen3-MoE,
# which the op sweeps do not use, here) cut to a few decoder layers, and tiny ones for
# the CPU smoke test (the interpreter runs our kernels there: hidden <= 64, vocab <= 256).
_DEEPSEEK3 = {"first_k_dense_replace": 1, "q_lora_rank": None, "qk_nope_head_dim": 128,
              "qk_rope_head_dim": 64, "v_head_dim": 128, "n_group": 1, "topk_group": 1,
              "norm_topk_prob": True}  # fmt: skip
_GEMMA2_CAPS = {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}
# fmt: off
MODELS: dict[str, Shape] = {
    #                     type         hidden inter  heads kv  hd   vocab   L  rope_theta
    "llama3-8b-4l":  _cut("llama", BY_NAME["Llama-3-8B"], 4, 500000.0,
                          {"rms_norm_eps": 1e-5, "max_position_embeddings": 8192}),
    "gemma2-9b-4l":  _cut("gemma2", BY_NAME["Gemma-2-9B"], 4, 10000.0,
                          {**_GEMMA2_CAPS, "query_pre_attn_scalar": 256, "sliding_window": 4096}),
    "qwen3-8b-4l":   Shape("qwen3",      4096, 12288, 32,  8,   128, 151936, 4, 1000000.0,
                           {"rms_norm_eps": 1e-6, "max_position_embeddings": 40960}),
    "qwen3moe-30b-a3b-4l": Shape("qwen3_moe", 2048, 6144, 32, 4, 128, 151936, 4, 1000000.0,
                           {"moe_intermediate_size": 768, "num_experts": 128,
                            "num_experts_per_tok": 8, "norm_topk_prob": True}),
    # Moonlight-16B-A3B: the DeepSeek-V3 architecture (MLA, shared experts, grouped routing)
    "moonlight-16b-a3b-4l": Shape("deepseek_v3", 2048, 11264, 16, 16, 64, 163840, 4, 50000.0,
                           _DEEPSEEK3 | {"moe_intermediate_size": 1408, "n_routed_experts": 64,
                            "num_experts_per_tok": 6, "n_shared_experts": 2,
                            "kv_lora_rank": 512, "routed_scaling_factor": 2.446}),
    "tiny-llama":    Shape("llama",       64,   128,  4,   2,   16,    256, 2, 500000.0),
    "tiny-gemma2":   Shape("gemma2",      64,   128,  4,   2,   16,    256, 2, 10000.0,
                           {**_GEMMA2_CAPS, "query_pre_attn_scalar": 16, "sliding_window": 8}),
    "tiny-deepseek3": Shape("deepseek_v3", 64, 128, 4,   4,   16,    256, 2, 50000.0,
                           _DEEPSEEK3 | {"moe_intermediate_size": 32, "n_routed_experts": 4,
                            "num_experts_per_tok": 2, "n_shared_experts": 1,
                            "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 16,
                            "v_head_dim": 16, "routed_scaling_factor": 2.5}),
    "tiny-qwen3moe": Shape("qwen3_moe",   64,   128,  4,   2,   16,    256, 2, 1000000.0,
                           {"moe_intermediate_size": 32, "num_experts": 4,
                            "num_experts_per_tok": 2, "norm_topk_prob": True}),
}
# fmt: on
FULL_MODELS = ("llama3-8b-4l", "gemma2-9b-4l", "qwen3moe-30b-a3b-4l")

# Liger's per-architecture entry points (present in Liger 0.8.x's liger_kernel.transformers).
LIGER_APPLY = {
    "llama": "apply_liger_kernel_to_llama",
    "gemma2": "apply_liger_kernel_to_gemma2",
    "qwen3": "apply_liger_kernel_to_qwen3",
    "deepseek_v3": "apply_liger_kernel_to_deepseek_v3",
    "qwen3_moe": "apply_liger_kernel_to_qwen3_moe",
}
# "+compile": the provider's model under torch.compile; "kw.compile": the unpatched model under
# kernelwright.compile (the registry's graph pass chooses the kernels, no per-model code).
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
    "device", "experts_impl", "notes", "losses",
)  # fmt: skip
MAX_BATCH_COLUMNS = (
    "model", "provider", "seq", "max_batch", "tried", "ms_per_step", "tokens_per_s",
    "peak_mem_mib", "gpu", "error",
)  # fmt: skip


def build_config(shape: Shape, *, layers: int | None, seq: int):
    from transformers import AutoConfig

    kw = dict(
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        vocab_size=shape.vocab,
        num_hidden_layers=layers or shape.layers,
        rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta},
        use_cache=False,
    )
    kw.update(shape.extra)
    # the rotary tables must cover the sequence
    kw["max_position_embeddings"] = max(kw.get("max_position_embeddings", 0), seq)
    return AutoConfig.for_model(shape.model_type, **kw)


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
        return kernelwright.compile(model, report=report), "kernelwright.compile", report
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
        except ImportError as e:
            dep = getattr(e, "name", None) or ""
            if isinstance(e, ModuleNotFoundError) and dep and not dep.startswith("kernelwright"):
                why = f"it needs {dep!r}, not installed here (pip install it, or carry its wheel)"
            else:
                why = f"{e}; the autopatch patcher must be in this checkout"
            raise ProviderUnavailable(f"kernelwright.patch is not importable: {why}") from e
        profile = patch(model)
        notes = ""
        unsupported = getattr(profile, "unsupported", None)
        if callable(unsupported):
            left = [what for what, _ in unsupported()]
            notes = "unsupported: " + "; ".join(left) if left else "all decisions patched"
        return notes, profile
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
        fn(model=model)  # its defaults: rope, rms_norm, swiglu/geglu, fused linear CE
        return fn_name, None
    raise ValueError(f"unknown provider {provider!r}; choose from {', '.join(PROVIDERS)}")


class ProviderUnavailable(RuntimeError):
    """The provider cannot run here (not installed, no GPU); its row records why."""


# --------------------------------------------------------------------------- one run


def build(shape: Shape, args, device: torch.device, provider: str):
    from transformers import AutoModelForCausalLM

    config = build_config(shape, layers=args.layers, seq=args.seq)
    kw = {}
    if args.experts_impl and shape.extra.get("num_experts"):
        kw["experts_implementation"] = args.experts_impl
    torch.manual_seed(args.seed)  # identical random init for every provider
    with device:
        model = AutoModelForCausalLM.from_config(
            config, dtype=torch.bfloat16, attn_implementation="sdpa", **kw
        )
    model.config.use_cache = False
    model.train()
    model, notes, profile = apply_provider(provider, model, shape, device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=device.type == "cuda")
    return model, opt, notes, profile


def make_batch(vocab: int, batch: int, seq: int, seed: int, device: torch.device):
    g = torch.Generator().manual_seed(seed + 1)  # drawn on the CPU: the same on every device
    return torch.randint(0, vocab, (batch, seq), generator=g).to(device)


def train_step(model, opt, ids) -> torch.Tensor:
    # labels = input_ids: the causal-LM forward shifts them. Only the loss is kept (as a
    # trainer does), so HF's logits are freed once its loss is computed.
    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
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
    model = opt = ids = None
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
            ids = make_batch(shape.vocab, batch, args.seq, args.seed, device)

            losses, times = [], []
            for i in range(args.warmup + args.steps):
                if device.type == "cuda" and i in (0, args.warmup):
                    # step 0 alone (AdamW allocates its state there), then the steady state
                    torch.cuda.reset_peak_memory_stats()
                t = time.perf_counter()
                loss = train_step(model, opt, ids)
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
        del model, opt, ids
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
                ids = make_batch(shape.vocab, b, args.seq, args.seed, device)
                ok = False
                try:
                    torch.cuda.reset_peak_memory_stats()
                    train_step(model, opt, ids)
                    sync(device)
                    t = time.perf_counter()
                    train_step(model, opt, ids)
                    sync(device)
                    dt = time.perf_counter() - t
                    ok = True
                except torch.OutOfMemoryError:
                    pass
                del ids
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


def compare(rows: list[dict], args) -> list[str]:
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
            r["loss_ok"] = diff <= args.loss_atol + args.loss_rtol * abs(ref["loss_first"])
            if not r["loss_ok"]:
                warnings.append(
                    f"WARNING {model}/{r['provider']}: first-step loss {r['loss_first']:.5f} "
                    f"differs from {ref['provider']}'s {ref['loss_first']:.5f} by {diff:.2e} "
                    f"(> {args.loss_atol} + {args.loss_rtol} x ref): its speed and memory are "
                    "not comparable until the patch is fixed"
                )
    return warnings


def _fmt(v, spec: str) -> str:
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
            f"{r['model']:22} {r['provider']:13} {r['batch']:>5} {_fmt(r['ms_per_step'], '9.1f')} "
            f"{_fmt(r['tokens_per_s'], '10.0f')} {_fmt(r['peak_mem_mib'], '9.0f')} "
            f"{_fmt(r.get('peak_mem_first_step_mib'), '9.0f')} "
            f"{_fmt(r.get('speedup_vs_hf'), '6.2f')} {_fmt(r.get('mem_ratio_vs_hf'), '6.2f')} "
            f"{_fmt(r['loss_first'], '9.5f')}{flag}  {r.get('notes', '')}"
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
        help="run each provider in its own process (needs an explicit --batch)",
    )
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        p.error("--steps must be >= 1 and --warmup >= 0")
    if args.process_per_provider and (args.batch == "auto" or args.batch_per_provider):
        p.error("--process-per-provider needs an explicit --batch (and no --batch-per-provider)")
    return args


def run_in_subprocess(name: str, provider: str, batch: int, argv, out: Path) -> dict:
    """One provider's row, measured by this script in a fresh process."""
    sub = out / f"_{name}_{provider}"
    rest = list(sys.argv[1:] if argv is None else argv)
    for flag in ("--model", "--providers", "--out", "--batch"):  # drop ours, set them below
        while flag in rest:
            i = rest.index(flag)
            del rest[i : i + 2]
        rest = [a for a in rest if not a.startswith(flag + "=")]
    rest = [a for a in rest if a != "--process-per-provider"]
    cmd = [sys.executable, __file__, "--model", name, "--providers", provider]
    cmd += ["--batch", str(batch), "--out", str(sub), "--no-plot", *rest]
    print(f"  {name}/{provider}: own process", flush=True)
    done = subprocess.run(cmd, check=False)
    path = sub / "train_step.csv"
    if done.returncode != 0 or not path.exists():
        err = f"its process exited with {done.returncode}"
        return {"model": name, "provider": provider, "batch": batch, "error": err}
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
                peak = _fmt(row["peak_mem_mib"], ".0f")
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

    warnings = compare(rows, args)
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
                f"{_fmt(r.get('tokens_per_s'), '.0f')} tokens/s, "
                f"peak {_fmt(r.get('peak_mem_mib'), '.0f')} MiB (one step)"
            )
            print(f"  {r['model']:22} {r['provider']:13} {r['max_batch']:>4}  {tail}")
        print(f"wrote {mpath}")
    if not args.no_plot:
        print(f"wrote {write_plot(out / 'train_step.png', rows)}")
    return rows


if __name__ == "__main__":
    main()
