"""The operators: torch.ops.flashattn.fwd and torch.ops.flashattn.bwd.

Both are torch.library custom ops with fake (meta) implementations, so torch.compile traces them
without running them, and fwd's autograd formula calls bwd, so the backward is the library's
fa_backward. Their real implementations only fill fa_params from the tensors and call the C ABI:

  dense:  q (batch, seqlen_q, num_heads, head_dim), k/v (batch, seqlen_k, num_heads_kv, head_dim)
          lse (batch, num_heads, seqlen_q) fp32
  varlen: q (total_q, num_heads, head_dim), k/v (total_k, num_heads_kv, head_dim),
          cu_seqlens_q/k int32 (batch + 1), lse (num_heads, total_q) fp32
  paged KV cache (fwd_kvcache, forward only): k/v (num_pages, page_block_size, num_heads_kv, head_dim),
          block_table int32 (batch, max_blocks)

Tensors keep their strides when the head_dim axis is contiguous (packed qkv views are not
copied); otherwise they are made contiguous. On CUDA the call runs on the current stream with a
workspace from the caching allocator and never synchronizes, so it can be captured in a graph.

attention() is what the flash_attn functions call: under torch.compile (or with tensor subclasses
or dispatch modes, e.g. fake tensors) it is torch.ops.flashattn.fwd; in plain eager mode it is an
autograd.Function around the same two implementations, which skips the dispatcher's and the
custom-op autograd wrapper's Python layers (bench/binding_overhead.py measures the difference).
"""

import ctypes
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _lib

_DTYPES = {torch.float32: _lib.FA_FLOAT32, torch.float16: _lib.FA_FLOAT16, torch.bfloat16: _lib.FA_BFLOAT16}

# Tests set this to fill every output with NaN before the library runs, so an element the
# library fails to write cannot pass as a stale value.
poison_outputs = False


def _check(q, k, v, cu_seqlens_q, cu_seqlens_k, paged=False):
    """Shape, dtype and device checks with messages in the caller's terms (real and fake paths).
    paged: k and v are a paged cache's pools, whose first axis is the pages, not the batch."""
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if varlen and (cu_seqlens_q is None or cu_seqlens_k is None):
        raise ValueError("flashattn: varlen needs both cu_seqlens_q and cu_seqlens_k")
    rank = 3 if varlen else 4
    layout = "(total, heads, head_dim)" if varlen else "(batch, seqlen, heads, head_dim)"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != rank:
            raise ValueError(f"flashattn: {name} must be {layout}, got shape {tuple(t.shape)}")
    if q.dtype not in _DTYPES:
        raise TypeError(f"flashattn: q has dtype {q.dtype}; supported: float32, float16, bfloat16")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"flashattn: q, k, v must share a dtype (got {q.dtype}, {k.dtype}, {v.dtype})")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"flashattn: q, k, v must be on one device (got {q.device}, {k.device}, {v.device})")
    if k.shape != v.shape:
        raise ValueError(f"flashattn: k and v must have the same shape (got {tuple(k.shape)}, {tuple(v.shape)})")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"flashattn: q and k must have the same head_dim (got {q.shape[-1]}, {k.shape[-1]})")
    if not varlen and not paged and q.shape[0] != k.shape[0]:
        raise ValueError(f"flashattn: q and k must have the same batch (got {q.shape[0]}, {k.shape[0]})")
    if varlen:
        for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
            if cu.dtype != torch.int32 or cu.dim() != 1:
                raise TypeError(f"flashattn: {name} must be a 1-D int32 tensor (got {cu.dtype}, shape {tuple(cu.shape)})")
            if cu.device != q.device:
                raise ValueError(f"flashattn: {name} is on {cu.device} but q is on {q.device}")
        if cu_seqlens_q.shape != cu_seqlens_k.shape:
            raise ValueError("flashattn: cu_seqlens_q and cu_seqlens_k must both have batch + 1 entries")


def _usable(t):
    """t itself when the library can read it in place: head_dim axis contiguous and, on CUDA,
    16-byte aligned rows (the kernels load 16 bytes at a time); else a contiguous copy."""
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        return t.contiguous()
    if t.is_cuda:
        vec = 16 // t.element_size()
        if t.data_ptr() % 16 or any(s % vec for s in t.stride()[:-1]):
            return t.contiguous()
    return t


# tensor -> its fa_params fields: pointer, batch, row and head strides
_FIELDS = {name: (name, f"{prefix}_batch_stride", f"{prefix}_row_stride", f"{prefix}_head_stride")
           for name, prefix in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "o"), ("dout", "do"), ("dq", "dq"),
                                ("dk", "dk"), ("dv", "dv"))}


def _set_tensor(p, name, t):
    """Pointer and (batch, row, head) element strides of a 4-D or varlen 3-D tensor."""
    ptr, batch_stride, row_stride, head_stride = _FIELDS[name]
    setattr(p, ptr, t.data_ptr())
    s = t.stride()
    if len(s) == 4:
        setattr(p, batch_stride, s[0])
    setattr(p, row_stride, s[-3])
    setattr(p, head_stride, s[-2])


def _check_alibi(q, alibi_slopes, batch):
    """ALiBi slopes: fp32 (nheads,) or (batch, nheads) on q's device (real and fake paths)."""
    nheads = q.shape[-2]
    if (alibi_slopes.dtype != torch.float32 or alibi_slopes.shape not in ((nheads,), (batch, nheads))
            or alibi_slopes.device != q.device):
        raise ValueError(f"flashattn: alibi_slopes must be a float32 tensor (nheads,) or (batch, nheads) = "
                         f"({batch}, {nheads}) on {q.device} (got {alibi_slopes.dtype}, shape "
                         f"{tuple(alibi_slopes.shape)}, {alibi_slopes.device})")


def _set_alibi(p, q, alibi_slopes):
    """fa_params.alibi_slopes (None: off; batch stride 0 for (nheads,)) after _check_alibi against p.batch.
    Returns the contiguous slopes the call reads, for the caller to hold until it has run."""
    if alibi_slopes is None:
        return None
    _check_alibi(q, alibi_slopes, p.batch)
    alibi_slopes = alibi_slopes.contiguous()
    p.alibi_slopes = alibi_slopes.data_ptr()
    p.alibi_slopes_batch_stride = alibi_slopes.shape[-1] if alibi_slopes.dim() == 2 else 0
    return alibi_slopes


def _params(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
            window_left, window_right, softcap, deterministic):
    p = _lib.new_params()
    if cu_seqlens_q is None:
        p.batch, p.seqlen_q, p.num_heads, p.head_dim = q.shape
        p.seqlen_k, p.num_heads_kv = k.shape[1], k.shape[2]
    else:
        p.batch = cu_seqlens_q.shape[0] - 1
        p.seqlen_q, p.seqlen_k = max_seqlen_q, max_seqlen_k
        p.total_q, p.num_heads, p.head_dim = q.shape
        p.total_k, p.num_heads_kv = k.shape[0], k.shape[1]
        p.cu_seqlens_q, p.cu_seqlens_k = cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr()
    p.dtype = _DTYPES[q.dtype]
    p.softmax_scale = softmax_scale
    p.causal = int(causal)
    p.window_left, p.window_right = window_left, window_right
    p.softcap = softcap
    p.deterministic = int(deterministic)
    if q.is_cuda:
        p.stream = torch.cuda.current_stream(q.device).cuda_stream
    else:
        p.num_threads = torch.get_num_threads()
    return p


def _run(fn, p, device, backward):
    """Calls fa_forward / fa_backward; on CUDA with the workspace the library asks for, on the
    tensors' device (the library launches on the current one)."""
    if device.type != "cuda":
        _lib.check(fn(ctypes.byref(p), _lib.impl))
    elif device.index is not None and device.index != torch.cuda.current_device():
        with torch.cuda.device(device):
            _run_cuda(fn, p, device, backward)
    else:
        _run_cuda(fn, p, device, backward)


def _run_cuda(fn, p, device, backward):
    n = _lib.workspace_size(p, _lib.impl, backward)
    workspace = torch.empty(n, dtype=torch.uint8, device=device) if n else None
    if workspace is not None:
        p.workspace, p.workspace_bytes = workspace.data_ptr(), n
    # The caching allocator orders the workspace's reuse after this stream's work: no sync.
    _lib.check(fn(ctypes.byref(p), _lib.impl))


def _lse_shape(q, varlen):
    return (q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1])


def _forward(p, q, k, v, varlen):
    """(out, lse): fa_forward with p's sizes and settings on q, k, v, into new outputs (NaN-filled first
    when the tests ask: poison_outputs)."""
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(_lse_shape(q, varlen), dtype=torch.float32, device=q.device)
    if poison_outputs:
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
    for name, t in (("q", q), ("k", k), ("v", v), ("o", out)):
        _set_tensor(p, name, t)
    p.lse = lse.data_ptr()
    _run(_lib.lib.fa_forward, p, q.device, False)
    return out, lse


def forward_impl(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
        max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, causal: bool, window_left: int,
        window_right: int, softcap: float, deterministic: bool, dropout_p: float, dropout_seed: int,
        alibi_slopes: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """(out, lse) = attention(q, k, v); `deterministic` only travels to the backward. Dropout: P's elements dropped
    with probability dropout_p by the mask of dropout_seed (offset 0), the same in the backward."""
    _check(q, k, v, cu_seqlens_q, cu_seqlens_k)
    q, k, v = _usable(q), _usable(k), _usable(v)
    varlen = cu_seqlens_q is not None
    if varlen:
        cu_seqlens_q, cu_seqlens_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
    p = _params(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                window_left, window_right, softcap, deterministic)
    p.dropout_p, p.dropout_seed = dropout_p, dropout_seed
    alibi_slopes = _set_alibi(p, q, alibi_slopes)
    return _forward(p, q, k, v, varlen)


fwd = torch.library.custom_op("flashattn::fwd", forward_impl, mutates_args=())


@fwd.register_fake
def _fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
              window_left, window_right, softcap, deterministic, dropout_p, dropout_seed, alibi_slopes):
    _check(q, k, v, cu_seqlens_q, cu_seqlens_k)
    varlen = cu_seqlens_q is not None
    if alibi_slopes is not None:
        _check_alibi(q, alibi_slopes, cu_seqlens_q.shape[0] - 1 if varlen else q.shape[0])
    return q.new_empty(q.shape), q.new_empty(_lse_shape(q, varlen), dtype=torch.float32)


def backward_impl(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, cu_seqlens_q: Optional[Tensor],
        cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, causal: bool,
        window_left: int, window_right: int, softcap: float, deterministic: bool, dropout_p: float, dropout_seed: int,
        alibi_slopes: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) by the library's backward from dout and the forward's out and lse."""
    _check(q, k, v, cu_seqlens_q, cu_seqlens_k)
    dout, q, k, v, out = _usable(dout), _usable(q), _usable(k), _usable(v), _usable(out)
    lse = lse.contiguous()
    if cu_seqlens_q is not None:
        cu_seqlens_q, cu_seqlens_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    if poison_outputs:
        for t in (dq, dk, dv):
            t.fill_(float("nan"))
    p = _params(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                window_left, window_right, softcap, deterministic)
    p.dropout_p, p.dropout_seed = dropout_p, dropout_seed
    alibi_slopes = _set_alibi(p, q, alibi_slopes)
    for name, t in (("q", q), ("k", k), ("v", v), ("o", out), ("dout", dout), ("dq", dq), ("dk", dk), ("dv", dv)):
        _set_tensor(p, name, t)
    p.lse = lse.data_ptr()
    _run(_lib.lib.fa_backward, p, q.device, True)
    return dq, dk, dv


bwd = torch.library.custom_op("flashattn::bwd", backward_impl, mutates_args=())


@bwd.register_fake
def _bwd_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
              causal, window_left, window_right, softcap, deterministic, dropout_p, dropout_seed, alibi_slopes):
    _check(q, k, v, cu_seqlens_q, cu_seqlens_k)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _check_block_table(q, block_table):
    """A paged cache's table: int32 (batch, max_blocks) on q's device (real and fake paths)."""
    if block_table.dtype != torch.int32 or block_table.dim() != 2:
        raise TypeError(f"flashattn: block_table must be a 2-D int32 tensor (batch, max_blocks) (got "
                        f"{block_table.dtype}, shape {tuple(block_table.shape)})")
    if block_table.shape[0] != q.shape[0]:
        raise ValueError(f"flashattn: block_table must have a row per sequence: (batch = {q.shape[0]}, max_blocks) "
                         f"(got shape {tuple(block_table.shape)})")
    if block_table.device != q.device:
        raise ValueError(f"flashattn: block_table is on {block_table.device} but q is on {q.device}")


def _per_sequence(name, q, x):
    """x, an int32 (batch,) tensor on q's device, contiguous."""
    if x.dtype != torch.int32 or x.shape != (q.shape[0],) or x.device != q.device:
        raise ValueError(f"flashattn: {name} must be an int32 tensor (batch,) on {q.device} "
                         f"(got {x.dtype}, shape {tuple(x.shape)}, {x.device})")
    return x.contiguous()


def kvcache_forward_impl(q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_used: Optional[Tensor],
        block_table: Optional[Tensor], cache_leftpad: Optional[Tensor], softmax_scale: float, causal: bool,
        window_left: int, window_right: int, softcap: float, num_splits: int,
        alibi_slopes: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """(out, lse) over a KV cache (forward only): sequence b attends to keys [cache_leftpad[b], cache_used[b])
    of its k_cache / v_cache rows (fa_params.leftpad_k, None: 0; fa_params.seqused_k, None: all rows), masks
    aligned to their count. With block_table the caches are pools of pages (num_pages, page_block_size,
    heads_kv, head_dim) and key j of sequence b is row j % page_block_size of page block_table[b, j // page_block_size]."""
    paged = block_table is not None
    _check(q, k_cache, v_cache, None, None, paged)
    if paged:
        _check_block_table(q, block_table)
    q, k_cache, v_cache = _usable(q), _usable(k_cache), _usable(v_cache)
    if cache_used is not None:
        cache_used = _per_sequence("the cache lengths", q, cache_used)
    if cache_leftpad is not None:
        cache_leftpad = _per_sequence("cache_leftpad", q, cache_leftpad)
    p = _params(q, k_cache, None, None, 0, 0, softmax_scale, causal, window_left, window_right, softcap, False)
    p.num_splits = num_splits
    alibi_slopes = _set_alibi(p, q, alibi_slopes)
    if cache_used is not None:
        p.seqused_k = cache_used.data_ptr()
    if cache_leftpad is not None:
        p.leftpad_k = cache_leftpad.data_ptr()
    if paged:
        # k_cache / v_cache's batch strides (set by _forward) step from page to page; seqlen_k is the
        # keys a table row can address.
        block_table = block_table.contiguous()
        p.block_table, p.block_table_batch_stride = block_table.data_ptr(), block_table.stride(0)
        p.num_pages, p.page_block_size = k_cache.shape[0], k_cache.shape[1]
        p.seqlen_k = block_table.shape[1] * k_cache.shape[1]
    return _forward(p, q, k_cache, v_cache, False)


fwd_kvcache = torch.library.custom_op("flashattn::fwd_kvcache", kvcache_forward_impl, mutates_args=())


@fwd_kvcache.register_fake
def _fwd_kvcache_fake(q, k_cache, v_cache, cache_used, block_table, cache_leftpad, softmax_scale, causal, window_left,
                      window_right, softcap, num_splits, alibi_slopes):
    _check(q, k_cache, v_cache, None, None, block_table is not None)
    if alibi_slopes is not None:
        _check_alibi(q, alibi_slopes, q.shape[0])
    if block_table is not None:
        _check_block_table(q, block_table)
    return q.new_empty(q.shape), q.new_empty(_lse_shape(q, False), dtype=torch.float32)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_k, *args, alibi_slopes = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes)
    ctx.args = args  # max_seqlen_q, .. softcap, deterministic, dropout_p, dropout_seed
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes = ctx.saved_tensors
    dq, dk, dv = bwd(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, *ctx.args, alibi_slopes)
    return (dq, dk, dv) + (None,) * 13


fwd.register_autograd(_backward, setup_context=_setup_context)


class _EagerAttention(torch.autograd.Function):
    """fwd with the same autograd formula, for plain eager tensors: no dispatcher round trips."""

    @staticmethod
    def forward(ctx, *inputs):
        out, lse = forward_impl(*inputs)
        _setup_context(ctx, inputs, (out, lse))
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes = ctx.saved_tensors
        dq, dk, dv = backward_impl(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, *ctx.args, alibi_slopes)
        return (dq, dk, dv) + (None,) * 13


def _dispatch_stack_empty():
    depth = getattr(torch._C, "_len_torch_dispatch_stack", None)
    return depth is None or depth() == 0


def attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
              window_right, softcap, deterministic, dropout_p=0.0, dropout_seed=0, alibi_slopes=None):
    """(out, lse): torch.ops.flashattn.fwd, or its eager twin where nothing needs the dispatcher."""
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
            window_right, softcap, deterministic, dropout_p, dropout_seed, alibi_slopes)
    if (torch.compiler.is_compiling() or type(q) is not Tensor or type(k) is not Tensor or type(v) is not Tensor
            or not _dispatch_stack_empty()):
        return fwd(*args)
    return _EagerAttention.apply(*args)
