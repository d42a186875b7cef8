"""The library's ops: one `OpEntry` each, grouped by family.

Adding an op is one module in `kernelwright/ops/` and one entry here (docs/adding-an-op.md).
Every name below is resolved lazily; tests/test_registry.py checks that each one resolves.
"""

from __future__ import annotations

import torch

from kernelwright.registry.entry import INDUCTOR, Capability, DemoCase, HFPattern, Impl, OpEntry

OPS = "kernelwright.ops"
TABLES = "kernelwright.runtime.tables"
LIGER = "liger_kernel.ops"

# Liger's row kernels hold a whole row in one block of next_power_of_2(n) (its
# calculate_settings refuses more than 65536 columns).
LIGER_MAX_ROW = 65536


def _impls(op: str, liger: str | None = None, liger_max_row: int | None = None, **cap):
    """kernelwright's kernel (capability `cap`), Liger's (`liger`: "module:Function", CUDA
    only) where it has the op, and Inductor's default, in the order that breaks ties."""
    own = Impl("kernelwright", "kernelwright", f"{OPS}.{op}:{op}", Capability(**cap))
    peer = ()
    if liger is not None:
        peer_cap = Capability(devices=("cuda",), max_row=liger_max_row)
        peer = (Impl("liger", "liger", f"{LIGER}.{liger}", peer_cap),)
    return (own, *peer, INDUCTOR)


# The demo's shapes when a case names none: x-like [..., N], on the GPU real widths, on the CPU
# (interpreter) a 3-D odd shape and a wider row.
DEFAULT_SHAPES = ([(4, 1000, 4096), (2048, 16384)], [(3, 5, 300), (7, 1500)])

# (B, S, Hq, Hk, D, R): Llama-3-8B's heads on the GPU; GQA 3:1 and partial rotary on the CPU
_ROPE_SHAPES = ([(2, 2048, 32, 8, 128, 128), (1, 4096, 64, 8, 128, 64)],
                [(2, 7, 6, 2, 64, 64), (1, 9, 5, 3, 96, 32)])  # fmt: skip
# (..., V): Llama-3's vocabulary on the GPU; on the CPU a one-block and a looped row (V > 4096)
_CE_SHAPES = ([(4, 1000, 32768), (2048, 128256)], [(3, 5, 300), (7, 5000)])
# (..., H, V): Llama-3-8B's lm-head on the GPU. chunk_size=32 (options case): several chunks
_FLCE_SHAPES = ([(4, 1024, 4096, 128256), (1000, 2048, 32000)], [(2, 9, 32, 300), (45, 40, 130)])
_CE_OPTIONS = {"label_smoothing": 0.1, "softcap": 30.0, "lse_square_scale": 1e-4}

# autopatch's norm candidates: leaf modules whose class name contains "norm"; each one is then
# proven an RMSNorm or a LayerNorm from its forward, never from the name
_NORM_CLASSES = r"(?i)norm"


NORMS = (
    OpEntry(
        "rms_norm",
        "norms",
        f"{OPS}.rms_norm",
        summary="RMSNorm (Llama / Gemma casting, weight offset), forward and backward",
        impls=_impls("rms_norm", "rms_norm:LigerRMSNormFunction", LIGER_MAX_ROW),
        module_class="RMSNorm",
        eager="rms_norm_eager",
        table=f"{TABLES}.rms_norm",
        bench="rms_norm",
        demo=(
            DemoCase("rms_norm (llama)", "x_weight"),
            DemoCase("rms_norm (gemma)", "x_weight", {"casting_mode": "gemma", "offset": 1.0}),
        ),
        replaces=(HFPattern("norm", _NORM_CLASSES, "rms_norm"),),
    ),
    OpEntry(
        "fused_add_rms_norm",
        "norms",
        f"{OPS}.fused_add_rms_norm",
        summary="residual add + RMSNorm in one pass, returning both",
        impls=_impls(
            "fused_add_rms_norm", "fused_add_rms_norm:LigerFusedAddRMSNormFunction", LIGER_MAX_ROW
        ),
        module_class="FusedAddRMSNorm",
        eager="fused_add_rms_norm_eager",
        table=f"{TABLES}.fused_add_rms_norm",
        bench="fused_add_rms_norm",
        demo=(DemoCase("fused_add_rms_norm", "x_residual_weight"),),
    ),
    OpEntry(
        "layer_norm",
        "norms",
        f"{OPS}.layer_norm",
        summary="LayerNorm with weight and bias",
        impls=_impls("layer_norm", "layer_norm:LigerLayerNormFunction", LIGER_MAX_ROW),
        module_class="LayerNorm",
        eager="layer_norm_eager",
        table=f"{TABLES}.layer_norm",
        bench="layer_norm",
        demo=(DemoCase("layer_norm", "x_weight_bias"),),
        replaces=(HFPattern("norm", _NORM_CLASSES, "layer_norm"),),
    ),
    OpEntry(
        "l2_norm",
        "norms",
        f"{OPS}.l2_norm",
        summary="x / sqrt(sum(x^2) + eps) over the last dim (QK-norm of linear attention)",
        impls=_impls("l2_norm", max_row=16384),  # ops/l2_norm.MAX_N: one row in registers
        module_class="L2Norm",
        eager="l2_norm_eager",
        bench="l2_norm",
        demo=(DemoCase("l2_norm", "x"),),
        test_shapes=((3, 5, 64), (7, 300), (2, 1500), (1, 7)),
    ),
)

ACTIVATIONS = (
    OpEntry(
        "swiglu",
        "activations",
        f"{OPS}.swiglu",
        summary="silu(gate) * up, separate or fused [gate | up] projections",
        impls=_impls("swiglu", "swiglu:LigerSiLUMulFunction", LIGER_MAX_ROW),
        module_class="SwiGLU",
        eager="swiglu_eager",
        table=f"{TABLES}.swiglu",
        bench="swiglu",
        demo=(
            DemoCase("swiglu", "gate_up"),
            DemoCase(
                "swiglu_fused",
                "gate_up_fused",
                function="swiglu_fused",
                reference="swiglu_fused_ref",
            ),
        ),  # fmt: skip
        replaces=(HFPattern("mlp", r"MLP$", "swiglu", ("silu", "swish"), fused="swiglu_fused"),),
    ),
    OpEntry(
        "geglu",
        "activations",
        f"{OPS}.geglu",
        summary="gelu(gate) * up, tanh or erf GELU",
        # Liger's GELUMul is the tanh form only
        impls=_impls("geglu", "geglu:LigerGELUMulFunction", LIGER_MAX_ROW),
        module_class="GeGLU",
        eager="geglu_eager",
        table=f"{TABLES}.geglu",
        bench="geglu",
        demo=(
            DemoCase("geglu (tanh)", "gate_up", {"approximate": "tanh"}),
            DemoCase("geglu (erf)", "gate_up", {"approximate": "none"}),
        ),
        replaces=(
            HFPattern(
                "mlp",
                r"MLP$",
                "geglu_tanh",
                ("gelu_pytorch_tanh", "gelu_tanh"),
                {"approximate": "tanh"},
                fused="geglu_fused",
            ),
            HFPattern(
                "mlp",
                r"MLP$",
                "geglu_erf",
                ("gelu",),
                {"approximate": "none"},
                fused="geglu_fused",
            ),
        ),  # fmt: skip
    ),
    OpEntry(
        "relu_squared",
        "activations",
        f"{OPS}.relu_squared",
        summary="relu(x)^2, the non-gated MLP activation of Primer / Nemotron",
        impls=_impls("relu_squared", "relu_squared:LigerReLUSquaredFunction", LIGER_MAX_ROW),
        module_class="ReLUSquared",
        eager="relu_squared_eager",
        table=f"{TABLES}.relu_squared",
        bench="relu_squared",
        demo=(DemoCase("relu_squared", "x"),),
        replaces=(HFPattern("mlp", r"MLP$", "relu_squared", ("relu2",)),),
    ),
    OpEntry(
        "swiglu_clamped",
        "activations",
        f"{OPS}.swiglu_clamped",
        summary="clamped SwiGLU, min(g, L) * sigmoid(alpha g) * (clamp(u, +-L) + 1): GPT-OSS's "
        "expert gate; interleaved gate/up read in place",
        module_class="SwiGLUClamped",
        eager="swiglu_clamped_eager",
        bench="swiglu_clamped",
        demo=(
            # limit 1: the N(0, 1) inputs then cross the clamp on both sides
            DemoCase("swiglu_clamped", "gate_up", {"limit": 1.0}),
            DemoCase(
                "swiglu_clamped_fused (interleaved)",
                "gate_up_fused",
                {"limit": 1.0},
                function="swiglu_clamped_fused",
                reference="swiglu_clamped_fused_ref",
            ),
        ),  # fmt: skip
    ),
)

SOFTMAX = (
    OpEntry(
        "softmax",
        "softmax",
        f"{OPS}.softmax",
        summary="softmax and log_softmax over the last dim",
        impls=_impls("softmax", "softmax:LigerSoftmaxFunction", LIGER_MAX_ROW),
        module_class="Softmax",
        eager="softmax_eager",
        table=f"{TABLES}.softmax",
        bench="softmax",
        demo=(
            DemoCase("softmax", "x"),
            DemoCase("log_softmax", "x", function="log_softmax", reference="log_softmax_ref"),
        ),
    ),
)

LOSSES = (
    OpEntry(
        "cross_entropy",
        "losses",
        f"{OPS}.cross_entropy",
        summary="cross-entropy over logits (label smoothing, softcap, z-loss)",
        impls=_impls("cross_entropy", "cross_entropy:LigerCrossEntropyFunction"),
        module_class="CrossEntropyLoss",
        eager="cross_entropy_eager",
        table=f"{TABLES}.cross_entropy",
        bench="cross_entropy",
        demo=(
            DemoCase("cross_entropy", "logits_target", shapes=_CE_SHAPES, index_inputs=("target",)),
            DemoCase(
                "cross_entropy (smoothing, softcap, z-loss)",
                "logits_target",
                {**_CE_OPTIONS, "return_z_loss": True},
                _CE_SHAPES,
                index_inputs=("target",),
            ),
        ),  # fmt: skip
    ),
    OpEntry(
        "fused_linear_cross_entropy",
        "losses",
        f"{OPS}.fused_linear_cross_entropy",
        summary="lm-head matmul + cross-entropy in chunks, the logits never stored",
        impls=_impls(
            "fused_linear_cross_entropy",
            "fused_linear_cross_entropy:LigerFusedLinearCrossEntropyFunction",
            min_rank=2,
        ),
        bucket=(("tokens",), "hidden"),  # the site's hidden states [tokens, H]
        module_class="FusedLinearCrossEntropyLoss",
        eager="fused_linear_cross_entropy_eager",
        bench="fused_linear_cross_entropy",
        demo=(
            DemoCase(
                "fused_linear_cross_entropy",
                "hidden_weight_target",
                shapes=_FLCE_SHAPES,
                index_inputs=("target",),
            ),
            DemoCase(
                "fused_linear_cross_entropy (options, fp32 dW)",
                "hidden_weight_target",
                {**_CE_OPTIONS, "accum_dtype": torch.float32, "chunk_size": 32},
                _FLCE_SHAPES,
                index_inputs=("target",),
            ),
        ),  # fmt: skip
        replaces=(HFPattern("loss", r"ForCausalLM$", "fused_linear_cross_entropy"),),
    ),
)

ROPE = (
    OpEntry(
        "rope",
        "rope",
        f"{OPS}.rope",
        summary="rotary position embedding of q and k (half-split or interleaved)",
        impls=_impls("rope", "rope:LigerRopeFunction", min_rank=4, max_rank=4),
        bucket=(("tokens", "heads"), "head_dim"),  # the site's q [B, S, H, D]
        module_class="RoPE",
        eager="rope_eager",
        table=f"{TABLES}.rope",
        bench="rope",
        demo=(
            DemoCase("rope", "rope", shapes=_ROPE_SHAPES, grad_inputs=("q", "k")),
            DemoCase("rope (interleaved)", "rope", {"interleaved": True}, _ROPE_SHAPES, ("q", "k")),
        ),  # fmt: skip
        replaces=(
            HFPattern("rope", r"Attention$", "half_split"),
            HFPattern("rope", r"Attention$", "interleaved", kwargs={"interleaved": True}),
        ),
    ),
)

JAGGED = (
    OpEntry(
        "jagged_mean",
        "jagged",
        f"{OPS}.jagged_mean",
        summary="mean of each segment of a jagged [total, D] tensor",
        impls=_impls("jagged_mean", min_rank=2, max_rank=2),
        # the site's values [total, D]; a bench row's total is the sum of the lengths it drew
        # (its spec's derived dim), so a row lands in the bucket of the workload it times
        bucket=(("total",), "d"),
        module_class="JaggedMean",
        table=f"{TABLES}.jagged_mean",
        bench="jagged_mean",
        demo=(DemoCase("jagged_mean", "jagged"),),
    ),
)

MOE = (
    OpEntry(
        "moe_experts",
        "moe",
        f"{OPS}.moe_experts",
        summary="the expert layer of a mixture of experts (stacked SwiGLU experts)",
        impls=_impls("moe_experts", min_rank=2),
        replaces=(HFPattern("moe", r"Experts$|SparseMoeBlock$", "stacked"),),
    ),
)

# The benchmark specs register in this order too (bench/specs/__init__.py).
ENTRIES: tuple[OpEntry, ...] = (*NORMS, *SOFTMAX, *ACTIVATIONS, *JAGGED, *ROPE, *LOSSES, *MOE)
