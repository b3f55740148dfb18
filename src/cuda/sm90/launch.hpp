// Declarations shared by the Hopper forward's dispatcher (launch.cu), its instantiations and the Hopper
// backward (bwd_run.cuh: the Q, dO tensor maps).
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

#include "common/status.hpp"

namespace flashattn::cuda::sm90 {

// A 4D tensor map (head_dim, rows, heads, batch) over a (batch, rows, heads, head_dim) tensor
// with element strides, boxes of (64 columns, box_rows rows), 128-byte swizzle, zero fill
// out of bounds.
Status make_tensor_map(CUtensorMap* map, const void* base, bool bf16, int head_dim, int64_t rows, int heads,
                       int batch, int64_t row_stride, int64_t head_stride, int64_t batch_stride, int box_rows);

template <int kHeadDim, bool kBf16>
Status run_fwd(const fa_params& p);

// Bytes of workspace run_fwd uses on num_sms SMs (the last round's split, launch_template.cuh).
template <int kHeadDim, bool kBf16>
size_t fwd_workspace(const fa_params& p, int num_sms);

}  // namespace flashattn::cuda::sm90
