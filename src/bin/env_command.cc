// relay env: what this machine gives relay's processes, one "key: value" line
// each: the LibTorch it runs, its devices, the attention implementation
// (model/attention_implementation.h), the BLAS and the kernels it chose
// (model/blas_kernels.h), the CPU's vector instructions and the threads a
// process gets with run.threads 0. The first thing to attach to a report of
// slow training or decoding.

#include <torch/cuda.h>
#include <torch/version.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <thread>

#include "bin/commands.h"
#include "relay/model/attention_implementation.h"
#include "relay/model/blas_kernels.h"
#include "relay/model/device.h"
#include "relay/model/threads.h"

namespace relay::cli {
namespace {

const char* yes_no(bool b) { return b ? "yes" : "no"; }

int print_env() {
  std::printf("libtorch: %s\n", TORCH_VERSION);
  if (model::cuda_available()) {
    std::printf("cuda: %d device(s)\n", static_cast<int>(torch::cuda::device_count()));
  } else {
    std::printf("cuda: none (this build or this machine has no GPU)\n");
  }
  std::printf("attention: %s (%s)\n",
              model::attention_implementation_name(model::attention_implementation()),
              model::sdpa_available() ? "at::scaled_dot_product_attention"
                                      : "explicit products; this LibTorch has no "
                                        "scaled_dot_product_attention (2.0+)");
  std::printf("blas: %s\n", model::describe(model::blas_kernels()).c_str());
  const model::CpuVectorIsa isa = model::cpu_vector_isa();
  std::printf("cpu: %u cores, AVX2+FMA %s, AVX-512 %s\n", std::thread::hardware_concurrency(),
              yes_no(isa.avx2_fma), yes_no(isa.avx512));
  const model::ThreadSettings threads = model::configure_threads(0);
  if (threads.blas >= 0) {
    std::printf("threads: %d intra-op, %d OpenBLAS (run.threads 0)\n", threads.intra_op,
                threads.blas);
  } else {
    std::printf("threads: %d intra-op (run.threads 0)\n", threads.intra_op);
  }
  return 0;
}

}  // namespace

Command add_env_command(CLI::App& relay) {
  CLI::App* env = relay.add_subcommand(
      "env", "Report LibTorch, devices, BLAS kernels, CPU and threads on this machine");
  return {env, [] { return print_env(); }};
}

}  // namespace relay::cli
