"""The last wave's cost: backward kernel time per k-block task against the number of tasks (heads at
batch 1), the library's main kernel and torch's flash backend. With equal tasks dispatched in waves of
one per SM, time / task rises when tasks % SMs is small. usage: python3 dev/sm80bwd/waves.py LIB
[seqlen] [d] [heads,...] (IMPL=flashattn-sm90: the Hopper kernels)."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import fa_ctypes as fa  # noqa: E402
import gpu_bench as gb  # noqa: E402
from event_timing import median_ms  # noqa: E402
from torch.nn.attention import SDPBackend  # noqa: E402

lib = fa.load(sys.argv[1] if len(sys.argv) > 1 else "build/libflashattn.so")
s = int(sys.argv[2]) if len(sys.argv) > 2 else 16384
d = int(sys.argv[3]) if len(sys.argv) > 3 else 128
heads_list = [int(x) for x in sys.argv[4].split(",")] if len(sys.argv) > 4 else [15, 16, 17, 31, 33]
IMPL = os.environ.get("IMPL", "flashattn-sm80")
sms = torch.cuda.get_device_properties(0).multi_processor_count


print(f"{IMPL} d{d} s{s} batch 1, {sms} SMs; tasks = heads * ceil(s / 128)")
for heads in heads_list:
    q, k, v, dout = (torch.randn((1, s, heads, d), device="cuda", dtype=torch.bfloat16) for _ in range(4))
    ours = gb.Ours(lib, IMPL, q, k, v, False)
    ours.prepare_backward(dout)
    t = median_ms(ours.backward, n=10)
    qq, kk, vv = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = gb.torch_fwd(SDPBackend.FLASH_ATTENTION, qq, kk, vv, False)

    def flash_bwd():
        qq.grad = kk.grad = vv.grad = None
        out.backward(dout, retain_graph=True)
    tf = median_ms(flash_bwd, n=10)
    tasks = heads * ((s + 127) // 128)
    fl = gb.flops(1, heads, s, s, d, False, True)
    print(f"heads {heads:3d} tasks {tasks:5d} waves {tasks / sms:6.2f}: ours {t:7.3f} ms {fl / t / 1e9:6.1f} TFLOP/s"
          f" | flash {tf:7.3f} ms {fl / tf / 1e9:6.1f} TFLOP/s", flush=True)
    del q, k, v, dout, ours, qq, kk, vv, out
    torch.cuda.empty_cache()
