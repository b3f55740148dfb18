"""The backward timed three ways, ours and cuDNN's (session 57): `synced` (CUDA events around each call and a
synchronize after it: dev/sm80bwd/event_timing.py before session 57), `queued` (its form since: n calls queued,
one synchronize) and triton's do_bench (the library benchmark's). L2 flushed before each call (256 MB written).
usage: python3 dev/sm90/timing_check.py LIB [d,causal,seqlen;...]  (bf16, 16k tokens, 2048 / d heads); FWD=1: the
forward instead (cuDNN's under no_grad, o alone, as the library benchmark times it)."""
import os
import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "sm80bwd"))
import fa_ctypes as fa  # noqa: E402
import gpu_bench as gb  # noqa: E402
from event_timing import median_ms  # noqa: E402

cache = torch.empty(256 << 20, dtype=torch.int8, device="cuda")


def synced_ms(fn, n=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(n):
        cache.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[n // 2]


FWD = os.environ.get("FWD", "0") == "1"
lib = fa.load(sys.argv[1])
specs = sys.argv[2] if len(sys.argv) > 2 else "128,0,512;128,0,2048;128,0,16384;64,0,512;64,1,1024"
print(f"{'forward' if FWD else 'backward'}; d causal seqlen | TFLOP/s synced / queued / do_bench: ours | cudnn",
      flush=True)
for spec in specs.split(";"):
    d, causal, s = (int(x) for x in spec.split(","))
    heads, b = 2048 // d, 16384 // s
    q, k, v = (torch.randn((b, s, heads, d), device="cuda", dtype=torch.bfloat16) for _ in range(3))
    dout = torch.randn_like(q)
    ours = gb.Ours(lib, "flashattn-sm90", q, k, v, bool(causal))
    ours.prepare_backward(dout)
    qq, kk, vv = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = gb.torch_fwd(gb.SDPBackend.CUDNN_ATTENTION, qq, kk, vv, bool(causal))

    def cudnn_bwd():
        for x in (qq, kk, vv):
            x.grad = None
        out.backward(dout, retain_graph=True)

    def cudnn_fwd():
        with torch.no_grad():
            gb.torch_fwd(gb.SDPBackend.CUDNN_ATTENTION, q, k, v, bool(causal))
    fl = gb.flops(b, heads, s, s, d, bool(causal), not FWD) / 1e9
    row = []
    for fn in ((ours.forward, cudnn_fwd) if FWD else (ours.backward, cudnn_bwd)):
        ms = (synced_ms(fn), median_ms(fn, before=cache.zero_),
              do_bench(fn, warmup=25, rep=100, return_mode="median"))
        row.append(" / ".join(f"{fl / t:6.1f}" for t in ms))
    print(f"{d:3d} {causal} {s:6d} | {row[0]} | {row[1]}", flush=True)
    del q, k, v, qq, kk, vv, out, ours
    torch.cuda.empty_cache()
