#include "device.hpp"

#include <malloc.h>
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>

#ifdef FLASHATTN_TOOLS_CUDA
#include <cuda_runtime.h>
#endif

namespace fa_cli {

namespace {
#ifdef FLASHATTN_TOOLS_CUDA
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
#endif

int64_t status_kib(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(key);
  while (std::getline(f, line))
    if (line.compare(0, n, key) == 0) return std::stoll(line.substr(n + 1));
  return -1;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      auto c = line.find(':');
      if (c != std::string::npos) return line.substr(c + 2);
    }
  return "unknown CPU";
}
}  // namespace

const char* device_flag_name(Device d) { return d == Device::Cuda ? "cuda" : "cpu"; }

bool cuda_built() {
#ifdef FLASHATTN_TOOLS_CUDA
  return true;
#else
  return false;
#endif
}

int cpu_count() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  unsigned n = std::thread::hardware_concurrency();
  return n ? int(n) : 1;
}

std::string device_description(Device d, int cpu_threads) {
#ifdef FLASHATTN_TOOLS_CUDA
  if (d == Device::Cuda) {
    int dev = 0;
    cudaDeviceProp prop{};
    if (cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&prop, dev) == cudaSuccess)
      return std::string(prop.name) + " (sm_" + std::to_string(prop.major * 10 + prop.minor) + ", " +
             std::to_string(prop.multiProcessorCount) + " SMs)";
    return "CUDA GPU";
  }
#endif
  (void)d;
  return cpu_model() + ", " + std::to_string(cpu_threads) + " threads";
}

Buffer::Buffer(Device dev, size_t bytes) : bytes_(bytes), dev_(dev) {
  if (bytes == 0) return;
  if (dev == Device::Cpu) {
    data_ = ::operator new(bytes, std::align_val_t(64));
    return;
  }
#ifdef FLASHATTN_TOOLS_CUDA
  check(cudaMalloc(&data_, bytes), "cudaMalloc");
#else
  throw std::runtime_error("this build of the flashattn CLI has no CUDA support");
#endif
}

Buffer::~Buffer() {
  if (!data_) return;
  if (dev_ == Device::Cpu) {
    ::operator delete(data_, std::align_val_t(64));
  } else {
#ifdef FLASHATTN_TOOLS_CUDA
    cudaFree(data_);
#endif
  }
}

void Buffer::upload(const void* host, size_t bytes) {
  if (bytes == 0) return;
  if (dev_ == Device::Cpu) {
    std::memcpy(data_, host, bytes);
    return;
  }
#ifdef FLASHATTN_TOOLS_CUDA
  check(cudaMemcpy(data_, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to the GPU");
#endif
}

void Buffer::download(void* host, size_t bytes) const {
  if (bytes == 0) return;
  if (dev_ == Device::Cpu) {
    std::memcpy(host, data_, bytes);
    return;
  }
#ifdef FLASHATTN_TOOLS_CUDA
  check(cudaMemcpy(host, data_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy from the GPU");
#endif
}

void Buffer::fill_bytes(unsigned char value) {
  if (bytes_ == 0) return;
  if (dev_ == Device::Cpu) {
    std::memset(data_, value, bytes_);
    return;
  }
#ifdef FLASHATTN_TOOLS_CUDA
  check(cudaMemset(data_, value, bytes_), "cudaMemset");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
#endif
}

double time_ms(Device dev, const std::function<bool()>& fn, bool* ok) {
#ifdef FLASHATTN_TOOLS_CUDA
  if (dev == Device::Cuda) {
    cudaEvent_t start, stop;
    check(cudaEventCreate(&start), "cudaEventCreate");
    check(cudaEventCreate(&stop), "cudaEventCreate");
    check(cudaEventRecord(start, nullptr), "cudaEventRecord");
    *ok = fn();
    check(cudaEventRecord(stop, nullptr), "cudaEventRecord");
    cudaError_t e = cudaEventSynchronize(stop);
    float ms = 0;
    if (e == cudaSuccess) cudaEventElapsedTime(&ms, start, stop);
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    if (e != cudaSuccess) {
      *ok = false;
      std::fprintf(stderr, "flashattn: the GPU reported: %s\n", cudaGetErrorString(e));
    }
    return ms;
  }
#endif
  (void)dev;
  auto t0 = std::chrono::steady_clock::now();
  *ok = fn();
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

size_t cuda_used_bytes() {
#ifdef FLASHATTN_TOOLS_CUDA
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) return total_b - free_b;
#endif
  return 0;
}

int64_t cuda_smem_per_sm() {
#ifdef FLASHATTN_TOOLS_CUDA
  int dev = 0, v = 0;
  if (cudaGetDevice(&dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) == cudaSuccess)
    return v;
#endif
  return 0;
}

int cuda_compute_capability() {
#ifdef FLASHATTN_TOOLS_CUDA
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  return major * 10 + minor;
#else
  return 0;
#endif
}

bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  if (!f) return false;
  f << "5";
  f.flush();
  return bool(f);
}

int64_t rss_bytes() {
  int64_t kib = status_kib("VmRSS:");
  return kib < 0 ? -1 : kib * 1024;
}

int64_t peak_rss_bytes() {
  int64_t kib = status_kib("VmHWM:");
  return kib < 0 ? -1 : kib * 1024;
}

void release_free_heap() { malloc_trim(0); }

}  // namespace fa_cli

namespace fa_cli {
int64_t l2_cache_bytes() {
#ifdef _SC_LEVEL2_CACHE_SIZE
  long v = sysconf(_SC_LEVEL2_CACHE_SIZE);
  if (v > 0) return v;
#endif
  for (int i = 0; i < 8; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream level(dir + "level"), size(dir + "size");
    int lv = 0;
    std::string sz;
    if (!(level >> lv) || !(size >> sz) || lv != 2) continue;
    int64_t n = std::stoll(sz);
    char unit = sz.empty() ? ' ' : sz.back();
    return unit == 'K' ? n * 1024 : unit == 'M' ? n * 1024 * 1024 : n;
  }
  return int64_t(1) << 20;
}
}  // namespace fa_cli
