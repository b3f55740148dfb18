// Entry points of the CUDA kernel families, called by the dispatcher (backend.cu).
// Each validates what is specific to it (head_dim, dtype), sizes its workspace, and launches on
// p.stream without host synchronization or allocation.
#pragma once

#include <cstddef>

#include "common/status.hpp"

namespace flashattn::cuda {

// Standard attention: S = QK^T and O = PV through cuBLAS, a softmax kernel between. The workspace
// holds S (fp32) and P (the input dtype), batch * num_heads * seqlen_q * seqlen_k each, and is the O(N^2) memory of the seeds.
size_t standard_forward_workspace(const fa_params& p);
Status standard_forward(const fa_params& p);

// FA2 on mma.sync (sm_80 and later). The forward's workspace is for split-KV partials; the
// backward's holds D = rowsum(dO * O) and the fp32 dQ accumulator.
size_t sm80_forward_workspace(const fa_params& p);
Status sm80_forward(const fa_params& p);
int sm80_forward_splits(const fa_params& p);  // key splits sm80_forward would run p with (1: none)
// Whether p is a decode step for it: the query rows (a kv head's group of heads, for one row) fit
// its decode config's tile (fwd_config.cuh), over 16 key blocks or more.
bool sm80_forward_decode(const fa_params& p);
size_t sm80_backward_workspace(const fa_params& p);
Status sm80_backward(const fa_params& p);

// Hopper forward (TMA + wgmma + warp specialization, sm_90a). sm90_supports says whether this
// problem (dtype, head_dim, device) has a kernel; otherwise the dispatcher uses sm80.
bool sm90_supports(const fa_params& p);
bool sm90_forward_fills_gpu(const fa_params& p);  // whether its tiles give every SM one (whole tiles: its split
                                                  // of the last round is in one head_dim 128 kernel only)
size_t sm90_forward_workspace(const fa_params& p);
Status sm90_forward(const fa_params& p);

// Hopper backward: the sm80 backward with a wgmma main kernel for kernel head dims 64 and 128
// (sm90/bwd_kernel.cuh), 192 and 256 (sm90/bwd_wide_kernel.cuh); sm80/bwd_launch.cu.
// sm90_backward_supports: whether this build has one for p (with ALiBi: a wide kernel, head_dim 129..256).
bool sm90_backward_supports(const fa_params& p);
size_t sm90_backward_workspace(const fa_params& p);
Status sm90_backward(const fa_params& p);

}  // namespace flashattn::cuda
