#pragma once

// Which of OpenBLAS's kernel sets (its "core") the process runs, and a fix
// for the case where OpenBLAS picked one far below the CPU.
//
// Debian's OpenBLAS (0.3.21, built with DYNAMIC_ARCH) chooses its kernels
// from the CPU's family and model number when it loads. A model it does not
// know gets its Prescott (SSE3) kernels, whatever the CPU offers: on an
// Emerald Rapids guest (family 6, model 207, AVX-512) fp32 SGEMM ran 5-6x
// slower than with the SkylakeX kernels, and qwen2-100m decoded 3x slower
// at batch 64 (docs/BENCHMARKS.md, "OpenBLAS's kernels"). OpenBLAS takes
// another choice from the environment variable OPENBLAS_CORETYPE, but reads
// it only while it loads, before main(): a process can change its kernels
// only by starting again with the variable set.
//
// The rule (`openblas_core_to_request`) replaces only kernel sets that
// cannot be right for the CPU: one written for processors without AVX2
// (Prescott, Core2, Nehalem, Sandybridge, Barcelona, ...) on a CPU with AVX2
// and FMA. A set relay does not know (a newer OpenBLAS's) is never touched,
// and neither is any choice made through OPENBLAS_CORETYPE.

#include <string>
#include <string_view>

namespace relay::model {

// What the CPU (and the operating system, which must save the wider
// registers) offers for vector arithmetic.
struct CpuVectorIsa {
  bool avx2_fma = false;
  bool avx512 = false;  // F, CD, BW, DQ and VL: what OpenBLAS's SkylakeX kernels use
  bool amd = false;     // vendor AuthenticAMD (picks Zen over Haswell for AVX2)
};

CpuVectorIsa cpu_vector_isa();

// The OPENBLAS_CORETYPE to ask for when OpenBLAS chose `detected` (as
// openblas_get_corename() names it, any case) on a CPU with `isa`; "" keeps
// OpenBLAS's choice. AVX-512 -> "SkylakeX"; AVX2 and FMA -> "Zen" on AMD,
// "Haswell" otherwise.
std::string openblas_core_to_request(std::string_view detected, CpuVectorIsa isa);

// Call first in main(), before any other work: when the process runs
// Debian-style OpenBLAS (DYNAMIC_ARCH), OPENBLAS_CORETYPE is unset and
// openblas_core_to_request() names a better set, sets OPENBLAS_CORETYPE (and
// RELAY_OPENBLAS_DETECTED, OpenBLAS's own choice, for blas_kernels()) and
// executes the same program again with the same arguments and process id.
// Returns when there is nothing to change; when the restart itself fails it
// says so on stderr and returns with OpenBLAS's choice. Child processes
// inherit the variable and start with the chosen kernels.
void choose_blas_kernels(char** argv);

// What this process runs, for logs and reports.
struct BlasKernels {
  bool openblas = false;          // false: another BLAS (MKL, reference); nothing else is set
  std::string config;             // openblas_get_config(): version and build options
  std::string kernels;            // openblas_get_corename()
  std::string detected;           // OpenBLAS's own choice when relay replaced it, else ""
  bool from_environment = false;  // OPENBLAS_CORETYPE was set outside relay
  // OpenBLAS's kernels are written for an older processor than this CPU and
  // nothing replaced them (not a DYNAMIC_ARCH build, or the restart failed).
  bool below_cpu = false;
};

BlasKernels blas_kernels();

// One line: "OpenBLAS 0.3.21 ... : SkylakeX kernels (relay's choice; OpenBLAS
// detected Prescott)", "... (OPENBLAS_CORETYPE)", "not OpenBLAS".
std::string describe(const BlasKernels& k);

}  // namespace relay::model
