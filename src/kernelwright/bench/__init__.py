"""Benchmark harness: specs (what to run, a module per op family; our ops' modules and functions
come from the op registry), harness (timing, memory, bandwidth), report (CSV, plots, summary),
models (the shape registry); train_models and train_report hold benchmarks/train_step.py's model
cuts, input batches and results.

    from kernelwright.bench import SPECS, make_context, run_spec, write_csv, print_summary
    ctx = make_context()                      # device, versions, commit, copy bandwidth (once)
    rows = run_spec(SPECS["rms_norm"], ctx=ctx, quick=True)
    write_csv(rows, "out/rms_norm.csv"); print_summary(rows)
"""

from kernelwright.bench.harness import (
    COLUMNS,
    BenchRow,
    RunContext,
    Timer,
    cuda_timer,
    default_timer,
    interpreter_timer,
    make_context,
    measure_copy_bandwidth,
    plan,
    run_spec,
    select_providers,
)
from kernelwright.bench.models import MODELS, ModelConfig
from kernelwright.bench.report import (
    print_summary,
    read_csv,
    summarize,
    summary_markdown,
    write_csv,
    write_plots,
)
from kernelwright.bench.specs import MODES, SPECS, BenchSpec, Provider, Sweep, get_spec, register

__all__ = [
    "COLUMNS",
    "MODELS",
    "MODES",
    "SPECS",
    "BenchRow",
    "BenchSpec",
    "ModelConfig",
    "Provider",
    "RunContext",
    "Sweep",
    "Timer",
    "cuda_timer",
    "default_timer",
    "get_spec",
    "interpreter_timer",
    "make_context",
    "measure_copy_bandwidth",
    "plan",
    "print_summary",
    "read_csv",
    "register",
    "run_spec",
    "select_providers",
    "summarize",
    "summary_markdown",
    "write_csv",
    "write_plots",
]
