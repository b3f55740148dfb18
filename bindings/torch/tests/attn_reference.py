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


def alibi_bias(alibi_slopes, batch, heads, seqlen_q, seqlen_k, device):
    """(batch, heads, seqlen_q, seqlen_k) fp64: -slope * |i + seqlen_k - seqlen_q - j|, as flash_attn's ALiBi;
    alibi_slopes (heads,) or (batch, heads)."""
    i = torch.arange(seqlen_q, device=device)[:, None] + (seqlen_k - seqlen_q)
    j = torch.arange(seqlen_k, device=device)[None, :]
    slopes = alibi_slopes.double().expand(batch, heads)
    return -slopes[:, :, None, None] * (i - j).abs().double()


def _philox4x32_10(c, k0, k1):
    """Philox4x32-10 (Salmon et al., SC 2011) on int64 tensors holding uint32 values: c a list of 4 counters."""
    m32 = 0xFFFFFFFF
    x, y, z, w = c
    for _ in range(10):
        p0, p1 = x * 0xD2511F53, z * 0xCD9E8D57  # < 2^64: wraps in int64, the low 64 bits stay exact
        hi0, lo0, hi1, lo1 = (p0 >> 32) & m32, p0 & m32, (p1 >> 32) & m32, p1 & m32
        x, y, z, w = hi1 ^ y ^ k0, lo1, hi0 ^ w ^ k1, lo0
        k0, k1 = (k0 + 0x9E3779B9) & m32, (k1 + 0xBB67AE85) & m32
    return x, y, z, w


def dropout_factors(batch, heads, seqlen_q, seqlen_k, dropout_p, seed, offset=0):
    """(batch, heads, seqlen_q, seqlen_k) fp64 Z of the library's dropout (src/common/dropout.hpp, written apart
    from it here): 0 where dropped, else 65536 / (65536 - t), t = round(p 65536); key j of row i of (b, h) keeps iff
    16-bit number e = j % 2 + 2 (i % 16 / 8) + 4 (j % 16 / 8) of Philox((j / 16, 32 (i / 16) + 4 (i % 8) + j % 8 / 2,
    b heads + h, offset), (seed, seed >> 32 ^ offset >> 32)) is >= t."""
    t = min(int(dropout_p * 65536 + 0.5), 65535)
    bh = torch.arange(batch * heads, dtype=torch.int64)[:, None, None]
    i = torch.arange(seqlen_q, dtype=torch.int64)[None, :, None]
    j = torch.arange(seqlen_k, dtype=torch.int64)[None, None, :]
    shape = (batch * heads, seqlen_q, seqlen_k)
    lane = 4 * (i % 8) + (j % 8) // 2
    c = [(j // 16).expand(shape), (32 * (i // 16) + lane).expand(shape), bh.expand(shape),
         torch.full(shape, offset & 0xFFFFFFFF)]
    words = _philox4x32_10(c, seed & 0xFFFFFFFF, ((seed >> 32) ^ (offset >> 32)) & 0xFFFFFFFF)
    e = (j % 2 + 2 * ((i % 16) // 8) + 4 * ((j % 16) // 8)).expand(shape)
    word = torch.where(e // 2 == 0, words[0], torch.where(e // 2 == 1, words[1], torch.where(e // 2 == 2, words[2], words[3])))
    r = (word >> (16 * (e % 2))) & 0xFFFF
    return torch.where(r >= t, 65536.0 / (65536 - t), 0.0).double().reshape(batch, heads, seqlen_q, seqlen_k)


def plain_attention(q, k, v, softmax_scale=None, causal=False, window=(-1, -1), softcap=0.0, alibi_slopes=None,
                    dropout=None):
    """q (b, s_q, h, d), k/v (b, s_k, h_k, d) -> (out like q, lse (b, h, s_q) fp32 or fp64).
    Rows with no visible key give out 0 and lse -inf. alibi_slopes: its bias added after the softcap, in
    the scores' dtype. dropout: dropout_factors' Z, multiplied into P (the lse is that of P itself)."""
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    k = k.repeat_interleave(h // hk, dim=2)
    v = v.repeat_interleave(h // hk, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", q, k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if alibi_slopes is not None:
        s = s + alibi_bias(alibi_slopes, b, h, sq, sk, q.device).to(s.dtype)
    mask = visible(sq, sk, causal, window[0], window[1], q.device)
    s = torch.where(mask, s, float("-inf"))
    lse = torch.logsumexp(s.to(torch.float64 if s.dtype == torch.float64 else torch.float32), dim=-1)
    p = torch.softmax(s, dim=-1)
    p = torch.where(mask.any(-1, keepdim=True), p, 0.0)
    if dropout is not None:
        p = p * dropout.to(device=p.device, dtype=p.dtype)
    out = torch.einsum("bhij,bjhd->bihd", p, v)
    return out, lse


def _sequence_kw(kw, b):
    """The keyword arguments of sequence b of a varlen batch: per-sequence ALiBi slopes (batch, h) -> row b."""
    slopes = kw.get("alibi_slopes")
    return {**kw, "alibi_slopes": slopes[b]} if slopes is not None and slopes.dim() == 2 else kw


def plain_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, **kw):
    """Packed q (total_q, h, d), k/v (total_k, h_k, d) -> (out like q, lse (h, total_q))."""
    outs, lses = [], []
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(cq) - 1):
        o, lse = plain_attention(q[None, cq[b]:cq[b + 1]], k[None, ck[b]:ck[b + 1]], v[None, ck[b]:ck[b + 1]],
                                 **_sequence_kw(kw, b))
        outs.append(o[0])
        lses.append(lse[0])
    return torch.cat(outs, 0), torch.cat(lses, 1)


U32 = 2.0 ** -24  # fp32 unit roundoff


def _seq_sum(terms, n):
    """sum_{t < n} terms(t), added one after another in fp32 (as a plain loop does)."""
    acc = terms(0)
    for t in range(1, n):
        acc = acc + terms(t)
    return acc


def plain_sequential(q, k, v, dout, softmax_scale=None, causal=False, window=(-1, -1), softcap=0.0, alibi_slopes=None):
    """The C++ harness's plain implementation (tests/support/plain.cpp) in PyTorch: standard
    attention in the input's precision, every intermediate rounded to the dtype as eager ops store
    it, every matmul a sequential fp32 sum. Returns (out, dq, dk, dv) in the input dtype.

    This is the yardstick of the rule for every dtype. For fp16/bf16 it errs like PyTorch's own
    attention (the roundings to the dtype dominate); for fp32 a BLAS matmul's blocked sums err
    less than any fused kernel's running sums can, so this plain loop is the fair fp32 yardstick."""
    dt = q.dtype
    q, k, v, dout = (t.detach().float() for t in (q, k, v, dout))
    r = lambda x: x.to(dt).float()  # noqa: E731
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    group = h // hk
    if sq == 0 or sk == 0:  # no score: out and every gradient are 0
        return [torch.zeros_like(t).to(dt) for t in (q, q, k, v)]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    qh = q.permute(0, 2, 1, 3)                                                   # (b, h, sq, d)
    kh = k.repeat_interleave(group, dim=2).permute(0, 2, 1, 3)                   # (b, h, sk, d)
    vh = v.repeat_interleave(group, dim=2).permute(0, 2, 1, 3)
    doh = dout.permute(0, 2, 1, 3)
    s = r(_seq_sum(lambda c: qh[..., :, None, c] * kh[..., None, :, c], d) * scale)   # (b, h, sq, sk)
    th = None
    if softcap > 0:
        th = torch.tanh(s / softcap)
        s = r(softcap * th)
    if alibi_slopes is not None:  # added in fp32, as the C++ harness's plain implementation does
        s = s + alibi_bias(alibi_slopes.cpu(), b, h, sq, sk, q.device).float()
    mask = visible(sq, sk, causal, window[0], window[1], q.device)
    s = torch.where(mask, s, float("-inf"))
    m = s.amax(-1, keepdim=True)
    e = torch.where(mask, torch.exp(s - torch.where(torch.isinf(m), 0.0, m)), 0.0)
    l = _seq_sum(lambda j: e[..., j:j + 1], sk)
    p = r(torch.where(l > 0, e / l, 0.0))
    out = r(_seq_sum(lambda j: p[..., :, j:j + 1] * vh[..., j:j + 1, :], sk))
    dp = r(_seq_sum(lambda c: doh[..., :, None, c] * vh[..., None, :, c], d))
    dsum = _seq_sum(lambda j: p[..., j:j + 1] * dp[..., j:j + 1], sk)
    ds = r(p * (dp - dsum))
    if th is not None:
        ds = r(ds * (1 - th * th))
    ds = r(ds * scale)
    dq = r(_seq_sum(lambda j: ds[..., :, j:j + 1] * kh[..., j:j + 1, :], sk))
    dk_h = r(_seq_sum(lambda i: ds[..., i:i + 1, :].transpose(-1, -2) * qh[..., i:i + 1, :], sq))
    dv_h = r(_seq_sum(lambda i: p[..., i:i + 1, :].transpose(-1, -2) * doh[..., i:i + 1, :], sq))
    # The group's query heads' dK, dV summed in fp32 (the backward of the expanded k, v), rounded.
    dk = r(dk_h.unflatten(1, (hk, group)).sum(2)).permute(0, 2, 1, 3)
    dv = r(dv_h.unflatten(1, (hk, group)).sum(2)).permute(0, 2, 1, 3)
    return [t.to(dt) for t in (out.permute(0, 2, 1, 3), dq.permute(0, 2, 1, 3), dk, dv)]


def plain_sequential_varlen(q, k, v, dout, cu_seqlens_q, cu_seqlens_k, **kw):
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    parts = [plain_sequential(q[None, cq[b]:cq[b + 1]], k[None, ck[b]:ck[b + 1]], v[None, ck[b]:ck[b + 1]],
                              dout[None, cq[b]:cq[b + 1]], **_sequence_kw(kw, b)) for b in range(len(cq) - 1)]
    return [torch.cat([part[i][0] for part in parts], 0) for i in range(4)]


def gradient_floor(q, k, v, dout, softmax_scale=None, causal=False, window=(-1, -1), softcap=0.0, alibi_slopes=None,
                   dropout=None):
    """Per-element fp32 floors of (o, dq, dk, dv), as the C++ harness (tests/support/plain.cpp) has them.
    o: a flash forward computes P_ij from fp32 scores, a running max and sum and lse, each exact to
    eps_i = 4 u (|lse_i| + max_j |s_ij| + sqrt(n_i) + sqrt(d) max_j scale |q_i| . |k_j|) relative,
    so o_ic is off by up to eps_i sum_j P_ij |v_jc|.
    Gradients: a backward recomputes P, dP_ij = dO_i . V_j and D_i = dO_i . O_i in fp32, each dot
    product off by up to (d + 8) u of its |terms|, so dS_ij is off by up to (2 d + 16) u P_ij
    (|dP_ij| + |D_i|), and each gradient element by (2 d + 16) u times its sum of |terms|. dropout (Z): the same
    terms with P Z where the dropped P enters (o, dV) and dP Z for dP."""
    q, k, v, dout = (t.detach().double() for t in (q, k, v, dout))
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    ke, ve = k.repeat_interleave(h // hk, dim=2), v.repeat_interleave(h // hk, dim=2)
    raw = torch.einsum("bihd,bjhd->bhij", q, ke) * scale
    dcap = 1 - torch.tanh(raw / softcap) ** 2 if softcap > 0 else torch.ones_like(raw)
    s = softcap * torch.tanh(raw / softcap) if softcap > 0 else raw
    if alibi_slopes is not None:
        s = s + alibi_bias(alibi_slopes.to(q.device), b, h, sq, sk, q.device)
    mask = visible(sq, sk, causal, window[0], window[1], q.device)
    p = torch.where(mask.any(-1, keepdim=True), torch.softmax(torch.where(mask, s, float("-inf")), -1), 0.0)
    dp = torch.einsum("bihd,bjhd->bhij", dout, ve)
    z = dropout.to(device=q.device, dtype=torch.float64) if dropout is not None else torch.ones_like(p)
    dp = dp * z
    D = (p * dp).sum(-1, keepdim=True)
    ds_abs = p * (dp.abs() + D.abs()) * dcap * scale
    dq_abs = torch.einsum("bhij,bjhd->bihd", ds_abs, ke.abs())
    dk_abs = torch.einsum("bhij,bihd->bjhd", ds_abs, q.abs()).unflatten(2, (hk, h // hk)).sum(3)
    dv_abs = torch.einsum("bhij,bihd->bjhd", p * z, dout.abs()).unflatten(2, (hk, h // hk)).sum(3)
    c = (2 * d + 16) * U32
    def row_max(x):  # (b, h, sq, sk) -> (b, h, sq), 0 with no key
        return x.where(mask, 0.0).amax(-1) if sk > 0 else x.new_zeros(x.shape[:-1])
    dot_abs = row_max(torch.einsum("bihd,bjhd->bhij", q.abs(), ke.abs()) * abs(scale))
    s_abs = row_max(s.abs())
    lse = torch.logsumexp(torch.where(mask, s, float("-inf")), -1)
    n = mask.sum(-1).double()
    eps = 4 * U32 * (lse.abs().where(torch.isfinite(lse), 0.0) + s_abs + n.sqrt() + math.sqrt(d) * dot_abs)
    o_abs = torch.einsum("bhij,bjhd->bihd", p * z * eps[..., None], ve.abs())
    return o_abs, c * dq_abs, c * dk_abs, c * dv_abs


def gradient_floor_varlen(q, k, v, dout, cu_seqlens_q, cu_seqlens_k, **kw):
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    parts = [gradient_floor(q[None, cq[b]:cq[b + 1]], k[None, ck[b]:ck[b + 1]], v[None, ck[b]:ck[b + 1]],
                            dout[None, cq[b]:cq[b + 1]], **_sequence_kw(kw, b)) for b in range(len(cq) - 1)]
    return tuple(torch.cat([part[i][0] for part in parts], 0) for i in range(4))


def lse_bound(q, k, lse_ref, softmax_scale=None, causal=False, window=(-1, -1), softcap=0.0, alibi_slopes=None):
    """Per-row bound on |lse - ref| from fp32 error analysis, as the C++ harness's check_lse has it:
    the scores' dot products (d + 4) u scale |q||k|, the sum of n exponentials and its rescalings
    (2 n + 16) u, the exp2/log conversions and the final add 8 u (|lse| + max |s|)."""
    q, k = q.detach().double(), k.detach().double()
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    if sk == 0:  # no key: every lse is -inf, checked exactly
        return torch.ones(b, h, sq, dtype=torch.float64, device=q.device)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    mask = visible(sq, sk, causal, window[0], window[1], q.device)                     # (sq, sk)
    k_norm = k.norm(dim=-1).repeat_interleave(h // hk, dim=2).permute(0, 2, 1)          # (b, h, sk)
    k_max = torch.where(mask, k_norm[:, :, None, :], 0.0).amax(-1)                      # (b, h, sq)
    a = scale * q.norm(dim=-1).permute(0, 2, 1) * k_max
    smax = a.clamp(max=softcap) if softcap > 0 else a
    if alibi_slopes is not None:  # ALiBi adds up to its largest visible |bias| to |s|
        bias = alibi_bias(alibi_slopes.to(q.device), b, h, sq, sk, q.device).abs()
        smax = smax + torch.where(mask, bias, 0.0).amax(-1)
    n = mask.sum(-1).double()                                                           # (sq,)
    ref = lse_ref.detach().double().abs().where(torch.isfinite(lse_ref), 0.0)
    return (d + 4) * U32 * a + 4 * U32 * softcap + (2 * n + 16) * U32 + 8 * U32 * (ref + smax)


def lse_bound_varlen(q, k, lse_ref, cu_seqlens_q, cu_seqlens_k, **kw):
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    parts = [lse_bound(q[None, cq[b]:cq[b + 1]], k[None, ck[b]:ck[b + 1]], lse_ref[None, :, cq[b]:cq[b + 1]],
                       **_sequence_kw(kw, b))[0]
             for b in range(len(cq) - 1)]
    return torch.cat(parts, 1)


def check_lse(lse, ref, bound):
    """-inf exactly where the reference has it, elsewhere |lse - ref| <= the fp32 bound."""
    lse, ref, bound = lse.detach().double().cpu(), ref.detach().double().cpu(), bound.double().cpu()
    assert lse.shape == ref.shape, f"lse: shape {tuple(lse.shape)} != reference {tuple(ref.shape)}"
    assert not lse.isnan().any(), f"lse: {int(lse.isnan().sum())} NaN elements"
    inf = torch.isinf(ref)
    assert torch.equal(torch.isinf(lse), inf) and torch.equal(lse[inf], ref[inf]), "lse: infinities differ"
    err = (lse - ref).abs().where(~inf, 0.0)
    worst = int((err / bound).argmax())
    assert err.flatten()[worst] <= bound.flatten()[worst], (
        f"lse: |lse - ref| = {err.flatten()[worst].item():.3g} (lse {lse.flatten()[worst].item():.8g}, ref "
        f"{ref.flatten()[worst].item():.8g}) exceeds the fp32 bound {bound.flatten()[worst].item():.3g}")


def rounding_atol(ref, dtype):
    r = ref.to(dtype)
    y = ((r + 0.3).to(dtype) - 0.3).to(dtype)
    return 2 * (y.double() - r.double()).abs().max().item() if r.numel() else 0.0


def check_rule(what, out, ref, plain, factor, dtype, floor=None):
    """Asserts the anchor rule (plus a per-element floor where given); names the worst element."""
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    out, ref, plain = out.detach().double().cpu(), ref.detach().double().cpu(), plain.detach().double().cpu()
    assert not out.isnan().any(), f"{what}: {int(out.isnan().sum())} NaN elements (not written, or computed as NaN)"
    # -inf (fully masked lse rows) must match exactly; compare the finite rest.
    inf = torch.isinf(ref)
    assert torch.equal(torch.isinf(out), inf) and torch.equal(out[inf], ref[inf]), f"{what}: infinities differ"
    floor = torch.zeros_like(ref) if floor is None else floor.double().cpu()
    out, ref, plain, floor = out[~inf], ref[~inf], plain[~inf], floor[~inf]
    if ref.numel() == 0:
        return
    err = (out - ref).abs()
    plain_err = (plain - ref).abs().max().item()
    atol = rounding_atol(ref, dtype)
    bound = factor * plain_err + atol + floor
    worst = int((err / bound).argmax())
    assert err[worst].item() <= bound[worst].item(), (
        f"{what}: |out - ref| = {err[worst].item():.3g} (out {out[worst].item():.6g}, ref {ref[worst].item():.6g}) "
        f"exceeds {bound[worst].item():.3g} = {factor} x plain error {plain_err:.3g} + atol {atol:.3g} "
        f"+ fp32 floor {floor[worst].item():.3g}")
