#include "relay/trainer/run_checkpoint.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <torch/types.h>
#include <torch/utils.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "relay/common/file_io.h"
#include "relay/rollout/engine.h"
#include "testing/tensor_testing.h"

namespace relay::trainer {
namespace {

using relay::testing::TinyConfig;

std::string fresh_dir(const std::string& name) {
  const std::string dir =
      ::testing::TempDir() + "/relay_ckpt_" + name + "_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  return dir;
}

model::Policy make_policy() {
  model::Policy p(TinyConfig());
  model::init_weights(*p, 21, 0.3);
  p->eval();
  return p;
}

std::vector<rollout::TrajectoryGroup> sample_groups(model::Policy& policy) {
  model::Policy copy = model::clone_policy(*policy);
  rollout::EngineOptions eo;
  eo.num_slots = 8;
  eo.max_new_tokens = 6;
  auto engine = rollout::Engine::create(copy, eo, 0, 1).value();
  for (int g = 0; g < 3; ++g) {
    rollout::PromptGroup pg;
    pg.group_id = std::to_string(g);
    pg.prompt = {1, 3 + g, 7};
    pg.k = 4;
    pg.seed = 10 + g;
    EXPECT_TRUE(engine->submit(pg).ok());
  }
  auto groups = engine->run().value();
  for (auto& g : groups) {
    for (size_t j = 0; j < g.trajectories.size(); ++j) g.trajectories[j].reward = j % 2;
  }
  return groups;
}

TrainerOptions options() {
  TrainerOptions o;
  o.optimizer.lr = 1e-2;
  o.allow_missing_logprobs = true;
  o.max_staleness = -1;  // the same groups are trained on at every step
  return o;
}

void train(Trainer& t, const std::vector<rollout::TrajectoryGroup>& groups, int steps) {
  for (int i = 0; i < steps; ++i) {
    auto m = t.step(groups);
    ASSERT_TRUE(m.ok()) << m.status();
  }
}

// Interrupting a run at a checkpoint and resuming from it gives the same
// weights as never stopping: weights, AdamW moments, step count (the LR
// schedule) and, for bf16 policies, the fp32 master copies all come back.
void expect_resume_matches(bool bf16) {
  const std::string root = fresh_dir(bf16 ? "resume_bf16" : "resume_fp32");
  model::Policy policy = make_policy();
  auto groups = sample_groups(policy);
  if (bf16) policy->to(torch::kBFloat16);
  TrainerOptions o = options();
  o.optimizer.schedule = LrSchedule::kLinearWarmup;
  o.optimizer.warmup_steps = 5;
  auto straight = Trainer::create(policy, o).value();
  train(*straight, groups, 2);
  CheckpointInfo meta;
  meta.rl_step = 2;
  meta.seed = 7;
  meta.store_next_seq = 12;
  meta.dispenser_state = std::string("\x01\x00cursor", 8);
  auto info = write_checkpoint(root, *straight, meta, {}, {});
  ASSERT_TRUE(info.ok()) << info.status();
  train(*straight, groups, 2);

  auto latest = latest_checkpoint(root).value();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->version, 2);
  EXPECT_EQ(latest->rl_step, 2);
  EXPECT_EQ(latest->seed, 7u);
  EXPECT_EQ(latest->store_next_seq, 12u);
  EXPECT_EQ(latest->dispenser_state, meta.dispenser_state) << "binary bytes survive";
  EXPECT_EQ(latest->dir, root + "/step_000002");
  model::LoadOptions lo;
  lo.dtype = bf16 ? torch::kBFloat16 : torch::kFloat32;
  model::Policy loaded = model::load_policy(latest->dir, lo).value();
  auto resumed = Trainer::create(loaded, o).value();
  ASSERT_TRUE(restore_checkpoint(*latest, *resumed).ok());
  EXPECT_EQ(resumed->version(), 2);
  train(*resumed, groups, 2);
  EXPECT_EQ(resumed->version(), 4);

  // Without the optimizer state the same two steps land elsewhere: the test
  // can tell a restored state from a fresh one.
  model::Policy fresh_policy = model::load_policy(latest->dir, lo).value();
  auto fresh = Trainer::create(fresh_policy, o, 2).value();
  train(*fresh, groups, 2);

  auto mine = straight->policy()->named_parameters();
  auto theirs = resumed->policy()->named_parameters();
  auto other = fresh->policy()->named_parameters();
  double fresh_diff = 0;
  for (const auto& p : mine) {
    SCOPED_TRACE(p.key());
    EXPECT_TRUE(torch::equal(p.value(), theirs[p.key()]));
    fresh_diff =
        std::max(fresh_diff, (p.value().to(torch::kFloat64) - other[p.key()].to(torch::kFloat64))
                                 .abs()
                                 .max()
                                 .item<double>());
  }
  EXPECT_GT(fresh_diff, 1e-4);
}

TEST(RunCheckpointTest, ResumingGivesTheSameWeightsAsNotStopping) { expect_resume_matches(false); }

TEST(RunCheckpointTest, ResumingRestoresFp32MasterWeightsOfBf16Policies) {
  expect_resume_matches(true);
}

TEST(RunCheckpointTest, KeepsTheNewestAndFindsTheLatest) {
  const std::string root = fresh_dir("keep");
  EXPECT_FALSE(latest_checkpoint(root).value().has_value()) << "no directory yet";
  model::Policy policy = make_policy();
  auto groups = sample_groups(policy);
  auto t = Trainer::create(policy, options()).value();
  for (int i = 1; i <= 3; ++i) {
    train(*t, groups, 1);
    CheckpointInfo meta;
    meta.rl_step = i;
    ASSERT_TRUE(write_checkpoint(root, *t, meta, {}, {2, true}).ok());
  }
  // A staging directory or stray entry is not a checkpoint.
  std::filesystem::create_directories(root + "/step_000099.staging");
  std::filesystem::create_directories(root + "/step_000100");  // no checkpoint.json: incomplete
  EXPECT_FALSE(std::filesystem::exists(root + "/step_000001"));
  EXPECT_TRUE(std::filesystem::exists(root + "/step_000002"));
  EXPECT_FALSE(std::filesystem::exists(root + "/best")) << "nothing was evaluated";
  std::vector<std::string> skipped;
  auto latest = latest_checkpoint(root, &skipped).value();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->version, 3);
  EXPECT_EQ(latest->dir, root + "/step_000003");
  EXPECT_EQ(skipped, std::vector<std::string>{
                         root + "/step_000100: no checkpoint.json (the directory is empty)"});
}

// A newer step directory that lacks a file a resume reads (emptied, or a
// trainer state that never landed) is passed over for the one before it,
// and each one passed over is named with the file it lacks.
TEST(RunCheckpointTest, PassesOverIncompleteDirectoriesAndSaysWhy) {
  const std::string root = fresh_dir("incomplete");
  model::Policy policy = make_policy();
  auto t = Trainer::create(policy, options()).value();
  for (int step : {1, 2, 3}) {
    CheckpointInfo meta;
    meta.rl_step = step;
    ASSERT_TRUE(write_checkpoint(root, *t, meta, {}, {3, false}).ok());
  }
  namespace fs = std::filesystem;
  for (const auto& e : fs::directory_iterator(root + "/step_000003")) fs::remove(e.path());
  fs::remove(root + "/step_000002/" + kTrainerStateFile);
  std::vector<std::string> skipped;
  auto latest = latest_checkpoint(root, &skipped);
  ASSERT_TRUE(latest.ok()) << latest.status();
  ASSERT_TRUE(latest->has_value());
  EXPECT_EQ((*latest)->dir, root + "/step_000001");
  EXPECT_EQ(skipped, (std::vector<std::string>{
                         root + "/step_000003: no checkpoint.json (the directory is empty)",
                         root + "/step_000002: no trainer_state.pt"}));

  // None left: nullopt, with every directory tried listed.
  fs::remove(root + "/step_000001/model.safetensors");
  skipped.clear();
  latest = latest_checkpoint(root, &skipped);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_FALSE(latest->has_value());
  ASSERT_EQ(skipped.size(), 3u);
  EXPECT_EQ(skipped[2], root +
                            "/step_000001: no model.safetensors (nor "
                            "model.safetensors.index.json)");
}

// keep_last 2 plus the best by eval accuracy: the best survives pruning,
// <root>/best points at it, an equal later score does not replace it, and
// a better one does (after which the old best is pruned).
TEST(RunCheckpointTest, KeepsTheBestByEvalAndLinksIt) {
  const std::string root = fresh_dir("best");
  model::Policy policy = make_policy();
  auto t = Trainer::create(policy, options()).value();
  auto write = [&](int step, std::optional<double> acc) {
    CheckpointInfo meta;
    meta.rl_step = step;
    meta.eval_accuracy = acc;
    ASSERT_TRUE(write_checkpoint(root, *t, meta, {}, {2, true}).ok());
  };
  auto best_target = [&] { return std::filesystem::read_symlink(root + "/best").string(); };
  write(0, 0.25);
  write(10, 0.75);
  write(20, std::nullopt);
  write(30, 0.5);
  EXPECT_FALSE(std::filesystem::exists(root + "/step_000000"));
  EXPECT_TRUE(std::filesystem::exists(root + "/step_000010")) << "the best is kept";
  EXPECT_TRUE(std::filesystem::exists(root + "/step_000020"));
  EXPECT_TRUE(std::filesystem::exists(root + "/step_000030"));
  EXPECT_EQ(best_target(), "step_000010");
  write(40, 0.75);
  EXPECT_EQ(best_target(), "step_000010") << "an equal score is no improvement";
  auto best = best_checkpoint(root).value();
  ASSERT_TRUE(best.has_value());
  EXPECT_EQ(best->rl_step, 10);
  EXPECT_DOUBLE_EQ(*best->eval_accuracy, 0.75);
  write(50, 0.875);
  EXPECT_EQ(best_target(), "step_000050");
  EXPECT_FALSE(std::filesystem::exists(root + "/step_000010")) << "the old best is pruned";
  EXPECT_TRUE(std::filesystem::exists(root + "/step_000040"));
  // The link resolves to a loadable model directory.
  EXPECT_TRUE(model::load_policy(root + "/best").ok());

  // Without keep_best only the newest two stay, and the link goes.
  const std::string plain = fresh_dir("best_off");
  for (int step : {0, 10, 20}) {
    CheckpointInfo meta;
    meta.rl_step = step;
    meta.eval_accuracy = step == 0 ? 1.0 : 0.0;
    ASSERT_TRUE(write_checkpoint(plain, *t, meta, {}, {2, false}).ok());
  }
  EXPECT_FALSE(std::filesystem::exists(plain + "/step_000000"));
  EXPECT_FALSE(std::filesystem::exists(plain + "/best"));
}

// A trainer_state.pt cut short (a full disk, an interrupted copy) is one line
// naming the file and saying so; LibTorch's C++ stack trace stays out of it.
TEST(RunCheckpointTest, TruncatedStateIsOneLineNamingTheFile) {
  const std::string root = fresh_dir("truncated");
  model::Policy policy = make_policy();
  auto t = Trainer::create(policy, options()).value();
  auto info = write_checkpoint(root, *t, CheckpointInfo{}, {}, {}).value();
  const std::string state = info.dir + "/" + kTrainerStateFile;
  const std::uintmax_t size = std::filesystem::file_size(state);
  std::filesystem::resize_file(state, size / 2);
  Status s = restore_checkpoint(info, *t);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  const std::string message(s.message());
  EXPECT_EQ(message.rfind(state + ": truncated or corrupt (" + std::to_string(size / 2) +
                              " bytes are not a readable torch archive: ",
                          0),
            0u)
      << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  EXPECT_EQ(message.find("frame #"), std::string::npos) << message;

  std::filesystem::resize_file(state, 0);
  s = restore_checkpoint(info, *t);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), state + ": empty file (0 bytes), not a trainer state");
}

TEST(RunCheckpointTest, CorruptStateIsAnErrorThatNamesTheFile) {
  const std::string root = fresh_dir("corrupt");
  model::Policy policy = make_policy();
  auto t = Trainer::create(policy, options()).value();
  auto info = write_checkpoint(root, *t, CheckpointInfo{}, {}, {}).value();
  const std::string state = info.dir + "/" + kTrainerStateFile;
  { std::ofstream(state, std::ios::trunc) << "not a torch archive"; }
  Status s = restore_checkpoint(info, *t);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(std::string(s.message()).find(state), std::string::npos) << s;
  EXPECT_EQ(std::string(s.message()).find('\n'), std::string::npos) << s;
  { std::ofstream(info.dir + "/" + kCheckpointInfoFile, std::ios::trunc) << "{\"version\": 1}"; }
  auto latest = latest_checkpoint(root);
  EXPECT_EQ(latest.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(std::string(latest.status().message()).find(kCheckpointInfoFile), std::string::npos);
}

// This process's VmRSS or VmHWM (its peak RSS) in bytes, from
// /proc/self/status; writing 5 to /proc/self/clear_refs resets the peak.
int64_t proc_status_bytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  }
  ADD_FAILURE() << "/proc/self/status has no " << field;
  return -1;
}

// The peak RSS a call adds over the RSS before it (the peak reset first).
int64_t peak_growth(const std::function<void()>& call) {
  { std::ofstream("/proc/self/clear_refs") << "5"; }
  const int64_t before = proc_status_bytes("VmRSS");
  EXPECT_LE(proc_status_bytes("VmHWM"), before + (1 << 20)) << "the peak was not reset";
  call();
  return proc_status_bytes("VmHWM") - before;
}

// The trainer state goes to its file as the archive is serialized, and
// comes back from it as the archive loads, never held whole in a string:
// writing adds a small fraction of the file to the process's peak, where
// save_state() adds at least the whole file. A 38-MB model, whose AdamW
// state is 76 MB, so that the archive's own small buffers do not
// matter. The restored trainer takes the same next step as one restored
// from save_state()'s bytes.
TEST(TrainerStateFileTest, StreamsTheStateWithoutACopyOfItInMemory) {
  const std::string dir = fresh_dir("state_memory");
  std::filesystem::create_directories(dir);
  model::PolicyConfig config = TinyConfig();
  config.hidden_size = 512;
  config.intermediate_size = 1024;
  config.num_hidden_layers = 4;
  model::Policy policy(config);
  model::init_weights(*policy, 3, 0.02);
  policy->eval();
  auto groups = sample_groups(policy);
  auto t = Trainer::create(model::clone_policy(*policy), options()).value();
  train(*t, groups, 1);
  const std::string path = dir + "/" + kTrainerStateFile;

  Status saved;
  const int64_t streamed = peak_growth([&] { saved = t->save_state_to_file(path); });
  ASSERT_TRUE(saved.ok()) << saved;
  const auto size = static_cast<int64_t>(std::filesystem::file_size(path));
  ASSERT_GT(size, 64 << 20) << "AdamW's two moments of 9.5M parameters";
  std::string bytes;
  const int64_t in_memory = peak_growth([&] { bytes = t->save_state().value(); });
  EXPECT_GE(in_memory, size) << "the measurement sees a string of the state";
  EXPECT_LT(streamed, size / 8) << "streamed: " << streamed << " bytes of peak for " << size;

  // Over the weights the state was saved with, as a resume loads them.
  auto from_file = Trainer::create(model::clone_policy(*t->policy()), options(), 1).value();
  auto from_bytes = Trainer::create(model::clone_policy(*t->policy()), options(), 1).value();
  Status restored;
  const int64_t loaded = peak_growth([&] { restored = from_file->restore_state_from_file(path); });
  ASSERT_TRUE(restored.ok()) << restored;
  std::printf(
      "trainer state %.1f MB; peak RSS added: streamed %.1f MB, as a string %.1f MB, "
      "restored from the file %.1f MB\n",
      size / 1e6, streamed / 1e6, in_memory / 1e6, loaded / 1e6);
  // The tensors read are the state the trainer now holds: one copy.
  EXPECT_LT(loaded, size + size / 4) << "restored: " << loaded << " bytes of peak for " << size;
  ASSERT_TRUE(from_bytes->restore_state(bytes, "bytes").ok());
  EXPECT_EQ(from_file->version(), 1);
  train(*from_file, groups, 1);
  train(*from_bytes, groups, 1);
  train(*t, groups, 1);
  auto a = from_file->policy()->named_parameters();
  auto b = from_bytes->policy()->named_parameters();
  auto c = t->policy()->named_parameters();
  for (const auto& p : a) {
    SCOPED_TRACE(p.key());
    EXPECT_TRUE(torch::equal(p.value(), b[p.key()]));
    EXPECT_TRUE(torch::equal(p.value(), c[p.key()]));
  }
  std::filesystem::remove_all(dir);  // 76 MB
}

// A state file that cannot be written in full (here the process's file
// size limit, as a full disk would) is an error naming the file; the file
// it would have replaced is still there, whole, and no temporary is left.
// write_checkpoint then leaves no step directory and no staging one.
TEST(TrainerStateFileTest, AFailedWriteLeavesTheOldFileAndNoCheckpoint) {
  const std::string root = fresh_dir("state_write_fails");
  model::Policy policy = make_policy();
  auto groups = sample_groups(policy);
  auto t = Trainer::create(policy, options()).value();
  train(*t, groups, 1);
  CheckpointInfo meta;
  meta.rl_step = 1;
  const CheckpointInfo first = write_checkpoint(root, *t, meta, {}, {5, false}).value();
  const std::string path = first.dir + "/" + kTrainerStateFile;
  const std::string old_bytes = read_file(path).value();
  const auto weights = std::filesystem::file_size(first.dir + "/model.safetensors");
  const uint64_t limit = weights + 4096;
  ASSERT_GT(old_bytes.size(), limit) << "the limit must fall inside the trainer state";
  train(*t, groups, 1);

  struct rlimit was {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &was), 0);
  auto* const old_handler = std::signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of the signal
  struct rlimit capped = was;
  capped.rlim_cur = limit;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &capped), 0);
  const Status direct = t->save_state_to_file(path);
  meta.rl_step = 2;
  const StatusOr<CheckpointInfo> second = write_checkpoint(root, *t, meta, {}, {5, false});
  ::setrlimit(RLIMIT_FSIZE, &was);
  std::signal(SIGXFSZ, old_handler);

  ASSERT_FALSE(direct.ok());
  EXPECT_EQ(std::string(direct.message()).rfind(path + ".tmp: write failed", 0), 0u) << direct;
  EXPECT_EQ(read_file(path).value(), old_bytes);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  ASSERT_FALSE(second.ok());
  EXPECT_NE(std::string(second.status().message()).find(kTrainerStateFile), std::string::npos)
      << second.status();
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(root)) {
    left.push_back(e.path().filename().string());
  }
  EXPECT_EQ(left, std::vector<std::string>{"step_000001"});
  auto latest = latest_checkpoint(root).value();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->rl_step, 1);
  EXPECT_TRUE(restore_checkpoint(*latest, *Trainer::create(make_policy(), options()).value()).ok());
}

TEST(TrainerStateFileTest, AMissingFileIsNotFoundAndNamed) {
  const std::string dir = fresh_dir("state_missing");
  auto t = Trainer::create(make_policy(), options()).value();
  const Status s = t->restore_state_from_file(dir + "/trainer_state.pt");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), dir + "/trainer_state.pt: no such file");
  EXPECT_EQ(t->version(), 0);
}

}  // namespace
}  // namespace relay::trainer
