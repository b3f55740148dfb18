"""Two or more builds of the library side by side on decode (one query row against a long K/V cache), bf16,
head_dim 128, one process: each shape timed by every build in turn, ROUNDS times (default 3; every other round
in reverse order), median of N calls each time (dev/sm80bwd/event_timing.py; FLUSH=1: the L2 emptied before
each call, as the library benchmark's do_bench does). IMPL: the implementation asked for (default auto, the
library's own choice; flashattn-sm80 forces the split-KV path). CUDNN=1: torch's cuDNN SDPA (no_grad) as one
more column. PAGE=n: the builds named in PAGED (comma-separated; default the last) also on the same cache paged (pages of
n rows, shuffled in a pool; fa_params.block_table), as NAME-paged (a build from before the paged cache, 78fe47c,
would ignore the table). Each build's output is checked against torch's flash SDPA once per shape (max |diff|).
usage: python3 dev/sm80fwd/decode_ab.py NAME=LIB,NAME=LIB [SHAPES]; SHAPES: ';'-separated
"batch,seqlen_k[,heads[,heads_kv]]" (default: bench/gpu_bench.py's decode problems, 16 heads). Prints GB/s of
K and V read per build (the median over rounds) and each build's ratio to the first (the median of the
rounds' ratios)."""
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "sm80bwd"))
import gpu_bench as gb  # noqa: E402
import fa_ctypes as fa  # noqa: E402
from event_timing import median_ms  # noqa: E402

libs = fa.load_named(sys.argv[1])
if len(sys.argv) > 2:
    shapes = [tuple(int(x) for x in s.split(",")) for s in sys.argv[2].split(";")]
else:
    shapes = [(b, sk) for b in (1, 4, 16) for sk in (4096, 16384, 65536)]
N = int(os.environ.get("N", "20"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
IMPL = os.environ.get("IMPL", "auto")
flush = None
if os.environ.get("FLUSH", "1") == "1":
    _l2 = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    flush = _l2.zero_

PAGE = int(os.environ.get("PAGE", "0"))



paged_libs = os.environ.get("PAGED", list(libs)[-1]).split(",") if PAGE else []
names = list(libs) + [f"{n}-paged" for n in paged_libs]
if os.environ.get("CUDNN", "0") == "1":
    names.append("cudnn")
props = torch.cuda.get_device_properties(0)
print(f"# {props.name}, {props.multi_processor_count} SMs; impl {IMPL}; GB/s of K and V", flush=True)
print("batch seqlen_k heads heads_kv | " + " ".join(f"{n:>8}" for n in names) + " | " +
      " ".join(f"{n}/{names[0]}" for n in names[1:]) + " | max diff", flush=True)
d = 128
for shape in shapes:
    b, sk = shape[:2]
    heads = shape[2] if len(shape) > 2 else 16
    heads_kv = shape[3] if len(shape) > 3 else heads
    gen = torch.Generator(device="cuda").manual_seed(b * 7 + sk)
    q = torch.randn(b, 1, heads, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(b, sk, heads_kv, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    kv_bytes = 2 * k.numel() * k.element_size()
    ours = {n: gb.Ours(lib, IMPL, q, k, v, False) for n, lib in libs.items()}
    if PAGE:
        kp, vp, table, extra = gb.paged_cache(k, v, PAGE, gen)
        ours.update({f"{n}-paged": gb.Ours(libs[n], IMPL, q, kp, vp, False, **extra) for n in paged_libs})
    calls = {n: o.forward for n, o in ours.items()}
    with torch.no_grad():
        ref = gb.torch_fwd(gb.SDPBackend.FLASH_ATTENTION if heads == heads_kv else gb.SDPBackend.MATH,
                           q, k.repeat_interleave(heads // heads_kv, 2), v.repeat_interleave(heads // heads_kv, 2),
                           False).float()
        diff = max((calls[n]().float() - ref).abs().max().item() for n in ours)
    if "cudnn" in names:
        kr, vr = (x.repeat_interleave(heads // heads_kv, 2) for x in (k, v))
        calls["cudnn"] = lambda: gb.torch_fwd(gb.SDPBackend.CUDNN_ATTENTION, q, kr, vr, False)
    times = {n: [] for n in names}
    with torch.no_grad():
        for r in range(ROUNDS):
            for n in names if r % 2 == 0 else names[::-1]:
                times[n].append(median_ms(calls[n], n=N, before=flush))
    gbps = {n: kv_bytes / statistics.median(t) / 1e6 for n, t in times.items()}
    ratio = {n: statistics.median(a / c for a, c in zip(times[names[0]], times[n])) for n in names[1:]}
    print(f"{b:5d} {sk:8d} {heads:5d} {heads_kv:8d} | " + " ".join(f"{gbps[n]:8.0f}" for n in names) + " | " +
          " ".join(f"{ratio[n]:.3f}" for n in names[1:]) + f" | {diff:.2e}", flush=True)
    del q, k, v, ours, calls
    if PAGE:
        del kp, vp, table
    torch.cuda.empty_cache()
