"""Where a short call's time goes: the device time of each kernel of one call (torch.profiler, mean of
10 calls after warm-up), the sm80 library against torch's flash backend, forward and backward, on the
standard sweep's short shapes. usage: python3 dev/sm80bwd/short_profile.py LIB[,NAME=LIB...] [seqlens]
(several libraries: builds of two versions side by side in one process). PASSES=fwd or bwd: one pass.
IMPL=flashattn-sm90: the library's Hopper kernels instead of the sm80 ones."""
import os
import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import fa_ctypes as fa  # noqa: E402
import gpu_bench as gb  # noqa: E402
from torch.nn.attention import SDPBackend  # noqa: E402

libs = {}
for i, spec in enumerate((sys.argv[1] if len(sys.argv) > 1 else "build/libflashattn.so").split(",")):
    name, _, path = spec.rpartition("=")
    libs[name or f"lib{i}"] = fa.load(path)
seqlens = [int(x) for x in sys.argv[2].split(",")] if len(sys.argv) > 2 else [512, 1024, 2048]
N = 10
PASSES = os.environ.get("PASSES", "fwd,bwd").split(",")
IMPL = os.environ.get("IMPL", "flashattn-sm80")


def kernels(fn):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(N):
            fn()
        torch.cuda.synchronize()
    t = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            t[e.name[:60]] += e.device_time / N
    return t


def show(label, t):
    total = sum(t.values())
    parts = "  ".join(f"{v:7.1f} {k[:40]}" for k, v in sorted(t.items(), key=lambda kv: -kv[1]))
    print(f"  {label:<18} {total:8.1f} us | {parts}", flush=True)
    return total


for d in (64, 128):
    heads = 2048 // d
    for causal in (False, True):
        for s in seqlens:
            b = 16384 // s
            shape = (b, s, heads, d)
            q, k, v, dout = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            print(f"d{d} s{s} causal={int(causal)} batch {b} heads {heads}")
            impls = {}
            for name, lib in libs.items():
                impls[name] = gb.Ours(lib, IMPL, q, k, v, causal)
                impls[name].prepare_backward(dout)
            if "fwd" in PASSES:
                fwd = {name: show(f"{name} fwd", kernels(ours.forward)) for name, ours in impls.items()}
                with torch.no_grad():
                    bb = show("flash fwd", kernels(lambda: gb.torch_fwd(SDPBackend.FLASH_ATTENTION, q, k, v, causal)))
                print("  fwd flash/ours " + "  ".join(f"{n} {bb / a:.3f}" for n, a in fwd.items()))
            if "bwd" in PASSES:
                bwd = {name: show(f"{name} bwd", kernels(ours.backward)) for name, ours in impls.items()}
                qq, kk, vv = (x.detach().clone().requires_grad_() for x in (q, k, v))
                out = gb.torch_fwd(SDPBackend.FLASH_ATTENTION, qq, kk, vv, causal)

                def flash_bwd():
                    qq.grad = kk.grad = vv.grad = None
                    out.backward(dout, retain_graph=True)
                bb = show("flash bwd", kernels(flash_bwd))
                print("  bwd flash/ours " + "  ".join(f"{n} {bb / a:.3f}" for n, a in bwd.items()))
                del qq, kk, vv, out
            del impls, q, k, v, dout
            torch.cuda.empty_cache()
