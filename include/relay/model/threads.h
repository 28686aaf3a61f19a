#pragma once

// CPU threads for the tensor library, set once per process from run.threads
// (DESIGN.md, "Runtime choices"): a trainer and workers sharing a machine
// must not each assume they own every core.

namespace relay::model {

struct ThreadSettings {
  int intra_op = 0;  // LibTorch's intra-op pool (at::set_num_threads)
  int blas = -1;     // OpenBLAS's own pthread pool; -1 when the BLAS is not OpenBLAS
};

// Sets both pools to `threads` (0 = every core this process may use). Both
// are sized alike because LibTorch hands a whole GEMM to the BLAS from one
// thread, while its own pool runs elementwise work and batched matmuls; on a
// core budget the two must not multiply (on 2 cores, 2 intra-op threads next
// to a busy neighbour ran a decode-shaped loop ~3x slower than 1).
ThreadSettings configure_threads(int threads);

}  // namespace relay::model
