"""docs/sm90.md step 21's measurement: the HBM bytes and rate of one forward call, the library's sm90 kernel
against cuDNN (torch SDPA), per shape, each call inside an NVTX range named after it:
  ncu --nvtx --nvtx-include "ours/" --nvtx-include "cudnn/" --clock-control none \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,... \
      python3 dev/sm90/dram_probe.py LIB 128,1,512 64,1,512 ...   (head_dim,causal,seqlen; 16k tokens)
The inputs are (batch, seqlen, heads, d) for both (SDPA takes transposed views of the same memory)."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import gpu_bench as gb  # noqa: E402
import fa_ctypes as fa  # noqa: E402
from torch.nn.attention import SDPBackend  # noqa: E402


def main():
    lib = fa.load(sys.argv[1])
    for spec in sys.argv[2:]:
        d, causal, s = (int(x) for x in spec.split(","))
        heads, b = 2048 // d, 16384 // s
        q, k, v = (torch.randn(b, s, heads, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        ours = gb.Ours(lib, "flashattn-sm90", q, k, v, bool(causal))
        with torch.no_grad():
            for name, fn in (("ours", ours.forward),
                             ("cudnn", lambda: gb.torch_fwd(SDPBackend.CUDNN_ATTENTION, q, k, v, bool(causal)))):
                for _ in range(3):
                    fn()
                torch.cuda.synchronize()
                torch.cuda.nvtx.range_push(name)
                fn()
                torch.cuda.nvtx.range_pop()
                torch.cuda.synchronize()
        print(f"probe d={d} causal={causal} s={s} b={b} h={heads}", flush=True)


if __name__ == "__main__":
    main()
