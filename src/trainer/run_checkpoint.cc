#include "relay/trainer/run_checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "relay/common/file_io.h"
#include "relay/model/cpu_memory.h"

namespace relay::trainer {
namespace fs = std::filesystem;
namespace {

constexpr char kDirPrefix[] = "step_";

// "step_<digits>" -> the step; -1 for any other name (staging directories,
// the reference copy, the best link, stray files).
int64_t step_of(const std::string& name) {
  const size_t n = sizeof(kDirPrefix) - 1;
  if (name.size() <= n || name.compare(0, n, kDirPrefix) != 0) return -1;
  int64_t v = 0;
  for (size_t i = n; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || v > (int64_t{1} << 56)) return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

// The step_<N> directories under root, newest first. The best link is
// skipped (it is a symlink to one of them).
std::vector<std::pair<int64_t, fs::path>> list_step_dirs(const fs::path& root) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    if (e.is_symlink(ec) || !e.is_directory(ec)) continue;
    const int64_t step = step_of(e.path().filename().string());
    if (step >= 0) out.emplace_back(step, e.path());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

// Checkpoints under root (those with a checkpoint.json), newest first.
std::vector<std::pair<int64_t, fs::path>> list_checkpoints(const fs::path& root) {
  std::vector<std::pair<int64_t, fs::path>> out = list_step_dirs(root);
  std::error_code ec;
  out.erase(std::remove_if(
                out.begin(), out.end(),
                [&](const auto& c) { return !fs::exists(c.second / kCheckpointInfoFile, ec); }),
            out.end());
  return out;
}

// Why `dir` cannot be resumed from: the first file a resume reads that it
// lacks ("no trainer_state.pt"), or "" when none is missing. An emptied
// directory (files deleted, a copy that never finished) says so too.
std::string missing_for_resume(const fs::path& dir) {
  std::error_code ec;
  for (const char* name : {kCheckpointInfoFile, kTrainerStateFile, kDispenserStateFile}) {
    if (fs::exists(dir / name, ec)) continue;
    const std::string why = absl::StrCat("no ", name);
    return fs::is_empty(dir, ec) ? why + " (the directory is empty)" : why;
  }
  // A LoRA run's checkpoint is a PEFT adapter directory (model/lora.h).
  if (fs::exists(dir / "adapter_config.json", ec) && !fs::exists(dir / "config.json", ec)) {
    return fs::exists(dir / "adapter_model.safetensors", ec) ? "" : "no adapter_model.safetensors";
  }
  if (!fs::exists(dir / "config.json", ec)) return "no config.json";
  if (!fs::exists(dir / "model.safetensors", ec) &&
      !fs::exists(dir / "model.safetensors.index.json", ec)) {
    return "no model.safetensors (nor model.safetensors.index.json)";
  }
  return "";
}

// <root>/best -> `target` (a directory name under root), replaced atomically;
// removed when target is empty.
Status point_best_link(const fs::path& root, const std::string& target) {
  const fs::path link = root / kBestCheckpointLink;
  std::error_code ec;
  if (target.empty()) {
    fs::remove(link, ec);
    return OkStatus();
  }
  const fs::path tmp = root / absl::StrCat(".best.tmp-", ::getpid());
  fs::remove(tmp, ec);
  fs::create_directory_symlink(target, tmp, ec);
  if (ec) return InternalError(absl::StrCat("cannot create ", tmp.string(), ": ", ec.message()));
  fs::rename(tmp, link, ec);
  if (ec) return InternalError(absl::StrCat("cannot replace ", link.string(), ": ", ec.message()));
  return OkStatus();
}

// The best evaluated checkpoint among `all` (newest first): highest
// accuracy, the earliest of equals (a later equal score is no improvement).
std::optional<CheckpointInfo> best_of(const std::vector<CheckpointInfo>& all) {
  std::optional<CheckpointInfo> best;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (!it->eval_accuracy || std::isnan(*it->eval_accuracy)) continue;
    if (!best || *it->eval_accuracy > *best->eval_accuracy) best = *it;
  }
  return best;
}

StatusOr<std::vector<CheckpointInfo>> read_all(const fs::path& root) {
  std::vector<CheckpointInfo> out;
  for (const auto& [step, path] : list_checkpoints(root)) {
    RELAY_ASSIGN_OR_RETURN(CheckpointInfo info, read_checkpoint(path.string()));
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace

std::string checkpoint_dir_name(int64_t rl_step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%s%06lld", kDirPrefix, static_cast<long long>(rl_step));
  return buf;
}

StatusOr<CheckpointInfo> write_checkpoint(const std::string& root, const Trainer& trainer,
                                          CheckpointInfo meta, model::SaveOptions save_options,
                                          const CheckpointRetention& retention) {
  // The weights converted for writing and the archive's own buffers:
  // one-off, freed at the end (cpu_memory.h).
  model::ReturnFreedMemoryScope one_off;
  CheckpointInfo info = std::move(meta);
  info.version = trainer.version();
  info.dir = (fs::path(root) / checkpoint_dir_name(info.rl_step)).string();
  nlohmann::json j = {{"version", info.version},
                      {"rl_step", info.rl_step},
                      {"rl_start_version", info.rl_start_version},
                      {"seed", info.seed},
                      {"store_next_seq", info.store_next_seq},
                      {"unix_time_s", std::chrono::duration_cast<std::chrono::seconds>(
                                          std::chrono::system_clock::now().time_since_epoch())
                                          .count()}};
  if (info.eval_accuracy) j["eval_accuracy"] = *info.eval_accuracy;
  save_options.extra_files[kCheckpointInfoFile] = j.dump(2) + "\n";
  save_options.extra_files[kDispenserStateFile] = info.dispenser_state;
  save_options.overwrite = true;
  // The trainer state is streamed into the staging directory (never a
  // string of its whole size), then the critic's directory, if any.
  // trainer.critic() is read after save_state_to_file: under sharding
  // full it is the host copy that the save refreshes.
  model::SaveOptions critic_options;
  critic_options.dtype = save_options.dtype;
  critic_options.max_shard_bytes = save_options.max_shard_bytes;
  save_options.write_more = [&trainer, critic_options](const std::string& staging) {
    RELAY_RETURN_IF_ERROR(
        trainer.save_state_to_file((fs::path(staging) / kTrainerStateFile).string()));
    model::ValueModel critic = trainer.critic();
    if (!critic) return OkStatus();
    return model::save_value_model(*critic, (fs::path(staging) / kCriticDir).string(),
                                   critic_options);
  };
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) return InternalError(absl::StrCat("cannot create ", root, ": ", ec.message()));
  RELAY_RETURN_IF_ERROR(model::save_policy(*trainer.policy(), info.dir, save_options));

  // Retention: the newest keep_last, plus the best one.
  RELAY_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> all, read_all(root));
  const std::optional<CheckpointInfo> best =
      retention.keep_best ? best_of(all) : std::optional<CheckpointInfo>();
  for (size_t i = static_cast<size_t>(std::max(retention.keep_last, 1)); i < all.size(); ++i) {
    if (best && all[i].dir == best->dir) continue;
    fs::remove_all(all[i].dir, ec);  // best effort: an old checkpoint left behind is harmless
  }
  RELAY_RETURN_IF_ERROR(
      point_best_link(root, best ? fs::path(best->dir).filename().string() : std::string()));
  return info;
}

StatusOr<CheckpointInfo> read_checkpoint(const std::string& dir) {
  const fs::path file = fs::path(dir) / kCheckpointInfoFile;
  RELAY_ASSIGN_OR_RETURN(std::string text, read_file(file.string()));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto integer = [&](const char* key) { return j.contains(key) && j[key].is_number_integer(); };
  if (!j.is_object() || !integer("version") || !integer("rl_step") ||
      !integer("rl_start_version") || !integer("seed") || !integer("store_next_seq")) {
    return DataLossError(
        absl::StrCat(file.string(),
                     ": expected a JSON object with integer version, rl_step, rl_start_version, "
                     "seed and store_next_seq"));
  }
  if (j.contains("eval_accuracy") && !j["eval_accuracy"].is_number()) {
    return DataLossError(absl::StrCat(file.string(), ": eval_accuracy: expected a number"));
  }
  CheckpointInfo info;
  info.dir = dir;
  info.version = j["version"].get<int64_t>();
  info.rl_step = j["rl_step"].get<int64_t>();
  info.rl_start_version = j["rl_start_version"].get<int64_t>();
  info.seed = j["seed"].get<uint64_t>();
  info.store_next_seq = j["store_next_seq"].get<uint64_t>();
  if (j.contains("eval_accuracy")) info.eval_accuracy = j["eval_accuracy"].get<double>();
  const int64_t named = step_of(fs::path(dir).filename().string());
  if (named >= 0 && named != info.rl_step) {
    return DataLossError(absl::StrCat(file.string(), ": rl_step ", info.rl_step,
                                      " disagrees with its directory name"));
  }
  RELAY_ASSIGN_OR_RETURN(info.dispenser_state,
                         read_file((fs::path(dir) / kDispenserStateFile).string()));
  return info;
}

StatusOr<std::optional<CheckpointInfo>> latest_checkpoint(const std::string& root,
                                                          std::vector<std::string>* skipped) {
  for (const auto& [step, path] : list_step_dirs(root)) {
    if (const std::string missing = missing_for_resume(path); !missing.empty()) {
      if (skipped != nullptr) skipped->push_back(absl::StrCat(path.string(), ": ", missing));
      continue;
    }
    RELAY_ASSIGN_OR_RETURN(CheckpointInfo info, read_checkpoint(path.string()));
    return std::optional<CheckpointInfo>(std::move(info));
  }
  return std::optional<CheckpointInfo>();
}

StatusOr<std::optional<CheckpointInfo>> best_checkpoint(const std::string& root) {
  RELAY_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> all, read_all(root));
  return best_of(all);
}

Status restore_checkpoint(const CheckpointInfo& info, Trainer& trainer) {
  model::ReturnFreedMemoryScope one_off;  // the archive's read buffers (cpu_memory.h)
  const std::string path = (fs::path(info.dir) / kTrainerStateFile).string();
  RELAY_RETURN_IF_ERROR(trainer.restore_state_from_file(path));
  if (trainer.version() != info.version) {
    return DataLossError(absl::StrCat(path, ": holds version ", trainer.version(), ", ",
                                      kCheckpointInfoFile, " says ", info.version));
  }
  return OkStatus();
}

}  // namespace relay::trainer
