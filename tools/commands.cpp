#include <algorithm>
#include <cmath>
#include <cstdio>

#include "commands.hpp"

namespace fa_cli {

Device resolve_device(const std::string& flag) {
  const bool gpu = cuda_built() && fa_cuda_available();
  if (flag == "auto") return gpu ? Device::Cuda : Device::Cpu;
  if (flag == "cpu") return Device::Cpu;
  if (flag == "cuda") {
    if (!cuda_built()) throw UsageError("--device cuda: this build of flashattn has no CUDA backend (nvcc was not found)");
    if (!gpu) throw UsageError("--device cuda: no CUDA GPU is present");
    return Device::Cuda;
  }
  throw UsageError("--device: unknown device '" + flag + "' (use auto, cpu or cuda)");
}

fa_impl parse_impl(const std::string& name, Device dev) {
  const bool cpu = dev == Device::Cpu;
  fa_impl impl;
  if (name == "standard") impl = cpu ? FA_IMPL_CPU_REFERENCE : FA_IMPL_CUDA_STANDARD;
  else if (name == "reference") impl = FA_IMPL_CPU_REFERENCE;
  else if (name == "fa1") impl = FA_IMPL_CPU_FA1;
  else if (name == "fa2") impl = cpu ? FA_IMPL_CPU_FA2 : FA_IMPL_CUDA_SM80;
  else if (name == "sm80") impl = FA_IMPL_CUDA_SM80;
  else if (name == "sm90") impl = FA_IMPL_CUDA_SM90;
  else if (name == "auto") impl = FA_IMPL_AUTO;
  else {
    impl = FA_IMPL_AUTO;
    bool found = false;
    for (int i = FA_IMPL_CPU_REFERENCE; i <= FA_IMPL_CUDA_SM90; ++i)
      if (name == fa_impl_name(fa_impl(i))) {
        impl = fa_impl(i);
        found = true;
      }
    if (!found)
      throw UsageError("--impl: unknown implementation '" + name +
                       "' (use standard, reference, fa1, fa2, sm80, sm90, auto, or a full name such as cpu-fa2)");
  }
  const bool cuda_impl = impl == FA_IMPL_CUDA_STANDARD || impl == FA_IMPL_CUDA_SM80 || impl == FA_IMPL_CUDA_SM90;
  const bool cpu_impl = impl == FA_IMPL_CPU_REFERENCE || impl == FA_IMPL_CPU_FA1 || impl == FA_IMPL_CPU_FA2;
  if (cpu && cuda_impl) throw UsageError("--impl " + name + " runs on the GPU but --device is cpu");
  if (!cpu && cpu_impl) throw UsageError("--impl " + name + " runs on the CPU but --device is cuda");
  return impl;
}

std::vector<fa_impl> default_impls(Device dev, bool flash_only) {
  std::vector<fa_impl> v;
  if (dev == Device::Cpu) {
    if (!flash_only) v = {FA_IMPL_CPU_REFERENCE, FA_IMPL_CPU_FA1};
    v.push_back(FA_IMPL_CPU_FA2);
    return v;
  }
  if (!flash_only) v.push_back(FA_IMPL_CUDA_STANDARD);
  v.push_back(FA_IMPL_CUDA_SM80);
  if (cuda_compute_capability() == 90) v.push_back(FA_IMPL_CUDA_SM90);
  return v;
}

std::string impl_label(fa_impl impl) {
  switch (impl) {
    case FA_IMPL_CPU_REFERENCE: return "(standard, S/P fp64)";
    case FA_IMPL_CPU_FA1: return "(flash, FA1 order)";
    case FA_IMPL_CPU_FA2: return "(flash, FA2)";
    case FA_IMPL_CUDA_STANDARD: return "(standard, cuBLAS)";
    case FA_IMPL_CUDA_SM80: return "(flash, mma.sync)";
    case FA_IMPL_CUDA_SM90: return "(flash, wgmma)";
    default: return "(auto)";
  }
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double x = std::fabs(b);
  while (x >= 1024 && u < 4) {
    x /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", b < 0 ? -x : x, units[u]);
  return buf;
}

std::string fixed(double v, int digits) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

}  // namespace fa_cli
