"""flashattn for PyTorch: the flash_attn API on this library's CPU and CUDA backends.

    from flashattn_torch import flash_attn_func   # instead of: from flash_attn import flash_attn_func

CPU tensors run on the CPU FA2 backend (fp32, fp16, bf16); CUDA tensors on the CUDA backend.
The operators are torch.ops.flashattn.fwd / .bwd (torch.compile and CUDA-graph safe).
"""

from . import ops
from ._lib import FlashAttnError, cuda_available, library_path
from .interface import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
)

__version__ = "0.1.0"

__all__ = [
    "FlashAttnError",
    "cuda_available",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "library_path",
    "ops",
]
