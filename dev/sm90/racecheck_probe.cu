// Does compute-sanitizer's racecheck follow the hand-off the sm90 forward uses for tile plans (TilePlan)?
// A producer thread writes a plan into one of two slots, arrives on full[slot]; the 2 x 128 consumer threads wait
// on full[slot], read the plan, and release the slot through empty[slot] in one of several ways; the producer
// waits on empty[slot] before it writes that slot again. Run each variant under racecheck:
//
//   nvcc -std=c++20 -arch=sm_90a -Isrc dev/sm90/racecheck_probe.cu -o /tmp/probe
//   for v in 0 1 2 3 4; do compute-sanitizer --tool racecheck /tmp/probe $v; done
//
// Variants (how a warpgroup's reads are ordered before its one release):
//   0 none: thread 0 arrives right after its own read (a real race: the other warps' reads are unordered)
//   1 bar.sync of the warpgroup (128), then thread 0 arrives
//   2 ping-pong: bar.sync of id 1 + wg with 256 threads, the other warpgroup arriving (bar.arrive), then thread 0
//   3 each warp: __syncwarp, then its lane 0 arrives (empty counts 4 a warpgroup)
//   4 every thread arrives (empty counts 128 a warpgroup)
#include <cstdio>
#include <cstdlib>

#include "cuda/sm90/primitives.cuh"

using namespace flashattn::cuda::sm90;

struct Plan {
  int a, b, c, d;
};

constexpr int kTiles = 16;

__global__ void probe(int variant, int* out) {
  __shared__ uint64_t full[2], empty[2];
  __shared__ Plan plan[2];
  const int wg = threadIdx.x / 128, thread = threadIdx.x % 128, lane = threadIdx.x % 32;
  const uint32_t empty_count = variant == 3 ? 8 : variant == 4 ? 256 : 2;
  if (threadIdx.x == 0) {
    for (int s = 0; s < 2; ++s) mbar_init(&full[s], 1), mbar_init(&empty[s], empty_count);
    mbar_fence_init();
  }
  __syncthreads();
  if (wg == 2) {  // producer
    if (thread != 0) return;
    for (int t = 0; t < kTiles; ++t) {
      const int s = t % 2;
      const uint32_t phase = (t / 2) % 2;
      mbar_wait(&empty[s], phase ^ 1);
      plan[s] = Plan{t, t + 1, t + 2, t + 3};
      mbar_arrive(&full[s]);
    }
    return;
  }
  int sum = 0;
  if (variant == 2 && wg == 1) named_barrier_arrive(1, 256);  // the first turn to warpgroup 0
  for (int t = 0; t < kTiles; ++t) {
    const int s = t % 2;
    const uint32_t phase = (t / 2) % 2;
    mbar_wait(&full[s], phase);
    const Plan p = plan[s];
    sum += p.a + p.b * 3 + p.c * 5 + p.d * 7;
    switch (variant) {
      case 1: named_barrier_sync(3 + wg, 128); break;
      case 2:  // each warpgroup in turn, wg 0 first: both take a bar.sync every tile
        if (wg == 0) {
          named_barrier_sync(1, 256);
          named_barrier_arrive(2, 256);
        } else {
          named_barrier_sync(2, 256);
          if (t + 1 < kTiles) named_barrier_arrive(1, 256);
        }
        break;
      case 3: __syncwarp(); break;
      default: break;
    }
    const bool arrive = variant == 4 || (variant == 3 ? lane == 0 : thread == 0);
    if (arrive) mbar_arrive(&empty[s]);
  }
  out[threadIdx.x] = sum;
}

int main(int argc, char** argv) {
  const int variant = argc > 1 ? std::atoi(argv[1]) : 0;
  int* out;
  cudaMalloc(&out, 384 * sizeof(int));
  probe<<<1, 384>>>(variant, out);
  const cudaError_t err = cudaDeviceSynchronize();
  int host[256];
  cudaMemcpy(host, out, sizeof(host), cudaMemcpyDeviceToHost);
  int expect = 0;
  for (int t = 0; t < kTiles; ++t) expect += t + (t + 1) * 3 + (t + 2) * 5 + (t + 3) * 7;
  int wrong = 0;
  for (int i = 0; i < 256; ++i) wrong += host[i] != expect;
  std::printf("variant %d: %s, %d of 256 sums wrong\n", variant, cudaGetErrorString(err), wrong);
  return err != cudaSuccess || wrong != 0;
}
