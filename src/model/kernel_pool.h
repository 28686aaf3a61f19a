#pragma once

// Threads for relay's own memory-bound kernels (row_linear's few-row
// products, decode_attention's reads of the paged cache). Private to src/.
//
// With OpenBLAS, model::configure_threads gives LibTorch's intra-op pool one
// thread and the cores to OpenBLAS's pool (two pools spinning on the same
// cores collide). A decode step at batch 1-4 then runs no OpenBLAS at all:
// its products are row_linear's, on one thread, and one core does not
// saturate the memory bus (on the 2-core Xeon VM the batch-1 kernel streamed
// ~9.5 GB/s of weights where OpenBLAS's two-thread GEMV reads 21 GB/s). This
// pool lends those kernels the cores OpenBLAS idles on meanwhile.
//
// Workers spin briefly after a job (a decode step calls the kernels ~85
// times, tens of microseconds apart) and then sleep on a condition variable,
// so a process that stops calling them, or runs OpenBLAS's GEMMs instead,
// gets its cores back within about a millisecond.
//
// Splits are by index range only, so a kernel whose outputs do not depend
// on the split (row_linear's) gives the same bits on any number of threads.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace relay::model {

class KernelPool {
 public:
  // `threads` >= 1: the caller plus threads - 1 workers.
  explicit KernelPool(int threads);
  ~KernelPool();
  KernelPool(const KernelPool&) = delete;
  KernelPool& operator=(const KernelPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) over disjoint ranges covering [0, n), each at least
  // `grain` long (the last may be shorter), on up to threads() threads, the
  // caller among them; returns when every range is done. `fn` must not
  // throw. A call made while
  // another is running (another thread's) runs whole on its own caller.
  template <typename Fn>
  void parallel_for(int64_t n, int64_t grain, const Fn& fn) {
    run(n, grain, &invoke<Fn>, &fn);
  }

 private:
  using Trampoline = void (*)(const void* fn, int64_t begin, int64_t end);
  template <typename Fn>
  static void invoke(const void* fn, int64_t begin, int64_t end) {
    (*static_cast<const Fn*>(fn))(begin, end);
  }

  void run(int64_t n, int64_t grain, Trampoline call, const void* fn);
  void work(int index);
  // Range `part` of `parts` over [0, n_), in grain-sized steps.
  void run_part(int part, int parts) const;

  std::vector<std::thread> workers_;
  std::mutex busy_;  // one job at a time

  // The job: written by the caller before it bumps generation_.
  Trampoline call_ = nullptr;
  const void* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t grain_ = 1;
  int parts_ = 0;  // workers with index < parts_ - 1 take part index + 1

  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};  // parts not yet finished by workers
  std::atomic<bool> stop_{false};
  std::mutex sleep_mutex_;
  std::condition_variable wake_;
  int sleeping_ = 0;  // under sleep_mutex_
};

// The process's pool for relay's kernels: one thread until
// set_kernel_threads() (model::configure_threads calls it). A caller keeps
// the pointer for the length of its job; a new size replaces the pool for
// later callers (a size used before gets its earlier pool back).
std::shared_ptr<KernelPool> kernel_pool();
void set_kernel_threads(int threads);

// fn(begin, end) over [0, n) in ranges of at least `grain` on the kernel
// pool where it has more than one thread (with OpenBLAS: threads.h), else
// on LibTorch's intra-op pool, which then has the cores. What relay's
// kernels call.
void run_on_kernel_threads(int64_t n, int64_t grain,
                           void (*call)(const void* fn, int64_t begin, int64_t end),
                           const void* fn);
template <typename Fn>
void kernel_parallel_for(int64_t n, int64_t grain, const Fn& fn) {
  run_on_kernel_threads(
      n, grain,
      [](const void* f, int64_t begin, int64_t end) { (*static_cast<const Fn*>(f))(begin, end); },
      &fn);
}

}  // namespace relay::model
