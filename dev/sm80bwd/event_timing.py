"""Median CUDA-event time of a call (ms), after 3 warm-up calls; `before`, if given, runs ahead of each
timed call, outside the timed span (e.g. a memset that flushes the L2). Used by waves.py, bench_modes.py,
dev/sm90/fwd_ab.py and fwd_waves.py.

The n calls are queued back to back and synchronized once, as triton's do_bench (the library benchmark)
does: the host's time to issue a call hides behind the GPU's work on the calls before it. Until session 57
this synchronized after every call, so a call whose host side is slow (torch's autograd backward: cuDNN's
SDPA backward read 0.75x of do_bench's rate at head_dim 128, 512 keys, dev/sm90/timing_check.py) was charged
for the GPU idling while the host issued it, beyond what the flush before it covers."""
import torch


def median_ms(fn, n=20, before=None):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for a, b in events:
        if before:
            before()
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return sorted(a.elapsed_time(b) for a, b in events)[n // 2]
