"""The last round's cost in the Hopper forward: time per tile against the number of tiles (heads at
batch 1, non-causal). The persistent grid runs ceil(tiles / SMs) rounds of equal tiles, so TFLOP/s
drops when tiles % SMs is small. cuDNN (torch SDPA) on the same shapes beside it.
usage: python3 dev/sm90/fwd_waves.py LIB [seqlen] [d] [heads,...] [block_m]"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "sm80bwd"))
import fa_ctypes as fa  # noqa: E402
import gpu_bench as gb  # noqa: E402
from event_timing import median_ms  # noqa: E402
from torch.nn.attention import SDPBackend  # noqa: E402

lib = fa.load(sys.argv[1] if len(sys.argv) > 1 else "build/libflashattn.so")
s = int(sys.argv[2]) if len(sys.argv) > 2 else 16384
d = int(sys.argv[3]) if len(sys.argv) > 3 else 128
heads_list = [int(x) for x in sys.argv[4].split(",")] if len(sys.argv) > 4 else [12, 14, 16, 20, 23]
block_m = int(sys.argv[5]) if len(sys.argv) > 5 else 192
sms = torch.cuda.get_device_properties(0).multi_processor_count

print(f"flashattn-sm90 forward d{d} s{s} batch 1 non-causal, {sms} SMs; tiles = heads * ceil(s / {block_m})")
for heads in heads_list:
    q, k, v = (torch.randn((1, s, heads, d), device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ours = gb.Ours(lib, "flashattn-sm90", q, k, v, False)
    t = median_ms(ours.forward, n=20)
    with torch.no_grad():
        tc = median_ms(lambda: gb.torch_fwd(SDPBackend.CUDNN_ATTENTION, q, k, v, False), n=20)
    tiles = heads * ((s + block_m - 1) // block_m)
    fl = gb.flops(1, heads, s, s, d, False, False)
    print(f"heads {heads:3d} tiles {tiles:5d} rounds {tiles / sms:6.2f}: ours {t:7.3f} ms {fl / t / 1e9:6.1f} TFLOP/s"
          f" | cudnn {tc:7.3f} ms {fl / tc / 1e9:6.1f} TFLOP/s", flush=True)
    del q, k, v, ours
    torch.cuda.empty_cache()
