"""Benchmark declarations: one `BenchSpec` per op, registered in `SPECS`, a module per family.

`base` holds the types and the provider builders; each family module (`norms`, `softmax`,
`activations`, `jagged`, `rope`, `losses`) declares its ops' specs and registers them on
import. Our op's module and functions come from the op registry (`kernelwright.registry`), so
a spec names an op, never a module path. To benchmark a new op, see `base`'s docstring.
"""

from kernelwright.bench.specs.base import (
    MODES,
    SPECS,
    BenchSpec,
    Builder,
    Inputs,
    Provider,
    Shape,
    Sweep,
    call,
    compiled,
    get_spec,
    importable,
    op_torch_providers,
    ours,
    register,
    torch_providers,
    unary_providers,
)

# Imported in this order, so SPECS lists the ops as the registry does.
from kernelwright.bench.specs.norms import (  # isort: skip
    EPS,
    FUSED_ADD_RMS_NORM,
    L2_NORM,
    LAYER_NORM,
    LN_EPS,
    RMS_NORM,
)
from kernelwright.bench.specs.softmax import SOFTMAX, SOFTMAX_ROWS  # isort: skip
from kernelwright.bench.specs.activations import GEGLU, RELU_SQUARED, SWIGLU  # isort: skip
from kernelwright.bench.specs.jagged import JAGGED_MEAN  # isort: skip
from kernelwright.bench.specs.rope import ROPE, ROPE_THETA, HeadConfigSweep  # isort: skip
from kernelwright.bench.specs.losses import (  # isort: skip
    CROSS_ENTROPY,
    FUSED_LINEAR_CROSS_ENTROPY,
    IGNORE_INDEX,
    IGNORED_FRACTION,
)

__all__ = [
    "CROSS_ENTROPY",
    "EPS",
    "FUSED_ADD_RMS_NORM",
    "FUSED_LINEAR_CROSS_ENTROPY",
    "GEGLU",
    "IGNORED_FRACTION",
    "IGNORE_INDEX",
    "JAGGED_MEAN",
    "L2_NORM",
    "LAYER_NORM",
    "LN_EPS",
    "MODES",
    "RELU_SQUARED",
    "RMS_NORM",
    "ROPE",
    "ROPE_THETA",
    "SOFTMAX",
    "SOFTMAX_ROWS",
    "SPECS",
    "SWIGLU",
    "BenchSpec",
    "Builder",
    "HeadConfigSweep",
    "Inputs",
    "Provider",
    "Shape",
    "Sweep",
    "call",
    "compiled",
    "get_spec",
    "importable",
    "op_torch_providers",
    "ours",
    "register",
    "torch_providers",
    "unary_providers",
]
