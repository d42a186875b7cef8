"""Vocabulary-parallel cross-entropy (CE) and fused linear cross-entropy (FLCE) on every
visible GPU (NCCL, one process per GPU), against the unsplit op on one GPU, PyTorch's
loss_parallel and Liger Kernel's tensor-parallel losses: forward+backward time, peak memory
per GPU, and the loss and gradient differences from the unsplit op. One script, so a run fits
one call of the GPU machine:

    python3 benchmarks/vocab_parallel.py --out DIR       # N = the visible GPUs
    python3 benchmarks/vocab_parallel.py --device cpu --tokens 16 --vocabs 51 --hidden 16

Shapes: every --tokens x --vocabs (default 8192,16384 x 128256,151936,256000), --hidden 4096
for FLCE, --dtype bf16. Every rank draws the same whole inputs from one seed (targets with
every 97th token ignored) and keeps its contiguous slice of the vocabulary, torch.chunk's split
(the one DTensor's Shard uses). Providers, one after another in the same processes:

    kernelwright       kernelwright.distributed.vocab_parallel_cross_entropy on this rank's
                       logits [T, V_r] / vocab_parallel_fused_linear_cross_entropy on its
                       lm-head rows [V_r, H] (plain tensors, process group and shard_sizes)
    torch_loss_parallel  F.cross_entropy(logits.float(), target) under
                       torch.distributed.tensor.parallel.loss_parallel, logits a DTensor
                       placed Shard(-1) (DTensor.from_local of this rank's slice); for FLCE the
                       logits come from F.linear of Replicate hidden states and a Shard(0)
                       weight, as ColwiseParallel(use_local_output=False) computes them
    liger              Liger's LigerVocabParallelCrossEntropy (per-token losses, summed over
                       the non-ignored count) / liger_fused_linear_scaled_cross_entropy_tp
                       (temperature 1); both need equal slices and CUDA, else the row says why
    kernelwright_1gpu  the unsplit kernelwright.ops cross_entropy / fused_linear_cross_entropy
                       on rank 0 alone, whole logits / whole weight

Time: CUDA events around one forward+backward, every rank synchronized before each call
(rank 0 alone for kernelwright_1gpu); per call the slowest rank; median (and min) over --reps
after --warmup calls. Memory: peak_mib is, on the rank using most, torch.cuda's peak allocation
during the provider's calls less what was allocated before its inputs were made (its inputs,
outputs, gradients and temporaries). Equality: each rank also runs the unsplit op on the whole
inputs and keeps its slice of the gradients; the provider's first call is compared with it
(largest over ranks): loss_diff, grad_diff (logits gradient for CE, hidden gradient for
FLCE), wgrad_diff (FLCE's weight gradient); grad_ref_max is the gradient's scale. Outputs in
--out: vocab_parallel.csv (a provider that cannot run or fails gets a row saying why) and .md.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import gc
import math
import os
import socket
import statistics
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
try:
    import kernelwright  # noqa: F401
except ImportError:  # a checkout without `pip install -e .` (the GPU machine)
    sys.path.insert(0, str(ROOT / "src"))
    import kernelwright  # noqa: F401

from kernelwright.bench.context import package_version  # noqa: E402

IGNORE = -100
OPS = ("ce", "flce")
PROVIDERS = ("kernelwright", "torch_loss_parallel", "liger", "kernelwright_1gpu")
FIELDS = ["op", "provider", "tokens", "vocab", "hidden", "world", "dtype", "available", "ms",
          "ms_min", "reps", "peak_mib", "loss", "loss_diff", "grad_diff", "wgrad_diff",
          "grad_ref_max", "note", "error", "gpu", "device", "torch", "triton", "liger",
          "kernelwright_commit"]  # fmt: skip
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


class Unavailable(RuntimeError):
    """The provider cannot run here; its row records why."""


@dataclass
class Ctx:
    rank: int
    world: int
    device: torch.device
    group: object
    mesh: object
    op: str
    T: int
    V: int
    H: int
    sizes: list  # every rank's V_r, torch.chunk's split
    start: int  # this rank's first class
    n_valid: int  # non-ignored targets


# --------------------------------------------------------------------------- inputs


def _full_inputs(ctx: Ctx, dtype, seed: int) -> dict:
    """The whole inputs, the same on every rank (one seed)."""
    g = torch.Generator(device=ctx.device).manual_seed(seed)
    dev = ctx.device
    target = torch.randint(0, ctx.V, (ctx.T,), device=dev, generator=g)
    target[::97] = IGNORE
    if ctx.op == "ce":
        logits = torch.randn(ctx.T, ctx.V, device=dev, dtype=dtype, generator=g).mul_(2.0)
        return {"target": target, "logits": logits}
    hidden = torch.randn(ctx.T, ctx.H, device=dev, dtype=dtype, generator=g)
    weight = torch.randn(ctx.V, ctx.H, device=dev, dtype=dtype, generator=g)
    return {"target": target, "hidden": hidden, "weight": weight.mul_(2.0 / math.sqrt(ctx.H))}


def _unsplit_step(ctx: Ctx, full: dict):
    """The unsplit kernelwright op on copies of the whole inputs: (step, leaves)."""
    from kernelwright.ops.cross_entropy import cross_entropy
    from kernelwright.ops.fused_linear_cross_entropy import fused_linear_cross_entropy

    t = full["target"]
    if ctx.op == "ce":
        x = full["logits"].clone().requires_grad_()
        return _with_backward(lambda: cross_entropy(x, t)), {"logits": x}
    h = full["hidden"].clone().requires_grad_()
    w = full["weight"].clone().requires_grad_()
    return _with_backward(lambda: fused_linear_cross_entropy(h, w, t)), {"hidden": h, "weight": w}


def _reference(ctx: Ctx, full: dict) -> dict:
    """The unsplit op's loss and this rank's slice of its gradients."""
    step, leaves = _unsplit_step(ctx, full)
    loss = step()
    sl = slice(ctx.start, ctx.start + ctx.sizes[ctx.rank])
    if ctx.op == "ce":
        grads = {"logits": leaves["logits"].grad[:, sl].clone()}
    else:
        grads = {"hidden": leaves["hidden"].grad, "weight": leaves["weight"].grad[sl].clone()}
    return {"loss": float(loss.detach()), "grads": grads}


def _with_backward(fn):
    def step():
        loss = fn()
        loss.backward()
        return loss

    return step


# --------------------------------------------------------------------------- providers


def _local(ctx: Ctx, full: dict) -> dict:
    """This rank's slice, copies as leaves needing gradients: logits [T, V_r] for CE; hidden
    [T, H] (whole) and weight [V_r, H] for FLCE."""
    sl = slice(ctx.start, ctx.start + ctx.sizes[ctx.rank])
    if ctx.op == "ce":
        return {"logits": full["logits"][:, sl].clone().requires_grad_()}
    h, w = full["hidden"].clone(), full["weight"][sl].clone()
    return {"hidden": h.requires_grad_(), "weight": w.requires_grad_()}


def _kernelwright(ctx: Ctx, full: dict):
    from kernelwright.distributed import (
        vocab_parallel_cross_entropy,
        vocab_parallel_fused_linear_cross_entropy,
    )

    leaves, t = _local(ctx, full), full["target"]
    xs = list(leaves.values())
    kw = dict(group=ctx.group, shard_sizes=ctx.sizes)

    def fn():
        if ctx.op == "ce":
            return vocab_parallel_cross_entropy(xs[0], t, **kw)
        return vocab_parallel_fused_linear_cross_entropy(xs[0], xs[1], t, **kw)

    return _with_backward(fn), leaves, "process group + shard_sizes"


def _torch_loss_parallel(ctx: Ctx, full: dict):
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel import loss_parallel

    leaves, t = _local(ctx, full), full["target"]
    xs = list(leaves.values())

    def step():
        if ctx.op == "ce":
            logits = DTensor.from_local(xs[0], ctx.mesh, [Shard(1)], run_check=False,
                                        shape=(ctx.T, ctx.V), stride=(ctx.V, 1))  # fmt: skip
        else:
            h = DTensor.from_local(xs[0], ctx.mesh, [Replicate()], run_check=False)
            w = DTensor.from_local(xs[1], ctx.mesh, [Shard(0)], run_check=False,
                                   shape=(ctx.V, ctx.H), stride=(ctx.H, 1))  # fmt: skip
            logits = F.linear(h, w)  # Shard(-1): this rank's [T, V_r]
        with loss_parallel():
            loss = F.cross_entropy(logits.float(), t, ignore_index=IGNORE)
            loss.backward()
        return loss.to_local()  # Replicate: the loss itself

    return step, leaves, "DTensor.from_local, logits.float() (as torchtitan)"


def _liger(ctx: Ctx, full: dict):
    if ctx.device.type != "cuda":  # its FLCE checks for CUDA tensors; its CE is Triton
        raise Unavailable("Liger's tensor-parallel losses are run on CUDA only (CPU run)")
    try:
        if ctx.op == "ce":
            from liger_kernel.transformers.vocab_parallel_cross_entropy import (
                LigerVocabParallelCrossEntropy,
            )
        else:
            from liger_kernel.transformers.functional import (
                liger_fused_linear_scaled_cross_entropy_tp,
            )
    except ImportError as e:
        have = package_version("liger-kernel") or "not installed"
        raise Unavailable(f"no Liger tensor-parallel {ctx.op} (liger_kernel {have}: {e})") from e
    if ctx.V % ctx.world:
        raise Unavailable(f"Liger assumes equal slices (its first class is rank * V_local); "
                          f"V = {ctx.V} does not split evenly over {ctx.world} ranks")  # fmt: skip
    leaves, t = _local(ctx, full), full["target"]
    xs = list(leaves.values())
    if ctx.op == "ce":
        ce = LigerVocabParallelCrossEntropy(ignore_index=IGNORE)  # reduction "none": [S, B]

        def fn():  # Liger takes [S, B, V_local]; the mean over the non-ignored tokens
            rows = ce(xs[0].view(ctx.T, 1, -1), t.view(ctx.T, 1), tp_group=ctx.group)
            return rows.sum() / ctx.n_valid

        return _with_backward(fn), leaves, "LigerVocabParallelCrossEntropy"

    def fn():  # per-token NLL; the mean over the non-ignored tokens
        nll = liger_fused_linear_scaled_cross_entropy_tp(xs[0], xs[1], t, ctx.group,
                                                         ignore_index=IGNORE)  # fmt: skip
        return nll.sum() / ctx.n_valid

    return _with_backward(fn), leaves, _liger_flce_path(xs[0])


def _liger_flce_path(hidden) -> str:
    """Which implementation liger_fused_linear_scaled_cross_entropy_tp takes here (its own
    test: bf16 on Hopper/Blackwell with the separate liger_cute_kernels package loadable)."""
    name = "liger_fused_linear_scaled_cross_entropy_tp"
    try:
        from liger_kernel.ops import fused_linear_scaled_cross_entropy as m

        native = hidden.dtype == torch.bfloat16
        native = native and m._supports_native_tp_architecture(hidden.device)
        try:
            native = native and m._load_native_tp_function() is not None
        except ImportError:
            native = False
    except Exception:  # private helpers of this Liger version: the note only
        return f"{name} (path unknown)"
    if native:
        return f"{name}, native CUTLASS + NVSHMEM path"
    return f"{name}, PyTorch fallback (512-token chunks)"


def _kernelwright_1gpu(ctx: Ctx, full: dict):
    step, leaves = _unsplit_step(ctx, full)
    return step, leaves, "rank 0 alone, whole inputs"


BUILD = {"kernelwright": _kernelwright, "torch_loss_parallel": _torch_loss_parallel,
         "liger": _liger, "kernelwright_1gpu": _kernelwright_1gpu}  # fmt: skip


# --------------------------------------------------------------------------- measuring


def _sync(ctx: Ctx, collective: bool) -> None:
    """Wait for this rank's device, and with `collective` for every rank."""
    if ctx.device.type == "cuda":
        torch.cuda.synchronize()
    if collective and ctx.world > 1:
        flag = torch.zeros(1, device=ctx.device)
        dist.all_reduce(flag, group=ctx.group)
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()


def _timed(ctx: Ctx, step, leaves, collective: bool) -> float:
    """Milliseconds of one forward+backward (gradients dropped afterwards)."""
    _sync(ctx, collective)
    if ctx.device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end)
    else:
        t0 = time.perf_counter()
        step()
        ms = (time.perf_counter() - t0) * 1e3
    for x in leaves.values():
        x.grad = None
    return ms


def _max_abs_diff(a: torch.Tensor, b: torch.Tensor, rows: int = 1024) -> float:
    """max |a - b| in fp32, a block of rows at a time (no whole fp32 copies)."""
    out = 0.0
    for i in range(0, a.shape[0], rows):
        d = (a[i : i + rows].float() - b[i : i + rows].float()).abs().max()
        out = max(out, float(d))
    return out


def _compare(ctx: Ctx, loss, leaves: dict, ref: dict, whole: bool) -> dict:
    """Differences of a first call from the unsplit op (this rank's slice)."""
    sl = slice(ctx.start, ctx.start + ctx.sizes[ctx.rank])
    value = float(loss.detach())
    out = {"loss": value, "loss_diff": abs(value - ref["loss"])}
    if ctx.op == "ce":
        g = leaves["logits"].grad
        out["grad_diff"] = _max_abs_diff(g[:, sl] if whole else g, ref["grads"]["logits"])
        out["grad_ref_max"] = float(ref["grads"]["logits"].abs().max())
    else:
        gw = leaves["weight"].grad
        out["grad_diff"] = _max_abs_diff(leaves["hidden"].grad, ref["grads"]["hidden"])
        out["wgrad_diff"] = _max_abs_diff(gw[sl] if whole else gw, ref["grads"]["weight"])
        out["grad_ref_max"] = float(ref["grads"]["hidden"].abs().max())
    return out


def _run_provider(ctx: Ctx, name: str, full: dict, ref: dict, a) -> dict:
    """This rank's measurement of one provider (empty where this rank takes no part)."""
    alone = name == "kernelwright_1gpu"
    if alone and ctx.rank != 0:
        return {}
    cuda = ctx.device.type == "cuda"
    res: dict = {}
    try:
        if cuda:
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
        step, leaves, res["note"] = BUILD[name](ctx, full)
        loss = step()
        res.update(_compare(ctx, loss, leaves, ref, whole=alone))
        del loss
        for x in leaves.values():
            x.grad = None
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        times = [_timed(ctx, step, leaves, not alone) for _ in range(a.warmup + a.reps)]
        res["times"] = times[a.warmup :]
        if cuda:
            res["peak_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
    except Unavailable as e:
        res = {"unavailable": str(e)}
    except Exception as e:  # recorded in the row; the run goes on
        traceback.print_exc()
        res = {"error": f"{type(e).__name__}: {e}"[:300]}
    return res


def _combine(parts: list[dict]) -> dict:
    """One row's measured fields from every rank's part."""
    parts = [p for p in parts if p]
    why = next((p["unavailable"] for p in parts if "unavailable" in p), "")
    err = next((p["error"] for p in parts if "error" in p), "")
    row = {"available": not why, "error": err, "note": why or parts[0].get("note", "")}
    if why or err:
        return row
    per_call = [max(ts) for ts in zip(*(p["times"] for p in parts), strict=True)]
    row.update(ms=statistics.median(per_call), ms_min=min(per_call), reps=len(per_call),
               loss=parts[0]["loss"])  # fmt: skip
    for k in ("peak_mib", "loss_diff", "grad_diff", "wgrad_diff", "grad_ref_max"):
        vals = [p[k] for p in parts if k in p]
        row[k] = max(vals) if vals else float("nan")
    return row


def _free(ctx: Ctx, collect: bool = False) -> None:
    """Hand cached GPU memory back; `collect`: also cycles (a caught exception's frames)."""
    if collect:
        gc.collect()
    if ctx.device.type == "cuda":
        torch.cuda.empty_cache()


def _shape_rows(ctx: Ctx, a, env: dict) -> list[dict]:
    dtype = DTYPES[a.dtype]
    full = _full_inputs(ctx, dtype, a.seed)
    ctx.n_valid = int((full["target"] != IGNORE).sum())
    ref = _reference(ctx, full)
    _free(ctx)
    rows = []
    for name in a.providers:
        part = _run_provider(ctx, name, full, ref, a)
        _free(ctx, collect="error" in part)
        parts = [None] * ctx.world
        dist.all_gather_object(parts, part, group=ctx.group)
        row = dict(op=ctx.op, provider=name, tokens=ctx.T, vocab=ctx.V,
                   hidden=ctx.H if ctx.op == "flce" else "", world=ctx.world, dtype=a.dtype,
                   **_combine(parts), **env)  # fmt: skip
        rows.append(row)
        if ctx.rank == 0:
            print(_progress(row), flush=True)
    return rows


def _progress(r: dict) -> str:
    head = f"  {r['provider']:<20}"
    if not r["available"]:
        return f"{head} unavailable: {r['note']}"
    if r["error"]:
        return f"{head} ERROR: {r['error']}"
    peak = r.get("peak_mib", float("nan"))
    return (
        f"{head} {r['ms']:9.2f} ms  peak {peak:8.0f} MiB  loss {r['loss']:.5f}  "
        f"dloss {r['loss_diff']:.1e}  dgrad {r['grad_diff']:.1e}"
    )


# --------------------------------------------------------------------------- the ranks


def _environment(device: torch.device) -> dict:
    import triton

    from kernelwright.bench.context import git_commit

    return {
        "gpu": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "device": device.type,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "liger": package_version("liger-kernel"),
        "kernelwright_commit": git_commit(ROOT),
    }


def _rank(rank: int, world: int, a, init: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from kernelwright.distributed import chunk_sizes

    timeout = datetime.timedelta(seconds=a.timeout)
    if a.device == "cuda":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        dist.init_process_group(
            "nccl", init_method=init, rank=rank, world_size=world, timeout=timeout, device_id=device
        )
    else:
        device = torch.device("cpu")
        dist.init_process_group(
            "gloo", init_method=init, rank=rank, world_size=world, timeout=timeout
        )
    try:
        mesh = init_device_mesh(device.type, (world,))
        env = _environment(device)
        shapes = [(op, T, V) for op in a.ops for T in a.tokens for V in a.vocabs]
        rows = []
        for i, (op, T, V) in enumerate(shapes):
            sizes = chunk_sizes(V, world)
            ctx = Ctx(rank, world, device, mesh.get_group(0), mesh, op, T, V, a.hidden, sizes,
                      sum(sizes[:rank]), 0)  # fmt: skip
            if rank == 0:
                what = f", hidden {a.hidden}" if op == "flce" else ""
                print(f"[{i + 1}/{len(shapes)}] {op}: {T} tokens, V {V}{what}, {world} ranks",
                      flush=True)  # fmt: skip
            rows += _shape_rows(ctx, a, env)
            _free(ctx, collect=True)
            if rank == 0:  # after every shape: a run cut short keeps what it measured
                _write(rows, Path(a.out), a, final=i + 1 == len(shapes))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    # Leave without C++ static destructors: gloo's worker threads at teardown abort the process
    # now and then, after every collective has completed.
    os._exit(0)


# --------------------------------------------------------------------------- output


def _fmt(x, spec: str) -> str:
    return "" if x is None or x == "" or (isinstance(x, float) and math.isnan(x)) else f"{x:{spec}}"


def _write(rows: list[dict], out: Path, a, final: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "vocab_parallel.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    r0 = rows[0]
    lines = [
        f"Vocabulary-parallel losses, {r0['world']}x {r0['gpu']}, {r0['dtype']}, forward + "
        f"backward, median of {a.reps} calls after {a.warmup} warm-up; torch {r0['torch']}, "
        f"liger {r0['liger'] or 'not installed'}, kernelwright {r0['kernelwright_commit']}. "
        "Differences are against the unsplit kernelwright op (kernelwright_1gpu).",
        "",
    ]
    skipped = {}
    for op in OPS:
        mine = [r for r in rows if r["op"] == op]
        if not mine:
            continue
        split = "logits [tokens, V]" if op == "ce" else f"lm-head weight [V, {mine[0]['hidden']}]"
        wcol = " weight-grad diff |" if op == "flce" else ""
        lines += [
            f"### {op}: {split} split along V over {r0['world']} ranks",
            "",
            f"| tokens | V | provider | ms | vs 1 GPU | peak MiB per GPU | loss diff | "
            f"{'hidden' if op == 'flce' else 'logits'}-grad diff |{wcol}",
            "|---|---|---|---|---|---|---|---|" + ("---|" if wcol else ""),
        ]
        one = {(r["tokens"], r["vocab"]): r.get("ms") for r in mine
               if r["provider"] == "kernelwright_1gpu"}  # fmt: skip
        for r in mine:
            if not r["available"] or r["error"]:
                key = (r["provider"], op, r["note"] if not r["available"] else r["error"])
                skipped.setdefault(key, []).append(f"{r['tokens']}x{r['vocab']}")
                continue
            base = one.get((r["tokens"], r["vocab"]))
            ratio = f"{base / r['ms']:.2f}x" if base and r["ms"] else ""
            cells = [r["tokens"], r["vocab"], r["provider"], _fmt(r["ms"], ".2f"), ratio,
                     _fmt(r.get("peak_mib"), ".0f"), _fmt(r["loss_diff"], ".1e"),
                     _fmt(r["grad_diff"], ".1e")]  # fmt: skip
            if wcol:
                cells.append(_fmt(r.get("wgrad_diff"), ".1e"))
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
        lines.append("")
    for (prov, op, why), shapes in skipped.items():
        lines.append(f"- {prov}, {op} ({', '.join(shapes)}): {why}")
    text = "\n".join(lines).rstrip() + "\n"
    (out / "vocab_parallel.md").write_text(text)
    if final:
        print(text, flush=True)


# --------------------------------------------------------------------------- main


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def _names(allowed):
    def parse(s: str) -> list[str]:
        names = [x for x in s.split(",") if x]
        bad = [x for x in names if x not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {', '.join(allowed)}")
        return names

    return parse


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=_ints, default=[8192, 16384])
    ap.add_argument("--vocabs", type=_ints, default=[128256, 151936, 256000])
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--ops", type=_names(OPS), default=list(OPS))
    ap.add_argument("--providers", type=_names(PROVIDERS), default=list(PROVIDERS))
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument(
        "--world", type=int, default=None, help="processes (default: the visible GPUs; 2 on CPU)"
    )
    ap.add_argument("--timeout", type=int, default=180, help="seconds a collective may wait")
    ap.add_argument("--out", default="kernelwright-runs/vocab_parallel")
    a = ap.parse_args(argv)
    if a.device == "cuda":
        world = a.world or torch.cuda.device_count()
        if world < 1 or world > torch.cuda.device_count():
            found = torch.cuda.device_count()
            print(f"vocab_parallel.py needs {world or 'some'} CUDA GPUs, found {found} "
                  "(--device cpu for a gloo run)", file=sys.stderr)  # fmt: skip
            return 2
    else:
        world = a.world or 2
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = os.environ.get("MASTER_PORT")
    if not port:  # a free one
        with socket.socket() as s:
            s.bind((addr, 0))
            port = s.getsockname()[1]
    torch.multiprocessing.spawn(_rank, args=(world, a, f"tcp://{addr}:{port}"), nprocs=world)
    return 0


if __name__ == "__main__":
    sys.exit(main())
