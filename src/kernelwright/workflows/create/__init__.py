"""create: a PyTorch reference → a reviewed KernelProfile → a generated Triton kernel.

Stage 1 (Understand) lives here: `load_reference` (file, module or package.module:function),
`trace` (aten forward/backward graphs through AOT Autograd) and `understand` (the profile).
"""

from kernelwright.workflows.create.load import Reference, ReferenceError, load_reference
from kernelwright.workflows.create.trace import TraceError, trace
from kernelwright.workflows.create.understand import understand

__all__ = [
    "Reference",
    "ReferenceError",
    "TraceError",
    "load_reference",
    "trace",
    "understand",
]
