"""Plain attention in PyTorch and the anchor suite's error rule, for the binding's tests.

plain_attention computes standard attention (materialized S and P) in the dtype of its inputs:
run on fp64 copies it is the reference, run in the input dtype it is the "plain implementation"
whose error sets the bound:
    max|out - ref| <= factor * max|plain - ref| + atol     (factor 2 forward, 3 gradients)
with atol the dtype's rounding at the magnitude of ref (2 * max|(r + 0.3) - 0.3 - r| in the dtype).
"""

import math

import pytest
import torch

import flashattn_torch

CUDA = torch.cuda.is_available() and flashattn_torch.cuda_available()
DEVICES = ["cpu"] + (["cuda"] if CUDA else [])
NO_CUDA = "needs a CUDA GPU and a library built with CUDA (this machine: CPU only)"


def skip_unsupported(device, dtype):
    if device == "cuda" and dtype == torch.float32:
        pytest.skip("the CUDA kernels take fp16/bf16 (as flash_attn); fp32 runs on the CPU backend")


def visible(seqlen_q, seqlen_k, causal, window_left, window_right, device):
    """(seqlen_q, seqlen_k) bool: key j visible from row i (bottom-right aligned, as the C header)."""
    i = torch.arange(seqlen_q, device=device)[:, None] + (seqlen_k - seqlen_q)
    j = torch.arange(seqlen_k, device=device)[None, :]
    mask = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if causal:
        mask &= j <= i
    if window_left >= 0:
        mask &= j >= i - window_left
    if window_right >= 0:
        mask &= j <= i + window_right
    return mask


def plain_attention(q, k, v, softmax_scale=None, causal=False, window=(-1, -1), softcap=0.0):
    """q (b, s_q, h, d), k/v (b, s_k, h_k, d) -> (out like q, lse (b, h, s_q) fp32 or fp64).
    Rows with no visible key give out 0 and lse -inf."""
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    k = k.repeat_interleave(h // hk, dim=2)
    v = v.repeat_interleave(h // hk, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", q, k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    mask = visible(sq, sk, causal, window[0], window[1], q.device)
    s = torch.where(mask, s, float("-inf"))
    lse = torch.logsumexp(s.to(torch.float64 if s.dtype == torch.float64 else torch.float32), dim=-1)
    p = torch.softmax(s, dim=-1)
    p = torch.where(mask.any(-1, keepdim=True), p, 0.0)
    out = torch.einsum("bhij,bjhd->bihd", p, v)
    return out, lse


def plain_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, **kw):
    """Packed q (total_q, h, d), k/v (total_k, h_k, d) -> (out like q, lse (h, total_q))."""
    outs, lses = [], []
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(cq) - 1):
        o, lse = plain_attention(q[None, cq[b]:cq[b + 1]], k[None, ck[b]:ck[b + 1]], v[None, ck[b]:ck[b + 1]], **kw)
        outs.append(o[0])
        lses.append(lse[0])
    return torch.cat(outs, 0), torch.cat(lses, 1)


def rounding_atol(ref, dtype):
    r = ref.to(dtype)
    y = ((r + 0.3).to(dtype) - 0.3).to(dtype)
    return 2 * (y.double() - r.double()).abs().max().item() if r.numel() else 0.0


def check_rule(what, out, ref, plain, factor, dtype):
    """Asserts the anchor rule; names the worst element and the numbers when it fails."""
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    out, ref, plain = out.detach().double().cpu(), ref.detach().double().cpu(), plain.detach().double().cpu()
    assert not out.isnan().any(), f"{what}: {int(out.isnan().sum())} NaN elements (not written, or computed as NaN)"
    # -inf (fully masked lse rows) must match exactly; compare the finite rest.
    inf = torch.isinf(ref)
    assert torch.equal(torch.isinf(out), inf) and torch.equal(out[inf], ref[inf]), f"{what}: infinities differ"
    out, ref, plain = out[~inf], ref[~inf], plain[~inf]
    if ref.numel() == 0:
        return
    err = (out - ref).abs()
    plain_err = (plain - ref).abs().max().item()
    atol = rounding_atol(ref, dtype)
    bound = factor * plain_err + atol
    worst = int(err.argmax())
    assert err[worst].item() <= bound, (
        f"{what}: max|out - ref| = {err[worst].item():.3g} (out {out[worst].item():.6g}, ref {ref[worst].item():.6g}) "
        f"exceeds {bound:.3g} = {factor} x plain error {plain_err:.3g} + atol {atol:.3g}")
