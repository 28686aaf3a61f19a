#include "relay/model/device.h"

#include <ATen/autocast_mode.h>
#include <torch/cuda.h>
#include <torch/version.h>

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

}  // namespace

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

StatusOr<std::optional<c10::ScalarType>> parse_autocast(const std::string& name) {
  if (name == "none") return std::optional<c10::ScalarType>();
  if (name == "bfloat16") return std::optional<c10::ScalarType>(c10::ScalarType::BFloat16);
  if (name == "float16") return std::optional<c10::ScalarType>(c10::ScalarType::Half);
  return InvalidArgumentError(
      absl::StrCat("run.autocast: '", name, "' is not none, bfloat16 or float16"));
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
