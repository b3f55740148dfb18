"""The 16k figure of the full sweep, case by case: bench/gpu_bench.py's bench_case at seqlen 16k
(batch 1) with different implementation lists before flashattn-sm80, and the sm80 backward's
TFLOP/s in each; plus the same with more timed repeats. usage: python3 dev/sm80bwd/case_probe.py LIB"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import fa_ctypes as fa  # noqa: E402
import gpu_bench as gb  # noqa: E402

lib = fa.load(sys.argv[1] if len(sys.argv) > 1 else "build/libflashattn.so")
lists = {"sm80,flash": ["flashattn-sm80", "torch-flash"],
         "sm90,sm80,flash": ["flashattn-sm90", "flashattn-sm80", "torch-flash"],
         "all5": ["flashattn-sm90", "flashattn-sm80", "torch-flash", "torch-efficient", "torch-cudnn"]}
for d, heads in ((64, 32), (128, 16)):
    for s in (8192, 16384):
        for name, impls in lists.items():
            rows = gb.bench_case(lib, impls, 16384 // s, heads, s, d, False, "fwd,bwd", "probe", "probe")
            r = {(x["impl"], x["pass"]): x["tflops"] for x in rows}
            print(f"d{d} s{s} [{name:<16}] sm80 bwd {r.get(('flashattn-sm80', 'bwd'), 0):.0f}  flash bwd "
                  f"{r.get(('torch-flash', 'bwd'), 0):.0f}", flush=True)
# the same call timed with many more repeats (do_bench's rep in ms)
from triton.testing import do_bench  # noqa: E402
for d, heads in ((64, 32), (128, 16)):
    shape = (1, 16384, heads, d)
    q, k, v, dout = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    ours = gb.Ours(lib, "flashattn-sm80", q, k, v, False)
    ours.prepare_backward(dout)
    f = gb.flops(1, heads, 16384, 16384, d, False, True)
    for rep in (100, 1000):
        ms = [do_bench(ours.backward, warmup=25, rep=rep, return_mode="median") for _ in range(3)]
        print(f"d{d} s16384 sm80 bwd, do_bench rep={rep}: " + " ".join(f"{f / m / 1e9:.0f}" for m in ms), flush=True)
    times = []
    for _ in range(12):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(); ours.backward(); e1.record(); torch.cuda.synchronize()
        times.append(f / e0.elapsed_time(e1) / 1e9)
    print(f"d{d} s16384 sm80 bwd, 12 calls back to back: " + " ".join(f"{t:.0f}" for t in times), flush=True)
    del ours, q, k, v, dout
    torch.cuda.empty_cache()
