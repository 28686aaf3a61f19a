// The kernel pool: every index once, on the caller and its workers, from
// several callers at once, after its workers fell asleep.

#include "model/kernel_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace relay::model {
namespace {

// Runs one job over [0, n) and checks it: every index exactly once, every
// range but the last at least `grain` long. Returns the threads that ran it.
std::set<std::thread::id> run_and_check(KernelPool& pool, int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  std::mutex mutex;
  std::set<std::thread::id> ran_on;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  pool.parallel_for(n, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
    std::lock_guard<std::mutex> lock(mutex);
    ran_on.insert(std::this_thread::get_id());
    ranges.emplace_back(begin, end);
  });
  for (int64_t i = 0; i < n; ++i)
    EXPECT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "index " << i;
  for (const auto& [begin, end] : ranges) {
    EXPECT_LT(begin, end);
    if (end != n) {
      EXPECT_GE(end - begin, grain) << begin << ".." << end;
    }
  }
  return ran_on;
}

TEST(KernelPoolTest, EveryIndexOnceForAnyThreadsSizeAndGrain) {
  for (int threads : {1, 2, 3, 4}) {
    KernelPool pool(threads);
    EXPECT_EQ(pool.threads(), threads);
    for (int64_t n : {0, 1, 2, 5, 97, 1000}) {
      for (int64_t grain : {1, 7, 64}) {
        SCOPED_TRACE(std::to_string(threads) + " threads, n " + std::to_string(n) + ", grain " +
                     std::to_string(grain));
        const std::set<std::thread::id> ran_on = run_and_check(pool, n, grain);
        const int64_t chunks = (n + grain - 1) / grain;
        EXPECT_EQ(static_cast<int64_t>(ran_on.size()), std::min<int64_t>(threads, chunks));
      }
    }
  }
}

TEST(KernelPoolTest, TheCallerTakesPartAndWorkersTheRest) {
  KernelPool pool(2);
  const std::set<std::thread::id> ran_on = run_and_check(pool, 1000, 10);
  EXPECT_EQ(ran_on.size(), 2u);
  EXPECT_EQ(ran_on.count(std::this_thread::get_id()), 1u);
}

TEST(KernelPoolTest, WorkersThatFellAsleepWakeForTheNextJob) {
  KernelPool pool(3);
  for (int round = 0; round < 3; ++round) {
    // Longer than a worker spins before it sleeps (1 ms).
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(run_and_check(pool, 300, 10).size(), 3u) << "round " << round;
  }
}

TEST(KernelPoolTest, CallersAtTheSameTimeEachGetTheirWholeJob) {
  KernelPool pool(2);
  std::vector<std::thread> callers;
  for (int c = 0; c < 3; ++c) {
    callers.emplace_back([&pool] {
      for (int i = 0; i < 200; ++i) run_and_check(pool, 257, 8);
    });
  }
  for (std::thread& t : callers) t.join();
}

TEST(KernelPoolTest, TheProcessPoolTakesANewSize) {
  set_kernel_threads(3);
  EXPECT_EQ(kernel_pool()->threads(), 3);
  EXPECT_EQ(run_and_check(*kernel_pool(), 100, 1).size(), 3u);
  set_kernel_threads(0);  // at least one: the caller
  EXPECT_EQ(kernel_pool()->threads(), 1);
}

// A core share moves a process between a few sizes many times a second: a
// size set before comes back as the same pool, its threads kept (asleep).
TEST(KernelPoolTest, ASizeSetBeforeIsTheSamePoolAgain) {
  set_kernel_threads(2);
  const KernelPool* two = kernel_pool().get();
  set_kernel_threads(3);
  EXPECT_NE(kernel_pool().get(), two);
  set_kernel_threads(2);
  EXPECT_EQ(kernel_pool().get(), two);
  EXPECT_EQ(run_and_check(*kernel_pool(), 100, 1).size(), 2u) << "its workers woke";
  set_kernel_threads(1);
}

}  // namespace
}  // namespace relay::model
