// Dropout's keep mask: which scores of P survive, the same on every backend and in both passes.
//
// Element (b, h, i, j) (sequence b, query head h, query row i, key j, in the sequence's own rows) is
// kept iff a 16-bit random number r is >= threshold, threshold = round(p * 65536): the probability of
// a drop is threshold / 65536 (p to 1/65536), and the kept ones are scaled by
// 65536 / (65536 - threshold), so that E[P_dropped] = P exactly. r comes from Philox4x32-10 (Salmon
// et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011), one call per 8 elements laid out as
// a GPU thread holds them in an mma.m16n8 accumulator: P in 16 x 16 tiles (row tile i / 16, key tile
// j / 16); in a tile, element (r, c) = (i % 16, j % 16) belongs to lane 4 (r % 8) + (c % 8) / 2, which
// holds rows r % 8 and + 8, keys 2 t, 2 t + 1 and + 8, + 9, as number e = c % 2 + 2 (r / 8) + 4 (c / 8)
// of its call: counter (j / 16, 32 (i / 16) + lane, b * num_heads + h, low word of offset), key (low
// word of seed, high word of seed xor high word of offset); number e is bits 16 (e % 2) of output word
// e / 2. The forward's thread (rows x keys) makes one call a tile (keep_bits); a thread holding the
// transposed tile (keys x rows) makes one too and trades halves with another lane (transposed_*).
#pragma once

#include <cstdint>

#include "flashattn/flashattn.h"

#if defined(__CUDACC__)
#define FA_DROPOUT_HD __host__ __device__ __forceinline__
#else
#define FA_DROPOUT_HD inline
#endif

namespace flashattn {

struct Philox4 {
  uint32_t x, y, z, w;
};

FA_DROPOUT_HD void mul_hi_lo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t m = uint64_t(a) * b;
  hi = uint32_t(m >> 32);
  lo = uint32_t(m);
}

// Philox4x32 with 10 rounds (the Random123 constants).
FA_DROPOUT_HD Philox4 philox4x32_10(Philox4 c, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mul_hi_lo(0xD2511F53u, c.x, hi0, lo0);
    mul_hi_lo(0xCD9E8D57u, c.z, hi1, lo1);
    c = {hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0};
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c;
}

// The per-call state of one problem's dropout: threshold and scale from p, the key from seed and offset.
struct DropoutMask {
  uint32_t threshold = 0;  // 0: off
  float scale = 1.f;       // 65536 / (65536 - threshold)
  uint32_t key0 = 0, key1 = 0, offset_lo = 0;

  FA_DROPOUT_HD static DropoutMask make(float dropout_p, uint64_t seed, uint64_t offset) {
    DropoutMask m;
    if (!(dropout_p > 0.f)) return m;
    const float t = dropout_p * 65536.f + 0.5f;
    m.threshold = t >= 65535.f ? 65535u : uint32_t(t);
    m.scale = 65536.f / float(65536u - m.threshold);
    m.key0 = uint32_t(seed);
    m.key1 = uint32_t(seed >> 32) ^ uint32_t(offset >> 32);
    m.offset_lo = uint32_t(offset);
    return m;
  }
  FA_DROPOUT_HD static DropoutMask of(const fa_params& p) {
    return make(p.dropout_p, p.dropout_seed, p.dropout_offset);
  }
  FA_DROPOUT_HD bool on() const { return threshold != 0; }
  // The call of lane `lane` of tile (row tile i16, key tile j16) of (sequence b, head h), bh = b * heads + h.
  FA_DROPOUT_HD Philox4 call(int32_t bh, int32_t i16, int32_t j16, int lane) const {
    return philox4x32_10({uint32_t(j16), uint32_t(i16) * 32u + uint32_t(lane), uint32_t(bh), offset_lo}, key0, key1);
  }
  // Its 8 numbers.
  FA_DROPOUT_HD void randoms(int32_t bh, int32_t i16, int32_t j16, int lane, uint16_t (&r)[8]) const {
    const Philox4 o = call(bh, i16, j16, lane);
    const uint32_t words[4] = {o.x, o.y, o.z, o.w};
    for (int e = 0; e < 8; ++e) r[e] = uint16_t(words[e / 2] >> (16 * (e % 2)));
  }
  // Bit e set iff number e of lane `lane`'s 8 in tile (i16, j16) is kept: the GPU forward's thread, which
  // holds the tile as that lane of the mma accumulator (rows x keys).
  FA_DROPOUT_HD uint32_t keep_bits(int32_t bh, int32_t i16, int32_t j16, int lane) const {
    uint16_t r[8];
    randoms(bh, i16, j16, lane, r);
    uint32_t bits = 0;
    for (int e = 0; e < 8; ++e) bits |= uint32_t(kept(r[e])) << e;
    return bits;
  }
  // The tile held transposed (keys x rows, the backward's S^T) by lane 4 g + t of an mma accumulator: its
  // element (n8 tile nt, accumulator element e), key g + 8 (e / 2) and row 8 nt + 2 t + e % 2 of the tile,
  // is bit 4 nt + e of its keep bits. Those 8 numbers are half g % 2 of each of two lanes' calls, 8 t + g / 2
  // (e % 2 = 0) and + 4 (e % 2 = 1); the thread of the other g of the pair (lane ^ 4) needs the other halves
  // of the same two calls. So each makes one of them (transposed_lane: the one of e % 2 = g % 2), hands its
  // partner the halves it needs (transposed_send; the kernels shuffle them) and combines its own call with
  // what it receives (transposed_keep_bits): one call a tile, not two.
  FA_DROPOUT_HD static int transposed_lane(int g, int t) { return 8 * t + 4 * (g % 2) + g / 2; }
  // The partner's halves (1 - g % 2) of the call's four words, two to a word (word 2 w + k in half k of send[w]).
  FA_DROPOUT_HD static void transposed_send(const Philox4& o, int g, uint32_t (&send)[2]) {
    const uint32_t words[4] = {o.x, o.y, o.z, o.w};
    for (int w = 0; w < 2; ++w) {
      const uint32_t a = words[2 * w], b = words[2 * w + 1];
      send[w] = g % 2 ? (a & 0xffffu) | (b << 16) : (a >> 16) | (b & 0xffff0000u);
    }
  }
  // The keep bits from this thread's call o and the halves recv its partner sent: word k of a call holds
  // n8 tile k % 2 and key half k / 2, so its numbers are bits 4 (k % 2) + 2 (k / 2) + e % 2.
  FA_DROPOUT_HD uint32_t transposed_keep_bits(const Philox4& o, const uint32_t (&recv)[2], int g) const {
    const uint32_t words[4] = {o.x, o.y, o.z, o.w};
    const int x = g % 2;
    uint32_t bits = 0;
    for (int k = 0; k < 4; ++k) {
      const int bit = 4 * (k % 2) + 2 * (k / 2);
      bits |= uint32_t(kept(uint16_t(words[k] >> (16 * x)))) << (bit + x);
      bits |= uint32_t(kept(uint16_t(recv[k / 2] >> (16 * (k % 2))))) << (bit + 1 - x);
    }
    return bits;
  }
  // Element e of a lane's 8 in its tile: (row, key) in the tile.
  FA_DROPOUT_HD static int tile_row(int lane, int e) { return lane / 4 + 8 * ((e / 2) % 2); }
  FA_DROPOUT_HD static int tile_key(int lane, int e) { return 2 * (lane % 4) + e % 2 + 8 * (e / 4); }
  FA_DROPOUT_HD bool kept(uint16_t r) const { return r >= threshold; }
  // One element, for the references (a call per element: slow, exact).
  FA_DROPOUT_HD bool kept(int32_t bh, int32_t i, int32_t j) const {
    const int r = i % 16, c = j % 16;
    uint16_t x[8];
    randoms(bh, i / 16, j / 16, 4 * (r % 8) + (c % 8) / 2, x);
    return kept(x[c % 2 + 2 * (r / 8) + 4 * (c / 8)]);
  }
};

}  // namespace flashattn
