#include "relay/model/threads.h"

#include <dlfcn.h>

#include <algorithm>
#include <thread>

#include <ATen/Parallel.h>

namespace relay::model {

ThreadSettings configure_threads(int threads) {
  ThreadSettings s;
  s.intra_op =
      threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(s.intra_op);
  // OpenBLAS is whatever libblas.so.3 resolves to at run time (Debian's
  // alternatives), so look its setter up instead of linking against it.
  using SetThreads = void (*)(int);
  if (auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set(s.intra_op);
    s.blas = s.intra_op;
  }
  return s;
}

}  // namespace relay::model
