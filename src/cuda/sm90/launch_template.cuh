// Host side of the Hopper forward: tensor maps, kernel parameters and the launch of one
// (head_dim, dtype) instantiation. Included by the fwd_hdim<N>_<dtype>.cu files only.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/last_round_split.hpp"
#include "common/layout.hpp"
#include "common/section_balance.hpp"
#include "common/tile_geometry.hpp"
#include "cuda/common.cuh"
#include "cuda/sm90/fwd_config.hpp"
#include "cuda/sm90/kernel.cuh"
#include "cuda/sm90/launch.hpp"

#if FLASHATTN_SM90_TRACE
extern long long* flashattn_sm90_trace;  // dev: set by dev/sm90/harness.cu
#endif
#if FLASHATTN_SM90_WATCHDOG
extern int* flashattn_sm90_watchdog;  // dev: set by dev/sm90/harness.cu
#endif

// Dev switch: the causal L2 sections' size (heads_per_section) below the one-section lengths: -1 the
// schedule's model (causal_schedule), 0 the L2's choice alone (before step 40), > 0 that many heads.
#ifndef FLASHATTN_SM90_SECTION_HEADS
#define FLASHATTN_SM90_SECTION_HEADS -1
#endif

namespace flashattn::cuda::sm90 {

// Causal tiles aligned to the end of the sequence instead of its start where that visits fewer key blocks
// (end_aligned_row_shift, common/tile_geometry.hpp; FwdParams::row_shift). It pays with 192-row tiles over
// 128-key blocks (head_dim 128, 3 consumer warpgroups): at 4k, 363 key blocks a (batch, head) instead of
// 384, measured +5%. Fixed-length batches only (varlen tiles start at their sequence's row 0).
template <class T>
int32_t causal_row_shift(const fa_params& p) {
  if (!tiles_end_aligned(p) || T::kDropout) return 0;
  return end_aligned_row_shift<T::kBlockM, T::kBlockN>(mask_of(p));
}

// Causal tiles of a (batch, head) differ in length, and the section size decides how the long ones fall on
// the CTAs of each round: from the sizes whose k and v fit L2, the one the schedule's model balances best
// (common/section_balance.hpp; a tile costs its key blocks + 2 there, for its loads and epilogue). l2_heads:
// the heads whose k and v take half the L2. Measured +3-25% at head_dim 128 and 256 with 512-4k keys, even
// at 64 (docs/sm90.md, step 40). At head_dim 128 and 256 also the grid: the fewest CTAs that keep the
// model's makespan and sections (fewest_ctas_schedule; 128 or 126 CTAs at 256-1k keys): +0.6-2.6% at head_dim
// 128 256-1k keys, +0.4-1.0% at 256 384-512 (at head_dim 64 0.97-1.00 with 128: step 71), or whole rounds of
// whole heads up to 1.5k keys (causal_grid_schedule: +1.6-21% at 640-1152 keys, step 72). The model costs the
// host about 1 ns a tile and candidate (10-60 us at 1k-4k tiles; up to ~16 grids more), so it runs once per
// problem: the answers for the last four are kept, in statics of internal linkage (a template's local static
// is otherwise one object in a process across every copy of the library: two builds timed side by side would
// share their answers).
template <class T>
static SectionSchedule causal_schedule(const fa_params& p, const FwdParams& fp, int64_t num_bh,
                                       int64_t l2_heads, int32_t grid) {
  struct Key {
    int32_t seqlen_q, seqlen_k, window_left, window_right, grid;
    int64_t num_bh, l2_heads;
    bool operator==(const Key&) const = default;
  };
  struct Entry {
    Key key{};
    SectionSchedule schedule{0, 0};  // heads 0: empty
  };
  static thread_local Entry memo[4];  // the last problems' answers, replaced round-robin
  static thread_local int next = 0;
  const Key key{p.seqlen_q, p.seqlen_k, p.window_left, p.window_right, grid, num_bh, l2_heads};
  for (const Entry& e : memo)
    if (e.schedule.heads > 0 && e.key == key) return e.schedule;
  // In run order (the last m_block first), each tile's key blocks + 2.
  std::vector<int32_t> cost = tile_key_blocks<T::kBlockM, T::kBlockN>(mask_of(p), fp.num_m_blocks, fp.row_shift);
  std::reverse(cost.begin(), cost.end());
  for (int32_t& c : cost) c += 2;
  Entry& e = memo[next];
  next = (next + 1) % 4;
  e.key = key;
  e.schedule = T::kHeadDim >= 128 ? causal_grid_schedule(cost, num_bh, l2_heads, grid)
                                  : SectionSchedule{grid, balanced_section_heads(cost, num_bh, l2_heads, grid)};
  return e.schedule;
}

// The last round's split (tail_stream, common/last_round_split.hpp) of a problem whose tiles all visit
// every key block (non-causal, no window, fixed length), unless the caller turned key splits off
// (num_splits 1): the tiles left after whole rounds run as one stream of key blocks cut into a segment
// per SM. At head_dim 128 the sweep leaves 56 of 1376 192-row tiles for an 11th round on 132 SMs (8k,
// 16k; dev/sm90/fwd_waves.py: 624-640 TFLOP/s with 9.1-10.4 rounds, 678-697 with 7.8 and 15.0), and 68
// of 2048 128-row tiles for a 16th (16k, block_n 144). The workspace holds each piece's partial state
// (FwdParams::tail_o, tail_ml) and the counters.
struct FwdTailPlan {
  TailStream stream;
  size_t done_bytes = 0, ml_bytes = 0, o_bytes = 0;
  size_t bytes() const { return done_bytes + ml_bytes + o_bytes; }
};
template <class T>
FwdTailPlan fwd_tail_plan(const fa_params& p, int num_sms) {
  FwdTailPlan t;
  if (!T::kTailSplit || !equal_tasks(p) || p.num_splits == 1 || p.seqlen_q <= 0 || p.seqlen_k <= 0 || num_sms <= 0) return t;
  const int64_t tiles = int64_t(p.batch) * p.num_heads * ((int64_t(p.seqlen_q) + T::kBlockM - 1) / T::kBlockM);
  const int64_t iters = (int64_t(p.seqlen_k) + T::kBlockN - 1) / T::kBlockN;
  if (tiles >= (int64_t(1) << 30)) return t;
  t.stream = tail_stream(tiles, iters, num_sms, kMaxTailPieces);
  if (t.stream.tasks == 0) return t;
  const size_t warpgroup_pieces = size_t(t.stream.workspace_slots()) * T::kConsumerWarpgroups;
  t.done_bytes = (size_t(t.stream.tasks) * T::kConsumerWarpgroups * sizeof(int32_t) + 255) / 256 * 256;
  t.ml_bytes = warpgroup_pieces * 128 * sizeof(float4);
  t.o_bytes = warpgroup_pieces * (T::kHeadDim / 8) * 128 * sizeof(float4);
  return t;
}

// One tile configuration's launch.
template <class T>
Status launch(const fa_params& p) {
  constexpr int kHeadDim = T::kHeadDim;
  constexpr bool kBf16 = T::kBf16;
  const bool varlen = is_varlen(p);
  const int64_t rows_q = varlen ? p.total_q : p.seqlen_q;
  const int64_t rows_k = varlen ? p.total_k : p.seqlen_k;
  if (p.batch == 0 || rows_q == 0 || p.seqlen_q == 0) return {};

  // The maps have p.head_dim columns: below the kernel's kHeadDim, TMA's loads fill the columns past them with
  // zeros and its stores leave them out (fwd_kernel_head_dim, fwd_config.hpp).
  CUtensorMap map_q, map_k, map_v, map_o;
  const int32_t batch_dim = varlen ? 1 : p.batch;
  FA_RETURN_IF_ERROR(make_tensor_map(&map_q, p.q, kBf16, p.head_dim, rows_q, p.num_heads, batch_dim, p.q_row_stride,
                                     p.q_head_stride, p.q_batch_stride, T::kBlockM));
  // O by TMA stores of 64 rows (a consumer warpgroup's, staged epilogue) or 16 (a warp's slab),
  // fixed-length batches only (epilogue.cuh).
  FA_RETURN_IF_ERROR(make_tensor_map(&map_o, p.o, kBf16, p.head_dim, rows_q, p.num_heads, batch_dim, p.o_row_stride,
                                     p.o_head_stride, p.o_batch_stride, T::kStagedEpilogue ? 64 : 16));
  // With no keys the maps are never read; they still need a valid address and extent.
  const void* k_ptr = rows_k > 0 ? p.k : p.q;
  const void* v_ptr = rows_k > 0 ? p.v : p.q;
  FA_RETURN_IF_ERROR(make_tensor_map(&map_k, k_ptr, kBf16, p.head_dim, rows_k, p.num_heads_kv, batch_dim, p.k_row_stride,
                                     p.k_head_stride, p.k_batch_stride, T::kBlockN));
  FA_RETURN_IF_ERROR(make_tensor_map(&map_v, v_ptr, kBf16, p.head_dim, rows_k, p.num_heads_kv, batch_dim, p.v_row_stride,
                                     p.v_head_stride, p.v_batch_stride, T::kBlockN));

  FwdParams fp{};
  fp.o = p.o;
  fp.o_batch_stride = p.o_batch_stride;
  fp.o_row_stride = p.o_row_stride;
  fp.o_head_stride = p.o_head_stride;
  fp.head_dim = p.head_dim;
  fp.lse = p.lse;
  fp.cu_seqlens_q = p.cu_seqlens_q;
  fp.cu_seqlens_k = p.cu_seqlens_k;
  fp.batch = p.batch;
  fp.num_heads = p.num_heads;
  fp.heads_per_kv_head = p.num_heads / p.num_heads_kv;
  fp.seqlen_q = p.seqlen_q;
  fp.seqlen_k = p.seqlen_k;
  fp.total_q = p.total_q;
  constexpr float kLog2e = 1.4426950408889634f;
  const float scale = p.softmax_scale != 0.f ? p.softmax_scale : 1.f / std::sqrt(float(p.head_dim));
  fp.has_softcap = p.softcap > 0.f;
  fp.score_scale_log2 = fp.has_softcap ? kLog2e : scale * kLog2e;
  fp.softcap_pre = fp.has_softcap ? scale / p.softcap : 0.f;
  fp.softcap = p.softcap;
  fp.alibi_slopes = p.alibi_slopes, fp.alibi_slopes_batch_stride = p.alibi_slopes_batch_stride;
  fp.dropout = DropoutMask::of(p);
  fp.causal = p.causal;
  fp.window_left = p.window_left;
  fp.window_right = p.window_right;
  fp.block_m = T::kBlockM;
#if FLASHATTN_SM90_TRACE
  fp.trace = flashattn_sm90_trace;
#endif
#if FLASHATTN_SM90_WATCHDOG
  fp.watchdog = flashattn_sm90_watchdog;
#endif
  fp.num_m_blocks = num_m_blocks<T::kBlockM>(mask_of(p));
  fp.row_shift = causal_row_shift<T>(p);
  const int64_t num_bh = int64_t(p.batch) * p.num_heads;
  const int64_t num_tiles = num_bh * fp.num_m_blocks;
  if (num_tiles >= (int64_t(1) << 31) - (int64_t(1) << 16)) return unsupported("flashattn-sm90: %lld tiles", (long long)num_tiles);
  fp.num_tiles = int32_t(num_tiles);

  DeviceInfo dev;
  FA_RETURN_IF_ERROR(device_info(&dev));
  // The split needs its workspace (fa_workspace_size); without it the tiles run whole.
  const FwdTailPlan tail = fwd_tail_plan<T>(p, dev.num_sms);
  const bool split = tail.stream.tasks > 0 && p.workspace && p.workspace_bytes >= tail.bytes();
  if (split) fp.tail = tail.stream;
  fp.tail_begin = fp.num_tiles - fp.tail.tasks;
  // The tail's two rounds (piece 0, then piece 1 of every segment) on a grid of every SM.
  fp.num_tasks = split ? fp.tail_begin + 2 * dev.num_sms : fp.num_tiles;
  if (split) {
    char* ws = static_cast<char*>(p.workspace);
    fp.tail_done = reinterpret_cast<int32_t*>(ws);
    fp.tail_ml = reinterpret_cast<float4*>(ws + tail.done_bytes);
    fp.tail_o = reinterpret_cast<float4*>(ws + tail.done_bytes + tail.ml_bytes);
    FA_CUDA_CHECK(cudaMemsetAsync(fp.tail_done, 0, tail.done_bytes, stream_of(p)));
  }
  // Equal tiles, unsplit, at head_dim 128 and 256: the fewest CTAs that take as many rounds, every round full
  // (2048 tiles: 128 CTAs for 16 rounds, not 15 of 132 and one of 68; fewer CTAs a round share HBM and L2):
  // +0.8-0.9% at head_dim 128 512-640 keys, +1.3-1.7% at 256 512-2k, +3.5% with 136 tiles, even at 128 1k;
  // at head_dim 64 even on the sweep, 1.4% slower with 135 tiles (docs/sm90.md, step 71). Elsewhere a CTA
  // per SM (causal tiles differ: the sections' model balances them).
  const bool even_rounds = kHeadDim >= 128 && equal_tasks(p) && !split;
  int64_t grid = even_rounds ? even_rounds_grid(fp.num_tasks, dev.num_sms)
                             : std::min<int64_t>(fp.num_tasks, dev.num_sms);
  // k and v of one (batch, head): seqlen_k * head_dim * 2 tensors * 2 bytes. Half of L2 for them.
  const int64_t kv_bytes = std::max<int64_t>(1, int64_t(p.seqlen_k) * p.head_dim * 4);
  const int64_t l2_heads = std::clamp<int64_t>(dev.l2_bytes / 2 / kv_bytes, 1, num_bh);
  fp.heads_per_section = int32_t(l2_heads);
  // Snake order: measured up to 16% faster causal at head_dim 128 and 256 (seqlen 1k-8k), but
  // 10-14% slower causal at head_dim 64 with seqlen 8k-16k (docs/sm90.md); non-causal is neutral.
  fp.snake_order = kHeadDim >= 128;
  // Sections of about one round of tiles (grid / num_m_blocks heads, all their m_blocks): the
  // CTAs running at once read a few heads' k, v (each from DRAM once, then from L2) instead of one
  // head each (at short seqlen a burst of DRAM reads every num_m_blocks rounds, with the tensor
  // cores waiting). Measured non-causal +1-15% (most at 512-1k keys), causal +5-8% at 512 and
  // +5-7% at head_dim 64 up to 4k; 20-25% slower causal at head_dim 128 and 256 with 1k-2k (a
  // round then mixes long and short tiles), so not there (docs/sm90.md, step 8). The snake order
  // pairs the long causal m_blocks of one round with the short ones of the next.
  if (!p.causal || fp.num_m_blocks <= 4 || (kHeadDim == 64 && p.seqlen_q <= 4096)) {
    const int64_t round_heads = std::max<int64_t>(1, grid / fp.num_m_blocks);
    fp.heads_per_section = int32_t(std::min<int64_t>(fp.heads_per_section, round_heads));
    fp.snake_order = 1;
  }
  // Causal, long sequences: tiles ordered longest first over all (batch, head) pairs (one L2
  // section) with the snake order balance the CTAs' work: measured +9-60% at head_dim >= 128 with
  // seqlen 4k-16k (d256 causal 16k: 414 -> 655 TFLOP/s) against the L2's sections, but 20-25% slower
  // at 512-2k; at head_dim 64 (3 consumer warpgroups) +5-8% at 8k-16k, 4% slower at 4k (docs/sm90.md,
  // steps 7 and 9). From 8k queries on: below, the model's sections (next) read +5-12% at 4k at head_dim
  // 128 and 256, even at 6k, and 8-37% slower at 12k-16k, 16% at d256 8k (step 40).
  if (p.causal && p.seqlen_q >= 8192) {
    fp.heads_per_section = int32_t(num_bh);
    fp.snake_order = 1;
  }
  // Causal problems below those lengths (in snake order; fixed length, where every (batch, head) has the
  // same tiles): the section size from the schedule's model.
  else if (p.causal && !varlen && fp.snake_order && FLASHATTN_SM90_SECTION_HEADS != 0) {
    if (FLASHATTN_SM90_SECTION_HEADS > 0) {
      fp.heads_per_section = int32_t(std::clamp<int64_t>(FLASHATTN_SM90_SECTION_HEADS, 1, num_bh));
    } else {
      const SectionSchedule schedule = causal_schedule<T>(p, fp, num_bh, l2_heads, int32_t(grid));
      fp.heads_per_section = int32_t(schedule.heads);
      grid = schedule.grid;
    }
  }

  fp.section_tiles_div = FastDivmod(fp.heads_per_section * fp.num_m_blocks);
  fp.section_heads_div = FastDivmod(fp.heads_per_section);
  const int64_t last_section_heads = num_bh - (num_bh - 1) / fp.heads_per_section * fp.heads_per_section;
  fp.last_section_heads_div = FastDivmod(int32_t(last_section_heads));
  fp.num_heads_div = FastDivmod(p.num_heads);

  constexpr size_t smem_bytes = sizeof(SharedStorage<T>) + 1024;  // + alignment slack
  static_assert(smem_bytes <= 227 * 1024, "shared memory per CTA");
  constexpr auto kernel = &fwd_kernel<T>;
  FA_RETURN_IF_ERROR(opt_in_shared_memory<kernel>(dev, int(smem_bytes), "flashattn-sm90", "forward", kHeadDim));
  kernel<<<int(grid), T::kThreads, smem_bytes, stream_of(p)>>>(map_q, map_k, map_v, map_o, fp);
  FA_CUDA_CHECK_LAUNCH("flashattn-sm90 forward");
  return {};
}

template <class T>
struct TraitsTag {
  using type = T;
};

// f(TraitsTag<Traits<fwd_config(kernel), kBf16>>{}) for kernel, one of head dim kHeadDim's kernels (the enum
// lists them in a run): only those are instantiated, in enum order; the run's last stands for any other.
template <int kHeadDim, bool kBf16, int kIndex = 0, class F>
auto with_kernel_traits(FwdKernel kernel, F&& f) {
  constexpr FwdConfig config = fwd_config(FwdKernel(kIndex));
  if constexpr (config.head_dim != kHeadDim) {
    static_assert(kIndex < int(kLastFwdKernel), "a head dim without a kernel");
    return with_kernel_traits<kHeadDim, kBf16, kIndex + 1>(kernel, f);
  } else if constexpr (fwd_config(FwdKernel(kIndex + 1)).head_dim != kHeadDim) {
    return f(TraitsTag<Traits<config, kBf16>>{});
  } else {
    if (kernel == FwdKernel(kIndex)) return f(TraitsTag<Traits<config, kBf16>>{});
    return with_kernel_traits<kHeadDim, kBf16, kIndex + 1>(kernel, f);
  }
}

// Calls f(TraitsTag<T>{}) with the Traits T of p's kernel (fwd_kernel, fwd_config.hpp).
template <int kHeadDim, bool kBf16, class F>
auto with_fwd_config(const fa_params& p, F&& f) {
#if FLASHATTN_SM90_DEV_CONFIG
  constexpr int kBlockN = kHeadDim == 64    ? FLASHATTN_SM90_HDIM64_BLOCK_N
                          : kHeadDim == 128 ? FLASHATTN_SM90_HDIM128_BLOCK_N
                          : kHeadDim == 192 ? FLASHATTN_SM90_HDIM192_BLOCK_N
                                            : FLASHATTN_SM90_HDIM256_BLOCK_N;
  constexpr int kConsumers = kHeadDim == 64    ? FLASHATTN_SM90_HDIM64_CONSUMERS
                             : kHeadDim == 128 ? FLASHATTN_SM90_HDIM128_CONSUMERS
                                               : 2;
  constexpr FwdConfig kConfig{.head_dim = kHeadDim,
                              .block_n = kBlockN,
                              .consumers = kConsumers,
                              .rescale_early = bool(FLASHATTN_SM90_RESCALE_EARLY),
                              .tile_overlap = bool(FLASHATTN_SM90_TILE_OVERLAP),
                              .serial = FLASHATTN_SM90_SERIAL && kConsumers == 3,
                              .optimistic_max = kBlockN == 144,
                              .pingpong = kHeadDim == 128 && kBlockN == 128 && kConsumers == 2};
  return f(TraitsTag<Traits<kConfig, kBf16>>{});
#else
  return with_kernel_traits<kHeadDim, kBf16>(fwd_kernel(p), f);
#endif
}

template <int kHeadDim, bool kBf16>
Status run_fwd(const fa_params& p) {
  return with_fwd_config<kHeadDim, kBf16>(p, [&](auto tag) { return launch<typename decltype(tag)::type>(p); });
}

template <int kHeadDim, bool kBf16>
size_t fwd_workspace(const fa_params& p, int num_sms) {
  return with_fwd_config<kHeadDim, kBf16>(
      p, [&](auto tag) { return fwd_tail_plan<typename decltype(tag)::type>(p, num_sms).bytes(); });
}

}  // namespace flashattn::cuda::sm90
