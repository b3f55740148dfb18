// Tile configuration of the sm80 backward: one constexpr table from head_dim to
// (block_m, block_n, warps, stages, split_d), the derived sizes, and the problem description the
// kernels read (BwdParams). Host and device both include it.
//
// Work split of the main kernel: one CTA per (k-block of block_n keys, kv head, batch[, d part]).
// Warp w owns key rows 16w .. 16w + 15 of the block: it computes S^T = K_w Q^T and dP^T = V_w dO^T
// for those rows and keeps their dK and dV (16 x head_dim / split_d fp32) in registers, so
// block_n = 16 * warps (layout 0; layout 1 tiles every product over all the warps, see
// bwd_kernel_2d.cuh). With split_d = 2 two CTAs share a k-block, each owning half of the head_dim
// columns of dK, dV, dQ (they both recompute S and dP): that keeps the accumulators of
// head_dim 192 in registers (head_dim 256 takes layout 1 with one q, dO buffer).
#pragma once

#include <cstdint>

#include "common/dropout.hpp"
#include "common/fast_divmod.hpp"

namespace flashattn::sm80 {

struct BwdConfig {
  int head_dim;  // the kernel's head_dim; smaller problems are zero-padded to it
  int block_m;   // query rows per inner iteration (the q-block)
  int block_n;   // keys per CTA (the k-block): 16 per warp (layout 0), 32-row warp tiles (layout 1)
  int warps;
  int stages;    // q / dO / lse / D tiles in shared memory: 2 = tile i+1 loads while tile i computes
  int split_d;   // CTAs per k-block, each owning head_dim / split_d columns of dK, dV, dQ
  int chunk_m;   // layout 0: query columns of S^T, dP^T held in registers at once (block_m in chunks); layout 1: 0
  int ctas_per_sm;  // __launch_bounds__ minimum: 1 lets a thread use 255 registers
  int layout;       // 0: each warp owns 16 key rows (bwd_main_kernel); 1: 2D warp tiles (bwd_main_2d_kernel)
  int s_keys;       // keys of a warp's S^T, dP^T tile: 16 (layout 0); layout 1: 32 or 64
  int dq_stages;    // layout 1 on sm_90: dQ staging tiles (bwd_kernel_2d.cuh); layout 0: 0
  int dq_late;      // layout 1 on sm_90: 1 issues a q-block's dQ reductions after the next iteration's mid
                    // barrier (needs 2 staging tiles), 0 after its first barrier
};

// K, V tiles (resident), `stages` Q and dO tiles, dS^T (block_n x block_m) [and P^T, layout 1],
// `stages` lse and D rows.
constexpr int bwd_smem_bytes(const BwdConfig& c) {
  return 2 * 2 * c.block_n * c.head_dim + 2 * 2 * c.stages * c.block_m * c.head_dim +
         (c.layout == 1 ? 2 : 1) * 2 * c.block_n * c.block_m + 2 * 4 * c.stages * c.block_m;
}

// fp32 accumulator registers per thread. Layout 0: dK and dV (16 rows x head_dim / split_d each), S^T
// and dP^T (16 x chunk_m each). Layout 1: dK, dV, S^T, dP^T spread over all the warps.
constexpr int bwd_accumulator_regs(const BwdConfig& c) {
  if (c.layout == 1) return (2 * c.block_n * c.head_dim + 2 * c.block_n * c.block_m) / (32 * c.warps);
  return (2 * 16 * c.head_dim / c.split_d + 2 * 16 * c.chunk_m) / 32;
}

// The fp32 dQ accumulator is (num_heads, rows_q, kernel head_dim) with each row's 32-byte pieces
// XOR-swizzled by its index ws = h * rows_q + row: column c is stored at c ^ dq_swizzle(ws). The Hopper
// paths stage a q-block's dQ in shared memory in this layout, where the swizzle spreads the 4 rows of a
// half-warp's 8-byte fragment stores over all banks; the staging tile is then a byte image of the
// q-block's rows, and a few bulk reductions of many rows each add it. (Head dims are multiples of 32:
// the XOR stays inside the row.)
__host__ __device__ constexpr int dq_swizzle(int64_t ws) { return 8 * int(ws & 3); }

constexpr int kBwdMaxSmemSm80 = 163 * 1024;  // A100's per-CTA limit (H100: 227 KB)

// clang-format off
constexpr BwdConfig kBwdConfigs[] = {
    {32,  64,  128, 8, 2, 1, 64, 1, 0, 16, 0, 0},  // 49 KB, 96 accumulators: small enough for S^T, dP^T of the whole q-block
    {64,  128, 128, 8, 2, 1, 0,  1, 1, 64, 2, 1},  // 162 KB, 192 accumulators, 2D warp tiles (H100 16k: 204 vs 194 TFLOP/s);
                                                // S^T in 64 x 32 warp tiles, FA2's transposed: +1-2.5% over 32 x 64;
                                                // 2 dQ staging tiles, reductions after the mid barrier: +3-4%
    {96,  64,  128, 8, 2, 1, 32, 1, 0, 16, 0, 0},  // 113 KB, 128 accumulators
    {128, 64,  128, 8, 2, 1, 0,  1, 1, 32, 1, 0},  // 161 KB, 192 accumulators, 2D warp tiles: the FA2 shape (235 vs 201 TFLOP/s)
    {192, 64,  64,  4, 2, 2, 32, 1, 0, 16, 0, 0},  // 153 KB, 128 accumulators: d split in 2 so dK, dV (96 columns) fit registers
    {256, 64,  64,  8, 1, 1, 0,  1, 1, 32, 1, 0},  // 145 KB, 160 accumulators, 2D warp tiles with one q, dO buffer (two
                                                // do not fit the A100); was d split in 2, block_m 32, 4 warps
};
// clang-format on
constexpr int kBwdHeadDims = sizeof(kBwdConfigs) / sizeof(kBwdConfigs[0]);

constexpr bool is_pow2(int x) { return x > 0 && (x & (x - 1)) == 0; }

// Layout 1 (bwd_main_2d_kernel): S^T, dP^T warps (block_n / s_keys) x rest over the queries, dK, dV
// (block_n / 32) x rest over head_dim, dQ (block_m / 32) x rest over head_dim. Warp column spans are
// powers of two >= 16 inside 64-column chunks (compile-time ldmatrix offsets).
constexpr bool bwd_2d_config_ok(const BwdConfig& c) {
  const int sn = c.block_n / 32, dqm = c.block_m / 32, ssn = c.s_keys > 0 ? c.block_n / c.s_keys : 0;
  return c.split_d == 1 && (c.stages == 1 || c.stages == 2) && c.head_dim % 64 == 0 && c.block_n % 32 == 0 && c.block_m % 32 == 0 &&
         c.block_m % 64 == 0 && sn > 0 && c.warps % sn == 0 && dqm > 0 && c.warps % dqm == 0 &&
         (c.s_keys == 32 || c.s_keys == 64) && c.block_n % c.s_keys == 0 && c.warps % ssn == 0 &&
         (c.dq_stages == 1 || c.dq_stages == 2) && (c.dq_late == 0 || c.dq_stages == 2) &&
         (c.block_m / (c.warps / ssn)) % 16 == 0 && is_pow2(c.head_dim / (c.warps / sn)) &&
         c.head_dim / (c.warps / sn) >= 16 && is_pow2(c.head_dim / (c.warps / dqm)) &&
         c.head_dim / (c.warps / dqm) >= 16 && 32 * c.warps >= 2 * c.block_m && bwd_smem_bytes(c) <= kBwdMaxSmemSm80 &&
         bwd_accumulator_regs(c) <= 192;
}

constexpr bool bwd_config_ok(const BwdConfig& c) {
  if (c.layout == 1) return bwd_2d_config_ok(c);
  return c.layout == 0 && c.s_keys == 16 && c.dq_stages == 0 && c.dq_late == 0 && c.block_n == 16 * c.warps && c.block_m % 16 == 0 && c.chunk_m % 16 == 0 && c.block_m % c.chunk_m == 0 &&
         c.warps % (c.block_m / 16) == 0 &&
         c.head_dim % (16 * c.split_d) == 0 && (c.head_dim / c.split_d) % (16 * (c.warps / (c.block_m / 16))) == 0 &&
         c.stages == 2 && 32 * c.warps >= 2 * c.block_m && bwd_smem_bytes(c) <= kBwdMaxSmemSm80 &&
         bwd_accumulator_regs(c) <= 192;
}
static_assert(bwd_config_ok(kBwdConfigs[0]) && bwd_config_ok(kBwdConfigs[1]) && bwd_config_ok(kBwdConfigs[2]) &&
                  bwd_config_ok(kBwdConfigs[3]) && bwd_config_ok(kBwdConfigs[4]) && bwd_config_ok(kBwdConfigs[5]),
              "a backward tile breaks the work split, the A100's shared memory or the register budget");

// The smallest kernel head_dim >= head_dim (0 when head_dim > 256).
constexpr int bwd_kernel_head_dim(int head_dim) {
  for (const BwdConfig& c : kBwdConfigs)
    if (head_dim <= c.head_dim) return c.head_dim;
  return 0;
}

constexpr BwdConfig bwd_config(int kernel_head_dim) {
  for (const BwdConfig& c : kBwdConfigs)
    if (c.head_dim == kernel_head_dim) return c;
  return {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
}

// The Hopper main kernel (src/cuda/sm90/bwd_kernel.cuh, wgmma): block_n 128 keys, two warpgroups of
// 64 keys each; block_m per head_dim (S^T, dP^T of 64 x block_m and dK, dV of 64 x head_dim per
// warpgroup in registers: (2 * block_m + 2 * head_dim) / 2 accumulators a thread, 192 at both).
// dq_stages: dQ staging tiles in shared memory (2: iteration i stages while the reductions of i - 1
// still read the other; head_dim 128 +2.5% on average; head_dim 64 0.98-1.0 with the producer, session 58).
// Every head_dim runs with a producer warpgroup (loads, dQ's reductions; bwd_ws_kernel): +8-14% at
// head_dim 128 when it came, and +2.6-4.5% at 64 without a mask (0.99-1.03 causal) once K, V came from it and
// dK, dV left by TMA (session 58, docs/sm90_bwd.md). producer_regs: the producer's setmaxnreg (24 at head_dim 64:
// +1-7% over 40, session 59; 40 at 128, where 24 read 0.95-0.97).
// It shares BwdParams, the workspace and the row kernels with the sm80 backward.
// Head_dims 192 and 256 have a kernel of their own (src/cuda/sm90/bwd_wide_kernel.cuh, wide 1): dK, dV of 64 x 256 per
// warpgroup do not fit registers, so its CTA owns 64 keys and its warpgroups split the products, not the keys
// (warpgroup 0 computes S^T, P^T and dV, warpgroup 1 dP^T, dS^T and dK; each half of dQ).
struct Sm90BwdConfig {
  int head_dim;
  int block_m;
  int block_n;
  int dq_stages;      // bwd_ws_kernel's dQ staging tiles (the wide kernel stages dQ over its Q, dO stage)
  int producer_regs;  // the producer's registers; the consumers get the rest (d64: 240, d128: 232, d256: 224)
  int wide;           // 1: bwd_wide_kernel, 0: bwd_ws_kernel
};
constexpr Sm90BwdConfig kSm90BwdConfigs[] = {
    {64, 128, 128, 1, 24, 0}, {128, 64, 128, 2, 40, 0},
    {192, 64, 64, 0, 56, 1},
    {256, 64, 64, 0, 56, 1},  // 56 + 2 x 224: no spills (bwd_wide_kernel.cuh, FLASHATTN_SM90_BWD_WIDE_RS_WAIT)
};
// A CTA's own cost in q-block iterations, in the last wave's split (bwd_tail_split.hpp): the sm80 2D kernel's
// from session 19; the Hopper kernel's from session 59 (8 leaves 16-iteration tasks whole: d128 1k +1.5%
// against 3, which split them in 3 pieces; even at 2k-16k, where both split; H200).
constexpr double kBwdPieceCost = 3, kSm90BwdPieceCost = 8;
// The Hopper kernel's persistent grid (bwd_tail_split.hpp, persistent_tasks) for equal tasks of at most this
// many q-block iterations: d64 512 / 1k keys +6-8 / +4%, d128 1k +1% (16 iterations); at 32 (d128 2k, d64
// 4k) 0.97-1.02 (session 60, H200). FLASHATTN_SM90_BWD_PERSISTENT overrides it (0: always the task grid).
#ifndef FLASHATTN_SM90_BWD_PERSISTENT
#define FLASHATTN_SM90_BWD_PERSISTENT 16
#endif
constexpr int kSm90BwdPersistentIters = FLASHATTN_SM90_BWD_PERSISTENT;
// The Hopper kernel's causal tasks in groups of (batch, kv head) pairs of this many query rows in all, where a
// head has at least kSm90BwdGroupMinBlocks k-blocks (bwd_tail_split.hpp, causal_task_group): d128 causal +1.9 /
// 3.5 / 0.7-4.9 / 0.3% at 1k / 2k / 4k / 8k, d64 +0.7 / 1.7% at 1k / 4k; 0.98 at 512 (4 k-blocks; session 60,
// H200). FLASHATTN_SM90_BWD_GROUP_ROWS overrides the rows (0: the k-block fastest).
#ifndef FLASHATTN_SM90_BWD_GROUP_ROWS
#define FLASHATTN_SM90_BWD_GROUP_ROWS 32768
#endif
constexpr int64_t kSm90BwdGroupRows = FLASHATTN_SM90_BWD_GROUP_ROWS;
constexpr int kSm90BwdGroupMinBlocks = 8;

// The Hopper kernel head_dim for head_dim: 64 for 33..64, 128 for 65..128, 192 for 129..192, 256 for 193..256
// (zero-padded inside the kernel; 0: none).
// Head_dim 65..96 pads to 128 rather than run the sm80 kernel of 96: that read 188 TFLOP/s at 96 (H200, bf16,
// 16k tokens) against 570 for the Hopper kernel at 128, which pays 4 / 3 the work at 96. Up to 32 the sm80
// kernel of 32 stays (padding to 64 doubles the work and dQ's accumulator).
constexpr int sm90_bwd_kernel_head_dim(int head_dim) {
  return head_dim <= 32 ? 0 : head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : head_dim <= 192 ? 192 : head_dim <= 256 ? 256 : 0;
}

// The Hopper kernel's configuration for this kernel head_dim, block_m 0 when it has none.
constexpr Sm90BwdConfig sm90_bwd_config(int kernel_head_dim) {
  for (const Sm90BwdConfig& c : kSm90BwdConfigs)
    if (c.head_dim == kernel_head_dim) return c;
  return {kernel_head_dim, 0, 0, 0, 0, 0};
}
static_assert(sm90_bwd_kernel_head_dim(32) == 0 && sm90_bwd_kernel_head_dim(33) == 64 &&
                  sm90_bwd_kernel_head_dim(65) == 128 && sm90_bwd_kernel_head_dim(128) == 128 &&
                  sm90_bwd_kernel_head_dim(129) == 192 && sm90_bwd_kernel_head_dim(193) == 256 &&
                  sm90_bwd_kernel_head_dim(257) == 0 && sm90_bwd_config(64).block_m > 0 &&
                  sm90_bwd_config(128).block_m > 0 && sm90_bwd_config(192).block_m > 0 && sm90_bwd_config(256).block_m > 0,
              "every Hopper kernel head_dim has its configuration");

// What the three backward kernels read. Strides are in elements, 64-bit.
struct BwdParams {
  const void *q, *k, *v, *o, *dout;
  void *dq, *dk, *dv;
  const float* lse;  // (batch, num_heads, seqlen_q) or varlen (num_heads, total_q), natural log
  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  int64_t do_batch_stride, do_row_stride, do_head_stride;
  int64_t dq_batch_stride, dq_row_stride, dq_head_stride;
  int64_t dk_batch_stride, dk_row_stride, dk_head_stride;
  int64_t dv_batch_stride, dv_row_stride, dv_head_stride;
  const int32_t *cu_seqlens_q, *cu_seqlens_k;  // device arrays, or null
  int32_t batch, seqlen_q, seqlen_k, num_heads, num_heads_kv, head_dim;
  int32_t group;      // num_heads / num_heads_kv
  int64_t rows_q;     // q rows of all sequences: total_q (varlen) or batch * seqlen_q
  int64_t rows_k;     // k rows of all sequences: total_k (varlen) or batch * seqlen_k
  int32_t num_m_blocks;  // ceil(seqlen_q / block_m), seqlen_q the longest
  float softmax_scale;
  float scale_log2;   // softmax_scale * log2(e)
  float softcap;      // 0: off
  float softcap_inv;  // softmax_scale / softcap
  int32_t causal, window_left, window_right;
  int32_t deterministic;
  int32_t vectorized;  // every pointer 16-byte aligned, every stride and head_dim a multiple of 8
  // Workspace.
  float* d_sum;     // D = rowsum(dO * O): (num_heads, rows_q)
  float* dq_accum;  // fp32 dQ / softmax_scale: (num_heads, rows_q, kernel head_dim), dq_swizzle'd
  int32_t* dq_semaphore;  // deterministic: (batch, num_heads, num_m_blocks, split_d) k-blocks done
  // Tasks of the 2D and the Hopper main kernels (one grid dimension, k-block fastest, then kv head, then
  // batch) and the last wave's split (bwd_launch.cu, tail_split): tasks >= tail_begin run as tail_pieces
  // CTAs, each a share of the task's q-block iterations; they add their dK, dV in fp32 into the task's
  // slot of tail_dkv, and the last to finish (tail_done) writes the sum. tail_pieces 1: no split. (The
  // workspace is sized for the current GPU's SM count; another GPU's call may ask for more: a clear
  // FA_ERROR_WORKSPACE, as for any short workspace.)
  int32_t num_n_blocks;  // k-blocks of a (batch, kv head): ceil(seqlen_k / block_n), seqlen_k the longest
  FastDivmod n_blocks_div, heads_kv_div, tail_pieces_div;  // by num_n_blocks, num_heads_kv, tail_pieces
  int32_t tail_begin, tail_pieces;
  int32_t tail_tasks;    // tasks - tail_begin (0: no split)
  float* tail_dkv;       // (tail_tasks, 2 block_n head_dim) fp32, zeroed by the preprocess
  int32_t* tail_done;    // (tail_tasks) pieces finished, zeroed by the preprocess
  int64_t tail_floats;   // tail_dkv's size
  int32_t persistent_ctas;  // the Hopper kernel: the SMs, a CTA each running tasks in turn (persistent_tasks); 0: none
  // Task order (task_pair): 0, the k-block fastest; else groups of task_group (batch, kv head) pairs of the
  // task_pairs, the k-block slowest within a group (causal_task_group: the longest tasks of a group first).
  int32_t task_group, task_pairs;
  FastDivmod task_group_div, group_pairs_div;  // by task_group * num_n_blocks, task_group
  const float* alibi_slopes;  // ALiBi (null: off): slope of sequence b, query head h at [b * stride + h]
  int64_t alibi_slopes_batch_stride;
  DropoutMask dropout;  // off unless dropout_p > 0 (the main kernels' dropout instances)
};

}  // namespace flashattn::sm80
