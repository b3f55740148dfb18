// Block sizes from the paper's rule, and the default on-chip budget M (the core's L2).
//
// The FlashAttention paper sizes the blocks so that the four tiles a step touches (Q_i, K_j, V_j,
// O_i) fit in an on-chip memory of M elements: B_c = ceil(M / 4d), B_r = min(B_c, d). On the CPU the
// "on-chip memory" is the core's L2 and the elements are fp32 (every dtype is computed in fp32), so
// M = cache_bytes / sizeof(float) and
//   B_c = ceil(cache_bytes / (4 * head_dim * sizeof(float))),  B_r = min(B_c, head_dim),
// both clamped to >= 1. Example: L2 512 KiB, head_dim 64 -> B_c = 512, B_r = 64.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <string>

#include "cpu/cpu_backend.hpp"

namespace flashattn::cpu {

// Exported (the library hides symbols by default): the CLI's IO model and the tests use the rule.
FA_API BlockSizes block_sizes(int64_t cache_bytes, int head_dim) {
  const int64_t d = std::max(head_dim, 1);
  const int64_t m_elements = std::max<int64_t>(cache_bytes, 0) / int64_t(sizeof(float));
  int64_t block_c = (m_elements + 4 * d - 1) / (4 * d);
  block_c = std::clamp<int64_t>(block_c, 1, int64_t(1) << 20);  // 1 << 20: keeps tiles addressable by int
  int64_t block_r = std::max<int64_t>(std::min(block_c, d), 1);
  return {int(block_r), int(block_c)};
}

namespace {

// "512K", "1M", "1048576" -> bytes; 0 when unreadable.
int64_t parse_size(const std::string& s) {
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (v <= 0 || end == s.c_str()) return 0;
  switch (*end) {
    case 'K': case 'k': return v << 10;
    case 'M': case 'm': return v << 20;
    case 'G': case 'g': return v << 30;
    default: return v;
  }
}

}  // namespace

FA_API int64_t l2_cache_bytes() {
  static const int64_t bytes = [] {
#ifdef _SC_LEVEL2_CACHE_SIZE
    long v = sysconf(_SC_LEVEL2_CACHE_SIZE);
    if (v > 0) return int64_t(v);
#endif
    // sysfs: find the level-2 data or unified cache of cpu0.
    for (int index = 0; index < 8; ++index) {
      std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
      std::ifstream level(dir + "level"), type(dir + "type"), size(dir + "size");
      int lv = 0;
      std::string ty, sz;
      if (!(level >> lv) || !(type >> ty) || !(size >> sz)) continue;
      if (lv == 2 && ty != "Instruction") {
        int64_t b = parse_size(sz);
        if (b > 0) return b;
      }
    }
    return int64_t(1) << 20;
  }();
  return bytes;
}

}  // namespace flashattn::cpu
