// Argument checks shared by every implementation: each failure names the argument.
#pragma once

#include "common/status.hpp"

namespace flashattn {

enum class Pass { Forward, Backward };

struct ImplLimits {
  int max_head_dim;
  bool fp32, fp16, bf16;
  bool backward;
  bool host_memory;  // pointers must be host memory (the CPU backend); else device memory
};

ImplLimits impl_limits(fa_impl impl);

// Checks everything that can be checked without touching tensor memory, plus cu_seqlens when
// the implementation runs on the host.
Status validate(const fa_params* p, Pass pass, fa_impl impl);

}  // namespace flashattn
