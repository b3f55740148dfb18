"""Where a short call's time goes, ours against cuDNN: the benchmark's interleaved timing (bench/gpu_bench.py:
L2 flushed by zeroing 256 MB, CUDA events around each call, calls in turn) run under torch.profiler, so that each
call's event time sits beside the device time of its kernels (CUPTI) and the gap between the start event and the
kernel. usage: python3 dev/sm90/kernel_times.py LIB [d,causal,seqlen[,heads[,batch]]];...  (bf16; heads 2048 / d,
batch 16k tokens / seqlen by default)."""
import os
import statistics
import sys

import torch
from torch.nn.attention import SDPBackend
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import fa_ctypes as fa  # noqa: E402
import gpu_bench as gb  # noqa: E402


def run(lib, d, causal, s, heads, batch, rounds=60):
    gen = torch.Generator(device="cuda").manual_seed(s * 131 + d)
    q, k, v = (torch.randn((batch, s, heads, d), device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    ours = gb.Ours(lib, "flashattn-sm90", q, k, v, bool(causal))
    fns = {"ours": ours.forward, "cudnn": lambda: gb.torch_fwd(SDPBackend.CUDNN_ATTENTION, q, k, v, bool(causal))}
    cache = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device="cuda")
    with torch.no_grad():
        for _ in range(20):
            for fn in fns.values():
                cache.zero_()
                fn()
        torch.cuda.synchronize()
        events = {n: [] for n in fns}
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for r in range(rounds):
                order = list(fns) if r % 2 == 0 else list(reversed(fns))
                for n in order:
                    cache.zero_()
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    e0.record()
                    fns[n]()
                    e1.record()
                    events[n].append((e0, e1))
            torch.cuda.synchronize()
    ev_ms = {n: statistics.median(a.elapsed_time(b) for a, b in e) for n, e in events.items()}
    # Device kernels in launch order: the zero fill, then the call's kernels, per call.
    kern = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kern.sort(key=lambda e: e.time_range.start)
    per_call = {"ours": [], "cudnn": []}
    gaps = {"ours": [], "cudnn": []}
    i = 0
    calls = []
    for r in range(rounds):
        calls += list(fns) if r % 2 == 0 else list(reversed(list(fns)))
    names = set()
    for n in calls:
        # the fill kernel first
        while i < len(kern) and "fill" not in kern[i].name.lower() and "zero" not in kern[i].name.lower():
            i += 1
        if i >= len(kern):
            break
        fill_end = kern[i].time_range.end
        i += 1
        start, end, j = None, None, i
        while j < len(kern) and "fill" not in kern[j].name.lower() and "zero" not in kern[j].name.lower():
            names.add((n, kern[j].name[:60]))
            start = kern[j].time_range.start if start is None else start
            end = kern[j].time_range.end
            j += 1
        i = j
        if start is not None:
            per_call[n].append((end - start) / 1000.0)
            gaps[n].append((start - fill_end) / 1000.0)
    out = {}
    for n in fns:
        out[n] = (ev_ms[n], statistics.median(per_call[n]) if per_call[n] else float("nan"),
                  statistics.median(gaps[n]) if gaps[n] else float("nan"), len(per_call[n]))
    return out, sorted(names)


def main():
    lib = fa.load(sys.argv[1])
    specs = sys.argv[2] if len(sys.argv) > 2 else "64,1,512;64,1,1024;128,0,512;64,0,512"
    print("d causal seqlen heads batch | events ours / cudnn (ms) | kernels ours / cudnn | fill->kernel gap ours / cudnn"
          " | ours/cudnn by events, by kernels", flush=True)
    for spec in specs.split(";"):
        x = [int(t) for t in spec.split(",")]
        d, causal, s = x[:3]
        heads = x[3] if len(x) > 3 else 2048 // d
        batch = x[4] if len(x) > 4 else 16384 // s
        res, names = run(lib, d, causal, s, heads, batch)
        (eo, ko, go, no), (ec, kc, gc, nc) = res["ours"], res["cudnn"]
        print(f"{d:3d} {causal} {s:6d} {heads:4d} {batch:4d} | {eo:.4f} / {ec:.4f} | {ko:.4f} / {kc:.4f} | "
              f"{go:.4f} / {gc:.4f} | {ec / eo:.3f} {kc / ko:.3f}  (calls {no}, {nc})", flush=True)
        for n, k in names:
            print(f"    {n}: {k}")


if __name__ == "__main__":
    main()
