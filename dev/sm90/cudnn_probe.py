"""One call of cuDNN attention (torch SDPA, CUDNN_ATTENTION) per shape inside an NVTX range, for
ncu to show what cuDNN launches (kernel name, grid, block, registers, shared memory, duration):
  ncu --nvtx --nvtx-include "probe/" --section LaunchStats --section SpeedOfLight \
      python3 dev/sm90/cudnn_probe.py 128,0,2048 64,1,512 ...   (head_dim,causal,seqlen; 16k tokens)"""
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F


def main():
    for spec in sys.argv[1:]:
        d, causal, s = (int(x) for x in spec.split(","))
        heads = 2048 // d
        b = 16384 // s
        q, k, v = (torch.randn(b, heads, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            for _ in range(3):
                F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push("probe")
            F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
            torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
        print(f"probe d={d} causal={causal} s={s} b={b} h={heads}", flush=True)


if __name__ == "__main__":
    main()
