"""kernelwright: fast, tested Triton kernels for LLM training.

On a machine without a CUDA GPU, importing kernelwright selects Triton's CPU interpreter
(TRITON_INTERPRET=1) so the kernels run — slowly — on CPU tensors.
"""

from kernelwright.runtime.device import ensure_backend

ensure_backend()

# kernelwright.compile(model): a callable module (torch.compile with the graph pass); left out
# of __all__ so that `from kernelwright import *` does not shadow the builtin compile
from kernelwright import compile as compile  # noqa: E402
from kernelwright.compile import compile_backend  # noqa: E402
from kernelwright.ops.cross_entropy import (  # noqa: E402
    CrossEntropyLoss,
    cross_entropy,
    cross_entropy_ref,
)
from kernelwright.ops.fused_add_rms_norm import (  # noqa: E402
    FusedAddRMSNorm,
    fused_add_rms_norm,
    fused_add_rms_norm_ref,
)
from kernelwright.ops.fused_linear_cross_entropy import (  # noqa: E402
    FusedLinearCrossEntropyLoss,
    fused_linear_cross_entropy,
    fused_linear_cross_entropy_ref,
)
from kernelwright.ops.geglu import (  # noqa: E402
    GeGLU,
    GeGLUFused,
    geglu,
    geglu_fused,
    geglu_fused_ref,
    geglu_ref,
)
from kernelwright.ops.jagged_mean import JaggedMean, jagged_mean, jagged_mean_ref  # noqa: E402
from kernelwright.ops.layer_norm import LayerNorm, layer_norm, layer_norm_ref  # noqa: E402
from kernelwright.ops.relu_squared import ReLUSquared, relu_squared, relu_squared_ref  # noqa: E402
from kernelwright.ops.rms_norm import RMSNorm, rms_norm, rms_norm_ref  # noqa: E402
from kernelwright.ops.rope import RoPE, rope, rope_ref, rope_tables  # noqa: E402
from kernelwright.ops.softmax import (  # noqa: E402
    LogSoftmax,
    Softmax,
    log_softmax,
    log_softmax_ref,
    softmax,
    softmax_ref,
)
from kernelwright.ops.swiglu import (  # noqa: E402
    SwiGLU,
    SwiGLUFused,
    swiglu,
    swiglu_fused,
    swiglu_fused_ref,
    swiglu_ref,
)
from kernelwright.ops.swiglu_clamped import (  # noqa: E402
    SwiGLUClamped,
    swiglu_clamped,
    swiglu_clamped_fused,
    swiglu_clamped_ref,
)

__version__ = "0.1.0"

# autopatch needs transformers, an optional dependency: these names import it on first use only
# (and stay out of __all__, so that `from kernelwright import *` does not import it either)
_TRANSFORMERS_EXPORTS = ("KernelwrightCallback", "from_pretrained", "patch", "unpatch")


def __getattr__(name: str):
    if name in _TRANSFORMERS_EXPORTS:
        try:
            from kernelwright.integrations import transformers as _hf
        except ModuleNotFoundError as e:
            if e.name != "transformers":
                raise
            raise ImportError(
                f"kernelwright.{name} needs Hugging Face transformers: "
                "pip install 'transformers>=5' (or, in the checkout, pip install -e '.[hf]')"
            ) from e
        return getattr(_hf, name)
    raise AttributeError(f"module 'kernelwright' has no attribute {name!r}")


__all__ = [
    "CrossEntropyLoss",
    "FusedAddRMSNorm",
    "FusedLinearCrossEntropyLoss",
    "GeGLU",
    "GeGLUFused",
    "JaggedMean",
    "LayerNorm",
    "LogSoftmax",
    "ReLUSquared",
    "RMSNorm",
    "RoPE",
    "Softmax",
    "SwiGLU",
    "SwiGLUClamped",
    "SwiGLUFused",
    "__version__",
    "compile_backend",
    "cross_entropy",
    "cross_entropy_ref",
    "fused_linear_cross_entropy",
    "fused_linear_cross_entropy_ref",
    "fused_add_rms_norm",
    "fused_add_rms_norm_ref",
    "geglu",
    "geglu_fused",
    "geglu_fused_ref",
    "geglu_ref",
    "jagged_mean",
    "jagged_mean_ref",
    "layer_norm",
    "layer_norm_ref",
    "log_softmax",
    "log_softmax_ref",
    "relu_squared",
    "relu_squared_ref",
    "rms_norm",
    "rms_norm_ref",
    "rope",
    "rope_ref",
    "rope_tables",
    "softmax",
    "softmax_ref",
    "swiglu",
    "swiglu_clamped",
    "swiglu_clamped_fused",
    "swiglu_clamped_ref",
    "swiglu_fused",
    "swiglu_fused_ref",
    "swiglu_ref",
]
