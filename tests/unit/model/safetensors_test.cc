#include "relay/model/safetensors.h"

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace relay::model {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test under ::testing::TempDir().
std::string test_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir =
      fs::path(::testing::TempDir()) / (std::string("relay_safetensors_") + info->name());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// 8-byte little-endian length of `header`, then `header`, then `data`.
std::string compose(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string u64_le(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out;
}

// Same dtype, same shape, same bytes.
void expect_identical(const at::Tensor& actual, const at::Tensor& expected,
                      const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(actual.scalar_type(), expected.scalar_type());
  ASSERT_EQ(actual.sizes(), expected.sizes());
  EXPECT_TRUE(actual.is_contiguous());
  EXPECT_EQ(actual.device().type(), c10::DeviceType::CPU);
  at::Tensor e = expected.contiguous();
  const size_t bytes = e.numel() * e.element_size();
  if (bytes > 0) {
    EXPECT_EQ(std::memcmp(actual.data_ptr(), e.data_ptr(), bytes), 0);
  }
}

bool contains(absl::string_view haystack, absl::string_view needle) {
  return haystack.find(needle) != absl::string_view::npos;
}

std::vector<std::pair<std::string, at::Tensor>> sample_tensors() {
  auto f32 = torch::kFloat32;
  return {
      {"model.embed_tokens.weight",
       torch::tensor({1.0f, -2.5f, 3.25f, 0.0f, 1e-8f, -7e10f}, f32).reshape({2, 3})},
      // Values exactly representable in half and bfloat16.
      {"half", torch::tensor({1.5f, -2.25f, 0.0078125f, 65504.0f}).to(torch::kFloat16)},
      {"bf16", torch::tensor({1.0f, -3.0f, 0.5f, 256.0f, -0.125f, 2.0f})
                   .reshape({3, 2})
                   .to(torch::kBFloat16)},
      {"ids", torch::tensor({int64_t{-1}, int64_t{1} << 40, int64_t{7}}, torch::kInt64)},
      {"scalar", torch::tensor(42.0f)},  // 0-dim
      {"empty", torch::empty({0, 4}, f32)},
      {"f64", torch::tensor({3.141592653589793}, torch::kFloat64)},
      {"mask", torch::tensor({true, false, true})},
      {"bytes", torch::tensor({0, 255, 128}, torch::kUInt8)},
  };
}

TEST(SafetensorsTest, DTypeNamesSizesAndScalarTypes) {
  struct Case {
    DType dtype;
    const char* name;
    size_t size;
    c10::ScalarType scalar;
  };
  const Case cases[] = {
      {DType::kF64, "F64", 8, at::kDouble}, {DType::kF32, "F32", 4, at::kFloat},
      {DType::kF16, "F16", 2, at::kHalf},   {DType::kBF16, "BF16", 2, at::kBFloat16},
      {DType::kI64, "I64", 8, at::kLong},   {DType::kI32, "I32", 4, at::kInt},
      {DType::kI16, "I16", 2, at::kShort},  {DType::kI8, "I8", 1, at::kChar},
      {DType::kU8, "U8", 1, at::kByte},     {DType::kBool, "BOOL", 1, at::kBool},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(dtype_name(c.dtype), c.name);
    EXPECT_EQ(dtype_size(c.dtype), c.size);
    EXPECT_EQ(to_scalar_type(c.dtype), c.scalar);
    ASSERT_TRUE(parse_dtype(c.name).ok());
    EXPECT_EQ(*parse_dtype(c.name), c.dtype);
    ASSERT_TRUE(from_scalar_type(c.scalar).ok());
    EXPECT_EQ(*from_scalar_type(c.scalar), c.dtype);
  }
  EXPECT_EQ(parse_dtype("F7").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(parse_dtype("f32").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(from_scalar_type(at::kComplexFloat).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SafetensorsTest, RoundTripIsExact) {
  const std::string path = test_dir() + "/model.safetensors";
  const auto tensors = sample_tensors();
  ASSERT_TRUE(write_safetensors(path, tensors).ok());
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  auto reader = SafetensorsReader::open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->path(), path);
  const auto& entries = (*reader)->entries();
  ASSERT_EQ(entries.size(), tensors.size());
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, expected] = tensors[i];
    EXPECT_EQ(entries[i].name, name);  // file order == write order
    EXPECT_EQ(entries[i].shape, expected.sizes().vec());
    EXPECT_EQ(entries[i].numel(), expected.numel());
    EXPECT_EQ(entries[i].begin, offset) << name;
    offset += expected.numel() * expected.element_size();
    EXPECT_EQ(entries[i].end, offset) << name;
    ASSERT_EQ((*reader)->find(name), &entries[i]);
    auto t = (*reader)->tensor(name);
    ASSERT_TRUE(t.ok()) << t.status();
    expect_identical(*t, expected, name);
  }
  EXPECT_EQ((*reader)->find("scalar")->shape, std::vector<int64_t>{});
  EXPECT_EQ((*reader)->find("half")->dtype, DType::kF16);
  EXPECT_EQ((*reader)->find("bf16")->dtype, DType::kBF16);
  EXPECT_EQ((*reader)->find("ids")->dtype, DType::kI64);
  EXPECT_EQ((*reader)->find("empty")->begin, (*reader)->find("empty")->end);
  EXPECT_EQ((*reader)->find("nope"), nullptr);
  EXPECT_EQ(torch::tensor(42.0f).item<float>(), (*reader)->tensor("scalar")->item<float>());
  EXPECT_TRUE((*reader)->metadata().empty());
}

TEST(SafetensorsTest, TensorIsAnOwnedCopy) {
  const std::string path = test_dir() + "/a.safetensors";
  ASSERT_TRUE(write_safetensors(path, {{"w", torch::tensor({1.0f, 2.0f})}}).ok());
  auto reader = SafetensorsReader::open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  at::Tensor first = *(*reader)->tensor("w");
  first.fill_(9.0f);  // would fault if it aliased the read-only mapping
  at::Tensor second = *(*reader)->tensor("w");
  EXPECT_EQ(second[0].item<float>(), 1.0f);
  EXPECT_EQ(second[1].item<float>(), 2.0f);
}

TEST(SafetensorsTest, DataSectionIsEightByteAligned) {
  const std::string dir = test_dir();
  // Names of every length mod 8, so without padding some headers would not be aligned.
  for (int len = 1; len <= 8; ++len) {
    const std::string path = dir + "/a" + std::to_string(len) + ".safetensors";
    ASSERT_TRUE(write_safetensors(path, {{std::string(len, 'x'), torch::ones({3})}}).ok());
    const std::string bytes = read_bytes(path);
    uint64_t n;
    std::memcpy(&n, bytes.data(), 8);
    EXPECT_EQ((8 + n) % 8, 0u) << "name length " << len;
    EXPECT_EQ(bytes.size(), 8 + n + 12);
    EXPECT_EQ(bytes[8], '{');
    // Padding is trailing spaces after the closing brace.
    const std::string header = bytes.substr(8, n);
    const size_t close = header.find_last_of('}');
    EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos);
    EXPECT_LT(n - close - 1, 8u);
  }
}

TEST(SafetensorsTest, MetadataRoundTrip) {
  const std::string path = test_dir() + "/m.safetensors";
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"step", "17"}, {"note", "quotes \" and \\ survive"}};
  ASSERT_TRUE(write_safetensors(path, {{"w", torch::zeros({2})}}, metadata).ok());
  auto reader = SafetensorsReader::open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->metadata(), metadata);
  ASSERT_EQ((*reader)->entries().size(), 1u);  // __metadata__ is not a tensor
}

TEST(SafetensorsTest, ReadsHandComposedBytes) {
  // F32 [1.0, -2.0] then BF16 0x3F80 (= 1.0); the header is not padded, so
  // the data section starts unaligned.
  const std::string header =
      R"({"__metadata__":{"src":"hand"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"BF16","shape":[],"data_offsets":[8,10]}})";
  const std::string data("\x00\x00\x80\x3f\x00\x00\x00\xc0\x80\x3f", 10);
  ASSERT_NE((8 + header.size()) % 4, 0u);
  const std::string path = test_dir() + "/known.safetensors";
  write_bytes(path, compose(header, data));

  auto reader = SafetensorsReader::open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_EQ((*reader)->entries().size(), 2u);
  EXPECT_EQ((*reader)->metadata().at("src"), "hand");
  at::Tensor a = *(*reader)->tensor("a");
  ASSERT_EQ(a.scalar_type(), at::kFloat);
  ASSERT_EQ(a.sizes(), at::IntArrayRef({2}));
  EXPECT_EQ(a[0].item<float>(), 1.0f);
  EXPECT_EQ(a[1].item<float>(), -2.0f);
  at::Tensor b = *(*reader)->tensor("b");
  ASSERT_EQ(b.scalar_type(), at::kBFloat16);
  EXPECT_EQ(b.dim(), 0);
  EXPECT_EQ(b.item<float>(), 1.0f);
}

TEST(SafetensorsTest, RejectsMalformedFiles) {
  const std::string f32_w = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  struct Case {
    const char* label;
    std::string bytes;
    absl::StatusCode code;
    std::vector<std::string> message_has;  // besides the path
  };
  const std::string eight(8, '\0');
  const std::vector<Case> cases = {
      {"shorter than 8 bytes",
       std::string("\x05\x00\x00", 3),
       absl::StatusCode::kDataLoss,
       {"3 bytes", "shorter"}},
      {"header length beyond file",
       u64_le(1000) + "{}",
       absl::StatusCode::kDataLoss,
       {"header length 1000", "exceeds"}},
      {"absurd header length",
       u64_le(uint64_t{1} << 40) + "{}",
       absl::StatusCode::kDataLoss,
       {"100 MiB"}},
      {"bad JSON",
       compose(R"({"w": {"dtype": )", eight),
       absl::StatusCode::kDataLoss,
       {"not valid JSON"}},
      {"header not an object", compose("[1, 2]", ""), absl::StatusCode::kDataLoss, {"JSON object"}},
      {"missing dtype",
       compose(R"({"w":{"shape":[2],"data_offsets":[0,8]}})", eight),
       absl::StatusCode::kDataLoss,
       {"tensor 'w'", "missing 'dtype'"}},
      {"missing data_offsets",
       compose(R"({"w":{"dtype":"F32","shape":[2]}})", eight),
       absl::StatusCode::kDataLoss,
       {"tensor 'w'", "missing 'data_offsets'"}},
      {"shape of wrong type",
       compose(R"({"w":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", eight),
       absl::StatusCode::kDataLoss,
       {"tensor 'w'", "shape must be an array"}},
      {"dtype of wrong type",
       compose(R"({"w":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", eight),
       absl::StatusCode::kDataLoss,
       {"tensor 'w'", "dtype must be a string"}},
      {"offsets of wrong type",
       compose(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", eight),
       absl::StatusCode::kDataLoss,
       {"tensor 'w'", "data_offsets"}},
      {"unknown dtype",
       compose(R"({"w":{"dtype":"F7","shape":[2],"data_offsets":[0,8]}})", eight),
       absl::StatusCode::kDataLoss,
       {"tensor 'w': unknown dtype 'F7'"}},
      {"unsupported dtype",
       compose(R"({"w":{"dtype":"U32","shape":[2],"data_offsets":[0,8]}})", eight),
       absl::StatusCode::kUnimplemented,
       {"tensor 'w'", "unsupported dtype 'U32'"}},
      {"negative dim",
       compose(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", eight),
       absl::StatusCode::kDataLoss,
       {"tensor 'w'", "negative dim -2"}},
      {"begin after end",
       compose(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", eight),
       absl::StatusCode::kDataLoss,
       {"tensor 'w'", "begin 8 > end 0"}},
      {"out-of-range offset",
       compose(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[400,408]}})", eight),
       absl::StatusCode::kDataLoss,
       {"tensor 'w'", "truncated or out-of-range"}},
      {"shape/size mismatch",
       compose(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight),
       absl::StatusCode::kDataLoss,
       {"tensor 'w'", "span 8 bytes", "needs 12"}},
      {"overlapping tensors",
       compose(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
               R"("w":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
               std::string(12, '\0')),
       absl::StatusCode::kDataLoss,
       {"tensor 'w'", "overlaps tensor 'a'"}},
      {"dim above int64",
       compose(R"({"w":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,8]}})",
               eight),
       absl::StatusCode::kDataLoss,
       {"tensor 'w'", "dim too large in shape"}},
      {"element count overflows uint64",
       compose(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
               eight),
       absl::StatusCode::kDataLoss,
       {"tensor 'w'", "shape [4294967296, 4294967296] overflows"}},
      {"element count above int64",
       compose(R"({"w":{"dtype":"U8","shape":[4611686018427387904,2],"data_offsets":[0,8]}})",
               eight),
       absl::StatusCode::kDataLoss,
       {"tensor 'w'", "shape [4611686018427387904, 2] overflows"}},
      {"metadata not an object",
       compose(R"({"__metadata__":[1]})", ""),
       absl::StatusCode::kDataLoss,
       {"__metadata__ must be a JSON object"}},
      {"metadata not strings",
       compose(R"({"__metadata__":{"step":3}})", ""),
       absl::StatusCode::kDataLoss,
       {"__metadata__ 'step'"}},
      // Parsed, then dumped for the error message, this overflowed the stack.
      {"nested 200,000 deep",
       compose("{\"w\": " + std::string(200000, '[') + std::string(200000, ']') + "}", ""),
       absl::StatusCode::kDataLoss,
       {": header: JSON nests deeper than 128 levels (at byte 133)"}},
  };
  const std::string dir = test_dir();
  // The template the cases break is itself valid.
  write_bytes(dir + "/valid.safetensors", compose(f32_w, eight));
  ASSERT_TRUE(SafetensorsReader::open(dir + "/valid.safetensors").ok());
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(c.label);
    const std::string path = dir + "/bad" + std::to_string(i) + ".safetensors";
    write_bytes(path, c.bytes);
    auto reader = SafetensorsReader::open(path);
    ASSERT_FALSE(reader.ok());
    EXPECT_EQ(reader.status().code(), c.code) << reader.status();
    const std::string msg(reader.status().message());
    EXPECT_TRUE(contains(msg, path)) << msg;
    for (const std::string& part : c.message_has) EXPECT_TRUE(contains(msg, part)) << msg;
  }
}

TEST(SafetensorsTest, RejectsADirectory) {
  const std::string dir = test_dir();
  auto reader = SafetensorsReader::open(dir);
  ASSERT_FALSE(reader.ok());
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(reader.status().message(), dir + ": not a regular file");
}

TEST(SafetensorsTest, RejectsTruncatedFile) {
  const std::string dir = test_dir();
  const std::string path = dir + "/model.safetensors";
  ASSERT_TRUE(write_safetensors(path, {{"a", torch::ones({4})}, {"last", torch::ones({4})}}).ok());
  const std::string bytes = read_bytes(path);
  write_bytes(path, bytes.substr(0, bytes.size() - 3));
  auto reader = SafetensorsReader::open(path);
  ASSERT_FALSE(reader.ok());
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss);
  const std::string msg(reader.status().message());
  EXPECT_TRUE(contains(msg, path)) << msg;
  EXPECT_TRUE(contains(msg, "tensor 'last'")) << msg;
  EXPECT_TRUE(contains(msg, "truncated or out-of-range")) << msg;
}

TEST(SafetensorsTest, MissingFileAndTensorAreNotFound) {
  const std::string dir = test_dir();
  auto missing = SafetensorsReader::open(dir + "/none.safetensors");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(contains(missing.status().message(), "none.safetensors"));

  const std::string path = dir + "/a.safetensors";
  ASSERT_TRUE(write_safetensors(path, {{"w", torch::ones({1})}}).ok());
  auto reader = SafetensorsReader::open(path);
  ASSERT_TRUE(reader.ok());
  auto t = (*reader)->tensor("v");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(contains(t.status().message(), "'v'"));
}

TEST(SafetensorsTest, WriteRejectsBadInputAndKeepsOldFile) {
  const std::string path = test_dir() + "/w.safetensors";
  ASSERT_TRUE(write_safetensors(path, {{"old", torch::ones({2})}}).ok());
  const std::string before = read_bytes(path);

  struct Case {
    const char* label;
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    const char* message_has;
  };
  const std::vector<Case> cases = {
      {"duplicate",
       {{"w", torch::ones({1})}, {"w", torch::ones({1})}},
       "duplicate tensor name 'w'"},
      {"complex", {{"c", torch::ones({1}, torch::kComplexFloat)}}, "tensor 'c'"},
      {"reserved", {{"__metadata__", torch::ones({1})}}, "reserved"},
      {"empty name", {{"", torch::ones({1})}}, "empty tensor name"},
      {"undefined", {{"u", at::Tensor()}}, "tensor 'u' is undefined"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    Status s = write_safetensors(path, c.tensors);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_TRUE(contains(s.message(), path)) << s;
    EXPECT_TRUE(contains(s.message(), c.message_has)) << s;
    EXPECT_EQ(read_bytes(path), before);
    EXPECT_FALSE(fs::exists(path + ".tmp"));
  }
}

TEST(SafetensorsTest, WritesNonContiguousTensorsInLogicalOrder) {
  const std::string path = test_dir() + "/t.safetensors";
  at::Tensor t = torch::arange(6, torch::kFloat32).reshape({2, 3}).t();  // [[0,3],[1,4],[2,5]]
  ASSERT_FALSE(t.is_contiguous());
  ASSERT_TRUE(write_safetensors(path, {{"t", t}}).ok());
  auto reader = SafetensorsReader::open(path);
  ASSERT_TRUE(reader.ok());
  at::Tensor back = *(*reader)->tensor("t");
  EXPECT_EQ(back.sizes(), at::IntArrayRef({3, 2}));
  EXPECT_EQ(back[0][1].item<float>(), 3.0f);
  EXPECT_EQ(back[2][0].item<float>(), 2.0f);
}

TEST(SafetensorsTest, ShardedCheckpointRoundTrip) {
  const std::string dir = test_dir() + "/ckpt";
  // 16-byte tensors and one of 40 bytes, with a 32-byte shard limit:
  // [a, b] [c] [big] [d]; big exceeds the limit and goes alone.
  const std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"a", torch::full({4}, 1.0f)},
      {"b", torch::full({4}, 2.0f)},
      {"c", torch::full({2, 2}, 3.0f)},
      {"big", torch::arange(10, torch::kFloat32)},
      {"d", torch::tensor({int64_t{5}, int64_t{-6}})},
  };
  ASSERT_TRUE(write_checkpoint_tensors(dir, tensors, /*max_shard_bytes=*/32).ok());

  EXPECT_FALSE(fs::exists(dir + "/model.safetensors"));
  auto index = read_shard_index(dir + "/model.safetensors.index.json");
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->metadata.at("total_size"), "104");
  const std::map<std::string, std::string> expected_map = {
      {"a", "model-00001-of-00004.safetensors"}, {"b", "model-00001-of-00004.safetensors"},
      {"c", "model-00002-of-00004.safetensors"}, {"big", "model-00003-of-00004.safetensors"},
      {"d", "model-00004-of-00004.safetensors"},
  };
  EXPECT_EQ(index->weight_map, expected_map);
  for (int i = 1; i <= 4; ++i) {
    const std::string shard = dir + "/model-0000" + std::to_string(i) + "-of-00004.safetensors";
    ASSERT_TRUE(fs::exists(shard)) << shard;
    auto reader = SafetensorsReader::open(shard);
    ASSERT_TRUE(reader.ok()) << reader.status();
    EXPECT_EQ((*reader)->metadata().at("format"), "pt");
  }

  auto ckpt = CheckpointTensors::open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->names(), (std::vector<std::string>{"a", "b", "big", "c", "d"}));
  for (const auto& [name, expected] : tensors) {
    EXPECT_TRUE(ckpt->contains(name));
    ASSERT_NE(ckpt->entry(name), nullptr);
    EXPECT_EQ(ckpt->entry(name)->name, name);
    auto t = ckpt->tensor(name);
    ASSERT_TRUE(t.ok()) << t.status();
    expect_identical(*t, expected, name);
  }
  EXPECT_FALSE(ckpt->contains("e"));
  EXPECT_EQ(ckpt->entry("e"), nullptr);
  EXPECT_EQ(ckpt->tensor("e").status().code(), absl::StatusCode::kNotFound);

  // Movable: entries stay valid after the move.
  const TensorEntry* big = ckpt->entry("big");
  CheckpointTensors moved = std::move(*ckpt);
  EXPECT_EQ(moved.entry("big"), big);
  expect_identical(*moved.tensor("big"), tensors[3].second, "big after move");
}

TEST(SafetensorsTest, SingleFileCheckpointRoundTrip) {
  const std::string dir = test_dir();
  const auto tensors = sample_tensors();
  ASSERT_TRUE(write_checkpoint_tensors(dir, tensors).ok());
  EXPECT_TRUE(fs::exists(dir + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors.index.json"));
  auto reader = SafetensorsReader::open(dir + "/model.safetensors");
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));

  auto ckpt = CheckpointTensors::open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->names().size(), tensors.size());
  for (const auto& [name, expected] : tensors)
    expect_identical(*ckpt->tensor(name), expected, name);
}

TEST(SafetensorsTest, CheckpointWriteRejectsDuplicatesAcrossShards) {
  const std::string dir = test_dir() + "/dup";
  Status s = write_checkpoint_tensors(dir, {{"w", torch::ones({8})}, {"w", torch::ones({8})}}, 16);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(s.message(), "duplicate tensor name 'w'")) << s;
  EXPECT_FALSE(fs::exists(dir + "/model-00001-of-00002.safetensors"));
}

TEST(SafetensorsTest, MissingCheckpointIsNotFound) {
  const std::string dir = test_dir();
  for (const std::string& d : {dir, dir + "/does_not_exist"}) {
    auto ckpt = CheckpointTensors::open(d);
    ASSERT_FALSE(ckpt.ok());
    EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kNotFound);
    const std::string msg(ckpt.status().message());
    EXPECT_TRUE(contains(msg, d)) << msg;
    EXPECT_TRUE(contains(msg, "model.safetensors.index.json")) << msg;
    EXPECT_TRUE(contains(msg, "nor model.safetensors")) << msg;
  }
  auto index = read_shard_index(dir + "/model.safetensors.index.json");
  EXPECT_EQ(index.status().code(), absl::StatusCode::kNotFound);
}

TEST(SafetensorsTest, RejectsBadShardIndex) {
  const std::string dir = test_dir();
  ASSERT_TRUE(write_safetensors(dir + "/s1.safetensors", {{"a", torch::ones({1})}}).ok());
  const std::string index_path = dir + "/model.safetensors.index.json";
  struct Case {
    const char* label;
    std::string json;
    absl::StatusCode code;
    const char* message_has;
  };
  const std::vector<Case> cases = {
      {"escapes dir", R"({"weight_map": {"a": "../s1.safetensors"}})",
       absl::StatusCode::kInvalidArgument, "'../s1.safetensors'"},
      {"subdir", R"({"weight_map": {"a": "sub/s1.safetensors"}})",
       absl::StatusCode::kInvalidArgument, "weight_map 'a'"},
      {"no weight_map", R"({"metadata": {}})", absl::StatusCode::kInvalidArgument, "weight_map"},
      {"not JSON", "{", absl::StatusCode::kInvalidArgument, "not valid JSON"},
      {"nested 200,000 deep", "{\"metadata\": " + std::string(200000, '[') + "}",
       absl::StatusCode::kInvalidArgument, "JSON nests deeper than 128 levels (at byte 140)"},
      {"tensor missing in shard",
       R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors"}})",
       absl::StatusCode::kDataLoss, "tensor 'b' is mapped to 's1.safetensors'"},
      {"missing shard", R"({"weight_map": {"a": "s2.safetensors"}})", absl::StatusCode::kNotFound,
       "s2.safetensors"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    write_bytes(index_path, c.json);
    auto ckpt = CheckpointTensors::open(dir);
    ASSERT_FALSE(ckpt.ok());
    EXPECT_EQ(ckpt.status().code(), c.code) << ckpt.status();
    EXPECT_TRUE(contains(ckpt.status().message(), c.message_has)) << ckpt.status();
  }

  // total_size as HF writes it (a number) is kept as its decimal text.
  write_bytes(
      index_path,
      R"({"metadata": {"total_size": 4, "format": "pt"}, "weight_map": {"a": "s1.safetensors"}})");
  auto index = read_shard_index(index_path);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->metadata,
            (std::map<std::string, std::string>{{"format", "pt"}, {"total_size", "4"}}));
  auto ckpt = CheckpointTensors::open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->names(), std::vector<std::string>{"a"});
}

}  // namespace
}  // namespace relay::model
