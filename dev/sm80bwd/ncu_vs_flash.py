"""One backward call each of torch's flash kernel (FlashAttention-2) and flashattn-sm80, head_dim 64
and 128 at 16k non-causal (the standard sweep's shapes; NCU_SEQLEN, NCU_CAUSAL=1 for others, 16k
tokens; NCU_PASS=fwd: the forward kernels instead; NCU_DIMS=256: other head dims), for Nsight Compute to profile side by side
(dev/sm80bwd/ncu_vs_flash.sh)."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import fa_ctypes as fa  # noqa: E402
import gpu_bench as gb  # noqa: E402

lib = fa.load(sys.argv[1] if len(sys.argv) > 1 else "build/libflashattn.so")
seqlen, causal = int(os.environ.get("NCU_SEQLEN", 16384)), os.environ.get("NCU_CAUSAL", "0") == "1"
for d in (int(x) for x in os.environ.get("NCU_DIMS", "64,128").split(",")):
    shape = (16384 // seqlen, seqlen, 2048 // d, d)
    q, k, v, dout = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    ours = gb.Ours(lib, "flashattn-sm80", q, k, v, causal)
    if os.environ.get("NCU_PASS", "bwd") == "fwd":
        with torch.no_grad():
            gb.torch_fwd(gb.SDPBackend.FLASH_ATTENTION, q, k, v, causal)
        ours.forward()
    else:
        qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
        out = gb.torch_fwd(gb.SDPBackend.FLASH_ATTENTION, qq, kk, vv, causal)
        out.backward(dout)
        ours.prepare_backward(dout)
        ours.backward()
    torch.cuda.synchronize()
