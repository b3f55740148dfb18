"""ctypes view of the C ABI (include/flashattn/flashattn.h) for benchmark scripts.

Only what the benchmarks need: the params struct, the entry points, and a helper that fills the
params from torch tensors of layout (batch, seqlen, heads, head_dim).
"""
import ctypes
import os

FA_FLOAT32, FA_FLOAT16, FA_BFLOAT16 = 0, 1, 2
IMPL = {"auto": 0, "cpu-reference": 1, "cpu-fa1": 2, "cpu-fa2": 3, "cuda-standard": 4,
        "flashattn-sm80": 5, "flashattn-sm90": 6}

_i64, _i32, _vp, _f = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p, ctypes.c_float


def _strides(prefix):
    return [(f"{prefix}_batch_stride", _i64), (f"{prefix}_row_stride", _i64), (f"{prefix}_head_stride", _i64)]


class Params(ctypes.Structure):
    _fields_ = ([("q", _vp), ("k", _vp), ("v", _vp), ("o", _vp), ("lse", _vp)]
                + _strides("q") + _strides("k") + _strides("v") + _strides("o")
                + [("dout", _vp), ("dq", _vp), ("dk", _vp), ("dv", _vp)]
                + _strides("do") + _strides("dq") + _strides("dk") + _strides("dv")
                + [("batch", _i32), ("seqlen_q", _i32), ("seqlen_k", _i32), ("num_heads", _i32),
                   ("num_heads_kv", _i32), ("head_dim", _i32),
                   ("cu_seqlens_q", _vp), ("cu_seqlens_k", _vp), ("total_q", _i64), ("total_k", _i64),
                   ("dtype", ctypes.c_int), ("softmax_scale", _f), ("causal", _i32),
                   ("window_left", _i32), ("window_right", _i32), ("softcap", _f), ("deterministic", _i32),
                   ("stream", _vp), ("workspace", _vp), ("workspace_bytes", ctypes.c_size_t),
                   ("num_threads", _i32), ("cpu_cache_bytes", _i64), ("num_splits", _i32),
                   ("seqused_k", _vp),
                   ("block_table", _vp), ("block_table_batch_stride", _i64), ("page_block_size", _i32),
                   ("num_pages", _i32), ("leftpad_k", _vp),
                   ("alibi_slopes", _vp), ("alibi_slopes_batch_stride", _i64),
                   ("dropout_p", _f), ("dropout_seed", ctypes.c_uint64), ("dropout_offset", ctypes.c_uint64)])


def load(path=None):
    path = path or os.environ.get("FLASHATTN_LIBRARY", "build/libflashattn.so")
    lib = ctypes.CDLL(path)
    lib.fa_params_init.argtypes = [ctypes.POINTER(Params)]
    for name in ("fa_forward", "fa_backward"):
        getattr(lib, name).argtypes = [ctypes.POINTER(Params), ctypes.c_int]
        getattr(lib, name).restype = ctypes.c_int
    lib.fa_workspace_size.argtypes = [ctypes.POINTER(Params), ctypes.c_int, ctypes.c_int,
                                      ctypes.POINTER(ctypes.c_size_t)]
    lib.fa_workspace_size.restype = ctypes.c_int
    lib.fa_last_error.restype = ctypes.c_char_p
    return lib


def load_named(specs):
    """Several builds side by side (the A/B scripts): "NAME=LIB,NAME=LIB" -> {name: library}, in order."""
    return {name: load(path) for name, _, path in (spec.partition("=") for spec in specs.split(","))}


def _set(p, prefix, t):
    b, s, h, _ = t.stride()
    setattr(p, f"{prefix}_batch_stride", b)
    setattr(p, f"{prefix}_row_stride", s)
    setattr(p, f"{prefix}_head_stride", h)


def params_from(torch, q, k, v, o, lse, causal=False, dout=None, dq=None, dk=None, dv=None, **extra):
    """fa_params for (batch, seqlen, heads, head_dim) torch tensors on one device."""
    p = Params()
    p.q, p.k, p.v, p.o = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr()
    p.lse = lse.data_ptr() if lse is not None else None
    for name, t in (("q", q), ("k", k), ("v", v), ("o", o), ("do", dout), ("dq", dq), ("dk", dk), ("dv", dv)):
        if t is not None:
            _set(p, name, t)
    if dout is not None:
        p.dout, p.dq, p.dk, p.dv = dout.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr()
    p.batch, p.seqlen_q, p.num_heads, p.head_dim = q.shape
    p.seqlen_k, p.num_heads_kv = k.shape[1], k.shape[2]
    p.dtype = {torch.float32: FA_FLOAT32, torch.float16: FA_FLOAT16, torch.bfloat16: FA_BFLOAT16}[q.dtype]
    p.causal = int(causal)
    p.window_left = p.window_right = -1
    if q.is_cuda:
        p.stream = torch.cuda.current_stream().cuda_stream
    for key, val in extra.items():
        setattr(p, key, val)
    return p


def check(lib, status, what):
    if status != 0:
        raise RuntimeError(f"{what}: status {status}: {lib.fa_last_error().decode()}")
