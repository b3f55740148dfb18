// The test harness every implementation is checked with, CPU and CUDA alike.
//
// One check = fresh random inputs (normal, seeded) rounded to the dtype, outputs poisoned with NaN
// bytes, the implementation run with its tensors in host or device memory, then compared with
//   - the oracle: FA_IMPL_CPU_REFERENCE (accumulates in double) on fp32 copies of the rounded inputs;
//   - the plain implementation (plain.hpp): standard attention in the input's precision, as PyTorch
//     would compute it, whose error against the oracle sets the bound.
// The rule of the anchor suite: max|out - ref| <= 2 * max|plain - ref| + atol (gradients: 3x), atol
// the dtype's rounding at the magnitude of ref; NaN never passes; every output element must be
// written; memory beside a strided view must stay untouched.
//
// Seeds: each check draws a fresh seed (random_device mixed with the case name) unless one is given
// or FA_TEST_SEED is set in the environment; a failure prints the seed to reproduce it.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "flashattn/flashattn.h"

namespace fa_test {

enum class Space { Host, Cuda };  // where the tensors live for the implementation under test

struct Case {  // one problem
  int batch = 1, seqlen_q = 1, seqlen_k = 1, num_heads = 1, num_heads_kv = 1, head_dim = 64;
  fa_dtype dtype = FA_FLOAT16;
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.f;
  float softmax_scale = 0.f;
  std::vector<int> seqlens_q, seqlens_k;  // non-empty: varlen (packed) with these lengths (may contain 0)
  std::vector<int> seqused_k;             // non-empty: a KV cache's used keys per sequence (the rest are NaN)
  int page_block_size = 0;                // > 0: k and v as a paged KV cache of pages of this many rows
  std::vector<int> leftpad_k;             // non-empty: a left-padded cache, keys from these rows (those before NaN)
  int alibi = 0;                          // ALiBi slopes: 0 none, 1 one per head, 2 one per (sequence, head)
  float alibi_max_slope = 1.f;            // the first head's slope (the others halve it, as in the paper)
  float dropout_p = 0.f;                  // dropout (fa_params::dropout_p; offset kDropoutOffset)
  uint64_t dropout_seed = 0;
  bool bhsd = false;                      // memory laid out (batch, heads, seqlen, head_dim)
  int row_padding = 0;                    // extra elements after each head vector and each row
  bool deterministic = false;
  int num_splits = 0;           // CUDA forward split-KV (0 heuristic, 1 off, n splits)
  int64_t cpu_cache_bytes = 0;  // CPU block-size budget M (small values force many blocks)
  int num_threads = 0;          // CPU threads (0: every core)
  std::string name() const;     // readable, for test names / messages
};

// A Case with these sizes and dtype, every other field at its default.
Case make_case(fa_dtype dtype, int batch, int seqlen_q, int seqlen_k, int num_heads, int num_heads_kv, int head_dim);
// c as a varlen batch of these sequence lengths (batch and the maxima from them).
Case varlen(Case c, std::vector<int> seqlens_q, std::vector<int> seqlens_k);

// gtest prints a Case parameter by its name.
inline void PrintTo(const Case& c, std::ostream* os) { *os << c.name(); }

// Built with CUDA and a GPU exists.
bool cuda_present();
// ... and it is an sm_90 GPU (H100 / H200): the Hopper kernels run.
bool hopper_present();

// Skips the current test when no GPU is usable (use at the top of CUDA tests).
#define FA_SKIP_WITHOUT_CUDA() \
  if (!::fa_test::cuda_present()) GTEST_SKIP() << "no CUDA GPU (or this build has no CUDA)"

// Forward: o (and lse) against the reference by the rule; every element written, lse -inf exactly
// where the reference's is, fully masked rows exactly 0.
::testing::AssertionResult check_forward(const Case&, fa_impl impl, Space space, uint64_t seed = 0);
// Forward with impl, then backward from its o and lse; dq, dk, dv against the reference gradient (3x).
::testing::AssertionResult check_backward(const Case&, fa_impl impl, Space space, uint64_t seed = 0);
// Backward twice on the same inputs: dq, dk, dv bit-identical.
::testing::AssertionResult check_backward_deterministic(const Case&, fa_impl impl, Space space, uint64_t seed = 0);

// The awkward-shape lists every implementation is tested on (head dims, seqlens, masks, GQA/MQA,
// varlen with zero-length sequences, strided views), limited to head_dim <= max_head_dim.
std::vector<Case> standard_forward_cases(fa_dtype dtype, int max_head_dim);
// KV-cache forwards (fa_params::seqused_k): used lengths of all, none and some keys of a padded cache,
// causal (rows above the shortest cache's diagonal fully masked), windowed, GQA, split across CTAs.
std::vector<Case> kv_cache_cases(fa_dtype dtype);
// Left-padded KV caches (fa_params::leftpad_k): decode, GQA causal chunks, windowed, split, with and
// without used lengths, a sequence padded to its end (no key).
std::vector<Case> leftpad_kv_cases(fa_dtype dtype);
// Paged KV-cache forwards (fa_params::block_table) with each of these page sizes: pages shuffled in
// a pool with spare NaN pages, table entries past the used keys -1; decode, GQA, causal, windowed,
// split, a strided (bhsd, padded) pool, sequences of 0 used keys and of lengths off the page size.
std::vector<Case> paged_kv_cases(fa_dtype dtype, const std::vector<int>& page_sizes);
// ALiBi (fa_params::alibi_slopes): one slope per head and per (sequence, head), s_q != s_k, causal,
// windowed with softcap, GQA, varlen, slopes large enough that the bias dominates the scores, one
// key; backward = false adds the KV-cache forms (a decode step over used and left-padded keys).
std::vector<Case> alibi_cases(fa_dtype dtype, bool backward);
// Dropout (fa_params::dropout_p): light and heavy, causal, GQA, varlen, with softcap and ALiBi.
std::vector<Case> dropout_cases(fa_dtype dtype);
constexpr uint64_t kDropoutOffset = 12345;
std::vector<Case> standard_backward_cases(fa_dtype dtype, int max_head_dim);

// A gtest parameter name for a case: the name with every non-alphanumeric character made '_'.
std::string test_name(const std::string& readable);

}  // namespace fa_test
