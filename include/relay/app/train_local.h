#pragma once

// `relay train-local`: the whole loop in one process. The rollout engine
// samples, the verifier scores, the trainer steps, the new weights go back
// to the engine; greedy accuracy on held-out task prompts is evaluated
// before and after (app/training_loop.h, with an InProcessGroupSource).

#include <cstdint>
#include <string>
#include <vector>

namespace relay::app {

struct TrainLocalArgs {
  std::string config_file;
  std::vector<std::string> overrides;
  std::string model_dir;        // starting weights; default: model.path
  int64_t steps = 20;           // RL steps
  int64_t groups_per_step = 8;  // task prompts per RL step (rollout.n samples each)
  int64_t sft_steps = 0;        // warm-start steps on task targets before RL
  double sft_lr = 0;            // warm-start learning rate (its own optimizer); 0 = trainer.lr
  int64_t eval_prompts = 64;    // held-out prompts scored greedily before and after
  int64_t eval_every = 0;       // also evaluate every N RL steps; 0 = only before/after
  std::string metrics_out;      // JSONL, one line per step; empty = none
  std::string save;             // write the trained model here (HF layout); empty = no
};

// Returns the exit code: 0, or 1 with "relay train-local: <message>" on
// stderr.
int train_local(const TrainLocalArgs& args);

}  // namespace relay::app
