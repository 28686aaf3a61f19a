// relay's malloc policy (FreedMemory::kKeep): a freed tensor's pages serve
// the next tensors without new page faults, on the main thread and on
// others, and what malloc holds is reported.
//
// Not asserted: that a larger tensor fits in the merged space of smaller
// freed ones. It does not when the tensors' small bookkeeping allocations
// lie between them (cpu_memory.h). The policy is process-wide, so
// every test here sets kKeep (the binaries' policy); kReturn is compared in
// the benchmarks (trainer_bench --cpu-memory).

#include "relay/model/cpu_memory.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "relay/model/device.h"

namespace relay::model {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

int64_t minor_faults() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return u.ru_minflt;
}

// Allocates and writes `bytes` of float tensors (as a step's activations),
// frees them, and returns the minor page faults taken by doing it again.
int64_t faults_of_a_second_pass(int64_t bytes, int pieces) {
  auto pass = [&] {
    std::vector<at::Tensor> ts;
    for (int i = 0; i < pieces; ++i) {
      ts.push_back(at::empty({bytes / pieces / 4}, at::kFloat));
      ts.back().fill_(static_cast<float>(i));
    }
    double sum = 0;
    for (const at::Tensor& t : ts) sum += t[0].item<double>();
    return sum;
  };
  EXPECT_EQ(pass(), pieces * (pieces - 1) / 2.0);
  const int64_t before = minor_faults();
  EXPECT_EQ(pass(), pieces * (pieces - 1) / 2.0);
  return minor_faults() - before;
}

class CpuMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override { configure_cpu_memory(FreedMemory::kKeep); }
};

TEST_F(CpuMemoryTest, FreedTensorsPagesServeTheNextOnesWithoutFaults) {
  // 256 MiB in eight 32 MiB tensors: 65,536 pages, each faulted again if
  // the blocks went back to the system (glibc maps anything this large by
  // default). Kept, the second pass reuses them.
  const int64_t faults = faults_of_a_second_pass(256 * kMiB, 8);
  EXPECT_LT(faults, 2000) << "the second pass faulted in its pages again";
}

TEST_F(CpuMemoryTest, OtherThreadsBlocksAreKeptToo) {
  // Blocks that fit the thread's arena's 64 MiB heaps (larger ones are
  // mapped whatever malloc is told: cpu_memory.h).
  int64_t faults = -1;
  std::thread worker([&] { faults = faults_of_a_second_pass(48 * kMiB, 6); });
  worker.join();
  EXPECT_GE(faults, 0);
  EXPECT_LT(faults, 2000);
}

TEST_F(CpuMemoryTest, StatsCountWhatIsInUseAndWhatIsKept) {
  const CpuMemoryStats start = cpu_memory_stats();
  if (!start.known) GTEST_SKIP() << "malloc here does not report (not glibc 2.33+)";
  at::Tensor t = at::ones({64 * kMiB / 4}, at::kFloat);
  const CpuMemoryStats held = cpu_memory_stats();
  EXPECT_GE(held.in_use_bytes - start.in_use_bytes, 64 * kMiB - kMiB);
  t = at::Tensor();
  const CpuMemoryStats after = cpu_memory_stats();
  EXPECT_LE(after.in_use_bytes, held.in_use_bytes - 64 * kMiB + kMiB);
  EXPECT_GE(after.free_bytes, 64 * kMiB);
}

TEST_F(CpuMemoryTest, ReleaseGivesTheFreedMemoryBack) {
  {
    at::Tensor t = at::ones({256 * kMiB / 4}, at::kFloat);
    EXPECT_EQ(t[-1].item<float>(), 1.0f);
  }
  const int64_t kept = current_rss_bytes();
  if (kept < 0) GTEST_SKIP() << "no /proc/self/status";
  release_free_cpu_memory();
  const int64_t released = current_rss_bytes();
  EXPECT_GE(kept - released, 200 * kMiB) << "resident " << kept << " -> " << released;
  // Tensors made afterwards fault their pages in afresh and hold what was
  // written (checked inside).
  faults_of_a_second_pass(64 * kMiB, 2);
}

TEST_F(CpuMemoryTest, AReturnScopeMapsNewBlocksAndRestoresThePolicy) {
  const CpuMemoryStats start = cpu_memory_stats();
  if (!start.known) GTEST_SKIP() << "malloc here does not report (not glibc 2.33+)";
  // Larger than all the freed memory malloc holds, so no freed chunk can
  // serve it: inside the scope it gets a mapping of its own, outside it
  // comes from the heap.
  const int64_t bytes = start.free_bytes + 64 * kMiB;
  {
    ReturnFreedMemoryScope one_off;
    at::Tensor t = at::empty({bytes / 4}, at::kFloat);
    EXPECT_GE(cpu_memory_stats().mapped_bytes - start.mapped_bytes, bytes);
  }
  EXPECT_EQ(cpu_memory_stats().mapped_bytes, start.mapped_bytes) << "unmapped when freed";
  at::Tensor t = at::empty({bytes / 4}, at::kFloat);
  EXPECT_EQ(cpu_memory_stats().mapped_bytes, start.mapped_bytes) << "kKeep again after the scope";
}

}  // namespace
}  // namespace relay::model
