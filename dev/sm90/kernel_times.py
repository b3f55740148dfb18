"""Where a short call's time goes, ours against cuDNN: the benchmark's interleaved timing (bench/gpu_bench.py's
`interleaved`: L2 flushed by zeroing 256 MB, CUDA events around each call, calls in turn) run under torch.profiler, so that each
call's event time sits beside the device time of its kernels (CUPTI) and the gap between the start event and the
kernel. usage: python3 dev/sm90/kernel_times.py LIB [d,causal,seqlen[,heads[,batch]]];...  (bf16; heads 2048 / d,
batch 16k tokens / seqlen by default). BWD=1: the backward (ours: fa_backward; cuDNN's through autograd, as the
library benchmark times it), each kernel's median device time listed."""
import os
import statistics
import sys

import torch
from torch.nn.attention import SDPBackend
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import fa_ctypes as fa  # noqa: E402
import gpu_bench as gb  # noqa: E402


BWD = os.environ.get("BWD", "0") == "1"


def flush(cache):  # the L2 flush: a kernel no attention call launches (its calls may fill or zero)
    cache.bitwise_not_()


def is_fill(kernel):
    return "bitwise_not" in kernel.name.lower()


def run(lib, d, causal, s, heads, batch, rep_ms=100):
    gen = torch.Generator(device="cuda").manual_seed(s * 131 + d)
    q, k, v = (torch.randn((batch, s, heads, d), device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    ours = gb.Ours(lib, "flashattn-sm90", q, k, v, bool(causal))
    fns = {"ours": ours.forward, "cudnn": lambda: gb.torch_fwd(SDPBackend.CUDNN_ATTENTION, q, k, v, bool(causal))}
    if BWD:
        dout = torch.randn_like(q)
        ours.prepare_backward(dout)
        qq, kk, vv = (x.detach().clone().requires_grad_() for x in (q, k, v))
        out = gb.torch_fwd(SDPBackend.CUDNN_ATTENTION, qq, kk, vv, bool(causal))

        def cudnn_bwd():
            for x in (qq, kk, vv):
                x.grad = None
            out.backward(dout, retain_graph=True)
        fns = {"ours": ours.backward, "cudnn": cudnn_bwd}
    with torch.set_grad_enabled(BWD), profile(activities=[ProfilerActivity.CUDA]) as prof:
        ev_ms = dict(zip(fns, gb.interleaved(list(fns.values()), rep_ms, flush=flush)))
    # The device's kernels in time order: each timed call is the L2 flush's fill, then the call's kernels (ours
    # alone; cuDNN's memset and kernel). Calls without a fill before them (interleaved's warm-up) are left out.
    kern = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                  key=lambda e: e.time_range.start)
    per_call, gaps, names = {n: [] for n in fns}, {n: [] for n in fns}, {}
    i = 0
    while i < len(kern):
        if not is_fill(kern[i]):
            i += 1
            continue
        fill_end, j = kern[i].time_range.end, i + 1
        while j < len(kern) and not is_fill(kern[j]):
            j += 1
        call = kern[i + 1:j]
        i = j
        # Whose call: memsets and fills (ours may zero the dQ accumulator, autograd its gradients) go with it.
        owners = {"ours" if "flashattn" in e.name else "cudnn" for e in call
                  if not any(w in e.name.lower() for w in ("memset", "fill", "zero"))}
        if len(owners) != 1:
            continue  # no kernel, or a warm-up pair without a flush between
        n = owners.pop()
        for e in call:
            names.setdefault((n, e.name[:70]), []).append((e.time_range.end - e.time_range.start) / 1000.0)
        per_call[n].append((call[-1].time_range.end - call[0].time_range.start) / 1000.0)
        gaps[n].append((call[0].time_range.start - fill_end) / 1000.0)
    med = lambda x: statistics.median(x) if x else float("nan")  # noqa: E731
    return ({n: (ev_ms[n], med(per_call[n]), med(gaps[n]), len(per_call[n])) for n in fns},
            {k: (med(t), len(t)) for k, t in sorted(names.items())})


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
        for (n, k), (t, c) in names.items():
            print(f"    {n}: {t:.4f} ms x {c}: {k}")


if __name__ == "__main__":
    main()
