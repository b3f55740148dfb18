// The CPU kernels' scratch memory (kernels.hpp's Buffer): each thread keeps the blocks its buffers freed for
// its next ones. Fresh blocks of a megabyte or more come from mmap, and their pages fault on first touch
// every call: 480 faults a call at 1k keys, 4 heads, head_dim 64 (the packed K and V), a third of the
// forward's time with a 64 + 64 window (docs/cpu.md).
#include <cstdlib>
#include <new>
#include <utility>
#include <vector>

#include "cpu/kernels.hpp"

namespace flashattn::cpu {
namespace {

constexpr size_t kMaxHeldBytes = size_t(256) << 20;  // kept a thread, at most (oldest dropped first)
constexpr size_t kMaxHeldBlocks = 64;

struct Pool {
  std::vector<std::pair<size_t, void*>> blocks;  // (bytes, block), oldest first
  size_t held = 0;
  void drop_oldest() {
    held -= blocks.front().first;
    std::free(blocks.front().second);
    blocks.erase(blocks.begin());
  }
  ~Pool() {
    while (!blocks.empty()) drop_oldest();
  }
};
thread_local Pool pool;

}  // namespace

void* scratch_take(size_t bytes, size_t* capacity) {
  // The smallest kept block that holds `bytes` and is at most twice as large.
  size_t best = pool.blocks.size();
  for (size_t i = 0; i < pool.blocks.size(); ++i) {
    const size_t size = pool.blocks[i].first;
    if (size >= bytes && size / 2 <= bytes && (best == pool.blocks.size() || size < pool.blocks[best].first)) best = i;
  }
  if (best < pool.blocks.size()) {
    void* block = pool.blocks[best].second;
    *capacity = pool.blocks[best].first;
    pool.held -= *capacity;
    pool.blocks.erase(pool.blocks.begin() + std::ptrdiff_t(best));
    return block;
  }
  void* block = std::aligned_alloc(64, bytes);
  if (!block) throw std::bad_alloc();
  *capacity = bytes;
  return block;
}

void scratch_give(void* block, size_t capacity) {
  if (capacity > kMaxHeldBytes) {
    std::free(block);
    return;
  }
  while (!pool.blocks.empty() && (pool.held + capacity > kMaxHeldBytes || pool.blocks.size() >= kMaxHeldBlocks))
    pool.drop_oldest();
  pool.blocks.emplace_back(capacity, block);
  pool.held += capacity;
}

}  // namespace flashattn::cpu
