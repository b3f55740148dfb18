"""flash_attn_with_kvcache: decode and chunked prefill over a padded KV cache, against plain attention
on each sequence's used rows (fp64 reference, the 2x rule). The cache rows past a sequence's used length
hold NaN, so an implementation that reads one fails."""

import pytest
import torch

from attn_reference import DEVICES, check_rule, gradient_floor, plain_attention, skip_unsupported
from flashattn_torch import FlashAttnError, flash_attn_with_kvcache


def per_sequence(q, k_cache, v_cache, used, dtype, **kw):
    """(out, lse) of plain attention on each sequence's used cache rows, in `dtype`."""
    outs, lses = [], []
    for b, n in enumerate(used.tolist()):
        o, l = plain_attention(q[b:b + 1].to(dtype), k_cache[b:b + 1, :n].to(dtype), v_cache[b:b + 1, :n].to(dtype),
                               **kw)
        outs.append(o)
        lses.append(l)
    return torch.cat(outs), torch.cat(lses)


def out_floor(q, k_cache, v_cache, used, **kw):
    """The fp32 floor of out (attn_reference.gradient_floor's, as every forward test has it) on each
    sequence's used cache rows."""
    return torch.cat([gradient_floor(q[b:b + 1], k_cache[b:b + 1, :n], v_cache[b:b + 1, :n], torch.zeros_like(q[b:b + 1]),
                                     **kw)[0] for b, n in enumerate(used.tolist())])


def nan_cache(batch, rows, heads_kv, d, used, dtype, device):
    cache = torch.randn(batch, rows, heads_kv, d, dtype=dtype, device=device)
    for b, n in enumerate(used):
        cache[b, n:] = float("nan")
    return cache


CASES = {
    # name -> (num_heads, num_heads_kv, seqlen_q, cache rows, used rows per sequence, keyword arguments)
    "decode": (4, 4, 1, 300, [300, 0, 77], {}),
    "decode_gqa": (8, 2, 1, 513, [1, 512, 200], {}),
    "chunk_causal": (4, 2, 6, 200, [6, 150, 9], {"causal": True}),
    "chunk_window": (4, 4, 5, 128, [128, 40, 5], {"causal": True, "window_size": (16, -1)}),
    "softcap_splits": (4, 1, 1, 900, [899, 450, 3], {"softcap": 2.0, "num_splits": 3}),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", CASES)
def test_matches_attention_on_the_used_rows(name, dtype, device):
    skip_unsupported(device, dtype)
    h, hk, sq, rows, used, kw = CASES[name]
    batch, d = len(used), 64
    q = torch.randn(batch, sq, h, d, dtype=dtype, device=device)
    k_cache, v_cache = (nan_cache(batch, rows, hk, d, used, dtype, device) for _ in range(2))
    seqlens = torch.tensor(used, dtype=torch.int32, device=device)
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, return_softmax_lse=True, **kw)
    plain_kw = {key: kw[key] for key in ("causal", "softcap") if key in kw}
    if "window_size" in kw:
        plain_kw["window"] = kw["window_size"]
    ref, ref_lse = per_sequence(q, k_cache, v_cache, seqlens, torch.float64, **plain_kw)
    plain, _ = per_sequence(q, k_cache, v_cache, seqlens, dtype, **plain_kw)
    check_rule("out", out, ref, plain, 2, dtype, out_floor(q, k_cache, v_cache, seqlens, **plain_kw))
    assert lse.shape == ref_lse.shape
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse).cpu(), finite.cpu()), "lse: rows without keys must be -inf, the rest finite"
    assert (lse.double() - ref_lse).abs()[finite].max().item() < 1e-3


@pytest.mark.parametrize("device", DEVICES)
def test_new_keys_are_written_into_the_cache_and_attended(device):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    batch, rows, h, hk, d, new = 3, 64, 4, 2, 32, 3
    used = [10, 0, 61]
    q = torch.randn(batch, new, h, d, dtype=dtype, device=device)
    k_cache, v_cache = (nan_cache(batch, rows, hk, d, used, dtype, device) for _ in range(2))
    k, v = (torch.randn(batch, new, hk, d, dtype=dtype, device=device) for _ in range(2))
    seqlens = torch.tensor(used, dtype=torch.int32, device=device)
    before = k_cache.clone()
    out = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens, causal=True)
    for b, n in enumerate(used):
        assert torch.equal(k_cache[b, n:n + new], k[b]) and torch.equal(v_cache[b, n:n + new], v[b])
        assert torch.equal(k_cache[b, :n], before[b, :n])
    total = seqlens + new
    ref, _ = per_sequence(q, k_cache, v_cache, total, torch.float64, causal=True)
    plain, _ = per_sequence(q, k_cache, v_cache, total, dtype, causal=True)
    check_rule("out", out, ref, plain, 2, dtype, out_floor(q, k_cache, v_cache, total, causal=True))


def test_an_int_cache_length_and_no_length():
    q = torch.randn(2, 1, 4, 32)
    k_cache, v_cache = torch.randn(2, 50, 4, 32), torch.randn(2, 50, 4, 32)
    whole = flash_attn_with_kvcache(q, k_cache, v_cache)
    ref, _ = plain_attention(q.double(), k_cache.double(), v_cache.double())
    assert (whole.double() - ref).abs().max().item() < 1e-5
    part = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=20)
    ref, _ = plain_attention(q.double(), k_cache[:, :20].double(), v_cache[:, :20].double())
    assert (part.double() - ref).abs().max().item() < 1e-5


@pytest.mark.parametrize("arg", ["rotary_cos", "rotary_sin", "cache_batch_idx", "cache_leftpad", "block_table",
                                 "alibi_slopes"])
def test_unsupported_arguments_raise_naming_them(arg):
    q, k_cache = torch.randn(1, 1, 2, 16), torch.randn(1, 8, 2, 16)
    with pytest.raises(NotImplementedError, match=arg):
        flash_attn_with_kvcache(q, k_cache, k_cache.clone(), cache_seqlens=4, **{arg: torch.zeros(1)})


def test_new_keys_without_cache_lengths_or_without_values_raise():
    q, k_cache, k = torch.randn(1, 1, 2, 16), torch.randn(1, 8, 2, 16), torch.randn(1, 1, 2, 16)
    with pytest.raises(ValueError, match="cache_seqlens"):
        flash_attn_with_kvcache(q, k_cache, k_cache.clone(), k, k.clone())
    with pytest.raises(ValueError, match="both k and v"):
        flash_attn_with_kvcache(q, k_cache, k_cache.clone(), k, cache_seqlens=2)


def test_a_cache_length_past_the_cache_is_an_error_naming_it():
    q, k_cache = torch.randn(2, 1, 2, 16), torch.randn(2, 8, 2, 16)
    with pytest.raises(FlashAttnError, match="seqused_k"):
        flash_attn_with_kvcache(q, k_cache, k_cache.clone(), cache_seqlens=torch.tensor([3, 9], dtype=torch.int32))
