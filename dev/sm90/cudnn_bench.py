"""cuDNN attention (torch SDPA, CUDNN_ATTENTION backend) on the standard sweep, in the same run as
the sm90 harness: bf16, 16k tokens, hidden 2048 (8 heads at head_dim 256), q/k/v (b, s, h, d) as
the harness lays them out, seen as (b, h, s, d). Median of 15 CUDA-event timings of 5 calls each, TFLOP/s as the
harness counts them, timed as the harness times. Usage: python3 dev/sm90/cudnn_bench.py  (BENCH_HDIMS / BENCH_SEQLENS as the
harness)."""
import os

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F


def listed(env, x):
    v = os.environ.get(env, "")
    return not v or str(x) in v.split(",")


def timed_ms(run):
    """As the harness: ~200 ms of calls first (clocks at their loaded level whatever ran before),
    then the median of 15 x 5 calls back to back."""
    w0, w1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    w0.record()
    run()
    w1.record()
    torch.cuda.synchronize()
    for _ in range(max(3, int(200 / max(w0.elapsed_time(w1), 1e-3)))):
        run()
    ts = []
    for _ in range(15):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(5):
            run()
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) / 5)
    return sorted(ts)[len(ts) // 2]


def ceiling():
    """The card's matrix-product ceiling (ANCHORS.md's: cuBLAS bf16 8192^3), timed the same way."""
    n = 8192
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    ms = timed_ms(lambda: torch.matmul(a, b))
    print(f"{'cublas':<10} {'-':>5} {n:>6} {1:>4} {0:>3} {'-':>7} {ms:>10.4f} {2.0 * n**3 / ms / 1e9:>8.1f}", flush=True)


def main():
    print(f"{'variant':<10} {'hdim':>5} {'seqlen':>6} {'bat':>4} {'cau':>3} {'heads':>7} {'ms':>10} {'TFLOP/s':>8}")
    for d in (64, 128, 256):
        for causal in (0, 1):
            for seqlen in (512, 1024, 2048, 4096, 8192, 16384):
                if not listed("BENCH_HDIMS", d) or not listed("BENCH_SEQLENS", seqlen):
                    continue
                b, h = 16384 // seqlen, 8 if d == 256 else 2048 // d
                q, k, v = (torch.randn(b, seqlen, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
                           for _ in range(3))
                try:
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        ms = timed_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal)))
                except RuntimeError as e:
                    print(f"cudnn d={d} seqlen={seqlen} causal={causal}: {str(e).splitlines()[0]}", flush=True)
                    continue
                flops = 4.0 * b * h * seqlen * seqlen * d / (2 if causal else 1)
                print(f"{'cudnn':<10} {d:>5} {seqlen:>6} {b:>4} {causal:>3} {h:>7} {ms:>10.4f} {flops / ms / 1e9:>8.1f}",
                      flush=True)


if __name__ == "__main__":
    ceiling()
    main()
    ceiling()
