"""Every "default" launch-table config of the cross_entropy kernels (also those of
fused_linear_cross_entropy) compiles for sm_90 (Hopper), with its compile-time flags.

The interpreter runs code that the GPU compiler rejects; this catches it before the GPU does.
"""

import pytest
import torch
from conftest import ON_GPU

from kernelwright.ops.cross_entropy import cross_entropy_fwd_launch, cross_entropy_scale_launch
from kernelwright.runtime.tables.cross_entropy import TABLE
from kernelwright.testing.gpu_compile import check_compiles

pytestmark = pytest.mark.skipif(ON_GPU, reason="the GPU run compiles these for real")

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
FWD_KERNELS = ("_ce_fwd_kernel", "_ce_fwd_looped_kernel")  # a row in one block; a looped row

# Flag combinations of the forward kernel, each flag on in some and off in others:
# (HAS_WEIGHT, HAS_SMOOTH, HAS_Z, STORE_Z, SOFTCAP, COMPUTE_GRAD, HAS_SCALE)
COMBOS = [
    (False, False, False, False, False, False, False),  # loss only ("sum", no grad)
    (True, True, True, True, True, True, True),  # everything ("mean" with all options)
    (False, True, False, True, True, True, False),  # z part stored without z-loss, "sum"
    (True, False, True, False, False, True, True),  # z-loss not returned, "mean"
    (True, False, True, True, False, False, True),  # "mean" without a gradient
    (False, True, False, False, True, False, False),
]


def _cases():
    """(config, V) for every default table row, through one block (V <= block) and looped."""
    cases = {}
    for max_n, cfg in TABLE["fwd"]["default"]:
        for V in (min(cfg.block_n, max_n) - 1, cfg.block_n + 7):  # one block (odd V); looped
            cases[(cfg.block_n, cfg.num_warps, V)] = (cfg, V)
    return list(cases.values())


def _fwd(cfg, V, dtype, combo, target_dtype):
    has_w, smooth, has_z, store_z, softcap, grad, scale = combo
    M = 2
    x = torch.randn(M, V).to(dtype)
    t = torch.tensor([1, -100], dtype=target_dtype)
    loss, lse = torch.empty(M), torch.empty(M)
    w = torch.rand(V) + 0.5 if has_w else None
    cross_entropy_fwd_launch(
        x,
        t,
        loss,
        lse,
        weight=w,
        weight_sum=w.sum().reshape(1) if has_w else None,
        z_loss=torch.empty(M) if store_z else None,
        grad=torch.empty_like(x) if grad else None,
        scale=torch.tensor([0.5]) if scale else None,
        label_smoothing=0.1 if smooth else 0.0,
        lse_square_scale=1e-4 if has_z else 0.0,
        softcap=30.0 if softcap else None,
        config=cfg,
    )


@pytest.mark.slow
def test_cross_entropy_kernels_compile_for_hopper():
    cases = _cases()

    def run():
        for cfg, V in cases:
            for d, dtype in enumerate(DTYPES):
                for c, combo in enumerate(COMBOS):
                    target_dtype = (torch.int64, torch.int32)[(c + d) % 2]
                    _fwd(cfg, V, dtype, combo, target_dtype)
        for _, cfg in TABLE["bwd_scale"]["default"]:
            for dtype in DTYPES:
                g = torch.randn(3, cfg.block_n + 7).to(dtype)
                cross_entropy_scale_launch(g, torch.tensor([0.5]), config=cfg)  # one scalar
                cross_entropy_scale_launch(g, torch.rand(3), config=cfg)  # one per row

    results = check_compiles(run)
    failures = [
        f"{r.launch.name} {dict(r.launch.constexprs)} num_warps={r.launch.num_warps}: {r.error}"
        for r in results
        if not r.ok
    ]
    assert not failures, "\n".join(failures)
    # both kernels (one block, looped) of every distinct config, every dtype and flag
    # combination, both target dtypes
    fwd = [r.launch for r in results if r.launch.name in FWD_KERNELS]
    flags = {
        (
            launch.name == "_ce_fwd_kernel",
            c["BLOCK_V"],
            dict(launch.signature)["x_ptr"],
            dict(launch.signature)["t_ptr"],
        )
        for launch in fwd
        for c in [dict(launch.constexprs)]
    }
    n_cfgs = len({(cfg.block_n, cfg.num_warps) for cfg, _ in cases})
    assert {f[0] for f in flags} == {True, False}
    assert {f[2] for f in flags} == {"*bf16", "*fp16", "*fp32"}
    assert {f[3] for f in flags} == {"*i32", "*i64"}
    assert len(fwd) >= n_cfgs * 2 * len(DTYPES) * len(COMBOS)
    assert any(r.launch.name == "_ce_scale_kernel" for r in results)
