#include "relay/model/blas_kernels.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "model/cpu_features.h"

namespace relay::model {
namespace {

constexpr const char* kCoreVariable = "OPENBLAS_CORETYPE";
constexpr const char* kDetectedVariable = "RELAY_OPENBLAS_DETECTED";

// OpenBLAS's x86-64 kernel sets (0.3.21's corenames) written for processors
// without AVX2. On a CPU that has AVX2 and FMA, OpenBLAS chose one of these
// only because it did not recognise the CPU. Sets with AVX2 (Haswell, Zen,
// Excavator, SkylakeX, Cooperlake, SapphireRapids) and names not listed here
// are OpenBLAS's informed choice.
constexpr std::array<std::string_view, 20> kPreAvx2Cores = {
    "katmai", "coppermine", "northwood",  "prescott",     "banias",
    "atom",   "core2",      "penryn",     "dunnington",   "nehalem",
    "athlon", "opteron",    "nano",       "opteron_sse3", "barcelona",
    "bobcat", "bulldozer",  "piledriver", "steamroller",  "sandybridge"};

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// OpenBLAS is whatever libblas.so.3 resolves to at run time (Debian's
// alternatives), so its functions are looked up, not linked.
template <typename Fn>
Fn openblas_function(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

using GetString = char* (*)();

}  // namespace

CpuVectorIsa cpu_vector_isa() {
  CpuVectorIsa isa;
#ifdef RELAY_X86_KERNELS
  // GCC's and Clang's checks include the operating system's support (XCR0)
  // for the wider registers, as OpenBLAS's own do.
  isa.avx2_fma = cpu_has_avx2_fma();
  isa.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx512vl");
  isa.amd = __builtin_cpu_is("amd");
#endif
  return isa;
}

std::string openblas_core_to_request(std::string_view detected, CpuVectorIsa isa) {
  if (!isa.avx2_fma) return "";
  const std::string name = lower(detected);
  if (std::find(kPreAvx2Cores.begin(), kPreAvx2Cores.end(), name) == kPreAvx2Cores.end()) {
    return "";
  }
  if (isa.avx512) return "SkylakeX";
  return isa.amd ? "Zen" : "Haswell";
}

void choose_blas_kernels(char** argv) {
  if (std::getenv(kCoreVariable) != nullptr) return;  // chosen already, by someone
  const auto corename = openblas_function<GetString>("openblas_get_corename");
  const auto config = openblas_function<GetString>("openblas_get_config");
  if (corename == nullptr || config == nullptr) return;
  // Without DYNAMIC_ARCH the kernels are compiled in and the variable is
  // ignored: starting again would change nothing.
  if (std::strstr(config(), "DYNAMIC_ARCH") == nullptr) return;
  const std::string detected = corename();
  const std::string wanted = openblas_core_to_request(detected, cpu_vector_isa());
  if (wanted.empty()) return;
  setenv(kCoreVariable, wanted.c_str(), 1);
  setenv(kDetectedVariable, detected.c_str(), 1);
  std::fflush(nullptr);
  // The program's own path, not /proc/self/exe: the kernel names a process
  // (ps, top, pgrep, killall) after the file it executed.
  std::string self(4096, '\0');
  const ssize_t n = readlink("/proc/self/exe", self.data(), self.size() - 1);
  self.resize(n > 0 ? static_cast<size_t>(n) : 0);
  constexpr std::string_view kDeleted = " (deleted)";  // replaced since it started
  if (self.empty() ||
      (self.size() >= kDeleted.size() &&
       self.compare(self.size() - kDeleted.size(), kDeleted.size(), kDeleted) == 0)) {
    self = "/proc/self/exe";
  }
  execv(self.c_str(), argv);
  const int error = errno;
  unsetenv(kCoreVariable);
  unsetenv(kDetectedVariable);
  std::fprintf(stderr,
               "relay: warning: OpenBLAS runs its %s kernels on a CPU with %s, and starting again "
               "with %s=%s failed (%s); matrix products will be several times slower than they "
               "can be\n",
               detected.c_str(), cpu_vector_isa().avx512 ? "AVX-512" : "AVX2", kCoreVariable,
               wanted.c_str(), std::strerror(error));
}

BlasKernels blas_kernels() {
  BlasKernels k;
  const auto corename = openblas_function<GetString>("openblas_get_corename");
  const auto config = openblas_function<GetString>("openblas_get_config");
  if (corename == nullptr || config == nullptr) return k;
  k.openblas = true;
  k.config = config();
  k.kernels = corename();
  const char* chosen = std::getenv(kCoreVariable);
  const char* detected = std::getenv(kDetectedVariable);
  // OpenBLAS may still decline the set relay asked for (it checks the CPU
  // too) and fall back to another; either way the choice was relay's.
  if (chosen != nullptr && detected != nullptr) {
    k.detected = detected;
  } else if (chosen != nullptr) {
    k.from_environment = true;
  }
  k.below_cpu =
      !k.from_environment && !openblas_core_to_request(k.kernels, cpu_vector_isa()).empty();
  return k;
}

std::string describe(const BlasKernels& k) {
  if (!k.openblas) return "not OpenBLAS";
  std::string s = k.config + ": " + k.kernels + " kernels";
  if (!k.detected.empty()) {
    s += " (relay's choice; OpenBLAS detected " + k.detected + ")";
  } else if (k.from_environment) {
    s += " (OPENBLAS_CORETYPE)";
  } else if (k.below_cpu) {
    s += " (OpenBLAS's choice, written for an older CPU than this one: matrix products run "
         "several times slower than they can)";
  } else {
    s += " (OpenBLAS's choice)";
  }
  return s;
}

}  // namespace relay::model
