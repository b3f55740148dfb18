// Every invalid argument returns an error status whose message names the argument, through the C
// ABI, for the forward and the backward, on every CPU implementation; nothing aborts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "support/harness.hpp"

namespace {

// A valid fp16 problem in host memory: batch 2, seqlen_q 5, seqlen_k 7, 4 heads over 2 kv heads,
// head_dim 32, contiguous, with every backward tensor.
struct Buffers {
  std::vector<uint16_t> q, k, v, o, dout, dq, dk, dv;
  std::vector<float> lse;
  std::vector<int32_t> cu_q{0, 2, 5}, cu_k{0, 7, 14};
  std::vector<int32_t> used_k{7, 3};  // a KV cache's used keys (seqused_k)
  std::vector<int32_t> table{1, 2, 0, -1};  // a paged cache's table: 2 pages a sequence
  fa_params p;

  Buffers() {
    fa_params_init(&p);
    p.batch = 2;
    p.seqlen_q = 5;
    p.seqlen_k = 7;
    p.num_heads = 4;
    p.num_heads_kv = 2;
    p.head_dim = 32;
    p.dtype = FA_FLOAT16;
    fa_params_set_contiguous_strides(&p);
    const size_t nq = 2 * 5 * 4 * 32, nk = 2 * 7 * 2 * 32;
    for (auto* t : {&q, &o, &dout, &dq}) t->assign(nq, 0x3c00);  // 1.0
    for (auto* t : {&k, &v, &dk, &dv}) t->assign(nk, 0x3c00);
    lse.assign(2 * 4 * 5, 0.f);
    p.q = q.data();
    p.k = k.data();
    p.v = v.data();
    p.o = o.data();
    p.lse = lse.data();
    p.dout = dout.data();
    p.dq = dq.data();
    p.dk = dk.data();
    p.dv = dv.data();
  }
  // k and v as a paged cache of 3 pages of 4 rows (of the 14 there are), 2 a sequence; sequence 1
  // uses 3 keys, so its second entry (-1) is never read.
  void make_paged() {
    p.seqused_k = used_k.data();
    p.block_table = table.data();
    p.block_table_batch_stride = 2;
    p.page_block_size = 4;
    p.num_pages = 3;
    p.k_batch_stride = p.v_batch_stride = 4 * p.k_row_stride;
  }
  // Varlen view of the same memory: sequences of 2 and 3 queries, 7 and 7 keys.
  void make_varlen() {
    p.cu_seqlens_q = cu_q.data();
    p.cu_seqlens_k = cu_k.data();
    p.total_q = 5;
    p.total_k = 14;
  }
};

// Out-of-range enum values as a C caller passes them: plain ints, through the C signature (in C++
// an enum object holding such a value cannot even be formed without undefined behaviour).
using ForwardWithInt = fa_status (*)(const fa_params*, int);
using DtypeNameWithInt = const char* (*)(int);
void set_raw_dtype(fa_params& p, int value) {
  static_assert(sizeof(p.dtype) == sizeof(int));
  std::memcpy(&p.dtype, &value, sizeof value);
}

const fa_impl kCpuImpls[] = {FA_IMPL_CPU_REFERENCE, FA_IMPL_CPU_FA1, FA_IMPL_CPU_FA2};

bool has_backward(fa_impl impl) { return impl != FA_IMPL_CPU_FA1; }

// The call fails with `code` and a message containing every word of `names`.
void expect_error(fa_status got, fa_status code, std::initializer_list<const char*> names, const std::string& what) {
  const std::string message = fa_last_error();
  EXPECT_EQ(got, code) << what << ": got " << fa_status_name(got) << " (" << message << ")";
  for (const char* name : names) EXPECT_NE(message.find(name), std::string::npos) << what << ": message '" << message << "' does not name " << name;
}

// Applies `breakit` to a valid problem and expects the forward (and backward where the
// implementation has one) to fail with `code`, the message naming `names`.
void expect_rejected(const std::function<void(Buffers&)>& breakit, fa_status code, std::initializer_list<const char*> names,
                     bool forward = true, bool backward = true) {
  for (fa_impl impl : kCpuImpls) {
    if (forward) {
      Buffers b;
      breakit(b);
      expect_error(fa_forward(&b.p, impl), code, names, std::string("forward, ") + fa_impl_name(impl));
    }
    if (backward && has_backward(impl)) {
      Buffers b;
      breakit(b);
      expect_error(fa_backward(&b.p, impl), code, names, std::string("backward, ") + fa_impl_name(impl));
    }
  }
}

TEST(InvalidArguments, TheValidBaseProblemIsAccepted) {
  for (fa_impl impl : kCpuImpls) {
    Buffers b;
    EXPECT_EQ(fa_forward(&b.p, impl), FA_OK) << fa_last_error();
    EXPECT_STREQ(fa_last_error(), "");
    if (has_backward(impl)) {
      EXPECT_EQ(fa_backward(&b.p, impl), FA_OK) << fa_last_error();
    }
    b.make_varlen();
    EXPECT_EQ(fa_forward(&b.p, impl), FA_OK) << fa_last_error();
  }
}

TEST(InvalidArguments, NullParams) {
  for (fa_impl impl : kCpuImpls) {
    expect_error(fa_forward(nullptr, impl), FA_ERROR_INVALID_ARGUMENT, {"params"}, "forward");
    expect_error(fa_backward(nullptr, impl), FA_ERROR_INVALID_ARGUMENT, {"params"}, "backward");
    size_t bytes = 1;
    expect_error(fa_workspace_size(nullptr, impl, 0, &bytes), FA_ERROR_INVALID_ARGUMENT, {"params"}, "workspace");
  }
  Buffers b;
  expect_error(fa_workspace_size(&b.p, FA_IMPL_CPU_FA2, 0, nullptr), FA_ERROR_INVALID_ARGUMENT, {"bytes"}, "workspace bytes");
}

TEST(InvalidArguments, NullForwardTensors) {
  expect_rejected([](Buffers& b) { b.p.q = nullptr; }, FA_ERROR_INVALID_ARGUMENT, {"q"});
  expect_rejected([](Buffers& b) { b.p.k = nullptr; }, FA_ERROR_INVALID_ARGUMENT, {"k"});
  expect_rejected([](Buffers& b) { b.p.v = nullptr; }, FA_ERROR_INVALID_ARGUMENT, {"v"});
  expect_rejected([](Buffers& b) { b.p.o = nullptr; }, FA_ERROR_INVALID_ARGUMENT, {"o"});
}

TEST(InvalidArguments, NullBackwardTensors) {
  expect_rejected([](Buffers& b) { b.p.lse = nullptr; }, FA_ERROR_INVALID_ARGUMENT, {"lse"}, false);
  expect_rejected([](Buffers& b) { b.p.dout = nullptr; }, FA_ERROR_INVALID_ARGUMENT, {"dout"}, false);
  expect_rejected([](Buffers& b) { b.p.dq = nullptr; }, FA_ERROR_INVALID_ARGUMENT, {"dq"}, false);
  expect_rejected([](Buffers& b) { b.p.dk = nullptr; }, FA_ERROR_INVALID_ARGUMENT, {"dk"}, false);
  expect_rejected([](Buffers& b) { b.p.dv = nullptr; }, FA_ERROR_INVALID_ARGUMENT, {"dv"}, false);
}

TEST(InvalidArguments, ForwardWithoutLseIsAllowed) {
  for (fa_impl impl : kCpuImpls) {
    Buffers b;
    b.p.lse = nullptr;
    EXPECT_EQ(fa_forward(&b.p, impl), FA_OK) << fa_impl_name(impl) << ": " << fa_last_error();
  }
}

TEST(InvalidArguments, NegativeStrides) {
  expect_rejected([](Buffers& b) { b.p.q_row_stride = -128; }, FA_ERROR_INVALID_ARGUMENT, {"q_row_stride"});
  expect_rejected([](Buffers& b) { b.p.k_head_stride = -32; }, FA_ERROR_INVALID_ARGUMENT, {"k_head_stride"});
  expect_rejected([](Buffers& b) { b.p.v_batch_stride = -1; }, FA_ERROR_INVALID_ARGUMENT, {"v_batch_stride"});
  expect_rejected([](Buffers& b) { b.p.o_row_stride = -1; }, FA_ERROR_INVALID_ARGUMENT, {"o_row_stride"});
  expect_rejected([](Buffers& b) { b.p.do_row_stride = -1; }, FA_ERROR_INVALID_ARGUMENT, {"do_row_stride"}, false);
  expect_rejected([](Buffers& b) { b.p.dq_head_stride = -1; }, FA_ERROR_INVALID_ARGUMENT, {"dq_head_stride"}, false);
  expect_rejected([](Buffers& b) { b.p.dk_row_stride = -1; }, FA_ERROR_INVALID_ARGUMENT, {"dk_row_stride"}, false);
  expect_rejected([](Buffers& b) { b.p.dv_batch_stride = -1; }, FA_ERROR_INVALID_ARGUMENT, {"dv_batch_stride"}, false);
}

// Strides under which two elements of an output are one memory location: the output's own shape
// and strides disagree.
TEST(InvalidArguments, OutputStridesThatMakeElementsCollide) {
  expect_rejected([](Buffers& b) { b.p.o_head_stride = 0; }, FA_ERROR_INVALID_ARGUMENT, {"o", "overlap"}, true, false);
  expect_rejected([](Buffers& b) { b.p.o_head_stride = 16; }, FA_ERROR_INVALID_ARGUMENT, {"o", "overlap"}, true, false);
  expect_rejected([](Buffers& b) { b.p.o_row_stride = 32; }, FA_ERROR_INVALID_ARGUMENT, {"o", "overlap"}, true, false);
  expect_rejected([](Buffers& b) { b.p.dk_batch_stride = 0; }, FA_ERROR_INVALID_ARGUMENT, {"dk", "overlap"}, false);
  expect_rejected([](Buffers& b) { b.p.dq_row_stride = 0; }, FA_ERROR_INVALID_ARGUMENT, {"dq", "overlap"}, false);
}

TEST(InvalidArguments, InputsMayBroadcastWithZeroStrides) {
  for (fa_impl impl : kCpuImpls) {
    Buffers b;
    b.p.k_batch_stride = 0;  // both batches read the same keys
    b.p.v_head_stride = 0;
    EXPECT_EQ(fa_forward(&b.p, impl), FA_OK) << fa_impl_name(impl) << ": " << fa_last_error();
  }
}

TEST(InvalidArguments, HeadsNotAMultipleOfKvHeads) {
  expect_rejected([](Buffers& b) { b.p.num_heads_kv = 3; }, FA_ERROR_INVALID_ARGUMENT, {"num_heads", "num_heads_kv"});
  expect_rejected([](Buffers& b) { b.p.num_heads_kv = 8; }, FA_ERROR_INVALID_ARGUMENT, {"num_heads_kv"});
  expect_rejected([](Buffers& b) { b.p.num_heads = 0; }, FA_ERROR_INVALID_ARGUMENT, {"num_heads"});
  expect_rejected([](Buffers& b) { b.p.num_heads_kv = 0; }, FA_ERROR_INVALID_ARGUMENT, {"num_heads_kv"});
}

TEST(InvalidArguments, NegativeSizes) {
  expect_rejected([](Buffers& b) { b.p.batch = -1; }, FA_ERROR_INVALID_ARGUMENT, {"batch"});
  expect_rejected([](Buffers& b) { b.p.seqlen_q = -5; }, FA_ERROR_INVALID_ARGUMENT, {"seqlen_q"});
  expect_rejected([](Buffers& b) { b.p.seqlen_k = -7; }, FA_ERROR_INVALID_ARGUMENT, {"seqlen_k"});
}

TEST(InvalidArguments, HeadDimZero) {
  expect_rejected([](Buffers& b) { b.p.head_dim = 0; }, FA_ERROR_INVALID_ARGUMENT, {"head_dim"});
  expect_rejected([](Buffers& b) { b.p.head_dim = -32; }, FA_ERROR_INVALID_ARGUMENT, {"head_dim"});
}

TEST(InvalidArguments, HeadDimBeyondTheImplementationsMaximum) {
  expect_rejected([](Buffers& b) { b.p.head_dim = 2048; }, FA_ERROR_UNSUPPORTED, {"head_dim", "2048"});
  for (fa_impl impl : {FA_IMPL_CUDA_SM80, FA_IMPL_CUDA_SM90, FA_IMPL_CUDA_STANDARD}) {
    Buffers b;
    b.p.head_dim = 512;
    expect_error(fa_forward(&b.p, impl), FA_ERROR_UNSUPPORTED, {"head_dim", "512"}, fa_impl_name(impl));
  }
}

TEST(InvalidArguments, DecreasingCuSeqlens) {
  expect_rejected([](Buffers& b) { b.make_varlen(); b.cu_q = {0, 3, 2}; b.p.total_q = 2; }, FA_ERROR_INVALID_ARGUMENT,
                  {"cu_seqlens_q", "non-decreasing"});
  expect_rejected([](Buffers& b) { b.make_varlen(); b.cu_k = {0, 5, 3}; b.p.total_k = 3; }, FA_ERROR_INVALID_ARGUMENT,
                  {"cu_seqlens_k", "non-decreasing"});
}

TEST(InvalidArguments, CuSeqlensNotStartingAtZero) {
  expect_rejected([](Buffers& b) { b.make_varlen(); b.cu_q = {1, 2, 5}; }, FA_ERROR_INVALID_ARGUMENT, {"cu_seqlens_q"});
}

TEST(InvalidArguments, OnlyOneOfTheCuSeqlensSet) {
  expect_rejected([](Buffers& b) { b.make_varlen(); b.p.cu_seqlens_k = nullptr; }, FA_ERROR_INVALID_ARGUMENT, {"cu_seqlens_k"});
  expect_rejected([](Buffers& b) { b.make_varlen(); b.p.cu_seqlens_q = nullptr; }, FA_ERROR_INVALID_ARGUMENT, {"cu_seqlens_q"});
}

TEST(InvalidArguments, CuSeqlensLastEntryDiffersFromTotal) {
  expect_rejected([](Buffers& b) { b.make_varlen(); b.p.total_q = 4; }, FA_ERROR_INVALID_ARGUMENT, {"cu_seqlens_q", "total"});
  expect_rejected([](Buffers& b) { b.make_varlen(); b.p.total_k = 15; }, FA_ERROR_INVALID_ARGUMENT, {"cu_seqlens_k", "total"});
}

TEST(InvalidArguments, CuSeqlensSequenceLongerThanTheMaxSeqlen) {
  expect_rejected([](Buffers& b) { b.make_varlen(); b.p.seqlen_q = 2; }, FA_ERROR_INVALID_ARGUMENT, {"cu_seqlens_q", "seqlen"});
}

TEST(InvalidArguments, SequsedK) {
  for (fa_impl impl : kCpuImpls) {
    Buffers b;
    b.p.seqused_k = b.used_k.data();
    EXPECT_EQ(fa_forward(&b.p, impl), FA_OK) << fa_impl_name(impl) << ": " << fa_last_error();
  }
  expect_rejected([](Buffers& b) { b.p.seqused_k = b.used_k.data(); b.used_k[1] = 8; }, FA_ERROR_INVALID_ARGUMENT,
                  {"seqused_k[1]", "8", "seqlen_k"}, true, false);
  expect_rejected([](Buffers& b) { b.p.seqused_k = b.used_k.data(); b.used_k[0] = -1; }, FA_ERROR_INVALID_ARGUMENT,
                  {"seqused_k[0]"}, true, false);
  expect_rejected([](Buffers& b) { b.p.seqused_k = b.used_k.data(); b.make_varlen(); }, FA_ERROR_UNSUPPORTED,
                  {"seqused_k", "cu_seqlens"});
  expect_rejected([](Buffers& b) { b.p.seqused_k = b.used_k.data(); }, FA_ERROR_UNSUPPORTED, {"seqused_k", "backward"},
                  false, true);
}

TEST(InvalidArguments, PagedKvCache) {
  for (fa_impl impl : kCpuImpls) {
    Buffers b;
    b.make_paged();
    EXPECT_EQ(fa_forward(&b.p, impl), FA_OK) << fa_impl_name(impl) << ": " << fa_last_error();
  }
  expect_rejected([](Buffers& b) { b.make_paged(); b.p.page_block_size = 0; }, FA_ERROR_INVALID_ARGUMENT,
                  {"page_block_size"}, true, false);
  expect_rejected([](Buffers& b) { b.p.page_block_size = 16; }, FA_ERROR_INVALID_ARGUMENT, {"page_block_size", "block_table"});
  expect_rejected([](Buffers& b) { b.make_paged(); b.p.num_pages = 0; }, FA_ERROR_INVALID_ARGUMENT, {"num_pages"}, true, false);
  expect_rejected([](Buffers& b) { b.make_paged(); b.table[1] = 3; }, FA_ERROR_INVALID_ARGUMENT,
                  {"block_table[0][1]", "3", "num_pages"}, true, false);
  expect_rejected([](Buffers& b) { b.make_paged(); b.table[2] = -1; }, FA_ERROR_INVALID_ARGUMENT, {"block_table[1][0]"}, true,
                  false);
  expect_rejected([](Buffers& b) { b.make_paged(); b.p.block_table_batch_stride = 1; }, FA_ERROR_INVALID_ARGUMENT,
                  {"block_table_batch_stride"}, true, false);
  expect_rejected([](Buffers& b) { b.make_paged(); b.p.seqused_k = nullptr; b.make_varlen(); }, FA_ERROR_UNSUPPORTED,
                  {"block_table", "cu_seqlens"});
  expect_rejected([](Buffers& b) { b.make_paged(); b.p.seqused_k = nullptr; }, FA_ERROR_UNSUPPORTED, {"block_table", "backward"},
                  false, true);
  // o overlapping a page of the pool (the pool's memory made long enough to hold all of o: past it, o could
  // overlap q or another buffer, whichever the heap put there, and the message would name that one).
  expect_rejected([](Buffers& b) { b.make_paged(); b.k.resize(4096); b.p.k = b.k.data(); b.p.o = b.k.data() + 8 * 64; },
                  FA_ERROR_INVALID_ARGUMENT, {"o", "k"}, true, false);
}

TEST(InvalidArguments, AlibiSlopes) {
  static std::vector<float> slopes;
  for (fa_impl impl : kCpuImpls) {
    Buffers b;
    slopes = {0.5f, 0.25f, 0.f, 8.f, 1.f, 1.f, 1.f, 1.f};  // (batch 2, heads 4); a zero slope is no bias
    b.p.alibi_slopes = slopes.data();
    b.p.alibi_slopes_batch_stride = 4;
    EXPECT_EQ(fa_forward(&b.p, impl), FA_OK) << fa_impl_name(impl) << ": " << fa_last_error();
    if (has_backward(impl)) EXPECT_EQ(fa_backward(&b.p, impl), FA_OK) << fa_impl_name(impl) << ": " << fa_last_error();
  }
  expect_rejected([](Buffers& b) { slopes = {1, 1, 1, 1, 1, 1, 1, 1}; b.p.alibi_slopes = slopes.data(); b.p.alibi_slopes_batch_stride = -4; },
                  FA_ERROR_INVALID_ARGUMENT, {"alibi_slopes_batch_stride", "-4"});
  expect_rejected([](Buffers& b) { b.p.alibi_slopes = slopes.data(); b.p.alibi_slopes_batch_stride = 2; },
                  FA_ERROR_INVALID_ARGUMENT, {"alibi_slopes_batch_stride", "num_heads"});
  expect_rejected([](Buffers& b) { b.p.alibi_slopes_batch_stride = 4; }, FA_ERROR_INVALID_ARGUMENT,
                  {"alibi_slopes_batch_stride", "null"});
  expect_rejected([](Buffers& b) { slopes = {1, 1, 1, 1, 1, 1, std::nanf(""), 1}; b.p.alibi_slopes = slopes.data(); b.p.alibi_slopes_batch_stride = 4; },
                  FA_ERROR_INVALID_ARGUMENT, {"alibi_slopes[1][2]", "finite"});
  // ALiBi on the GPU: sm80 forward and backward, sm90 forward; a clear error from cuda-standard and the sm90
  // backward on any machine (arguments come before the device).
  Buffers b;
  slopes = {1, 1, 1, 1};
  b.p.alibi_slopes = slopes.data();
  expect_error(fa_forward(&b.p, FA_IMPL_CUDA_STANDARD), FA_ERROR_UNSUPPORTED, {"alibi_slopes", "cuda-standard"},
               "cuda-standard");
  expect_error(fa_backward(&b.p, FA_IMPL_CUDA_SM90), FA_ERROR_UNSUPPORTED, {"alibi_slopes", "flashattn-sm90"}, "sm90 backward");
}

TEST(InvalidArguments, LeftpadK) {
  for (fa_impl impl : kCpuImpls) {
    Buffers b;
    std::vector<int32_t> pad{2, 3};  // sequence 1 (3 used keys) padded to its end: no key
    b.p.seqused_k = b.used_k.data();
    b.p.leftpad_k = pad.data();
    EXPECT_EQ(fa_forward(&b.p, impl), FA_OK) << fa_impl_name(impl) << ": " << fa_last_error();
  }
  static std::vector<int32_t> pad;
  pad = {2, 4};  // past sequence 1's 3 used keys
  expect_rejected([](Buffers& b) { b.p.seqused_k = b.used_k.data(); b.p.leftpad_k = pad.data(); }, FA_ERROR_INVALID_ARGUMENT,
                  {"leftpad_k[1]", "4", "seqused_k"}, true, false);
  expect_rejected([](Buffers& b) { pad = {-1, 0}; b.p.leftpad_k = pad.data(); }, FA_ERROR_INVALID_ARGUMENT, {"leftpad_k[0]"},
                  true, false);
  expect_rejected([](Buffers& b) { pad = {8, 0}; b.p.leftpad_k = pad.data(); }, FA_ERROR_INVALID_ARGUMENT,
                  {"leftpad_k[0]", "seqlen_k"}, true, false);
  expect_rejected([](Buffers& b) { pad = {0, 0}; b.p.leftpad_k = pad.data(); b.make_varlen(); }, FA_ERROR_UNSUPPORTED,
                  {"leftpad_k", "cu_seqlens"});
  expect_rejected([](Buffers& b) { pad = {0, 0}; b.make_paged(); b.p.leftpad_k = pad.data(); }, FA_ERROR_UNSUPPORTED,
                  {"leftpad_k", "block_table"}, true, false);
  expect_rejected([](Buffers& b) { pad = {0, 0}; b.p.leftpad_k = pad.data(); }, FA_ERROR_UNSUPPORTED, {"leftpad_k", "backward"},
                  false, true);
}

TEST(InvalidArguments, WindowBelowMinusOne) {
  expect_rejected([](Buffers& b) { b.p.window_left = -2; }, FA_ERROR_INVALID_ARGUMENT, {"window_left"});
  expect_rejected([](Buffers& b) { b.p.window_right = -5; }, FA_ERROR_INVALID_ARGUMENT, {"window_right"});
}

TEST(InvalidArguments, NonFiniteScale) {
  expect_rejected([](Buffers& b) { b.p.softmax_scale = std::numeric_limits<float>::quiet_NaN(); }, FA_ERROR_INVALID_ARGUMENT,
                  {"softmax_scale"});
  expect_rejected([](Buffers& b) { b.p.softmax_scale = std::numeric_limits<float>::infinity(); }, FA_ERROR_INVALID_ARGUMENT,
                  {"softmax_scale"});
  expect_rejected([](Buffers& b) { b.p.softmax_scale = -std::numeric_limits<float>::infinity(); }, FA_ERROR_INVALID_ARGUMENT,
                  {"softmax_scale"});
}

TEST(InvalidArguments, NegativeOrNonFiniteSoftcap) {
  expect_rejected([](Buffers& b) { b.p.softcap = -1.f; }, FA_ERROR_INVALID_ARGUMENT, {"softcap"});
  expect_rejected([](Buffers& b) { b.p.softcap = std::numeric_limits<float>::quiet_NaN(); }, FA_ERROR_INVALID_ARGUMENT, {"softcap"});
  expect_rejected([](Buffers& b) { b.p.softcap = std::numeric_limits<float>::infinity(); }, FA_ERROR_INVALID_ARGUMENT, {"softcap"});
}

TEST(InvalidArguments, UnknownDtype) {
  expect_rejected([](Buffers& b) { set_raw_dtype(b.p, 7); }, FA_ERROR_INVALID_ARGUMENT, {"dtype"});
  expect_rejected([](Buffers& b) { set_raw_dtype(b.p, -1); }, FA_ERROR_INVALID_ARGUMENT, {"dtype"});
}

// The API validates arguments, dtype included, before it looks for a device: fp32 on the sm80
// kernels is unsupported on any machine.
TEST(InvalidArguments, DtypeTheImplementationLacks) {
  for (fa_impl impl : {FA_IMPL_CUDA_SM80, FA_IMPL_CUDA_SM90}) {
    Buffers b;
    b.p.dtype = FA_FLOAT32;
    expect_error(fa_forward(&b.p, impl), FA_ERROR_UNSUPPORTED, {"dtype", "fp32"}, fa_impl_name(impl));
  }
}

TEST(InvalidArguments, UnknownImplementation) {
  Buffers b;
  auto forward = reinterpret_cast<ForwardWithInt>(&fa_forward), backward = reinterpret_cast<ForwardWithInt>(&fa_backward);
  expect_error(forward(&b.p, 99), FA_ERROR_INVALID_ARGUMENT, {"impl"}, "forward");
  expect_error(backward(&b.p, -3), FA_ERROR_INVALID_ARGUMENT, {"impl"}, "backward");
}

TEST(InvalidArguments, BackwardOfAForwardOnlyImplementation) {
  Buffers b;
  expect_error(fa_backward(&b.p, FA_IMPL_CPU_FA1), FA_ERROR_UNSUPPORTED, {"backward"}, "fa1 backward");
}

TEST(InvalidArguments, NegativeExecutionSettings) {
  expect_rejected([](Buffers& b) { b.p.num_threads = -1; }, FA_ERROR_INVALID_ARGUMENT, {"num_threads"});
  expect_rejected([](Buffers& b) { b.p.cpu_cache_bytes = -1; }, FA_ERROR_INVALID_ARGUMENT, {"cpu_cache_bytes"});
  expect_rejected([](Buffers& b) { b.p.num_splits = -1; }, FA_ERROR_INVALID_ARGUMENT, {"num_splits"});
}

TEST(InvalidArguments, OutputAliasingAnInput) {
  expect_rejected([](Buffers& b) { b.p.o = b.q.data(); }, FA_ERROR_INVALID_ARGUMENT, {"o", "q", "overlaps"}, true, false);
  // k and o in one allocation, o starting inside k (and reaching past it into nothing else).
  expect_rejected(
      [](Buffers& b) {
        b.k.resize(4096);
        b.p.k = b.k.data();
        b.p.o = b.k.data() + 500;
      },
      FA_ERROR_INVALID_ARGUMENT, {"o", "k", "overlaps"}, true, false);
  expect_rejected([](Buffers& b) { b.p.dk = b.k.data(); }, FA_ERROR_INVALID_ARGUMENT, {"dk", "k", "overlaps"}, false);
  expect_rejected([](Buffers& b) { b.p.lse = reinterpret_cast<float*>(b.v.data()); }, FA_ERROR_INVALID_ARGUMENT,
                  {"lse", "v", "overlaps"}, true, false);
  expect_rejected([](Buffers& b) { b.p.dq = b.dout.data(); }, FA_ERROR_INVALID_ARGUMENT, {"dq", "dout", "overlaps"}, false);
  expect_rejected([](Buffers& b) { b.p.dv = b.o.data(); }, FA_ERROR_INVALID_ARGUMENT, {"dv", "o", "overlaps"}, false);
}

TEST(InvalidArguments, OutputsAliasingEachOther) {
  // Each aliasing output lies inside the other's memory (which is larger), so nothing else is hit.
  expect_rejected([](Buffers& b) { b.p.dk = b.dq.data(); }, FA_ERROR_INVALID_ARGUMENT, {"dq", "dk", "overlaps"}, false);
  expect_rejected([](Buffers& b) { b.p.dv = b.dq.data() + 64; }, FA_ERROR_INVALID_ARGUMENT, {"dq", "dv", "overlaps"}, false);
  expect_rejected([](Buffers& b) { b.p.lse = reinterpret_cast<float*>(b.o.data()); }, FA_ERROR_INVALID_ARGUMENT,
                  {"o", "lse", "overlaps"}, true, false);
}

TEST(InvalidArguments, CudaImplementationWithoutAGpu) {
  if (fa_test::cuda_present()) GTEST_SKIP() << "a GPU is present";
  for (fa_impl impl : {FA_IMPL_CUDA_SM80, FA_IMPL_CUDA_SM90, FA_IMPL_CUDA_STANDARD}) {
    Buffers b;
    expect_error(fa_forward(&b.p, impl), FA_ERROR_NO_DEVICE, {fa_impl_name(impl), "GPU"}, fa_impl_name(impl));
  }
  Buffers b;
  expect_error(fa_backward(&b.p, FA_IMPL_CUDA_SM80), FA_ERROR_NO_DEVICE, {"GPU"}, "sm80 backward");
}

TEST(InvalidArguments, ErrorMessageClearsAfterSuccess) {
  Buffers b;
  b.p.head_dim = 0;
  EXPECT_NE(fa_forward(&b.p, FA_IMPL_CPU_FA2), FA_OK);
  EXPECT_STRNE(fa_last_error(), "");
  b.p.head_dim = 32;
  EXPECT_EQ(fa_forward(&b.p, FA_IMPL_CPU_FA2), FA_OK);
  EXPECT_STREQ(fa_last_error(), "");
}

TEST(InvalidArguments, NamesOfEnumsAreReadable) {
  EXPECT_STREQ(fa_status_name(FA_ERROR_NO_DEVICE), "no device");
  EXPECT_STREQ(fa_impl_name(FA_IMPL_CPU_FA2), "cpu-fa2");
  EXPECT_STREQ(fa_dtype_name(FA_BFLOAT16), "bf16");
  EXPECT_STREQ(reinterpret_cast<DtypeNameWithInt>(&fa_dtype_name)(9), "unknown dtype");
}

}  // namespace
