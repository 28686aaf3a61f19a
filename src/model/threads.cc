#include "relay/model/threads.h"

#include <dlfcn.h>

#include <algorithm>
#include <thread>

#include <ATen/Parallel.h>

#include "model/kernel_pool.h"

namespace relay::model {

ThreadSettings configure_threads(int threads) {
  const int cores =
      threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  ThreadSettings s;
  // OpenBLAS is whatever libblas.so.3 resolves to at run time (Debian's
  // alternatives), so look its setter up instead of linking against it.
  using SetThreads = void (*)(int);
  if (auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set(cores);
    s.blas = cores;
    s.intra_op = 1;
    s.kernels = cores;
  } else {
    s.intra_op = cores;
    s.kernels = 1;
  }
  set_kernel_threads(s.kernels);
  // Called again when a core share changes (core_share.h): LibTorch's own
  // pool may refuse a resize once it has run work, so only what changed.
  if (at::get_num_threads() != s.intra_op) at::set_num_threads(s.intra_op);
  return s;
}

}  // namespace relay::model
