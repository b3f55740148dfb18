// The subcommands of the flashattn CLI and what they share.
#pragma once

#include <string>
#include <vector>

#include "device.hpp"
#include "problem.hpp"

namespace CLI {
class App;
}

namespace fa_cli {

struct RunOptions {
  ProblemSpec spec;
  int seqlen = -1;  // --seqlen: both lengths
  std::string device = "auto";
  std::vector<std::string> impls;  // empty: standard and flash on the device
  int repeats = 5;
  double budget_s = 1.5;  // seconds the fp64 reference may take; beyond that the batch is scaled down
  bool full = false;      // never scale the batch down
  std::string pass = "fwd";  // fwd | bwd | both
};

struct BenchOptions {
  ProblemSpec spec;  // the non-shape fields
  std::string device = "auto";
  std::vector<std::string> impls, dtypes, passes{"fwd"};
  std::vector<int> batches, seqlens, head_dims, heads;
  std::string causal = "off";  // on | off | both
  int tokens = 0, hidden = 0;  // the standard sweep: batch = tokens / seqlen, heads = hidden / head_dim
  std::string file, json;
  int repeats = 10;
  bool progress = true;
};

struct IoOptions {
  std::vector<int64_t> seqlens{512, 1024, 2048, 4096, 8192, 16384};
  int head_dim = 64;
  std::string cache_bytes = "100K";
  std::string dtype = "fp16";
  bool causal = false;
  int window_left = -1, window_right = -1;
};

void add_run_command(CLI::App& app, RunOptions& o);
void add_bench_command(CLI::App& app, BenchOptions& o);
void add_io_command(CLI::App& app, IoOptions& o);

int cmd_run(const RunOptions& o);
int cmd_bench(const BenchOptions& o);
int cmd_io(const IoOptions& o);

// Shared by run and bench ---------------------------------------------------------------------

Device resolve_device(const std::string& flag);  // auto | cpu | cuda; throws UsageError
// Implementation names (standard, reference, fa1, fa2, sm80, sm90, auto, or fa_impl_name's) for
// a device; throws UsageError for an unknown name or one of the other device.
fa_impl parse_impl(const std::string& name, Device dev);
std::vector<fa_impl> default_impls(Device dev, bool flash_only);
std::string impl_label(fa_impl impl);  // what the implementation is, for tables

double median(std::vector<double> v);
std::string human_bytes(double bytes);
std::string fixed(double v, int digits);

}  // namespace fa_cli
