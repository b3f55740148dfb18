// A problem of the CLI: the flags that fill fa_params, and the tensors of one run on a device
// (random inputs, NaN-poisoned outputs, the fp32 copies the fp64 reference reads).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "device.hpp"
#include "flashattn/flashattn.hpp"

namespace CLI {
class App;
}

namespace fa_cli {

// A flag the user got wrong: main() prints the message and exits with 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Every field of fa_params the user chooses (pointers, strides, the workspace and the stream
// are set by the tool from these).
struct ProblemSpec {
  int batch = 32;
  int seqlen_q = 512, seqlen_k = 512;
  int heads = 16, heads_kv = 0;  // heads_kv 0: = heads
  int head_dim = 64;
  std::string dtype;             // fp32 | fp16 | bf16; empty: fp32 on the CPU, fp16 on the GPU
  bool causal = true;
  int window_left = -1, window_right = -1;
  float softcap = 0, scale = 0;
  bool alibi = false;  // ALiBi with the paper's slopes 2^(-8 (h + 1) / heads)
  float dropout = 0;   // dropout probability of P (fa_params::dropout_p)
  uint64_t dropout_seed = 0;  // dropout's seed (offset 0)
  int threads = 0;
  std::string cache_bytes = "0";  // M for the CPU block sizes; accepts K/M/KiB/MiB suffixes
  bool deterministic = false;
  int splits = 0;
  std::string layout = "bshd";    // bshd (row-major (b, s, h, d)) | bhsd (heads outer)
  std::vector<int> varlen_q, varlen_k;  // per-sequence lengths: varlen mode (packed rows)
  uint64_t seed = 0;
};

// Flags of the fields that are not shapes (masks, scale, execution, layout); `run` adds the
// shape flags itself, `bench` takes lists of shapes.
void add_param_flags(CLI::App* app, ProblemSpec& s);

fa_dtype parse_dtype(const std::string& name);  // throws UsageError
int64_t parse_bytes(const std::string& text, const char* flag);  // "1M", "228KiB", "4096"

// fa_params without pointers from the spec; checks what the library would reject as a bad
// flag (throws UsageError naming the flag).
fa_params make_params(const ProblemSpec& s, fa_dtype dtype);

// Elements of the q-side / k-side tensors as laid out by the spec.
int64_t q_elements(const fa_params& p);
int64_t k_elements(const fa_params& p);

// The tensors of one problem on one device. Inputs are random N(0, 1), rounded to the dtype;
// `host_*` keep their fp32 values in the same layout (the reference reads those).
struct Tensors {
  Device dev = Device::Cpu;
  fa_params p{};  // pointers set to the buffers below
  Buffer q, k, v, o, lse, dout, dq, dk, dv, cu_q, cu_k, alibi;
  std::vector<float> host_q, host_k, host_v, host_dout, host_alibi;  // host_alibi: one slope a head (--alibi)
  std::vector<int32_t> host_cu_q, host_cu_k;

  Tensors(Device dev, const fa_params& shape, const ProblemSpec& s, bool backward);
  void poison_outputs();                  // o, lse, dq, dk, dv = NaN
  std::vector<float> download_o() const;  // o in fp32, in o's layout
  std::vector<float> download(const Buffer& b) const;  // any dtype tensor (o, dq, dk, dv) in fp32
  std::vector<float> download_lse() const;
  int64_t lse_elements() const;
};

// fa_params of the fp64 reference on the fp32 copies of t's inputs, writing o_ref / lse_ref
// (same layout as t), restricted to the first `batch` sequences (not varlen).
fa_params reference_params(const Tensors& t, std::vector<float>& o_ref, std::vector<float>& lse_ref, int batch);
// The reference backward on the same copies: dout from t, o / lse from the reference forward
// (o_ref, lse_ref), writing dq_ref, dk_ref, dv_ref. t must hold the backward tensors.
fa_params reference_backward_params(const Tensors& t, std::vector<float>& o_ref, std::vector<float>& lse_ref,
                                    std::vector<float>& dq_ref, std::vector<float>& dk_ref, std::vector<float>& dv_ref,
                                    int batch);

// Max |a - b| over the elements of the o-side layout of p (first `batch` sequences), and how
// many elements of `a` are not finite.
struct Diff {
  double max_abs = 0;
  int64_t non_finite = 0;
};
Diff compare_o(const fa_params& p, const std::vector<float>& a, const std::vector<float>& b, int batch);
// The same over a k-side tensor (dk, dv: k's rows and num_heads_kv, dk's strides).
Diff compare_k_side(const fa_params& p, const std::vector<float>& a, const std::vector<float>& b, int batch);
Diff compare_lse(const fa_params& p, const std::vector<float>& a, const std::vector<float>& b, int batch);

// Forward FLOPs: 4 d per visible (query, key) pair per head; causal without a window counts
// half the matrix (the convention of the FlashAttention papers' plots), otherwise the exact
// count of visible pairs. cu_q / cu_k: the host cu_seqlens in varlen mode, else empty.
double forward_flops(const fa_params& p, const std::vector<int32_t>& cu_q, const std::vector<int32_t>& cu_k);

const char* layout_note(const ProblemSpec& s);

}  // namespace fa_cli
