// The Hopper forward kernel: one persistent CTA per SM, 1 + kConsumerWarpgroups warpgroups.
//   warpgroup 0: producer (TMA), registers lowered to kProducerRegs; one thread issues the loads.
//   warpgroups 1..: consumers (wgmma + softmax), 64 rows of the block_m-row q tile each,
//   registers raised to kConsumerRegs.
#pragma once

#include <cuda.h>

#include "cuda/sm90/mainloop.cuh"

namespace flashattn::cuda::sm90 {

template <class T>
__global__ void __launch_bounds__(T::kThreads, 1)
    fwd_kernel(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
               const __grid_constant__ CUtensorMap map_v, const __grid_constant__ CUtensorMap map_o,
               const __grid_constant__ FwdParams p) {
  extern __shared__ uint8_t smem_raw[];
  // TMA's 128-byte swizzle and the wgmma descriptors assume 1024-byte aligned tiles.
  auto& smem = *reinterpret_cast<SharedStorage<T>*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const int warpgroup = T::kUniformWarpgroup ? uniform_warpgroup_index() : int(threadIdx.x / 128);

  if (threadIdx.x == 0) {
    for (int s = 0; s < T::kQStages; ++s) {
      mbar_init(&smem.q_full[s], 1);
      // One arrival a consumer warpgroup (racecheck's build: one a thread, consumer_next_tile).
      const int arrivals = T::kPublishedTiles && FLASHATTN_SM90_PLAN_RELEASE_EVERY ? 128 : 1;
      mbar_init(&smem.q_empty[s], T::kConsumerWarpgroups * arrivals);
    }
    for (int s = 0; s < T::kStages; ++s) {
      mbar_init(&smem.k_full[s], 1);
      mbar_init(&smem.k_empty[s], T::kConsumerWarpgroups);
      mbar_init(&smem.v_full[s], 1);
      mbar_init(&smem.v_empty[s], T::kConsumerWarpgroups);
    }
    mbar_fence_init();
    tma_prefetch_descriptor(&map_q);
    tma_prefetch_descriptor(&map_k);
    tma_prefetch_descriptor(&map_v);
    if (T::kStagedEpilogue || T::kSlabCols > 0) tma_prefetch_descriptor(&map_o);
#if FLASHATTN_SM90_WATCHDOG
    watchdog_log = p.watchdog;
#endif
  }
  __syncthreads();

  if (warpgroup == 0) {
    setmaxnreg_dec<T::kProducerRegs>();
    if (threadIdx.x == 0) Producer<T>::run(&map_q, &map_k, &map_v, smem, p);
  } else {
    setmaxnreg_inc<T::kConsumerRegs>();
    const int consumer_wg = warpgroup - 1;
    if (consumer_wg == 0) SM90_TRACE_CTA(p, 0);
    // Warpgroup 0 issues first: its turn is given once here; the last turn handed back to it is
    // taken after the loop, so the barrier ends balanced.
    if (consumer_wg == 1) pingpong_pass<T>(consumer_wg);
    Consumer<T> consumer;
    if constexpr (T::kTileOverlap) {
      consumer.run(smem, p, consumer_wg);
    } else {
      PipelineState<T::kStages> pipe;
      PipelineState<T::kQStages> q_pipe;
      int32_t round = 0;  // of the schedule, where the consumers decode it (consumer_next_tile)
      TilePlan plan;
      int deferred_q_release = -1;  // q buffer a TMA store of O may still be reading
      // The split tiles whose merge falls to this warpgroup (at most the CTA's two tail tasks, its last):
      // its first thread writes them, the warpgroup reads them after the loop.
      int32_t(&merge_task)[2] = smem.merge_task[consumer_wg];
      if (T::kTailSplit && threadIdx.x % 128 == 0) merge_task[0] = merge_task[1] = -1;
      while (consumer_next_tile<T>(smem, p, q_pipe, round, plan)) {
        const int qs = q_pipe.index;
        const Tile& tile = plan.tile;
        SM90_TRACE(p, consumer_wg, consumer.trace_count, 8);
        consumer.run_tile(smem, p, plan, consumer_wg, pipe, q_pipe, deferred_q_release);
        deferred_q_release = -1;
        // A piece of a split tile leaves its part in the workspace (the staged epilogue's q buffer is then
        // free: q is in registers or read, store_piece held the warpgroup at a barrier after its last
        // S); the warpgroup that finishes the tile's rows last merges them after the loop.
        bool store = true;
        if constexpr (T::kTailSplit) {
          if (tile.tail_task >= 0) {
            const bool last = store_piece<T>(consumer.o, consumer.row_max, consumer.row_sum, p, tile, consumer_wg);
            if (last && threadIdx.x % 128 == 0) merge_task[tile.tail_task >= int32_t(gridDim.x)] = tile.tail_task;
            if (T::kStagedEpilogue && threadIdx.x % 128 == 0) mbar_arrive(&smem.q_empty[qs]);
            store = false;
          }
        }
        if (store) {
          float inv[2];
          consumer.epilogue_inverse(inv);
          if constexpr (T::kDropout) inv[0] *= p.dropout.scale, inv[1] *= p.dropout.scale;  // O of the kept P / (1 - p)
          if constexpr (T::kStagedEpilogue) {
            if (store_tile_staged<T>(consumer.o, consumer.row_max, consumer.row_sum, inv, p, &map_o, tile, consumer_wg,
                                     smem.q[qs], &smem.q_empty[qs], consumer.trace_count))
              deferred_q_release = qs;
          } else if constexpr (T::kSlabCols > 0) {
            store_tile_slab<T>(consumer.o, consumer.row_max, consumer.row_sum, inv, p, &map_o, tile, consumer_wg,
                               smem.slab, consumer.trace_count);
          } else {
            store_tile<T>(consumer.o, consumer.row_max, consumer.row_sum, inv, p, tile, consumer_wg);
          }
        }
        SM90_TRACE(p, consumer_wg, consumer.trace_count, 7);
        ++consumer.trace_count;
      }
      // The last TMA store done before the CTA (and its shared memory) goes; no q load follows it,
      // so its buffer needs no release.
      if (deferred_q_release >= 0 && threadIdx.x % 128 == 0) bulk_wait_group_0<false>();
      if (T::kSlabCols > 0 && threadIdx.x % 32 == 0) bulk_wait_group_0<false>();  // the slabs' stores
      if constexpr (T::kTailSplit) {
        named_barrier_sync(kEpilogueBarrier + consumer_wg, 128);  // merge_task written
#pragma unroll 1
        for (int sub = 0; sub < 2; ++sub)
          if (merge_task[sub] >= 0) merge_pieces<T>(p, decode_tile<true>(p.tail_begin + merge_task[sub], p), consumer_wg);
      }
    }
    if (consumer_wg == 0) pingpong_wait<T>(consumer_wg);
    static_assert(T::kConsumerWarpgroups <= 3, "the trace's CTA record: a start and an end per consumer warpgroup");
    SM90_TRACE_CTA(p, 1 + consumer_wg);
  }
}

}  // namespace flashattn::cuda::sm90
