"""The paged decode forward on one shape at several page sizes, a few calls each, for a profiler (ncu -k
regex:fwd_kernel): batch 16, 16k keys, 16 heads, head_dim 128, bf16; each page size's calls under an NVTX
range "page<n>". usage: python3 dev/sm80fwd/paged_probe.py LIB [PAGES, default 16,64] [CALLS, default 3]"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import gpu_bench as gb  # noqa: E402
import fa_ctypes as fa  # noqa: E402

lib = fa.load(sys.argv[1])
pages = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "16,64").split(",")]
calls = int(sys.argv[3]) if len(sys.argv) > 3 else 3
b, sk, heads, d = 16, 16384, 16, 128
gen = torch.Generator(device="cuda").manual_seed(1)
q = torch.randn(b, 1, heads, d, device="cuda", dtype=torch.bfloat16, generator=gen)
k, v = (torch.randn(b, sk, heads, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
with torch.no_grad():
    for page in pages:
        kp, vp, table, extra = gb.paged_cache(k, v, page, gen)
        ours = gb.Ours(lib, "auto", q, kp, vp, False, **extra)
        torch.cuda.nvtx.range_push(f"page{page}")
        for _ in range(calls):
            ours.forward()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        print(f"page {page}: ran {calls} calls", flush=True)
