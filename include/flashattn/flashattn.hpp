// flashattn C++ API: the C ABI's params struct and entry points, with errors as a Status value.
#pragma once

#include <cmath>
#include <string>

#include "flashattn/flashattn.h"

namespace flashattn {

using Params = fa_params;
using Impl = fa_impl;
using DType = fa_dtype;

// The outcome of a call: ok() or a code with a message naming the offending argument.
struct Status {
  fa_status code = FA_OK;
  std::string message;
  bool ok() const { return code == FA_OK; }
  explicit operator bool() const { return ok(); }
};

inline Params default_params() {
  Params p;
  fa_params_init(&p);
  return p;
}

inline Status forward(const Params& p, Impl impl = FA_IMPL_AUTO) {
  fa_status s = fa_forward(&p, impl);
  return {s, s == FA_OK ? std::string() : std::string(fa_last_error())};
}

inline Status backward(const Params& p, Impl impl = FA_IMPL_AUTO) {
  fa_status s = fa_backward(&p, impl);
  return {s, s == FA_OK ? std::string() : std::string(fa_last_error())};
}

// The softmax scale actually used: softmax_scale, or 1/sqrt(head_dim) when it is 0.
inline float effective_scale(const Params& p) {
  return p.softmax_scale != 0.f ? p.softmax_scale : 1.f / std::sqrt(float(p.head_dim));
}

}  // namespace flashattn
