"""Hugging Face transformers integration: apply a ModelProfile to a model instance.

Importing this package imports transformers; `import kernelwright` does not (it reaches
`kernelwright.patch` and friends lazily).
"""

from kernelwright.integrations.transformers.patch import (
    KernelwrightCallback,
    PatchedModule,
    PatchRecord,
    from_pretrained,
    is_patched,
    patch,
    patch_record,
    unpatch,
)

__all__ = [
    "KernelwrightCallback",
    "PatchRecord",
    "PatchedModule",
    "from_pretrained",
    "is_patched",
    "patch",
    "patch_record",
    "unpatch",
]
