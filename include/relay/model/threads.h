#pragma once

// CPU threads for the tensor library, set once per process from run.threads
// (DESIGN.md, "Runtime choices"): a trainer and workers sharing a machine
// must not each assume they own every core.

namespace relay::model {

struct ThreadSettings {
  int intra_op = 0;  // LibTorch's intra-op pool (at::set_num_threads)
  int blas = -1;     // OpenBLAS's own pthread pool; -1 when the BLAS is not OpenBLAS
  // relay's kernel pool (src/model/kernel_pool.h: row_linear's few-row
  // products): the cores with OpenBLAS, whose pool idles while they run;
  // 1 otherwise, the kernels then using the intra-op pool.
  int kernels = 1;
};

// Gives this process `threads` cores (0 = every core it may use).
//
// With OpenBLAS (Debian's LibTorch), the cores go to OpenBLAS's pthread pool
// and LibTorch's OpenMP pool gets one thread: LibTorch hands each GEMM to the
// BLAS from one thread, and two pools that both spin on the same cores
// collide. Measured on 2 cores (docs/BENCHMARKS.md, "Threads"): 1 intra-op +
// 2 OpenBLAS threads decoded a 100M model ~2x faster than 2 + 2, and steadily.
// With any other BLAS (MKL in upstream LibTorch, which shares OpenMP's pool)
// all cores go to the intra-op pool.
ThreadSettings configure_threads(int threads);

}  // namespace relay::model
