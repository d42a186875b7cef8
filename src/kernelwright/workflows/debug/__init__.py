"""The debug workflow: bisect a numerical divergence of an op from its fp32 reference.

Stage 1 (Plan) resolves the op, its reference, inputs and tolerances into a `DebugProfile`;
Stage 2 (Bisect) probes one axis at a time (case, dtype, shape regime, layout, value regime,
launch config), names the first divergence and its regime, shrinks its input and writes
`repro.py` and `report.md`. See `run.debug_op` and `kernelwright debug --help`.
"""

from kernelwright.workflows.debug.run import DebugOptions, DebugResult, debug_op
from kernelwright.workflows.debug.target import TargetError, plan

__all__ = ["DebugOptions", "DebugResult", "TargetError", "debug_op", "plan"]
