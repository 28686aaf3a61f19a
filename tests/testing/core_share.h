#pragma once

// A core share (model/core_share.h) installed in the test's process for the
// test's length, in a file of its own, and a wait for the process's mark:
// for tests of what marks a process busy or waiting.

#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "relay/model/core_share.h"

namespace relay::testing {

class InstalledCoreShare {
 public:
  explicit InstalledCoreShare(const std::string& name, int cores = 2)
      : path_((std::filesystem::temp_directory_path() /
               ("relay_" + name + "_" + std::to_string(::getpid())))
                  .string()) {
    std::filesystem::remove(path_);
    auto share = model::CoreShare::open(path_, cores);
    EXPECT_TRUE(share.ok()) << share.status();
    if (share.ok()) model::install_core_share(*std::move(share));
  }
  ~InstalledCoreShare() {
    model::install_core_share(nullptr);
    std::filesystem::remove(path_);
  }
  InstalledCoreShare(const InstalledCoreShare&) = delete;
  InstalledCoreShare& operator=(const InstalledCoreShare&) = delete;

  // Whether this process is marked busy now.
  bool busy() const { return model::installed_core_share()->busy(); }
  // Waits up to `timeout` for this process to be marked `busy` (true) or
  // waiting (false); whether it was.
  bool marked(bool busy, std::chrono::seconds timeout = std::chrono::seconds(30)) const {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (this->busy() != busy && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return this->busy() == busy;
  }

 private:
  std::string path_;
};

}  // namespace relay::testing
