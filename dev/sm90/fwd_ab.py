"""Two or more builds of the library side by side on the Hopper forward (flashattn-sm90), bf16, one
process: each shape timed by every build in turn, ROUNDS times (default 2; every other round in reverse
order), median of N calls (CUDA events, back to back) each time; IMPL: another implementation (e.g.
flashattn-sm80); SOFTCAP=c: scores capped (c * tanh(s / c)); ALIBI=1: ALiBi; DROPOUT=p: dropout; CUDNN=1: torch's cuDNN SDPA (no_grad, o
alone, as the library benchmark times it) as one more column, in the same rounds; BWD=1: the backward (with
CUDNN=1 cuDNN's through autograd, as the library benchmark times it). usage: python3 dev/sm90/fwd_ab.py
NAME=LIB,NAME=LIB [SHAPES] (NAME@IMPL=LIB: that build through IMPL, e.g. one library's sm90 and sm80
forwards side by side). SHAPES: ';'-separated
"d,causal,seqlen[,heads[,batch[,window_left[,window_right]]]]" (a window: window_right 0 unless given;
TFLOP/s then count the scores inside it); default: the
standard sweep at head_dim 128 (16k tokens, 2048 / d heads). Prints TFLOP/s per build (the median over
rounds) and the ratio of each to the first: the median of the rounds' ratios (each round times the builds
back to back, so a ratio is taken at one state of the card's clock and power)."""
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "sm80bwd"))
import fa_ctypes as fa  # noqa: E402
import gpu_bench as gb  # noqa: E402
from event_timing import median_ms  # noqa: E402

libs = fa.load_named(sys.argv[1])
if len(sys.argv) > 2:
    shapes = [tuple(int(x) for x in s.split(",")) for s in sys.argv[2].split(";")]
else:
    shapes = [(128, c, s) for c in (0, 1) for s in (512, 1024, 2048, 4096, 8192, 16384)]
N = int(os.environ.get("N", "20"))
# FLUSH=1: L2 emptied before each timed call (256 MB written), as the library benchmark's do_bench does.
flush = None
if os.environ.get("FLUSH", "0") == "1":
    _l2 = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    flush = _l2.zero_
ROUNDS = int(os.environ.get("ROUNDS", "2"))
BWD = os.environ.get("BWD", "0") == "1"
IMPL = os.environ.get("IMPL", "flashattn-sm90")
SOFTCAP = float(os.environ.get("SOFTCAP", "0"))  # > 0: fa_params.softcap (tanh capping of the scores)
ALIBI = os.environ.get("ALIBI", "0") == "1"  # ALiBi with the paper's slopes 2^(-8 (h + 1) / heads)
DROPOUT = float(os.environ.get("DROPOUT", "0"))  # > 0: fa_params.dropout_p (seed 1)

names = list(libs)
if os.environ.get("CUDNN", "0") == "1":
    names.append("cudnn")
props = torch.cuda.get_device_properties(0)
print(f"# {props.name}, {props.multi_processor_count} SMs, L2 {props.L2_cache_size >> 20} MiB", flush=True)
print("d causal seqlen heads batch | " + " ".join(f"{n:>8}" for n in names) + " | " +
      " ".join(f"{n}/{names[0]}" for n in names[1:]), flush=True)
for shape in shapes:
    d, causal, s = shape[:3]
    heads = shape[3] if len(shape) > 3 else 2048 // d
    b = shape[4] if len(shape) > 4 else max(1, 16384 // s)
    q, k, v = (torch.randn((b, s, heads, d), device="cuda", dtype=torch.bfloat16) for _ in range(3))
    wl = shape[5] if len(shape) > 5 else -1
    wr = shape[6] if len(shape) > 6 else (0 if wl >= 0 else -1)
    extra = {"softcap": SOFTCAP} if SOFTCAP > 0 else {}
    if DROPOUT > 0:
        extra.update(dropout_p=DROPOUT, dropout_seed=1)
    if ALIBI:
        slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / heads) for i in range(heads)], device="cuda")
        extra["alibi_slopes"] = slopes.data_ptr()
    ours = {n: gb.Ours(lib, n.partition("@")[2] or IMPL, q, k, v, bool(causal), window_left=wl, window_right=wr, **extra)
            for n, lib in libs.items()}
    calls = {n: o.forward for n, o in ours.items()}
    if BWD:  # the backward instead (dq, dk, dv from o, lse and a fixed dout)
        dout = torch.randn_like(q)
        for n, o in ours.items():
            o.prepare_backward(dout)
            calls[n] = o.backward
    if "cudnn" in names and BWD:  # cuDNN's backward through autograd, as gpu_bench
        qq, kk, vv = (x.detach().clone().requires_grad_() for x in (q, k, v))
        out = gb.torch_fwd(gb.SDPBackend.CUDNN_ATTENTION, qq, kk, vv, bool(causal))

        def cudnn_bwd(out=out, dout=dout, leaves=(qq, kk, vv)):
            for x in leaves:
                x.grad = None
            out.backward(dout, retain_graph=True)
        calls["cudnn"] = cudnn_bwd
    elif "cudnn" in names:
        calls["cudnn"] = lambda: gb.torch_fwd(gb.SDPBackend.CUDNN_ATTENTION, q, k, v, bool(causal))
    timed = list(names)
    if "cudnn" in calls:  # a shape cuDNN does not take (e.g. its head dims) leaves its column empty
        try:
            with torch.enable_grad() if BWD else torch.no_grad():
                calls["cudnn"]()
        except RuntimeError:
            timed.remove("cudnn")
    times = {n: [] for n in names}
    for r in range(ROUNDS):
        for n in timed if r % 2 == 0 else timed[::-1]:
            with torch.enable_grad() if BWD and n == "cudnn" else torch.no_grad():
                times[n].append(median_ms(calls[n], n=N, before=flush))
    for n in names:
        if not times[n]:
            times[n] = [float("nan")] * ROUNDS
    fl = gb.flops(b, heads, s, s, d, bool(causal), BWD)
    if wl >= 0 or wr >= 0:  # the keys each row sees: [i - wl, i + wr] (and <= i with causal), within [0, s)
        right = [min(s - 1, i + (0 if causal else wr if wr >= 0 else s)) for i in range(s)]
        fl = 4.0 * b * heads * d * sum(r - max(0, i - wl if wl >= 0 else 0) + 1 for i, r in enumerate(right))
    tf = {n: fl / statistics.median(t) / 1e9 for n, t in times.items()}
    ratio = {n: statistics.median(a / b for a, b in zip(times[names[0]], times[n])) for n in names[1:]}
    window = f" w{wl},{wr}" if wl >= 0 or wr >= 0 else ""
    print(f"{d:3d} {causal} {s:6d} {heads:4d} {b:4d}{window} | " + " ".join(f"{tf[n]:8.1f}" for n in names) +
          " | " + " ".join(f"{ratio[n]:.3f}" for n in names[1:]), flush=True)
    del q, k, v, ours, calls
    torch.cuda.empty_cache()
