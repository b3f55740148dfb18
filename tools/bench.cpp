// `flashattn bench`: a sweep of shapes, forward and backward, as a table and as JSON lines.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <numeric>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "commands.hpp"

namespace fa_cli {

void add_bench_command(CLI::App& app, BenchOptions& o) {
  CLI::App* b = app.add_subcommand(
      "bench",
      "A sweep of shapes, forward and/or backward: a table on the terminal and JSON lines to --json FILE. Default: "
      "the standard sweep on the GPU (bf16, 16k tokens, hidden 2048, head_dim 64 and 128, seqlen 512..16k, causal "
      "both); on the CPU fp32, batch 1, 16 heads, head_dim 64, seqlen 512..2048");
  b->add_option("--batch", o.batches, "batch sizes (comma-separated)")->delimiter(',');
  b->add_option("--seqlens", o.seqlens, "sequence lengths (queries = keys)")->delimiter(',');
  b->add_option("--head-dims", o.head_dims, "head dimensions")->delimiter(',');
  b->add_option("--heads", o.heads, "numbers of heads")->delimiter(',');
  b->add_option("--heads-kv", o.spec.heads_kv, "key/value heads (0: = heads)")->capture_default_str();
  b->add_option("--tokens", o.tokens, "batch = tokens / seqlen (the standard sweep uses 16384)");
  b->add_option("--hidden", o.hidden, "heads = hidden / head_dim (the standard sweep uses 2048)");
  b->add_option("--causal", o.causal, "on | off | both")->capture_default_str();
  b->add_option("--dtypes", o.dtypes, "fp32, fp16, bf16 (default: fp32 on the CPU, bf16 on the GPU)")->delimiter(',');
  b->add_option("--pass", o.passes, "fwd, bwd or both (comma-separated)")->delimiter(',')->capture_default_str();
  b->add_option("--impl", o.impls, "implementations (default: the device's flash implementations)")->delimiter(',');
  b->add_option("--file", o.file,
                "shapes, one per line as key=value pairs (batch seqlen seqlen_q seqlen_k heads head_dim causal "
                "dtype); unset keys take the flags' first value; # starts a comment");
  b->add_option("--json", o.json, "append one JSON object per measurement to this file");
  b->add_option("--device", o.device, "auto | cpu | cuda")->capture_default_str();
  b->add_option("--repeats", o.repeats, "timed runs per point (median; fewer when a run is slow)")->capture_default_str();
  b->add_flag("--progress,!--no-progress", o.progress, "progress bar when stdout is a terminal")->capture_default_str();
  ProblemSpec& s = o.spec;
  b->add_option("--window-left", s.window_left, "sliding window left (-1: unbounded)")->capture_default_str();
  b->add_option("--window-right", s.window_right, "sliding window right (-1: unbounded)")->capture_default_str();
  b->add_option("--softcap", s.softcap, "tanh soft-capping (0: off)")->capture_default_str();
  b->add_flag("--alibi", s.alibi, "ALiBi with slopes 2^(-8 (h + 1) / heads)");
  b->add_option("--dropout", s.dropout, "dropout probability of the attention weights, in [0, 1) (0: off)")
      ->capture_default_str();
  b->add_option("--dropout-seed", s.dropout_seed, "dropout's seed")->capture_default_str();
  b->add_option("--scale", s.scale, "softmax scale (0: 1/sqrt(head_dim))")->capture_default_str();
  b->add_option("--threads", s.threads, "CPU threads (0: every core)")->capture_default_str();
  b->add_option("--cache-bytes", s.cache_bytes, "CPU block-size budget M in bytes (0: L2)")->capture_default_str();
  b->add_flag("--deterministic", s.deterministic, "deterministic backward");
  b->add_option("--splits", s.splits, "CUDA split-KV: 0 heuristic, 1 off")->capture_default_str();
  b->add_option("--layout", s.layout, "bshd | bhsd")->capture_default_str();
  b->add_option("--seed", s.seed, "seed of the random inputs")->capture_default_str();
}

namespace {

struct Shape {
  int batch, seqlen_q, seqlen_k, heads, head_dim;
  bool causal;
  std::string dtype;
};

std::string utc_now() {
  std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return buf;
}

std::vector<bool> causal_values(const std::string& c) {
  if (c == "on" || c == "1" || c == "true") return {true};
  if (c == "off" || c == "0" || c == "false") return {false};
  if (c == "both") return {false, true};
  throw UsageError("--causal: use on, off or both (got '" + c + "')");
}

// The sweep from the flags (every combination) or from --file.
std::vector<Shape> make_shapes(const BenchOptions& o, Device dev) {
  const bool gpu = dev == Device::Cuda;
  std::vector<int> seqlens = o.seqlens, head_dims = o.head_dims, heads = o.heads, batches = o.batches;
  std::vector<std::string> dtypes = o.dtypes;
  int tokens = o.tokens, hidden = o.hidden;
  const bool shape_flags = !seqlens.empty() || !head_dims.empty() || !heads.empty() || !batches.empty();
  if (gpu && !shape_flags && tokens == 0 && hidden == 0 && o.file.empty()) {
    tokens = 16384;
    hidden = 2048;
  }
  if (seqlens.empty()) seqlens = gpu ? std::vector<int>{512, 1024, 2048, 4096, 8192, 16384} : std::vector<int>{512, 1024, 2048};
  if (head_dims.empty()) head_dims = gpu ? std::vector<int>{64, 128} : std::vector<int>{64};
  if (heads.empty()) heads = {16};
  if (batches.empty()) batches = {1};
  if (dtypes.empty()) dtypes = {gpu ? "bf16" : "fp32"};
  for (const auto& d : dtypes) parse_dtype(d);
  const std::string causal_flag = gpu && o.causal == "off" && !shape_flags && o.file.empty() ? "both" : o.causal;
  const std::vector<bool> causals = causal_values(causal_flag);
  if (tokens < 0 || hidden < 0) throw UsageError("--tokens and --hidden must be >= 0");

  std::vector<Shape> shapes;
  if (!o.file.empty()) {
    std::ifstream f(o.file);
    if (!f) throw UsageError("--file: cannot open '" + o.file + "'");
    std::string line;
    int lineno = 0;
    while (std::getline(f, line)) {
      ++lineno;
      line = line.substr(0, line.find('#'));
      std::istringstream in(line);
      std::string kv;
      Shape s{batches[0], seqlens[0], seqlens[0], heads[0], head_dims[0], causals[0], dtypes[0]};
      bool any = false;
      while (in >> kv) {
        any = true;
        const auto eq = kv.find('=');
        if (eq == std::string::npos) throw UsageError("--file line " + std::to_string(lineno) + ": expected key=value, got '" + kv + "'");
        const std::string key = kv.substr(0, eq), val = kv.substr(eq + 1);
        try {
          if (key == "batch") s.batch = std::stoi(val);
          else if (key == "seqlen") s.seqlen_q = s.seqlen_k = std::stoi(val);
          else if (key == "seqlen_q") s.seqlen_q = std::stoi(val);
          else if (key == "seqlen_k") s.seqlen_k = std::stoi(val);
          else if (key == "heads") s.heads = std::stoi(val);
          else if (key == "head_dim") s.head_dim = std::stoi(val);
          else if (key == "causal") s.causal = causal_values(val).at(0);
          else if (key == "dtype") {
            parse_dtype(val);
            s.dtype = val;
          }
          else throw UsageError("--file line " + std::to_string(lineno) + ": unknown key '" + key + "'");
        } catch (const std::invalid_argument&) {
          throw UsageError("--file line " + std::to_string(lineno) + ": '" + val + "' is not a number");
        }
      }
      if (any) shapes.push_back(s);
    }
    if (shapes.empty()) throw UsageError("--file: '" + o.file + "' holds no shape");
    return shapes;
  }
  for (const auto& dt : dtypes)
    for (int d : head_dims)
      for (bool c : causals)
        for (int n : seqlens) {
          if (hidden && hidden % d) throw UsageError("--hidden " + std::to_string(hidden) + " is not a multiple of head_dim " + std::to_string(d));
          const std::vector<int> hs = hidden ? std::vector<int>{hidden / d} : heads;
          const std::vector<int> bs = tokens ? std::vector<int>{std::max(1, tokens / n)} : batches;
          for (int h : hs)
            for (int b : bs) shapes.push_back({b, n, n, h, d, c, dt});
        }
  return shapes;
}

class Progress {
 public:
  Progress(bool on, size_t total) : on_(on), total_(total) {}
  void clear() {
    if (on_) std::printf("\r\033[K");
  }
  void draw(size_t done, const std::string& what) {
    if (!on_) return;
    const int width = 30, filled = int(width * done / std::max<size_t>(total_, 1));
    std::printf("\r\033[K[%s%s] %zu/%zu %s", std::string(size_t(filled), '#').c_str(),
                std::string(size_t(width - filled), '.').c_str(), done, total_, what.c_str());
    std::fflush(stdout);
  }

 private:
  bool on_;
  size_t total_;
};

bool any_non_finite(const std::vector<float>& v) {
  return std::any_of(v.begin(), v.end(), [](float x) { return !std::isfinite(x); });
}

}  // namespace

int cmd_bench(const BenchOptions& o) {
  const Device dev = resolve_device(o.device);
  const bool gpu = dev == Device::Cuda;
  if (o.repeats < 1) throw UsageError("--repeats must be >= 1");
  bool do_fwd = false, do_bwd = false;
  for (const auto& pass : o.passes) {
    if (pass == "fwd") do_fwd = true;
    else if (pass == "bwd") do_bwd = true;
    else if (pass == "both") do_fwd = do_bwd = true;
    else throw UsageError("--pass: use fwd, bwd or both (got '" + pass + "')");
  }
  std::vector<fa_impl> impls;
  for (const auto& name : o.impls) impls.push_back(parse_impl(name, dev));
  if (impls.empty()) impls = default_impls(dev, true);
  const std::vector<Shape> shapes = make_shapes(o, dev);
  // Checks the shared flags once (a bad --window-left fails before any run).
  make_params(o.spec, FA_FLOAT32);

  std::ofstream json;
  if (!o.json.empty()) {
    json.open(o.json, std::ios::app);
    if (!json) throw UsageError("--json: cannot open '" + o.json + "' for writing");
  }
  const int threads = o.spec.threads > 0 ? o.spec.threads : cpu_count();
  const std::string device = device_description(dev, threads), date = utc_now();
  std::printf("flashattn bench on %s: %s\n", device_flag_name(dev), device.c_str());
  std::printf("%-16s %4s %5s %6s %6s %8s %8s %5s %7s %11s %9s\n", "impl", "pass", "dtype", "batch", "heads", "seqlen_q",
              "seqlen_k", "d", "causal", "ms", gpu ? "TFLOP/s" : "GFLOP/s");
  std::fflush(stdout);

  Progress bar(o.progress && isatty(STDOUT_FILENO), shapes.size() * impls.size());
  size_t done = 0;
  bool failed = false;
  for (const Shape& sh : shapes) {
    ProblemSpec spec = o.spec;
    spec.batch = sh.batch;
    spec.seqlen_q = sh.seqlen_q;
    spec.seqlen_k = sh.seqlen_k;
    spec.heads = sh.heads;
    spec.head_dim = sh.head_dim;
    spec.causal = sh.causal;
    const fa_params shape = make_params(spec, parse_dtype(sh.dtype));
    Tensors t(dev, shape, spec, do_bwd);
    const double fwd_flops = forward_flops(t.p, {}, {});
    for (fa_impl impl : impls) {
      bar.draw(done, std::string(fa_impl_name(impl)) + " seqlen " + std::to_string(sh.seqlen_q));
      for (int pass = 0; pass < 2; ++pass) {
        if ((pass == 0 && !do_fwd) || (pass == 1 && !do_bwd)) continue;
        const bool backward = pass == 1;
        fa_params call = t.p;
        size_t ws_bytes = 0, ws_fwd = 0;
        fa_status st = fa_workspace_size(&call, impl, backward, &ws_bytes);
        if (st == FA_OK && backward) st = fa_workspace_size(&call, impl, 0, &ws_fwd);
        std::string err = st == FA_OK ? "" : std::string(fa_status_name(st)) + ": " + fa_last_error();
        Buffer ws;
        if (st == FA_OK) {
          ws = Buffer(dev, std::max(ws_bytes, ws_fwd));
          call.workspace = ws.data();
          call.workspace_bytes = ws.bytes();
          t.poison_outputs();
          // The checked run (backward: after the forward that makes o and lse).
          st = fa_forward(&call, impl);
          if (st == FA_OK && backward) st = fa_backward(&call, impl);
          if (st != FA_OK) err = std::string(fa_status_name(st)) + ": " + fa_last_error();
        }
        std::vector<double> times;
        if (st == FA_OK) {
          // Every output element written and finite (they were poisoned with NaN).
          std::vector<std::pair<const char*, const Buffer*>> outputs = {{"o", &t.o}};
          if (backward) outputs = {{"dq", &t.dq}, {"dk", &t.dk}, {"dv", &t.dv}};
          for (const auto& [name, buf] : outputs)
            if (err.empty() && any_non_finite(t.download(*buf)))
              err = std::string("WRONG: ") + name + " has elements that are not finite or not written";
          bool ok = true;
          for (int i = 0; i < o.repeats && ok && err.empty(); ++i) {
            times.push_back(time_ms(dev, [&] { return (backward ? fa_backward(&call, impl) : fa_forward(&call, impl)) == FA_OK; }, &ok));
            if (!ok) err = std::string("failed: ") + fa_last_error();
            const double spent = std::accumulate(times.begin(), times.end(), 0.0);
            if (spent > 2000 && times.size() >= 1) break;  // a slow point: fewer runs
          }
        }
        bar.clear();
        if (!err.empty()) {
          // A point an implementation lacks (a pass, a head_dim) is skipped, not a failure.
          const bool skip = err.rfind("unsupported", 0) == 0;
          if (!skip) failed = true;
          std::printf("%-16s %4s %5s %6d %6d %8d %8d %5d %7s  %s%s\n", fa_impl_name(impl), backward ? "bwd" : "fwd",
                      sh.dtype.c_str(), sh.batch, sh.heads, sh.seqlen_q, sh.seqlen_k, sh.head_dim, sh.causal ? "yes" : "no",
                      skip ? "skipped: " : "FAILED: ", err.c_str());
          continue;
        }
        const double ms = median(times), flops = fwd_flops * (backward ? 2.5 : 1.0);
        const double tflops = flops / (ms * 1e-3) / 1e12;
        std::printf("%-16s %4s %5s %6d %6d %8d %8d %5d %7s %11.3f %9.1f\n", fa_impl_name(impl), backward ? "bwd" : "fwd",
                    sh.dtype.c_str(), sh.batch, sh.heads, sh.seqlen_q, sh.seqlen_k, sh.head_dim, sh.causal ? "yes" : "no", ms,
                    gpu ? tflops : tflops * 1e3);
        if (json) {
          nlohmann::json j = {{"impl", fa_impl_name(impl)}, {"pass", backward ? "bwd" : "fwd"}, {"dtype", sh.dtype},
                              {"batch", sh.batch},         {"heads", sh.heads},                  {"heads_kv", t.p.num_heads_kv},
                              {"seqlen_q", sh.seqlen_q},   {"seqlen_k", sh.seqlen_k},            {"head_dim", sh.head_dim},
                              {"causal", sh.causal},       {"window_left", t.p.window_left},     {"window_right", t.p.window_right},
                              {"softcap", t.p.softcap}, {"alibi", t.p.alibi_slopes != nullptr},    {"dropout", t.p.dropout_p}, {"ms", ms},                           {"tflops", tflops},
                              {"gflops", tflops * 1e3},    {"runs", times.size()},               {"device", device},
                              {"device_kind", device_flag_name(dev)}, {"threads", gpu ? 0 : threads}, {"date", date}};
          json << j.dump() << "\n";
          json.flush();
        }
      }
      ++done;
      std::fflush(stdout);
    }
  }
  bar.clear();
  std::fflush(stdout);
  return failed ? 1 : 0;
}

}  // namespace fa_cli
