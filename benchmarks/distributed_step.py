"""Training steps of a patched and an unpatched model under DDP and FSDP2 on every visible GPU
(NCCL, one process per GPU), bf16 with fp32 gradient reduction: per-step losses (they must
agree), tokens/s and peak memory per GPU. One script, so a run fits one call of the GPU
machine:

    python3 benchmarks/distributed_step.py --model llama --layers 4 --out DIR

Model: a `tiny_config` of the model type at the "gpu" size, widened by --hidden/--layers
(defaults: hidden 2048, 4 layers, vocabulary 128256), built on each rank with the same seed.
Each rank trains on its own random batch (--batch sequences of --seq tokens). DDP wraps the
bf16 model (gradients all-reduced in bf16, DDP's default); FSDP2 shards each decoder layer and
the root with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) over fp32 weights.
`--checkpointing` turns activation checkpointing on. `--lora R` freezes the model and trains a
PEFT LoRA of rank R on every attention and MLP projection (added after `kernelwright.patch`, as a
user would; the fused loss then runs on a frozen `lm_head`). Outputs: distributed_step.csv and .md.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
try:
    import kernelwright  # noqa: F401
except ImportError:  # a checkout without `pip install -e .` (the GPU machine)
    sys.path.insert(0, str(ROOT / "src"))
    import kernelwright  # noqa: F401


def _model(a, patched: bool, wrapper: str):
    from transformers import AutoModelForCausalLM

    from kernelwright.testing.model_configs import tiny_config

    cfg = tiny_config(a.model, size="gpu", hidden_size=a.hidden, num_hidden_layers=a.layers,
                      intermediate_size=a.hidden * 4, num_attention_heads=a.hidden // 128,
                      num_key_value_heads=max(1, a.hidden // 512), vocab_size=a.vocab,
                      head_dim=128)  # fmt: skip
    torch.manual_seed(0)
    dtype = torch.bfloat16 if wrapper == "ddp" else torch.float32
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=dtype)
    if patched:
        kernelwright.patch(model)
    if a.lora:
        import peft

        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        lora = peft.LoraConfig(r=a.lora, lora_alpha=2 * a.lora, target_modules=targets)
        model = peft.get_peft_model(model, lora)
    if a.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model


def _wrap(model, wrapper: str, rank: int):
    if wrapper == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[rank])
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    for layer in inner.model.layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    return model


def _rank(rank: int, world: int, a, out: str) -> None:
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    rows = []
    try:
        for wrapper in a.wrappers.split(","):
            for patched in (False, True):
                model = _wrap(_model(a, patched, wrapper), wrapper, rank)
                params = [p for p in model.parameters() if p.requires_grad]
                opt = torch.optim.AdamW(params, lr=1e-4, foreach=True)
                g = torch.Generator(device="cuda").manual_seed(1000 + rank)
                ids = torch.randint(0, a.vocab, (a.batch, a.seq), device="cuda", generator=g)
                losses, times = [], []
                torch.cuda.reset_peak_memory_stats()
                for step in range(a.warmup + a.steps):
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    loss = model(input_ids=ids, labels=ids).loss
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    torch.cuda.synchronize()
                    if step >= a.warmup:
                        times.append(time.perf_counter() - t0)
                    losses.append(loss.item())
                tokens = a.batch * a.seq * world
                rows.append(dict(
                    model=a.model, wrapper=wrapper, patched=patched, lora=a.lora, rank=rank,
                    world=world,
                    gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                    tokens_per_s=tokens * len(times) / sum(times),
                    peak_mib=torch.cuda.max_memory_allocated() / 2**20,
                    losses=" ".join(f"{x:.5f}" for x in losses),
                ))  # fmt: skip
                del model, opt
                torch.cuda.empty_cache()
        if rank == 0:
            _write(rows, Path(out), a)
    finally:
        dist.destroy_process_group()


def _write(rows, out: Path, a) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "distributed_step.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = [f"{a.model}, hidden {a.hidden}, {a.layers} layers, V {a.vocab}, {a.batch}x{a.seq} "
             f"tokens per GPU, {rows[0]['world']}x {rows[0]['gpu']}, checkpointing "
             f"{a.checkpointing}, LoRA rank {a.lora or 'off'}", "",
             "| wrapper | patched | tokens/s (all GPUs) | peak MiB (GPU 0) | max loss diff |",
             "|---|---|---|---|---|"]  # fmt: skip
    base = {r["wrapper"]: r for r in rows if not r["patched"]}
    for r in rows:
        ref = [float(x) for x in base[r["wrapper"]]["losses"].split()]
        got = [float(x) for x in r["losses"].split()]
        diff = max(abs(x - y) for x, y in zip(got, ref, strict=True))
        lines.append(f"| {r['wrapper']} | {r['patched']} | {r['tokens_per_s']:.0f} | "
                     f"{r['peak_mib']:.0f} | {diff:.4f} |")  # fmt: skip
    text = "\n".join(lines) + "\n"
    (out / "distributed_step.md").write_text(text)
    print(text, flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="llama")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--wrappers", default="ddp,fsdp2")
    ap.add_argument("--checkpointing", action="store_true")
    ap.add_argument("--lora", type=int, default=0, help="train a LoRA of this rank (0: off)")
    ap.add_argument("--out", default="kernelwright-runs/distributed_step")
    a = ap.parse_args(argv)
    world = torch.cuda.device_count()
    if world < 1:
        print("distributed_step.py needs CUDA GPUs", file=sys.stderr)
        return 2
    torch.multiprocessing.spawn(_rank, args=(world, a, a.out), nprocs=world)
    return 0


if __name__ == "__main__":
    sys.exit(main())
