# ruff: noqa: B023, E501  (a throwaway probe: closures over loop variables are called at once)
"""Ad-hoc GPU probe for the losses (not a benchmark of record): correctness smoke, timings of
the key shapes vs peers, and a launch-config sweep of the cross_entropy forward. Prints only."""

import sys

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

from kernelwright.ops.cross_entropy import cross_entropy
from kernelwright.ops.fused_linear_cross_entropy import fused_linear_cross_entropy as flce

dev = torch.device("cuda")
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
what = sys.argv[1:] or ["ce", "flce"]


def bench(fn, leaves):
    def run():
        for t in leaves:
            t.grad = None
        fn()

    run()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    run()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    ms = do_bench(run, warmup=5, rep=50, return_mode="median")
    return ms, peak


try:
    from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction
except Exception as e:
    print("no liger", e)
    LigerCrossEntropyFunction = LigerFusedLinearCrossEntropyFunction = None

if "ce" in what or "ce1" in what:
    shapes = [(8192, 128256), (8192, 32000), (8192, 262144)] if "ce" in what else [(8192, 128256)]
    for M, V in shapes:
        g = torch.Generator(device=dev).manual_seed(0)
        x0 = (torch.randn(M, V, device=dev, generator=g) * 4).to(torch.bfloat16)
        t = torch.randint(0, V, (M,), device=dev, generator=g)
        t[::20] = -100
        # correctness vs fp32 torch
        xr = x0.float().requires_grad_()
        lr = F.cross_entropy(xr, t)
        lr.backward()
        x1 = x0.clone().requires_grad_()
        l1 = cross_entropy(x1, t)
        l1.backward()
        print(
            f"CE {M}x{V}: loss rel err {abs(l1.item() - lr.item()) / lr.item():.2e}, grad rel {((x1.grad.float() - xr.grad).norm() / xr.grad.norm()).item():.2e}",
            flush=True,
        )
        del xr, lr
        provs = {
            "kw": lambda x: cross_entropy(x, t),
            "kw_inplace": lambda x: cross_entropy(x, t, in_place=True),
            "eager": lambda x: F.cross_entropy(x.float(), t),
            "compile": torch.compile(lambda x: F.cross_entropy(x.float(), t)),
        }
        if LigerCrossEntropyFunction is not None:
            provs["liger"] = lambda x: LigerCrossEntropyFunction.apply(
                x, t, None, -100, 0.0, 0.0, "mean", None, False
            )[0]
        for name, f in provs.items():
            x = x0.clone().requires_grad_()
            try:
                ms, peak = bench(lambda: f(x).backward(), [x])
                print(
                    f"  {name:12s} fwd+bwd {ms:7.3f} ms  peak +{peak:8.1f} MiB  ({2 * M * V * 2 / ms / 1e9:.0f} GB/s min-bytes)",
                    flush=True,
                )
            except Exception as e:
                print(f"  {name:12s} ERROR {type(e).__name__}: {str(e)[:150]}", flush=True)
            del x
            torch.cuda.empty_cache()
        del x0

if "flce" in what:
    T, H, V = 8192, 4096, 128256
    g = torch.Generator(device=dev).manual_seed(0)
    h0 = torch.randn(T, H, device=dev, generator=g).to(torch.bfloat16)
    w0 = (torch.randn(V, H, device=dev, generator=g) * 0.03).to(torch.bfloat16)
    t = torch.randint(0, V, (T,), device=dev, generator=g)
    t[::20] = -100
    # mixed-dtype accumulate works?
    try:
        acc = torch.zeros(64, 32, device=dev)
        a = torch.randn(64, 16, device=dev, dtype=torch.bfloat16)
        b = torch.randn(16, 32, device=dev, dtype=torch.bfloat16)
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
        print("addmm out_dtype ok", (acc - a.float() @ b.float()).abs().max().item())
    except Exception as e:
        print("addmm out_dtype FAILED", e)
    # correctness vs fp32 reference on 1024 tokens
    hs, ts = h0[:1024], t[:1024]
    hr = hs.float().requires_grad_()
    wr = w0.float().requires_grad_()
    lr = F.cross_entropy(hr @ wr.t(), ts)
    lr.backward()
    h1 = hs.clone().requires_grad_()
    w1 = w0.clone().requires_grad_()
    l1 = flce(h1, w1, ts)
    l1.backward()
    rel = lambda a, b: ((a.float() - b).norm() / b.norm()).item()
    print(
        f"FLCE 1024x{H}x{V}: loss rel {abs(l1.item() - lr.item()) / lr.item():.2e} dh {rel(h1.grad, hr.grad):.2e} dw {rel(w1.grad, wr.grad):.2e}",
        flush=True,
    )
    del hr, wr, lr, h1, w1
    torch.cuda.empty_cache()
    flops = 3 * 2 * T * H * V
    provs = {
        f"kw_c{c}": (lambda c: lambda h, w: flce(h, w, t, chunk_size=c))(c)
        for c in (None, 384, 512, 1024)
    }
    provs["kw_fp32acc"] = lambda h, w: flce(h, w, t, accum_dtype=torch.float32)
    provs["eager"] = lambda h, w: F.cross_entropy((h @ w.t()).float(), t)
    if LigerFusedLinearCrossEntropyFunction is not None:
        provs["liger"] = lambda h, w: LigerFusedLinearCrossEntropyFunction.apply(h, w, t)[0]
    for name, f in provs.items():
        h = h0.clone().requires_grad_()
        w = w0.clone().requires_grad_()
        try:
            ms, peak = bench(lambda: f(h, w).backward(), [h, w])
            grads_mib = (h.numel() + w.numel()) * 2 / 2**20
            print(
                f"  {name:12s} fwd+bwd {ms:7.2f} ms  {flops / ms / 1e9:6.0f} TFLOP/s  peak +{peak:8.1f} MiB (extra over grads {peak - grads_mib:8.1f})",
                flush=True,
            )
        except Exception as e:
            print(f"  {name:12s} ERROR {type(e).__name__}: {str(e)[:200]}", flush=True)
        del h, w
        torch.cuda.empty_cache()
    # the three matmuls of one chunk, alone
    for c in (256, 512, 1024):
        hc = h0[:c]
        lg = torch.empty(c, V, device=dev, dtype=torch.bfloat16)
        gw = torch.zeros_like(w0)
        gh = torch.empty(c, H, device=dev, dtype=torch.bfloat16)
        m1 = do_bench(lambda: torch.mm(hc, w0.t(), out=lg))
        m2 = do_bench(lambda: torch.mm(lg, w0, out=gh))
        m3 = do_bench(lambda: gw.addmm_(lg.t(), hc))
        f1 = 2 * c * H * V / 1e9
        print(
            f"  chunk {c}: logits {m1:.3f} ms ({f1 / m1:.0f} TF/s), dh {m2:.3f} ({f1 / m2:.0f}), dw {m3:.3f} ({f1 / m3:.0f}); x{T // c} = {(m1 + m2 + m3) * T / c:.1f} ms",
            flush=True,
        )

if "dw" in what:
    T, H, V = 8192, 4096, 128256
    w0 = (torch.randn(V, H, device=dev) * 0.03).to(torch.bfloat16)
    wT = w0.t().contiguous()
    for c in (256, 512):
        g = (torch.randn(c, V, device=dev) * 1e-3).to(torch.bfloat16)
        hc = torch.randn(c, H, device=dev).to(torch.bfloat16)
        m0 = do_bench(lambda: w0.addmm_(g.t(), hc))
        m1 = do_bench(lambda: wT.addmm_(hc.t(), g))
        hT = hc.t().contiguous()
        m2 = do_bench(lambda: wT.addmm_(hT, g))
        print(
            f"dw c={c}: [V,H] += g.T @ h {m0:.3f} ms; [H,V] += h.T @ g {m1:.3f} ms; with h.T contiguous {m2:.3f} ms",
            flush=True,
        )
