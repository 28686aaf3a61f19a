#include "relay/model/safetensors.h"

#include "relay/common/file_io.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <set>

#include <nlohmann/json.hpp>

#include "model/json_nesting.h"
#include "model/safetensors_header.h"

namespace relay::model {

// Safetensors data is little-endian and copied raw into tensors.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "relay requires a little-endian host");

namespace {

using ordered_json = nlohmann::ordered_json;

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // 100 MiB; real headers are < 1 MiB
constexpr char kIndexName[] = "model.safetensors.index.json";
constexpr char kSingleName[] = "model.safetensors";

struct DTypeInfo {
  DType dtype;
  const char* name;
  size_t size;
  c10::ScalarType scalar_type;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::kF64, "F64", 8, c10::ScalarType::Double},
    {DType::kF32, "F32", 4, c10::ScalarType::Float},
    {DType::kF16, "F16", 2, c10::ScalarType::Half},
    {DType::kBF16, "BF16", 2, c10::ScalarType::BFloat16},
    {DType::kI64, "I64", 8, c10::ScalarType::Long},
    {DType::kI32, "I32", 4, c10::ScalarType::Int},
    {DType::kI16, "I16", 2, c10::ScalarType::Short},
    {DType::kI8, "I8", 1, c10::ScalarType::Char},
    {DType::kU8, "U8", 1, c10::ScalarType::Byte},
    {DType::kBool, "BOOL", 1, c10::ScalarType::Bool},
};

// kDTypes is indexed by DType.
constexpr bool dtypes_in_enum_order() {
  for (size_t i = 0; i < std::size(kDTypes); ++i) {
    if (static_cast<size_t>(kDTypes[i].dtype) != i) return false;
  }
  return true;
}
static_assert(dtypes_in_enum_order());

const DTypeInfo& info(DType dtype) { return kDTypes[static_cast<size_t>(dtype)]; }

Status errno_status(int err, const std::string& what) { return absl::ErrnoToStatus(err, what); }

// Maps the regular file `path` read-only into *map and returns its size, at
// least the 8 bytes of a safetensors header length. The caller unmaps.
StatusOr<uint64_t> map_file(const std::string& path, void** map) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno_status(errno, path + ": cannot open");
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    Status s = errno_status(errno, path + ": cannot stat");
    ::close(fd);
    return s;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgumentError(path + ": not a regular file");
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    return DataLossError(absl::StrCat(path, ": file is ", file_size,
                                      " bytes, shorter than the 8-byte header length"));
  }
  void* mapped = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  int mmap_errno = errno;
  ::close(fd);  // the mapping stays valid
  if (mapped == MAP_FAILED) return errno_status(mmap_errno, path + ": mmap failed");
  *map = mapped;
  return file_size;
}

std::string join_path(const std::string& dir, const std::string& name) {
  return (std::filesystem::path(dir) / name).string();
}

// Validates one tensor for writing; `where` prefixes messages.
Status check_writable(const std::string& where, const std::string& name, const at::Tensor& t) {
  if (name.empty()) return InvalidArgumentError(where + ": empty tensor name");
  if (name == "__metadata__") {
    return InvalidArgumentError(where + ": tensor name '__metadata__' is reserved");
  }
  if (!t.defined()) return InvalidArgumentError(where + ": tensor '" + name + "' is undefined");
  StatusOr<DType> d = from_scalar_type(t.scalar_type());
  if (!d.ok()) {
    return InvalidArgumentError(where + ": tensor '" + name +
                                "': " + std::string(d.status().message()));
  }
  return OkStatus();
}

}  // namespace

std::string_view dtype_name(DType dtype) { return info(dtype).name; }

StatusOr<DType> parse_dtype(std::string_view name) {
  for (const DTypeInfo& i : kDTypes) {
    if (name == i.name) return i.dtype;
  }
  return InvalidArgumentError(absl::StrCat("unknown dtype '", std::string(name), "'"));
}

size_t dtype_size(DType dtype) { return info(dtype).size; }

c10::ScalarType to_scalar_type(DType dtype) { return info(dtype).scalar_type; }

StatusOr<DType> from_scalar_type(c10::ScalarType type) {
  for (const DTypeInfo& i : kDTypes) {
    if (i.scalar_type == type) return i.dtype;
  }
  return InvalidArgumentError(absl::StrCat("unsupported dtype ", c10::toString(type)));
}

int64_t TensorEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---------------------------------------------------------------- reader

SafetensorsReader::~SafetensorsReader() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

StatusOr<std::unique_ptr<SafetensorsReader>> SafetensorsReader::open(const std::string& path) {
  std::unique_ptr<SafetensorsReader> r(new SafetensorsReader());
  r->path_ = path;
  RELAY_ASSIGN_OR_RETURN(const uint64_t file_size, map_file(path, &r->map_));
  r->map_size_ = file_size;  // from here on the destructor unmaps
  const auto* bytes = static_cast<const uint8_t*>(r->map_);

  uint64_t header_len;
  std::memcpy(&header_len, bytes, 8);  // little-endian host
  if (header_len > kMaxHeaderBytes) {
    return DataLossError(absl::StrCat(path, ": header length ", header_len,
                                      " is over the 100 MiB limit (not a safetensors file?)"));
  }
  if (header_len > file_size - 8) {
    return DataLossError(absl::StrCat(path, ": header length ", header_len, " exceeds the ",
                                      file_size - 8, " bytes after it (truncated file?)"));
  }
  const uint64_t data_size = file_size - 8 - header_len;
  r->data_ = bytes + 8 + header_len;

  const std::string_view header_text(reinterpret_cast<const char*>(bytes + 8), header_len);
  RELAY_ASSIGN_OR_RETURN(internal::SafetensorsHeader header,
                         internal::parse_safetensors_header(header_text, data_size, path));
  r->entries_ = std::move(header.entries);
  r->metadata_ = std::move(header.metadata);
  for (size_t i = 0; i < r->entries_.size(); ++i) r->by_name_.emplace(r->entries_[i].name, i);
  return r;
}

const TensorEntry* SafetensorsReader::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

StatusOr<at::Tensor> SafetensorsReader::tensor(std::string_view name) const {
  const TensorEntry* e = find(name);
  if (e == nullptr)
    return NotFoundError(absl::StrCat(path_, ": no tensor '", std::string(name), "'"));
  at::Tensor t = at::empty(e->shape, at::TensorOptions().dtype(to_scalar_type(e->dtype)));
  if (e->end > e->begin) std::memcpy(t.data_ptr(), data_ + e->begin, e->end - e->begin);
  return t;
}

// ---------------------------------------------------------------- writer

Status write_safetensors(const std::string& path,
                         const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  ordered_json header = ordered_json::object();
  if (!metadata.empty()) {
    ordered_json m = ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  uint64_t offset = 0;
  std::set<std::string_view> seen;
  for (const auto& [name, t] : tensors) {
    RELAY_RETURN_IF_ERROR(check_writable(path, name, t));
    if (!seen.insert(name).second) {
      return InvalidArgumentError(path + ": duplicate tensor name '" + name + "'");
    }
    DType dtype = *from_scalar_type(t.scalar_type());
    const uint64_t bytes = uint64_t(t.numel()) * dtype_size(dtype);
    header[name] = {{"dtype", std::string(dtype_name(dtype))},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');  // data section 8-byte aligned
  const uint64_t header_len = header_text.size();

  AtomicFile file(path);
  RELAY_RETURN_IF_ERROR(file.open());
  RELAY_RETURN_IF_ERROR(file.write(&header_len, 8));
  RELAY_RETURN_IF_ERROR(file.write(header_text.data(), header_text.size()));
  for (const auto& [name, t] : tensors) {
    // One tensor at a time on the CPU, so a GPU checkpoint is not copied whole.
    at::Tensor cpu = t.to(at::kCPU).contiguous();
    if (cpu.numel() > 0) {
      RELAY_RETURN_IF_ERROR(file.write(cpu.data_ptr(), cpu.numel() * cpu.element_size()));
    }
  }
  return file.commit();
}

// ---------------------------------------------------------------- shards

StatusOr<ShardIndex> read_shard_index(const std::string& index_path) {
  RELAY_ASSIGN_OR_RETURN(std::string text, read_file(index_path));
  RELAY_RETURN_IF_ERROR(check_json_nesting(text, index_path));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(index_path + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) return InvalidArgumentError(index_path + ": must be a JSON object");

  ShardIndex index;
  if (j.contains("metadata") && !j["metadata"].is_null()) {
    if (!j["metadata"].is_object()) {
      return InvalidArgumentError(index_path + ": metadata must be a JSON object");
    }
    for (const auto& [k, v] : j["metadata"].items()) {
      index.metadata[k] = v.is_string() ? v.get<std::string>() : v.dump();
    }
  }
  if (!j.contains("weight_map") || !j["weight_map"].is_object()) {
    return InvalidArgumentError(index_path + ": weight_map must be a JSON object");
  }
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string()) {
      return InvalidArgumentError(index_path + ": weight_map '" + name +
                                  "' must be a file name, got " + file.dump());
    }
    std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f.find("..") != std::string::npos) {
      return InvalidArgumentError(index_path + ": weight_map '" + name + "': shard file name '" +
                                  f + "' must be a plain file name in the same directory");
    }
    index.weight_map[name] = std::move(f);
  }
  return index;
}

StatusOr<CheckpointTensors> CheckpointTensors::open(const std::string& dir) {
  CheckpointTensors ct;
  ct.dir_ = dir;
  const std::string index_path = join_path(dir, kIndexName);
  const std::string single_path = join_path(dir, kSingleName);
  std::error_code ec;

  if (std::filesystem::exists(index_path, ec)) {
    RELAY_ASSIGN_OR_RETURN(ShardIndex index, read_shard_index(index_path));
    std::map<std::string, const SafetensorsReader*> shards;  // file name -> reader
    for (const auto& [name, file] : index.weight_map) {
      auto it = shards.find(file);
      if (it == shards.end()) {
        RELAY_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsReader> reader,
                               SafetensorsReader::open(join_path(dir, file)));
        ct.readers_.push_back(std::move(reader));
        it = shards.emplace(file, ct.readers_.back().get()).first;
      }
      const TensorEntry* e = it->second->find(name);
      if (e == nullptr) {
        return DataLossError(index_path + ": tensor '" + name + "' is mapped to '" + file +
                             "', which does not contain it");
      }
      ct.tensors_.emplace(name, Location{it->second, e});
    }
    return ct;
  }
  if (std::filesystem::exists(single_path, ec)) {
    RELAY_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsReader> reader,
                           SafetensorsReader::open(single_path));
    for (const TensorEntry& e : reader->entries()) {
      ct.tensors_.emplace(e.name, Location{reader.get(), &e});
    }
    ct.readers_.push_back(std::move(reader));
    return ct;
  }
  return NotFoundError(
      absl::StrCat(dir, ": found neither ", kIndexName, " nor ", kSingleName,
                   std::filesystem::is_directory(dir, ec) ? "" : " (no such directory)"));
}

std::vector<std::string> CheckpointTensors::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, loc] : tensors_) out.push_back(name);
  return out;  // std::map iterates sorted
}

bool CheckpointTensors::contains(std::string_view name) const {
  return tensors_.find(name) != tensors_.end();
}

const TensorEntry* CheckpointTensors::entry(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second.entry;
}

StatusOr<at::Tensor> CheckpointTensors::tensor(std::string_view name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end())
    return NotFoundError(absl::StrCat(dir_, ": no tensor '", std::string(name), "'"));
  return it->second.reader->tensor(name);
}

Status write_checkpoint_tensors(const std::string& dir,
                                const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                uint64_t max_shard_bytes,
                                const std::map<std::string, std::string>& metadata) {
  // Check everything first so a bad tensor never leaves some shards written.
  std::set<std::string_view> seen;
  for (const auto& [name, t] : tensors) {
    RELAY_RETURN_IF_ERROR(check_writable(dir, name, t));
    if (!seen.insert(name).second) {
      return InvalidArgumentError(dir + ": duplicate tensor name '" + name + "'");
    }
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return InternalError(dir + ": cannot create directory: " + ec.message());

  // Greedy in order, as huggingface_hub's split_torch_state_dict_into_shards.
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> shards(1);
  uint64_t shard_bytes = 0, total_bytes = 0;
  for (const auto& item : tensors) {
    const uint64_t bytes = uint64_t(item.second.numel()) * item.second.element_size();
    if (!shards.back().empty() && shard_bytes + bytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(item);
    shard_bytes += bytes;
    total_bytes += bytes;
  }
  if (shards.size() == 1) return write_safetensors(join_path(dir, kSingleName), tensors, metadata);

  nlohmann::json weight_map = nlohmann::json::object();  // sorted, as HF writes it
  for (size_t i = 0; i < shards.size(); ++i) {
    char file[64];
    std::snprintf(file, sizeof(file), "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    RELAY_RETURN_IF_ERROR(write_safetensors(join_path(dir, file), shards[i], metadata));
    for (const auto& [name, t] : shards[i]) weight_map[name] = file;
  }
  nlohmann::json index = {{"metadata", {{"total_size", total_bytes}}},
                          {"weight_map", std::move(weight_map)}};
  const std::string text = index.dump(2) + "\n";
  AtomicFile file(join_path(dir, kIndexName));
  RELAY_RETURN_IF_ERROR(file.open());
  RELAY_RETURN_IF_ERROR(file.write(text.data(), text.size()));
  return file.commit();
}

}  // namespace relay::model
