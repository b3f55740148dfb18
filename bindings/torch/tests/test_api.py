"""The flash_attn API contract: signatures, packed variants, return values, errors, layouts."""

import inspect

import pytest
import torch

import flashattn_torch
from attn_reference import DEVICES, skip_unsupported
from flashattn_torch import (FlashAttnError, flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                             flash_attn_varlen_func, flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func)
from flashattn_torch.ops import _usable

_COMMON = [("dropout_p", 0.0), ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)),
           ("softcap", 0.0), ("alibi_slopes", None), ("deterministic", False), ("return_attn_probs", False)]
_NONE = inspect.Parameter.empty

# flash_attn 2.6-2.8 (flash_attn/flash_attn_interface.py): parameter names and defaults, in order.
FLASH_ATTN_SIGNATURES = {
    "flash_attn_func": [("q", _NONE), ("k", _NONE), ("v", _NONE)] + _COMMON,
    "flash_attn_qkvpacked_func": [("qkv", _NONE)] + _COMMON,
    "flash_attn_kvpacked_func": [("q", _NONE), ("kv", _NONE)] + _COMMON,
    "flash_attn_varlen_func": [("q", _NONE), ("k", _NONE), ("v", _NONE), ("cu_seqlens_q", _NONE),
                               ("cu_seqlens_k", _NONE), ("max_seqlen_q", _NONE), ("max_seqlen_k", _NONE)]
                              + _COMMON + [("block_table", None)],
    "flash_attn_varlen_qkvpacked_func": [("qkv", _NONE), ("cu_seqlens", _NONE), ("max_seqlen", _NONE)] + _COMMON,
    "flash_attn_varlen_kvpacked_func": [("q", _NONE), ("kv", _NONE), ("cu_seqlens_q", _NONE), ("cu_seqlens_k", _NONE),
                                        ("max_seqlen_q", _NONE), ("max_seqlen_k", _NONE)] + _COMMON,
    "flash_attn_with_kvcache": [("q", _NONE), ("k_cache", _NONE), ("v_cache", _NONE), ("k", None), ("v", None),
                                ("rotary_cos", None), ("rotary_sin", None), ("cache_seqlens", None),
                                ("cache_batch_idx", None), ("cache_leftpad", None), ("block_table", None),
                                ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)),
                                ("softcap", 0.0), ("rotary_interleaved", True), ("alibi_slopes", None),
                                ("num_splits", 0), ("return_softmax_lse", False)],
}


@pytest.mark.parametrize("name", list(FLASH_ATTN_SIGNATURES))
def test_signature_matches_flash_attn(name):
    params = inspect.signature(getattr(flashattn_torch, name)).parameters.values()
    assert [(p.name, p.default) for p in params] == FLASH_ATTN_SIGNATURES[name]


def rand(*shape, dtype=torch.float16, device="cpu"):
    return torch.randn(shape, dtype=dtype, device=device)


def assert_same(a, b):
    """Bitwise equal on the CPU (one code path whatever the strides). On CUDA the backend may pick a
    different kernel for different strides (TMA needs aligned ones), so there the two agree only to
    rounding: a stride bug gives errors of order 1, far above this tolerance."""
    if a.is_cuda:
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-3)
    else:
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_packed_variants_equal_unpacked(device):
    b, s, h, d = 2, 40, 4, 64
    qkv = rand(b, s, 3, h, d, device=device).requires_grad_()
    out_packed = flash_attn_qkvpacked_func(qkv, causal=True)
    dout = torch.randn_like(out_packed)
    (dqkv,) = torch.autograd.grad(out_packed, qkv, dout)

    q, k, v = (qkv.detach()[:, :, i].clone().requires_grad_() for i in range(3))
    out = flash_attn_func(q, k, v, causal=True)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    assert_same(out_packed, out)
    assert_same(dqkv, torch.stack(grads, 2))

    kv = torch.stack((k.detach(), v.detach()), 2).requires_grad_()
    out_kv = flash_attn_kvpacked_func(q, kv, causal=True)
    assert_same(out_kv, out)
    (dkv,) = torch.autograd.grad(out_kv, kv, dout)
    assert_same(dkv, torch.stack(grads[1:], 2))


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_packed_variants_equal_unpacked(device):
    h, d = 4, 32
    cu = torch.tensor([0, 7, 30, 31, 50], dtype=torch.int32, device=device)
    qkv = rand(50, 3, h, d, device=device)
    q, k, v = qkv.unbind(1)
    out = flash_attn_varlen_func(q, k, v, cu, cu, 23, 23, causal=True)
    assert_same(flash_attn_varlen_qkvpacked_func(qkv, cu, 23, causal=True), out)
    assert_same(flash_attn_varlen_kvpacked_func(q, qkv[:, 1:], cu, cu, 23, 23, causal=True), out)


def test_return_attn_probs_gives_out_lse_none_like_flash_attn():
    q, k, v = rand(2, 10, 4, 32), rand(2, 12, 2, 32), rand(2, 12, 2, 32)
    out, lse, s_dmask = flash_attn_func(q, k, v, return_attn_probs=True)
    assert s_dmask is None  # flash_attn returns None for S_dmask when dropout_p == 0
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (2, 4, 10) and lse.dtype == torch.float32
    assert torch.equal(out, flash_attn_func(q, k, v))


def test_lse_is_not_differentiable():
    q = rand(1, 8, 2, 32).requires_grad_()
    out, lse, _ = flash_attn_func(q, q, q, return_attn_probs=True)
    assert out.requires_grad and not lse.requires_grad


def test_dropout_reaches_every_entry_point_and_repeats_with_the_seed():
    """dropout_p changes the output (a mask a call), and torch.manual_seed repeats it."""
    q = rand(1, 8, 4, 32)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    calls = [lambda **kw: flash_attn_func(q, q, q, **kw),
             lambda **kw: flash_attn_qkvpacked_func(torch.stack((q, q, q), 2), **kw),
             lambda **kw: flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 8, 8, **kw)]
    for call in calls:
        plain = call()
        torch.manual_seed(5)
        a = call(dropout_p=0.5)
        torch.manual_seed(5)
        b = call(dropout_p=0.5)
        assert torch.equal(a, b)
        assert not torch.allclose(a, plain)
    with pytest.raises(Exception, match="dropout_p"):
        flash_attn_func(q, q, q, dropout_p=1.0)


def test_block_table_raises():
    q, cu = rand(8, 4, 32), torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="block_table"):
        flash_attn_varlen_func(q, q, q, cu, cu, 8, 8, block_table=torch.zeros(1, 1, dtype=torch.int32))


def test_library_errors_arrive_with_its_message():
    q, k = rand(1, 8, 3, 32), rand(1, 8, 2, 32)
    with pytest.raises(FlashAttnError, match=r"num_heads \(3\) must be a multiple of num_heads_kv \(2\)"):
        flash_attn_func(q, k, k)
    big = rand(1, 4, 1, 2048)
    with pytest.raises(FlashAttnError, match="head_dim 2048 exceeds the maximum"):
        flash_attn_func(big, big, big)
    x = rand(9, 2, 32)
    bad = torch.tensor([0, 5, 3, 9], dtype=torch.int32)  # decreasing
    with pytest.raises(FlashAttnError, match="cu_seqlens_q must be non-decreasing"):
        flash_attn_varlen_func(x, x, x, bad, torch.tensor([0, 3, 6, 9], dtype=torch.int32), 6, 3)
    with pytest.raises(FlashAttnError, match="window_left must be >= -1"):
        flash_attn_func(q, q, q, window_size=(-5, 0))


def test_softcap_at_or_below_zero_is_off_and_scale_zero_raises():
    q, k, v = rand(1, 8, 2, 32), rand(1, 8, 2, 32), rand(1, 8, 2, 32)
    assert torch.equal(flash_attn_func(q, k, v, softcap=-1.0), flash_attn_func(q, k, v))
    with pytest.raises(ValueError, match="softmax_scale=0.0"):
        flash_attn_func(q, k, v, softmax_scale=0.0)


def test_python_side_errors():
    q = rand(1, 8, 2, 32)
    with pytest.raises(TypeError, match="float64"):
        flash_attn_func(q.double(), q.double(), q.double())
    with pytest.raises(TypeError, match="share a dtype"):
        flash_attn_func(q, q.float(), q.float())
    with pytest.raises(ValueError, match=r"\(batch, seqlen, heads, head_dim\)"):
        flash_attn_func(q[0], q[0], q[0])
    with pytest.raises(TypeError, match="int32"):
        flash_attn_varlen_func(q[0], q[0], q[0], torch.tensor([0, 8]), torch.tensor([0, 8]), 8, 8)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_strided_inputs_read_in_place_and_match_contiguous(dtype, device):
    skip_unsupported(device, dtype)
    b, s, h, d = 2, 33, 4, 64
    # (b, h, s, d) storage seen as (b, s, h, d): head_dim contiguous, the other strides permuted.
    q, k, v = (rand(b, h, s, d, dtype=dtype, device=device).transpose(1, 2).requires_grad_() for _ in range(3))
    assert _usable(q) is q  # no copy
    out = flash_attn_func(q, k, v, causal=True)
    dout = torch.randn_like(out).transpose(1, 2).contiguous().transpose(1, 2)  # a strided dout as well
    grads = torch.autograd.grad(out, (q, k, v), dout)
    qc, kc, vc = (t.detach().contiguous().requires_grad_() for t in (q, k, v))
    out_c = flash_attn_func(qc, kc, vc, causal=True)
    grads_c = torch.autograd.grad(out_c, (qc, kc, vc), dout.contiguous())
    assert_same(out, out_c)
    for g, gc in zip(grads, grads_c):
        assert_same(g, gc)


def test_head_dim_not_contiguous_is_copied():
    x = rand(2, 16, 64, 4)  # (b, s, d, h)
    q = x.transpose(2, 3)  # (b, s, h, d) with head_dim stride 4
    assert _usable(q) is not q and _usable(q).stride(-1) == 1
    assert torch.equal(flash_attn_func(q, q, q), flash_attn_func(q.contiguous(), q.contiguous(), q.contiguous()))


def test_deterministic_backward_is_bitwise_repeatable():
    q, k, v = (rand(2, 100, 4, 64, dtype=torch.float32).requires_grad_() for _ in range(3))
    dout = rand(2, 100, 4, 64, dtype=torch.float32)
    runs = [torch.autograd.grad(flash_attn_func(q, k, v, causal=True, deterministic=True), (q, k, v), dout)
            for _ in range(3)]
    for later in runs[1:]:
        for a, b in zip(runs[0], later):
            assert torch.equal(a, b)


def test_empty_batch_and_empty_sequences():
    q = rand(0, 8, 2, 32)
    assert flash_attn_func(q, q, q).shape == q.shape
    q = rand(2, 0, 2, 32)
    assert flash_attn_func(q, rand(2, 5, 2, 32), rand(2, 5, 2, 32)).shape == q.shape


def test_fully_masked_rows_give_zero_out_and_minus_inf_lse():
    q, k = rand(1, 6, 2, 32), rand(1, 2, 2, 32)
    out, lse, _ = flash_attn_func(q, k, k, causal=True, return_attn_probs=True)  # rows 0..3 see no key
    assert torch.equal(out[:, :4], torch.zeros_like(out[:, :4]))
    assert torch.isneginf(lse[..., :4]).all() and torch.isfinite(lse[..., 4:]).all()


def test_alibi_slopes_of_the_wrong_shape_dtype_or_device_raise():
    q = rand(2, 8, 4, 32)
    for slopes in (torch.ones(3), torch.ones(2, 3), torch.ones(4, dtype=torch.float64), torch.ones(3, 4)):
        with pytest.raises(ValueError, match="alibi_slopes"):
            flash_attn_func(q, q, q, alibi_slopes=slopes)
    flash_attn_func(q, q, q, alibi_slopes=torch.ones(2, 4))  # (batch, nheads) is accepted
