"""The optimize workflow: make a correct kernel faster on one GPU without making it wrong or
slower anywhere it is measured.

Stage 1 (Profile) measures the op as it is and writes an `OptimizationProfile`; Stage 2 runs
versioned variants of its launch-config table, each with a lab notebook, a smoke test and
guardrails; Stage 3 (Finalize) writes the winner into the library table behind the op's tests.
See `run.optimize` for the entry point and `kernelwright optimize --help` for the command.
"""

from kernelwright.workflows.optimize.run import (
    OptimizeResult,
    detuned,
    optimize,
    plant_regression,
    restore_table,
)
from kernelwright.workflows.optimize.setup import (
    GateResult,
    OptimizeOptions,
    PreflightError,
)
from kernelwright.workflows.optimize.target import Target, parse_target

__all__ = [
    "GateResult",
    "OptimizeOptions",
    "OptimizeResult",
    "PreflightError",
    "Target",
    "detuned",
    "optimize",
    "parse_target",
    "plant_regression",
    "restore_table",
]
