// The CPU backend: the fp64 reference (the oracle of every test), FA1 and FA2.
// Arguments were validated by the API layer before any of these runs.
#pragma once

#include "common/status.hpp"

namespace flashattn::cpu {

Status reference_forward(const fa_params& p);
Status reference_backward(const fa_params& p);
Status fa1_forward(const fa_params& p);
Status fa2_forward(const fa_params& p);
Status fa2_backward(const fa_params& p);

// Block sizes from the paper's rule for an on-chip budget of M bytes:
// B_c = ceil(M / 4d), B_r = min(B_c, d) (counted in fp32 elements, clamped to >= 1).
struct BlockSizes {
  int block_r, block_c;
};
BlockSizes block_sizes(int64_t cache_bytes, int head_dim);

// The core's L2 size in bytes (the default M), read from the OS; 1 MiB when unknown.
int64_t l2_cache_bytes();

}  // namespace flashattn::cpu
