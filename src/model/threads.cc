#include "relay/model/threads.h"

#include <dlfcn.h>
#include <malloc.h>

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
  at::set_num_threads(s.intra_op);
  return s;
}

void return_freed_memory() {
#ifdef M_MMAP_THRESHOLD
  // A fixed threshold also turns off glibc's dynamic adjustment.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  mallopt(M_TRIM_THRESHOLD, 8 << 20);
#endif
}

}  // namespace relay::model
