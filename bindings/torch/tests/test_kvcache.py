"""flash_attn_with_kvcache: decode and chunked prefill over a padded or a paged KV cache, against plain
attention on each sequence's used rows (fp64 reference, the 2x rule). The cache rows past a sequence's used
length hold NaN, and so do a paged cache's unused pages, so an implementation that reads one fails."""

import pytest
import torch

from attn_reference import CUDA, DEVICES, NO_CUDA, check_rule, gradient_floor, plain_attention, skip_unsupported
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


def check_out(out, q, k_cache, v_cache, used, dtype, **kw):
    """out by the 2x rule with the fp32 floor against plain attention on each sequence's first used[b]
    cache rows."""
    ref, _ = per_sequence(q, k_cache, v_cache, used, torch.float64, **kw)
    plain, _ = per_sequence(q, k_cache, v_cache, used, dtype, **kw)
    check_rule("out", out, ref, plain, 2, dtype, out_floor(q, k_cache, v_cache, used, **kw))


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
    check_against_plain(out, lse, q, k_cache, v_cache, seqlens, dtype, kw)


def check_against_plain(out, lse, q, k_cache, v_cache, seqlens, dtype, kw):
    """out by the 2x rule with the fp32 floor, lse within 1e-3 and -inf exactly on the rows without keys,
    against plain attention on each sequence's used rows of the (padded) k_cache / v_cache."""
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
    check_out(out, q, k_cache, v_cache, total, dtype, causal=True)


def test_an_int_cache_length_and_no_length():
    q = torch.randn(2, 1, 4, 32)
    k_cache, v_cache = torch.randn(2, 50, 4, 32), torch.randn(2, 50, 4, 32)
    whole = flash_attn_with_kvcache(q, k_cache, v_cache)
    ref, _ = plain_attention(q.double(), k_cache.double(), v_cache.double())
    assert (whole.double() - ref).abs().max().item() < 1e-5
    part = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=20)
    ref, _ = plain_attention(q.double(), k_cache[:, :20].double(), v_cache[:, :20].double())
    assert (part.double() - ref).abs().max().item() < 1e-5


@pytest.mark.parametrize("per_sequence", [False, True], ids=["per_head", "per_sequence"])
def test_alibi_over_the_used_keys(per_sequence):
    """ALiBi's distances count from the end of each sequence's used keys (seqlen_k = its cache length)."""
    torch.manual_seed(3)
    q, k_cache, v_cache = torch.randn(2, 3, 4, 32), torch.randn(2, 50, 2, 32), torch.randn(2, 50, 2, 32)
    used = torch.tensor([50, 17], dtype=torch.int32)
    slopes = torch.tensor([[0.5, 0.25, 0.125, 1.0], [2.0, 0.0, 0.3, 0.7]]) if per_sequence else torch.tensor([0.5, 0.25, 0.125, 1.0])
    out = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=used, causal=True, alibi_slopes=slopes)
    for b in range(2):
        n = int(used[b])
        s = slopes[b] if per_sequence else slopes
        ref, _ = plain_attention(q[b:b + 1].double(), k_cache[b:b + 1, :n].double(), v_cache[b:b + 1, :n].double(),
                                 causal=True, alibi_slopes=s)
        assert (out[b:b + 1].double() - ref).abs().max().item() < 1e-5


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


# Paged KV cache (block_table), any page size: the CUDA sm80 kernel looks up a page a key block where
# pages hold whole blocks (64 or 128 rows), else one a row.
PAGE_SIZES = [("cpu", 16), ("cpu", 5), ("cpu", 256)] + ([("cuda", 256), ("cuda", 16), ("cuda", 7)] if CUDA else [])


def page_table(pages_used, max_blocks, spare, device):
    """(block_table int32 (batch, max_blocks), num_pages): sequence b's first pages_used[b] blocks at
    distinct random pages of a pool with `spare` pages more than the used ones; the entries past them -1."""
    num_pages = sum(pages_used) + spare
    order = torch.randperm(num_pages)
    table = torch.full((len(pages_used), max_blocks), -1, dtype=torch.int32)
    start = 0
    for b, n in enumerate(pages_used):
        table[b, :n] = order[start:start + n]
        start += n
    return table.to(device), num_pages


def to_pool(cache, table, num_pages):
    """The pool (num_pages, page_block_size, heads_kv, d) holding the logical cache (batch, max_blocks *
    page_block_size, heads_kv, d) through the table: the pages the table names get their blocks, every
    other page is NaN."""
    page = cache.shape[1] // table.shape[1]
    pool = cache.new_full((num_pages, page) + tuple(cache.shape[2:]), float("nan"))
    b, j = (table >= 0).nonzero(as_tuple=True)
    pool[table[b, j].long()] = cache.unflatten(1, (table.shape[1], page))[b, j]
    return pool


def pages_for(used, page):
    return [-(-n // page) for n in used]


@pytest.mark.parametrize("device,page", PAGE_SIZES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", CASES)
def test_paged_matches_the_padded_cache(name, dtype, device, page):
    """A paged cache (pages in random order, unused pages and rows NaN, -1 past the used pages) gives the
    padded cache's result: against plain attention by the 2x rule, and on the CPU (where paging only
    changes where a key row is read from) bitwise the padded call's."""
    skip_unsupported(device, dtype)
    h, hk, sq, _, used, kw = CASES[name]
    batch, d = len(used), 64
    max_blocks = max(pages_for(used, page)) + 1  # every table row has entries past its used pages
    q = torch.randn(batch, sq, h, d, dtype=dtype, device=device)
    k_cache, v_cache = (nan_cache(batch, max_blocks * page, hk, d, used, dtype, device) for _ in range(2))
    table, num_pages = page_table(pages_for(used, page), max_blocks, 3, device)
    k_pool, v_pool = to_pool(k_cache, table, num_pages), to_pool(v_cache, table, num_pages)
    seqlens = torch.tensor(used, dtype=torch.int32, device=device)
    out, lse = flash_attn_with_kvcache(q, k_pool, v_pool, cache_seqlens=seqlens, block_table=table,
                                       return_softmax_lse=True, **kw)
    check_against_plain(out, lse, q, k_cache, v_cache, seqlens, dtype, kw)
    if device == "cpu":
        padded, padded_lse = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                                     return_softmax_lse=True, **kw)
        assert torch.equal(out, padded) and torch.equal(lse, padded_lse)


@pytest.mark.parametrize("device,page", [("cpu", 5), ("cpu", 16)] + ([("cuda", 128), ("cuda", 16)] if CUDA else []))
def test_new_keys_are_written_into_the_pages_and_attended(device, page):
    """k, v appended through the table land at row (n + i) % page of page table[b, (n + i) // page], one
    of the writes across a page boundary; no other pool element changes."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    h, hk, d, new = 4, 2, 32, 3
    used = [page - 2, 0, 2 * page + page // 2 + 1]
    batch, max_blocks = len(used), max(pages_for([n + new for n in used], page)) + 1
    q = torch.randn(batch, new, h, d, dtype=dtype, device=device)
    k_cache, v_cache = (nan_cache(batch, max_blocks * page, hk, d, used, dtype, device) for _ in range(2))
    table, num_pages = page_table(pages_for([n + new for n in used], page), max_blocks, 2, device)
    k_pool, v_pool = to_pool(k_cache, table, num_pages), to_pool(v_cache, table, num_pages)
    k, v = (torch.randn(batch, new, hk, d, dtype=dtype, device=device) for _ in range(2))
    seqlens = torch.tensor(used, dtype=torch.int32, device=device)
    out, lse = flash_attn_with_kvcache(q, k_pool, v_pool, k, v, cache_seqlens=seqlens, block_table=table, causal=True,
                                       return_softmax_lse=True)
    for b, n in enumerate(used):
        for i in range(new):
            pg, row = table[b, (n + i) // page].item(), (n + i) % page
            assert torch.equal(k_pool[pg, row], k[b, i]) and torch.equal(v_pool[pg, row], v[b, i])
        k_cache[b, n:n + new], v_cache[b, n:n + new] = k[b], v[b]
    # The whole pool: the appended logical cache's pages, NaN everywhere else (bitwise, NaN included).
    for pool, cache in ((k_pool, k_cache), (v_pool, v_cache)):
        torch.testing.assert_close(pool, to_pool(cache, table, num_pages), rtol=0, atol=0, equal_nan=True)
    check_against_plain(out, lse, q, k_cache, v_cache, seqlens + new, dtype, {"causal": True})


def test_an_append_into_an_unallocated_page_raises_and_does_not_wrap():
    """A -1 entry where k, v go: an IndexError, not a write into the pool's last page (where -1 would index)."""
    q, k = torch.randn(1, 1, 2, 16), torch.randn(1, 2, 2, 16)
    k_pool, v_pool = torch.randn(3, 4, 2, 16), torch.randn(3, 4, 2, 16)
    table = torch.tensor([[0, -1]], dtype=torch.int32)  # rows 4.. have no page; page 2 is spare
    before = k_pool.clone(), v_pool.clone()
    with pytest.raises(IndexError):
        flash_attn_with_kvcache(q, k_pool, v_pool, k, k.clone(), cache_seqlens=3, block_table=table)
    assert torch.equal(k_pool[2], before[0][2]) and torch.equal(v_pool[2], before[1][2])


def test_paged_argument_errors():
    q, pool = torch.randn(2, 1, 2, 16), torch.randn(4, 8, 2, 16)
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    with pytest.raises(TypeError, match="block_table"):
        flash_attn_with_kvcache(q, pool, pool.clone(), cache_seqlens=9, block_table=table.long())
    with pytest.raises(ValueError, match="block_table"):
        flash_attn_with_kvcache(q, pool, pool.clone(), cache_seqlens=9, block_table=table[:1])
    # A page outside the pool among a used key's entries: the library's message names the entry.
    with pytest.raises(FlashAttnError, match="block_table"):
        flash_attn_with_kvcache(q, pool, pool.clone(), cache_seqlens=9, block_table=table.where(table != 3, 4))
    with pytest.raises(FlashAttnError, match="seqused_k"):  # past the 2 * 8 keys a table row addresses
        flash_attn_with_kvcache(q, pool, pool.clone(), cache_seqlens=17, block_table=table)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("paged", [False, True], ids=["padded", "paged"])
def test_opcheck_fwd_kvcache(device, paged):
    """Schema and fake (meta) kernel of flashattn::fwd_kvcache, with and without a block_table."""
    q = torch.randn(2, 3, 4, 64, dtype=torch.bfloat16, device=device)
    page = 128 if device == "cuda" else 16
    used = torch.tensor([page + 5, 7], dtype=torch.int32, device=device)
    if paged:
        k_cache, v_cache = (torch.randn(5, page, 2, 64, dtype=torch.bfloat16, device=device) for _ in range(2))
        table = torch.tensor([[3, 0, -1], [4, -1, -1]], dtype=torch.int32, device=device)
    else:
        k_cache, v_cache = (torch.randn(2, 2 * page, 2, 64, dtype=torch.bfloat16, device=device) for _ in range(2))
        table = None
    torch.library.opcheck(torch.ops.flashattn.fwd_kvcache.default,
                          (q, k_cache, v_cache, used, table, None, 0.125, True, -1, -1, 0.0, 0, None))


# Rotary embeddings (rotary_cos / rotary_sin): the new k and q rotated at their positions before the write.
def rope_reference(x, theta, positions, interleaved):
    """x rotated by the angles theta (seqlen_ro, rotary_dim / 2) at positions (batch, seqlen), as complex
    products in fp64: pairs (2i, 2i + 1) when interleaved, else (i, i + rotary_dim / 2)."""
    half = theta.shape[1]
    xr = x[..., :2 * half].double()
    if interleaved:
        pairs = torch.complex(xr[..., 0::2], xr[..., 1::2])
    else:
        pairs = torch.complex(xr[..., :half], xr[..., half:])
    turned = pairs * torch.polar(torch.ones_like(theta), theta)[positions].unsqueeze(2)
    if interleaved:
        rotated = torch.stack((turned.real, turned.imag), dim=-1).flatten(-2)
    else:
        rotated = torch.cat((turned.real, turned.imag), dim=-1)
    return torch.cat((rotated.to(x.dtype), x[..., 2 * half:]), dim=-1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "neox"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_rotary_rotates_the_new_keys_and_q_at_their_positions(device, interleaved, causal):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    batch, rows, h, hk, d, new, rotary_dim = 3, 256, 4, 2, 64, 3, 32
    used = [10, 0, 200]
    theta = (torch.arange(rows, dtype=torch.float64)[:, None] *
             10000.0 ** (-torch.arange(rotary_dim // 2, dtype=torch.float64) * 2 / rotary_dim)).to(device)
    cos, sin = theta.cos().float(), theta.sin().float()
    q = torch.randn(batch, new, h, d, dtype=dtype, device=device)
    k, v = (torch.randn(batch, new, hk, d, dtype=dtype, device=device) for _ in range(2))
    k_cache, v_cache = (nan_cache(batch, rows, hk, d, used, dtype, device) for _ in range(2))
    seqlens = torch.tensor(used, dtype=torch.int32, device=device)
    k_pos = seqlens.long()[:, None] + torch.arange(new, device=device)
    q_pos = k_pos if causal else seqlens.long()[:, None].expand(batch, new)
    q_rot, k_rot = rope_reference(q, theta, q_pos, interleaved), rope_reference(k, theta, k_pos, interleaved)
    before = k_cache.clone()
    out = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens,
                                  causal=causal, rotary_interleaved=interleaved)
    # The cache holds the rotated keys (to the dtype's rounding: fp32 products against fp64 ones), the
    # values as given, the rows before untouched; the dims past rotary_dim are not rotated.
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    for b, n in enumerate(used):
        assert (k_cache[b, n:n + new].double() - k_rot[b].double()).abs().max().item() < tol
        assert torch.equal(k_cache[b, n:n + new, :, rotary_dim:], k[b, :, :, rotary_dim:])
        assert torch.equal(v_cache[b, n:n + new], v[b]) and torch.equal(k_cache[b, :n], before[b, :n])
    # Attention with q rotated as the reference rotates it, over the cache as it now is.
    check_out(out, q_rot, k_cache, v_cache, seqlens + new, dtype, causal=causal)


def test_rotary_argument_errors():
    q, k_cache, k = torch.randn(1, 1, 2, 16), torch.randn(1, 8, 2, 16), torch.randn(1, 1, 2, 16)
    cos = torch.ones(8, 4)
    with pytest.raises(ValueError, match="rotary_cos and rotary_sin"):
        flash_attn_with_kvcache(q, k_cache, k_cache.clone(), k, k.clone(), rotary_cos=cos, cache_seqlens=2)
    with pytest.raises(ValueError, match="pass k and v"):
        flash_attn_with_kvcache(q, k_cache, k_cache.clone(), rotary_cos=cos, rotary_sin=cos, cache_seqlens=2)
    with pytest.raises(ValueError, match="rotary_dim"):
        big = torch.ones(8, 9)  # rotary_dim 18 > headdim 16
        flash_attn_with_kvcache(q, k_cache, k_cache.clone(), k, k.clone(), rotary_cos=big, rotary_sin=big, cache_seqlens=2)


# cache_batch_idx: sequence b reads and writes the cache's batch row cache_batch_idx[b].
@pytest.mark.parametrize("device", DEVICES)
def test_cache_batch_idx_selects_each_sequences_cache_row(device):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    cache_batch, rows, h, hk, d, new = 5, 200, 4, 2, 64, 2  # 200 rows: on CUDA a page lookup a row
    index = [4, 0, 2]
    used = [100, 0, 198]  # cache_seqlens of the 3 sequences (their rows' used lengths)
    k_cache, v_cache = (torch.randn(cache_batch, rows, hk, d, dtype=dtype, device=device) for _ in range(2))
    for i, n in zip(index, used):
        k_cache[i, n:] = v_cache[i, n:] = float("nan")
    q = torch.randn(len(index), new, h, d, dtype=dtype, device=device)
    k, v = (torch.randn(len(index), new, hk, d, dtype=dtype, device=device) for _ in range(2))
    idx = torch.tensor(index, dtype=torch.int32, device=device)
    seqlens = torch.tensor(used, dtype=torch.int32, device=device)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    out = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens, cache_batch_idx=idx, causal=True)
    for b, (i, n) in enumerate(zip(index, used)):
        assert torch.equal(k_cache[i, n:n + new], k[b]) and torch.equal(v_cache[i, n:n + new], v[b])
    untouched = [i for i in range(cache_batch) if i not in index]
    assert torch.equal(k_cache[untouched], before_k[untouched]) and torch.equal(v_cache[untouched], before_v[untouched])
    gathered_k, gathered_v, total = k_cache[idx.long()], v_cache[idx.long()], seqlens + new
    check_out(out, q, gathered_k, gathered_v, total, dtype, causal=True)


def test_cache_batch_idx_errors():
    q, k_cache = torch.randn(2, 1, 2, 16), torch.randn(3, 8, 2, 16)
    with pytest.raises(ValueError, match="cache_batch_idx"):
        flash_attn_with_kvcache(q, k_cache, k_cache.clone(), cache_batch_idx=torch.tensor([0, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match="cache_batch_idx"):
        flash_attn_with_kvcache(q, k_cache, k_cache.clone(), cache_batch_idx=torch.tensor([0], dtype=torch.int32))
    with pytest.raises(ValueError, match="block_table"):
        flash_attn_with_kvcache(q, k_cache, k_cache.clone(), cache_batch_idx=torch.tensor([0, 1], dtype=torch.int32),
                                block_table=torch.zeros(2, 1, dtype=torch.int32))


# cache_leftpad: sequence b's keys are cache rows [cache_leftpad[b], cache_seqlens[b]).
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_cache_leftpad_attends_to_the_rows_after_the_padding(device, causal):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    batch, rows, h, hk, d, new = 3, 300, 4, 2, 64, 2
    pad, used = [5, 40, 0], [200, 40, 298]  # sequence 1 has no cached key: only the new ones
    k_cache, v_cache = (nan_cache(batch, rows, hk, d, used, dtype, device) for _ in range(2))
    for b, n in enumerate(pad):
        k_cache[b, :n] = v_cache[b, :n] = float("nan")
    q = torch.randn(batch, new, h, d, dtype=dtype, device=device)
    k, v = (torch.randn(batch, new, hk, d, dtype=dtype, device=device) for _ in range(2))
    seqlens, leftpad = (torch.tensor(x, dtype=torch.int32, device=device) for x in (used, pad))
    out = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens, cache_leftpad=leftpad, causal=causal)
    for b, n in enumerate(used):
        assert torch.equal(k_cache[b, n:n + new], k[b]) and torch.equal(v_cache[b, n:n + new], v[b])
    # The reference: each sequence's keys moved to row 0, its length less the padding.
    shifted_k, shifted_v = (torch.full_like(x, float("nan")) for x in (k_cache, v_cache))
    for b, n in enumerate(pad):
        shifted_k[b, :rows - n], shifted_v[b, :rows - n] = k_cache[b, n:], v_cache[b, n:]
    total = seqlens + new - leftpad
    check_out(out, q, shifted_k, shifted_v, total, dtype, causal=causal)


def test_cache_leftpad_errors():
    q, k_cache = torch.randn(2, 1, 2, 16), torch.randn(2, 8, 2, 16)
    with pytest.raises(FlashAttnError, match="leftpad_k"):
        flash_attn_with_kvcache(q, k_cache, k_cache.clone(), cache_seqlens=torch.tensor([3, 5], dtype=torch.int32),
                                cache_leftpad=torch.tensor([4, 0], dtype=torch.int32))
    with pytest.raises(ValueError, match="cache_leftpad"):
        flash_attn_with_kvcache(q, k_cache, k_cache.clone(), cache_leftpad=torch.tensor([0], dtype=torch.int32))
