"""A recommendation-style encoder written plainly, and what kernelwright.compile does to it.

Each sample has several partitions (user-history fields) of jagged length; every item is
embedded, each partition is mean-pooled with a Python loop over the partition offsets, the
pooled partitions of a sample are concatenated and go through an MLP tower. A training step
adds a linear head, a loss and AdamW.

    python3 examples/pooling_encoder.py                       # GPU: the figures below
    python3 examples/pooling_encoder.py --samples 8 --parts 3 --max-len 5 --dim 16   # CPU

Per provider, in one process: forward+backward of the encoder and one training step, median
ms over --reps, after a first call whose time (compile included) is reported on its own.
Providers: eager, kernelwright.compile, and plain torch.compile in a subprocess with a time
limit (Dynamo unrolls the loop one partition at a time; --compile-limit). Numerics of
kernelwright.compile against eager are checked on the encoder's output and every gradient.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch


class Encoder(torch.nn.Module):
    def __init__(self, vocab: int, dim: int, parts: int, hidden: int):
        super().__init__()
        self.parts = parts
        self.embedding = torch.nn.Embedding(vocab, dim)
        self.tower = torch.nn.Sequential(
            torch.nn.Linear(parts * dim, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, hidden),
        )

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        items = self.embedding(ids)  # [total items, dim]
        pooled = []
        for i in range(len(offsets) - 1):  # one partition at a time
            pooled.append(items[offsets[i] : offsets[i + 1]].mean(dim=0))
        pooled = torch.stack(pooled)  # [samples * parts, dim]
        return self.tower(pooled.view(-1, self.parts * items.shape[-1]))


class Model(torch.nn.Module):
    def __init__(self, encoder: Encoder, hidden: int):
        super().__init__()
        self.encoder = encoder
        self.head = torch.nn.Linear(hidden, 1)

    def forward(self, ids, offsets):
        return self.head(self.encoder(ids, offsets)).squeeze(-1)


def make_batch(samples: int, parts: int, max_len: int, vocab: int, device, seed: int = 0):
    """ids [total] on `device`, offsets [samples * parts + 1] int64 on the CPU (as a data
    loader hands them over), labels [samples]."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, max_len + 1, (samples * parts,), generator=g)
    offsets = torch.zeros(samples * parts + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths, 0)
    ids = torch.randint(0, vocab, (int(offsets[-1]),), generator=g).to(device)
    labels = torch.rand(samples, generator=g).to(device)
    return ids, offsets, labels


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _timed(fn, device, reps: int) -> tuple[float, float]:
    """(first call ms, median ms of the next `reps`)."""
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    first = (time.perf_counter() - t0) * 1e3
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return first, statistics.median(times)


def build(args, device):
    torch.manual_seed(0)
    model = Model(Encoder(args.vocab, args.dim, args.parts, args.hidden), args.hidden).to(device)
    return model


def measure(provider: str, args) -> dict:
    """Encoder fwd+bwd and a training step for one provider, in this process."""
    import kernelwright

    device = args.device
    model = build(args, device)
    ids, offsets, labels = make_batch(
        args.samples, args.parts, args.max_len, args.vocab, device, seed=1
    )
    report = kernelwright.compile.CompileReport()
    if provider == "kernelwright":
        encoder = kernelwright.compile(model.encoder, report=report)
        step_model = kernelwright.compile(model)
    elif provider == "torch_compile":
        encoder, step_model = torch.compile(model.encoder), torch.compile(model)
    else:
        encoder, step_model = model.encoder, model

    def encoder_fwd_bwd():
        model.zero_grad(set_to_none=True)
        encoder(ids, offsets).sum().backward()

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def train_step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(step_model(ids, offsets), labels)
        loss.backward()
        opt.step()

    enc_first, enc_ms = _timed(encoder_fwd_bwd, device, args.reps)
    step_first, step_ms = _timed(train_step, device, args.reps)
    return {
        "provider": provider,
        "encoder_first_ms": enc_first,
        "encoder_ms": enc_ms,
        "step_first_ms": step_first,
        "step_ms": step_ms,
        "sites": [s.line() for s in report],
    }


def check_numerics(args) -> float:
    """Largest relative error of kernelwright.compile's encoder output and gradients against
    eager (fp32), on fresh copies of the same model."""
    import kernelwright

    device = args.device
    ids, offsets, _ = make_batch(args.samples, args.parts, args.max_len, args.vocab, device, 2)
    results = []
    for compiled in (False, True):
        encoder = build(args, device).encoder
        run = kernelwright.compile(encoder) if compiled else encoder
        out = run(ids, offsets)
        torch.manual_seed(3)
        out.backward(torch.randn_like(out))
        results.append([out.detach()] + [p.grad for p in encoder.parameters()])
    worst = 0.0
    for got, want in zip(results[1], results[0], strict=True):
        err = (got - want).abs().max().item() / max(want.abs().max().item(), 1e-12)
        worst = max(worst, err)
    return worst


def _plain_compile_in_subprocess(args) -> dict:
    cmd = [sys.executable, __file__, "--only", "torch_compile", "--json"]
    cmd += [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k in _SIZE_ARGS]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=args.compile_limit, check=False
        )
    except subprocess.TimeoutExpired:
        return {"provider": "torch_compile", "error": f"not done in {args.compile_limit} s"}
    if proc.returncode != 0:
        return {"provider": "torch_compile", "error": proc.stderr.strip()[-300:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


_SIZE_ARGS = ("samples", "parts", "max_len", "dim", "hidden", "vocab", "reps", "device")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--parts", type=int, default=4)
    p.add_argument("--max-len", type=int, default=200)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--vocab", type=int, default=100_000)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--compile-limit", type=int, default=300, help="seconds for torch.compile")
    p.add_argument("--only", default=None, help="one provider, in this process")
    p.add_argument("--json", action="store_true", help="print the result as one JSON line")
    args = p.parse_args()

    if args.only:
        row = measure(args.only, args)
        print(json.dumps(row) if args.json else row)
        return
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(
        f"{gpu}, torch {torch.__version__}: {args.samples} samples x {args.parts} partitions "
        f"(lengths 1-{args.max_len}), dim {args.dim}, hidden {args.hidden}",
        flush=True,
    )
    print(f"kernelwright.compile vs eager, max relative error: {check_numerics(args):.2e}")
    rows = [measure("eager", args), measure("kernelwright", args)]
    rows.append(_plain_compile_in_subprocess(args))
    eager = rows[0]
    for r in rows:
        if "error" in r:
            print(f"{r['provider']:14s} {r['error']}")
            continue
        print(
            f"{r['provider']:14s} encoder fwd+bwd {r['encoder_ms']:9.2f} ms "
            f"({eager['encoder_ms'] / r['encoder_ms']:6.1f}x eager; first call "
            f"{r['encoder_first_ms'] / 1e3:6.1f} s)   train step {r['step_ms']:9.2f} ms "
            f"({eager['step_ms'] / r['step_ms']:6.1f}x; first {r['step_first_ms'] / 1e3:6.1f} s)"
        )
    for line in rows[1]["sites"]:
        print("  ", line)


if __name__ == "__main__":
    main()
