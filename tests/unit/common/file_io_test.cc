#include "relay/common/file_io.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

namespace relay {
namespace {

namespace fs = std::filesystem;

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "/file_io_" + std::to_string(::getpid()) + "_" + name;
}

TEST(FileIoTest, WriteThenReadRoundTrips) {
  const std::string path = TempPath("a.txt");
  ASSERT_TRUE(write_file_atomic(path, std::string("bytes\0inside", 12)).ok());
  auto text = read_file(path);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, std::string("bytes\0inside", 12));
  ASSERT_TRUE(write_file_atomic(path, "replaced").ok());
  EXPECT_EQ(*read_file(path), "replaced");
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  fs::remove(path);
}

TEST(FileIoTest, ReadingAMissingFileIsNotFound) {
  auto text = read_file(TempPath("absent.txt"));
  EXPECT_EQ(text.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(text.status().message().find("absent.txt"), std::string::npos);
}

// An abandoned write leaves the old file as it was and no temporary behind.
TEST(FileIoTest, UncommittedWriteChangesNothing) {
  const std::string path = TempPath("b.txt");
  ASSERT_TRUE(write_file_atomic(path, "old").ok());
  {
    AtomicFile file(path);
    ASSERT_TRUE(file.open().ok());
    ASSERT_TRUE(file.write("new", 3).ok());
  }  // destroyed before commit()
  EXPECT_EQ(*read_file(path), "old");
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_FALSE(write_file_atomic(TempPath("no_such_dir/c.txt"), "x").ok());
  fs::remove(path);
}

}  // namespace
}  // namespace relay
