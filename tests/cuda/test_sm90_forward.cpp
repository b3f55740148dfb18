// The Hopper (TMA + wgmma) forward against the fp64 reference with the anchor rule: the standard
// awkward-shape list in fp16 and bf16 for the head dims it takes (multiples of 8 up to 256), plus shapes long enough that
// every CTA of the persistent grid runs several tiles through the k/v ring (causal, windowed,
// softcapped, GQA, varlen with empty sequences, ALiBi) and causal ones long enough for the configurations
// of many query rows (launch_template.cuh). Skips without an sm_90 GPU.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/cuda_backend.hpp"
#include "cuda/kernels.hpp"
#include "cuda/sm90/fwd_config.hpp"
#include "support/harness.hpp"

namespace {

using fa_test::Case;

std::vector<Case> sm90_forward_cases() {
  std::vector<Case> out;
  auto causal = [](Case c) {
    c.causal = true;
    return c;
  };
  for (fa_dtype dt : {FA_FLOAT16, FA_BFLOAT16}) {
    // The kernel takes head dims that are multiples of 8 up to 256 (on its kernels of 64, 128, 192, 256, zero-padded
    // between them) and 16-byte strides (TMA); the rest goes to sm80.
    auto takes = [](const Case& c) { return flashattn::cuda::sm90::fwd_kernel_head_dim(c.head_dim) != 0; };
    for (const Case& c : fa_test::standard_forward_cases(dt, 256))
      if (takes(c) && c.row_padding % 8 == 0) out.push_back(c);
    // The shared dropout cases it takes (not with ALiBi: those go to sm80).
    for (const Case& c : fa_test::dropout_cases(dt))
      if (takes(c) && c.alibi == 0) out.push_back(c);
    // The kernels' head dims, and padded ones: 40 on the kernel of 64, 96 on 128, 136 on 192 and 200 on 256 (the
    // least each runs: one 8-column chunk of the last panel stored, fwd_min_head_dim).
    for (int d : {40, 64, 96, 128, 136, 192, 200, 256}) {
      Case c;
      c.dtype = dt, c.head_dim = d, c.batch = 2, c.seqlen_q = 1000, c.seqlen_k = 1100, c.num_heads = 8;
      c.num_heads_kv = 2;
      out.push_back(c);
      c.causal = true;
      out.push_back(c);
      c.causal = false, c.window_left = 300, c.window_right = 0, c.softcap = 20.f;
      out.push_back(c);
      Case v;
      v.dtype = dt, v.head_dim = d, v.num_heads = 4, v.num_heads_kv = 1, v.causal = true;
      v.seqlens_q = {700, 0, 129, 1, 520}, v.seqlens_k = {900, 40, 0, 333, 520};
      v.batch = 5, v.seqlen_q = 700, v.seqlen_k = 900;
      out.push_back(v);
      // Scores of a few units and more (scale 0.6 on unit-normal q, k): a row's max keeps rising by
      // more than 2^8 in p over several key blocks, so O is rescaled past the first block (the
      // kernel keeps a stale max below that, and with the default scale that rescale hardly runs).
      Case big = fa_test::make_case(dt, 1, 200, 900, 2, 1, d);
      big.softmax_scale = 0.6f;
      out.push_back(big);
      big.causal = true;
      out.push_back(big);
      // A long key range: the tile configurations chosen for many key blocks (launch_template.cuh).
      Case l;
      l.dtype = dt, l.head_dim = d, l.batch = 1, l.seqlen_q = 300, l.seqlen_k = 8300, l.num_heads = 2;
      l.num_heads_kv = 1;
      out.push_back(l);
      l.causal = true;
      out.push_back(l);
      // ALiBi (its own kernel a head dim): per head and per sequence, causal with tiles overhanging row 0,
      // more queries than keys, a window with softcap, varlen with empty sequences.
      Case a = fa_test::make_case(dt, 2, 300, 333, 4, 2, d);
      a.alibi = 1, a.alibi_max_slope = 0.5f;
      out.push_back(a);
      a.alibi = 2, a.causal = true, a.seqlen_q = 1000, a.seqlen_k = 700;
      out.push_back(a);
      a.causal = false, a.window_left = 100, a.window_right = 30, a.softcap = 5.f, a.alibi_max_slope = 4.f;
      out.push_back(a);
      Case av = fa_test::varlen(fa_test::make_case(dt, 1, 1, 1, 4, 1, d), {400, 0, 129, 1}, {300, 40, 0, 500});
      av.alibi = 2, av.alibi_max_slope = 1.f, av.causal = true;
      out.push_back(av);
      // Dropout (its own kernel a head dim, tiles from row 0): GQA, causal with more queries than keys and most
      // of P dropped, a window with softcap, varlen with empty sequences, many key blocks.
      Case dr = fa_test::make_case(dt, 2, 300, 333, 4, 2, d);
      dr.dropout_p = 0.15f, dr.dropout_seed = uint64_t(d) << 40 | 21;
      out.push_back(dr);
      dr.causal = true, dr.seqlen_q = 1000, dr.seqlen_k = 700, dr.dropout_p = 0.6f;
      out.push_back(dr);
      dr.causal = false, dr.window_left = 100, dr.window_right = 30, dr.softcap = 5.f, dr.dropout_p = 0.3f;
      out.push_back(dr);
      Case dv = fa_test::varlen(fa_test::make_case(dt, 1, 1, 1, 4, 1, d), {400, 0, 129, 1}, {300, 40, 0, 500});
      dv.dropout_p = 0.2f, dv.dropout_seed = 9, dv.causal = true;
      out.push_back(dv);
      Case dl = fa_test::make_case(dt, 1, 300, 2100, 2, 1, d);
      dl.dropout_p = 0.1f, dl.dropout_seed = 12, dl.causal = true;
      out.push_back(dl);
      // Head_dim 256 up to 1k keys (ping-pong), and 192, with several tiles a CTA, GQA 4:1, without a mask and
      // causal (head_dim 192: block_n 96, and causal block_n 64 with 2 q buffers); head_dim 192 past 4k keys
      // likewise (block_n 112, one q buffer).
      if (d == 192 || d == 256) {
        Case pp = fa_test::make_case(dt, 4, 640, 1000, 16, 4, d);
        out.push_back(pp);
        pp.causal = true;
        out.push_back(pp);
      }
      if (d == 192) {
        Case lk = fa_test::make_case(dt, 2, 640, 4200, 16, 4, d);
        out.push_back(lk);
        lk.causal = true;
        out.push_back(lk);
      }
      // Several tiles per CTA with empty ones among them (rows before the window, sequences
      // without keys): the release of an empty tile's q once every warp has seen it arrive (a
      // hang at head_dim 256, one q buffer, before the fix; 192 has one too).
      if (d == 192 || d == 256 || dt == FA_BFLOAT16) {
        Case e;
        e.dtype = dt, e.head_dim = d, e.num_heads = 32, e.num_heads_kv = 8, e.window_left = 64, e.window_right = 16;
        e.seqlens_q = {300, 0, 1, 129, 256, 70, 400, 128, 5, 200};
        e.seqlens_k = {200, 10, 300, 0, 256, 500, 130, 128, 64, 190};
        e.batch = 10, e.seqlen_q = 400, e.seqlen_k = 500;
        out.push_back(e);
      }
    }
    // Causal with many query rows: head_dim 64 up to 2k keys runs the kernel whose tiles compute the
    // fewest scores (hdim64_causal_kernel: 1500 x 1700 the 3 consumer warpgroups with block_n 128, 384 x
    // 384 the serial ones with block_n 192), past them the 3 warpgroups, from 8k rows their tiles longest
    // first over all heads (below, in sections sized by the schedule's model: launch_template.cuh).
    Case c;
    c.dtype = dt, c.head_dim = 64, c.batch = 2, c.seqlen_q = 1500, c.seqlen_k = 1700, c.num_heads = 4;
    c.num_heads_kv = 2, c.causal = true;
    out.push_back(c);
    // The same configuration (its longest sequence past 1k rows) with varlen, a window, softcap.
    Case v;
    v.dtype = dt, v.head_dim = 64, v.num_heads = 6, v.num_heads_kv = 2, v.causal = true, v.softcap = 15.f;
    v.seqlens_q = {1100, 0, 1300, 7}, v.seqlens_k = {1200, 50, 1300, 900};
    v.batch = 4, v.seqlen_q = 1300, v.seqlen_k = 1300;
    out.push_back(v);
    c.window_left = 250, c.softcap = 30.f;
    out.push_back(c);
    c.window_left = -1, c.softcap = 0.f;
    Case serial = fa_test::make_case(dt, 3, 384, 384, 4, 2, 64);
    serial.causal = true;
    out.push_back(serial);
    // 512 x 512 the 2 warpgroups, key blocks ascending with the optimistic softmax: the default scale, maxima
    // that keep rising (0.6), P overflowing (8: the check fails, S issued again); 640 with GQA; varlen (tiles
    // from row 0) up to 500 rows.
    for (float scale : {0.f, 0.6f, 8.f}) {
      Case two = fa_test::make_case(dt, 2, 512, 512, 4, 2, 64);
      two.causal = true, two.softmax_scale = scale;
      out.push_back(two);
    }
    out.push_back(causal(fa_test::make_case(dt, 1, 640, 640, 8, 1, 64)));
    // The same kernel with more tiles than 2 x 132 SMs (320): CTAs reuse a q buffer and its tile plan (read by
    // ld.shared); scripts/gpu_run.sh runs the sanitizers on it.
    out.push_back(causal(fa_test::make_case(dt, 8, 512, 512, 10, 2, 64)));
    // 1k x 1k on the 3 warpgroups (192-row tiles, the first overhanging row 0 by 128 rows: two of its warpgroups
    // have no row; the upper warpgroups' rows end a key block before the tile's), and 1300 x 900 (the serial
    // 3 warpgroups; rows without a key).
    if (dt == FA_BFLOAT16) {
      out.push_back(causal(fa_test::make_case(dt, 2, 1024, 1024, 6, 2, 64)));
      out.push_back(causal(fa_test::make_case(dt, 2, 1300, 900, 4, 2, 64)));
    }
    Case tv = fa_test::varlen(fa_test::make_case(dt, 1, 1, 1, 4, 2, 64), {500, 0, 130, 1}, {480, 20, 300, 64});
    tv.causal = true, tv.softmax_scale = 8.f;
    out.push_back(tv);
    if (dt == FA_BFLOAT16) {
      c.batch = 1, c.seqlen_q = c.seqlen_k = 8200, c.num_heads = c.num_heads_kv = 1;
      out.push_back(c);
      // From 8k rows a window's left edge: the 3 warpgroups with the full softmax.
      c.window_left = 1000;
      out.push_back(c);
      c.window_left = -1;
      c.head_dim = 128, c.seqlen_q = 4200, c.seqlen_k = 4300, c.num_heads = 2;
      out.push_back(c);
      // Head_dim 128 causal past 8k keys (block_n 144, a partial last key block), fixed length and varlen.
      c.seqlen_q = 12400, c.seqlen_k = 12500, c.num_heads = 1;
      out.push_back(c);
      Case lv = fa_test::varlen(fa_test::make_case(dt, 1, 1, 1, 2, 1, 128), {9000, 5, 0}, {9100, 8300, 7});
      lv.causal = true;
      out.push_back(lv);
    }
    // Head_dim 128 past 2k keys with varlen and softcap: without a window (3 consumer warpgroups, serial
    // GEMMs), with a left edge (2 warpgroups in ping-pong, block_n 128, the full softmax), with a right edge
    // alone (the 3 warpgroups); causal with 2k-4k keys (2 warpgroups, the optimistic softmax).
    Case w;
    w.dtype = dt, w.head_dim = 128, w.num_heads = 4, w.num_heads_kv = 2, w.softcap = 20.f;
    w.seqlens_q = {300, 0, 2500, 1}, w.seqlens_k = {3000, 100, 2600, 2200};
    w.batch = 4, w.seqlen_q = 2500, w.seqlen_k = 3000;
    out.push_back(w);
    w.window_left = 500;
    out.push_back(w);
    w.window_left = -1, w.window_right = 700;
    out.push_back(w);
    w.window_right = -1;
    if (dt == FA_BFLOAT16) {
      w.num_heads = 2, w.num_heads_kv = 1, w.window_left = -1, w.softcap = 0.f, w.causal = true;
      w.seqlens_q = {4200, 3, 0}, w.seqlens_k = {4400, 4300, 10};
      w.batch = 3, w.seqlen_q = 4200, w.seqlen_k = 4400;
      out.push_back(w);
    }
    // Head_dim 128 without a mask past 2k queries and keys (2 consumer warpgroups, block_n 144, q in
    // registers): partial last m-block and key block, GQA, softcap; 2k-4k as well.
    Case n = fa_test::make_case(dt, 1, 4150, 4999, 3, 1, 128);
    n.softcap = 30.f;
    out.push_back(n);
    out.push_back(fa_test::make_case(dt, 2, 2100, 3000, 4, 2, 128));
    // Its optimistic softmax (mainloop.cuh) where its check fails: scores that keep raising rows' maxima
    // after the first key block, by more than 2^8 in P (scale 0.6) and by 2^128 and more (scale 8: P
    // overflows). The warpgroup issues S again and takes the full softmax.
    for (float scale : {0.6f, 8.f}) {
      Case b = fa_test::make_case(dt, 1, 4150, 4999, 2, 1, 128);
      b.softmax_scale = scale;
      out.push_back(b);
    }
    // The short-key kernel's optimistic softmax (head_dim 128 up to 2k keys) where its check fails: maxima
    // that keep rising (scale 0.6), P overflowing (scale 8); without a mask, causal (key blocks ascending)
    // and, for the dispatch, a window (the full softmax); fixed length and varlen. At head_dim 64 the
    // 3-warpgroup kernel's (q in shared memory, released after the check).
    for (int d : {64, 128}) {
      for (float scale : {0.6f, 8.f})
        for (int mask = 0; mask < 3; ++mask) {
          Case s = fa_test::make_case(dt, 2, 300, 1000, 4, 2, d);
          s.softmax_scale = scale;
          s.causal = mask == 1;
          if (mask == 2) s.window_left = 150, s.window_right = 40;
          out.push_back(s);
        }
      Case sv;
      sv.dtype = dt, sv.head_dim = d, sv.num_heads = 2, sv.num_heads_kv = 1, sv.softmax_scale = 8.f;
      sv.seqlens_q = {500, 0, 129, 1, 2000}, sv.seqlens_k = {700, 30, 0, 333, 1900};
      sv.batch = 5, sv.seqlen_q = 2000, sv.seqlen_k = 1900;
      out.push_back(sv);
    }
    // Head_dim 128 without a mask, 385-512 keys (4 key blocks a tile): several tiles a CTA, GQA, the optimistic
    // softmax's check failing (scale 8), varlen with an empty sequence and a row without keys.
    Case f = fa_test::make_case(dt, 4, 1000, 500, 16, 4, 128);
    out.push_back(f);
    f = fa_test::make_case(dt, 2, 700, 420, 8, 8, 128);
    f.softmax_scale = 8.f;
    out.push_back(f);
    out.push_back(fa_test::varlen(fa_test::make_case(dt, 1, 1, 1, 8, 2, 128), {900, 0, 300, 1}, {500, 7, 450, 0}));
    // More tiles than SMs without a mask at other key-block counts: 5 (the last partial; the producer loads the next q
    // after a tile's k, v there, Traits::kQAfterKVTo) with GQA and scale 8, 2, and 1 (fewer blocks than k / v stages).
    f = fa_test::make_case(dt, 3, 900, 600, 12, 3, 128);
    f.softmax_scale = 8.f;
    out.push_back(f);
    out.push_back(fa_test::make_case(dt, 4, 1000, 250, 8, 8, 128));
    out.push_back(fa_test::make_case(dt, 2, 1200, 100, 16, 1, 128));
    // Tiles aligned to the sequence's end (causal_row_shift: here the first tile overhangs row 0).
    Case cz;
    cz.dtype = dt, cz.head_dim = 128, cz.causal = true, cz.batch = 1, cz.num_heads = 4, cz.num_heads_kv = 2;
    cz.seqlen_q = 2600, cz.seqlen_k = 3001;
    out.push_back(cz);
    // The same with more query rows than keys (the rows of the overhanging tile see no key) and a window.
    cz.seqlen_q = 3500, cz.seqlen_k = 2100, cz.num_heads = 2, cz.num_heads_kv = 1, cz.window_left = 500;
    out.push_back(cz);
    // Causal whole rounds of whole heads (causal_grid_schedule, on 132 SMs): 250 tiles of 5 a head on 125 CTAs
    // (head_dim 128, 640 keys), 252 of 7 on 126 (head_dim 256, 896 keys, GQA); two rounds each, sections of one head.
    out.push_back(causal(fa_test::make_case(dt, 10, 640, 640, 5, 5, 128)));
    out.push_back(causal(fa_test::make_case(dt, 9, 896, 896, 4, 2, 256)));
  }
  return out;
}

std::string param_name(const testing::TestParamInfo<Case>& info) { return fa_test::test_name(info.param.name()); }

class Sm90Forward : public testing::TestWithParam<Case> {};

TEST_P(Sm90Forward, MatchesReference) {
  if (!fa_test::hopper_present()) GTEST_SKIP() << "no sm_90 GPU";
  EXPECT_TRUE(fa_test::check_forward(GetParam(), FA_IMPL_CUDA_SM90, fa_test::Space::Cuda));
}

INSTANTIATE_TEST_SUITE_P(Standard, Sm90Forward, testing::ValuesIn(sm90_forward_cases()), param_name);

// The smallest head count from `from` on whose tiles (m_blocks a head) leave more than half a round of
// SMs for the last round (more: true) or at most half (false).
int heads_leaving(int sms, int m_blocks, bool more, int from) {
  for (int h = from;; ++h) {
    const int rest = (h * m_blocks) % sms;
    if (rest > 0 && (rest > sms / 2) == more) return h;
  }
}

// The last round's split (fwd_tail_plan, launch_template.cuh): where tiles % SMs leaves a short last
// round and every tile visits every key block, the last tiles run as one stream of key blocks cut into
// a segment per SM (or equal pieces, for few tiles) whose partial O, row max and row sum merge in the
// workspace. The kernels that split: head_dim 128 past 2k keys (192-row tiles, 3 consumer warpgroups)
// and, past 2k queries and keys, block_n 144 on 2 warpgroups (128-row tiles, q in registers, the staged
// epilogue). Shapes sized from this GPU's SM count: one tile a head over all SMs + 1 or + 3 (8 equal
// pieces), fewer tiles than SMs (partial m-blocks), more than half a round left (pieces of two tiles
// in a segment) and less; a partial last key block, GQA, MQA, softcap, a larger scale.
TEST(Sm90Forward, LastRoundSplitMatchesReference) {
  if (!fa_test::hopper_present()) GTEST_SKIP() << "no sm_90 GPU";
  int dev = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), cudaSuccess);
  std::vector<Case> cases;
  for (fa_dtype dt : {FA_FLOAT16, FA_BFLOAT16}) {
    // 3 consumer warpgroups, 192-row tiles.
    Case c = fa_test::make_case(dt, 1, 100, 2500, sms + 1, sms + 1, 128);  // 20 key blocks
    cases.push_back(c);
    c = fa_test::make_case(dt, 1, 150, 2900, sms + 3, 1, 128);  // MQA, 23 key blocks
    c.softcap = 25.f;
    cases.push_back(c);
    c = fa_test::make_case(dt, 2, 300, 2100, 4, 2, 128);  // 16 tiles (a partial m-block each head)
    cases.push_back(c);
    c = fa_test::make_case(dt, 3, 500, 4000, 3, 3, 128);  // 27 tiles, 32 key blocks
    c.softmax_scale = 0.6f;  // maxima that differ from piece to piece
    cases.push_back(c);
    const int h6 = heads_leaving(sms, 6, true, 1);  // 1000 rows: 6 tiles a head
    c = fa_test::make_case(dt, 1, 1000, 3000, h6, 1, 128);
    cases.push_back(c);
    // block_n 144, 128-row tiles: 4200 rows are 33 tiles a head, 4999 keys 35 key blocks (a partial one).
    c = fa_test::make_case(dt, 1, 4200, 4999, heads_leaving(sms, 33, true, 1), 1, 128);
    c.softcap = 30.f;
    cases.push_back(c);
    c = fa_test::make_case(dt, 1, 4100, 4500, heads_leaving(sms, 33, false, 2), 1, 128);  // a partial m-block
    c.softmax_scale = 0.5f;
    cases.push_back(c);
    // Head_dim 96 and 80 on these kernels (zero-padded to 128): the merge's stores of 96 or 80 columns.
    cases.push_back(fa_test::make_case(dt, 1, 100, 2500, sms + 1, sms + 1, 96));
    cases.push_back(fa_test::make_case(dt, 1, 4200, 4999, heads_leaving(sms, 33, true, 1), 1, 80));
  }
  for (const Case& c : cases) {
    fa_params p;
    fa_params_init(&p);
    p.dtype = c.dtype, p.head_dim = c.head_dim, p.batch = c.batch, p.seqlen_q = c.seqlen_q, p.seqlen_k = c.seqlen_k;
    p.num_heads = c.num_heads, p.num_heads_kv = c.num_heads_kv;
    fa_params_set_contiguous_strides(&p);
    EXPECT_GT(flashattn::cuda::sm90_forward_workspace(p), 0u) << c.name() << ": no split planned";
    EXPECT_TRUE(fa_test::check_forward(c, FA_IMPL_CUDA_SM90, fa_test::Space::Cuda)) << c.name();
    p.num_splits = 1;  // key splits off: whole tiles, no workspace
    EXPECT_EQ(flashattn::cuda::sm90_forward_workspace(p), 0u) << c.name();
  }
}

// The split tiles' pieces merge in piece order whichever finishes last: two calls give the same bits, on
// both kernels that split (3 consumer warpgroups; block_n 144 past 2k queries and keys).
TEST(Sm90Forward, LastRoundSplitIsDeterministic) {
  if (!fa_test::hopper_present()) GTEST_SKIP() << "no sm_90 GPU";
  int dev = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), cudaSuccess);
  struct Shape {
    int seqlen_q, seqlen_k, heads;
  };
  for (const Shape shape : {Shape{150, 3000, sms + 2}, Shape{4200, 4999, heads_leaving(sms, 33, true, 1)}}) {
    SCOPED_TRACE(std::to_string(shape.seqlen_q) + " x " + std::to_string(shape.seqlen_k));
    fa_params p;
    fa_params_init(&p);
    p.dtype = FA_BFLOAT16, p.head_dim = 128, p.batch = 1, p.seqlen_q = shape.seqlen_q, p.seqlen_k = shape.seqlen_k;
    p.num_heads = p.num_heads_kv = shape.heads;
    fa_params_set_contiguous_strides(&p);
    const size_t elems = size_t(std::max(p.seqlen_q, p.seqlen_k)) * p.num_heads * p.head_dim;
    const size_t rows = size_t(p.seqlen_q) * p.num_heads;
    std::vector<uint16_t> host(elems);
    uint32_t x = 12345;
    for (uint16_t& h : host) {  // bf16 in [-2, 2): sign, exponent 126-127, random mantissa
      x = x * 1664525u + 1013904223u;
      h = uint16_t(((x >> 16) & 0x80ff) | 0x3f00);
    }
    void *q, *k, *v, *o, *ws;
    float* lse;
    for (void** ptr : {&q, &k, &v, &o}) ASSERT_EQ(cudaMalloc(ptr, elems * 2), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&lse, rows * 4), cudaSuccess);
    for (void* ptr : {q, k, v}) ASSERT_EQ(cudaMemcpy(ptr, host.data(), elems * 2, cudaMemcpyHostToDevice), cudaSuccess);
    p.q = q, p.k = k, p.v = v, p.o = o, p.lse = lse;
    size_t ws_bytes = 0;
    ASSERT_EQ(fa_workspace_size(&p, FA_IMPL_CUDA_SM90, 0, &ws_bytes), FA_OK) << fa_last_error();
    ASSERT_GT(ws_bytes, 0u);
    ASSERT_EQ(cudaMalloc(&ws, ws_bytes), cudaSuccess);
    p.workspace = ws, p.workspace_bytes = ws_bytes;
    std::vector<uint16_t> o_first(rows * p.head_dim), o_again(o_first.size());
    std::vector<float> lse_first(rows), lse_again(rows);
    for (int call = 0; call < 2; ++call) {
      ASSERT_EQ(fa_forward(&p, FA_IMPL_CUDA_SM90), FA_OK) << fa_last_error();
      ASSERT_EQ(cudaMemcpy((call ? o_again : o_first).data(), o, o_first.size() * 2, cudaMemcpyDeviceToHost),
                cudaSuccess);
      ASSERT_EQ(cudaMemcpy((call ? lse_again : lse_first).data(), lse, rows * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    }
    EXPECT_TRUE(o_first == o_again);
    EXPECT_EQ(std::memcmp(lse_first.data(), lse_again.data(), rows * 4), 0);
    for (void* ptr : {q, k, v, o, static_cast<void*>(lse), ws}) cudaFree(ptr);
  }
}

// The dispatcher on an sm_90 GPU takes the Hopper forward, except for decode (a few query rows over
// 16 key blocks or more: the sm80 decode config), where its tiles leave SMs idle and the sm80 forward
// splits the keys, or where the caller asks for splits.
TEST(Sm90Dispatch, DecodeGoesToTheSplitKvForward) {
  if (!fa_test::hopper_present()) GTEST_SKIP() << "no sm_90 GPU";
  fa_params p;
  fa_params_init(&p);
  p.dtype = FA_BFLOAT16, p.head_dim = 128, p.num_heads = p.num_heads_kv = 16, p.batch = 1;
  p.seqlen_q = 1, p.seqlen_k = 16384;
  auto layout = [&] {  // contiguous (batch, seqlen, heads, head_dim); the pointers stay null (not read)
    p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = p.head_dim;
    p.q_row_stride = p.o_row_stride = p.k_row_stride = p.v_row_stride = int64_t(p.num_heads) * p.head_dim;
    p.q_batch_stride = p.o_batch_stride = p.seqlen_q * p.q_row_stride;
    p.k_batch_stride = p.v_batch_stride = p.seqlen_k * p.k_row_stride;
  };
  layout();
  EXPECT_EQ(flashattn::cuda::best_impl(p, false), FA_IMPL_CUDA_SM80);  // 16 tiles
  EXPECT_EQ(flashattn::cuda::best_impl(p, true), FA_IMPL_CUDA_SM90);
  p.batch = 16;  // 256 tiles: every SM has one, and still decode
  EXPECT_EQ(flashattn::cuda::best_impl(p, false), FA_IMPL_CUDA_SM80);
  p.seqlen_k = 512;  // 8 key blocks: not decode, the Hopper tiles fill the GPU
  layout();
  EXPECT_EQ(flashattn::cuda::best_impl(p, false), FA_IMPL_CUDA_SM90);
  p.num_splits = 4;
  EXPECT_EQ(flashattn::cuda::best_impl(p, false), FA_IMPL_CUDA_SM80);
  p.num_splits = 0, p.batch = 1, p.seqlen_q = 4096, p.seqlen_k = 16384;  // a long prefill: no split
  layout();
  EXPECT_EQ(flashattn::cuda::best_impl(p, false), FA_IMPL_CUDA_SM90);
}

// The decode problems the dispatcher sends to the split-KV forward, through FA_IMPL_AUTO.
TEST(Sm90Dispatch, DecodeThroughAutoMatchesReference) {
  if (!fa_test::hopper_present()) GTEST_SKIP() << "no sm_90 GPU";
  for (fa_dtype dt : {FA_FLOAT16, FA_BFLOAT16}) {
    Case c;
    c.dtype = dt, c.head_dim = 128, c.batch = 2, c.seqlen_q = 1, c.seqlen_k = 9000, c.num_heads = 8;
    c.num_heads_kv = 8;
    EXPECT_TRUE(fa_test::check_forward(c, FA_IMPL_AUTO, fa_test::Space::Cuda));
    c.num_heads_kv = 2, c.seqlen_q = 3, c.causal = true;  // GQA, a few query rows
    EXPECT_TRUE(fa_test::check_forward(c, FA_IMPL_AUTO, fa_test::Space::Cuda));
  }
}

}  // namespace
