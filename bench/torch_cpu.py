#!/usr/bin/env python3
"""torch.nn.functional.scaled_dot_product_attention on CPU fp32 tensors, the side-by-side for
bench/cpu_bench: batch 1, 16 heads, seqlen 2048, head_dim 64, non-causal and causal, with
torch.set_num_threads(T). Prints a table and one JSON line per measurement (median of reps).

    python3 bench/torch_cpu.py [--threads 2 16] [--seqlen 2048] [--reps 10] [--json FILE]
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, nargs="+", default=[2, 16])
    ap.add_argument("--seqlen", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", default="")
    args = ap.parse_args()

    b, h, s, d = 1, args.heads, args.seqlen, args.head_dim
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, dtype=torch.float32) for _ in range(3))
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for causal in (False, True):
            flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # warm-up
                times = []
                for _ in range(args.reps):
                    t0 = time.perf_counter()
                    F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    times.append(time.perf_counter() - t0)
            med = statistics.median(times)
            row = {"impl": "torch_sdpa_cpu", "torch": torch.__version__, "threads": threads, "causal": causal,
                   "batch": b, "heads": h, "seqlen": s, "head_dim": d, "dtype": "fp32",
                   "median_ms": med * 1e3, "best_ms": min(times) * 1e3, "gflops": flops / med * 1e-9}
            rows.append(row)
            print(f"torch sdpa cpu  threads {threads:2d}  causal {int(causal)}  {med * 1e3:9.2f} ms  "
                  f"{row['gflops']:8.1f} GFLOP/s")
            print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
