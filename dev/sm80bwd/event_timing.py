"""Median CUDA-event time of a call (ms), after 3 warm-up calls; `before`, if given, runs ahead of each
timed call, outside the timed span (e.g. a memset that flushes the L2). Used by waves.py and
bench_modes.py."""
import torch


def median_ms(fn, n=20, before=None):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(n):
        if before:
            before()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[n // 2]
