// Hopper primitives as thin inline-PTX wrappers: mbarriers, TMA loads, wgmma descriptors and
// fences, setmaxnreg, named barriers. Everything here is sm_90a device code.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace flashattn::cuda::sm90 {

// The thread's warpgroup, broadcast from lane 0: ptxas then knows it is the same across the warp, and keeps what
// derives from it (a warpgroup's shared-memory rows, so its wgmma descriptors) in uniform registers instead of
// moving them over (R2UR) before each wgmma (docs/sm90.md, step 74).
__device__ __forceinline__ int uniform_warpgroup_index() { return __shfl_sync(0xffffffffu, int(threadIdx.x / 128), 0); }

__device__ __forceinline__ uint32_t smem_addr(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// mbarrier ------------------------------------------------------------------------------------
// Phases alternate parity 0, 1, 0, ...; wait(parity) returns once the phase of that parity has
// completed. A fresh barrier is in phase 0, so wait(1) passes at once (the producer's first lap).

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

// Makes the initialized barriers visible to the other threads and to the TMA unit.
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// One arrival plus the number of bytes the TMA loads of this phase will deliver.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}

__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

// Non-blocking: whether the phase of that parity has completed (try_wait may suspend a while).
__device__ __forceinline__ bool mbar_test_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\n"
      "mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

// Dev switch: a watchdog on every mbar_wait. A wait that spins for ~2^32 clocks (a hang) records
// the barrier (its offset in the 1024-byte line after the k/v tiles: the index into q_full,
// q_empty, k_full, k_empty, v_full, v_empty), its raw state and where each warpgroup of the CTA
// was (SM90_WATCH) into FwdParams::watchdog (kernel.cuh sets watchdog_log from it), then gives
// up; after the first report every wait gives up within ~2^20 clocks, so the kernel ends. No
// printf: a call in the kernel serializes the wgmma (ptxas C7510) and moves the timing.
#ifndef FLASHATTN_SM90_WATCHDOG
#define FLASHATTN_SM90_WATCHDOG 0
#endif
#if FLASHATTN_SM90_WATCHDOG
constexpr int kWatchdogRecord = 20, kWatchdogRecords = 64;  // ints a record; [0]: records written
static __device__ int* watchdog_log;
static __device__ int watchdog_fired;
static __device__ int4 watchdog_where[1024 * 4];  // (block, warpgroup): what SM90_WATCH last wrote
#define SM90_WATCH(slot, a, b, c, d)                                                                \
  do {                                                                                              \
    if (threadIdx.x % 128 == 0) watchdog_where[blockIdx.x * 4 + (slot)] = make_int4(a, b, c, d); \
  } while (0)
__device__ __forceinline__ void watchdog_report(uint64_t* bar, uint32_t parity) {
  atomicExch(&watchdog_fired, 1);
  const int i = atomicAdd(watchdog_log, 1);
  if (i >= kWatchdogRecords) return;
  uint64_t state;
  asm volatile("ld.shared.b64 %0, [%1];" : "=l"(state) : "r"(smem_addr(bar)));
  int* r = watchdog_log + 1 + i * kWatchdogRecord;
  r[0] = blockIdx.x;
  r[1] = threadIdx.x;
  r[2] = (smem_addr(bar) % 1024) / 8;
  r[3] = parity;
  r[4] = int(state >> 32);
  r[5] = int(state);
  for (int w = 0; w < 4; ++w) {
    const volatile int4& x = watchdog_where[blockIdx.x * 4 + w];
    r[6 + 3 * w] = x.x;
    r[7 + 3 * w] = x.y;
    r[8 + 3 * w] = x.z * 1000 + x.w;  // key block (or -1 q, 10000 + n v, 20000 last PV) and tile count
  }
  __threadfence_system();
}
#else
#define SM90_WATCH(slot, a, b, c, d) \
  do {                               \
  } while (0)
#endif

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
#if FLASHATTN_SM90_WATCHDOG
  const long long start = clock64();
  while (!mbar_try_wait(bar, parity)) {
    if (clock64() - start > (*(volatile int*)&watchdog_fired ? (1ll << 20) : (1ll << 32))) {
      watchdog_report(bar, parity);
      return;
    }
  }
#else
  while (!mbar_try_wait(bar, parity)) {
  }
#endif
}

// TMA -----------------------------------------------------------------------------------------

__device__ __forceinline__ void tma_prefetch_descriptor(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// One box of a 4D tensor map (coordinates innermost first) into shared memory; completion is
// counted in bytes on `bar`.
__device__ __forceinline__ void tma_load_4d(const CUtensorMap* map, uint64_t* bar, void* dst, int c0, int c1, int c2,
                                            int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];" ::"r"(
          smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// L2 eviction priorities for TMA (createpolicy): evict_first for data used once, evict_last for
// data other tiles read again. Not volatile: a constant, computed once where the compiler can.
__device__ __forceinline__ uint64_t l2_evict_first() {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ uint64_t l2_evict_last() {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
// tma_load_4d with an L2 policy.
__device__ __forceinline__ void tma_load_4d(const CUtensorMap* map, uint64_t* bar, void* dst, int c0, int c1, int c2,
                                            int c3, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4, %5, %6}], [%2], %7;" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "l"(policy)
      : "memory");
}

// One box from shared memory to a 4D tensor map (TMA store; rows outside the tensor are not
// written), in the thread's current bulk async-group.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, const void* src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// Waits until the thread's committed TMA stores have read their shared memory (kRead) or are done.
template <bool kRead>
__device__ __forceinline__ void bulk_wait_group_0() {
  if constexpr (kRead) {
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
  } else {
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  }
}

// wgmma ---------------------------------------------------------------------------------------

// Shared-memory matrix descriptor for the 128-byte swizzle (the layout TMA writes with
// CU_TENSOR_MAP_SWIZZLE_128B): rows of 128 bytes, 8-row atoms of 1024 bytes.
//   K-major (Q, K):  lbo unused, sbo = 1024 (next 8 rows); the k16 step adds 32 bytes.
//   MN-major (V):    lbo = bytes to the next 64-column panel, sbo = 1024 (next 8 rows of k).
__device__ __forceinline__ uint64_t make_smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  uint64_t desc = 0;
  desc |= uint64_t((addr & 0x3FFFF) >> 4);
  desc |= uint64_t((lbo >> 4) & 0x3FFF) << 16;
  desc |= uint64_t((sbo >> 4) & 0x3FFF) << 32;
  desc |= uint64_t(1) << 62;  // layout type 1: 128-byte swizzle
  return desc;
}

// A tile's descriptor, to which each k16 step adds its byte offset. The start-address field
// (address / 16, bits 0-13) is the low word's low bits and every address stays below 256 KB, so
// offset / 16 adds to the low word without a carry: one uniform add a wgmma, where
// make_smem_desc per step compiled to six uniform instructions (add, mask, shift, or, two moves).
struct SmemDesc {
  uint32_t lo, hi;
  __device__ __forceinline__ SmemDesc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    const uint64_t d = make_smem_desc(addr, lbo, sbo);
    lo = uint32_t(d);
    hi = uint32_t(d >> 32);
  }
  __device__ __forceinline__ uint64_t at(uint32_t offset) const { return (uint64_t(hi) << 32) | (lo + (offset >> 4)); }
};

// Descriptor of a 128-byte-swizzled operand: K-major (rows of 64 k-elements; the k16 step adds
// 32 bytes) or MN-major (lbo: the next 64-wide panel of M / N; a k16 step is 16 rows, 2048 bytes).
__device__ __forceinline__ SmemDesc kmajor_desc(uint32_t addr) { return SmemDesc(addr, 16, 1024); }
__device__ __forceinline__ SmemDesc mnmajor_desc(uint32_t addr, uint32_t panel_bytes) {
  return SmemDesc(addr, panel_bytes, 1024);
}

// Orders this warpgroup's register and shared-memory accesses before the wgmma that follow.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving reads or writes of accumulator registers across wgmma
// issue / wait points (it does not see that the tensor cores own them in between).
template <int N>
__device__ __forceinline__ void fence_registers(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_registers(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// Registers and barriers ------------------------------------------------------------------------

template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}

// Barrier among `threads` threads (a multiple of 32) on hardware barrier `id` (1..15; 0 is
// __syncthreads). arrive does not wait.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
// bar.sync that also returns whether `pred` held in any of the threads (the named barrier's
// __syncthreads_or).
__device__ __forceinline__ bool named_barrier_or(int id, int threads, bool pred) {
  uint32_t any;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n bar.red.or.pred q, %2, %3, p;\n selp.u32 %0, 1, 0, q;\n}"
      : "=r"(any)
      : "r"(uint32_t(pred)), "r"(id), "r"(threads)
      : "memory");
  return any != 0;
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Shared-memory staging ------------------------------------------------------------------------

// Address of 16-byte chunk c of row r in a tile laid out as TMA's 128-byte swizzle writes it:
// panels of 64 columns (8 chunks) panel_bytes apart, rows of 128 bytes; chunk c % 8 of row r sits
// at c % 8 ^ r % 8 (8-row atoms).
__device__ __forceinline__ uint32_t swizzled_chunk(uint32_t base, int panel_bytes, int r, int c) {
  return base + (c / 8) * panel_bytes + r * 128 + (((c % 8) ^ (r % 8)) << 4);
}

// Four 8x8 b16 matrices from shared memory to the mma fragment layout (register j: matrix j, row
// lane / 4, columns 2 (lane % 4), + 1); lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// The reverse: four 8x8 b16 matrices from the mma fragment layout to shared memory, addressed the same way.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

// A copy of x (8-byte aligned, trivially copyable) from shared memory by 8-byte ld.shared, issued in
// program order (volatile: after the wait that publishes it). The kernel rounds its shared memory's base
// as an integer, so plain reads of its fields are generic loads.
template <class X>
__device__ __forceinline__ X ld_shared_copy(const X& x) {
  static_assert(sizeof(X) % 8 == 0 && alignof(X) >= 8, "8-byte words");
  uint2 w[sizeof(X) / 8];
  const uint32_t addr = smem_addr(&x);
#pragma unroll
  for (int i = 0; i < int(sizeof(X) / 8); ++i)
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(w[i].x), "=r"(w[i].y) : "r"(addr + 8 * i));
  X out;
  __builtin_memcpy(&out, w, sizeof(X));
  return out;
}

__device__ __forceinline__ uint4 ld_shared_v4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
// One 16-byte store (the compiler splits a uint4 store into four here).
__device__ __forceinline__ void st_global_v4(void* ptr, uint4 v) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(ptr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
// Orders this thread's generic-proxy shared-memory accesses before later async-proxy ones (TMA).
__device__ __forceinline__ void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

__device__ __forceinline__ uint32_t pack2(float lo, float hi, bool bf16) {
  uint32_t r;
  if (bf16) {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  }
  return r;
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace flashattn::cuda::sm90
