#include "relay/model/device.h"

#include <ATen/autocast_mode.h>
#include <torch/cuda.h>
#include <torch/version.h>
#include <algorithm>

#include <fstream>
#include <sstream>
#include <string>

#ifdef RELAY_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

// LibTorch 2.4 replaced the per-device autocast switches (set_enabled for
// CUDA, set_cpu_enabled, ...) with ones that take the device type, and
// deprecated the old ones; 1.13 has only the old ones.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define RELAY_AUTOCAST_BY_DEVICE_TYPE 1
#endif

namespace relay::model {
namespace {

bool autocast_enabled(bool cuda) {
#ifdef RELAY_AUTOCAST_BY_DEVICE_TYPE
  return at::autocast::is_autocast_enabled(cuda ? at::kCUDA : at::kCPU);
#else
  return cuda ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
#endif
}

c10::ScalarType autocast_dtype(bool cuda) {
#ifdef RELAY_AUTOCAST_BY_DEVICE_TYPE
  return at::autocast::get_autocast_dtype(cuda ? at::kCUDA : at::kCPU);
#else
  return cuda ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
#endif
}

void set_autocast(bool cuda, bool enabled, c10::ScalarType dtype) {
#ifdef RELAY_AUTOCAST_BY_DEVICE_TYPE
  const at::DeviceType type = cuda ? at::kCUDA : at::kCPU;
  at::autocast::set_autocast_enabled(type, enabled);
  at::autocast::set_autocast_dtype(type, dtype);
#else
  if (cuda) {
    at::autocast::set_enabled(enabled);
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_cpu_enabled(enabled);
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
#endif
}

// The value of `key` (e.g. "MemAvailable:") in a /proc file of "key value
// kB" lines, in bytes; -1 when absent.
int64_t proc_kib(const char* path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) != 0) continue;
    std::istringstream fields(line.substr(key.size()));
    int64_t kib = -1;
    fields >> kib;
    return kib >= 0 ? kib * 1024 : -1;
  }
  return -1;
}

// A one-number file (cgroup v2 memory.max / memory.current); -1 for "max" or
// when absent.
int64_t read_number(const char* path) {
  std::ifstream in(path);
  std::string text;
  in >> text;
  int64_t v = -1;
  return absl::SimpleAtoi(text, &v) ? v : -1;
}

}  // namespace

int64_t free_memory_bytes(c10::Device device) {
  if (device.is_cuda()) {
#ifdef RELAY_WITH_CUDA
    const c10::cuda::CUDAGuard guard(device);
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) return -1;
    return static_cast<int64_t>(free);
#else
    return -1;
#endif
  }
  int64_t available = proc_kib("/proc/meminfo", "MemAvailable:");
  const int64_t limit = read_number("/sys/fs/cgroup/memory.max");
  const int64_t used = read_number("/sys/fs/cgroup/memory.current");
  if (limit > 0 && used >= 0 && (available < 0 || limit - used < available)) {
    available = std::max<int64_t>(0, limit - used);
  }
  return available;
}

int64_t current_rss_bytes() { return proc_kib("/proc/self/status", "VmRSS:"); }
int64_t peak_rss_bytes() { return proc_kib("/proc/self/status", "VmHWM:"); }

bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  return static_cast<bool>(out.flush());
}

int64_t device_peak_bytes(c10::Device device) {
#ifdef RELAY_WITH_CUDA
  if (device.is_cuda()) {
    // Index 0 is StatType::AGGREGATE, an enum that moved namespaces across
    // LibTorch 2.x (CUDACachingAllocator, then CachingDeviceAllocator).
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return stats.allocated_bytes[0].peak;
  }
#endif
  return -1;
}

void reset_device_peak(c10::Device device) {
#ifdef RELAY_WITH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#endif
}

bool cuda_available() {
#ifdef RELAY_WITH_CUDA
  return torch::cuda::is_available();
#else
  return false;
#endif
}

StatusOr<c10::Device> parse_device(const std::string& name, int local_rank) {
  if (name == "cpu") return c10::Device(c10::DeviceType::CPU);
  int index = local_rank;
  if (name.rfind("cuda:", 0) == 0) {
    if (!absl::SimpleAtoi(name.substr(5), &index) || index < 0) {
      return InvalidArgumentError(
          absl::StrCat("run.device: '", name, "' is not cpu, cuda or cuda:<index>"));
    }
  } else if (name != "cuda") {
    return InvalidArgumentError(
        absl::StrCat("run.device: '", name, "' is not cpu, cuda or cuda:<index>"));
  }
#ifndef RELAY_WITH_CUDA
  return InvalidArgumentError(
      absl::StrCat("run.device: '", name,
                   "' needs a CUDA build of relay; this one was built against a CPU-only LibTorch "
                   "(docs/cluster.md, \"Building for the cluster\")"));
#else
  if (!torch::cuda::is_available()) {
    return InvalidArgumentError(
        absl::StrCat("run.device: '", name, "' but no CUDA device is visible to this process"));
  }
  const int64_t visible = static_cast<int64_t>(torch::cuda::device_count());
  if (index >= visible) {
    return InvalidArgumentError(absl::StrCat(
        "run.device: '", name, "' is cuda:", index, " but ", visible, " CUDA devices are visible",
        name == "cuda" ? " ($LOCAL_RANK picks the index)" : ""));
  }
  return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index));
#endif
}

c10::ScalarType scalar_type(Precision precision) {
  switch (precision) {
    case Precision::kFloat32:
      return c10::ScalarType::Float;
    case Precision::kBFloat16:
      return c10::ScalarType::BFloat16;
    case Precision::kFloat16:
      return c10::ScalarType::Half;
  }
  return c10::ScalarType::Float;
}

std::optional<c10::ScalarType> autocast_type(Autocast autocast) {
  switch (autocast) {
    case Autocast::kNone:
      return std::nullopt;
    case Autocast::kBFloat16:
      return c10::ScalarType::BFloat16;
    case Autocast::kFloat16:
      return c10::ScalarType::Half;
  }
  return std::nullopt;
}

std::optional<c10::ScalarType> current_autocast(c10::DeviceType device_type) {
  const bool cuda = device_type == c10::DeviceType::CUDA;
  if (!autocast_enabled(cuda)) return std::nullopt;
  return autocast_dtype(cuda);
}

AutocastGuard::AutocastGuard(c10::DeviceType device_type, std::optional<c10::ScalarType> dtype) {
  if (!dtype) return;
  active_ = true;
  cuda_ = device_type == c10::DeviceType::CUDA;
  was_enabled_ = autocast_enabled(cuda_);
  was_dtype_ = autocast_dtype(cuda_);
  set_autocast(cuda_, true, *dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  set_autocast(cuda_, was_enabled_, was_dtype_);
}

}  // namespace relay::model
