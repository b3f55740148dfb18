// `flashattn run`: the seeds' comparison of standard and flash attention on one problem —
// time, peak extra memory, main-memory traffic by the IO model, and error against fp64.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <malloc.h>

#include "commands.hpp"
#include "dtype.hpp"
#include "io_model.hpp"

namespace fa_cli {

void add_run_command(CLI::App& app, RunOptions& o) {
  CLI::App* run = app.add_subcommand(
      "run",
      "Standard vs flash attention on one problem (default: the classic batch 32, seqlen 512, 16 heads, head_dim 64, "
      "causal): time, peak extra memory, bytes moved by the IO model, max error against the fp64 reference");
  ProblemSpec& s = o.spec;
  run->add_option("--batch", s.batch, "batch size")->capture_default_str();
  CLI::Option* both = run->add_option("--seqlen", o.seqlen, "query and key length (sets both)");
  CLI::Option* sq = run->add_option("--seqlen-q", s.seqlen_q, "query length")->capture_default_str();
  CLI::Option* sk = run->add_option("--seqlen-k", s.seqlen_k, "key length")->capture_default_str();
  both->excludes(sq)->excludes(sk);
  run->add_option("--heads", s.heads, "query heads")->capture_default_str();
  run->add_option("--heads-kv", s.heads_kv, "key/value heads (GQA/MQA; 0: = --heads)")->capture_default_str();
  run->add_option("--head-dim", s.head_dim, "head dimension")->capture_default_str();
  add_param_flags(run, s);
  run->add_option("--device", o.device, "auto (CUDA when present) | cpu | cuda")->capture_default_str();
  run->add_option("--impl", o.impls,
                  "implementations, comma-separated: standard, fa1, fa2, sm80, sm90, auto, reference "
                  "(default: standard, fa1, fa2 on the CPU; standard, sm80, sm90 on the GPU)")
      ->delimiter(',');
  run->add_option("--repeats", o.repeats, "timed runs after the checked one (the median is shown)")->capture_default_str();
  run->add_option("--budget", o.budget_s, "seconds the fp64 reference may take before the batch is scaled down")
      ->capture_default_str();
  run->add_flag("--full", o.full, "never scale the batch down");
  run->add_option("--pass", o.pass, "fwd | bwd | both: the forward, the backward (dq, dk, dv from a forward's o and lse), or both")
      ->capture_default_str();
}

namespace {

struct Row {
  fa_impl impl;
  bool ran = false, ok = false;
  std::string status;
  double ms = 0;
  int runs = 0;
  double mem_model = -1, mem_measured = -1;
  IoCount io;
  Diff err_a, err_b;  // forward: o, lse; backward: dq, (dk, dv)
};

// Sanity bounds on the error against the fp64 reference (the tests apply the strict anchor
// rule; these only catch a broken run of the CLI).
double o_bound(fa_dtype d) { return d == FA_FLOAT32 ? 1e-4 : d == FA_FLOAT16 ? 1e-2 : 6e-2; }
constexpr double kLseBound = 1e-3;

// The IO model summed over the problem's sequences and heads.
IoCount model_io(fa_impl impl, const Tensors& t, Blocks blocks) {
  const fa_params& p = t.p;
  const int eb = int(dtype_bytes(p.dtype));
  IoCount total;
  auto one = [&](int64_t sq, int64_t sk) {
    IoProblem io;
    io.seqlen_q = sq;
    io.seqlen_k = sk;
    io.head_dim = p.head_dim;
    io.causal = p.causal != 0;
    io.window_left = p.window_left;
    io.window_right = p.window_right;
    io.elem_bytes = eb;
    if (impl == FA_IMPL_CPU_REFERENCE) io.s_bytes = io.p_bytes = 8;  // S and P in double
    if (impl == FA_IMPL_CUDA_STANDARD) {
      io.s_bytes = 4;  // S fp32, P in the input dtype
      io.p_bytes = eb;
    }
    IoCount c = impl == FA_IMPL_CPU_REFERENCE || impl == FA_IMPL_CUDA_STANDARD ? io_standard(io)
                : impl == FA_IMPL_CPU_FA1                                       ? io_flash1(io, blocks)
                                                                                : io_flash2(io, blocks);
    total += c.scaled(p.num_heads);
  };
  if (t.host_cu_q.empty()) {
    one(p.seqlen_q, p.seqlen_k);
    return total.scaled(p.batch);
  }
  for (size_t b = 0; b + 1 < t.host_cu_q.size(); ++b)
    one(t.host_cu_q[b + 1] - t.host_cu_q[b], t.host_cu_k[b + 1] - t.host_cu_k[b]);
  return total;
}

// Extra memory the fp64 reference holds by its algorithm, one task per thread. Forward: per
// (batch, head), S/P (seqlen_q x seqlen_k) and fp64 copies of q, k, v. Backward: per (batch, kv
// head), S/P and the softcap derivative (2 seqlen_q x seqlen_k), copies of q, k, v, dout and
// the dq, dk, dv accumulators.
double reference_memory_model(const fa_params& p, int threads, bool backward) {
  const double sq = p.seqlen_q, sk = p.seqlen_k, d = p.head_dim;
  if (!backward) {
    const double tasks = std::min<double>(threads, double(p.batch) * p.num_heads);
    return tasks * 8.0 * (sq * sk + (sq + 2 * sk) * d);
  }
  const double tasks = std::min<double>(threads, double(p.batch) * p.num_heads_kv);
  return tasks * 8.0 * (2 * sq * sk + (3 * sq + 4 * sk) * d);
}

bool call_forward(const fa_params& p, fa_impl impl, std::string* err) {
  fa_status s = fa_forward(&p, impl);
  if (s == FA_OK) return true;
  *err = std::string(fa_status_name(s)) + ": " + fa_last_error();
  return false;
}


bool call_backward(const fa_params& p, fa_impl impl, std::string* err) {
  fa_status s = fa_backward(&p, impl);
  if (s == FA_OK) return true;
  *err = std::string(fa_status_name(s)) + ": " + fa_last_error();
  return false;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v)
    if (std::isfinite(x)) m = std::max(m, double(std::fabs(x)));
  return m;
}

// What every measurement of one problem shares.
struct Context {
  Device dev;
  Tensors& t;
  const RunOptions& o;
  int threads, check_batch;
  Blocks blocks;
  const std::vector<float>&o_ref, &lse_ref, &dq_ref, &dk_ref, &dv_ref;
};

// One implementation, one pass: a checked run under the memory measurement, the comparison with
// the oracle, then the timed runs.
Row measure(const Context& c, fa_impl impl, bool backward, bool* measured_rss) {
  const fa_params& p = c.t.p;
  const Device dev = c.dev;
  Row row;
  row.impl = impl;
  size_t ws_fwd = 0, ws_bwd = 0;
  fa_status st = fa_workspace_size(&p, impl, 0, &ws_fwd);
  if (st == FA_OK && backward) st = fa_workspace_size(&p, impl, 1, &ws_bwd);
  if (st != FA_OK) {
    row.status = std::string(fa_status_name(st)) + ": " + fa_last_error();
    return row;
  }
  const size_t ws_bytes = backward ? ws_bwd : ws_fwd;
  fa_params call = p;
  Buffer ws_forward;
  std::string err;
  bool ok = true;
  c.t.poison_outputs();
  if (backward) {  // o and lse from this implementation's forward, outside the measurement
    ws_forward = Buffer(dev, ws_fwd);
    call.workspace = ws_forward.data();
    call.workspace_bytes = ws_fwd;
    ok = call_forward(call, impl, &err);
    if (!ok) {
      row.ran = true;
      row.status = err;
      return row;
    }
  }
  const size_t used_before = dev == Device::Cuda ? cuda_used_bytes() : 0;
  Buffer ws(dev, ws_bytes);
  call.workspace = ws.data();
  call.workspace_bytes = ws_bytes;
  auto once = [&] { return backward ? call_backward(call, impl, &err) : call_forward(call, impl, &err); };

  release_free_heap();
  const bool can_reset = dev == Device::Cpu && reset_peak_rss();
  const int64_t rss_before = rss_bytes();
  const double first_ms = time_ms(dev, once, &ok);
  if (can_reset) {
    row.mem_measured = double(peak_rss_bytes() - rss_before);
    *measured_rss = true;
  }
  const double lse_bytes = backward ? 0.0 : double(c.t.lse_elements()) * 4;  // the backward reads the forward's
  if (dev == Device::Cuda) {
    row.mem_model = double(ws_bytes) + lse_bytes;
    row.mem_measured = double(cuda_used_bytes()) - double(used_before) + lse_bytes;
  } else if (impl == FA_IMPL_CPU_REFERENCE) {
    row.mem_model = reference_memory_model(p, c.threads, backward);
  }
  row.ran = true;
  if (!ok) {
    row.status = err;
    return row;
  }
  double bound_a = o_bound(p.dtype), bound_b = kLseBound;
  if (!backward) {
    row.err_a = compare_o(p, c.t.download_o(), c.o_ref, c.check_batch);
    row.err_b = compare_lse(p, c.t.download_lse(), c.lse_ref, c.check_batch);
  } else {
    const double scale = std::max({1.0, max_abs(c.dq_ref), max_abs(c.dk_ref), max_abs(c.dv_ref)});
    bound_a = bound_b = 10 * o_bound(p.dtype) * scale;
    row.err_a = compare_o(p, c.t.download(c.t.dq), c.dq_ref, c.check_batch);
    const Diff dk = compare_k_side(p, c.t.download(c.t.dk), c.dk_ref, c.check_batch);
    const Diff dv = compare_k_side(p, c.t.download(c.t.dv), c.dv_ref, c.check_batch);
    row.err_b = {std::max(dk.max_abs, dv.max_abs), dk.non_finite + dv.non_finite};
  }

  // Timed runs: `repeats`, fewer for a slow implementation (about 2x the budget in all).
  const int n = std::clamp(int(2e3 * c.o.budget_s / std::max(first_ms, 1e-3)), 1, c.o.repeats);
  std::vector<double> times;
  for (int i = 0; i < n && ok; ++i) times.push_back(time_ms(dev, once, &ok));
  if (!ok) {
    row.status = err;
    return row;
  }
  row.ms = median(times);
  row.runs = n;
  if (!backward) row.io = model_io(impl, c.t, c.blocks);
  char buf[160];
  if (row.err_a.non_finite || row.err_b.non_finite) {
    std::snprintf(buf, sizeof buf, "WRONG: %lld output elements not finite or not written",
                  (long long)(row.err_a.non_finite + row.err_b.non_finite));
    row.status = buf;
  } else if (row.err_a.max_abs > bound_a || row.err_b.max_abs > bound_b) {
    std::snprintf(buf, sizeof buf, "WRONG: error above the sanity bound (%.0e, %.0e)", bound_a, bound_b);
    row.status = buf;
  } else {
    row.ok = true;
    row.status = "ok";
  }
  return row;
}

// The table of one pass; false when an implementation failed (an unsupported one of the
// default list is skipped).
bool print_rows(const std::vector<Row>& rows, bool backward, bool gpu, bool explicit_impls, double flops) {
  std::printf("%-34s %10s %9s %22s %14s %11s %11s  %s\n", "implementation", "time ms", gpu ? "TFLOP/s" : "GFLOP/s",
              gpu ? (backward ? "extra mem (ws/meas)" : "extra mem (ws+lse/meas)") : "extra mem (meas/model)",
              backward ? "" : "IO model", backward ? "max|dq-ref|" : "max|o-ref|", backward ? "max|dk,dv-r|" : "max|lse-ref|",
              "status");
  bool all_ok = true;
  for (const Row& r : rows) {
    const bool skipped = !r.ok && !explicit_impls && r.status.rfind("unsupported", 0) == 0;
    if (!r.ok && !skipped) all_ok = false;
    const std::string name = std::string(fa_impl_name(r.impl)) + " " + impl_label(r.impl);
    if (!r.ran || r.runs == 0) {
      std::printf("%-34s %10s %9s %22s %14s %11s %11s  %s%s\n", name.c_str(), "-", "-", "-", "-", "-", "-",
                  skipped ? "skipped: " : "FAILED: ", r.status.c_str());
      continue;
    }
    std::string mem = (r.mem_measured >= 0 ? human_bytes(r.mem_measured) : std::string("?")) + " / " +
                      (r.mem_model >= 0 ? human_bytes(r.mem_model) : std::string("-"));
    if (gpu) mem = human_bytes(r.mem_model) + " / " + human_bytes(r.mem_measured);
    const double rate = flops / (r.ms * 1e-3) / (gpu ? 1e12 : 1e9);
    char ea[32], eb[32];
    std::snprintf(ea, sizeof ea, "%.2e", r.err_a.max_abs);
    std::snprintf(eb, sizeof eb, "%.2e", r.err_b.max_abs);
    std::printf("%-34s %10s %9s %22s %14s %11s %11s  %s\n", name.c_str(), fixed(r.ms, r.ms < 10 ? 3 : 1).c_str(),
                fixed(rate, 1).c_str(), mem.c_str(), backward ? "" : human_bytes(r.io.bytes).c_str(), ea, eb,
                r.status.c_str());
  }
  return all_ok;
}

}  // namespace

int cmd_run(const RunOptions& o) {
  const Device dev = resolve_device(o.device);
  const fa_dtype dtype = o.spec.dtype.empty() ? (dev == Device::Cpu ? FA_FLOAT32 : FA_FLOAT16) : parse_dtype(o.spec.dtype);
  if (o.repeats < 1) throw UsageError("--repeats must be >= 1 (got " + std::to_string(o.repeats) + ")");
  if (!(o.budget_s > 0)) throw UsageError("--budget must be > 0 seconds");
  if (o.pass != "fwd" && o.pass != "bwd" && o.pass != "both") throw UsageError("--pass: use fwd, bwd or both (got '" + o.pass + "')");
  const bool do_fwd = o.pass != "bwd", do_bwd = o.pass != "fwd";
  ProblemSpec spec = o.spec;
  if (o.seqlen >= 0) spec.seqlen_q = spec.seqlen_k = o.seqlen;
  fa_params shape = make_params(spec, dtype);
  const bool varlen = !spec.varlen_q.empty();
  std::vector<fa_impl> impls;
  for (const auto& name : o.impls) impls.push_back(parse_impl(name, dev));
  const bool explicit_impls = !impls.empty();
  if (!explicit_impls) impls = default_impls(dev, false);
  const int threads = shape.num_threads > 0 ? shape.num_threads : cpu_count();

  // Large allocations come from mmap and go back on free, so RSS peaks measure one call.
  mallopt(M_MMAP_THRESHOLD, 256 * 1024);

  // Cost of the fp64 reference per sequence, from one sequence: the CPU scales the whole
  // problem down when the reference would exceed the budget; the GPU checks fewer sequences.
  const int full_batch = shape.batch;
  int check_batch = shape.batch;
  std::string scale_note;
  if (!varlen && shape.batch > 1 && !o.full) {
    fa_params one = shape;
    one.batch = 1;
    Tensors probe(Device::Cpu, one, spec, false);
    std::vector<float> o_ref, lse_ref;
    fa_params r = reference_params(probe, o_ref, lse_ref, 1);
    bool ok = false;
    // With the backward, the reference also computes gradients (about 2.5x the forward).
    const double per_seq = time_ms(Device::Cpu, [&] { return fa_forward(&r, FA_IMPL_CPU_REFERENCE) == FA_OK; }, &ok) /
                           1e3 * (do_bwd ? 3.5 : 1.0);
    // The reference runs one (batch, head) per thread: `batch` sequences take
    // ceil(batch * heads / threads) rounds of what one sequence took in ceil(heads / threads).
    const int64_t h = shape.num_heads, cpu_threads = cpu_count();
    auto estimate_of = [&](int64_t b) {
      return per_seq * double((b * h + cpu_threads - 1) / cpu_threads) / double((h + cpu_threads - 1) / cpu_threads);
    };
    const double estimate = estimate_of(shape.batch);
    if (ok && estimate > o.budget_s) {
      int fit = 1;
      while (fit + 1 < shape.batch && estimate_of(fit + 1) <= o.budget_s) ++fit;
      char buf[320];
      if (dev == Device::Cpu) {
        shape.batch = check_batch = fit;
        std::snprintf(buf, sizeof buf,
                      "note: the full problem (batch %d) would take ~%.1f s in the fp64 reference on this CPU; "
                      "running batch %d instead (--full keeps it)",
                      full_batch, estimate, fit);
      } else {
        check_batch = fit;
        std::snprintf(buf, sizeof buf,
                      "note: the error is checked on the first %d of %d sequences (the fp64 reference of all would "
                      "take ~%.1f s on the CPU; --full checks all)",
                      fit, full_batch, estimate);
      }
      scale_note = buf;
    }
  }

  Tensors t(dev, shape, spec, do_bwd);
  const fa_params& p = t.p;
  const double flops = forward_flops(p, t.host_cu_q, t.host_cu_k);
  const int64_t cache = p.cpu_cache_bytes > 0 ? p.cpu_cache_bytes : l2_cache_bytes();
  const int64_t model_m = dev == Device::Cuda ? cuda_smem_per_sm() : cache;
  const Blocks blocks = model_blocks(model_m, p.head_dim);

  std::printf("flashattn run: standard vs flash attention, %s\n",
              do_fwd && do_bwd ? "forward and backward" : do_bwd ? "backward" : "forward");
  std::printf("problem : batch %d, seqlen_q %d, seqlen_k %d, heads %d (kv %d), head_dim %d, %s, %s, %s",
              varlen ? p.batch : shape.batch, p.seqlen_q, p.seqlen_k, p.num_heads, p.num_heads_kv, p.head_dim,
              p.causal ? "causal" : "non-causal", fa_dtype_name(p.dtype), layout_note(spec));
  if (p.window_left >= 0 || p.window_right >= 0) std::printf(", window (%d, %d)", p.window_left, p.window_right);
  if (p.softcap > 0) std::printf(", softcap %g", double(p.softcap));
  if (p.alibi_slopes) std::printf(", ALiBi");
  if (p.dropout_p > 0.f) std::printf(", dropout %g", double(p.dropout_p));
  if (p.softmax_scale != 0) std::printf(", scale %g", double(p.softmax_scale));
  std::printf("\ndevice  : %s: %s\n", device_flag_name(dev), device_description(dev, threads).c_str());
  if (!scale_note.empty()) std::printf("%s\n", scale_note.c_str());
  std::fflush(stdout);

  // The oracle: the fp64 reference on fp32 copies of the same (dtype-rounded) inputs.
  std::vector<float> o_ref, lse_ref;
  fa_params ref = reference_params(t, o_ref, lse_ref, check_batch);
  bool ref_ok = false;
  std::string ref_err;
  const double ref_ms = time_ms(Device::Cpu, [&] { return call_forward(ref, FA_IMPL_CPU_REFERENCE, &ref_err); }, &ref_ok);
  if (!ref_ok) {
    std::fprintf(stderr, "flashattn run: the fp64 reference failed: %s\n", ref_err.c_str());
    return 1;
  }
  std::printf("oracle  : fp64 reference (cpu-reference on fp32 copies of the inputs), %s, %d sequence(s) checked\n\n",
              (fixed(ref_ms, 1) + " ms").c_str(), varlen ? p.batch : check_batch);
  std::vector<float> dq_ref, dk_ref, dv_ref;
  double ref_bwd_ms = 0;
  if (do_bwd) {
    fa_params ref_bwd = reference_backward_params(t, o_ref, lse_ref, dq_ref, dk_ref, dv_ref, check_batch);
    ref_bwd_ms = time_ms(Device::Cpu, [&] { return call_backward(ref_bwd, FA_IMPL_CPU_REFERENCE, &ref_err); }, &ref_ok);
    if (!ref_ok) {
      std::fprintf(stderr, "flashattn run: the fp64 reference backward failed: %s\n", ref_err.c_str());
      return 1;
    }
  }
  const Context ctx{dev, t, o, threads, check_batch, blocks, o_ref, lse_ref, dq_ref, dk_ref, dv_ref};

  const bool gpu = dev == Device::Cuda;
  bool all_ok = true, measured_rss = false;
  if (do_fwd) {
    std::vector<Row> rows;
    for (fa_impl impl : impls) rows.push_back(measure(ctx, impl, false, &measured_rss));
    all_ok &= print_rows(rows, false, gpu, explicit_impls, flops);
  }
  if (do_bwd) {
    if (do_fwd) std::printf("\n");
    std::printf("backward (dq, dk, dv from the implementation's own o and lse; oracle: the fp64 reference backward, %s ms)\n",
                fixed(ref_bwd_ms, 1).c_str());
    std::vector<Row> rows;
    for (fa_impl impl : impls) rows.push_back(measure(ctx, impl, true, &measured_rss));
    all_ok &= print_rows(rows, true, gpu, explicit_impls, 2.5 * flops);
  }

  std::printf("\n");
  const double tensor_bytes = double(dtype_bytes(p.dtype)) * (do_bwd ? 4 : 2) * (q_elements(p) + k_elements(p)) +
                              double(t.lse_elements()) * 4;
  std::printf("tensors   : %s take %s on the %s in every implementation (not counted as extra)\n",
              do_bwd ? "q, k, v, o, lse, dout, dq, dk, dv" : "q, k, v, o and lse", human_bytes(tensor_bytes).c_str(),
              gpu ? "GPU" : "CPU");
  std::printf("time      : median of the timed runs (up to %d, after one checked run), %s\n", o.repeats,
              gpu ? "CUDA events on the default stream" : "wall clock");
  if (gpu) {
    std::printf("extra mem : workspace (fa_workspace_size) + lse, exact / used device memory growth across the first\n"
                "            call measured with cudaMemGetInfo (+ lse), which also counts library handles (cuBLAS)\n");
  } else {
    std::printf("extra mem : measured = growth of the process's peak RSS during the checked run (%s);\n"
                "            model (standard) = S/P (backward: also dS) and fp64 copies of the tensors per (batch,\n"
                "            head) in flight, one per thread; flash holds O(block) per thread\n",
                measured_rss ? "VmHWM after clear_refs" : "unavailable here: /proc/self/clear_refs is not writable");
  }
  std::printf("IO model  : bytes to and from main memory by the model of the FlashAttention paper (flashattn io):\n"
              "            standard reads/writes S and P (%s); flash with M = %s (%s) -> B_r = %lld, B_c = %lld\n",
              gpu ? "S fp32, P in the dtype" : "fp64 in the reference", human_bytes(double(model_m)).c_str(),
              gpu ? "shared memory per SM" : "--cache-bytes or the L2 size", (long long)blocks.block_r,
              (long long)blocks.block_c);
  std::printf("error     : max abs difference from the fp64 reference on the same inputs (the tests apply the\n"
              "            anchor rule; here a sanity bound of %.0e on o and %.0e on lse flags a broken run%s)\n",
              o_bound(p.dtype), kLseBound, do_bwd ? ";\n            gradients: 10x the o bound relative to the largest reference gradient" : "");
  if (!all_ok) {
    std::printf("\nresult: FAILED (an implementation failed or gave a wrong result)\n");
    return 1;
  }
  std::printf("\nresult: ok\n");
  return 0;
}

}  // namespace fa_cli
