#include "relay/trainer/run_checkpoint.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "absl/strings/str_cat.h"
#include "relay/common/file_io.h"

namespace relay::trainer {
namespace fs = std::filesystem;
namespace {

// "v<digits>" -> the version; -1 for any other name (staging directories,
// the reference copy, stray files).
int64_t version_of(const std::string& name) {
  if (name.size() < 2 || name[0] != 'v') return -1;
  int64_t v = 0;
  for (size_t i = 1; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || v > (int64_t{1} << 56)) return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

// Complete checkpoints under root, newest first.
std::vector<std::pair<int64_t, fs::path>> list_checkpoints(const fs::path& root) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    const int64_t v = version_of(e.path().filename().string());
    if (v >= 0 && fs::exists(e.path() / kCheckpointInfoFile, ec)) out.emplace_back(v, e.path());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

}  // namespace

StatusOr<CheckpointInfo> write_checkpoint(const std::string& root, const Trainer& trainer,
                                          int64_t rl_step, int64_t rl_start_version,
                                          model::SaveOptions save_options, int keep) {
  CheckpointInfo info;
  info.version = trainer.version();
  info.rl_step = rl_step;
  info.rl_start_version = rl_start_version;
  info.dir = (fs::path(root) / absl::StrCat("v", info.version)).string();
  RELAY_ASSIGN_OR_RETURN(save_options.extra_files[kTrainerStateFile], trainer.save_state());
  const nlohmann::json meta = {
      {"version", info.version},
      {"rl_step", rl_step},
      {"rl_start_version", rl_start_version},
      {"unix_time_s", std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count()}};
  save_options.extra_files[kCheckpointInfoFile] = meta.dump(2) + "\n";
  save_options.overwrite = true;
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) return InternalError(absl::StrCat("cannot create ", root, ": ", ec.message()));
  RELAY_RETURN_IF_ERROR(model::save_policy(*trainer.policy(), info.dir, save_options));
  const auto all = list_checkpoints(root);
  for (size_t i = static_cast<size_t>(std::max(keep, 1)); i < all.size(); ++i) {
    fs::remove_all(all[i].second, ec);  // best effort: an old checkpoint left behind is harmless
  }
  return info;
}

StatusOr<std::optional<CheckpointInfo>> latest_checkpoint(const std::string& root) {
  const auto all = list_checkpoints(root);
  if (all.empty()) return std::optional<CheckpointInfo>();
  const fs::path file = all.front().second / kCheckpointInfoFile;
  RELAY_ASSIGN_OR_RETURN(std::string text, read_file(file.string()));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("version") || !j.contains("rl_step") ||
      !j.contains("rl_start_version") || !j["version"].is_number_integer() ||
      !j["rl_step"].is_number_integer() || !j["rl_start_version"].is_number_integer()) {
    return DataLossError(absl::StrCat(
        file.string(), ": expected a JSON object with integer version, rl_step, rl_start_version"));
  }
  CheckpointInfo info;
  info.dir = all.front().second.string();
  info.version = j["version"].get<int64_t>();
  info.rl_step = j["rl_step"].get<int64_t>();
  info.rl_start_version = j["rl_start_version"].get<int64_t>();
  if (info.version != all.front().first) {
    return DataLossError(absl::StrCat(file.string(), ": version ", info.version,
                                      " disagrees with its directory name"));
  }
  return std::optional<CheckpointInfo>(info);
}

Status restore_checkpoint(const CheckpointInfo& info, Trainer& trainer) {
  const std::string path = (fs::path(info.dir) / kTrainerStateFile).string();
  RELAY_ASSIGN_OR_RETURN(std::string bytes, read_file(path));
  RELAY_RETURN_IF_ERROR(trainer.restore_state(bytes, path));
  if (trainer.version() != info.version) {
    return DataLossError(absl::StrCat(path, ": holds version ", trainer.version(), ", ",
                                      kCheckpointInfoFile, " says ", info.version));
  }
  return OkStatus();
}

}  // namespace relay::trainer
