"""Side-by-side attention benchmark on one GPU, in one process.

The library (through its C ABI, ctypes on torch tensors' pointers) against PyTorch's
scaled_dot_product_attention backends (flash, efficient, cudnn, math), medians of CUDA-event
timings (triton.testing.do_bench), on the standard sweep of ANCHORS.md: bf16, 16k tokens,
hidden 2048, head_dim 64 and 128 (256 with 8 heads for the forward), seqlen 512 ... 16384,
causal and not, forward and backward; plus the seeds' classic small problem. The forward
rows time o alone, the lse not requested, as torch's SDPA runs under no_grad (its cuDNN and
efficient kernels then skip the log-sum-exp); flashattn-sm90+lse is the same call writing the lse,
as a training step's forward does (from run 49 on; the runs before timed that one as flashattn-sm90).
From run 51 on the forward of those two and torch-cudnn's, the head-to-head of the Hopper issue, are
timed call by call in turn (interleaved: the card's clock moves over a series by more than the gaps
measured); run 50 timed them in a palindrome of 125 ms windows, run 49 o then lse, the runs before
every impl one after the other (cuDNN's forward after torch-efficient's backward).

Each measurement is one JSON line: impl, pass, dtype, batch, heads, seqlen_q, seqlen_k,
head_dim, causal, ms, tflops, device, date (+ max_abs_diff vs torch's math/flash output, and
peak extra memory for the classic problem); decode problems (one query row, long K/V cache; their
K/V bandwidth as gbps; problem "decode"); and the card's cuBLAS matmul ceiling before and after
the sweep (problem "ceiling").

usage: python3 bench/gpu_bench.py --lib build/libflashattn.so --out results.jsonl [--quick]
"""
import argparse
import ctypes
import datetime
import json
import math
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

sys.path.insert(0, os.path.dirname(__file__))
import fa_ctypes as fa  # noqa: E402

TORCH_BACKENDS = {"torch-flash": SDPBackend.FLASH_ATTENTION, "torch-efficient": SDPBackend.EFFICIENT_ATTENTION,
                  "torch-cudnn": SDPBackend.CUDNN_ATTENTION, "torch-math": SDPBackend.MATH}


# Timed window of each measurement (do_bench's rep, ms): at 16k keys a backward call takes ~18 ms, so
# 100 ms gave a median of 5 calls, which moved by up to 8% between readings (dev/sm80bwd/NOTES.md);
# 250 ms gives 13 or more.
REP_MS = 250


def flops(batch, heads, sq, sk, d, causal, bwd):
    f = 4.0 * batch * heads * sq * sk * d
    if causal:
        f /= 2
    return f * 2.5 if bwd else f


class Ours:
    """One library implementation on fixed (batch, seqlen, heads, d) tensors. forward() returns o alone, as
    torch's SDPA does under no_grad (its cuDNN and efficient kernels then skip the log-sum-exp);
    forward_lse() writes the lse too, as a training step's forward (and the backward) needs. extra: more
    fa_params fields for all three, the backward's too (e.g. window_left, window_right)."""

    def __init__(self, lib, impl, q, k, v, causal, **extra):
        self.lib, self.impl, self.causal, self.extra = lib, fa.IMPL[impl], causal, extra
        self.q, self.k, self.v = q, k, v
        self.o = torch.empty_like(q)
        b, s, h, _ = q.shape
        self.lse = torch.empty(b, h, s, device=q.device, dtype=torch.float32)
        self.p = fa.params_from(torch, q, k, v, self.o, self.lse, causal, **extra)
        self.p_o = fa.params_from(torch, q, k, v, self.o, None, causal, **extra)
        self.ws_fwd = self._workspace(0)

    def _workspace(self, backward):
        n = ctypes.c_size_t(0)
        fa.check(self.lib, self.lib.fa_workspace_size(ctypes.byref(self.p), self.impl, backward, ctypes.byref(n)),
                 "workspace size")
        return torch.empty(max(n.value, 1), dtype=torch.uint8, device=self.q.device)

    def forward(self):
        return self._forward(self.p_o)

    def forward_lse(self):
        return self._forward(self.p)

    def _forward(self, p):
        p.workspace, p.workspace_bytes = self.ws_fwd.data_ptr(), self.ws_fwd.numel()
        fa.check(self.lib, self.lib.fa_forward(ctypes.byref(p), self.impl), "forward")
        return self.o

    def prepare_backward(self, dout):
        self.forward_lse()
        self.dout, self.dq = dout, torch.empty_like(self.q)
        self.dk, self.dv = torch.empty_like(self.k), torch.empty_like(self.v)
        self.pb = fa.params_from(torch, self.q, self.k, self.v, self.o, self.lse, self.causal,
                                 dout=dout, dq=self.dq, dk=self.dk, dv=self.dv, **self.extra)
        n = ctypes.c_size_t(0)
        fa.check(self.lib, self.lib.fa_workspace_size(ctypes.byref(self.pb), self.impl, 1, ctypes.byref(n)), "ws")
        self.ws_bwd = torch.empty(max(n.value, 1), dtype=torch.uint8, device=self.q.device)
        self.pb.workspace, self.pb.workspace_bytes = self.ws_bwd.data_ptr(), self.ws_bwd.numel()

    def backward(self):
        fa.check(self.lib, self.lib.fa_backward(ctypes.byref(self.pb), self.impl), "backward")


def interleaved(fns, rep, flush=torch.Tensor.zero_):
    """Median times (ms) of fns, their calls timed in turn: each call as do_bench times it (L2 flushed by
    writing 256 MB: flush(cache), zeroing it unless told, then CUDA events around the call), the order
    reversed every other round, about rep ms of calls each. The card's clock moves over a series (its power
    limit), and by more than the gaps being measured: turn by turn every fn meets the same states of it."""
    cache = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device="cuda")
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        for fn in fns:
            flush(cache)
            fn()
    end.record()
    torch.cuda.synchronize()
    round_ms = start.elapsed_time(end) / 3
    for _ in range(max(1, int(25 / round_ms))):  # warm-up, as do_bench's 25 ms
        for fn in fns:
            fn()
    rounds = max(5, int(rep * len(fns) / round_ms))
    events = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(rounds)]
              for _ in fns]
    for r in range(rounds):
        for j in (range(len(fns)) if r % 2 == 0 else reversed(range(len(fns)))):
            flush(cache)
            events[j][r][0].record()
            fns[j]()
            events[j][r][1].record()
    torch.cuda.synchronize()
    return [statistics.median(s.elapsed_time(e) for s, e in ev) for ev in events]


def torch_fwd(backend, q, k, v, causal):
    # SDPA takes (batch, heads, seqlen, d): transposed views of the same memory. Fewer k, v heads than q
    # heads (GQA) go through SDPA's enable_gqa (torch 2.5 on; a backend without it raises).
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    gqa = {"enable_gqa": True} if k.shape[2] != q.shape[2] else {}
    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, **gqa).transpose(1, 2)


def bench_case(lib, impls, batch, heads, seqlen, d, causal, passes, device, date, dtype=torch.bfloat16):
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(seqlen * 131 + d)
    shape = (batch, seqlen, heads, d)
    q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, generator=gen) for _ in range(3))
    dout = torch.randn(shape, device="cuda", dtype=dtype, generator=gen)
    base = dict(dtype=str(dtype).replace("torch.", "").replace("bfloat16", "bf16").replace("float16", "fp16"),
                batch=batch, heads=heads, seqlen_q=seqlen, seqlen_k=seqlen, head_dim=d, causal=causal,
                device=device, date=date)
    with torch.no_grad():
        ref = torch_fwd(SDPBackend.FLASH_ATTENTION if d <= 256 else SDPBackend.MATH, q, k, v, causal).float()
    # The Hopper issue's head-to-head, its calls timed in turn (interleaved): our forward (o alone, and with the
    # lse: what the lse costs) and cuDNN's; an impl that cannot run the shape stays out (its error comes below).
    ours90, head_to_head = None, {}
    if "fwd" in passes and "flashattn-sm90" in impls:
        try:
            ours90 = Ours(lib, "flashattn-sm90", q, k, v, causal)
            fns = {"flashattn-sm90": ours90.forward, "flashattn-sm90+lse": ours90.forward_lse}
            if "torch-cudnn" in impls:
                cudnn = lambda: torch_fwd(SDPBackend.CUDNN_ATTENTION, q, k, v, causal)  # noqa: E731
                try:
                    with torch.no_grad():
                        cudnn()
                    fns["torch-cudnn"] = cudnn
                except Exception:
                    pass
            with torch.no_grad():
                head_to_head = dict(zip(fns, interleaved(list(fns.values()), REP_MS)))
        except Exception:
            ours90 = None
    for impl in impls:
        if impl == "torch-math" and seqlen > 4096:
            continue  # materializes (b, h, s, s): minutes and tens of GB at 16k
        try:
            if impl.startswith("flashattn"):
                ours = ours90 if impl == "flashattn-sm90" and ours90 is not None else Ours(lib, impl, q, k, v, causal)
                out = ours.forward()
                diff = (out.float() - ref).abs().max().item()
                if "fwd" in passes:
                    if impl in head_to_head:
                        ms, ms_lse = head_to_head[impl], head_to_head[impl + "+lse"]
                        rows.append(dict(impl=impl + "+lse", **{"pass": "fwd"}, **base, ms=ms_lse,
                                         tflops=flops(batch, heads, seqlen, seqlen, d, causal, False) / ms_lse / 1e9))
                    else:
                        ms = do_bench(ours.forward, warmup=25, rep=REP_MS, return_mode="median")
                    rows.append(dict(impl=impl, **{"pass": "fwd"}, **base, ms=ms,
                                     tflops=flops(batch, heads, seqlen, seqlen, d, causal, False) / ms / 1e9,
                                     max_abs_diff=diff))
                if "bwd" in passes:
                    ours.prepare_backward(dout)
                    ms = do_bench(ours.backward, warmup=25, rep=REP_MS, return_mode="median")
                    qq, kk, vv = (x.detach().clone().requires_grad_() for x in (q, k, v))
                    torch_fwd(SDPBackend.FLASH_ATTENTION, qq, kk, vv, causal).backward(dout)
                    gdiff = max((a.float() - b.grad.float()).abs().max().item()
                                for a, b in ((ours.dq, qq), (ours.dk, kk), (ours.dv, vv)))
                    rows.append(dict(impl=impl, **{"pass": "bwd"}, **base, ms=ms,
                                     tflops=flops(batch, heads, seqlen, seqlen, d, causal, True) / ms / 1e9,
                                     max_abs_diff=gdiff))
            else:
                backend = TORCH_BACKENDS[impl]
                if "fwd" in passes:
                    with torch.no_grad():
                        out = torch_fwd(backend, q, k, v, causal)
                        diff = (out.float() - ref).abs().max().item()
                        ms = head_to_head[impl] if impl in head_to_head else do_bench(
                            lambda: torch_fwd(backend, q, k, v, causal), warmup=25, rep=REP_MS, return_mode="median")
                    rows.append(dict(impl=impl, **{"pass": "fwd"}, **base, ms=ms,
                                     tflops=flops(batch, heads, seqlen, seqlen, d, causal, False) / ms / 1e9,
                                     max_abs_diff=diff))
                if "bwd" in passes:
                    qq, kk, vv = (x.detach().clone().requires_grad_() for x in (q, k, v))
                    out = torch_fwd(backend, qq, kk, vv, causal)
                    ms = do_bench(lambda: out.backward(dout, retain_graph=True), warmup=25, rep=REP_MS,
                                  grad_to_none=[qq, kk, vv], return_mode="median")
                    rows.append(dict(impl=impl, **{"pass": "bwd"}, **base, ms=ms,
                                     tflops=flops(batch, heads, seqlen, seqlen, d, causal, True) / ms / 1e9))
        except Exception as e:  # an impl that lacks this shape: say so, keep going
            print(f"  {impl} d={d} s={seqlen} causal={causal}: {type(e).__name__}: {e}", file=sys.stderr)
        torch.cuda.empty_cache()
    return rows


def classic(lib, device, date):
    """The seeds' comparison: batch 32, seqlen 512, 16 heads, d 64, causal, fp16; time and peak extra memory."""
    rows = []
    b, s, h, d = 32, 512, 16, 64
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.float16, generator=gen) for _ in range(3))
    base = dict(dtype="fp16", batch=b, heads=h, seqlen_q=s, seqlen_k=s, head_dim=d, causal=True, device=device,
                date=date, problem="classic")
    cases = [("cuda-standard", None), ("flashattn-sm80", None), ("flashattn-sm90", None)]
    cases += [(name, backend) for name, backend in TORCH_BACKENDS.items()]
    for impl, backend in cases:
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            if backend is None:
                ours = Ours(lib, impl, q, k, v, True)  # allocates o, lse and the workspace; times o alone
                fn = ours.forward
            else:
                fn = lambda: torch_fwd(backend, q, k, v, True)  # noqa: E731
            with torch.no_grad():
                fn()
                torch.cuda.synchronize()
                peak = torch.cuda.max_memory_allocated() - before
                ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
            rows.append(dict(impl=impl, **{"pass": "fwd"}, **base, ms=ms,
                             tflops=flops(b, h, s, s, d, True, False) / ms / 1e9, peak_extra_mb=peak / 2**20))
        except Exception as e:
            print(f"  classic {impl}: {type(e).__name__}: {e}", file=sys.stderr)
    return rows


# Decode problems: (query heads, kv heads, [(batch, cache length)]). 16 heads without GQA, and ANCHORS.md's
# decode table (32 query heads over 8 kv heads).
DECODE_SETS = [(16, 16, [(b, sk) for b in (1, 4, 16) for sk in (4096, 16384, 65536)]),
               (32, 8, [(1, 32768), (1, 131072), (8, 16384), (32, 8192)])]


def paged_cache(k, v, page, gen):
    """k, v (batch, seqlen_k, heads_kv, d) as a paged KV cache: pools of pages of `page` rows in a random
    order, the table (batch, ceil(seqlen_k / page)) int32, and the fa_params fields that describe them."""
    b, sk, hk, d = k.shape
    per_seq = -(-sk // page)  # the last page of a sequence partly used when page does not divide sk
    order = torch.randperm(b * per_seq, device=k.device, generator=gen)
    table = order.view(b, per_seq).to(torch.int32).contiguous()
    pools = []
    for x in (k, v):
        pool = torch.zeros(b * per_seq, page, hk, d, device=x.device, dtype=x.dtype)
        whole = torch.zeros(b, per_seq * page, hk, d, device=x.device, dtype=x.dtype)
        whole[:, :sk] = x
        pool[order] = whole.reshape(b * per_seq, page, hk, d)
        pools.append(pool)
    fields = dict(block_table=table.data_ptr(), block_table_batch_stride=per_seq, page_block_size=page,
                  num_pages=b * per_seq, seqlen_k=sk)
    return pools[0], pools[1], table, fields


DECODE_PAGE = 256  # flashattn-paged: the same cache in shuffled pages of this many rows


def decode(lib, impls, device, date):
    """One query row against a long key/value cache (inference decode), head_dim 128, bf16: the case where
    batch x heads x q-blocks cannot fill the GPU and the keys must be split. The figure of merit is the
    bandwidth of reading K and V once (GB/s); flashattn-auto is the library's own choice, flashattn-paged
    the same on the cache paged (DECODE_PAGE). The reference is the math backend on K, V repeated to
    every query head."""
    rows = []
    d = 128
    for heads, heads_kv, shapes in DECODE_SETS:
        for batch, sk in shapes:
            gen = torch.Generator(device="cuda").manual_seed(batch * 7 + sk + heads_kv)
            q = torch.randn(batch, 1, heads, d, device="cuda", dtype=torch.bfloat16, generator=gen)
            k, v = (torch.randn(batch, sk, heads_kv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
                    for _ in range(2))
            kv_bytes = 2 * k.numel() * k.element_size()
            base = dict(dtype="bf16", batch=batch, heads=heads, heads_kv=heads_kv, seqlen_q=1, seqlen_k=sk,
                        head_dim=d, causal=False, device=device, date=date, problem="decode")
            with torch.no_grad():
                kr, vr = (x.repeat_interleave(heads // heads_kv, 2) for x in (k, v))
                ref = torch_fwd(SDPBackend.MATH, q.float(), kr.float(), vr.float(), False)
                del kr, vr
            kp = vp = table = None
            for impl in ["flashattn-auto", "flashattn-paged"] + [i for i in impls if i != "torch-math"]:
                try:
                    if impl == "flashattn-paged":
                        kp, vp, table, fields = paged_cache(k, v, DECODE_PAGE, gen)
                        ours = Ours(lib, "auto", q, kp, vp, False, **fields)
                        fn = ours.forward
                    elif impl.startswith("flashattn"):
                        ours = Ours(lib, "auto" if impl == "flashattn-auto" else impl, q, k, v, False)
                        fn = ours.forward
                    else:
                        backend = TORCH_BACKENDS[impl]
                        fn = lambda: torch_fwd(backend, q, k, v, False)  # noqa: E731
                    with torch.no_grad():
                        diff = (fn().float() - ref).abs().max().item()
                        ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
                    rows.append(dict(impl=impl, **{"pass": "fwd"}, **base, ms=ms,
                                     tflops=flops(batch, heads, 1, sk, d, False, False) / ms / 1e9,
                                     gbps=kv_bytes / ms / 1e6, max_abs_diff=diff))
                except Exception as e:
                    print(f"  decode {impl} h={heads}:{heads_kv} b={batch} sk={sk}: {type(e).__name__}: {e}",
                          file=sys.stderr)
            print(f"decode h={heads}:{heads_kv} b={batch} sk={sk}: " + " ".join(
                f"{r['impl']}={r['gbps']:.0f}GB/s" for r in rows
                if (r["heads"], r["heads_kv"], r["batch"], r["seqlen_k"]) == (heads, heads_kv, batch, sk)), flush=True)
            del q, k, v, ref, kp, vp, table
            torch.cuda.empty_cache()
    return rows


def ceiling(device, date, when):
    """The card's matrix-product ceiling as ANCHORS.md measures it (cuBLAS bf16 8192^3): the same
    chip model read 671-794 TFLOP/s in our runs, from card to card and as a card heats (its power
    limit)."""
    n = 8192
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    ms = do_bench(lambda: torch.matmul(a, b), warmup=25, rep=200, return_mode="median")
    return [dict(problem="ceiling", when=when, impl="cublas-matmul", **{"pass": "gemm"}, dtype="bf16", m=n, n=n, k=n,
                 ms=ms, tflops=2.0 * n**3 / ms / 1e9, device=device, date=date)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default="build/libflashattn.so")
    ap.add_argument("--out", default="bench/results/h100.json")
    ap.add_argument("--quick", action="store_true", help="seqlen 2k and 16k only")
    ap.add_argument("--impls", default="flashattn-sm90,flashattn-sm80,torch-flash,torch-efficient,torch-cudnn,torch-math")
    ap.add_argument("--head-dims", default="64,128,256", help="subset of the sweep's head dims")
    ap.add_argument("--passes", default="fwd,bwd", help="subset of the passes (d256 is forward only)")
    ap.add_argument("--decode-only", action="store_true", help="only the decode problems")
    args = ap.parse_args()
    lib = fa.load(args.lib)
    device = torch.cuda.get_device_name()
    date = datetime.date.today().isoformat()
    impls = args.impls.split(",")
    if args.decode_only:
        rows = decode(lib, impls, device, date)
        with open(args.out, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        print(f"wrote {len(rows)} rows to {args.out}")
        return
    seqlens = [2048, 16384] if args.quick else [512, 1024, 2048, 4096, 8192, 16384]
    rows = ceiling(device, date, "before") + classic(lib, device, date) + decode(lib, impls, device, date)
    dims = [int(x) for x in args.head_dims.split(",")]
    for d, heads, passes in ((64, 32, "fwd,bwd"), (128, 16, "fwd,bwd"), (256, 8, "fwd")):
        passes = ",".join(x for x in passes.split(",") if x in args.passes.split(","))
        if d not in dims or not passes:
            continue
        for causal in (False, True):
            for s in seqlens:
                rows += bench_case(lib, impls, 16384 // s, heads, s, d, causal, passes, device, date)
                last = [r for r in rows if r.get("seqlen_q") == s and r.get("head_dim") == d and r.get("causal") == causal]
                print(" ".join(f"{r['impl']}/{r['pass']}={r['tflops']:.0f}" for r in last), flush=True)
    rows += ceiling(device, date, "after")
    print(" ".join(f"ceiling ({r['when']}) {r['tflops']:.0f}" for r in rows if r.get("problem") == "ceiling"))
    with open(args.out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"wrote {len(rows)} rows to {args.out}")


if __name__ == "__main__":
    main()
