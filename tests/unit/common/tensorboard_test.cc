#include "relay/common/tensorboard.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace relay {
namespace {

std::string bytes(std::initializer_list<int> b) {
  std::string s;
  for (int x : b) s.push_back(static_cast<char>(x));
  return s;
}

TEST(TensorBoardTest, Crc32cMatchesTheStandardCheckValues) {
  EXPECT_EQ(crc32c(""), 0u);
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);            // the CRC-32C check value
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);  // RFC 3720, 32 zero bytes
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  const uint32_t c = crc32c("123456789");
  EXPECT_EQ(masked_crc32c("123456789"), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

// The protobuf bytes of an Event, spelled out by hand from the schema.
TEST(TensorBoardTest, ScalarEventIsTheProtobufEncodingOfEvent) {
  const std::string value = bytes({0x0A, 0x01, 'a', 0x15, 0x00, 0x00, 0x00, 0x40});  // tag, 2.0f
  const std::string summary = bytes({0x0A, 0x08}) + value;
  const std::string expected = bytes({0x09, 0, 0, 0, 0, 0, 0, 0xF8, 0x3F,  // wall_time 1.5
                                      0x10, 0x03,                          // step 3
                                      0x2A, 0x0A}) +
                               summary;
  EXPECT_EQ(scalar_event(1.5, 3, {{"a", 2.0}}), expected);
}

TEST(TensorBoardTest, WriterFramesEveryEventAndReadsBack) {
  const std::string dir = ::testing::TempDir() + "/relay_tb_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  auto w = TensorBoardWriter::open(dir);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_NE((*w)->path().find("/events.out.tfevents."), std::string::npos);
  ASSERT_TRUE((*w)->add_scalars(1, {{"reward/mean", 0.25}, {"loss", -1.0}}).ok());
  ASSERT_TRUE((*w)->add_scalars(2, {{"reward/mean", 0.5}}).ok());
  auto records = read_tfrecords((*w)->path());
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 3u);
  EXPECT_NE((*records)[0].find("brain.Event:2"), std::string::npos);
  EXPECT_NE((*records)[1].find("reward/mean"), std::string::npos);
  EXPECT_EQ((*records)[2].substr(9, 2), bytes({0x10, 0x02})) << "step 2 after wall_time";

  // A flipped byte in the data is caught by its CRC, naming the record.
  {
    std::fstream f((*w)->path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(12 + (*records)[0].size() + 4 + 12 + 3));
    f.put('\x7f');
  }
  auto bad = read_tfrecords((*w)->path());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(std::string(bad.status().message()).find("record 1"), std::string::npos)
      << bad.status();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace relay
