"""The create workflow over the whole corpus (examples/create/) on a GPU: generate, test, time.

    python benchmarks/create_corpus.py [--jobs 8] [--workers auto] [--only relu_squared,dyt]

Phase 1 runs `kernelwright create <ref> --yes --bench none` for every reference, `--jobs` at a
time, spread over the visible GPUs (each generated test suite runs in its own process;
correctness does not care what else the GPU runs). Phase 2 times every verified kernel against
its reference, eager and under torch.compile: one reference per task, `--workers` GPUs at once
and one task per GPU (timings do care; runtime/fanout.py, Ray when installed); 1, the default,
times them one after the other in this process. This process records the rows in the results
database, each with the GPU that measured it. Writes to $OUT (or --out): create_corpus.csv (the
harness's rows), corpus_summary.csv (one line per reference and mode: speed-ups at the largest
shape, memory), summary.md with the geometric means, and each reference's workspace under
runs/. Tier-3 references must stop cleanly: they are listed too.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "examples" / "create"


def phase1(src: Path, runs: Path, gpu: str | None) -> tuple[str, int, str, float]:
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "kernelwright.cli", "create", str(src), "--yes", "--bench",
           "none"]  # fmt: skip
    # run from `runs`: the workspace lands in runs/kernelwright-runs/create/<name>
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    proc = subprocess.run(cmd, cwd=runs, env=env, capture_output=True, text=True)
    out = (proc.stdout + proc.stderr).strip().splitlines()
    return src.stem, proc.returncode, out[-1] if out else "", time.perf_counter() - t0


def phase2(job: tuple[str, str, bool, str, str]) -> list:
    """Time one verified reference (in a fan-out worker: on its GPU alone) and return the rows.

    The generated bench records its rows itself; here that goes to a throwaway file and the
    parent records the rows it gets back (a Ray worker may run on another machine). Each row is
    also appended to `partial` (a CSV) as it lands, so that a reference stopped past the
    timeout keeps the rows it timed (`kept_rows`)."""
    import importlib
    import tempfile

    from kernelwright.bench.report import write_csv

    name, pkg, full, source, partial = job
    sys.path.insert(0, pkg)
    old = os.environ.get("KERNELWRIGHT_RESULTS_DB")
    Path(partial).unlink(missing_ok=True)

    def landed(row) -> None:
        write_csv([row], partial, append=True)

    try:
        with tempfile.TemporaryDirectory() as tmp:
            os.environ["KERNELWRIGHT_RESULTS_DB"] = str(Path(tmp) / "unused.db")
            bench = importlib.import_module(f"{name}.bench_{name}")
            return bench.run(quick=not full, source=source, on_row=landed)
    finally:
        sys.path.remove(pkg)
        if old is None:
            os.environ.pop("KERNELWRIGHT_RESULTS_DB", None)
        else:
            os.environ["KERNELWRIGHT_RESULTS_DB"] = old


def kept_rows(partial: Path) -> tuple[list, str]:
    """The rows a stopped reference timed before it stopped (its `partial` CSV; none where the
    worker ran on another machine), and what they leave out, e.g. "no torch_compile rows"."""
    from kernelwright.bench.report import read_csv

    if not partial.is_file():
        return [], "no rows"
    try:
        rows = [r for r in read_csv(partial) if r.ok]
    except (ValueError, KeyError, TypeError):  # a row cut off as the worker was stopped
        lines = partial.read_text().splitlines()
        partial.write_text("\n".join(lines[:-1]) + "\n")
        rows = [r for r in read_csv(partial) if r.ok] if len(lines) > 2 else []
    have = {r.provider for r in rows}
    missing = [p for p in ("kernelwright", "torch", "torch_compile") if p not in have]
    shapes = sorted({r.shape for r in rows})
    gap = f"no {', '.join(missing)} rows" if missing else "some shapes or modes untimed"
    return rows, f"{len(rows)} rows kept at {', '.join(shapes) or 'no shape'}; {gap}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument(
        "--workers", default="1", help="phase 2: GPUs timing at once, one reference each (auto)"
    )
    ap.add_argument("--only", default="")
    ap.add_argument("--full", action="store_true", help="each profile's whole sweep")
    ap.add_argument("--no-bench", action="store_true", help="phase 1 only: generate and test")
    ap.add_argument(
        "--bench-only", action="store_true", help="phase 2 only, on an earlier phase 1's --out"
    )
    ap.add_argument(
        "--timeout", type=float, default=240.0,
        help="phase 2: seconds one reference's timing may take; past it that reference is not "
        "timed (the reason is in the summary) and the rest go on; 0: no limit",
    )  # fmt: skip
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "create-corpus")))
    args = ap.parse_args()

    import torch

    from kernelwright.bench.context import git_commit
    from kernelwright.bench.db import new_run_id, record
    from kernelwright.bench.report import write_csv
    from kernelwright.runtime.fanout import parse_workers, run_tasks, visible_gpus
    from kernelwright.workflows.create.bench import compare, geomean

    try:
        workers = parse_workers(args.workers)
    except ValueError as e:
        sys.exit(f"create_corpus: --workers: {e}")

    if not torch.cuda.is_available():
        sys.exit("create_corpus: the timings need a CUDA GPU")
    args.out.mkdir(parents=True, exist_ok=True)
    runs = (args.out / "runs").resolve()
    runs.mkdir(exist_ok=True)
    only = {s for s in args.only.split(",") if s}
    refs = sorted(p for p in CORPUS.glob("*.py") if not only or p.stem in only)

    status: dict[str, tuple[int, str, float]] = {}
    if args.bench_only:  # what phase 1 verified: a package whose report says its tests passed
        for ref in refs:
            work = runs / "kernelwright-runs" / "create" / ref.stem
            report = work / "report.md"
            passed = report.is_file() and "**verify passed" in report.read_text()
            if passed and (work / "pkg" / ref.stem).is_dir():
                status[ref.stem] = (0, "verified earlier", 0.0)
            elif (work / "pkg").is_dir():  # generated, but its tests failed: not timed
                status[ref.stem] = (1, "verify failed earlier", 0.0)
            else:
                status[ref.stem] = (2, "", 0.0)
    else:
        print(f"phase 1: create --yes --bench none for {len(refs)} references", flush=True)
    gpus = visible_gpus() or [None]
    todo = [] if args.bench_only else refs
    on = [gpus[i % len(gpus)] for i in range(len(todo))]  # round robin over the GPUs
    with ThreadPoolExecutor(args.jobs) as pool:
        for name, rc, last, secs in pool.map(lambda p, g: phase1(p, runs, g), todo, on):
            status[name] = (rc, last, secs)
            verdict = {0: "verified", 2: "stopped (tier 3)"}.get(rc, f"FAILED rc={rc}")
            print(f"  {name:22s} {verdict:18s} {secs:5.1f}s  {last}", flush=True)
            if rc == 1:  # the last test log's failures, so a remote run shows why
                logs = sorted((runs / "kernelwright-runs/create" / name).glob("test_attempt*.log"))
                text = logs[-1].read_text().splitlines() if logs else []
                for ln in [x for x in text if x.startswith(("E ", "FAILED"))][:12]:
                    print(f"      {ln[:200]}", flush=True)

    failed = sorted(n for n, (rc, _, _) in status.items() if rc not in (0, 2))
    print(f"phase 1: {sum(rc == 0 for rc, _, _ in status.values())} verified, "
          f"{sum(rc == 2 for rc, _, _ in status.values())} stopped (tier 3), "
          f"failed: {', '.join(failed) or 'none'}", flush=True)  # fmt: skip
    if args.no_bench:
        return
    print(f"phase 2: benchmarks (kernelwright vs eager vs torch.compile), workers {workers}",
          flush=True)  # fmt: skip
    verified = [ref for ref in refs if status[ref.stem][0] == 0]
    partials = runs / "partial"  # each reference's rows as they land (kept_rows)
    partials.mkdir(exist_ok=True)
    jobs = [(ref.stem, str(runs / "kernelwright-runs" / "create" / ref.stem / "pkg"), args.full,
             str(ref), str(partials / f"{ref.stem}.csv")) for ref in verified]  # fmt: skip
    rows, summary = [], []

    def arrived(res) -> None:
        # each reference's rows are recorded and written as they come: a run cut short (a
        # time limit, a lost machine) keeps every reference it timed
        name = verified[res.index].stem
        if not res.ok:
            print(f"  {name:22s} phase 2 FAILED: {res.error}\n{res.traceback}", flush=True)
            got, kept = kept_rows(partials / f"{name}.csv")
            why = f"phase 2: {res.error.splitlines()[0][:200]}; {kept}"
            status[name] = (3, why, status[name][2])
            if not got:
                return
            print(f"  {name:22s} {kept}", flush=True)
        else:
            got = res.value
        record(got, source="create", run_id=new_run_id())  # the results database
        rows.extend(got)
        for c in compare(got):
            summary.append({"op": name, **c.__dict__})
            mem = f"{c.kernel_mb:.0f}/{c.eager_mb:.0f}/{c.compile_mb:.0f} MB"
            print(f"  {name:22s} {c.shape:12s} {c.mode:8s} kernel {c.kernel_ms:.4f} ms  "
                  f"{c.vs_eager:5.2f}x eager  {c.vs_compile:5.2f}x compile  mem {mem}",
                  flush=True)  # fmt: skip
        write_csv(rows, args.out / "create_corpus.csv")

    # a peer can stall a reference for minutes (torch.compile of a cumprod on long rows): with
    # a timeout, each reference runs in a worker process that is stopped past it
    run_tasks(phase2, jobs, workers=workers, labels=[r.stem for r in verified],
              progress=lambda line: print(line, flush=True), on_result=arrived,
              env={"KERNELWRIGHT_COMMIT": git_commit()},
              timeout_s=args.timeout or None)  # fmt: skip
    rows.sort(key=lambda r: r.op)  # the corpus's order, whatever order the GPUs finished in
    summary.sort(key=lambda s: s["op"])
    write_csv(rows, args.out / "create_corpus.csv")
    with open(args.out / "corpus_summary.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(summary[0]) if summary else ["op"])
        w.writeheader()
        w.writerows(summary)
    lines = [f"# create corpus on {rows[0].gpu if rows else '?'}", "",
             f"torch {torch.__version__}, commit {rows[0].commit if rows else '?'}", "",
             "| mode | geomean vs eager | geomean vs compile | min vs compile (op, shape) |",
             "|---|---|---|---|"]  # fmt: skip
    for mode in ("forward", "backward", "full"):
        sel = [s for s in summary if s["mode"] == mode]
        if not sel:
            continue
        worst = min(sel, key=lambda s: s["vs_compile"] if math.isfinite(s["vs_compile"]) else 9)
        lines.append(
            f"| {mode} | {geomean([s['vs_eager'] for s in sel]):.2f}x | "
            f"{geomean([s['vs_compile'] for s in sel]):.2f}x | {worst['vs_compile']:.2f}x "
            f"({worst['op']}, {worst['shape']}) |"
        )
    untimed = sorted(n for n, (rc, _, _) in status.items() if rc == 3)
    counts = [sum(rc in (0, 3) for rc, _, _ in status.values()),
              sum(rc == 2 for rc, _, _ in status.values()), len(failed)]  # fmt: skip
    which = f" ({', '.join(untimed)}: see below)" if untimed else ""
    lines += ["", f"{len(status)} references: {counts[0]} verified, {counts[1]} stopped with "
              f"a reason (tier 3), {counts[2]} failed; {len(untimed)} verified but not timed "
              f"in full{which}"]  # fmt: skip
    lines += ["", "| reference | phase 1 | seconds |", "|---|---|---|"]
    lines += [f"| {n} | {'rc=' + str(rc)} {last} | {s:.0f} |" for n, (rc, last, s) in
              status.items()]  # fmt: skip
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
