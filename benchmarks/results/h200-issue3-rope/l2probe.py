import functools, torch
from kernelwright.bench.harness import cuda_timer
from kernelwright.ops.rope import rope, rope_tables
from liger_kernel.transformers.rope import liger_rotary_pos_emb
t = cuda_timer(hide_host=True)
for s in (4096, 8192, 32768):
    q0 = torch.randn(1, s, 32, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    k0 = torch.randn(1, s, 8, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    cos, sin = rope_tables(s, 128, base=500000.0, dtype=torch.bfloat16, device="cuda")
    q, k = q0.clone(), k0.clone()
    def restore():
        q.copy_(q0); k.copy_(k0)
    fns = {"liger": functools.partial(liger_rotary_pos_emb, q, k, cos, sin),
           "kw": functools.partial(rope, q, k, cos, sin),
           "kw_inplace": functools.partial(rope, q, k, cos, sin, in_place=True),
           "copy_qk": restore}
    for name, fn in fns.items():
        a = t(fn, lambda: None)[1]
        b = t(fn, restore)[1]
        print(f"{s:6d} {name:11s} no-setup {a*1e3:7.1f} us   restore-setup {b*1e3:7.1f} us")
