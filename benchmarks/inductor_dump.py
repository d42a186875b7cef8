"""Print the Triton kernels torch.compile (inductor) generates for an op's backward (dev aid).

TORCH_LOGS=output_code python benchmarks/inductor_dump.py softmax 4096x4096,4096x8192
"""

from __future__ import annotations

import sys

import torch


def main() -> None:
    op = sys.argv[1]
    shapes = [tuple(int(v) for v in s.split("x")) for s in sys.argv[2].split(",")]
    fns = {
        "softmax": lambda x: torch.softmax(x, -1),
        "layer_norm": lambda x: torch.nn.functional.layer_norm(x, (x.shape[-1],), eps=1e-5),
    }
    fn = fns[op]
    for shape in shapes:
        torch._dynamo.reset()
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        y = torch.compile(fn)(x)
        y.backward(torch.randn_like(y))
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
