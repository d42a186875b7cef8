"""Post-training losses on the GPU: forward+backward time and peak memory, every provider on the
same inputs in one process, one provider after another.

    python3 benchmarks/post_training.py --tokens 8192,16384 --out DIR

Losses (hidden 4096, vocabulary 128256, bf16 weights and hidden states by default):
    dpo       chosen + rejected, the reference log-probs computed from the reference model's
              hidden states and lm_head inside the step (no gradient), sigmoid loss
    grpo      groups of 8 completions, reference log-probs given, KL beta 0.04, dapo
    jsd       distillation, generalized JSD (beta 0.5) from the student's and the teacher's
              hidden states and lm_heads
    trl_head  the fused LM head TRL's DPOTrainer calls (log-probs, entropy, mean logit,
              first-argmax): TRL's function against kernelwright's in its place
    trl_head_metric  the same where the entropy is only logged (GRPO's metric): the loss is
              the log-probs alone; kernelwright with entropy_grad=False, whose backward skips
              the entropy's gradient terms
    logprobs  the primitive alone: per-token log-probs, summed; its row also reports the time
              of its matmuls measured alone (forward logits, backward recomputed logits and
              the two gradient matmuls) and at the device's peak bf16 rate
    logprobs_frozen  the same with a frozen lm_head (LoRA elsewhere): only the hidden states
              get a gradient
Each sequence starts with a prompt (a quarter of its tokens) whose labels are ignored.

Providers:
    torch         unfused PyTorch as a loss is written from its paper: the full logits,
                  log_softmax in fp32, a gather
    kernelwright  kernelwright.losses (fused_linear_logprobs / fused_linear_distill + the loss)
    kernelwright_stored  the same with fused_linear_logprobs(..., backward="stored"): the
                  forward keeps the logits ([N, V] bf16) or, with a frozen head, each token's
                  hidden-gradient row ([N, H] fp32), and the backward does not recompute them
                  (log-prob losses only: logprobs, logprobs_frozen, dpo, grpo)
    liger         Liger Kernel's chunked loss (LigerFusedLinear{DPO,GRPO,JSD}Loss), its defaults
    trl           TRL's chunked log-prob function (trl.kernels.ChunkedLogProbFunction; for jsd,
                  ChunkedDivergenceFunction) with the same loss formula as kernelwright

Timing: `ms` is CUDA-event time of one forward+backward (median of --reps after --warmup);
`wall_ms` is the host's wall clock of the same step with a synchronize (what an eager loop
sees). `peak_mib` is torch.cuda.max_memory_allocated during a step minus what was allocated
before it (the inputs); `work_mib` is that minus the gradients every provider must return
(hidden's and the lm_head weight's: 1 GiB of it is the bf16 [128256, 4096] weight gradient).
`value` is the loss (every provider must agree with the unfused one: `loss_ok`).

Outputs in --out: post_training.csv (every field), post_training.md (the table),
post_training.png (time and memory per loss and provider) and post_training_bench.csv (the
rows in the results database's schema: `kernelwright results import` it).
"""

from __future__ import annotations

import argparse
import csv
import gc
import math
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
try:
    import kernelwright  # noqa: F401
except ImportError:  # a checkout without `pip install -e .` (the GPU machine)
    sys.path.insert(0, str(ROOT / "src"))
    import kernelwright  # noqa: F401

from kernelwright.bench.context import package_version  # noqa: E402
from kernelwright.losses import (  # noqa: E402
    dpo_loss,
    fused_linear_distill,
    fused_linear_logprobs,
    grpo_loss,
    sequence_logprobs,
)

PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0}  # dense bf16, SXM
GROUP = 8


# ---------------------------------------------------------------------------------- inputs


def make_inputs(loss: str, tokens: int, H: int, V: int, dtype, seed: int = 0) -> dict:
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = "cuda"
    seqs = GROUP if loss == "grpo" else 8
    T = tokens // seqs

    def hidden(n_seqs):
        return torch.randn(n_seqs, T, H, generator=g, device=dev).to(dtype)

    def weight():
        return (torch.randn(V, H, generator=g, device=dev) * H**-0.5).to(dtype)

    target = torch.randint(0, V, (seqs, T), generator=g, device=dev)
    target[:, : T // 4] = -100
    d = dict(
        h=hidden(seqs).requires_grad_(),
        w=weight().requires_grad_(loss != "logprobs_frozen"),
        target=target,
    )
    if loss == "dpo":
        d.update(h_ref=hidden(seqs), w_ref=weight())
    elif loss == "grpo":
        d.update(
            ref_logps=-torch.rand(seqs, T, generator=g, device=dev) * 8,
            advantages=torch.randn(seqs, generator=g, device=dev),
        )
    elif loss == "jsd":
        d.update(h_t=hidden(seqs), w_t=weight())
    return d


# ---------------------------------------------------------------------- log-prob providers


def _trl_kernels():
    """TRL's kernels module. Without TRL's trainer dependencies (datasets, pandas: the GPU
    machine has TRL's wheel alone) its kernels' one import from trl.trainer.utils, the
    DeepSpeed ZeRO-3 gathering context, is stood in for by a no-op: nothing here is
    partitioned."""
    try:
        import trl.trainer.utils  # noqa: F401
    except ImportError:
        import contextlib
        import types

        stub = types.ModuleType("trl.trainer.utils")
        stub.maybe_gather_lm_head_ctx = lambda *params: contextlib.nullcontext()
        sys.modules["trl.trainer.utils"] = stub
    import trl.kernels
    import trl.kernels.chunked_divergence

    return trl.kernels


def logps_torch(h, w, target):
    logits = h @ w.T
    logp = logits.float().log_softmax(-1)
    keep = target != -100
    picked = logp.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return torch.where(keep, picked, 0.0)


def logps_kernelwright(h, w, target):
    return fused_linear_logprobs(h, w, target)


def logps_kernelwright_stored(h, w, target):
    return fused_linear_logprobs(h, w, target, backward="stored")


def logps_trl(h, w, target):
    ChunkedLogProbFunction = _trl_kernels().ChunkedLogProbFunction

    keep = target != -100
    lp = ChunkedLogProbFunction.apply(
        h[keep], w, None, target[keep], 1.0, 32768, None, 1.0, ("log_probs",)
    )[0]
    return torch.zeros(target.shape, dtype=lp.dtype, device=lp.device).masked_scatter(keep, lp)


LOGPS = {
    "torch": logps_torch,
    "kernelwright": logps_kernelwright,
    "kernelwright_stored": logps_kernelwright_stored,
    "trl": logps_trl,
}


# -------------------------------------------------------------------------------- the steps


def step_fn(loss: str, provider: str, d: dict):
    """A zero-argument forward returning the scalar loss (backward is run by the caller)."""
    mask = (d["target"] != -100).float()
    if loss in ("logprobs", "logprobs_frozen"):
        if provider == "liger":
            return None
        f = LOGPS[provider]
        return lambda: f(d["h"], d["w"], d["target"]).sum()
    if loss in ("trl_head", "trl_head_metric"):  # what TRL's trainers ask their LM head for
        if provider not in ("trl", "kernelwright"):
            return None
        from kernelwright.integrations.trl import KernelwrightLogProbs

        metric = loss == "trl_head_metric"
        fn = (
            _trl_kernels().ChunkedLogProbFunction
            if provider == "trl"
            else KernelwrightLogProbs.configured(entropy_grad=not metric)
        )
        keep = d["target"] != -100
        outs = ("log_probs", "entropy", "mean_logits", "is_top1")

        def head():
            lp, ent = fn.apply(d["h"][keep], d["w"], None, d["target"][keep], 1.0, 32768,
                               None, 1.0, outs)[:2]  # fmt: skip
            return lp.sum() if metric else lp.sum() + 0.01 * ent.sum()

        return head
    if loss == "dpo":
        if provider == "liger":
            from liger_kernel.chunked_loss import LigerFusedLinearDPOLoss

            m = LigerFusedLinearDPOLoss(beta=0.1, use_ref_model=True)
            return lambda: m(
                d["w"], d["h"], d["target"], ref_input=d["h_ref"], ref_weight=d["w_ref"]
            )[0]
        f = LOGPS[provider]

        def dpo():
            pol = sequence_logprobs(f(d["h"], d["w"], d["target"]), mask)
            with torch.no_grad():
                ref = sequence_logprobs(f(d["h_ref"], d["w_ref"], d["target"]), mask)
            (pc, pr), (rc, rr) = pol.chunk(2), ref.chunk(2)
            return dpo_loss(pc, pr, rc, rr, beta=0.1)[0].mean()

        return dpo
    if loss == "grpo":
        if provider == "liger":
            from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

            m = LigerFusedLinearGRPOLoss(beta=0.04, use_ref_model=True, loss_type="dapo")
            return lambda: m(
                d["h"],
                d["w"],
                d["target"].clamp(min=0),
                mask,
                d["advantages"],
                ref_per_token_logps=d["ref_logps"],
            )[0]
        f = LOGPS[provider]
        return lambda: grpo_loss(
            f(d["h"], d["w"], d["target"]),
            d["advantages"],
            mask,
            ref_logps=d["ref_logps"],
            beta=0.04,
            loss_type="dapo",
        )[0]
    if loss == "jsd":
        if provider == "kernelwright_stored":
            return None
        if provider == "liger":
            from liger_kernel.chunked_loss import LigerFusedLinearJSDLoss

            m = LigerFusedLinearJSDLoss(weight_hard_loss=0.0, weight_soft_loss=1.0, beta=0.5)
            return lambda: m(
                d["h"].flatten(0, 1),
                d["w"],
                d["h_t"].flatten(0, 1),
                d["w_t"],
                d["target"].flatten(),
            )
        if provider == "kernelwright":
            return lambda: fused_linear_distill(
                d["h"], d["w"], d["h_t"], d["w_t"], d["target"], beta=0.5
            )
        if provider == "trl":
            kernels = _trl_kernels()
            ChunkedDivergenceFunction = kernels.chunked_divergence.ChunkedDivergenceFunction

            def trl_jsd():
                keep = d["target"] != -100
                div, _ = ChunkedDivergenceFunction.apply(
                    d["h"][keep], d["w"], None, d["h_t"][keep], d["w_t"], None, 0.5
                )
                return div.sum() / keep.sum()

            return trl_jsd
        from kernelwright.losses.distill import divergence

        def torch_jsd():
            keep = d["target"] != -100
            s = (d["h"] @ d["w"].T).float()
            with torch.no_grad():
                t = (d["h_t"] @ d["w_t"].T).float()
            return (divergence(s, t, 0.5, 1.0) * keep).sum() / keep.sum()

        return torch_jsd
    raise ValueError(loss)


def measure(fn, params, warmup: int, reps: int) -> dict:
    for p in params:
        p.grad = None
    for _ in range(warmup):
        fn().backward()
        for p in params:
            p.grad = None
    torch.cuda.synchronize()
    gc.collect()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    ms, wall = [], []
    loss = float("nan")
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        a.record()
        out = fn()
        out.backward()
        b.record()
        torch.cuda.synchronize()
        wall.append((time.perf_counter() - t0) * 1e3)
        ms.append(a.elapsed_time(b))
        loss = float(out.detach().float())
        for p in params:
            p.grad = None
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    grads = sum(p.numel() * p.element_size() for p in params) / 2**20
    return dict(
        ms=statistics.median(ms),
        wall_ms=statistics.median(wall),
        peak_mib=peak,
        work_mib=peak - grads,
        value=loss,
    )


def matmul_floor(d: dict, reps: int) -> dict:
    """The primitive's matmuls alone on its shapes (prompt tokens skipped, as it skips them):
    forward logits, backward recomputed logits, grad_hidden and grad_weight."""
    keep = d["target"] != -100
    h = d["h"].detach()[keep]
    w = d["w"].detach()
    N, H = h.shape
    V = w.shape[0]
    chunk = 1024
    buf = torch.empty(chunk, V, dtype=h.dtype, device=h.device)
    gw = torch.zeros_like(w)
    gh = torch.empty_like(h)

    def run():
        for s in range(0, N, chunk):
            torch.mm(h[s : s + chunk], w.T, out=buf[: min(chunk, N - s)])
        for s in range(0, N, chunk):
            e = min(s + chunk, N)
            torch.mm(h[s:e], w.T, out=buf[: e - s])
            torch.mm(buf[: e - s], w, out=gh[s:e])
            gw.addmm_(buf[: e - s].T, h[s:e])

    for _ in range(2):
        run()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        run()
    b.record()
    torch.cuda.synchronize()
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), float("nan"))
    flops3 = 3 * 2 * N * V * H
    return dict(mm4_ms=a.elapsed_time(b) / reps, mm3_peak_ms=flops3 / (peak * 1e9))


# ---------------------------------------------------------------------------------- main


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--losses", default="logprobs,logprobs_frozen,trl_head,trl_head_metric,dpo,grpo,jsd"
    )
    ap.add_argument("--providers", default="torch,kernelwright,kernelwright_stored,liger,trl")
    ap.add_argument("--tokens", default="8192,16384")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="kernelwright-runs/post_training")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("post_training.py measures on a CUDA GPU; none here", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(
        gpu=torch.cuda.get_device_name(),
        torch=torch.__version__,
        triton=package_version("triton"),
        liger=package_version("liger-kernel"),
        trl=package_version("trl"),
    )
    print(env, flush=True)
    rows = []
    for loss in a.losses.split(","):
        for tokens in (int(t) for t in a.tokens.split(",")):
            d = make_inputs(loss, tokens, a.hidden, a.vocab, torch.bfloat16)
            params = [p for p in (d["h"], d["w"]) if p.requires_grad]
            extra = matmul_floor(d, a.reps) if loss == "logprobs" else {}
            for provider in a.providers.split(","):
                row = dict(loss=loss, tokens=tokens, provider=provider, **env, **extra)
                try:
                    fn = step_fn(loss, provider, d)
                    if fn is None:
                        continue
                    row.update(measure(fn, params, a.warmup, a.reps))
                except Exception as e:  # a provider that fails gets a row with its error
                    row["error"] = f"{type(e).__name__}: {e}"[:300]
                    traceback.print_exc()
                gc.collect()
                torch.cuda.empty_cache()
                rows.append(row)
                print(
                    {
                        k: (round(v, 3) if isinstance(v, float) else v)
                        for k, v in row.items()
                        if k not in env
                    },
                    flush=True,
                )
            del d, params
            gc.collect()
            torch.cuda.empty_cache()
    _check_losses(rows)
    _write(rows, out)
    _write_bench_rows(rows, out, a.hidden, a.vocab)
    _plot(rows, out)
    return 0


def _write_bench_rows(rows, out: Path, H: int, V: int) -> None:
    from kernelwright.bench.context import arch_of, git_commit
    from kernelwright.bench.harness import BenchRow
    from kernelwright.bench.report import write_csv

    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    arch = arch_of(torch.device("cuda"))
    commit = git_commit(ROOT)
    bench = [
        BenchRow(
            op=_bench_op(r["loss"]),
            mode="full", provider=r["provider"], x_name="tokens", x_value=r["tokens"],
            shape=f"{r['tokens']}x{H}x{V}", dtype="bfloat16", ms_p50=r.get("ms", math.nan),
            peak_mem_mb=r.get("peak_mib", math.nan), timing="cuda_events_no_flush",
            gpu=r["gpu"], torch=r["torch"], triton=r["triton"], commit=commit,
            timestamp=stamp, error=r.get("error", ""), arch=arch,
            dims=f'{{"tokens": {r["tokens"]}, "hidden": {H}, "vocab": {V}}}',
        )
        for r in rows
    ]  # fmt: skip
    write_csv(bench, out / "post_training_bench.csv")


def _bench_op(loss: str) -> str:
    if loss == "logprobs":
        return "fused_linear_logprobs"
    if loss == "logprobs_frozen":
        return "fused_linear_logprobs_frozen_head"
    return f"{loss}_loss"


def _plot(rows, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    losses = list(dict.fromkeys(r["loss"] for r in rows))
    providers = list(dict.fromkeys(r["provider"] for r in rows))
    fig, axes = plt.subplots(2, len(losses), figsize=(4 * len(losses), 7), squeeze=False)
    for j, loss in enumerate(losses):
        sizes = sorted({r["tokens"] for r in rows if r["loss"] == loss})
        for i, (key, label) in enumerate((("ms", "fwd+bwd ms"), ("peak_mib", "peak MiB"))):
            ax = axes[i][j]
            width = 0.8 / len(providers)
            for k, prov in enumerate(providers):
                vals = [
                    next((r.get(key, math.nan) for r in rows if r["loss"] == loss
                          and r["tokens"] == n and r["provider"] == prov), math.nan)
                    for n in sizes
                ]  # fmt: skip
                ax.bar([x + k * width for x in range(len(sizes))], vals, width, label=prov)
            ax.set_xticks([x + 0.4 - width / 2 for x in range(len(sizes))], [str(n) for n in sizes])
            ax.set_title(f"{loss}: {label}")
            ax.set_xlabel("tokens")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"post-training losses, {rows[0]['gpu']}, bf16, H 4096, V 128256")
    fig.tight_layout()
    fig.savefig(out / "post_training.png", dpi=110)


def _check_losses(rows) -> None:
    """loss_ok: the provider's loss within 1% (bf16 logits) of the unfused torch one's."""
    base = {(r["loss"], r["tokens"]): r.get("value") for r in rows if r["provider"] == "torch"}
    for r in rows:
        want, got = base.get((r["loss"], r["tokens"])), r.get("value")
        if want is None or got is None:
            r["loss_ok"] = ""
        else:
            r["loss_ok"] = abs(got - want) <= 0.01 * abs(want) + 1e-3


def _write(rows, out: Path) -> None:
    keys = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with open(out / "post_training.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    lines = [
        "| loss | tokens | provider | ms | wall ms | peak MiB | work MiB | loss value | agrees |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [r["loss"], r["tokens"], r["provider"]]
        if r.get("error"):
            cells += ["error: " + r["error"][:60], "", "", "", "", ""]
        else:
            cells += [
                f"{r['ms']:.1f}",
                f"{r['wall_ms']:.1f}",
                f"{r['peak_mib']:.0f}",
                f"{r['work_mib']:.0f}",
                f"{r['value']:.5g}" if math.isfinite(r["value"]) else "nan",
                r["loss_ok"],
            ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    (out / "post_training.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
