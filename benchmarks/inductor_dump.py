"""Print the Triton kernels torch.compile (inductor) generates for an op's forward and backward,
and the launch config its autotuner picked for each (dev aid).

TORCH_LOGS=output_code python benchmarks/inductor_dump.py softmax 4096x4096,4096x8192
python benchmarks/inductor_dump.py rms_norm 1024x4096     # configs only
"""

from __future__ import annotations

import sys

import torch
from torch._inductor.codecache import PyCodeCache

from kernelwright.ops.rms_norm import rms_norm_eager


def main() -> None:
    op = sys.argv[1]
    shapes = [tuple(int(v) for v in s.split("x")) for s in sys.argv[2].split(",")]
    fns = {
        "softmax": lambda x: torch.softmax(x, -1),
        "layer_norm": lambda x: torch.nn.functional.layer_norm(x, (x.shape[-1],), eps=1e-5),
        "rms_norm": lambda x: rms_norm_eager(x, torch.ones_like(x[0])),
    }
    fn = fns[op]
    for shape in shapes:
        torch._dynamo.reset()
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        y = torch.compile(fn)(x)
        y.backward(torch.randn_like(y))
        torch.cuda.synchronize()
        _print_configs(shape)


def _print_configs(shape) -> None:
    # Each compiled module's kernels are CachingAutotuners; after a run, launchers[0] is the
    # config the autotuner kept.
    modules = PyCodeCache.modules
    for mod in modules.values() if isinstance(modules, dict) else modules:
        for name in dir(mod):
            kernel = getattr(mod, name)
            for launcher in getattr(kernel, "launchers", None) or []:
                print(shape, name, launcher.config, flush=True)


if __name__ == "__main__":
    main()
