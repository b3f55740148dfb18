// The Hopper forward's kernels, one line each (fwd_config), and which one runs a problem (fwd_kernel). Plain
// C++: the CPU tests check the table (tests/test_sm90_fwd_config.cpp); params.cuh's Traits derives each
// kernel's shared memory, stages and pipeline from its line, launch_template.cuh instantiates them.
#pragma once

#include <cstdint>

#include "common/last_round_split.hpp"  // equal_tasks
#include "common/layout.hpp"            // is_varlen
#include "common/mask.hpp"
#include "common/tile_geometry.hpp"
#include "flashattn/flashattn.h"

namespace flashattn::cuda::sm90 {

// How a kernel runs: its tile and the pipeline's choices (params.cuh says what each costs and buys).
struct FwdConfig {
  int head_dim = 0;
  int block_n = 0;
  int consumers = 2;            // consumer warpgroups, 64 query rows each
  bool rescale_early = false;   // O rescaled while S = q k^T computes, not after O += P v
  bool tile_overlap = false;    // a consumer's tiles as one stream of key blocks (dev configurations only)
  bool serial = false;          // each consumer warpgroup's GEMMs one at a time (3 warpgroups)
  bool tail_split = false;      // the last round's tiles split (problems without a mask)
  bool optimistic_max = false;  // the softmax without the block max (Consumer::optimistic_softmax)
  bool keys_forward = false;    // a tile's key blocks ascending, not from the last down (KeyOrder)
  bool pingpong = false;        // the 2 consumer warpgroups take turns at their GEMMs (Traits::kPingPong)
  int q_after_kv_from = 0;      // tiles of q_after_kv_from to q_after_kv_to key blocks load the next q after
  int q_after_kv_to = 0;        // their k, v (Traits::kQAfterKVTo); 0: none
  bool alibi = false;           // ALiBi's bias on the scores (fa_params::alibi_slopes; a kernel of its own)
  bool dropout = false;         // dropout on P (fa_params::dropout_p; a kernel of its own)
  constexpr int block_m() const { return 64 * consumers; }
};

// The kernels in order of head dim (launch_template.cuh instantiates a head dim's run of them).
enum class FwdKernel {
  kHdim64TwoWarpgroups,
  kHdim64TwoWarpgroupsCausal,
  kHdim64ThreeWarpgroups,
  kHdim64ThreeWarpgroupsOptimistic,
  kHdim64ThreeWarpgroupsCausal,
  kHdim64Serial,
  kHdim64Alibi,
  kHdim64Dropout,
  kHdim128ShortKeys,
  kHdim128ShortKeysOptimistic,
  kHdim128ShortKeysCausal,
  kHdim128LongNoMask,
  kHdim128LongCausal,
  kHdim128SerialSplit,
  kHdim128Serial,
  kHdim128Alibi,
  kHdim128Dropout,
  kHdim192ShortKeys,
  kHdim192,
  kHdim192LongKeys,
  kHdim192Alibi,
  kHdim192Dropout,
  kHdim256ShortKeys,
  kHdim256,
  kHdim256LongNoMask,
  kHdim256Alibi,
  kHdim256Dropout,
};
constexpr FwdKernel kLastFwdKernel = FwdKernel::kHdim256Dropout;

// A kernel with the optimistic softmax: its key blocks from the last down, or ascending (keys_forward).
constexpr FwdConfig optimistic(FwdConfig config, bool keys_forward = false) {
  config.optimistic_max = true;
  config.keys_forward = keys_forward;
  return config;
}

// One line per kernel (block_m = 64 x consumers): the table above fwd_kernel says when each runs and why.
// by_mask's three instantiations of a kernel share its tile (hdim64_causal_kernel counts the first's scores).
constexpr FwdConfig fwd_config(FwdKernel kernel) {
  switch (kernel) {
    case FwdKernel::kHdim64TwoWarpgroups: return {.head_dim = 64, .block_n = 128, .rescale_early = true};
    case FwdKernel::kHdim64TwoWarpgroupsCausal: return optimistic(fwd_config(FwdKernel::kHdim64TwoWarpgroups), true);
    case FwdKernel::kHdim64ThreeWarpgroups: return {.head_dim = 64, .block_n = 128, .consumers = 3};
    case FwdKernel::kHdim64ThreeWarpgroupsOptimistic:
      return optimistic(fwd_config(FwdKernel::kHdim64ThreeWarpgroups));
    case FwdKernel::kHdim64ThreeWarpgroupsCausal:
      return optimistic(fwd_config(FwdKernel::kHdim64ThreeWarpgroups), true);
    case FwdKernel::kHdim64Serial: return {.head_dim = 64, .block_n = 192, .consumers = 3, .serial = true};
    case FwdKernel::kHdim64Alibi: return {.head_dim = 64, .block_n = 128, .consumers = 3, .alibi = true};
    // Dropout: 2 warpgroups (with 3, at 160 registers a thread, the Philox calls spilled 224 bytes).
    case FwdKernel::kHdim64Dropout: return {.head_dim = 64, .block_n = 128, .rescale_early = true, .dropout = true};
    case FwdKernel::kHdim128ShortKeys:
      return {.head_dim = 128, .block_n = 128, .rescale_early = true, .pingpong = true};
    case FwdKernel::kHdim128ShortKeysOptimistic: {
      // Tiles of 4-5 key blocks (385-640 keys) load the next q after their k, v: +0.9-1.3% at 448-640 keys, even at
      // 384, 576, 704 and 1k; tiles of 3, 6 or 8 blocks, or causal ones at 512 keys, read 1-2% slower so (step 66).
      FwdConfig config = optimistic(fwd_config(FwdKernel::kHdim128ShortKeys));
      config.q_after_kv_from = 4, config.q_after_kv_to = 5;
      return config;
    }
    case FwdKernel::kHdim128ShortKeysCausal: return optimistic(fwd_config(FwdKernel::kHdim128ShortKeys), true);
    case FwdKernel::kHdim128LongNoMask:
      return {.head_dim = 128, .block_n = 144, .tail_split = true, .optimistic_max = true};
    case FwdKernel::kHdim128LongCausal: return optimistic({.head_dim = 128, .block_n = 144}, true);
    case FwdKernel::kHdim128SerialSplit:
      return {.head_dim = 128, .block_n = 128, .consumers = 3, .serial = true, .tail_split = true};
    case FwdKernel::kHdim128Serial: return {.head_dim = 128, .block_n = 128, .consumers = 3, .serial = true};
    case FwdKernel::kHdim128Alibi:
      return {.head_dim = 128, .block_n = 128, .rescale_early = true, .pingpong = true, .alibi = true};
    case FwdKernel::kHdim128Dropout:
      return {.head_dim = 128, .block_n = 128, .rescale_early = true, .pingpong = true, .dropout = true};
    // head_dim 192 (q 48 KB, O 96 registers a thread): block_n 64 with 2 q and the staged epilogue (192 KB);
    // block_n 96, 1 q and slabs of 64 columns (208 KB); block_n 112, 1 q (216 KB), O stored from registers.
    case FwdKernel::kHdim192ShortKeys: return {.head_dim = 192, .block_n = 64, .pingpong = true};
    case FwdKernel::kHdim192: return {.head_dim = 192, .block_n = 96, .pingpong = true};
    case FwdKernel::kHdim192LongKeys: return {.head_dim = 192, .block_n = 112};
    case FwdKernel::kHdim192Alibi: return {.head_dim = 192, .block_n = 112, .alibi = true};
    case FwdKernel::kHdim192Dropout: return {.head_dim = 192, .block_n = 112, .dropout = true};
    case FwdKernel::kHdim256ShortKeys: return {.head_dim = 256, .block_n = 64, .pingpong = true};
    case FwdKernel::kHdim256: return {.head_dim = 256, .block_n = 64};
    case FwdKernel::kHdim256LongNoMask: return {.head_dim = 256, .block_n = 80};
    case FwdKernel::kHdim256Alibi: return {.head_dim = 256, .block_n = 64, .alibi = true};
    case FwdKernel::kHdim256Dropout: return {.head_dim = 256, .block_n = 64, .dropout = true};
  }
  return {};  // past the last: head_dim 0
}

// The kernel head dim of a head_dim: the least of 64, 128, 192, 256 at or above it, 0 past 256 or where the
// head_dim is not a multiple of 8 (the epilogue's 16-byte stores of O then guard whole chunks). Below the kernel's
// columns q, k and v are zero-padded (TMA fills the columns past the tensor map's head_dim with zeros: the
// scores and O are those of head_dim) and O's stores are clipped to head_dim (the tensor map's, and the
// register and 16-byte stores' column guard, FwdParams::head_dim).
constexpr int fwd_kernel_head_dim(int head_dim) {
  if (head_dim <= 0 || head_dim % 8 != 0 || head_dim > 256) return 0;
  return (head_dim + 63) / 64 * 64;
}
// The least head_dim a kernel head dim runs (8, 72, 136, 200: the kernel below's + 8): its O columns below it
// are always stored.
constexpr int fwd_min_head_dim(int kernel_head_dim) { return kernel_head_dim == 64 ? 8 : kernel_head_dim - 56; }
static_assert(fwd_kernel_head_dim(8) == 64 && fwd_kernel_head_dim(64) == 64 && fwd_kernel_head_dim(72) == 128 &&
              fwd_kernel_head_dim(96) == 128 && fwd_kernel_head_dim(136) == 192 && fwd_kernel_head_dim(192) == 192 &&
              fwd_kernel_head_dim(200) == 256 && fwd_kernel_head_dim(256) == 256 && fwd_kernel_head_dim(264) == 0 &&
              fwd_kernel_head_dim(100) == 0);
static_assert(fwd_kernel_head_dim(fwd_min_head_dim(128)) == 128 && fwd_kernel_head_dim(fwd_min_head_dim(128) - 8) == 64 &&
              fwd_kernel_head_dim(fwd_min_head_dim(192)) == 192 && fwd_kernel_head_dim(fwd_min_head_dim(192) - 8) == 128 &&
              fwd_kernel_head_dim(fwd_min_head_dim(256)) == 256 && fwd_kernel_head_dim(fwd_min_head_dim(256) - 8) == 192);

// The mask of p's sequences (with varlen: of the longest).
inline Mask mask_of(const fa_params& p) {
  return Mask(p.seqlen_q, p.seqlen_k, p.causal, p.window_left, p.window_right);
}

// Causal tiles of fixed-length batches may align to the sequence's end (launch_template.cuh's
// causal_row_shift); varlen tiles start at their sequence's row 0.
inline bool tiles_end_aligned(const fa_params& p) { return p.causal && !is_varlen(p); }

// One kernel in three instantiations by the mask (head_dim 64's 3 warpgroups, head_dim 128's short keys):
// without a mask the optimistic softmax (+1-6%: steps 45, 46); causal (keys up to the diagonal, no left
// edge) the optimistic softmax with the key blocks ascending, the first block then a full one whose maxima
// hold (+2-5% at 700-12k keys; from the diagonal down the check fails often: 3-18% slower, steps 36, 45-47); a
// window's left edge the full softmax (ascending 3-11% slower: the first block is masked). Head_dim 64's 2
// warpgroups, picked causal only, in two (optimistic = full): +3-4% causal at 512 and 640 keys (step 49).
inline FwdKernel by_mask(const Mask& mask, FwdKernel full, FwdKernel optimistic, FwdKernel keys_forward) {
  if (!mask.is_banded()) return optimistic;
  return mask.left < 0 ? keys_forward : full;
}

// A kernel's instantiation for the mask, where it has several (by_mask); any other kernel as it is.
inline FwdKernel for_mask(FwdKernel kernel, const Mask& mask) {
  switch (kernel) {
    case FwdKernel::kHdim64TwoWarpgroups:
      return by_mask(mask, kernel, kernel, FwdKernel::kHdim64TwoWarpgroupsCausal);
    case FwdKernel::kHdim64ThreeWarpgroups:
      return by_mask(mask, kernel, FwdKernel::kHdim64ThreeWarpgroupsOptimistic,
                     FwdKernel::kHdim64ThreeWarpgroupsCausal);
    case FwdKernel::kHdim128ShortKeys:
      return by_mask(mask, kernel, FwdKernel::kHdim128ShortKeysOptimistic, FwdKernel::kHdim128ShortKeysCausal);
    default: return kernel;
  }
}

// Causal head_dim 64 up to 2k keys (a window's left edge: below 8k queries): which of its three kernels
// computes the fewest scores, the 2-warpgroup kernel's counted 1.16x. Its softmax has no third warpgroup's
// GEMMs to hide behind: 1.11-1.19x the time per score of the 3-warpgroup kernels at 384-1k keys, the two
// 3-warpgroup kernels within 2% of each other per score there (docs/sm90.md, step 43; past 2k keys the
// ascending keys pull ahead, fwd_kernel). The tiles' quantization decides: 192-row tiles overhang the
// sequence, block_n 192 wastes less of the diagonal where 192 divides the length. end_aligned: fixed-length
// batches (varlen tiles start at row 0).
inline FwdKernel hdim64_causal_kernel(const Mask& mask, bool end_aligned) {
  constexpr FwdConfig kTwo = fwd_config(FwdKernel::kHdim64TwoWarpgroups),
                      kThree = fwd_config(FwdKernel::kHdim64ThreeWarpgroups),
                      kSerial = fwd_config(FwdKernel::kHdim64Serial);
  const double two = 1.16 * tile_scores<kTwo.block_m(), kTwo.block_n>(mask, end_aligned),
               three = tile_scores<kThree.block_m(), kThree.block_n>(mask, end_aligned),
               serial = tile_scores<kSerial.block_m(), kSerial.block_n>(mask, end_aligned);
  if (two <= three && two <= serial) return FwdKernel::kHdim64TwoWarpgroups;
  return three < serial ? FwdKernel::kHdim64ThreeWarpgroups : FwdKernel::kHdim64Serial;
}

// Of one kernel a kernel head dim (64, 128, 192, 256), head_dim's (none: sm90_supports said no first; the last).
inline FwdKernel of_head_dim(int kernel_head_dim, const FwdKernel (&kernels)[4]) {
  return kernels[kernel_head_dim >= 64 && kernel_head_dim <= 256 ? kernel_head_dim / 64 - 1 : 3];
}

// The kernel per problem (by the kernel head dim, fwd_kernel_head_dim), from the side-by-side timings of
// docs/sm90.md (H100, bf16 sweep): a larger block_n pays where a tile has many key blocks, a smaller one where the
// per-tile prologue and epilogue weigh (short sequences) or, for causal, where tiles are short.
//   head_dim 64:  3 consumer warpgroups (block_m 192) with block_n 128 and the rescale after the
//                 wait: +8-15% non-causal at every seqlen, +3-10% causal at 2k-4k over 2 warpgroups
//                 (either block_n), without a mask with the optimistic softmax (+2-6% at 512-16k,
//                 step 46), causal with it too, key blocks ascending (by_mask, above); single-tile
//                 problems keep 2 warpgroups with block_n 128 and the early rescale (docs/sm90.md,
//                 step 9). Causal past 2k keys the 3 warpgroups, key blocks ascending: +1-2% at 3k,
//                 +1-5% at 6k-24k over the serial GEMMs with block_n 192, whose tiles compute fewer
//                 scores (step 51); up to 2k keys, of those three kernels, the one whose tiles compute
//                 the fewest scores (hdim64_causal_kernel, above: +1-11% at 384-4k keys, step 43; the
//                 serial GEMMs +2-6% at 384-576, even at 768 and 1.5k, step 51), the 2 warpgroups'
//                 then in by_mask's two instantiations (step 49). A window's left edge: the model below
//                 8k rows (the 3 warpgroups 6% slower at 4k with a 512 window), the 3 warpgroups from 8k
//                 (+5% at 8k with a 1k window, +1% at 16k with 2k-4k, step 51).
//   head_dim 128: block_n 128 + early rescale (two q buffers, staged epilogue, ping-pong: step 33) up to
//                 seqlen_k 2k (without a mask or causal with the optimistic softmax: by_mask, above;
//                 the block_n 144 kernel measured 3-17% slower there), and causal up to 8k keys
//                 (+3-13% at 2.5k-12k over the 3 warpgroups with L2 flushed between calls, steps 38,
//                 40; with step 47's ascending keys +1-5% at 14k-32k and 16k with a window, step 49;
//                 past 8k keys without a left edge block_n 144 in the same form: +1-3% at 12k-32k,
//                 even at 8k, 2% slower at 3k-4k, step 50),
//                 and windows with a left edge at any length (+7-28% at 4k-16k, step 49; a window
//                 with a right edge only, all but unmasked, read 0.98 there and stays below);
//                 above, 3 consumer warpgroups with serial GEMMs and block_n 128: +1.5-2%
//                 non-causal at 4k-16k, +1-3% causal at 4k and +3-5% at 8k over the 2-warpgroup
//                 kernels of that time (block_n 128 and 176, before ping-pong and q in registers),
//                 8-25% slower at shorter lengths (docs/sm90.md, steps 6, 8, 9, 13). Without a
//                 mask (equal_tasks) past 2k queries and keys: 2 warpgroups with block_n 144 and q
//                 in registers, +2-3% at 8k-16k over the 3 warpgroups and their last-round split,
//                 9% slower causal at 8k (step 28); with the optimistic softmax (steps 36-37) +7-10%
//                 at 2.5k-4k too (step 44). Problems without a mask split the last round's tiles (the
//                 3-warpgroup kernel in an instantiation of its own: step 29).
//   head_dim 192: block_n 96 with ping-pong up to 4k keys (+3-21% at 768-4k over block_n 112, but 1% slower
//                 at head_dim 160 4k without a mask), block_n 64 with ping-pong up to 512 keys, causal up to
//                 1k (+14-35% at 512, +17-24% causal at 1k, where block_n 96 reads 1-2% slower), block_n 112
//                 past 4k (block_n 96 0-12% slower at 8k-16k but for head_dim 192 causal 8k, 4% faster). ALiBi
//                 and dropout on block_n 112. H200, bf16, 16k tokens, head_dim 160 and 192 (step 78).
//   head_dim 256: block_n 64, rescale after the wait (the early rescale measured 0-4% slower, the
//                 overlapped tile boundaries 3-8% slower from 1k keys), with the slab epilogue
//                 (+16-27% at 512 keys, epilogue.cuh); up to 1k keys with ping-pong (+1-2.5% at
//                 512-1k with the L2 warm, 0-2% with it flushed; even at 2k-4k, 3% slower causal at
//                 16k: step 50); block_n 80 (no room left for the slab) non-causal past 8k keys: +3% at
//                 16k, even at 8k, 2-8% slower below.
inline FwdKernel fwd_kernel(const fa_params& p) {
  const int head_dim = fwd_kernel_head_dim(p.head_dim);
  // ALiBi: one kernel a head dim, the full softmax (not the optimistic one: the bias moves the rows' maxima
  // with the keys) on the tiles of its plain kernels without a mask (head_dim 128: the short-key kernel's).
  if (p.alibi_slopes)
    return of_head_dim(head_dim, {FwdKernel::kHdim64Alibi, FwdKernel::kHdim128Alibi, FwdKernel::kHdim192Alibi,
                                  FwdKernel::kHdim256Alibi});
  // Dropout (not with ALiBi: sm90_supports): likewise, the full softmax, tiles from row 0 (no causal row shift:
  // dropout's 16 x 16 tiles, common/dropout.hpp, then fall whole in a warp's rows).
  if (p.dropout_p > 0.f)
    return of_head_dim(head_dim, {FwdKernel::kHdim64Dropout, FwdKernel::kHdim128Dropout, FwdKernel::kHdim192Dropout,
                                  FwdKernel::kHdim256Dropout});
  if (head_dim == 64) {
    if (p.seqlen_q <= 128) return FwdKernel::kHdim64TwoWarpgroups;
    const Mask mask = mask_of(p);
    // Causal: the model's pick only among short keys (or a window's left edge below 8k rows).
    const bool three = !p.causal || p.seqlen_q >= 8192 || (mask.left < 0 && p.seqlen_k > 2048);
    const FwdKernel kernel =
        three ? FwdKernel::kHdim64ThreeWarpgroups : hdim64_causal_kernel(mask, tiles_end_aligned(p));
    return for_mask(kernel, mask);
  }
  if (head_dim == 128) {
    const Mask mask = mask_of(p);
    // Causal past 8k keys (no left edge): block_n 144, the optimistic softmax with the key blocks ascending.
    if (p.causal && mask.left < 0 && p.seqlen_k > 8192) return FwdKernel::kHdim128LongCausal;
    // Past 2k keys: causal, and windows with a left edge (their tiles see a band of keys).
    if (p.seqlen_k <= 2048 || p.causal || mask.left >= 0) return for_mask(FwdKernel::kHdim128ShortKeys, mask);
    // Without a mask every tile sees every key: the last round's tiles split.
    if (equal_tasks(p) && p.seqlen_q > 2048 && p.seqlen_k > 2048) return FwdKernel::kHdim128LongNoMask;
    return equal_tasks(p) ? FwdKernel::kHdim128SerialSplit : FwdKernel::kHdim128Serial;
  }
  if (head_dim == 192) {
    if (p.seqlen_k <= 512 || (p.causal && p.seqlen_k <= 1024)) return FwdKernel::kHdim192ShortKeys;
    return p.seqlen_k <= 4096 ? FwdKernel::kHdim192 : FwdKernel::kHdim192LongKeys;
  }
  if (p.seqlen_k <= 1024) return FwdKernel::kHdim256ShortKeys;
  return !p.causal && p.seqlen_k > 8192 ? FwdKernel::kHdim256LongNoMask : FwdKernel::kHdim256;
}

}  // namespace flashattn::cuda::sm90
