"""ctypes view of the C ABI (include/flashattn/flashattn.h): the library, fa_params, the calls.

Nothing here is compiled against libtorch, so a torch upgrade cannot break the binding with
undefined symbols. The library is found, in order, at
  1. $FLASHATTN_LIBRARY (a path to libflashattn.so),
  2. flashattn_torch/lib/libflashattn.so (what `pip install .` packs into the wheel),
  3. <repo>/build/libflashattn.so (running from a source checkout after `cmake --build build`).
"""

import ctypes
import os
from pathlib import Path

# fa_status
FA_OK = 0
# fa_dtype
FA_FLOAT32, FA_FLOAT16, FA_BFLOAT16 = 0, 1, 2
# fa_impl, by the names fa_impl_name() gives them
IMPLS = {"auto": 0, "cpu-reference": 1, "cpu-fa1": 2, "cpu-fa2": 3, "cuda-standard": 4, "flashattn-sm80": 5,
         "flashattn-sm90": 6}
FA_IMPL_AUTO = 0

_i32, _i64, _f32, _ptr = ctypes.c_int32, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p


def _strides(name):
    return [(f"{name}_batch_stride", _i64), (f"{name}_row_stride", _i64), (f"{name}_head_stride", _i64)]


class FaParams(ctypes.Structure):
    """fa_params, field for field (C layout rules give the same padding)."""

    _fields_ = (
        [("q", _ptr), ("k", _ptr), ("v", _ptr), ("o", _ptr), ("lse", _ptr)]
        + _strides("q") + _strides("k") + _strides("v") + _strides("o")
        + [("dout", _ptr), ("dq", _ptr), ("dk", _ptr), ("dv", _ptr)]
        + _strides("do") + _strides("dq") + _strides("dk") + _strides("dv")
        + [("batch", _i32), ("seqlen_q", _i32), ("seqlen_k", _i32), ("num_heads", _i32),
           ("num_heads_kv", _i32), ("head_dim", _i32)]
        + [("cu_seqlens_q", _ptr), ("cu_seqlens_k", _ptr), ("total_q", _i64), ("total_k", _i64)]
        + [("dtype", ctypes.c_int), ("softmax_scale", _f32), ("causal", _i32), ("window_left", _i32),
           ("window_right", _i32), ("softcap", _f32), ("deterministic", _i32)]
        + [("stream", _ptr), ("workspace", _ptr), ("workspace_bytes", ctypes.c_size_t),
           ("num_threads", _i32), ("cpu_cache_bytes", _i64), ("num_splits", _i32)]
        + [("seqused_k", _ptr)]
        + [("block_table", _ptr), ("block_table_batch_stride", _i64), ("page_block_size", _i32), ("num_pages", _i32)]
        + [("leftpad_k", _ptr)]
        + [("alibi_slopes", _ptr), ("alibi_slopes_batch_stride", _i64)]
        + [("dropout_p", _f32), ("dropout_seed", ctypes.c_uint64), ("dropout_offset", ctypes.c_uint64)]
    )


class FlashAttnError(RuntimeError):
    """An error reported by the library; the message is fa_last_error()'s."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def _candidates():
    env = os.environ.get("FLASHATTN_LIBRARY")
    if env:
        return [Path(env)]  # an explicit choice is never silently replaced by another library
    here = Path(__file__).resolve().parent
    return [here / "lib" / "libflashattn.so", here.parents[2] / "build" / "libflashattn.so"]


def _load():
    tried = []
    for path in _candidates():
        if path.is_file():
            lib = ctypes.CDLL(str(path))
            lib._path = str(path)
            return lib
        tried.append(str(path))
    raise ImportError(
        "flashattn_torch: libflashattn.so not found (tried: " + ", ".join(tried) + "). Install the package "
        "with `pip install .` at the repository root, or build the library (cmake -S . -B build && cmake "
        "--build build --target flashattn) and/or set FLASHATTN_LIBRARY=/path/to/libflashattn.so."
    )


lib = _load()
_P = ctypes.POINTER(FaParams)
lib.fa_params_init.argtypes, lib.fa_params_init.restype = [_P], None
lib.fa_forward.argtypes, lib.fa_forward.restype = [_P, ctypes.c_int], ctypes.c_int
lib.fa_backward.argtypes, lib.fa_backward.restype = [_P, ctypes.c_int], ctypes.c_int
lib.fa_workspace_size.argtypes = [_P, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_size_t)]
lib.fa_workspace_size.restype = ctypes.c_int
lib.fa_last_error.argtypes, lib.fa_last_error.restype = [], ctypes.c_char_p
lib.fa_status_name.argtypes, lib.fa_status_name.restype = [ctypes.c_int], ctypes.c_char_p
lib.fa_cuda_available.argtypes, lib.fa_cuda_available.restype = [], ctypes.c_int

library_path = lib._path

# $FLASHATTN_IMPL forces one implementation (e.g. cpu-reference to cross-check); default auto: CPU
# tensors on the CPU FA2, CUDA tensors on the best kernel for the GPU.
_impl_name = os.environ.get("FLASHATTN_IMPL", "auto")
if _impl_name not in IMPLS:
    raise ImportError(f"FLASHATTN_IMPL={_impl_name!r} is not one of: {', '.join(IMPLS)}")
impl = IMPLS[_impl_name]


def check(status):
    """Raises FlashAttnError with the library's message unless status is FA_OK."""
    if status != FA_OK:
        name = lib.fa_status_name(status).decode()
        raise FlashAttnError(status, f"flashattn: {name}: {lib.fa_last_error().decode()}")


def new_params():
    p = FaParams()
    lib.fa_params_init(ctypes.byref(p))
    return p


def workspace_size(p, impl, backward):
    n = ctypes.c_size_t(0)
    check(lib.fa_workspace_size(ctypes.byref(p), impl, int(backward), ctypes.byref(n)))
    return n.value


def cuda_available():
    return bool(lib.fa_cuda_available())
