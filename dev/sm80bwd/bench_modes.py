"""One backward problem timed three ways in one process, to find why the library's sweep reads the sm90
backward at 16k non-causal under its 8k point while backward-only runs do not: CUDA events around
back-to-back calls; events around calls each preceded by a 256 MB memset (what do_bench does to flush the
L2); and triton's do_bench itself (the sweep's timer, 250 ms). usage: python3 dev/sm80bwd/bench_modes.py LIB
[seqlen,...] [d] [impl,...]"""
import os
import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import fa_ctypes as fa  # noqa: E402
import gpu_bench as gb  # noqa: E402
from event_timing import median_ms  # noqa: E402

libs = {}
for i, spec in enumerate((sys.argv[1] if len(sys.argv) > 1 else "build/libflashattn.so").split(",")):
    name, _, path = spec.rpartition("=")
    libs[name or f"lib{i}"] = fa.load(path)
seqlens = [int(x) for x in sys.argv[2].split(",")] if len(sys.argv) > 2 else [8192, 16384]
d = int(sys.argv[3]) if len(sys.argv) > 3 else 128
impls = sys.argv[4].split(",") if len(sys.argv) > 4 else ["flashattn-sm90", "flashattn-sm80"]
flush = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")


for s in seqlens:
    batch, heads = 16384 // s, 2048 // d
    gen = torch.Generator(device="cuda").manual_seed(s * 131 + d)
    shape = (batch, s, heads, d)
    q, k, v, dout = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
    fl = gb.flops(batch, heads, s, s, d, False, True)
    for impl in impls:
        for name, lib in libs.items():
            ours = gb.Ours(lib, impl, q, k, v, False)
            ours.prepare_backward(dout)
            r = [median_ms(ours.backward), median_ms(ours.backward, before=flush.zero_),
                 do_bench(ours.backward, warmup=25, rep=250, return_mode="median"), median_ms(ours.backward)]
            print(f"{name:>6} {impl} d{d} s{s} b{batch}: TFLOP/s events {fl / r[0] / 1e9:6.1f} | events+flush"
                  f" {fl / r[1] / 1e9:6.1f} | do_bench {fl / r[2] / 1e9:6.1f} | events again {fl / r[3] / 1e9:6.1f}",
                  flush=True)
            del ours
            torch.cuda.empty_cache()
