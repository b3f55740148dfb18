// The Hopper forward's device-side parameters and its per-head-dim tile configuration.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/dropout.hpp"      // DropoutMask
#include "common/fast_divmod.hpp"  // the tile decode (three divisions in a row were ~850 clocks a tile)
#include "common/last_round_split.hpp"  // TailStream
#include "cuda/sm90/fwd_config.hpp"     // FwdConfig

// Dev switch: ping-pong scheduling of the two consumer warpgroups (Traits::kPingPong) in every
// 2-consumer kernel (1), in none (0), or where the table in Traits says (-1).
#ifndef FLASHATTN_SM90_PINGPONG
#define FLASHATTN_SM90_PINGPONG -1
#endif

// Dev switch: the staged epilogue (Traits::kStagedEpilogue) where it applies; 0 stores O
// straight from registers everywhere.
#ifndef FLASHATTN_SM90_STAGED_EPILOGUE
#define FLASHATTN_SM90_STAGED_EPILOGUE 1
#endif

// Build switch for compute-sanitizer's racecheck: every consumer thread that reads a published tile plan
// (Traits::kPublishedTiles) arrives on its q buffer's q_empty, not only the warpgroup's first thread. The kernel's
// own order (all 128 threads read the plan, then the epilogue's bar.sync, then the first thread's release
// arrival) is sound by the PTX memory model, but racecheck credits an mbarrier arrival with the arriving thread's
// own accesses only, so it reports the producer's next plan as a race (dev/sm90/racecheck_probe.cu shows it on a
// small kernel). 0.9-1.5% slower at head_dim 128 without a mask, 512-2k keys (docs/sm90.md, step 73).
#ifndef FLASHATTN_SM90_PLAN_RELEASE_EVERY
#define FLASHATTN_SM90_PLAN_RELEASE_EVERY 0
#endif

// Dev switch: q in registers (the A operand of S = q k^T from registers instead of shared memory)
// where it fits (Traits::kQInRegisters): measured +2-6% at head_dim 128 with block_n 128.
#ifndef FLASHATTN_SM90_Q_REGS
#define FLASHATTN_SM90_Q_REGS 1
#endif

// Dev switch: clock64 of the pipeline's events per tile into FwdParams::trace (CTAs 0-7, their
// first 64 tiles, 16 events; dev/sm90/harness.cu trace prints them).
#ifndef FLASHATTN_SM90_TRACE
#define FLASHATTN_SM90_TRACE 0
#endif
#if FLASHATTN_SM90_TRACE
// slot: consumer warpgroup 0, 1, .. or the producer (kTraceProducer); event e < 16 of tile `count`.
#define SM90_TRACE(p, slot, count, e)                                                         \
  do {                                                                                        \
    if ((p).trace && blockIdx.x < 8 && (count) < 64 && threadIdx.x % 128 == 0)               \
      (p).trace[((blockIdx.x * 4 + (slot)) * 64 + (count)) * 16 + (e)] = clock64();          \
  } while (0)
#else
#define SM90_TRACE(p, slot, count, e) \
  do {                                \
  } while (0)
#endif
constexpr int kTraceProducer = 3;
// After the events: per CTA (up to 1024) the globaltimer (ns) at consumer warpgroup 0's start and at the end
// of each consumer warpgroup's loop: [4 * cta + 0] start, [4 * cta + 1 + wg] end.
constexpr int kTraceCtaBase = 8 * 4 * 64 * 16;
#if FLASHATTN_SM90_TRACE
#define SM90_TRACE_CTA(p, index)                                                      \
  do {                                                                                \
    if ((p).trace && threadIdx.x % 128 == 0 && blockIdx.x < 1024) {                   \
      long long ns;                                                                   \
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));                          \
      (p).trace[kTraceCtaBase + 4 * blockIdx.x + (index)] = ns;                       \
    }                                                                                 \
  } while (0)
#else
#define SM90_TRACE_CTA(p, index) \
  do {                           \
  } while (0)
#endif

// Dev switch: L2 eviction priorities on the loads (Traits::kL2Hints) in every kernel (1), in none (0),
// or where the table in Traits says (-1).
#ifndef FLASHATTN_SM90_L2_HINTS
#define FLASHATTN_SM90_L2_HINTS -1
#endif

// Dev switch: the slab epilogue (Traits::kSlabCols) where it applies; 0: O stored straight from
// the accumulator registers there.
#ifndef FLASHATTN_SM90_SLAB_EPILOGUE
#define FLASHATTN_SM90_SLAB_EPILOGUE 1
#endif

// Dev switch: the depth of the k / v ring (Traits::kStages) where that many stages fit beside one q
// buffer; 0: the table in Traits.
#ifndef FLASHATTN_SM90_STAGES
#define FLASHATTN_SM90_STAGES 0
#endif

// Dev switch: the optimistic softmax (Traits::kOptimisticMax) where it applies (1), nowhere (0), or in
// every block (2: each block's check fails, so the fallback runs everywhere; for testing it).
#ifndef FLASHATTN_SM90_OPT_MAX
#define FLASHATTN_SM90_OPT_MAX 1
#endif

// Dev switch: Traits::kUniformWarpgroup where it applies (-1), everywhere (1), nowhere (0).
#ifndef FLASHATTN_SM90_UNIFORM_WG
#define FLASHATTN_SM90_UNIFORM_WG -1
#endif

// Dev switch: Traits::kQAfterKVFrom / kQAfterKVTo in the kernels whose configuration sets one (-1: as it says).
#ifndef FLASHATTN_SM90_Q_AFTER_KV_FROM
#define FLASHATTN_SM90_Q_AFTER_KV_FROM -1
#endif
#ifndef FLASHATTN_SM90_Q_AFTER_KV_TO
#define FLASHATTN_SM90_Q_AFTER_KV_TO -1
#endif

// Dev switch: the wider producer (Traits::kWideProducer) where it applies; 0: 24 registers everywhere.
#ifndef FLASHATTN_SM90_WIDE_PRODUCER
#define FLASHATTN_SM90_WIDE_PRODUCER 1
#endif

// Dev switch: the staged epilogue stores O with TMA (fixed-length batches); 0: 16-byte stores.
#ifndef FLASHATTN_SM90_TMA_STORE
#define FLASHATTN_SM90_TMA_STORE 1
#endif

// Dev switches that pin one tile configuration for every problem of a head dim (the per-problem
// choice of launch_template.cuh is skipped when any of them is defined): block_n of head_dim 64
// (128 or 192), 128 (128 or 176), 192 (64 to 112) and 256 (64 or 80), where the O rescale runs
// (Traits::kRescaleEarly), the overlapped tile boundaries (Traits::kTileOverlap), the consumer
// warpgroups at head_dim 64 and 128 and, with 3, serial GEMMs (Traits::kSerial). dev/sm90/run.sh
// builds its variants with them.
#if defined(FLASHATTN_SM90_HDIM64_BLOCK_N) || defined(FLASHATTN_SM90_HDIM128_BLOCK_N) || \
    defined(FLASHATTN_SM90_HDIM192_BLOCK_N) || defined(FLASHATTN_SM90_HDIM256_BLOCK_N) ||   \
    defined(FLASHATTN_SM90_RESCALE_EARLY) || defined(FLASHATTN_SM90_TILE_OVERLAP) ||         \
    defined(FLASHATTN_SM90_HDIM64_CONSUMERS) || defined(FLASHATTN_SM90_HDIM128_CONSUMERS) || \
    defined(FLASHATTN_SM90_SERIAL)
#define FLASHATTN_SM90_DEV_CONFIG 1
#ifndef FLASHATTN_SM90_HDIM64_CONSUMERS
#define FLASHATTN_SM90_HDIM64_CONSUMERS 2
#endif
#ifndef FLASHATTN_SM90_HDIM128_CONSUMERS
#define FLASHATTN_SM90_HDIM128_CONSUMERS 2
#endif
#ifndef FLASHATTN_SM90_SERIAL
#define FLASHATTN_SM90_SERIAL 0
#endif
#ifndef FLASHATTN_SM90_HDIM64_BLOCK_N
#define FLASHATTN_SM90_HDIM64_BLOCK_N 128
#endif
#ifndef FLASHATTN_SM90_HDIM128_BLOCK_N
#define FLASHATTN_SM90_HDIM128_BLOCK_N 176
#endif
#ifndef FLASHATTN_SM90_HDIM192_BLOCK_N
#define FLASHATTN_SM90_HDIM192_BLOCK_N 112
#endif
#ifndef FLASHATTN_SM90_HDIM256_BLOCK_N
#define FLASHATTN_SM90_HDIM256_BLOCK_N 64
#endif
#ifndef FLASHATTN_SM90_RESCALE_EARLY
#define FLASHATTN_SM90_RESCALE_EARLY 0
#endif
#ifndef FLASHATTN_SM90_TILE_OVERLAP
#define FLASHATTN_SM90_TILE_OVERLAP 0
#endif
#else
#define FLASHATTN_SM90_DEV_CONFIG 0
#endif

namespace flashattn::cuda::sm90 {

// What the kernel reads besides the three tensor maps (q, k, v are read through TMA only).
struct FwdParams {
  void* o;  // (batch, seqlen_q, num_heads, head_dim), or varlen (total_q, num_heads, head_dim)
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  int32_t head_dim;  // o's columns: kHeadDim, or fewer (a multiple of 8; zero-padded: fwd_kernel_head_dim)
  float* lse;  // (batch, num_heads, seqlen_q) or varlen (num_heads, total_q); nullptr: not written
  const int32_t* cu_seqlens_q;  // nullptr unless varlen
  const int32_t* cu_seqlens_k;
  int32_t batch, num_heads, heads_per_kv_head;
  int32_t seqlen_q, seqlen_k;  // varlen: the longest
  int64_t total_q;
  // Scores go to the exp2 domain in the FFMA of the softmax: s * score_scale_log2 - max.
  float score_scale_log2;  // softmax_scale * log2(e); with softcap log2(e) (the cap applied first)
  float softcap_pre;       // softmax_scale / softcap (softcap on): s = softcap * tanh(q.k * softcap_pre)
  float softcap;
  int32_t has_softcap;
  int32_t causal, window_left, window_right;
  int32_t block_m;       // rows of q per tile: 64 per consumer warpgroup
  int32_t num_m_blocks;  // ceil(seqlen_q / block_m)
  int32_t row_shift;     // rows the first tile overhangs row 0 (causal_row_shift, launch_template.cuh)
  int32_t num_tiles;     // num_m_blocks * batch * num_heads
  int32_t heads_per_section;  // (batch, head) pairs whose k, v share L2 (the scheduler's swizzle)
  // Divisors of the tile decode: tiles of a section, heads of a section (of the last one, which
  // may hold fewer), heads.
  FastDivmod section_tiles_div, section_heads_div, last_section_heads_div, num_heads_div;
  int32_t snake_order;        // rounds of tiles alternate direction (scheduler.cuh)
  // The last round's split (non-causal fixed-length problems, fwd_tail_plan in launch_template.cuh):
  // the tiles from tail_begin on run as one stream of key blocks cut into tail.segments segments, one
  // per CTA (common/last_round_split.hpp). Their tasks come in two rounds after the whole tiles': piece 0
  // of every segment, then piece 1 (none where the segment lies in one tile), so num_tasks = tail_begin +
  // 2 * grid (no split: tail_begin = num_tasks = num_tiles). A piece leaves its partial O, row max and
  // row sum in the workspace; the warpgroup that finishes its rows last (a counter per split tile and
  // warpgroup) merges them and stores the tile.
  int32_t num_tasks, tail_begin;
  TailStream tail;
  float4* tail_o;   // [piece slot][warpgroup][O float4 n][thread]: the accumulator registers as they are
  float4* tail_ml;  // [piece slot][warpgroup][thread]: (row_max[0], row_max[1], row_sum[0], row_sum[1])
  int32_t* tail_done;  // [split tile][warpgroup]: pieces finished (zeroed before the launch)
  const float* alibi_slopes;  // ALiBi (Traits::kAlibi): slope of sequence b, head h at [b * stride + h]
  int64_t alibi_slopes_batch_stride;
  DropoutMask dropout;  // Traits::kDropout: P's keep mask and the scale of the kept (common/dropout.hpp)
#if FLASHATTN_SM90_TRACE
  long long* trace;
#endif
#if FLASHATTN_SM90_WATCHDOG
  int* watchdog;  // 1 + kWatchdogRecords * kWatchdogRecord ints, zeroed (primitives.cuh)
#endif
};

// A tile is (m_block, batch, head) of the persistent schedule (scheduler.cuh).
struct Tile {
  int32_t m_block, batch, head;
  // First q row of the tile in its sequence: m_block * block_m - FwdParams::row_shift (a causal
  // tile may overhang row 0). Rows outside [0, seqlen_q) are computed and not stored.
  int32_t row0;
  int64_t q_start, k_start;  // first row of the sequence in the packed tensors (0 unless varlen)
  int32_t seqlen_q, seqlen_k;
  // A piece of a split tile of the last round: its task index past FwdParams::tail_begin (the
  // piece: tail_piece_of); -1: the whole tile.
  int32_t tail_task;
  bool valid;  // false: past the end of a shorter varlen sequence (nothing to do); a plan's: no tile left
};

// What the producer publishes with a tile's q (SharedStorage::plan, one per q buffer, written before the
// q_full arrival that the consumers wait for): the tile and the key blocks it visits, so that the consumer
// warpgroups skip the tile decode and the mask's arithmetic between two tiles (~220 instructions a warp,
// 7% of the warps' samples at head_dim 64, causal, 512 keys: docs/sm90.md, step 52). tile.valid = false:
// no tile is left, the consumers' loop ends.
struct TilePlan {
  Tile tile;
  int32_t n_begin, n_end;          // the key blocks [n_begin, n_end) (scheduler.cuh's key_block_range)
  int64_t inner_begin, inner_end;  // the keys every row of the tile sees (tile_inner_keys)
};

// Pieces a split tile of the last round runs as, at most (merge_pieces, epilogue.cuh).
constexpr int kMaxTailPieces = 8;

// A kernel's configuration from its FwdConfig (fwd_config.hpp's table, one line a kernel): block_m = 64
// rows of q per consumer warpgroup, block_n keys per step; derived here: stages of the k/v ring, two q
// buffers where they fit, the epilogue. Shared memory: q stages * q + stages * (k + v). The
// configurations in use (fwd_kernel picks one per problem):
//   head_dim 64:  3 consumer warpgroups (block_m 192), block_n 128, 3 stages, 2 q (144 KB) + slabs
//                 (24 KB); causal past 1k rows: the same with serial GEMMs and block_n 192 (192 KB
//                 + slabs of 24 KB); short causal: 2 consumer warpgroups, early rescale (128 KB).
//   head_dim 128: block_n 128 with the early rescale, 2 q (192 KB); long: 3 consumer warpgroups
//                 with serial GEMMs, block_n 128, 2 stages, 2 q (224 KB), O stored from registers;
//                 long q and k without a mask: block_n 144, rescale after the wait, 2 q (208 KB).
//                 (block_n 176, 1 q (208 KB) + slabs of 64 columns: a dev configuration now.)
//   head_dim 192: block_n 64, 2 q (192 KB), staged epilogue; block_n 96, 1 q (192 KB) + slabs of 64
//                 columns (16 KB); block_n 112, 1 q (216 KB), O stored from registers.
//   head_dim 256: block_n 64, 2 stages, 1 q (192 KB) + the epilogue's slabs (32 KB); O alone is
//                 128 registers a thread. Long non-causal: block_n 80 (224 KB, no slabs).
// kRescaleEarly: the O rescale runs between the issue of S = q k^T and that of O += P v, while the
// tensor cores compute S; otherwise after the wait for O += P v (mainloop.cuh).
// kTileOverlap: the consumer runs its tiles as one stream of key blocks (Consumer::run): the next
// tile's first S is issued with the last O += P v of the tile before, whose epilogue runs while
// the S after it computes; otherwise tile by tile (Consumer::run_tile, then the epilogue). Not
// dispatched since step 9 (measured slower than tile by tile with the staged epilogue); a dev
// switch (FLASHATTN_SM90_TILE_OVERLAP).
// kConsumers: consumer warpgroups (3: more warps to hide the softmax behind; ping-pong needs 2).
// ptxas reports the launch bound's count (168 or 128 a thread) and allocates the consumers' code up
// to setmaxnreg's (240 or 160: the SASS uses up to R232 and R157; docs/sm90.md, step 26).
// kSerial: with 3 consumer warpgroups, each runs S = q k^T, the softmax and O += P v in turn.
// kTailSplit: the last round's tiles split (FwdParams::tail_begin, store_piece / merge_pieces): the
// head_dim 128 kernels of long keys for problems without a mask, a separate instantiation (the causal
// 3-warpgroup kernel with the split's code compiled in read 4% slower at 16k: docs/sm90.md, step 29).
template <FwdConfig kConfig, bool kBf16_>
struct Traits {
  static constexpr int kHeadDim = kConfig.head_dim;
  // O's columns below it need no guard (stores_column): the least head_dim this kernel runs zero-padded
  // (fwd_min_head_dim), but 136 at 256, where 200 made ptxas's code 1-3.5% slower (docs/sm90.md, step 78);
  // with 136 its PTX is that of the kernel before the kernel of 192.
  static constexpr int kMinHeadDim = kHeadDim == 256 ? fwd_min_head_dim(192) : fwd_min_head_dim(kHeadDim);
  static constexpr bool kBf16 = kBf16_;
  static constexpr int kConsumerWarpgroups = kConfig.consumers;
  static constexpr int kBlockM = kConfig.block_m();
  static constexpr int kBlockN = kConfig.block_n;
  static constexpr bool kRescaleEarly = kConfig.rescale_early;
  static constexpr int kThreads = 128 * (1 + kConsumerWarpgroups);
  // Ping-pong: the two consumer warpgroups take turns at issuing their GEMMs (mainloop.cuh). With the
  // softmax already overlapped inside each warpgroup it measured 1-8% slower at most shapes (docs/sm90.md,
  // steps 4-6). Today it pays in the short-key kernels where their configuration asks: head_dim 128
  // (block_n 128) +1-4% causal at 384-1k keys, even non-causal (step 33); head_dim 256 up to 1k keys
  // +1-2.5% with the L2 warm, 0-2% with it flushed (step 50). At head_dim 64 1-2% slower (steps 33, 50),
  // as with block_n 144.
  static constexpr bool kPingPong =
      kConsumerWarpgroups == 2 && (FLASHATTN_SM90_PINGPONG < 0 ? kConfig.pingpong : FLASHATTN_SM90_PINGPONG > 0);
  // Each consumer warpgroup runs its GEMMs one at a time (no overlap inside the warpgroup; the
  // other two warpgroups' GEMMs overlap its softmax): S and P are not live beside the next S,
  // which lets block_n grow (head_dim 64: 192) within 128 registers.
  static constexpr bool kSerial = kConfig.serial;
  static_assert(!kSerial || (kConsumerWarpgroups == 3 && !kConfig.tile_overlap && !kRescaleEarly),
                "serial: tile by tile, 3 warpgroups, O rescaled right after each softmax");
  // The producer thread decodes each tile and writes its plan: at head_dim 64 with 2 consumer warpgroups 56
  // registers for it and 224 for them (no spill either side) read +1-2% at causal 512-640 keys (docs/sm90.md,
  // step 53); the head_dim 128 consumers spill at 224.
  static constexpr bool kWideProducer = FLASHATTN_SM90_WIDE_PRODUCER && kHeadDim == 64 && kConsumerWarpgroups == 2;
  static constexpr int kProducerRegs = kWideProducer ? 56 : 24;
  // 24 * 128 + 240 * 256 and 56 * 128 + 224 * 256 = 64512 (168 a thread at launch), 24 * 128 + 160 * 384 <= 65536
  static constexpr int kConsumerRegs = kConsumerWarpgroups == 2 ? (kWideProducer ? 224 : 240) : 160;

  // 128-byte swizzled tiles are stored as panels of 64 columns (128 bytes) by rows.
  static constexpr int kPanels = kHeadDim / 64;
  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kKVBytes = kBlockN * kHeadDim * 2;
  static constexpr int kQPanelBytes = kBlockM * 128;
  static constexpr int kKVPanelBytes = kBlockN * 128;
  // Shared memory per CTA is 227 KB; 1 KB goes to the alignment slack, a little to the barriers.
  static constexpr int kSmemLimit = 227 * 1024 - 1024 - 256;
  // The k / v ring: 3 stages at head_dim 64, 2 elsewhere (deeper rings measured even or slower: step 33).
  static constexpr int kStages =
      FLASHATTN_SM90_STAGES > 0 && kQBytes + 2 * FLASHATTN_SM90_STAGES * kKVBytes <= kSmemLimit
          ? FLASHATTN_SM90_STAGES
          : kHeadDim == 64 ? 3 : 2;
  static constexpr bool kTileOverlap = kConfig.tile_overlap;
  static constexpr bool kAlibi = kConfig.alibi;  // ALiBi's bias (Consumer::alibi_scores)
  static constexpr bool kDropout = kConfig.dropout;  // dropout on P (Consumer::dropout_scores)
  // Two q buffers where they fit: the next tile's q loads while this one runs.
  static constexpr int kQStages = 2 * kQBytes + 2 * kStages * kKVBytes <= kSmemLimit ? 2 : 1;
  // The epilogue stages O in the tile's q buffer (epilogue.cuh) when the other q buffer lets the
  // next tile start meanwhile; tile by tile only (the stream stores while the next tile runs),
  // and with 2 consumer warpgroups (measured +4-10% at head_dim 128 with 512-2k keys, 3-5%
  // slower with 3 at head_dim 64).
  static constexpr bool kStagedEpilogue =
      FLASHATTN_SM90_STAGED_EPILOGUE && kQStages == 2 && !kTileOverlap && kConsumerWarpgroups == 2;
  // Where a tile has kQAfterKVFrom to kQAfterKVTo key blocks, the producer loads the next tile's q only after the
  // tile's k, v (Producer::run), not beside the loads its consumers wait for next (fwd_config's line says where;
  // kQAfterKVTo 0: nowhere).
  static constexpr int kQAfterKVFrom =
      FLASHATTN_SM90_Q_AFTER_KV_FROM >= 0 ? FLASHATTN_SM90_Q_AFTER_KV_FROM : kConfig.q_after_kv_from;
  static constexpr int kQAfterKVTo = kQStages < 2 || kConfig.q_after_kv_to == 0 ? 0
                                     : FLASHATTN_SM90_Q_AFTER_KV_TO >= 0        ? FLASHATTN_SM90_Q_AFTER_KV_TO
                                                                                : kConfig.q_after_kv_to;
  // The loads carry L2 eviction priorities: q evict_first (read once), k and v evict_last (read by
  // every tile of the head). Measured at head_dim 256: +3-6% causal at 512 keys, +1-3% at
  // 1k-4k, even elsewhere; at head_dim 64 and 128 even within the noise (docs/sm90.md, step 31); at 192
  // (block_n 112) +2-14% at 4k-16k (step 78).
  static constexpr bool kL2Hints = FLASHATTN_SM90_L2_HINTS < 0 ? kHeadDim >= 192 : FLASHATTN_SM90_L2_HINTS > 0;
  // q (64 x head_dim of the warpgroup) in registers, head_dim / 4 a thread: S = q k^T then reads
  // only k from shared memory. Room for it: head_dim 128 with block_n up to 144 (O 64 + S 72 + P 36
  // + q 32 floats a thread; 160 spills and serializes the wgmma).
  static constexpr bool kQInRegisters =
      FLASHATTN_SM90_Q_REGS && !kTileOverlap && kHeadDim == 128 && kBlockN <= 144 && kConsumerWarpgroups == 2;
  // The optimistic softmax (Consumer::optimistic_softmax) in the steady state, where the configuration
  // asks for it: head_dim 128 without a mask, in the block_n 144 kernel (long: +6.5% at 16k, +4.4% at
  // 8k; docs/sm90.md, step 37) and in the short-key one (block_n 128: +1-5% at 512-2k keys, step 45),
  // and head_dim 64 without a mask (3 warpgroups: +2-6% at 512-16k; step 46); causal in both with the
  // key blocks ascending (fwd_config.hpp's by_mask; step 47), and in head_dim 64's 2 warpgroups (step 49).
  // The block whose max moved issues S again, from q in registers or, at head_dim 64, from q in shared
  // memory (released after the check).
  static constexpr bool kOptimisticMax =
      FLASHATTN_SM90_OPT_MAX > 0 && kConfig.optimistic_max && !kSerial && !kTileOverlap;
  // The order of a tile's key blocks (producer and consumers alike, KeyOrder): from the last down, the
  // masked ones first, or ascending where the configuration asks (keys_forward; not in the overlapped stream).
  static constexpr bool kKeysForward = kConfig.keys_forward && !kTileOverlap;
  // The warpgroup index broadcast from lane 0 (kernel.cuh): ptxas then knows it is the same across a warp, and
  // keeps what derives from it (a consumer warpgroup's q rows, so the q operand's wgmma descriptors) in uniform
  // registers instead of vector registers moved over (R2UR) before each wgmma: at head_dim 64 R2UR 31-44 -> 16-21
  // a kernel, +1.0-2.7% causal at 512-2k keys, 0.99-1.00 at 16k; at head_dim 128 0.967 at 16k without a mask
  // (docs/sm90.md, step 74).
  static constexpr bool kUniformWarpgroup =
      FLASHATTN_SM90_UNIFORM_WG < 0 ? kHeadDim == 64 : FLASHATTN_SM90_UNIFORM_WG > 0;
  // Elsewhere O goes through a slab of shared memory per consumer warp (its 16 rows, kSlabCols
  // columns at a time: 128, or 64 where 128 does not fit; 0: no room, stored from registers).
  static constexpr int kSmemTiles = kQStages * kQBytes + 2 * kStages * kKVBytes;
  static constexpr int kSlabBytesPerCol = 4 * kConsumerWarpgroups * 16 * 2;  // every consumer warp
  static constexpr int kSlabWide = kHeadDim < 128 ? kHeadDim : kHeadDim % 128 == 0 ? 128 : 64;
  static constexpr int kSlabCols = !FLASHATTN_SM90_SLAB_EPILOGUE || kStagedEpilogue || kTileOverlap ? 0
                                   : kSmemTiles + kSlabWide * kSlabBytesPerCol <= kSmemLimit       ? kSlabWide
                                   : kSmemTiles + 64 * kSlabBytesPerCol <= kSmemLimit              ? 64
                                                                                                   : 0;
  static constexpr int kSlabBytes = kSlabCols * kSlabBytesPerCol;
  // The head_dim 64 and 256 kernels spilled 100-160 bytes in their main loops with the split's code
  // (session 20, with the merge inside the persistent loop), and the block_n 128 2-warpgroup head_dim
  // 128 kernel (8 bytes, once a tile) read 6-11% slower at 512-2k keys without splitting (step 24).
  static constexpr bool kTailSplit = kConfig.tail_split;
  // The consumers take each tile's plan from the producer with its q (TilePlan) instead of decoding the
  // schedule themselves: +1.5-3.7% at 512-1k keys, head_dim 64 and 128 (docs/sm90.md, step 52). Where
  // registers are short (3 warpgroups at 160 a thread, the split's kernel, head_dim 256's O) the plan, read
  // after the wait for q, sits in vector registers (a decoded tile in uniform ones): 64-500 bytes spilled,
  // 3-25% slower. Those decode as before (taking only the plan's key blocks measured even). With the staged
  // epilogue only: its bar.sync orders all 128 threads' reads of the plan before the first thread's release of
  // the q buffer, after which the producer writes the next plan there.
  static constexpr bool kPublishedTiles =
      kConsumerWarpgroups == 2 && !kTailSplit && kHeadDim <= 128 && kStagedEpilogue;
  // At head_dim 64 the consumers read the plan by ld.shared (ld_shared_copy), not by the generic loads plain
  // reads of smem.plan compile to: +0.9-1.6% at causal 512-640 keys, even elsewhere; 0.993-0.995x at head_dim
  // 128 512 keys without a mask, so not there (docs/sm90.md, step 69).
  static constexpr bool kPlanByLds = kPublishedTiles && kHeadDim == 64;
  // The row sums summed over the quad and their reciprocals taken while a tile's last O += P v runs, not after it
  // (Consumer::run_tile, inverse_row_sums): head_dim 64's 2-warpgroup kernels (+1.4-2.0% at causal 512-640 keys)
  // and its causal 3-warpgroup kernel (key blocks ascending: +0.1-0.8% at causal 896-1k keys, even at 2k-16k);
  // head_dim 64 without a mask 0.5-4% slower at 8k-16k, head_dim 128 and 256 even (docs/sm90.md, steps 68, 70).
  static constexpr bool kInverseEarly = kHeadDim == 64 && (kConsumerWarpgroups == 2 || kKeysForward);
  static_assert(!kTailSplit || (kHeadDim == 128 && !kTileOverlap), "split tiles: head_dim 128, tile by tile");
  static_assert(!kAlibi || (!kTileOverlap && !kTailSplit && !kOptimisticMax), "ALiBi: whole tiles, the full softmax");
  static_assert(!kDropout || (!kTileOverlap && !kTailSplit && !kOptimisticMax && !kAlibi && kBlockN % 16 == 0),
                "dropout: whole tiles, the full softmax, whole 16 x 16 dropout tiles a block");
  static_assert(kHeadDim % 64 == 0 && kBlockN % 16 == 0, "panels of 64 columns, k16 steps");
  static_assert((kBlockN / 8) % 2 == 0 && kBlockN % 8 == 0, "8-row swizzle atoms, chunk pairs");
  // setmaxnreg moves registers inside the pool the launch gave the CTA: 64K / kThreads a thread, in 8s.
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumerWarpgroups <= 65536 / kThreads / 8 * 8 * kThreads,
                "the CTA's register pool");
};

// SharedStorage::plan where the producer publishes none.
struct NoPlans {};

template <class T>
struct alignas(1024) SharedStorage {
  uint8_t q[T::kQStages][T::kQBytes];    // (block_m, head_dim) as kPanels x (block_m, 64), swizzled
  uint8_t k[T::kStages][T::kKVBytes];    // (block_n, head_dim) per stage, same layout
  uint8_t v[T::kStages][T::kKVBytes];
  uint64_t q_full[T::kQStages], q_empty[T::kQStages];
  uint64_t k_full[T::kStages], k_empty[T::kStages];
  uint64_t v_full[T::kStages], v_empty[T::kStages];
  // Split tiles (Traits::kTailSplit) whose merge falls to a consumer warpgroup: the tail task of its piece
  // 0 and 1, or -1 (kernel.cuh). Here, not in registers: live across the main loop they spilled there.
  int32_t merge_task[T::kConsumerWarpgroups][2];
  // The tile whose q is in q[s] (Traits::kPublishedTiles).
  std::conditional_t<T::kPublishedTiles, TilePlan[T::kQStages], NoPlans> plan;
  // Traits::kSlabCols (epilogue.cuh); TMA stores from it: 1024-byte aligned panels.
  alignas(T::kSlabBytes > 0 ? 1024 : 16) uint8_t slab[T::kSlabBytes > 0 ? T::kSlabBytes : 16];
};

}  // namespace flashattn::cuda::sm90
