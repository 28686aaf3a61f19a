#pragma once

// TensorBoard event files, written directly (no TensorFlow, no protobuf
// schema): a file of TFRecords, each
//   uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)
// (little-endian), whose data is a serialized tensorflow.Event. The first
// event carries file_version "brain.Event:2"; each later one a step and a
// Summary of scalar values (Summary.Value.tag + simple_value). That is all
// TensorBoard's scalar dashboard reads.

#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "relay/common/status.h"

namespace relay {

// CRC-32C (Castagnoli), as TFRecord uses; crc32c("123456789") == 0xE3069283.
uint32_t crc32c(std::string_view data);
// TFRecord's masking of a CRC stored next to the data it covers.
uint32_t masked_crc32c(std::string_view data);

// One TFRecord's bytes around `data`.
std::string tfrecord(std::string_view data);

// A serialized tensorflow.Event: wall_time, step and scalar summary values.
std::string scalar_event(double wall_time, int64_t step,
                         const std::map<std::string, double>& values);

class TensorBoardWriter {
 public:
  // Creates `dir` and events.out.tfevents.<unix seconds>.<host>.relay in it,
  // with the file-version event. Errors name the path.
  static StatusOr<std::unique_ptr<TensorBoardWriter>> open(const std::string& dir);

  // One event with every value as a scalar under its name (metric names
  // like "reward/mean" group into TensorBoard sections by their prefix);
  // flushed, so a running TensorBoard sees it at once.
  Status add_scalars(int64_t step, const std::map<std::string, double>& values);

  const std::string& path() const { return path_; }

 private:
  TensorBoardWriter(std::string path, std::ofstream out);
  std::string path_;
  std::ofstream out_;
};

// The data of every record in a TFRecord file, each length and data CRC
// checked; DataLoss naming the file, record and offset otherwise.
StatusOr<std::vector<std::string>> read_tfrecords(const std::string& path);

}  // namespace relay
