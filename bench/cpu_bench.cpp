// CPU benchmark of the FA2 kernels against the machine's fp32 FMA peak and the fp64 reference.
//
//   cpu_bench [--threads T] [--seqlen N] [--heads H] [--head-dim D] [--reps R]
//             [--no-reference] [--no-memory] [--memory-seqlen N] [--cache-bytes M] [--json FILE]
//
// 1. Peak: the clock from a chain of dependent FMAs (each waits for the previous one: the time
//    per FMA is its latency, 4 cycles on AMD Zen 2/3/4 and Intel Skylake and later), and the
//    measured FMA throughput of all threads (10 independent chains per thread). The theoretical
//    peak is 2 FMA pipes x lanes x 2 flops x clock x threads.
// 2. Time (median and best of R runs after a warm-up) of FA2 forward (non-causal, causal),
//    backward, FA1 forward and the reference, batch 1, fp32, (seqlen, heads, head_dim).
//    FLOPs: forward 4 * b * h * s_q * s_k * d, halved when causal; backward 2.5x forward.
//    Also FLOPs per process CPU second times the threads: what the threads did while they ran,
//    the rate a machine free of other programs would give (wall time is the figure that counts;
//    this one tells how much of a shortfall comes from sharing the cores).
// 3. Peak extra memory at --memory-seqlen: each implementation runs in a fresh process; extra =
//    its peak RSS (VmHWM) minus its RSS after the inputs were allocated and touched.
#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "flashattn/flashattn.hpp"

namespace {

#if defined(__AVX512F__)
constexpr int kLanes = 16;
#else
constexpr int kLanes = 8;
#endif
typedef float vfloat __attribute__((vector_size(kLanes * sizeof(float))));

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// CPU seconds of this thread / of the whole process (all threads): unlike wall time, they do not
// grow while other programs hold the cores.
double cpu_seconds(clockid_t id) {
  timespec ts{};
  clock_gettime(id, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Clock in GHz from the latency of dependent FMAs (assumed 4 cycles), timed in this thread's CPU
// time so that time slices given to other programs do not count.
double measure_clock_ghz() {
  vfloat a = vfloat{} + 1.0000001f, b = vfloat{} + 1e-7f, c = vfloat{};
  const long n = 200'000'000;
  double best = 0;
  for (int trial = 0; trial < 3; ++trial) {
    double t0 = cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
    for (long i = 0; i < n; ++i) {
      c = a * c + b;
      asm volatile("" : "+x"(c));
    }
    double t = cpu_seconds(CLOCK_THREAD_CPUTIME_ID) - t0;
    best = std::max(best, 4.0 * n / t * 1e-9);
  }
  if (c[0] == 42.f) std::printf(" ");
  return best;
}

// FMA throughput of `threads` threads in GFLOP/s (10 independent accumulator chains each).
double measure_fma_gflops(int threads) {
  const long n = 100'000'000;
  double best = 0;
  for (int trial = 0; trial < 3; ++trial) {
    double t0 = now();
    float sink = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
      vfloat a = vfloat{} + 1.0000001f, b = vfloat{} + 1e-7f;
      vfloat x0{}, x1{}, x2{}, x3{}, x4{}, x5{}, x6{}, x7{}, x8{}, x9{};
      for (long i = 0; i < n / 10; ++i) {
        x0 = a * x0 + b; x1 = a * x1 + b; x2 = a * x2 + b; x3 = a * x3 + b; x4 = a * x4 + b;
        x5 = a * x5 + b; x6 = a * x6 + b; x7 = a * x7 + b; x8 = a * x8 + b; x9 = a * x9 + b;
        asm volatile("" : "+x"(x0), "+x"(x1), "+x"(x2), "+x"(x3), "+x"(x4), "+x"(x5), "+x"(x6), "+x"(x7), "+x"(x8), "+x"(x9));
      }
      vfloat s = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7 + x8 + x9;
      sink += s[0];
    }
    double t = now() - t0;
    best = std::max(best, double(n / 10 * 10) * kLanes * 2 * threads / t * 1e-9);
    if (sink == 42.f) std::printf(" ");
  }
  return best;
}

struct Problem {
  int seqlen, heads, head_dim;
  std::vector<float> q, k, v, o, dout, dq, dk, dv, lse;
  fa_params p;
  Problem(int s, int h, int d, int threads) : seqlen(s), heads(h), head_dim(d) {
    const size_t n = size_t(s) * h * d;
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto* t : {&q, &k, &v, &dout}) {
      t->resize(n);
      for (auto& x : *t) x = nd(rng);
    }
    for (auto* t : {&o, &dq, &dk, &dv}) t->assign(n, 0.f);
    lse.assign(size_t(h) * s, 0.f);
    fa_params_init(&p);
    p.batch = 1;
    p.seqlen_q = p.seqlen_k = s;
    p.num_heads = p.num_heads_kv = h;
    p.head_dim = d;
    p.dtype = FA_FLOAT32;
    p.num_threads = threads;
    p.q = q.data(); p.k = k.data(); p.v = v.data(); p.o = o.data(); p.lse = lse.data();
    p.dout = dout.data(); p.dq = dq.data(); p.dk = dk.data(); p.dv = dv.data();
    fa_params_set_contiguous_strides(&p);
  }
  double fwd_flops(bool causal) const { return 4.0 * heads * double(seqlen) * seqlen * head_dim * (causal ? 0.5 : 1.0); }
};

struct Timing {
  double median_s, best_s;
  double cpu_s;  // median process CPU seconds per call (all threads; spinning OpenMP waits included)
};

Timing time_it(const std::function<void()>& fn, int reps) {
  fn();  // warm-up
  std::vector<double> t, c;
  for (int r = 0; r < reps; ++r) {
    double t0 = now(), c0 = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID);
    fn();
    t.push_back(now() - t0);
    c.push_back(cpu_seconds(CLOCK_PROCESS_CPUTIME_ID) - c0);
  }
  std::sort(t.begin(), t.end());
  std::sort(c.begin(), c.end());
  return {t[t.size() / 2], t[0], c[c.size() / 2]};
}

void check(fa_status s) {
  if (s != FA_OK) {
    std::fprintf(stderr, "cpu_bench: %s: %s\n", fa_status_name(s), fa_last_error());
    std::exit(1);
  }
}

// A "Vm...:  N kB" field of /proc/self/status: VmRSS (resident now) or VmHWM (peak resident of
// this address space; unlike getrusage's ru_maxrss it does not carry the parent's peak over exec).
long status_kib(const char* field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(field);
  while (std::getline(f, line))
    if (line.compare(0, n, field) == 0 && line.size() > n && line[n] == ':') return std::atol(line.c_str() + n + 1);
  return -1;
}

// The child of extra_memory_mib: one forward call, prints the peak extra resident MiB.
int memory_child(int seqlen, int heads, int head_dim, int threads, fa_impl impl) {
  Problem pr(seqlen, heads, head_dim, threads);
  const long before = status_kib("VmRSS");
  if (fa_forward(&pr.p, impl) != FA_OK) return 1;
  std::printf("%.3f\n", double(status_kib("VmHWM") - before) / 1024.0);
  return 0;
}

// Peak extra resident memory (MiB) of one forward call, in a fresh process (this program run with
// --memory-child: a fork alone would inherit OpenMP's thread pool, which libgomp does not survive).
double extra_memory_mib(int seqlen, int heads, int head_dim, int threads, fa_impl impl) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    std::string args[] = {"cpu_bench", "--memory-child", std::to_string(int(impl)), std::to_string(seqlen),
                          std::to_string(heads), std::to_string(head_dim), std::to_string(threads)};
    char* argv[8];
    for (int i = 0; i < 7; ++i) argv[i] = args[i].data();
    argv[7] = nullptr;
    execv("/proc/self/exe", argv);
    _exit(127);
  }
  close(fds[1]);
  char buf[64] = {};
  ssize_t n = read(fds[0], buf, sizeof buf - 1);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (n <= 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return -1;
  return std::atof(buf);
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 7 && std::strcmp(argv[1], "--memory-child") == 0)
    return memory_child(std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]), std::atoi(argv[6]),
                        fa_impl(std::atoi(argv[2])));
  int threads = 0, seqlen = 2048, heads = 16, head_dim = 64, reps = 5, memory_seqlen = 8192;
  long long cache_bytes = 0;  // the params' cpu_cache_bytes (0: the L2 size)
  bool reference = true, memory = true;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "cpu_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--threads") threads = std::atoi(next());
    else if (a == "--seqlen") seqlen = std::atoi(next());
    else if (a == "--heads") heads = std::atoi(next());
    else if (a == "--head-dim") head_dim = std::atoi(next());
    else if (a == "--reps") reps = std::max(1, std::atoi(next()));
    else if (a == "--memory-seqlen") memory_seqlen = std::atoi(next());
    else if (a == "--cache-bytes") cache_bytes = std::atoll(next());
    else if (a == "--no-reference") reference = false;
    else if (a == "--no-memory") memory = false;
    else if (a == "--json") json_path = next();
    else {
      std::fprintf(stderr, "usage: cpu_bench [--threads T] [--seqlen N] [--heads H] [--head-dim D] [--reps R]\n"
                           "                 [--no-reference] [--no-memory] [--memory-seqlen N] [--cache-bytes M]\n"
                           "                 [--json FILE]\n");
      return 2;
    }
  }
  if (threads <= 0) threads = omp_get_max_threads();

  const double ghz = measure_clock_ghz();
  const double fma_gflops = measure_fma_gflops(threads);
  const double peak = 2.0 * kLanes * 2.0 * ghz * threads;
  std::printf("cpu: %s, %d threads, %d-lane fp32 vectors\n", cpu_model().c_str(), threads, kLanes);
  std::printf("clock %.2f GHz (dependent-FMA latency, 4 cycles); peak 2 pipes x %d lanes x 2 x %.2f GHz x %d = %.1f GFLOP/s;"
              " measured FMA throughput %.1f GFLOP/s\n", ghz, kLanes, ghz, threads, peak, fma_gflops);
  std::printf("problem: fp32, batch 1, heads %d, seqlen %d, head_dim %d; cache budget M %lld bytes (0: L2)\n\n", heads,
              seqlen, head_dim, cache_bytes);
  std::printf("%-26s %12s %12s %12s %9s %16s\n", "impl", "median ms", "best ms", "GFLOP/s", "% peak", "GFLOP/cpu-s x T");

  Problem pr(seqlen, heads, head_dim, threads);
  pr.p.cpu_cache_bytes = cache_bytes;
  struct Row {
    std::string name;
    double flops;
    Timing t;
  };
  std::vector<Row> rows;
  auto run = [&](const std::string& name, double flops, int n, const std::function<void()>& fn) {
    Row r{name, flops, time_it(fn, n)};
    std::printf("%-26s %12.2f %12.2f %12.1f %8.1f%% %16.1f\n", name.c_str(), r.t.median_s * 1e3, r.t.best_s * 1e3,
                flops / r.t.median_s * 1e-9, 100.0 * flops / r.t.median_s * 1e-9 / peak,
                flops / r.t.cpu_s * 1e-9 * threads);
    std::fflush(stdout);
    rows.push_back(r);
  };
  pr.p.causal = 0;
  run("fa2_forward", pr.fwd_flops(false), reps, [&] { check(fa_forward(&pr.p, FA_IMPL_CPU_FA2)); });
  run("fa2_backward", 2.5 * pr.fwd_flops(false), reps, [&] { check(fa_backward(&pr.p, FA_IMPL_CPU_FA2)); });
  pr.p.causal = 1;
  run("fa2_forward_causal", pr.fwd_flops(true), reps, [&] { check(fa_forward(&pr.p, FA_IMPL_CPU_FA2)); });
  run("fa2_backward_causal", 2.5 * pr.fwd_flops(true), reps, [&] { check(fa_backward(&pr.p, FA_IMPL_CPU_FA2)); });
  pr.p.causal = 0;
  run("fa1_forward", pr.fwd_flops(false), 1, [&] { check(fa_forward(&pr.p, FA_IMPL_CPU_FA1)); });
  if (reference) run("reference_forward", pr.fwd_flops(false), 1, [&] { check(fa_forward(&pr.p, FA_IMPL_CPU_REFERENCE)); });

  auto find = [&](const std::string& n) -> const Row* {
    for (auto& r : rows)
      if (r.name == n) return &r;
    return nullptr;
  };
  const Row *fwd = find("fa2_forward"), *bwd = find("fa2_backward"), *ref = find("reference_forward");
  std::printf("\nbackward / forward time: %.2f\n", bwd->t.median_s / fwd->t.median_s);
  if (ref) std::printf("fa2 forward speed-up over the reference: %.1fx\n", ref->t.median_s / fwd->t.median_s);

  double mem_flash = -1, mem_fa1 = -1, mem_ref = -1;
  const int mem_heads = 2;
  if (memory) {
    mem_flash = extra_memory_mib(memory_seqlen, mem_heads, head_dim, threads, FA_IMPL_CPU_FA2);
    mem_fa1 = extra_memory_mib(memory_seqlen, mem_heads, head_dim, threads, FA_IMPL_CPU_FA1);
    mem_ref = reference ? extra_memory_mib(memory_seqlen, mem_heads, head_dim, threads, FA_IMPL_CPU_REFERENCE) : -1;
    std::printf("peak extra memory, seqlen %d, heads %d, head_dim %d: fa2 %.1f MiB, fa1 %.1f MiB, reference %.1f MiB"
                " (inputs+outputs %.1f MiB not counted)\n", memory_seqlen, mem_heads, head_dim, mem_flash, mem_fa1, mem_ref,
                6.0 * memory_seqlen * mem_heads * head_dim * 4 / 1048576.0);
  }

  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << "{\n  \"cpu\": \"" << cpu_model() << "\",\n  \"threads\": " << threads << ",\n  \"lanes\": " << kLanes
      << ",\n  \"clock_ghz\": " << ghz << ",\n  \"peak_gflops\": " << peak << ",\n  \"fma_measured_gflops\": "
      << fma_gflops << ",\n  \"problem\": {\"dtype\": \"fp32\", \"batch\": 1, \"heads\": " << heads
      << ", \"seqlen\": " << seqlen << ", \"head_dim\": " << head_dim << ", \"cpu_cache_bytes\": " << cache_bytes
      << "},\n  \"results\": [\n";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      f << "    {\"impl\": \"" << r.name << "\", \"median_ms\": " << r.t.median_s * 1e3 << ", \"best_ms\": "
        << r.t.best_s * 1e3 << ", \"gflops\": " << r.flops / r.t.median_s * 1e-9 << ", \"gflops_best\": "
        << r.flops / r.t.best_s * 1e-9 << ", \"fraction_of_peak\": " << r.flops / r.t.median_s * 1e-9 / peak << ", \"cpu_s\": " << r.t.cpu_s
        << ", \"gflops_per_cpu_s_times_threads\": " << r.flops / r.t.cpu_s * 1e-9 * threads << "}"
        << (i + 1 < rows.size() ? ",\n" : "\n");
    }
    f << "  ],\n  \"backward_over_forward\": " << bwd->t.median_s / fwd->t.median_s;
    if (ref) f << ",\n  \"speedup_over_reference\": " << ref->t.median_s / fwd->t.median_s;
    if (memory)
      f << ",\n  \"memory\": {\"seqlen\": " << memory_seqlen << ", \"heads\": " << mem_heads
        << ", \"fa2_extra_mib\": " << mem_flash << ", \"fa1_extra_mib\": " << mem_fa1
        << ", \"reference_extra_mib\": " << mem_ref << "}";
    f << "\n}\n";
  }
  return 0;
}
