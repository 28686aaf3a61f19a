#include "relay/app/training_loop.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "testing/tensor_testing.h"

namespace relay::app {
namespace {

// Steps without training: metrics {"step": N}, a failure or an empty step
// where the test says so.
class FakeSource : public GroupSource {
 public:
  std::map<int64_t, Status> fail_at;
  std::vector<int64_t> skip;
  bool sound_after_failure = false;
  std::vector<int64_t> steps;
  int finished_calls = 0;
  bool finished = false;

  StatusOr<std::optional<trainer::StepMetrics>> train_step(trainer::Trainer&,
                                                           int64_t rl_step) override {
    steps.push_back(rl_step);
    if (auto it = fail_at.find(rl_step); it != fail_at.end()) return it->second;
    if (std::find(skip.begin(), skip.end(), rl_step) != skip.end()) {
      return std::optional<trainer::StepMetrics>();
    }
    return std::optional<trainer::StepMetrics>(
        trainer::StepMetrics{{"step", static_cast<double>(rl_step)}});
  }
  const std::vector<rollout::TrajectoryGroup>& last_groups() const override { return groups_; }
  void finish(bool f) override {
    ++finished_calls;
    finished = f;
  }
  bool trainer_sound_after(const Status&) const override { return sound_after_failure; }

 private:
  std::vector<rollout::TrajectoryGroup> groups_;
};

// Accuracies from a script, by label; every call logged as "<step>:<label>".
class FakeEvaluator : public Evaluator {
 public:
  std::map<std::string, double> accuracy;
  std::vector<std::string> calls;
  StatusOr<double> evaluate(int64_t step, const std::string& label, const model::Policy&) override {
    calls.push_back(std::to_string(step) + ":" + label);
    auto it = accuracy.find(label);
    return it == accuracy.end() ? 0.0 : it->second;
  }
};

// Each write logged as "<step>" or "<step>@<accuracy>".
class FakeCheckpointer : public Checkpointer {
 public:
  std::vector<std::string> writes;
  Status write(const trainer::Trainer&, int64_t rl_step, std::optional<double> acc) override {
    writes.push_back(std::to_string(rl_step) +
                     (acc ? "@" + std::to_string(*acc).substr(0, 4) : ""));
    return OkStatus();
  }
};

class RecordingSink : public MetricsSink {
 public:
  std::vector<std::string> records;  // "<phase>:<step>"
  void record(const std::string& phase, int64_t step, const MetricValues&) override {
    records.push_back(phase + ":" + std::to_string(step));
  }
};

class TrainingLoopTest : public ::testing::Test {
 protected:
  TrainingLoopTest() {
    model::Policy policy(relay::testing::TinyConfig());
    model::init_weights(*policy, 5, 0.1);
    trainer_ = trainer::Trainer::create(policy, trainer::TrainerOptions{}).value();
  }
  LoopParts parts() {
    LoopParts p;
    p.source = &source_;
    p.evaluator = &evaluator_;
    p.metrics = &sink_;
    p.checkpointer = &checkpointer_;
    p.on_step = [this](const StepReport& r) { reported_.push_back(r.rl_step); };
    p.final_save = [this](const trainer::Trainer&) {
      ++saves_;
      return OkStatus();
    };
    return p;
  }

  std::unique_ptr<trainer::Trainer> trainer_;
  FakeSource source_;
  FakeEvaluator evaluator_;
  FakeCheckpointer checkpointer_;
  RecordingSink sink_;
  std::vector<int64_t> reported_;
  int saves_ = 0;
};

// Evaluations every 2 steps (not at the last, which has "after"),
// checkpoints every 3 steps and at a new best eval accuracy (step 2, not
// step 4, which is worse), the final checkpoint with the final accuracy,
// then the model.
TEST_F(TrainingLoopTest, EvaluatesAndCheckpointsOnSchedule) {
  LoopOptions o;
  o.steps = 6;
  o.eval_every = 2;
  o.checkpoint_every = 3;
  o.checkpoint_best = true;
  evaluator_.accuracy = {{"at step 2", 0.5}, {"at step 4", 0.25}, {"after", 0.75}};
  LoopState state;
  LoopEnd end = TrainingLoop(o, parts()).run(*trainer_, state);
  ASSERT_TRUE(end.status.ok()) << end.status;
  EXPECT_TRUE(end.finished);
  EXPECT_FALSE(end.stopped);
  EXPECT_EQ(state.rl_step, 6);
  EXPECT_EQ(evaluator_.calls, (std::vector<std::string>{"2:at step 2", "4:at step 4", "6:after"}));
  EXPECT_EQ(checkpointer_.writes, (std::vector<std::string>{"2@0.50", "3", "6@0.75"}));
  EXPECT_EQ(state.best_accuracy, 0.5);
  EXPECT_EQ(reported_, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(sink_.records,
            (std::vector<std::string>{"rl:1", "rl:2", "rl:3", "rl:4", "rl:5", "rl:6"}))
      << "the fake evaluator records nothing itself";
  EXPECT_EQ(source_.finished_calls, 1);
  EXPECT_TRUE(source_.finished);
  EXPECT_EQ(saves_, 1);
}

// A resumed loop goes on from its step; its best accuracy stands.
TEST_F(TrainingLoopTest, ResumedLoopStartsAfterItsStep) {
  LoopOptions o;
  o.steps = 4;
  o.eval_every = 1;
  o.checkpoint_best = true;
  evaluator_.accuracy = {{"at step 3", 0.5}};
  LoopState state;
  state.rl_step = 2;
  state.best_accuracy = 0.6;
  LoopEnd end = TrainingLoop(o, parts()).run(*trainer_, state);
  ASSERT_TRUE(end.status.ok()) << end.status;
  EXPECT_EQ(source_.steps, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(checkpointer_.writes, (std::vector<std::string>{"4@0.00"})) << "0.5 is no new best";
}

// A failed step ends the loop: no final evaluation, no checkpoint (the
// trainer may be half-updated), no model.
TEST_F(TrainingLoopTest, FailingStepStopsWithoutCheckpointing) {
  LoopOptions o;
  o.steps = 5;
  o.checkpoint_every = 1;
  source_.fail_at[3] = InternalError("step exploded");
  LoopState state;
  LoopEnd end = TrainingLoop(o, parts()).run(*trainer_, state);
  EXPECT_EQ(end.status.message(), "step exploded");
  EXPECT_FALSE(end.finished);
  EXPECT_EQ(state.rl_step, 2);
  EXPECT_TRUE(evaluator_.calls.empty());
  EXPECT_EQ(checkpointer_.writes, (std::vector<std::string>{"1", "2"})) << "periodic ones only";
  EXPECT_EQ(saves_, 0);
  EXPECT_FALSE(source_.finished);
}

// A source whose failure leaves the trainer sound (its workers went away)
// gets the final checkpoint, and the error still ends the run.
TEST_F(TrainingLoopTest, SoundTrainerIsCheckpointedAfterASourceFailure) {
  LoopOptions o;
  o.steps = 5;
  source_.fail_at[2] = UnavailableError("every worker is gone");
  source_.sound_after_failure = true;
  LoopState state;
  LoopEnd end = TrainingLoop(o, parts()).run(*trainer_, state);
  EXPECT_EQ(end.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(checkpointer_.writes, (std::vector<std::string>{"1"}));
  EXPECT_EQ(saves_, 0);
}

// A stop asked for (SIGTERM) ends the loop cleanly: a checkpoint, no final
// evaluation, no model; a source cancelled by it is no error.
TEST_F(TrainingLoopTest, StopEndsCleanlyWithACheckpoint) {
  LoopOptions o;
  o.steps = 5;
  bool stop = false;
  LoopParts p = parts();
  p.on_step = [&](const StepReport& r) { stop = r.rl_step == 2; };
  p.stop = [&] { return stop; };
  LoopState state;
  LoopEnd end = TrainingLoop(o, p).run(*trainer_, state);
  EXPECT_TRUE(end.status.ok()) << end.status;
  EXPECT_TRUE(end.stopped);
  EXPECT_FALSE(end.finished);
  EXPECT_EQ(checkpointer_.writes, (std::vector<std::string>{"2"}));
  EXPECT_TRUE(evaluator_.calls.empty());
  EXPECT_EQ(saves_, 0);

  // Cancelled while waiting for groups because the stop turned true during
  // step 3: still clean, and step 3 does not count.
  FakeSource cancelled;
  cancelled.fail_at[3] = CancelledError("stopping");
  LoopParts q = parts();
  q.source = &cancelled;
  q.stop = [&] { return cancelled.steps.size() >= 3; };
  LoopState state2;
  end = TrainingLoop(o, q).run(*trainer_, state2);
  EXPECT_TRUE(end.status.ok()) << end.status;
  EXPECT_TRUE(end.stopped);
  EXPECT_EQ(state2.rl_step, 2);
}

// A step with nothing to train on counts but records nothing.
TEST_F(TrainingLoopTest, SkippedStepCountsWithoutMetrics) {
  LoopOptions o;
  o.steps = 3;
  source_.skip = {2};
  LoopParts p = parts();
  p.checkpointer = nullptr;
  LoopState state;
  LoopEnd end = TrainingLoop(o, p).run(*trainer_, state);
  ASSERT_TRUE(end.status.ok()) << end.status;
  EXPECT_EQ(sink_.records, (std::vector<std::string>{"rl:1", "rl:3"}));
  EXPECT_EQ(reported_, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(evaluator_.calls, (std::vector<std::string>{"3:after"}));
  EXPECT_EQ(saves_, 1);
}

// Before RL: evaluated, warm-started, evaluated again; the latest accuracy
// is the best so far.
TEST_F(TrainingLoopTest, BeforeRlEvaluatesAroundTheWarmStart) {
  evaluator_.accuracy = {{"before", 0.1}, {"after warm start", 0.4}};
  LoopState state;
  int warm_starts = 0;
  StatusOr<int64_t> version = before_rl(
      evaluator_, trainer_->policy(),
      [&]() -> StatusOr<int64_t> {
        ++warm_starts;
        return 7;
      },
      state);
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(*version, 7);
  EXPECT_EQ(warm_starts, 1);
  EXPECT_EQ(evaluator_.calls, (std::vector<std::string>{"0:before", "0:after warm start"}));
  EXPECT_EQ(state.best_accuracy, 0.4);
  EXPECT_EQ(state.accuracy_at(0), 0.4);

  FakeEvaluator plain;
  LoopState fresh;
  version = before_rl(plain, trainer_->policy(), nullptr, fresh);
  ASSERT_TRUE(version.ok());
  EXPECT_EQ(*version, 0);
  EXPECT_EQ(plain.calls, (std::vector<std::string>{"0:before"}));
}

}  // namespace
}  // namespace relay::app
