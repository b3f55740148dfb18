// Memory and timing on the device a command runs on: the host (CPU) or a CUDA GPU.
// Built with FLASHATTN_TOOLS_CUDA when the library has its CUDA backend; the CLI never calls
// the CUDA runtime otherwise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace fa_cli {

enum class Device { Cpu, Cuda };

const char* device_flag_name(Device d);  // "cpu" / "cuda"
bool cuda_built();                       // this binary can reach a GPU
std::string device_description(Device d, int cpu_threads);
int cpu_count();                         // cores this process may run on

// One allocation on a device; freed by the destructor.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Device dev, size_t bytes);
  Buffer(Buffer&& o) noexcept { swap(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    swap(o);
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  void upload(const void* host, size_t bytes);  // host -> this buffer
  void download(void* host, size_t bytes) const;
  void fill_bytes(unsigned char value);          // memset (0xff: NaN in every dtype)

 private:
  void swap(Buffer& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    std::swap(dev_, o.dev_);
  }
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device dev_ = Device::Cpu;
};

// Milliseconds of fn() on the device: CUDA events around it on the default stream, or the
// host's steady clock. fn returns false on failure (then the time is meaningless).
double time_ms(Device dev, const std::function<bool()>& fn, bool* ok);

// Device memory in use (total - free) from cudaMemGetInfo; 0 on the CPU.
size_t cuda_used_bytes();
// Shared memory per SM of the current GPU (the model's M on the GPU); 0 without one.
int64_t cuda_smem_per_sm();
int cuda_compute_capability();  // e.g. 90; 0 without a GPU

// Peak resident memory of this process, for the CPU's "peak extra memory": reset_peak() makes
// the kernel forget the old peak (/proc/self/clear_refs), rss_bytes()/peak_rss_bytes() read
// /proc/self/status. reset_peak returns false where the kernel does not allow it.
bool reset_peak_rss();
int64_t rss_bytes();
int64_t peak_rss_bytes();
void release_free_heap();  // hand freed heap pages back to the OS (malloc_trim)

}  // namespace fa_cli

namespace fa_cli {
// The core's L2 size in bytes (the CPU backend's default M): sysconf, then sysfs; 1 MiB when unknown.
int64_t l2_cache_bytes();
}  // namespace fa_cli
