"""torch.autograd.gradcheck in double on the CPU backend.

The library computes in fp32 at most (it has no fp64 kernels), so the checked function takes and
returns float64 tensors and runs the op in fp32 between two casts. gradcheck then compares the
analytical Jacobian (the library's fa_backward) with central differences of the library's
forward. The tolerances follow from fp32, not from double: with eps = 3e-3 the differences carry
a rounding error of about u32 * |out| / eps ~ 2e-5 and a truncation error of eps^2 * f''' ~ 1e-5;
measured on these problems, max |numerical - analytical| = 3e-5 .. 7e-5 (|J| up to 0.6), about an
eighth of atol + rtol * |J| with atol = 5e-4, rtol = 5e-3. A backward wrong by 1% fails (below).
"""

import pytest
import torch

from flashattn_torch import flash_attn_func, flash_attn_varlen_func

GRADCHECK = dict(eps=3e-3, atol=5e-4, rtol=5e-3, nondet_tol=1e-6, fast_mode=False)


def in_fp32(fn):
    def wrapped(*tensors):
        return fn(*(t.float() for t in tensors)).double()
    return wrapped


def inputs(*shapes):
    return [torch.randn(s, dtype=torch.float64, requires_grad=True) for s in shapes]


@pytest.mark.parametrize("kw", [{}, {"causal": True}, {"window_size": (3, 1), "softcap": 2.0}],
                         ids=["full", "causal", "window_softcap"])
def test_gradcheck_dense_gqa(kw):
    q, k, v = inputs((1, 6, 4, 16), (1, 9, 2, 16), (1, 9, 2, 16))
    assert torch.autograd.gradcheck(in_fp32(lambda a, b, c: flash_attn_func(a, b, c, **kw)), (q, k, v), **GRADCHECK)


def test_gradcheck_varlen():
    cu = torch.tensor([0, 3, 3, 8], dtype=torch.int32)
    q, k, v = inputs((8, 2, 16), (8, 2, 16), (8, 2, 16))
    f = in_fp32(lambda a, b, c: flash_attn_varlen_func(a, b, c, cu, cu, 5, 5, causal=True))
    assert torch.autograd.gradcheck(f, (q, k, v), **GRADCHECK)


class _ScaledGrad(torch.autograd.Function):
    """Identity forward, backward scaled: stands in for a backward that is 1% wrong."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * 1.01


def test_gradcheck_tolerances_catch_a_wrong_backward():
    q, k, v = inputs((1, 6, 4, 16), (1, 9, 2, 16), (1, 9, 2, 16))
    f = in_fp32(lambda a, b, c: _ScaledGrad.apply(flash_attn_func(a, b, c, causal=True)))
    assert not torch.autograd.gradcheck(f, (q, k, v), raise_exception=False, **GRADCHECK)
