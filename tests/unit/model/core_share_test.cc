// The core share: busy processes divide the cores, a crashed process's slot
// goes back, bad files are refused by name, and the installed share moves
// this process's threads at its safe points.

#include "relay/model/core_share.h"

#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "model/kernel_pool.h"
#include "relay/model/threads.h"

namespace relay::model {
namespace {

class CoreShareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("relay_core_share_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "cores").string();
  }
  void TearDown() override {
    install_core_share(nullptr);
    configure_threads(0);
    std::filesystem::remove_all(dir_);
  }
  std::unique_ptr<CoreShare> open(int cores) {
    auto s = CoreShare::open(path_, cores);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }
  std::filesystem::path dir_;
  std::string path_;
};

TEST_F(CoreShareTest, BusyProcessesDivideTheCores) {
  auto a = open(4), b = open(4), c = open(4);
  ASSERT_TRUE(a && b && c);
  EXPECT_NE(a->slot(), b->slot());
  EXPECT_NE(b->slot(), c->slot());
  // Every share starts busy.
  EXPECT_EQ(a->busy_processes(), 3);
  EXPECT_EQ(a->share(), 1);  // 4 / 3
  a->set_busy(false);
  EXPECT_EQ(b->busy_processes(), 2);
  EXPECT_EQ(b->share(), 2);
  // A waiting process's share is what it would get on starting work.
  EXPECT_EQ(a->share(), 1);
  c->set_busy(false);
  EXPECT_EQ(b->share(), 4);
  EXPECT_EQ(a->share(), 2);
  b->set_busy(false);
  EXPECT_EQ(a->busy_processes(), 0);
  EXPECT_EQ(a->share(), 4);
}

TEST_F(CoreShareTest, AClosedShareGivesItsSlotBack) {
  auto a = open(2);
  ASSERT_TRUE(a);
  const int slot = a->slot();
  auto b = open(2);
  EXPECT_EQ(b->busy_processes(), 2);
  a.reset();
  EXPECT_EQ(b->busy_processes(), 1);
  EXPECT_EQ(b->share(), 2);
  auto c = open(2);
  EXPECT_EQ(c->slot(), slot);
}

TEST_F(CoreShareTest, ACrashedProcessIsNotCountedAndItsSlotIsTakenBack) {
  auto a = open(2);
  ASSERT_TRUE(a);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Busy, then gone without closing: its slot still says busy.
    auto s = CoreShare::open(path_, 2);
    ::_exit(s.ok() ? 10 + (*s)->slot() : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  const int child_slot = WEXITSTATUS(status) - 10;
  ASSERT_GE(child_slot, 0);
  EXPECT_EQ(a->busy_processes(), 1);
  EXPECT_EQ(a->share(), 2);
  auto b = open(2);
  EXPECT_EQ(b->slot(), child_slot);
}

TEST_F(CoreShareTest, EverySlotHeldIsAnErrorNamingTheFile) {
  std::vector<std::unique_ptr<CoreShare>> held;
  for (int i = 0; i < CoreShare::kSlots; ++i) {
    held.push_back(open(2));
    ASSERT_TRUE(held.back());
  }
  auto more = CoreShare::open(path_, 2);
  ASSERT_FALSE(more.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(more.status())) << more.status();
  EXPECT_NE(more.status().message().find(path_), std::string::npos) << more.status();
}

TEST_F(CoreShareTest, BadFilesAndCoresAreRefusedByName) {
  {
    std::ofstream f(path_);
    f << "not a core share";
  }
  auto wrong_size = CoreShare::open(path_, 2);
  ASSERT_FALSE(wrong_size.ok());
  EXPECT_NE(wrong_size.status().message().find(path_), std::string::npos);
  EXPECT_NE(wrong_size.status().message().find("bytes"), std::string::npos);

  const std::string missing_dir = (dir_ / "no" / "such" / "cores").string();
  auto unopenable = CoreShare::open(missing_dir, 2);
  ASSERT_FALSE(unopenable.ok());
  EXPECT_NE(unopenable.status().message().find(missing_dir), std::string::npos);

  std::filesystem::remove(path_);
  auto zero = CoreShare::open(path_, 0);
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("cores"), std::string::npos);
}

// The threads configure_threads set: the kernel pool's with OpenBLAS (which
// then gets the same count), LibTorch's intra-op pool otherwise.
int process_threads() {
  const int kernels = kernel_pool()->threads();
  return kernels > 1 ? kernels : at::get_num_threads();
}

// Past refresh_cores()'s 10 ms between reads of the file.
void refresh_later() {
  std::this_thread::sleep_for(std::chrono::milliseconds(15));
  refresh_cores();
}

TEST_F(CoreShareTest, TheInstalledShareMovesThisProcesssThreadsAtItsSafePoints) {
  install_core_share(open(2));
  ASSERT_NE(installed_core_share(), nullptr);
  EXPECT_EQ(core_share_threads(), 2);  // alone and busy: every core
  EXPECT_EQ(process_threads(), 2);

  // Another process starts working: this one follows at its next safe point.
  auto other = open(2);
  refresh_later();
  EXPECT_EQ(core_share_threads(), 1);
  EXPECT_EQ(process_threads(), 1);

  // It waits again: the cores come back.
  other->set_busy(false);
  refresh_later();
  EXPECT_EQ(core_share_threads(), 2);
  EXPECT_EQ(process_threads(), 2);

  // While this process waits its threads stay; starting work takes the
  // share at once, without a safe point.
  {
    const CoresWaiting waiting;
    EXPECT_FALSE(installed_core_share()->busy());
    other->set_busy(true);
    refresh_later();
    EXPECT_EQ(core_share_threads(), 2);
  }
  EXPECT_TRUE(installed_core_share()->busy());
  EXPECT_EQ(core_share_threads(), 1);
  EXPECT_EQ(process_threads(), 1);
}

TEST_F(CoreShareTest, WithoutAShareTheCallsChangeNothing) {
  configure_threads(2);
  cores_busy(false);
  cores_busy(true);
  refresh_later();
  EXPECT_EQ(core_share_threads(), 0);
  EXPECT_EQ(process_threads(), 2);
}

}  // namespace
}  // namespace relay::model
