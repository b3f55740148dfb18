"""Times PyTorch's flash backward (scaled_dot_product_attention, FLASH_ATTENTION backend) on the
standard sweep, the same shapes and FLOP count as `bwd_dev bench`, for a side-by-side ratio."""
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

print(f"device: {torch.cuda.get_device_name()} torch {torch.__version__}")
print(f"{'hdim':<6} {'heads':<5} {'batch':<6} {'seqlen':<6} {'causal':<6} {'ms':<9} {'TFLOP/s':<10}")
for d in (64, 128):
    for causal in (0, 1):
        for s in (512, 1024, 2048, 4096, 8192, 16384):
            h, b = 2048 // d, 16384 // s
            q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
            dout = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
            times = []
            for rep in range(13):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
                e1.record()
                torch.cuda.synchronize()
                if rep >= 3:
                    times.append(e0.elapsed_time(e1))
            ms = sorted(times)[len(times) // 2]
            flops = 2.5 * 4 * b * h * s * s * d * (0.5 if causal else 1.0)
            print(f"{d:<6} {h:<5} {b:<6} {s:<6} {causal:<6} {ms:<9.3f} {flops / ms / 1e9:<10.1f}")
            del q, k, v, dout, out
