"""Hugging Face transformers: attention routed to flashattn through AttentionInterface.

    import flashattn_torch.hf
    name = flashattn_torch.hf.register()                    # "fa_torch"
    model = AutoModelForCausalLM.from_config(config, attn_implementation=name)

transformers calls attention_forward with query (batch, num_heads, seqlen_q, head_dim) and
key/value (batch, num_heads_kv, seqlen_k, head_dim); they are passed to the library as the
(batch, seqlen, heads, head_dim) views flash_attn takes (no copy), GQA unexpanded. A padded batch
arrives as the 2-D padding mask that transformers' flash-attention mask function gives (it is
registered under the same name) and runs through the varlen path; padded query rows get 0.
"""

import torch
import torch.nn.functional as F

from .interface import flash_attn_func, flash_attn_varlen_func

# Not "flashattn": transformers takes any name containing "flash" for one of its own flash-attention
# kernels and tries to import it.
NAME = "fa_torch"


def _cu_seqlens(lengths):
    return F.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))


def _padded(q, k, v, mask, **kw):
    """q (b, s_q, h, d), k/v (b, s_k, h_k, d), mask (b, s_k) bool, True = token (the last s_q
    columns are the queries' own). Unpads to varlen, runs, pads back with zeros."""
    b, sq, h, d = q.shape
    sk = k.shape[1]
    kmask, qmask = mask, mask[:, -sq:]
    idx_q, idx_k = qmask.flatten().nonzero().squeeze(1), kmask.flatten().nonzero().squeeze(1)
    lens_q, lens_k = qmask.sum(1, dtype=torch.int32), kmask.sum(1, dtype=torch.int32)
    out = flash_attn_varlen_func(
        q.reshape(b * sq, h, d).index_select(0, idx_q), k.reshape(b * sk, *k.shape[2:]).index_select(0, idx_k),
        v.reshape(b * sk, *v.shape[2:]).index_select(0, idx_k), _cu_seqlens(lens_q), _cu_seqlens(lens_k),
        int(lens_q.max()), int(lens_k.max()), **kw)
    return q.new_zeros(b * sq, h, d).index_copy(0, idx_q, out).view(b, sq, h, d)


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None,
                      softcap=None, is_causal=None, **kwargs):
    """The AttentionInterface function: returns (out (batch, seqlen_q, num_heads, head_dim), None)."""
    if kwargs.get("s_aux") is not None:
        raise NotImplementedError("flashattn: attention sinks (s_aux) are not supported")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    window = (-1, -1)
    if sliding_window is not None and k.shape[1] > sliding_window:
        window = (sliding_window - 1, sliding_window - 1)  # transformers' flash-attention convention
    kw = dict(dropout_p=float(dropout or 0.0), softmax_scale=scaling, causal=causal, window_size=window,
              softcap=softcap or 0.0)
    if attention_mask is None:
        return flash_attn_func(q, k, v, **kw), None
    if attention_mask.dim() != 2:
        raise ValueError(f"flashattn: expected no mask or a 2-D padding mask, got shape {tuple(attention_mask.shape)} "
                         "(register the attention with flashattn_torch.hf.register(), which also registers its mask)")
    return _padded(q, k, v, attention_mask.bool(), **kw), None


def register(name=NAME):
    """Registers attention_forward (and transformers' flash-attention padding mask) under `name`."""
    from transformers import AttentionInterface

    AttentionInterface.register(name, attention_forward)
    try:
        from transformers import AttentionMaskInterface
        from transformers.masking_utils import flash_attention_mask
    except ImportError:  # older transformers: no mask is built for custom names; unpadded batches only
        return name
    AttentionMaskInterface.register(name, flash_attention_mask)
    return name
