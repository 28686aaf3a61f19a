#include "relay/app/run_directory.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "relay/common/file_io.h"
#include "testing/tensor_testing.h"

namespace relay::app {
namespace {

namespace fs = std::filesystem;

std::string fresh_dir(const std::string& name) {
  const std::string dir =
      ::testing::TempDir() + "/relay_rundir_" + name + "_" + std::to_string(::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string text_of(const std::string& path) {
  StatusOr<std::string> t = read_file(path);
  return t.ok() ? *t : "<missing>";
}

// Writes checkpoints of steps `steps` under run.checkpoints.
void write_checkpoints(const RunLayout& run, const std::vector<int64_t>& steps) {
  model::Policy policy(relay::testing::TinyConfig());
  model::init_weights(*policy, 3, 0.1);
  trainer::TrainerOptions o;
  o.allow_missing_logprobs = true;
  auto t = trainer::Trainer::create(policy, o).value();
  for (int64_t step : steps) {
    trainer::CheckpointInfo meta;
    meta.rl_step = step;
    ASSERT_TRUE(trainer::write_checkpoint(run.checkpoints, *t, meta, {}, {10, false}).ok());
  }
}

TEST(RunDirectoryTest, LayoutDefaultsAndOverrides) {
  RunLayout r = run_layout("/runs/x");
  EXPECT_EQ(r.config, "/runs/x/config.yaml");
  EXPECT_EQ(r.metrics, "/runs/x/metrics.jsonl");
  EXPECT_EQ(r.samples, "/runs/x/samples.jsonl");
  EXPECT_EQ(r.tensorboard, "/runs/x/tensorboard");
  EXPECT_EQ(r.checkpoints, "/runs/x/checkpoints");
  EXPECT_EQ(r.reference, "/runs/x/checkpoints/reference");
  EXPECT_EQ(r.store, "/runs/x/store");
  r = run_layout("/runs/x", "/tmp/m.jsonl", "/tmp/store");
  EXPECT_EQ(r.metrics, "/tmp/m.jsonl");
  EXPECT_EQ(r.store, "/tmp/store");
}

// config.yaml is the latest start's; a changed config keeps the previous
// one as config.before-<t>.yaml, an unchanged one keeps nothing.
TEST(RunDirectoryTest, ConfigHistoryKeepsEachChangedStart) {
  const RunLayout run = run_layout(fresh_dir("config"));
  ASSERT_TRUE(record_config(run, "a: 1\n", 100).ok());
  EXPECT_EQ(text_of(run.config), "a: 1\n");
  ASSERT_TRUE(record_config(run, "a: 1\n", 200).ok());
  EXPECT_FALSE(fs::exists(run.dir + "/config.before-200.yaml")) << "same config: no history";
  ASSERT_TRUE(record_config(run, "a: 2\n", 300).ok());
  EXPECT_EQ(text_of(run.config), "a: 2\n");
  EXPECT_EQ(text_of(run.dir + "/config.before-300.yaml"), "a: 1\n");
}

// After a resume from step 2: RL and eval records of later steps go, warm
// start (sft) records of any step stay, and so does a torn last line's
// predecessor; the torn line itself goes.
TEST(RunDirectoryTest, TruncatesRecordsAfterTheResumedStep) {
  const std::string path = fresh_dir("truncate") + "/metrics.jsonl";
  ASSERT_TRUE(write_file_atomic(path,
                                "{\"phase\":\"sft\",\"step\":5}\n"
                                "{\"phase\":\"eval\",\"step\":0}\n"
                                "{\"phase\":\"rl\",\"step\":1}\n"
                                "{\"phase\":\"rl\",\"step\":2}\n"
                                "{\"phase\":\"eval\",\"step\":2}\n"
                                "{\"phase\":\"rl\",\"step\":3}\n"
                                "{\"phase\":\"eval\",\"step\":3}\n"
                                "{\"phase\":\"rl\",\"st")
                  .ok());
  ASSERT_TRUE(truncate_records_after(path, 2).ok());
  EXPECT_EQ(text_of(path),
            "{\"phase\":\"sft\",\"step\":5}\n"
            "{\"phase\":\"eval\",\"step\":0}\n"
            "{\"phase\":\"rl\",\"step\":1}\n"
            "{\"phase\":\"rl\",\"step\":2}\n"
            "{\"phase\":\"eval\",\"step\":2}\n");
  EXPECT_TRUE(truncate_records_after(path + ".missing", 2).ok()) << "a missing file is fine";
}

TEST(RunDirectoryTest, ResumeChoosesTheNewestCompleteCheckpoint) {
  const RunLayout run = run_layout(fresh_dir("resume"));
  StatusOr<ResumePoint> p = choose_resume_point(run, /*require=*/false);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->checkpoint.has_value()) << "no checkpoints: a fresh start";
  EXPECT_TRUE(p->warnings.empty());

  write_checkpoints(run, {1, 2, 3});
  // Step 3 lost its trainer state: passed over, out loud, for step 2.
  fs::remove(run.checkpoints + "/step_000003/" + trainer::kTrainerStateFile);
  p = choose_resume_point(run, /*require=*/true);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(p->checkpoint.has_value());
  EXPECT_EQ(p->checkpoint->rl_step, 2);
  ASSERT_EQ(p->warnings.size(), 1u);
  EXPECT_EQ(p->warnings[0], "skipping checkpoint " + run.checkpoints +
                                "/step_000003: no trainer_state.pt; resuming from " +
                                run.checkpoints + "/step_000002");
}

TEST(RunDirectoryTest, ResumeFlagWithoutACheckpointIsAnError) {
  const RunLayout run = run_layout(fresh_dir("require"));
  StatusOr<ResumePoint> p = choose_resume_point(run, /*require=*/true);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(p.status().message(),
            "--resume: " + run.checkpoints + " holds no checkpoint to resume from");

  write_checkpoints(run, {1});
  fs::remove(run.checkpoints + "/step_000001/" + trainer::kTrainerStateFile);
  p = choose_resume_point(run, /*require=*/true);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(p.status().message().find("holds no usable checkpoint; tried " + run.checkpoints +
                                      "/step_000001: no trainer_state.pt"),
            std::string::npos)
      << p.status();
}

// A start on a directory with a checkpoint of step 1: config recorded,
// step 1 chosen, later records dropped from metrics and samples.
TEST(RunDirectoryTest, PrepareRecordsConfigAndTruncatesAfterTheResumePoint) {
  const RunLayout run = run_layout(fresh_dir("prepare"));
  write_checkpoints(run, {1});
  ASSERT_TRUE(write_file_atomic(run.metrics,
                                "{\"phase\":\"rl\",\"step\":1}\n{\"phase\":\"rl\",\"step\":2}\n")
                  .ok());
  ASSERT_TRUE(write_file_atomic(run.samples, "{\"step\":2,\"version\":2,\"samples\":[]}\n").ok());
  StatusOr<ResumePoint> p = prepare_run_directory(run, "b: 1\n", /*require_resume=*/false);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(p->checkpoint.has_value());
  EXPECT_EQ(p->checkpoint->rl_step, 1);
  EXPECT_EQ(text_of(run.config), "b: 1\n");
  EXPECT_EQ(text_of(run.metrics), "{\"phase\":\"rl\",\"step\":1}\n");
  EXPECT_EQ(text_of(run.samples), "");
}

}  // namespace
}  // namespace relay::app
