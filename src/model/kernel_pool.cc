#include "model/kernel_pool.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>

#include "model/cpu_features.h"

#ifdef RELAY_X86_KERNELS
#include <immintrin.h>
#endif

namespace relay::model {
namespace {

// How long an idle worker spins before it sleeps: longer than the gaps
// between one decode step's kernel calls (norms, attention, sampling), short
// enough that the core is back for OpenBLAS soon after decoding stops using
// the kernels.
constexpr auto kSpin = std::chrono::microseconds(1000);

inline void relax() {
#ifdef RELAY_X86_KERNELS
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

}  // namespace

KernelPool::KernelPool(int threads) {
  for (int i = 0; i + 1 < std::max(threads, 1); ++i) workers_.emplace_back([this, i] { work(i); });
}

KernelPool::~KernelPool() {
  {
    std::lock_guard<std::mutex> lock(sleep_mutex_);
    stop_.store(true, std::memory_order_release);
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void KernelPool::run_part(int part, int parts) const {
  const int64_t chunks = (n_ + grain_ - 1) / grain_;
  const int64_t begin = chunks * part / parts * grain_;
  const int64_t end = std::min(n_, chunks * (part + 1) / parts * grain_);
  if (begin < end) call_(fn_, begin, end);
}

void KernelPool::run(int64_t n, int64_t grain, Trampoline call, const void* fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t chunks = (n + grain - 1) / grain;
  const int parts = static_cast<int>(std::min<int64_t>(threads(), chunks));
  std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
  if (parts <= 1 || !busy.owns_lock()) {
    call(fn, 0, n);
    return;
  }
  call_ = call;
  fn_ = fn;
  n_ = n;
  grain_ = grain;
  parts_ = parts;
  // Every worker acknowledges every job, taking part or not: none may still
  // be reading this job's fields when the next call rewrites them.
  pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  {
    // A worker about to sleep checks generation_ under this mutex, so it
    // either sees the new job or is waiting by the time this notifies.
    std::lock_guard<std::mutex> lock(sleep_mutex_);
    if (sleeping_ > 0) wake_.notify_all();
  }
  run_part(0, parts);
  while (pending_.load(std::memory_order_acquire) != 0) relax();
}

void KernelPool::work(int index) {
  uint64_t seen = 0;
  for (;;) {
    auto deadline = std::chrono::steady_clock::now() + kSpin;
    uint64_t now_generation;
    for (int k = 1;; ++k) {
      now_generation = generation_.load(std::memory_order_acquire);
      if (now_generation != seen || stop_.load(std::memory_order_acquire)) break;
      relax();
      if (k % 256 == 0 && std::chrono::steady_clock::now() > deadline) {
        std::unique_lock<std::mutex> lock(sleep_mutex_);
        ++sleeping_;
        wake_.wait(lock, [&] {
          return generation_.load(std::memory_order_acquire) != seen ||
                 stop_.load(std::memory_order_acquire);
        });
        --sleeping_;
        deadline = std::chrono::steady_clock::now() + kSpin;
      }
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = now_generation;
    if (index + 1 < parts_) run_part(index + 1, parts_);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

namespace {

std::shared_ptr<KernelPool>& pool_slot() {
  static std::shared_ptr<KernelPool> pool = std::make_shared<KernelPool>(1);
  return pool;
}

// Every size set so far, kept: a core share (core_share.h) moves a process
// between a few sizes (cores / busy processes), many times a second with a
// small model, and need not start and join a pool's threads each time (on
// configs/arith.yaml it took the share from 0.94x to 0.99x of a fixed
// split, docs/BENCHMARKS.md "Sharing the cores"). An unused pool's workers
// sleep.
std::mutex& pools_mutex() {
  static std::mutex m;
  return m;
}
std::map<int, std::shared_ptr<KernelPool>>& pools() {
  static std::map<int, std::shared_ptr<KernelPool>> p;
  return p;
}

}  // namespace

std::shared_ptr<KernelPool> kernel_pool() { return std::atomic_load(&pool_slot()); }

void set_kernel_threads(int threads) {
  threads = std::max(threads, 1);
  if (kernel_pool()->threads() == threads) return;
  std::lock_guard<std::mutex> lock(pools_mutex());
  std::shared_ptr<KernelPool>& pool = pools()[threads];
  if (!pool) pool = std::make_shared<KernelPool>(threads);
  // Callers of the old pool hold it until their job ends.
  std::atomic_store(&pool_slot(), pool);
}

void run_on_kernel_threads(int64_t n, int64_t grain,
                           void (*call)(const void* fn, int64_t begin, int64_t end),
                           const void* fn) {
  const std::shared_ptr<KernelPool> pool = kernel_pool();
  if (pool->threads() > 1) {
    pool->parallel_for(n, grain, [&](int64_t begin, int64_t end) { call(fn, begin, end); });
  } else {
    at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) { call(fn, begin, end); });
  }
}

}  // namespace relay::model
