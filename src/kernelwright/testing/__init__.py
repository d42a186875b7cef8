"""Correctness harness: input factories, tolerance tables, poisoning, reference comparison."""

from kernelwright.runtime.alloc import poisoned
from kernelwright.testing.compare import (
    CheckReport,
    CheckRow,
    check_op,
    check_op_seeds,
    rel_norm_error,
)
from kernelwright.testing.inputs import (
    LAYOUTS,
    class_targets,
    generator,
    large_offset_rows,
    rand,
)
from kernelwright.testing.tolerances import DEFAULT_TOLERANCES, Tolerance

__all__ = [
    "class_targets",
    "DEFAULT_TOLERANCES",
    "LAYOUTS",
    "CheckReport",
    "CheckRow",
    "Tolerance",
    "check_op",
    "check_op_seeds",
    "generator",
    "large_offset_rows",
    "poisoned",
    "rand",
    "rel_norm_error",
]
