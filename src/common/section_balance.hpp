// The Hopper forward's static tile schedule in a model, to size its L2 sections (plain C++: the CPU tests
// check it). cuda/sm90/scheduler.cuh: the tiles of a section of heads_per_section (batch, head) pairs run
// with the m_block as the outer loop (causal: the longest first); round r gives tiles r G ... r G + G - 1
// to the G CTAs, in reverse order in odd rounds (snake). A CTA's time is the sum of its tiles' costs. Causal
// tiles differ in length, and where the sections do not fit the rounds the long tiles pile up on some
// CTAs: 25 heads of 8 m_blocks (head_dim 256, 1k keys, the L2's choice) put 1.19x the mean on one CTA,
// 11, 22 or 33 heads 1.01-1.03x.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace flashattn {

// The largest sum of tile costs over the grid's CTAs. cost[i]: the cost of the i-th m_block in run order
// (the same for every (batch, head)); num_bh (batch, head) pairs in sections of heads_per_section.
inline int64_t snake_makespan(const std::vector<int32_t>& cost, int64_t num_bh, int64_t heads_per_section,
                              int32_t grid) {
  std::vector<int64_t> load(size_t(grid), 0);
  int32_t pos = 0;  // the next tile's place in its round
  bool reverse = false;
  for (int64_t first = 0; first < num_bh; first += heads_per_section) {
    const int64_t heads = std::min(heads_per_section, num_bh - first);
    for (const int32_t c : cost)
      for (int64_t left = heads; left > 0;) {  // `heads` tiles of cost c, in runs to the round's end
        const int32_t run = int32_t(std::min<int64_t>(left, grid - pos));
        int64_t* first_cta = load.data() + (reverse ? grid - pos - run : pos);  // the run's CTAs, a range
        for (int32_t i = 0; i < run; ++i) first_cta[i] += c;
        left -= run;
        pos += run;
        if (pos == grid) {
          pos = 0;
          reverse = !reverse;
        }
      }
  }
  return *std::max_element(load.begin(), load.end());
}

// Tiles past which balanced_section_heads keeps l2_heads unmeasured: the model would cost the host about a
// millisecond on a problem's first call.
constexpr int64_t kSectionModelTiles = int64_t(1) << 16;

// The section size, in (batch, head) pairs, whose schedule has the smallest makespan. l2_heads: the heads
// whose k and v take half the L2 (the size without the model). The candidates: the divisors of the grid
// up to 2 l2_heads (a full L2; the tiles running at once read a window of their k and v), l2_heads and 2
// l2_heads; of those within 2% of the best, the smallest (fewer heads at once, more reuse in L2).
inline int64_t balanced_section_heads(const std::vector<int32_t>& cost, int64_t num_bh, int64_t l2_heads,
                                      int32_t grid) {
  const int64_t half = std::clamp<int64_t>(l2_heads, 1, std::max<int64_t>(num_bh, 1));
  const int64_t full = std::min(2 * half, std::max<int64_t>(num_bh, 1));
  if (grid <= 0 || cost.empty() || num_bh * int64_t(cost.size()) > kSectionModelTiles) return half;
  std::vector<std::pair<int64_t, int64_t>> spans;  // (makespan, heads), by heads
  for (int64_t h = 1; h <= full; ++h)
    if (grid % h == 0 || h == half || h == full) spans.emplace_back(snake_makespan(cost, num_bh, h, grid), h);
  int64_t best = spans.front().first;
  for (const auto& s : spans) best = std::min(best, s.first);
  for (const auto& s : spans)
    if (s.first * 100 <= best * 102) return s.second;
  return half;
}

// A causal problem's schedule: its grid and section size. From one CTA per SM (max_grid) down, the fewest
// CTAs that keep one CTA per SM's makespan with the same sections: as many rounds with fewer CTAs a round to
// share HBM and L2 (d128 causal 512: 512 heads of 4 tiles costing 6, 5, 4 and 3 take 72 on 132 CTAs or on
// 128, each of those then exactly 72). Candidates: multiples of the tiles a head (a section then fills whole
// rounds), down to the fewest that could hold the total cost in that makespan and to 15/16 of max_grid (each
// candidate runs the model again: ~8 at most on 132 SMs).
struct SectionSchedule {
  int32_t grid = 1;
  int64_t heads = 1;
};
inline SectionSchedule fewest_ctas_schedule(const std::vector<int32_t>& cost, int64_t num_bh, int64_t l2_heads,
                                            int32_t max_grid) {
  SectionSchedule best{std::max(max_grid, 1), balanced_section_heads(cost, num_bh, l2_heads, max_grid)};
  if (max_grid <= 1 || cost.empty() || num_bh * int64_t(cost.size()) > kSectionModelTiles) return best;
  const int64_t span = snake_makespan(cost, num_bh, best.heads, max_grid);
  int64_t total = 0;
  for (const int32_t c : cost) total += c;
  total *= num_bh;
  const int64_t lowest = std::max<int64_t>({1, (total + span - 1) / span, max_grid - max_grid / 16});
  const int32_t tiles_per_head = int32_t(cost.size());
  for (int32_t g = max_grid - 1; g >= lowest; --g) {
    if (g % tiles_per_head != 0) continue;
    // The same sections only: where the model moved them with the grid, it read 0.89-1.17 (step 71).
    if (balanced_section_heads(cost, num_bh, l2_heads, g) != best.heads) continue;
    if (snake_makespan(cost, num_bh, best.heads, g) <= span) best.grid = g;
  }
  return best;
}

// Whole rounds of whole heads: the grid G, down to 15/16 of max_grid, a multiple of the tiles a head that
// divides the tiles, and sections of one head. Each round then runs all the tiles of G / tiles-a-head heads
// at once (a head's k and v come from HBM once for all its m_blocks), and the snake pairs each CTA's longest
// tile of a round with its shortest of the next. {0, 0}: no such grid; of several, the smallest makespan.
inline SectionSchedule whole_rounds_schedule(const std::vector<int32_t>& cost, int64_t num_bh, int32_t max_grid) {
  SectionSchedule best{0, 0};
  const int64_t tiles_per_head = int64_t(cost.size());
  if (tiles_per_head == 0 || num_bh * tiles_per_head > kSectionModelTiles) return best;
  int64_t best_span = 0;
  for (int32_t g = max_grid; g >= std::max(1, max_grid - max_grid / 16); --g) {
    if (g % tiles_per_head != 0 || num_bh * tiles_per_head % g != 0) continue;
    const int64_t span = snake_makespan(cost, num_bh, 1, g);
    if (best.grid == 0 || span <= best_span) best = {g, 1}, best_span = span;  // ties: fewer CTAs
  }
  return best;
}

// A causal problem's schedule at head_dim 128 and 256: fewest_ctas_schedule's, or, for heads of up to
// kWholeRoundsMaxTiles tiles, whole rounds where their makespan is within 5% of it. The model knows no L2,
// and undervalues whole rounds where the L2's sections span 1.25-3.5 rounds: +1.6-21% at 640-1152 keys
// (head_dim 256 causal 896: 80 against 84 for 66 heads a section, +21%), even at head_dim 128 768. With 16
// and 32 tiles a head the sections keep a head's tiles together already: head_dim 128 2k 0.991-0.994, 256 2k
// 1.004-1.013; rounds not whole (12 tiles a head on 132 CTAs, 0.97) are not taken (docs/sm90.md, step 72).
constexpr int64_t kWholeRoundsMaxTiles = 12;
inline SectionSchedule causal_grid_schedule(const std::vector<int32_t>& cost, int64_t num_bh, int64_t l2_heads,
                                            int32_t max_grid) {
  const SectionSchedule fewest = fewest_ctas_schedule(cost, num_bh, l2_heads, max_grid);
  if (int64_t(cost.size()) > kWholeRoundsMaxTiles) return fewest;
  const SectionSchedule whole = whole_rounds_schedule(cost, num_bh, max_grid);
  if (whole.grid == 0) return fewest;
  const int64_t span = snake_makespan(cost, num_bh, fewest.heads, fewest.grid);
  return snake_makespan(cost, num_bh, 1, whole.grid) * 100 <= span * 105 ? whole : fewest;
}

}  // namespace flashattn
