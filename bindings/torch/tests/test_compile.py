"""torch.library registration (opcheck), torch.compile(fullgraph=True), and CUDA graphs."""

import pytest
import torch

from attn_reference import CUDA, DEVICES, NO_CUDA
from flashattn_torch import flash_attn_func, flash_attn_varlen_func, ops


def fwd_args(device, dtype=torch.float16, varlen=False, alibi=False, dropout=0.0):
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], device=device) if alibi else None  # (nheads,)
    drop = (dropout, 1234 if dropout else 0)  # dropout_p, dropout_seed
    if varlen:
        cu = torch.tensor([0, 5, 21, 32], dtype=torch.int32, device=device)
        q, k, v = (torch.randn(32, 4, 64, dtype=dtype, device=device, requires_grad=True) for _ in range(3))
        return (q, k, v, cu, cu, 16, 16, 0.125, True, -1, -1, 0.0, False, *drop, slopes)
    q = torch.randn(2, 24, 4, 64, dtype=dtype, device=device, requires_grad=True)
    k, v = (torch.randn(2, 30, 2, 64, dtype=dtype, device=device, requires_grad=True) for _ in range(2))
    return (q, k, v, None, None, 0, 0, 0.125, True, 8, -1, 5.0, False, *drop, slopes)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
@pytest.mark.parametrize("alibi", [False, True], ids=["", "alibi"])
@pytest.mark.parametrize("dropout", [0.0, 0.2], ids=["", "dropout"])
def test_opcheck(device, varlen, alibi, dropout):
    """Schema, fake (meta) kernel, autograd registration and AOT dispatch of flashattn::fwd and ::bwd."""
    args = fwd_args(device, varlen=varlen, alibi=alibi, dropout=dropout)
    torch.library.opcheck(torch.ops.flashattn.fwd.default, args)
    out, lse = torch.ops.flashattn.fwd(*args)
    q, k, v, cu_q, cu_k, *rest = args
    bwd_args = (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out.detach(), lse, cu_q, cu_k, *rest)
    torch.library.opcheck(torch.ops.flashattn.bwd.default, bwd_args)


def loss_fn(q, k, v, w):
    out = flash_attn_func(q, k, v, causal=True, window_size=(16, -1))
    return out, (out.float() * w).sum()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_forward_and_backward(device, backend):
    torch._dynamo.reset()
    compiled = torch.compile(loss_fn, fullgraph=True, backend=backend)
    q, k, v = (torch.randn(2, 48, 4, 64, dtype=torch.bfloat16, device=device, requires_grad=True) for _ in range(3))
    w = torch.randn(2, 48, 4, 64, device=device)
    out, loss = compiled(q, k, v, w)
    grads = torch.autograd.grad(loss, (q, k, v))
    out_e, loss_e = loss_fn(q, k, v, w)
    grads_e = torch.autograd.grad(loss_e, (q, k, v))
    assert torch.equal(out, out_e)  # the same library call on the same inputs
    for g, ge in zip(grads, grads_e):
        torch.testing.assert_close(g, ge, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_dynamic_shapes_varlen(device):
    """One compiled graph serves several packed lengths (the fake kernel handles symbolic shapes)."""
    torch._dynamo.reset()

    def f(q, k, v, cu, max_seqlen):
        return flash_attn_varlen_func(q, k, v, cu, cu, max_seqlen, max_seqlen, causal=True).sum(-1)

    compiled = torch.compile(f, fullgraph=True, dynamic=True, backend="aot_eager")
    for lens in ([5, 17, 9], [30, 2], [11, 11, 11, 11]):
        cu = torch.tensor([0] + lens, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(device)
        q, k, v = (torch.randn(sum(lens), 4, 32, dtype=torch.float16, device=device) for _ in range(3))
        assert torch.equal(compiled(q, k, v, cu, max(lens)), f(q, k, v, cu, max(lens)))


@pytest.mark.skipif(not CUDA, reason=NO_CUDA)
def test_cuda_graph_capture_and_replay():
    """Forward and backward captured in one CUDA graph, replayed on new inputs: equal to eager."""
    shape = (2, 128, 8, 64)
    q, k, v = (torch.randn(shape, dtype=torch.bfloat16, device="cuda", requires_grad=True) for _ in range(3))
    dout = torch.randn(shape, dtype=torch.bfloat16, device="cuda")

    def step():
        out = flash_attn_func(q, k, v, causal=True)
        return (out, *torch.autograd.grad(out, (q, k, v), dout))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside the graph, on a side stream as capture requires
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()

    for _ in range(3):
        with torch.no_grad():
            for t in (q, k, v, dout):
                t.copy_(torch.randn_like(t))
        graph.replay()
        torch.cuda.synchronize()
        for got, want in zip(captured, step()):
            assert torch.equal(got, want)


@pytest.mark.skipif(not CUDA, reason=NO_CUDA)
def test_compile_reduce_overhead_uses_cuda_graphs():
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: flash_attn_func(q, k, v, causal=True), mode="reduce-overhead",
                             fullgraph=True)
    q, k, v = (torch.randn(2, 256, 8, 128, dtype=torch.float16, device="cuda") for _ in range(3))
    for _ in range(3):
        out = compiled(q, k, v)
    assert torch.equal(out, flash_attn_func(q, k, v, causal=True))


@pytest.mark.parametrize("device", DEVICES)
def test_eager_path_equals_the_registered_op(device):
    """flash_attn_func runs an autograd.Function in eager mode and torch.ops.flashattn.fwd otherwise:
    the two give bitwise the same outputs and gradients."""
    args = fwd_args(device)
    q, k, v = args[:3]
    out, lse = ops.attention(*args)
    assert type(out.grad_fn).__name__ == "_EagerAttentionBackward"
    out_op, lse_op = torch.ops.flashattn.fwd(*args)
    assert torch.equal(out, out_op) and torch.equal(lse, lse_op)
    dout = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), dout), torch.autograd.grad(out_op, (q, k, v), dout)):
        assert torch.equal(a, b)
