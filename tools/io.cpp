// `flashattn io`: the IO-complexity model of the FlashAttention paper as a table (io_model.hpp).
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>

#include "commands.hpp"
#include "dtype.hpp"
#include "io_model.hpp"

namespace fa_cli {

void add_io_command(CLI::App& app, IoOptions& o) {
  CLI::App* io = app.add_subcommand(
      "io",
      "The IO-complexity model of the FlashAttention paper: HBM accesses of standard attention, Theta(N d + N^2), "
      "against flash attention, Theta(N^2 d^2 / M), counted exactly for each N, with the block sizes that follow");
  io->add_option("--seqlens,-N", o.seqlens, "sequence lengths N (comma-separated)")->delimiter(',')->capture_default_str();
  io->add_option("--head-dim,-d", o.head_dim, "head dimension d")->capture_default_str();
  io->add_option("--cache-bytes,-M", o.cache_bytes,
                 "on-chip memory M in BYTES (K/M suffixes); the model counts it as M/4 fp32 elements")
      ->capture_default_str();
  io->add_option("--dtype", o.dtype, "element type of q, k, v, o, S, P for the byte counts: fp32 | fp16 | bf16")
      ->capture_default_str();
  io->add_flag("--causal", o.causal, "skip the blocks a causal mask hides (flash only; standard writes S in full)");
  io->add_option("--window-left", o.window_left, "sliding window left (-1: unbounded)")->capture_default_str();
  io->add_option("--window-right", o.window_right, "sliding window right (-1: unbounded)")->capture_default_str();
}

int cmd_io(const IoOptions& o) {
  const int64_t m_bytes = parse_bytes(o.cache_bytes, "--cache-bytes");
  const fa_dtype dtype = parse_dtype(o.dtype);
  if (o.head_dim < 1) throw UsageError("--head-dim must be >= 1 (got " + std::to_string(o.head_dim) + ")");
  if (m_bytes < 16) throw UsageError("--cache-bytes must be at least 16 bytes (got " + o.cache_bytes + ")");
  if (o.window_left < -1 || o.window_right < -1) throw UsageError("--window-left/--window-right must be >= -1");
  for (int64_t n : o.seqlens)
    if (n < 1) throw UsageError("--seqlens: every N must be >= 1 (got " + std::to_string(n) + ")");
  const int64_t d = o.head_dim, m_elems = m_bytes / 4;
  const Blocks b = model_blocks(m_bytes, d);
  const int eb = int(dtype_bytes(dtype));

  std::printf("flashattn io: HBM accesses per (batch, head), the model of the FlashAttention paper (Theorem 2)\n");
  std::printf("d = %lld, M = %lld bytes = %lld fp32 elements -> B_c = ceil(M / 4d) = %lld, B_r = min(B_c, d) = %lld; "
              "%s%s; bytes at %s (l, m, lse fp32)\n\n",
              (long long)d, (long long)m_bytes, (long long)m_elems, (long long)b.block_c, (long long)b.block_r,
              o.causal ? "causal" : "no mask", o.window_left >= 0 || o.window_right >= 0 ? ", window" : "",
              fa_dtype_name(dtype));
  std::printf("%8s %6s %6s %15s %15s %15s %8s %14s %14s %10s %10s\n", "N", "T_r", "T_c", "standard", "flash (FA1)",
              "flash (FA2)", "std/FA1", "Nd + N^2", "N^2 d^2 / M", "std bytes", "FA1 bytes");
  for (int64_t n : o.seqlens) {
    IoProblem p;
    p.seqlen_q = p.seqlen_k = n;
    p.head_dim = d;
    p.causal = o.causal;
    p.window_left = o.window_left;
    p.window_right = o.window_right;
    p.elem_bytes = p.s_bytes = p.p_bytes = eb;
    const IoCount s = io_standard(p), f1 = io_flash1(p, b), f2 = io_flash2(p, b);
    const int64_t tr = (n + b.block_r - 1) / b.block_r, tc = (n + b.block_c - 1) / b.block_c;
    const double nd = double(n), asym_std = nd * d + nd * nd, asym_flash = nd * nd * d * d / double(m_elems);
    std::printf("%8lld %6lld %6lld %15.0f %15.0f %15.0f %8.2f %14.4g %14.4g %10s %10s\n", (long long)n, (long long)tr,
                (long long)tc, s.elements(), f1.elements(), f2.elements(), s.elements() / f1.elements(), asym_std,
                asym_flash, human_bytes(s.bytes).c_str(), human_bytes(f1.bytes).c_str());
  }
  std::printf("\nstandard    = read Q, K (2Nd) + write S (N^2) + read S, write P (2N^2) + read P, V (N^2 + Nd) + write O (Nd)\n"
              "flash (FA1) = init O, l, m (Nd + 2N) + read K, V once (2Nd) + per (K/V block, Q block) pair:\n"
              "              read Q_i, O_i, l_i, m_i and write O_i, l_i, m_i (3 B_r d + 4 B_r)  ~ T_c (3Nd + 4N)\n"
              "flash (FA2) = per Q block: read Q_i (B_r d), read K, V blocks (2Nd), write O_i, lse_i  ~ T_r 2Nd + 2Nd + N\n"
              "(counts are elements; masks drop the block pairs with no visible key from the flash counts)\n");
  return 0;
}

}  // namespace fa_cli
