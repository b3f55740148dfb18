"""The flash_attn API: same names, arguments, defaults, layouts and return values.

    out = flash_attn_func(q, k, v, causal=True)                  # q (b, s, h, d), k/v (b, s, h_k, d)
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True)

As in flash_attn, return_attn_probs=True returns (out, softmax_lse, S_dmask); S_dmask is always None
here (flash_attn returns the dropped probabilities when dropout_p > 0; the mask here is a function of
a seed, src/common/dropout.hpp). dropout_p > 0 draws that seed from torch's generator each call (so
torch.manual_seed repeats it) and runs on the CPU and on the GPU (the same mask on both). block_table outside flash_attn_with_kvcache raises NotImplementedError; nothing is
silently ignored. alibi_slopes (fp32 (nheads,) or (batch, nheads))
runs forward and backward on the CPU and on the GPU.
"""

import torch

from . import ops


def _unsupported(block_table=None):
    if block_table is not None:
        raise NotImplementedError("flashattn: block_table (paged KV cache) is not supported")


def _window(window_size):
    left, right = window_size
    return int(left), int(right)


def _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
               causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs, block_table=None):
    _unsupported(block_table)
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** (-0.5)
    elif softmax_scale == 0:
        raise ValueError("flashattn: softmax_scale=0.0 is not supported (the library reads 0 as its default "
                         "1/sqrt(head_dim)); pass None for the default")
    left, right = _window(window_size)
    softcap = float(softcap) if softcap > 0 else 0.0  # flash_attn: softcap <= 0 means off
    # Dropout: a fresh mask a call, its seed from torch's generator (torch.manual_seed repeats it).
    dropout_seed = int(torch.randint(0, 2**62, (), dtype=torch.int64).item()) if dropout_p > 0 else 0
    out, lse = ops.attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, float(softmax_scale),
                             bool(causal), left, right, softcap, bool(deterministic), float(dropout_p), dropout_seed,
                             alibi_slopes)
    return (out, lse, None) if return_attn_probs else out


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q (batch, seqlen_q, nheads, headdim), k/v (batch, seqlen_k, nheads_k, headdim) -> out like q.
    With return_attn_probs: (out, softmax_lse (batch, nheads, seqlen_q) fp32, None)."""
    return _attention(q, k, v, None, None, 0, 0, dropout_p, softmax_scale, causal, window_size, softcap,
                      alibi_slopes, deterministic, return_attn_probs)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """qkv (batch, seqlen, 3, nheads, headdim) -> out (batch, seqlen, nheads, headdim)."""
    q, k, v = qkv.unbind(2)
    return _attention(q, k, v, None, None, 0, 0, dropout_p, softmax_scale, causal, window_size, softcap,
                      alibi_slopes, deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q (batch, seqlen_q, nheads, headdim), kv (batch, seqlen_k, 2, nheads_k, headdim) -> out like q."""
    k, v = kv.unbind(2)
    return _attention(q, k, v, None, None, 0, 0, dropout_p, softmax_scale, causal, window_size, softcap,
                      alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """q (total_q, nheads, headdim), k/v (total_k, nheads_k, headdim), cu_seqlens int32 (batch + 1).
    With return_attn_probs: (out, softmax_lse (nheads, total_q) fp32, None)."""
    return _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), dropout_p,
                      softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
                      block_table)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """qkv (total, 3, nheads, headdim) -> out (total, nheads, headdim)."""
    q, k, v = qkv.unbind(1)
    return _attention(q, k, v, cu_seqlens, cu_seqlens, int(max_seqlen), int(max_seqlen), dropout_p, softmax_scale,
                      causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs)


def _rotary(x, cos, sin, positions, interleaved):
    """x (batch, seqlen, heads, d) with its first rotary_dim = 2 * cos.shape[1] dims rotated by the angles
    of cos / sin (seqlen_ro, rotary_dim / 2) at positions (batch, seqlen), in fp32, rounded to x's dtype."""
    half = cos.shape[-1]
    if cos.dim() != 2 or sin.shape != cos.shape or 2 * half > x.shape[-1]:
        raise ValueError(f"flashattn: rotary_cos / rotary_sin must both be (seqlen_ro, rotary_dim / 2) with rotary_dim "
                         f"<= headdim {x.shape[-1]} (got {tuple(cos.shape)}, {tuple(sin.shape)})")
    c, s = (t.to(x.device)[positions].unsqueeze(2).float() for t in (cos, sin))  # (batch, seqlen, 1, half)
    xr = x[..., :2 * half].float()
    if interleaved:  # pairs (2i, 2i + 1)
        x0, x1 = xr[..., 0::2], xr[..., 1::2]
        rotated = torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)
    else:  # pairs (i, i + half)
        x0, x1 = xr[..., :half], xr[..., half:]
        rotated = torch.cat((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1)
    return torch.cat((rotated.to(x.dtype), x[..., 2 * half:]), dim=-1)


def _batch_idx_table(q, k_cache, cache_batch_idx):
    """cache_batch_idx (batch,) as a page table of one page a sequence: the cache's batch axis the pages."""
    if cache_batch_idx.dim() != 1 or cache_batch_idx.shape[0] != q.shape[0]:
        raise ValueError(f"flashattn: cache_batch_idx must be (batch = {q.shape[0]},) (got {tuple(cache_batch_idx.shape)})")
    if not cache_batch_idx.is_cuda and ((cache_batch_idx < 0) | (cache_batch_idx >= k_cache.shape[0])).any():
        raise ValueError(f"flashattn: cache_batch_idx entries must lie in [0, {k_cache.shape[0]}) (the cache's batch)")
    return cache_batch_idx.to(device=q.device, dtype=torch.int32).view(-1, 1)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
                            cache_batch_idx=None, cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0, rotary_interleaved=True,
                            alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    """Decode / chunked prefill over a KV cache (forward only). q (batch, seqlen_q, nheads, headdim),
    k_cache / v_cache (batch, seqlen_cache, nheads_k, headdim), or with block_table (a paged cache)
    (num_blocks, page_block_size, nheads_k, headdim) and block_table int32 (batch, max_num_blocks_per_seq):
    row j of sequence b is row j % page_block_size of block block_table[b, j // page_block_size], and
    seqlen_cache = max_num_blocks_per_seq * page_block_size (any page_block_size). cache_seqlens (int, or int32 (batch,)): the cache rows in use per sequence (None:
    all). k / v (batch, seqlen_new, nheads_k, headdim), when given, are written into the caches in place
    at rows cache_seqlens .. + seqlen_new (which must fit, in allocated blocks when paged) and attended to
    as well. Causal and window masks align to the end of the used rows. cache_batch_idx (int32 (batch,),
    not with block_table): sequence b's cache is k_cache[cache_batch_idx[b]] (run as a paged cache of one
    page a sequence). rotary_cos / rotary_sin
    (seqlen_ro, rotary_dim / 2), with k and v: the new k, and q, are rotated (RoPE, in fp32) at their
    positions cache_seqlens[b] + i before the write; q at cache_seqlens[b] alone unless causal or
    windowed; rotary_interleaved pairs dims (0, 1), (2, 3).. else (i, i + rotary_dim / 2) (GPT-NeoX).
    cache_leftpad (int32 (batch,), not with block_table): sequence b's keys start at cache row
    cache_leftpad[b] (the rows before are never read; masks align to the keys from there; cache_seqlens
    stays the end row, where new k, v go, and the rotary positions are cache rows). Returns out like q; with
    return_softmax_lse, (out, softmax_lse (batch, nheads, seqlen_q) fp32). alibi_slopes (fp32 (nheads,) or
    (batch, nheads)): ALiBi over the keys attended to (as flash_attn_func)."""
    if cache_leftpad is not None:
        cache_leftpad = cache_leftpad.to(device=q.device, dtype=torch.int32)
    if (k is None) != (v is None):
        raise ValueError("flashattn: pass both k and v (the new keys and values), or neither")
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("flashattn: pass both rotary_cos and rotary_sin, or neither")
    if rotary_cos is not None and k is None:
        raise ValueError("flashattn: rotary_cos / rotary_sin rotate the new k (and q): pass k and v with them")
    if cache_batch_idx is not None:
        if block_table is not None:
            raise ValueError("flashattn: cache_batch_idx is not supported with block_table (index the table instead)")
        block_table = _batch_idx_table(q, k_cache, cache_batch_idx)
    if block_table is not None:
        ops._check_block_table(q, block_table)  # before the table indexes the caches below
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** (-0.5)
    elif softmax_scale == 0:
        raise ValueError("flashattn: softmax_scale=0.0 is not supported; pass None for the default")
    batch = q.shape[0]
    used = None
    if cache_seqlens is not None:
        if isinstance(cache_seqlens, int):
            used = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)
        else:
            used = cache_seqlens.to(device=q.device, dtype=torch.int32)
    if k is not None:
        if used is None:
            raise ValueError("flashattn: k and v are appended at cache_seqlens: pass cache_seqlens with them")
        rows = used.long()[:, None] + torch.arange(k.shape[1], device=q.device)  # (batch, seqlen_new)
        batch_index = torch.arange(batch, device=q.device)[:, None]
        if rotary_cos is not None:
            k = _rotary(k, rotary_cos, rotary_sin, rows, rotary_interleaved)
            # q's rows sit at the end of the keys when masked so; else all at the first new position.
            masked = causal or tuple(window_size) != (-1, -1)
            q_rows = used.long()[:, None] + (torch.arange(q.shape[1], device=q.device) if masked else 0)
            q = _rotary(q, rotary_cos, rotary_sin, q_rows.expand(batch, q.shape[1]), rotary_interleaved)
        if block_table is None:
            k_cache[batch_index, rows] = k
            v_cache[batch_index, rows] = v
        else:
            # Logical row -> (block, row in block) through the table, (batch, seqlen_new) each. A negative
            # entry (an unallocated block) is sent past the pool so that it fails like a row past the end,
            # rather than wrapping around to the last block.
            page_size = k_cache.shape[1]
            pages = block_table[batch_index, rows // page_size].long()
            pages = torch.where(pages < 0, k_cache.shape[0], pages)
            k_cache[pages, rows % page_size] = k
            v_cache[pages, rows % page_size] = v
        used = used + k.shape[1]
    left, right = _window(window_size)
    softcap = float(softcap) if softcap > 0 else 0.0
    out, lse = ops.fwd_kvcache(q, k_cache, v_cache, used, block_table, cache_leftpad, float(softmax_scale), bool(causal),
                               left, right, softcap, int(num_splits), alibi_slopes)
    return (out, lse) if return_softmax_lse else out


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """q (total_q, nheads, headdim), kv (total_k, 2, nheads_k, headdim) -> out like q."""
    k, v = kv.unbind(1)
    return _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), dropout_p,
                      softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs)
