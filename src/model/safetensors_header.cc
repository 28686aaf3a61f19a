#include "model/safetensors_header.h"

#include <algorithm>
#include <limits>

#include <nlohmann/json.hpp>

#include "model/json_nesting.h"

namespace relay::model::internal {
namespace {

using json = nlohmann::json;

// Dtypes the safetensors format defines but relay does not read.
constexpr const char* kUnsupportedDTypes[] = {"U16",     "U32",     "U64",     "F8_E4M3", "F8_E5M2",
                                              "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4",      "C64"};

// a * b, or false on uint64 overflow.
bool mul_u64(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_mul_overflow(a, b, out); }

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&s, i ? ", " : "", shape[i]);
  return s + "]";
}

// In this file's functions, `prefix` is "<path>: tensor '<name>': ".

StatusOr<DType> parse_dtype_field(const json& dtype, const std::string& prefix) {
  if (!dtype.is_string())
    return DataLossError(prefix + "dtype must be a string, got " + dtype.dump());
  const std::string dtype_str = dtype.get<std::string>();
  StatusOr<DType> parsed = parse_dtype(dtype_str);
  if (parsed.ok()) return parsed;
  // Named apart from garbage, so a newer checkpoint reads as "not yet".
  for (const char* unsupported : kUnsupportedDTypes) {
    if (dtype_str == unsupported) {
      return UnimplementedError(
          absl::StrCat(prefix, "unsupported dtype '", dtype_str,
                       "' (relay reads F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL)"));
    }
  }
  return DataLossError(prefix + "unknown dtype '" + dtype_str + "'");
}

StatusOr<std::vector<int64_t>> parse_shape(const json& shape, const std::string& prefix) {
  if (!shape.is_array())
    return DataLossError(prefix + "shape must be an array, got " + shape.dump());
  std::vector<int64_t> out;
  for (const json& d : shape) {
    if (!d.is_number_integer()) {
      return DataLossError(prefix + "shape must hold integers, got " + shape.dump());
    }
    if (d.is_number_unsigned() &&
        d.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())) {
      return DataLossError(prefix + "dim too large in shape " + shape.dump());
    }
    int64_t v = d.get<int64_t>();
    if (v < 0)
      return DataLossError(absl::StrCat(prefix, "negative dim ", v, " in shape ", shape.dump()));
    out.push_back(v);
  }
  return out;
}

// Sets e.begin and e.end, which must lie within the data section.
Status parse_offsets(const json& offs, uint64_t data_size, const std::string& prefix,
                     TensorEntry& e) {
  if (!offs.is_array() || offs.size() != 2 || !offs[0].is_number_unsigned() ||
      !offs[1].is_number_unsigned()) {
    return DataLossError(prefix + "data_offsets must be two non-negative integers, got " +
                         offs.dump());
  }
  e.begin = offs[0].get<uint64_t>();
  e.end = offs[1].get<uint64_t>();
  if (e.begin > e.end) {
    return DataLossError(absl::StrCat(prefix, "data_offsets begin ", e.begin, " > end ", e.end));
  }
  if (e.end > data_size) {
    return DataLossError(absl::StrCat(prefix, "data_offsets [", e.begin, ", ", e.end,
                                      "] end beyond the data section of ", data_size,
                                      " bytes (truncated or out-of-range)"));
  }
  return OkStatus();
}

// The span must hold exactly shape x dtype size bytes: reading a tensor
// copies that many, so a shorter span would read its neighbour's.
Status check_span(const TensorEntry& e, const std::string& dtype_str, const std::string& prefix) {
  uint64_t numel = 1, bytes = 0;
  for (int64_t d : e.shape) {
    if (!mul_u64(numel, uint64_t(d), &numel)) {
      return DataLossError(prefix + "shape " + shape_str(e.shape) + " overflows");
    }
  }
  if (numel > uint64_t(std::numeric_limits<int64_t>::max()) ||
      !mul_u64(numel, dtype_size(e.dtype), &bytes)) {
    return DataLossError(prefix + "shape " + shape_str(e.shape) + " overflows");
  }
  if (e.end - e.begin != bytes) {
    return DataLossError(absl::StrCat(prefix, "data_offsets span ", e.end - e.begin,
                                      " bytes but shape ", shape_str(e.shape), " of ", dtype_str,
                                      " needs ", bytes, " (shape mismatch)"));
  }
  return OkStatus();
}

// Parses one header entry.
StatusOr<TensorEntry> parse_entry(const std::string& name, const json& j, uint64_t data_size,
                                  const std::string& prefix) {
  if (!j.is_object()) return DataLossError(prefix + "entry must be a JSON object, got " + j.dump());
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!j.contains(key)) return DataLossError(prefix + "missing '" + key + "'");
  }
  TensorEntry e;
  e.name = name;
  RELAY_ASSIGN_OR_RETURN(e.dtype, parse_dtype_field(j["dtype"], prefix));
  RELAY_ASSIGN_OR_RETURN(e.shape, parse_shape(j["shape"], prefix));
  RELAY_RETURN_IF_ERROR(parse_offsets(j["data_offsets"], data_size, prefix, e));
  RELAY_RETURN_IF_ERROR(check_span(e, j["dtype"].get<std::string>(), prefix));
  return e;
}

Status parse_metadata(const json& value, const std::string& path,
                      std::map<std::string, std::string>& out) {
  if (value.is_null()) return OkStatus();
  if (!value.is_object()) return DataLossError(path + ": __metadata__ must be a JSON object");
  for (const auto& [k, v] : value.items()) {
    if (!v.is_string()) {
      return DataLossError(path + ": __metadata__ '" + k + "' must be a string, got " + v.dump());
    }
    out[k] = v.get<std::string>();
  }
  return OkStatus();
}

// Sorts into data order, by (begin, end), so an empty tensor sorts before the
// tensor that starts where it sits; empty tensors at one offset stay in name
// order. Then no two tensors that hold bytes may overlap.
Status order_and_check_overlaps(std::vector<TensorEntry>& entries, const std::string& path) {
  std::stable_sort(entries.begin(), entries.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const TensorEntry* prev = nullptr;  // last entry holding bytes
  for (const TensorEntry& e : entries) {
    if (e.begin == e.end) continue;  // empty tensors hold no bytes
    if (prev != nullptr && e.begin < prev->end) {
      return DataLossError(absl::StrCat(path, ": tensor '", e.name, "' [", e.begin, ", ", e.end,
                                        ") overlaps tensor '", prev->name, "' [", prev->begin, ", ",
                                        prev->end, ")"));
    }
    prev = &e;
  }
  return OkStatus();
}

}  // namespace

StatusOr<SafetensorsHeader> parse_safetensors_header(std::string_view text, uint64_t data_size,
                                                     const std::string& path) {
  if (Status s = check_json_nesting(text, path + ": header"); !s.ok()) {
    return DataLossError(s.message());
  }
  // A sorted-map json (not ordered_json, whose lookups are linear): entries
  // are put in data order afterwards.
  json header;
  try {
    header = json::parse(text);
  } catch (const json::exception& e) {
    return DataLossError(path + ": header is not valid JSON: " + e.what());
  }
  if (!header.is_object()) return DataLossError(path + ": header must be a JSON object");

  SafetensorsHeader out;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      RELAY_RETURN_IF_ERROR(parse_metadata(value, path, out.metadata));
      continue;
    }
    RELAY_ASSIGN_OR_RETURN(TensorEntry e,
                           parse_entry(name, value, data_size, path + ": tensor '" + name + "': "));
    out.entries.push_back(std::move(e));
  }
  RELAY_RETURN_IF_ERROR(order_and_check_overlaps(out.entries, path));
  return out;
}

}  // namespace relay::model::internal
