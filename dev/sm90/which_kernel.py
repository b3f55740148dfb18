"""Which CUDA kernels each library launches for each shape (torch profiler). usage: python3
dev/sm90/which_kernel.py NAME=LIB,... 'd,causal,seqlen,heads,batch;...'"""
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import fa_ctypes as fa  # noqa: E402
import gpu_bench as gb  # noqa: E402

libs = {n: fa.load(p) for n, _, p in (s.partition("=") for s in sys.argv[1].split(","))}
for shape in sys.argv[2].split(";"):
    d, causal, s, heads, b = (int(x) for x in shape.split(","))
    q, k, v = (torch.randn((b, s, heads, d), device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for n, lib in libs.items():
        o = gb.Ours(lib, "flashattn-sm90", q, k, v, bool(causal))
        o.forward()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            o.forward()
            torch.cuda.synchronize()
        names = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
        print(shape, n, [x[:300] for x in names], flush=True)
