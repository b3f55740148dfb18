// The softmax primitives of FlashAttention, host and device (CUDA) alike.
//
//   plain:  y_j = e^{x_j} / sum_k e^{x_k}                   overflows once some x_j > ~88 (fp32)
//   safe:   m = max x;  y_j = e^{x_j - m} / sum_k e^{x_k - m}  two passes, never overflows
//   online: one pass; a running state (m, l) with l = sum_k e^{x_k - m} over the x seen so far,
//           rescaled by e^{m_old - m_new} whenever the max grows (Milakov & Gimelshein 2018)
//   merge:  two states over disjoint parts of a row -> the state of the whole row; with the
//           unnormalized outputs o = sum_k e^{x_k - m} v_k, it merges partial attention outputs
//           (split-KV decoding, attention split across devices).
// A state that has seen only -inf (every key masked) is m = -inf, l = 0; lse() is then -inf and
// such a state merges as the identity. No exp of (-inf) - (-inf) is ever evaluated.
#pragma once

#include <cmath>
#include <limits>

#ifndef FA_HOST_DEVICE
#if defined(__CUDACC__)
#define FA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FA_HOST_DEVICE inline
#endif
#endif

namespace flashattn::softmax {

template <class T>
FA_HOST_DEVICE T neg_inf() {
  return -std::numeric_limits<T>::infinity();
}

// e^{a - b} for b >= a with the convention e^{-inf - (-inf)} = 0 (an empty state scales to 0).
template <class T>
FA_HOST_DEVICE T exp_diff(T a, T b) {
  return a == neg_inf<T>() ? T(0) : std::exp(a - b);
}

// y = softmax(x) as written, without the max: e^{x} overflows to inf for large x (inf/inf = NaN).
template <class T>
FA_HOST_DEVICE void plain(const T* x, int n, T* y) {
  T l = 0;
  for (int j = 0; j < n; ++j) l += (y[j] = std::exp(x[j]));
  for (int j = 0; j < n; ++j) y[j] /= l;
}

// y = softmax(x), max subtracted first. All -inf (every key masked): y = 0.
template <class T>
FA_HOST_DEVICE void safe(const T* x, int n, T* y) {
  T m = neg_inf<T>();
  for (int j = 0; j < n; ++j) m = x[j] > m ? x[j] : m;
  T l = 0;
  for (int j = 0; j < n; ++j) l += (y[j] = exp_diff(x[j], m));
  for (int j = 0; j < n; ++j) y[j] = l > 0 ? y[j] / l : T(0);
}

// The running state of the online softmax of one row.
template <class T>
struct State {
  T m = neg_inf<T>();  // max of the x seen
  T l = 0;             // sum of e^{x - m} over the x seen

  // Adds one score x.
  FA_HOST_DEVICE void update(T x) {
    if (x == neg_inf<T>()) return;
    T m_new = x > m ? x : m;
    l = l * exp_diff(m, m_new) + std::exp(x - m_new);
    m = m_new;
  }
  // log(sum e^x) over the x seen; -inf when nothing (finite) was seen.
  FA_HOST_DEVICE T lse() const { return l > 0 ? m + std::log(l) : neg_inf<T>(); }
  // softmax probability of score x under the final state.
  FA_HOST_DEVICE T prob(T x) const { return l > 0 ? exp_diff(x, m) / l : T(0); }
};

// The state of a row from the states of two disjoint parts of it.
template <class T>
FA_HOST_DEVICE State<T> merge(const State<T>& a, const State<T>& b) {
  State<T> r;
  r.m = a.m > b.m ? a.m : b.m;
  r.l = a.l * exp_diff(a.m, r.m) + b.l * exp_diff(b.m, r.m);
  return r;
}

// Merges the unnormalized outputs too: o = o_a e^{m_a - m} + o_b e^{m_b - m} (n elements, into o_a),
// and returns the merged state. The attention output of the whole row is o / l.
template <class T>
FA_HOST_DEVICE State<T> merge(const State<T>& a, T* o_a, const State<T>& b, const T* o_b, int n) {
  State<T> r = merge(a, b);
  const T sa = exp_diff(a.m, r.m), sb = exp_diff(b.m, r.m);
  for (int c = 0; c < n; ++c) o_a[c] = o_a[c] * sa + o_b[c] * sb;
  return r;
}

}  // namespace flashattn::softmax
