"""Decode (one query row, long K/V) through the sm80 split-KV forward at forced split counts, beside
the heuristic's (num_splits 0) and cuDNN: GB/s of K and V read. usage: python3 decode_splits.py LIB"""
import ctypes
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../bench"))
import fa_ctypes as fa  # noqa: E402

lib = fa.load(sys.argv[1])
heads, d = 16, 128
for batch, sk in ((1, 4096), (1, 16384), (1, 65536), (4, 16384), (16, 16384)):
    q = torch.randn(batch, 1, heads, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(batch, sk, heads, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    o = torch.empty_like(q)
    lse = torch.empty(batch, heads, 1, device="cuda", dtype=torch.float32)
    gb = 2 * k.numel() * 2 / 1e9
    line = []
    for splits in (0, 1, 4, 8, 16, 32, 64, 128):
        p = fa.params_from(torch, q, k, v, o, lse, False, num_splits=splits)
        n = ctypes.c_size_t(0)
        fa.check(lib, lib.fa_workspace_size(ctypes.byref(p), fa.IMPL["flashattn-sm80"], 0, ctypes.byref(n)), "ws")
        ws = torch.empty(max(n.value, 1), dtype=torch.uint8, device="cuda")
        p.workspace, p.workspace_bytes = ws.data_ptr(), ws.numel()
        fn = lambda: fa.check(lib, lib.fa_forward(ctypes.byref(p), fa.IMPL["flashattn-sm80"]), "fwd")  # noqa: E731
        ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
        line.append(f"s{splits}={gb / ms * 1e3:.0f}")
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        ms = do_bench(lambda: F.scaled_dot_product_attention(qt, kt, vt), warmup=25, rep=100, return_mode="median")
    print(f"b{batch} sk{sk}: " + " ".join(line) + f" cudnn={gb / ms * 1e3:.0f} GB/s", flush=True)
