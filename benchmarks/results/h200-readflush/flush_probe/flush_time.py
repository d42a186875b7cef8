import torch, time
a = torch.ones(2**26, dtype=torch.int32, device="cuda"); si = torch.empty((), dtype=torch.int64, device="cuda")
f = torch.ones(2**26, dtype=torch.float32, device="cuda"); sf = torch.empty((), dtype=torch.float32, device="cuda")
z = torch.empty(2**28, dtype=torch.int8, device="cuda")
for name, fn in [("int32->int64 sum", lambda: torch.sum(a, dim=0, dtype=torch.int64, out=si)), ("fp32 sum", lambda: torch.sum(f, dim=0, out=sf)), ("zero_", lambda: z.zero_())]:
    for _ in range(5): fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(50): fn()
    e.record(); torch.cuda.synchronize()
    ms = s.elapsed_time(e) / 50
    print(f"flush {name}: {ms*1e3:.1f} us, {2**28/ms/1e6:.0f} GB/s")
