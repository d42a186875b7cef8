"""Verify: run the generated tests in a subprocess, classify failures, repair up to 3 times.

Hard gates (an import or compile error, a crash, wrong numbers) block; a soft gate (a tolerance
missed by a small margin) is reported. A repair regenerates and logs why in `profile.repairs`:
when a gradient is wrong and the profile stores intermediates for the backward, first the stored
values in the input's dtype are widened to fp32, then they are recomputed instead; otherwise
(and after those) with the next, smaller launch config, until the smallest has failed too.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kernelwright.profiles.kernel import KernelProfile, Repair
from kernelwright.workflows.create.codegen import launch_configs, launch_repairs, write

MAX_REPAIRS = 3
BENCH_MODES = ("quick", "full", "none")
_HARD_ERRORS = ("ImportError", "SyntaxError", "CompilationError", "NameError", "TypeError",
                "error during collection", "AttributeError")  # fmt: skip


@dataclass
class Attempt:
    attempt: int
    config: dict
    gate: str  # "pass", "soft", "hard"
    reason: str
    log: Path


@dataclass
class VerifyResult:
    passed: bool
    gate: str
    attempts: list[Attempt] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)


@dataclass
class BenchResult:
    note: str  # one line for the report
    comparisons: list = field(default_factory=list)  # bench.Comparison per shape and mode
    findings: list[str] = field(default_factory=list)  # soft gates and provider errors
    csv: Path | None = None


def classify(returncode: int, output: str) -> tuple[str, str]:
    """(gate, reason) from a pytest run."""
    if returncode == 0:
        return "pass", "all generated tests pass"
    lines = [ln for ln in output.splitlines() if ln.startswith("E ")]
    first = lines[0][1:].strip() if lines else output.strip().splitlines()[-1:][0:1]
    first = first if isinstance(first, str) else " ".join(first)
    if any(e in output for e in _HARD_ERRORS) and "Mismatched elements" not in output:
        return "hard", f"import/compile error: {first}"
    rel = [float(m) for m in re.findall(r"Greatest relative difference: ([0-9.e+-]+)", output)]
    if rel and max(rel) < 0.05:
        return "soft", f"tolerance at the edge (max relative difference {max(rel):.3g})"
    if _crashed(returncode, output):
        return "hard", f"crash: {first}"
    return "hard", f"wrong numbers: {first}"


def _crashed(returncode: int, output: str) -> bool:
    """Whether a failed run raised (or died) rather than compared and found values apart: the
    first error pytest shows is an exception other than an assertion, or the process was
    killed by a signal or Python's fatal error handler."""
    if returncode < 0 or "Fatal Python error" in output or "Segmentation fault" in output:
        return True
    if "Mismatched elements" in output or "not close" in output:
        return False
    first = re.search(r"^E\s+((?:\w+\.)*[A-Z]\w*)(?::|$)", output, re.M)
    return first is not None and first.group(1).rpartition(".")[2] != "AssertionError"


def run_tests(pkg_root: Path, name: str, log: Path) -> tuple[int, str]:
    (pkg_root / "pytest.ini").write_text("[pytest]\n")  # isolate from any enclosing config
    env = dict(os.environ)
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           f"{name}/test_{name}.py"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=pkg_root, env=env, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    log.write_text(out)
    return proc.returncode, out


def stored_repair(profile: KernelProfile, output: str, reason: str) -> Repair | None:
    """A repair of `profile.stored` for a failed gradient (applied to the profile), or None.

    A stored intermediate rounded to a 16-bit input dtype is the likeliest cause of a backward
    that misses its tolerance when the forward passes: widen it to fp32; if the profile stores
    nothing narrower, recompute the stored intermediates from the inputs (the default)."""
    # the generated tests' assertion names what failed: "grad of input 0: Tensor-likes ..."
    if not profile.stored or not re.search(r"^E .*grad of input \d+:", output, re.M):
        return None
    attempt = len(profile.repairs) + 1
    narrow = [t for t in profile.stored if t.dtype == "same"]
    names = ", ".join(t.name for t in (narrow or profile.stored))
    if narrow:
        for t in narrow:
            t.dtype = "fp32"
            t.reason = f"widened to fp32 by Verify repair {attempt}; was: {t.reason}"
        change = f"stored {names}: input dtype -> fp32"
    else:
        profile.stored = []
        change = f"stored {names} -> recomputed in the backward"
    return Repair(attempt=attempt, change=change, reason=f"a gradient failed: {reason}",
                  kind="stored")  # fmt: skip


def verify(profile: KernelProfile, workdir: str | Path) -> VerifyResult:
    """Generate under workdir/pkg, test, repair with smaller configs; profile.repairs grows."""
    workdir = Path(workdir)
    pkg_root = workdir / "pkg"
    result = VerifyResult(passed=False, gate="hard")
    while True:
        k = len(profile.repairs)
        files = write(profile, pkg_root)
        log = workdir / f"test_attempt{k}.log"
        rc, out = run_tests(pkg_root, profile.name, log)
        gate, reason = classify(rc, out)
        configs = launch_configs(profile)
        launch = launch_repairs(profile)
        cfg = configs[min(launch, len(configs) - 1)]
        result.attempts.append(Attempt(k, cfg, gate, reason, log))
        result.files, result.gate = files, gate
        # a smaller launch config cannot fix code that does not import or compile
        if gate in ("pass", "soft") or k >= MAX_REPAIRS or reason.startswith("import/"):
            result.passed = gate != "hard"
            break
        repair = stored_repair(profile, out, reason)
        if repair is None:
            if launch + 1 >= len(configs):  # the smallest config failed too: nothing left to try
                result.attempts[-1].reason += f" (no smaller launch config than {cfg} to try)"
                break
            nxt = configs[launch + 1]
            repair = Repair(attempt=k + 1, change=f"launch config {cfg} -> {nxt}", reason=reason)
        profile.repairs.append(repair)
    return result


def _reference_path(source: str) -> str:
    """The reference as the benchmark subprocess (another cwd) can load it."""
    file_part, sep, target = source.partition(":")
    if file_part.endswith(".py") and Path(file_part).is_file():
        return str(Path(file_part).resolve()) + sep + target
    return source  # package.module:function, importable from the original cwd (on the path)


def benchmark(profile: KernelProfile, workdir: str | Path, mode: str = "quick") -> BenchResult:
    """Time the generated kernel against the reference, eager and compiled (GPU only).

    mode: "quick" (two token counts at the profile's main column count), "full" (the
    profile's sweep) or "none". Runs `bench_<name>` in a subprocess, as a user would; its
    CSV, log and plots land in the workspace. Slower than eager, or more than 10% slower than
    torch.compile, or more memory than eager: soft findings, reported, never a pass/fail.
    """
    from kernelwright.bench.report import read_csv, write_plots
    from kernelwright.workflows.create.bench import compare, soft_findings

    if mode not in BENCH_MODES:
        raise ValueError(f"benchmark mode must be one of {BENCH_MODES}, got {mode!r}")
    if mode == "none":
        return BenchResult("benchmark: skipped (--bench none)")
    if not torch.cuda.is_available():
        return BenchResult(
            f"benchmark: GPU only (no CUDA device here); on a GPU, from {Path(workdir) / 'pkg'}: "
            f"python -m {profile.name}.bench_{profile.name}"
        )
    workdir = Path(workdir)
    pkg_root, name = workdir / "pkg", profile.name
    csv, log = (workdir / "bench.csv").resolve(), workdir / "bench.log"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(pkg_root.resolve()), os.getcwd(),
                                         env.get("PYTHONPATH", "")])  # fmt: skip
    cmd = [sys.executable, "-m", f"{name}.bench_{name}", "--csv", str(csv),
           "--source", _reference_path(profile.source)]  # fmt: skip
    cmd += ["--full"] if mode == "full" else []
    proc = subprocess.run(cmd, cwd=pkg_root, env=env, capture_output=True, text=True)
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0 or not csv.is_file():
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:]
        return BenchResult(f"benchmark: FAILED ({' '.join(tail)}); see {log}")
    rows = read_csv(csv)
    comparisons = compare(rows)
    findings = soft_findings(comparisons)
    errors = sorted({f"{r.provider}: {r.error}" for r in rows if r.error})
    plots = write_plots(rows, workdir)
    gpu = rows[0].gpu if rows else "?"
    text = (f"benchmark ({mode}, {gpu}, bf16, GPU time alone; host time in host_ms): "
            f"{csv.name}, " + ", ".join(p.name for p in plots))  # fmt: skip
    return BenchResult(text, comparisons, findings + errors, csv)
