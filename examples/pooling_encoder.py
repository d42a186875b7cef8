"""A recommendation-style encoder written plainly, and what kernelwright.compile does to it.

Each sample has several partitions (user-history fields) of jagged length; every item is
embedded, each partition is mean-pooled with a Python loop over the partition offsets, the
pooled partitions of a sample are concatenated and go through an MLP tower. A training step
adds a linear head, a loss and AdamW.

    python3 examples/pooling_encoder.py                       # GPU: one size, printed
    python3 examples/pooling_encoder.py --sizes 2048:200:256,8192:1000:512 --limit 60 --out DIR
    python3 examples/pooling_encoder.py --samples 8 --parts 3 --max-len 5 --dim 16   # CPU

--sizes: PARTITIONS:MAX_LEN:DIM triples (samples = partitions / --parts; lengths 1..MAX_LEN).
Per size, each provider — eager, kernelwright.compile, plain torch.compile — runs in its own
child process under a time limit (--limit s for the compiled ones): plain torch.compile unrolls
the loop through Dynamo one partition at a time and may not finish compiling; it is then
reported as such. In
each: forward+backward of the encoder and one training step, median ms of up to --reps calls
(fewer when a call is slow: --budget s per figure) after a first call whose time (compile
included) is reported on its own. The compiled providers' encoder output and gradients are
compared with eager's (same model, same batch; max relative error). --out DIR writes
pooling_encoder.csv and pooling_encoder.md there (GPU, torch and triton versions, the command).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

PROVIDERS = ("eager", "kernelwright", "torch_compile")  # eager first: the reference
NAMES = {"eager": "eager", "kernelwright": "kernelwright.compile", "torch_compile": "torch.compile"}
_MARK = "@@ "  # a child's line of figures so far (JSON), read even when it is killed


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


# --------------------------------------------------------------------------- one provider


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _timed(fn, device, reps: int, budget_s: float) -> tuple[float, float, int]:
    """(first call ms, median ms of the next calls, how many): up to `reps`, at least one,
    no more once another would pass `budget_s` seconds in all."""
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    first = (time.perf_counter() - t0) * 1e3
    times: list[float] = []
    while not times or (len(times) < reps and sum(times) + times[-1] <= budget_s * 1e3):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return first, statistics.median(times), len(times)


def _report(row: dict) -> None:
    print(_MARK + json.dumps(row), flush=True)


def measure(provider: str, args, ref: Path | None = None) -> dict:
    """Encoder fwd+bwd and a training step for one provider, in this process. Eager writes
    its encoder output and gradients to `ref`; a compiled provider reads them and reports its
    largest relative error against them. Prints the figures as they come (`_MARK` lines)."""
    import kernelwright

    device = args.device
    torch.manual_seed(0)
    model = Model(Encoder(args.vocab, args.dim, args.parts, args.hidden), args.hidden).to(device)
    ids, offsets, labels = make_batch(args.samples, args.parts, args.max_len, args.vocab, device, 1)
    report = kernelwright.compile.CompileReport()
    if provider == "kernelwright":
        encoder = kernelwright.compile(model.encoder, report=report, backend=args.backend)
        step_model = kernelwright.compile(model, backend=args.backend)
    elif provider == "torch_compile":
        encoder = torch.compile(model.encoder, backend=args.backend)
        step_model = torch.compile(model, backend=args.backend)
    else:
        encoder, step_model = model.encoder, model
    last = {}

    def encoder_fwd_bwd():
        model.zero_grad(set_to_none=True)
        last["out"] = encoder(ids, offsets)
        last["out"].sum().backward()

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def train_step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(step_model(ids, offsets), labels)
        loss.backward()
        opt.step()

    row: dict = {"provider": provider}
    first, ms, n = _timed(encoder_fwd_bwd, device, args.reps, args.budget)
    row.update(encoder_first_s=first / 1e3, encoder_ms=ms, encoder_reps=n)
    _report(row)
    got = [last["out"].detach()] + [p.grad for p in model.encoder.parameters()]
    if provider == "eager" and ref is not None:
        torch.save([t.cpu() for t in got], ref)
    elif ref is not None and ref.exists():
        want = torch.load(ref)
        row["max_rel_err"] = max(
            ((g.cpu() - w).abs().max() / w.abs().max().clamp_min(1e-12)).item()
            for g, w in zip(got, want, strict=True)
        )
    _report(row)
    first, ms, n = _timed(train_step, device, args.reps, args.budget)
    row.update(step_first_s=first / 1e3, step_ms=ms, step_reps=n, sites=[s.line() for s in report])
    _report(row)
    return row


def _child_args(args, size: dict) -> list[str]:
    keep = {k: v for k, v in vars(args).items() if k in _SIZE_ARGS} | size
    return [f"--{k.replace('_', '-')}={v}" for k, v in keep.items()]


def run_provider(provider: str, args, size: dict, ref: Path) -> dict:
    """One provider at one size in a child process of at most `args.limit` seconds (eager:
    `args.eager_limit`); the figures it printed before a timeout are kept, with a status
    saying where it stopped."""
    cmd = [sys.executable, os.path.abspath(__file__), "--only", provider, "--ref", str(ref)]
    cmd += _child_args(args, size)
    status = "ok"
    # its own process group: a timeout ends Inductor's compile workers with it
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    limit = args.eager_limit if provider == "eager" else args.limit
    try:
        out, err = proc.communicate(timeout=limit)
        if proc.returncode != 0:
            lines = [ln for ln in err.strip().splitlines() if ln.strip()]
            status = f"failed: {lines[-1][:200] if lines else f'exit {proc.returncode}'}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()  # what it printed before
        status = "timeout"
    row: dict = {"provider": provider}
    for line in out.splitlines():
        if line.startswith(_MARK):
            row.update(json.loads(line[len(_MARK) :]))
    if status == "timeout":
        if "encoder_ms" not in row:
            status = f"did not finish compiling in {limit} s"
        elif "step_first_s" not in row:
            status = f"encoder measured; the training step did not finish in {limit} s"
    row["status"] = status
    return row


# --------------------------------------------------------------------------- the table

COLUMNS = (
    "gpu", "torch", "triton", "partitions", "samples", "parts", "max_len", "dim", "hidden",
    "provider", "status", "encoder_ms", "encoder_x_eager", "encoder_first_s", "step_ms",
    "step_x_eager", "step_first_s", "max_rel_err", "encoder_reps", "step_reps",
)  # fmt: skip


def environment(device: str) -> dict:
    import importlib.metadata

    try:
        triton = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton = ""
    gpu = torch.cuda.get_device_name() if torch.device(device).type == "cuda" else "cpu"
    return {"gpu": gpu, "torch": torch.__version__, "triton": triton}


def with_speedups(rows: list[dict]) -> list[dict]:
    """Each row's encoder and step speed over eager's at the same size."""
    eager = {(r["partitions"], r["max_len"], r["dim"]): r for r in rows if r["provider"] == "eager"}
    for r in rows:
        e = eager.get((r["partitions"], r["max_len"], r["dim"]), {})
        for what in ("encoder", "step"):
            if r.get(f"{what}_ms") and e.get(f"{what}_ms"):
                r[f"{what}_x_eager"] = e[f"{what}_ms"] / r[f"{what}_ms"]
    return rows


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1e-2 else f"{v:,.2f}"
    return "" if v is None else str(v)


def write_outputs(rows: list[dict], out: Path, env: dict, command: str) -> tuple[Path, Path]:
    """pooling_encoder.csv (one row per size and provider) and pooling_encoder.md in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out / "pooling_encoder.csv", out / "pooling_encoder.md"
    with csv_path.open("w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows({**env, **r} for r in rows)
    head = ["partitions", "lengths", "D", "provider", "encoder fwd+bwd ms", "x eager",
            "first call s", "train step ms", "x eager", "first step s", "max rel err",
            "status"]  # fmt: skip
    lines = [
        f"# Pooling encoder: {env['gpu']}, torch {env['torch']}, triton {env['triton']}",
        "",
        f"`{command}`",
        "",
        "First call: compile included. Max rel err: the encoder's output and gradients against "
        "eager's (fp32).",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in rows:
        cells = [r["partitions"], f"1-{r['max_len']}", r["dim"], NAMES[r["provider"]]]
        cells += [r.get(k) for k in ("encoder_ms", "encoder_x_eager", "encoder_first_s")]
        cells += [r.get(k) for k in ("step_ms", "step_x_eager", "step_first_s", "max_rel_err")]
        lines.append("| " + " | ".join(_fmt(c) for c in [*cells, r["status"]]) + " |")
    sites = [(r, s) for r in rows if r["provider"] == "kernelwright" for s in r.get("sites", [])]
    if sites:
        lines += ["", "kernelwright.compile's sites:", ""]
        lines += [f"- {r['partitions']}:{r['max_len']}:{r['dim']}: {s}" for r, s in sites]
    md_path.write_text("\n".join(lines) + "\n")
    return csv_path, md_path


# --------------------------------------------------------------------------- main

_SIZE_ARGS = ("samples", "parts", "max_len", "dim", "hidden", "vocab", "reps", "device",
              "budget", "backend")  # fmt: skip


def parse_sizes(text: str, parts: int) -> list[dict]:
    """ "2048:200:256,8192:1000:512" -> [{"samples": 512, "max_len": 200, "dim": 256}, ...]."""
    sizes = []
    for item in filter(None, text.split(",")):
        partitions, max_len, dim = (int(x) for x in item.split(":"))
        if partitions % parts:
            raise SystemExit(f"--sizes {item}: {partitions} partitions are not a multiple of "
                             f"--parts {parts}")  # fmt: skip
        sizes.append({"samples": partitions // parts, "max_len": max_len, "dim": dim})
    return sizes


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--parts", type=int, default=4)
    p.add_argument("--max-len", type=int, default=200)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--sizes", default="", help="PARTITIONS:MAX_LEN:DIM,... (several sizes)")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--vocab", type=int, default=100_000)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--budget", type=float, default=10.0, help="seconds of reps per figure")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--backend", default="inductor", help="the compiled providers' backend")
    p.add_argument("--limit", "--compile-limit", dest="limit", type=int, default=300,
                   help="seconds per compiled provider and size (its child process)")  # fmt: skip
    p.add_argument("--eager-limit", type=int, default=900,
                   help="seconds for eager's child (it compiles nothing)")  # fmt: skip
    p.add_argument("--providers", default=",".join(PROVIDERS))
    p.add_argument("--out", type=Path, default=None, help="write the CSV and markdown here")
    p.add_argument("--only", default=None, help=argparse.SUPPRESS)  # a child: one provider
    p.add_argument("--ref", type=Path, default=None, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> list[dict]:
    args = parser().parse_args(argv)
    if args.only:
        return [measure(args.only, args, args.ref)]
    sizes = parse_sizes(args.sizes, args.parts) or [
        {"samples": args.samples, "max_len": args.max_len, "dim": args.dim}
    ]
    env = environment(args.device)
    print(f"{env['gpu']}, torch {env['torch']}, triton {env['triton']}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, size in enumerate(sizes):
            ref = Path(tmp) / f"eager_{i}.pt"
            for provider in args.providers.split(","):
                row = run_provider(provider, args, size, ref)
                row.update(partitions=size["samples"] * args.parts, parts=args.parts,
                           hidden=args.hidden, **size)  # fmt: skip
                rows.append(row)
                print(_line(row), flush=True)
    with_speedups(rows)
    for r in rows:
        for s in r.get("sites", []):
            print(f"  {r['partitions']}:{r['max_len']}:{r['dim']} {s}")
    if args.out is not None:
        command = "python3 examples/pooling_encoder.py " + " ".join(argv or sys.argv[1:])
        for path in write_outputs(rows, args.out, env, command):
            print("wrote", path)
    return rows


def _line(r: dict) -> str:
    size = f"{r['partitions']} x 1-{r['max_len']} x {r['dim']}"
    figures = "  ".join(
        f"{k} {_fmt(r[k])}"
        for k in ("encoder_ms", "encoder_first_s", "step_ms", "step_first_s", "max_rel_err")
        if k in r
    )
    return f"{size}  {NAMES[r['provider']]:21s} {figures}  [{r['status']}]"


if __name__ == "__main__":
    main()
