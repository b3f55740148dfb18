"""One backward call each of flashattn-sm90 and torch's cuDNN SDPA (bf16, 16k tokens; NCU_DIM, default 128,
NCU_SEQLEN, default 4096, NCU_CAUSAL=1), for Nsight Compute to profile side by side (dev/sm90/ncu_bwd.sh)."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import fa_ctypes as fa  # noqa: E402
import gpu_bench as gb  # noqa: E402

lib = fa.load(sys.argv[1] if len(sys.argv) > 1 else "build/libflashattn.so")
d, s = int(os.environ.get("NCU_DIM", 128)), int(os.environ.get("NCU_SEQLEN", 4096))
causal = os.environ.get("NCU_CAUSAL", "0") == "1"
q, k, v, dout = (torch.randn((16384 // s, s, 2048 // d, d), device="cuda", dtype=torch.bfloat16) for _ in range(4))
ours = gb.Ours(lib, "flashattn-sm90", q, k, v, causal)
ours.prepare_backward(dout)
qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
out = gb.torch_fwd(gb.SDPBackend.CUDNN_ATTENTION, qq, kk, vv, causal)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
ours.backward()
out.backward(dout)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
