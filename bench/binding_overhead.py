"""The PyTorch binding's overhead over the raw C ABI call, in microseconds.

    python bench/binding_overhead.py [--device cpu|cuda] [--dtype ...] [--reps N]

Three problems: the classic small one (batch 32, seqlen 512, 16 heads, head_dim 64, causal), and
two tiny ones (batch 1, seqlen 16 or 128, 1 head, head_dim 64) where the kernel takes microseconds,
so the difference is the binding's own cost. For each:
  raw        fa_forward / fa_backward through ctypes on a prebuilt fa_params, outputs allocated
             once (what a C++ caller that reuses its buffers pays);
  raw_alloc  the same call with fresh output tensors (torch.empty) each time, as any API that
             returns new tensors must do (on the CPU, fresh large buffers are fresh pages: the
             kernel then pays their first-touch faults);
  binding    flashattn_torch.flash_attn_func (fresh outputs, fa_params filled from the tensors,
             the autograd bookkeeping, and for forward_backward torch.autograd.grad).
overhead_us = binding - raw; glue_us = binding - raw_alloc is the binding's Python cost. The
variants alternate call by call, so drift on a busy machine hits all alike; each time is a
median over --reps calls. CUDA calls are timed to completion (synchronize after each call), and also pipelined
(N calls back to back, one synchronize) where the binding's host time hides behind the kernels.
Prints one JSON object (bench/results/ keeps the ones that were run, with the machine).
"""

import argparse
import ctypes
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bindings" / "torch"))
import flashattn_torch  # noqa: E402
from flashattn_torch import _lib, ops  # noqa: E402

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def raw_params(q, k, v, out, lse, dout=None, dq=None, dk=None, dv=None):
    """fa_params for the raw calls, filled once (as a C++ caller would)."""
    p = ops._params(q, k, None, None, 0, 0, q.shape[-1] ** -0.5, True, -1, -1, 0.0, False)
    for name, t in (("q", q), ("k", k), ("v", v), ("o", out), ("dout", dout), ("dq", dq), ("dk", dk), ("dv", dv)):
        if t is not None:
            ops._set_tensor(p, name, t)
    p.lse = lse.data_ptr()
    return p


def with_workspace(p, device, backward, keep):
    if device.type == "cuda":
        n = _lib.workspace_size(p, _lib.impl, backward)
        if n:
            keep.append(torch.empty(n, dtype=torch.uint8, device=device))
            p.workspace, p.workspace_bytes = keep[-1].data_ptr(), n
    return p


def timed(fn, sync):
    t0 = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - t0) * 1e6


def measure(fns, reps, sync):
    """Median microseconds of each fn, the fns interleaved call by call."""
    for fn in fns.values():  # warm-up (allocator, dispatcher caches, CUDA module load)
        for _ in range(3):
            fn()
    sync()
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            times[name].append(timed(fn, sync))
    return {name: statistics.median(t) for name, t in times.items()}


def pipelined(fn, calls, sync):
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - t0) * 1e6 / calls


def bench_problem(batch, seqlen, heads, head_dim, dtype, device, reps, threads):
    torch.set_num_threads(threads)  # the CPU backend uses torch's thread count, in both paths
    shape = (batch, seqlen, heads, head_dim)
    q, k, v, dout = (torch.randn(shape, dtype=dtype, device=device) for _ in range(4))
    out, dq, dk, dv = (torch.empty(shape, dtype=dtype, device=device) for _ in range(4))
    lse = torch.empty(batch, heads, seqlen, dtype=torch.float32, device=device)
    keep = []
    p_fwd = with_workspace(raw_params(q, k, v, out, lse), device, False, keep)
    p_bwd = with_workspace(raw_params(q, k, v, out, lse, dout, dq, dk, dv), device, True, keep)
    _lib.check(_lib.lib.fa_forward(ctypes.byref(p_fwd), _lib.impl))  # out and lse for the raw backward
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    # Private copies for raw_alloc, whose output pointers change every call.
    a_fwd, a_bwd = type(p_fwd).from_buffer_copy(p_fwd), type(p_bwd).from_buffer_copy(p_bwd)

    def raw_forward():
        _lib.lib.fa_forward(ctypes.byref(p_fwd), _lib.impl)

    def raw_forward_backward():
        _lib.lib.fa_forward(ctypes.byref(p_fwd), _lib.impl)
        _lib.lib.fa_backward(ctypes.byref(p_bwd), _lib.impl)

    def alloc_forward():
        o, l = torch.empty(shape, dtype=dtype, device=device), torch.empty(lse.shape, device=device)
        ops._set_tensor(a_fwd, "o", o)
        a_fwd.lse = l.data_ptr()
        _lib.lib.fa_forward(ctypes.byref(a_fwd), _lib.impl)
        return o, l

    def alloc_forward_backward():
        o, l = alloc_forward()
        grads = [torch.empty(shape, dtype=dtype, device=device) for _ in range(3)]
        ops._set_tensor(a_bwd, "o", o)
        a_bwd.lse = l.data_ptr()
        for name, g in zip(("dq", "dk", "dv"), grads):
            ops._set_tensor(a_bwd, name, g)
        _lib.lib.fa_backward(ctypes.byref(a_bwd), _lib.impl)

    def binding_forward():
        flashattn_torch.flash_attn_func(q, k, v, causal=True)

    def binding_forward_backward():
        o = flashattn_torch.flash_attn_func(qg, kg, vg, causal=True)
        torch.autograd.grad(o, (qg, kg, vg), dout)

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    result = {"problem": {"batch": batch, "seqlen": seqlen, "heads": heads, "head_dim": head_dim, "causal": True,
                          "dtype": str(dtype).split(".")[-1]}, "reps": reps}
    if device.type == "cpu":
        result["cpu_threads"] = threads
    for label, raw, alloc, binding in (("forward", raw_forward, alloc_forward, binding_forward),
                                       ("forward_backward", raw_forward_backward, alloc_forward_backward,
                                        binding_forward_backward)):
        t = measure({"raw": raw, "raw_alloc": alloc, "binding": binding}, reps, sync)
        entry = {"raw_us": round(t["raw"], 1), "raw_alloc_us": round(t["raw_alloc"], 1),
                 "binding_us": round(t["binding"], 1), "overhead_us": round(t["binding"] - t["raw"], 1),
                 "glue_us": round(t["binding"] - t["raw_alloc"], 1)}
        if device.type == "cuda":
            calls = max(10, reps)
            raw_p, bind_p = pipelined(raw, calls, sync), pipelined(binding, calls, sync)
            entry.update({"pipelined_raw_us": round(raw_p, 1), "pipelined_binding_us": round(bind_p, 1),
                          "pipelined_overhead_us": round(bind_p - raw_p, 1)})
        result[label] = entry
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=list(DTYPES), default=None,
                        help="default: float16 on CUDA (the classic problem's), float32 on the CPU")
    parser.add_argument("--reps", type=int, default=None, help="default: 50 on CUDA, 5 (classic) / 200 (tiny) on the CPU")
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype or ("float16" if device.type == "cuda" else "float32")]
    cuda = device.type == "cuda"
    # The tiny problems run the CPU backend on one thread: on a shared machine the wake-up of a
    # second OpenMP thread can take milliseconds, which would swamp the microseconds measured.
    all_threads = torch.get_num_threads()
    problems = [("classic", (32, 512, 16, 64), args.reps or (50 if cuda else 5), all_threads),
                ("tiny_seqlen_16", (1, 16, 1, 64), args.reps or 200, 1),
                ("tiny_seqlen_128", (1, 128, 1, 64), args.reps or 200, 1)]
    report = {
        "device": torch.cuda.get_device_name(device) if cuda else f"CPU ({platform.processor() or platform.machine()}, "
                                                                  f"{os.cpu_count()} cores)",
        "torch": torch.__version__, "library": flashattn_torch.library_path, "impl": os.environ.get("FLASHATTN_IMPL", "auto"),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_average_1min": round(os.getloadavg()[0], 2),  # other programs on the machine skew CPU times
    }
    for name, (b, s, h, d), reps, threads in problems:
        report[name] = bench_problem(b, s, h, d, dtype, device, reps, threads)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
