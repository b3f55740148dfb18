"""Forward and gradients against the fp64 reference with the 2x rule (3x for gradients)."""

import pytest
import torch

from attn_reference import (DEVICES, check_lse, check_rule, dropout_factors, gradient_floor, gradient_floor_varlen, lse_bound,
                            lse_bound_varlen, plain_attention, plain_sequential, plain_sequential_varlen, plain_varlen,
                            skip_unsupported)
from flashattn_torch import flash_attn_func, flash_attn_varlen_func

DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# name -> (num_heads, num_heads_kv, seqlen_q, seqlen_k, flash_attn keyword arguments)
FEATURES = {
    "full": (4, 4, 97, 130, {}),
    "causal": (4, 4, 128, 128, {"causal": True}),
    "causal_sq_lt_sk": (4, 4, 45, 150, {"causal": True}),
    "causal_sq_gt_sk": (4, 4, 90, 40, {"causal": True}),  # the first 50 rows see no key: out 0, lse -inf
    "window": (4, 4, 120, 120, {"window_size": (17, 5)}),
    "window_causal": (4, 4, 80, 110, {"window_size": (24, -1), "causal": True}),
    "softcap": (4, 4, 64, 96, {"softcap": 1.5}),
    "gqa": (6, 2, 70, 70, {"causal": True}),
    "mqa": (4, 1, 33, 65, {}),
    "scale": (4, 4, 50, 50, {"softmax_scale": 0.3}),
}


def make(shape, dtype, device):
    return torch.randn(shape, dtype=dtype, device=device).requires_grad_()


def reference(q, k, v, dout, fn):
    """[out, lse, dq, dk, dv] of fn (plain attention) run in fp64 on the same inputs."""
    qq, kk, vv = (t.detach().double().requires_grad_() for t in (q, k, v))
    out, lse = fn(qq, kk, vv)
    return [out, lse, *torch.autograd.grad(out, (qq, kk, vv), dout.double())]


def check_all(out, lse, grads, ref, plain, lse_bounds, floors, dtype):
    """plain: [out, dq, dk, dv] of the plain implementation in the inputs' dtype."""
    check_rule("out", out, ref[0], plain[0], 2, dtype, floors[0])
    # lse is fp32 for every input dtype: checked against the fp32 error bound of any implementation.
    check_lse(lse, ref[1], lse_bounds)
    for name, g, r, pl, floor in zip(("dq", "dk", "dv"), grads, ref[2:], plain[1:], floors[1:]):
        check_rule(name, g, r, pl, 3, dtype, floor)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("feature", list(FEATURES))
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_flash_attn_func(dtype, head_dim, feature, device):
    skip_unsupported(device, dtype)
    h, hk, sq, sk, kw = FEATURES[feature]
    batch = 2
    q = make((batch, sq, h, head_dim), dtype, device)
    k = make((batch, sk, hk, head_dim), dtype, device)
    v = make((batch, sk, hk, head_dim), dtype, device)
    out, lse, s_dmask = flash_attn_func(q, k, v, return_attn_probs=True, **kw)
    assert s_dmask is None
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)

    plain_kw = {"softmax_scale": kw.get("softmax_scale"), "causal": kw.get("causal", False),
                "window": kw.get("window_size", (-1, -1)), "softcap": kw.get("softcap", 0.0)}
    ref = reference(q, k, v, dout, lambda a, b, c: plain_attention(a, b, c, **plain_kw))
    plain = plain_sequential(q.cpu(), k.cpu(), v.cpu(), dout.cpu(), **plain_kw)
    bounds = lse_bound(q, k, ref[1], **plain_kw)
    floors = gradient_floor(q, k, v, dout, **plain_kw)
    check_all(out, lse, grads, ref, plain, bounds, floors, dtype)


def random_cu_seqlens(batch, max_len, device, empty):
    lens = torch.randint(1, max_len + 1, (batch,))
    lens[0] = max_len  # the longest sequence is exactly max_seqlen
    lens[empty] = 0
    cu = torch.zeros(batch + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lens, 0)
    return cu.to(device), int(lens.max())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kw", [{}, {"causal": True}, {"window_size": (10, 3)}, {"softcap": 2.0, "causal": True}],
                         ids=["full", "causal", "window", "softcap_causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_flash_attn_varlen_func(dtype, kw, device):
    skip_unsupported(device, dtype)
    batch, h, hk, d = 5, 4, 2, 64
    cu_q, max_q = random_cu_seqlens(batch, 70, device, empty=-1)  # a sequence without queries
    cu_k, max_k = random_cu_seqlens(batch, 90, device, empty=-2)  # one whose queries see no key
    q = make((int(cu_q[-1]), h, d), dtype, device)
    k = make((int(cu_k[-1]), hk, d), dtype, device)
    v = make((int(cu_k[-1]), hk, d), dtype, device)
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, return_attn_probs=True, **kw)
    assert lse.shape == (h, q.shape[0])
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)

    plain_kw = {"causal": kw.get("causal", False), "window": kw.get("window_size", (-1, -1)),
                "softcap": kw.get("softcap", 0.0)}
    fn = lambda a, b, c: plain_varlen(a, b, c, cu_q.cpu(), cu_k.cpu(), **plain_kw)  # noqa: E731
    ref = reference(q, k, v, dout, fn)
    plain = plain_sequential_varlen(q.cpu(), k.cpu(), v.cpu(), dout.cpu(), cu_q.cpu(), cu_k.cpu(), **plain_kw)
    bounds = lse_bound_varlen(q, k, ref[1], cu_q.cpu(), cu_k.cpu(), **plain_kw)
    floors = gradient_floor_varlen(q, k, v, dout, cu_q.cpu(), cu_k.cpu(), **plain_kw)
    check_all(out, lse, grads, ref, plain, bounds, floors, dtype)


def alibi_slopes(per_sequence, batch, heads, device):
    """ALiBi's geometric slopes 2^(-8 i / heads) from 1/2, times (b + 1) per sequence: the bias matters at
    these lengths."""
    base = torch.tensor([2.0 ** (-1 - 8 * i / heads) for i in range(heads)])
    slopes = base[None, :] * torch.arange(1, batch + 1)[:, None] if per_sequence else base
    return slopes.to(torch.float32).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kw", [{}, {"causal": True}, {"window_size": (20, 5), "softcap": 2.0}],
                         ids=["full", "causal", "window_softcap"])
@pytest.mark.parametrize("per_sequence", [False, True], ids=["per_head", "per_sequence"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
def test_alibi(dtype, per_sequence, kw, device):
    """ALiBi (alibi_slopes) forward and gradients, s_q != s_k, GQA; then the same on a varlen batch."""
    skip_unsupported(device, dtype)
    batch, h, hk, d, sq, sk = 2, 4, 2, 64, 45, 110
    slopes = alibi_slopes(per_sequence, batch, h, device)
    q, k, v = make((batch, sq, h, d), dtype, device), make((batch, sk, hk, d), dtype, device), make((batch, sk, hk, d), dtype, device)
    out, lse, _ = flash_attn_func(q, k, v, alibi_slopes=slopes, return_attn_probs=True, **kw)
    dout = torch.randn_like(out)
    plain_kw = {"causal": kw.get("causal", False), "window": kw.get("window_size", (-1, -1)),
                "softcap": kw.get("softcap", 0.0), "alibi_slopes": slopes}
    ref = reference(q, k, v, dout, lambda a, b, c: plain_attention(a, b, c, **plain_kw))
    plain = plain_sequential(q.cpu(), k.cpu(), v.cpu(), dout.cpu(), **plain_kw)
    floors = gradient_floor(q, k, v, dout, **plain_kw)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    check_all(out, lse, grads, ref, plain, lse_bound(q, k, ref[1], **plain_kw), floors, dtype)

    cu_q = torch.tensor([0, 30, 31], dtype=torch.int32, device=device)  # a one-row sequence
    cu_k = torch.tensor([0, 64, 100], dtype=torch.int32, device=device)
    q, k, v = make((31, h, d), dtype, device), make((100, hk, d), dtype, device), make((100, hk, d), dtype, device)
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 30, 64, alibi_slopes=slopes, return_attn_probs=True, **kw)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    cu_q, cu_k = cu_q.cpu(), cu_k.cpu()
    ref = reference(q, k, v, dout, lambda a, b, c: plain_varlen(a, b, c, cu_q, cu_k, **plain_kw))
    plain = plain_sequential_varlen(q.cpu(), k.cpu(), v.cpu(), dout.cpu(), cu_q, cu_k, **plain_kw)
    check_all(out, lse, grads, ref, plain, lse_bound_varlen(q, k, ref[1], cu_q, cu_k, **plain_kw),
              gradient_floor_varlen(q, k, v, dout, cu_q, cu_k, **plain_kw), dtype)


@pytest.mark.parametrize("kw", [{}, {"causal": True, "alibi": True}, {"window_size": (20, 5), "softcap": 2.0}],
                         ids=["full", "causal_alibi", "window_softcap"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("device", DEVICES)
def test_dropout(device, dtype, kw):
    """Dropout (dropout_p): out and gradients against attention with the same mask computed here in Python
    (attn_reference.dropout_factors), in fp64 and, for the error rule, in the inputs' dtype; the seed is the
    one the binding draws from torch's generator. On CUDA: the sm80 kernels (on Hopper too)."""
    skip_unsupported(device, dtype)
    batch, h, hk, d, sq, sk, p_drop = 2, 4, 2, 32, 45, 70, 0.3
    torch.manual_seed(1)
    q, k, v = make((batch, sq, h, d), dtype, device), make((batch, sk, hk, d), dtype, device), make((batch, sk, hk, d), dtype, device)
    slopes = alibi_slopes(False, batch, h, device) if kw.get("alibi") else None
    fkw = {key: val for key, val in kw.items() if key != "alibi"}
    torch.manual_seed(7)
    seed = int(torch.randint(0, 2**62, (), dtype=torch.int64).item())
    torch.manual_seed(7)
    out = flash_attn_func(q, k, v, dropout_p=p_drop, alibi_slopes=slopes, **fkw)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    z = dropout_factors(batch, h, sq, sk, p_drop, seed)
    plain_kw = {"causal": kw.get("causal", False), "window": kw.get("window_size", (-1, -1)),
                "softcap": kw.get("softcap", 0.0), "alibi_slopes": slopes, "dropout": z}
    ref = reference(q, k, v, dout, lambda a, b, c: plain_attention(a, b, c, **plain_kw))
    qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
    plain_out, _ = plain_attention(qq, kk, vv, **plain_kw)
    plain = [plain_out, *torch.autograd.grad(plain_out, (qq, kk, vv), dout)]
    floors = gradient_floor(q, k, v, dout, **plain_kw)  # a recomputing backward's fp32 error (the C++ harness's)
    check_rule("out", out, ref[0], plain[0], 2, dtype, floors[0])
    for name, g, r, pl, floor in zip(("dq", "dk", "dv"), grads, ref[2:], plain[1:], floors[1:]):
        check_rule(name, g, r, pl, 3, dtype, floor)
    assert (z == 0).float().mean().item() == pytest.approx(p_drop, abs=0.02)
