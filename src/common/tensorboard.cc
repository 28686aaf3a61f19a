#include "relay/common/tensorboard.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace relay {
namespace {

// Byte-at-a-time table for the reflected Castagnoli polynomial 0x82F63B78.
const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

void put_le(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

// Protobuf wire format, the few pieces an Event needs.
void put_varint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}
void put_tag(std::string* out, int field, int wire_type) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(wire_type));
}
void put_bytes(std::string* out, int field, std::string_view bytes) {
  put_tag(out, field, 2);
  put_varint(out, bytes.size());
  out->append(bytes.data(), bytes.size());
}
void put_double(std::string* out, int field, double x) {
  put_tag(out, field, 1);
  uint64_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  put_le(out, bits, 8);
}
void put_float(std::string* out, int field, float x) {
  put_tag(out, field, 5);
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  put_le(out, bits, 4);
}

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t crc32c(std::string_view data) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : data) c = crc_table()[(c ^ b) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tfrecord(std::string_view data) {
  std::string out, len;
  put_le(&len, data.size(), 8);
  out += len;
  put_le(&out, masked_crc32c(len), 4);
  out.append(data.data(), data.size());
  put_le(&out, masked_crc32c(data), 4);
  return out;
}

// tensorflow.Event: wall_time = 1 (double), step = 2 (int64),
// file_version = 3 (string), summary = 5 (Summary). Summary: value = 1
// (repeated Value). Value: tag = 1 (string), simple_value = 2 (float).
std::string scalar_event(double wall_time, int64_t step,
                         const std::map<std::string, double>& values) {
  std::string summary;
  for (const auto& [tag, x] : values) {
    std::string value;
    put_bytes(&value, 1, tag);
    put_float(&value, 2, static_cast<float>(x));
    put_bytes(&summary, 1, value);
  }
  std::string event;
  put_double(&event, 1, wall_time);
  put_tag(&event, 2, 0);
  put_varint(&event, static_cast<uint64_t>(step));
  put_bytes(&event, 5, summary);
  return event;
}

StatusOr<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::open(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "localhost");
  const double now = unix_seconds();
  const std::string path =
      (std::filesystem::path(dir) /
       absl::StrCat("events.out.tfevents.", static_cast<int64_t>(now), ".", host, ".relay"))
          .string();
  std::ofstream out(path, std::ios::binary | std::ios::app);
  if (!out) return InternalError(absl::StrCat("cannot open ", path, " for writing"));
  std::string first;
  put_double(&first, 1, now);
  put_bytes(&first, 3, "brain.Event:2");
  out << tfrecord(first);
  out.flush();
  if (!out) return InternalError(absl::StrCat("cannot write ", path));
  return std::unique_ptr<TensorBoardWriter>(new TensorBoardWriter(path, std::move(out)));
}

TensorBoardWriter::TensorBoardWriter(std::string path, std::ofstream out)
    : path_(std::move(path)), out_(std::move(out)) {}

Status TensorBoardWriter::add_scalars(int64_t step, const std::map<std::string, double>& values) {
  out_ << tfrecord(scalar_event(unix_seconds(), step, values));
  out_.flush();
  if (!out_) return InternalError(absl::StrCat("cannot write ", path_));
  return OkStatus();
}

StatusOr<std::vector<std::string>> read_tfrecords(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string bytes = ss.str();
  std::vector<std::string> records;
  size_t at = 0;
  while (at < bytes.size()) {
    auto bad = [&](const std::string& what) {
      return DataLossError(
          absl::StrCat(path, ": record ", records.size(), " at byte ", at, ": ", what));
    };
    if (bytes.size() - at < 12) return bad("truncated header");
    const std::string_view len_bytes(bytes.data() + at, 8);
    const uint64_t len = get_le(bytes.data() + at, 8);
    if (get_le(bytes.data() + at + 8, 4) != masked_crc32c(len_bytes)) return bad("length CRC");
    if (bytes.size() - at - 12 < len + 4) return bad("truncated data");
    const std::string_view data(bytes.data() + at + 12, len);
    if (get_le(bytes.data() + at + 12 + len, 4) != masked_crc32c(data)) return bad("data CRC");
    records.emplace_back(data);
    at += 12 + len + 4;
  }
  return records;
}

}  // namespace relay
