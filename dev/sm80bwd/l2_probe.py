"""Probe of the session-8 puzzle: flashattn-sm80's backward at head_dim 128, 16k, non-causal reads
~310 TFLOP/s alone but ~270 after the sweep's head_dim 64 cases (5 implementations, fwd + bwd).
Times that case fresh, after the head_dim 64 cases, then after each reset of process state that
could explain it: the persisting-L2 lines and limit, torch's cached blocks, fresh tensors.

usage: python3 dev/sm80bwd/l2_probe.py --lib build/libflashattn.so
"""
import argparse
import ctypes
import os
import subprocess
import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import fa_ctypes as fa  # noqa: E402
import gpu_bench as gb  # noqa: E402


def smi():
    q = "clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"
    return subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True,
                          text=True).stdout.strip()


def cudart():
    for name in ("libcudart.so", "libcudart.so.12", "/usr/local/cuda/lib64/libcudart.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            pass
    return None


def persisting_limit(rt):
    v = ctypes.c_size_t(0)
    rc = rt.cudaDeviceGetLimit(ctypes.byref(v), 0x06)  # cudaLimitPersistingL2CacheSize
    return f"rc={rc} limit={v.value}"


class Case:
    def __init__(self, lib, impl, d=128, s=16384):
        heads, batch = 2048 // d, 16384 // s
        gen = torch.Generator(device="cuda").manual_seed(7)
        shape = (batch, s, heads, d)
        self.q, self.k, self.v, self.dout = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
                                             for _ in range(4))
        self.ours = gb.Ours(lib, impl, self.q, self.k, self.v, False)
        self.ours.prepare_backward(self.dout)
        self.flops = gb.flops(batch, heads, s, s, d, False, True)

    def tflops(self):
        ms = do_bench(self.ours.backward, warmup=25, rep=100, return_mode="median")
        return self.flops / ms / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="build/libflashattn.so")
    args = ap.parse_args()
    lib = fa.load(args.lib)
    rt = cudart()
    print("device:", torch.cuda.get_device_name(), "| cudart:", rt)

    def measure(label, case=None):
        case = case or Case(lib, "flashattn-sm80")
        r = [case.tflops() for _ in range(2)]
        extra = f" | persisting L2 {persisting_limit(rt)}" if rt else ""
        print(f"{label:<44} sm80 bwd d128 16k: {r[0]:.0f} {r[1]:.0f}  | {smi()}{extra}", flush=True)
        return case

    measure("fresh process")
    impls = ["flashattn-sm90", "flashattn-sm80", "torch-flash", "torch-efficient", "torch-cudnn"]
    for causal in (False, True):
        for s in (512, 1024, 2048, 4096, 8192, 16384):
            gb.bench_case(lib, impls, 16384 // s, 32, s, 64, causal, "fwd,bwd", "probe", "probe")
    case = measure("after the d64 cases (5 impls, fwd+bwd)")
    measure("same tensors again", case)
    if rt:
        print("cudaCtxResetPersistingL2Cache rc =", rt.cudaCtxResetPersistingL2Cache())
        measure("after cudaCtxResetPersistingL2Cache", case)
        print("cudaDeviceSetLimit(persisting, 0) rc =", rt.cudaDeviceSetLimit(0x06, ctypes.c_size_t(0)))
        measure("after persisting limit 0", case)
    del case
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    measure("after empty_cache, fresh tensors")
    # torch's flash backward the same way, for the ratio
    gen = torch.Generator(device="cuda").manual_seed(7)
    q, k, v = (torch.randn(1, 16384, 16, 128, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
               for _ in range(3))
    dout = torch.randn_like(q)
    out = gb.torch_fwd(gb.SDPBackend.FLASH_ATTENTION, q, k, v, False)
    ms = do_bench(lambda: out.backward(dout, retain_graph=True), warmup=25, rep=100, grad_to_none=[q, k, v],
                  return_mode="median")
    print(f"torch flash bwd d128 16k: {gb.flops(1, 16, 16384, 16384, 128, False, True) / ms / 1e9:.0f}")


if __name__ == "__main__":
    main()
