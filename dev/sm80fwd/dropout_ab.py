"""Dropout's cost on the GPU: the library's forward (o and lse, as training runs it) and backward with and
without dropout, beside torch's SDPA on its flash backend (FlashAttention-2) with the same dropout_p, bf16,
one process, every call timed in each round (ROUNDS, default 2; median of N calls, CUDA events).
usage: python3 dev/sm80fwd/dropout_ab.py LIB [SHAPES]   (SHAPES: ';'-separated "d,causal,seqlen", 16k tokens,
2048 / d heads; P: dropout_p, default 0.1; IMPL: the forward's, default auto; BWD_IMPL: the backward's, default
auto). Prints TFLOP/s."""
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "sm80bwd"))
import fa_ctypes as fa  # noqa: E402
import gpu_bench as gb  # noqa: E402
from event_timing import median_ms  # noqa: E402

lib = fa.load(sys.argv[1])
shapes = [tuple(int(x) for x in s.split(",")) for s in (sys.argv[2] if len(sys.argv) > 2 else
                                                         "64,0,4096;64,1,4096;128,0,4096;128,1,4096;128,1,16384").split(";")]
P = float(os.environ.get("P", "0.1"))
N, ROUNDS = int(os.environ.get("N", "10")), int(os.environ.get("ROUNDS", "2"))
IMPL, BWD_IMPL = os.environ.get("IMPL", "auto"), os.environ.get("BWD_IMPL", "auto")
print(f"# {torch.cuda.get_device_properties(0).name}; dropout_p {P}; ours: {IMPL} (backward {BWD_IMPL})", flush=True)
cols = ["fwd", "fwd_drop", "sdpa_fwd_drop", "bwd", "bwd_drop", "sdpa_bwd_drop"]
print("d causal seqlen heads batch | " + " ".join(f"{c:>13}" for c in cols), flush=True)
for d, causal, s in shapes:
    heads, b = 2048 // d, max(1, 16384 // s)
    q, k, v, dout = (torch.randn((b, s, heads, d), device="cuda", dtype=torch.bfloat16) for _ in range(4))
    plain = gb.Ours(lib, IMPL, q, k, v, bool(causal))
    drop = gb.Ours(lib, IMPL, q, k, v, bool(causal), dropout_p=P, dropout_seed=1)
    plain_b = gb.Ours(lib, BWD_IMPL, q, k, v, bool(causal))
    drop_b = gb.Ours(lib, BWD_IMPL, q, k, v, bool(causal), dropout_p=P, dropout_seed=1)
    plain_b.prepare_backward(dout)
    drop_b.prepare_backward(dout)
    qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))

    def sdpa():
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return F.scaled_dot_product_attention(qt, kt, vt, dropout_p=P, is_causal=bool(causal))
    out = sdpa()
    dout_t = dout.transpose(1, 2)

    def sdpa_bwd():
        for x in (qt, kt, vt):
            x.grad = None
        out.backward(dout_t, retain_graph=True)

    def sdpa_fwd():
        with torch.no_grad():
            sdpa()
    calls = {"fwd": plain.forward_lse, "fwd_drop": drop.forward_lse, "sdpa_fwd_drop": sdpa_fwd,
             "bwd": plain_b.backward, "bwd_drop": drop_b.backward, "sdpa_bwd_drop": sdpa_bwd}
    times = {c: [] for c in cols}
    for r in range(ROUNDS):
        for c in cols if r % 2 == 0 else cols[::-1]:
            times[c].append(median_ms(calls[c], n=N))
    tf = {c: gb.flops(b, heads, s, s, d, bool(causal), c.endswith("bwd") or "bwd" in c) / statistics.median(t) / 1e9
          for c, t in times.items()}
    print(f"{d:3d} {causal} {s:6d} {heads:4d} {b:4d} | " + " ".join(f"{tf[c]:13.1f}" for c in cols), flush=True)
    del q, k, v, dout, plain, drop, plain_b, drop_b, qt, kt, vt, out
    torch.cuda.empty_cache()
