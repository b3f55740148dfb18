// Argument checks shared by every implementation: each failure names the argument.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/status.hpp"

namespace flashattn {

enum class Pass { Forward, Backward };

// The integer a C caller stored in an enum argument or field, read as bytes: loading an enum
// object that holds a value outside the enumerators' range is undefined behaviour in C++.
template <class E>
int64_t enum_value(const E& e) {
  std::underlying_type_t<E> v;
  std::memcpy(&v, &e, sizeof v);
  return int64_t(v);
}

// impl is one of the fa_impl enumerators.
Status check_impl_value(const fa_impl& impl);

struct ImplLimits {
  int max_head_dim;
  bool fp32, fp16, bf16;
  bool backward;
  bool host_memory;  // pointers must be host memory (the CPU backend); else device memory
  bool seqused_k;    // takes a KV cache's used lengths (fa_params::seqused_k)
  bool paged_kv;     // takes a paged or left-padded KV cache (fa_params::block_table, leftpad_k)
  bool alibi;           // takes ALiBi slopes (fa_params::alibi_slopes) in the forward pass
  bool alibi_backward;  // ... and in the backward pass
  bool dropout;         // takes dropout (fa_params::dropout_p > 0), forward and backward
  bool dropout_alibi;   // ... together with ALiBi
  int alibi_backward_from = 0;  // alibi_backward false: the backward takes ALiBi from this head_dim on (0: never)
};

ImplLimits impl_limits(fa_impl impl);

// Checks everything that can be checked without touching tensor memory, plus cu_seqlens when
// the implementation runs on the host.
Status validate(const fa_params* p, Pass pass, fa_impl impl);

}  // namespace flashattn
