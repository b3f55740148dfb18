"""One decode call of the library (IMPL, default auto) and one of torch's cuDNN SDPA, between
cudaProfilerStart/Stop, for Nsight Compute (dev/sm80fwd/ncu_decode.sh). usage: python3 ncu_decode.py LIB
BATCH SEQLEN_K [HEADS [HEADS_KV]]; head_dim 128, bf16."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import gpu_bench as gb  # noqa: E402
import fa_ctypes as fa  # noqa: E402

lib = fa.load(sys.argv[1])
b, sk = int(sys.argv[2]), int(sys.argv[3])
heads = int(sys.argv[4]) if len(sys.argv) > 4 else 16
heads_kv = int(sys.argv[5]) if len(sys.argv) > 5 else heads
q = torch.randn(b, 1, heads, 128, device="cuda", dtype=torch.bfloat16)
k, v = (torch.randn(b, sk, heads_kv, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
ours = gb.Ours(lib, os.environ.get("IMPL", "auto"), q, k, v, False)
kr, vr = (x.repeat_interleave(heads // heads_kv, 2) for x in (k, v))
with torch.no_grad():
    for _ in range(3):
        ours.forward()
        gb.torch_fwd(gb.SDPBackend.CUDNN_ATTENTION, q, kr, vr, False)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    ours.forward()
    gb.torch_fwd(gb.SDPBackend.CUDNN_ATTENTION, q, kr, vr, False)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
