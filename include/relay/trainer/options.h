#pragma once

// From the experiment config (trainer: section) to the trainer's options.
//
// The config layer (relay_common) holds plain strings and numbers and knows
// nothing of LibTorch; this is where its names become the trainer's enums,
// parsed by the trainer's own parsers.

#include "relay/common/config.h"
#include "relay/common/status.h"
#include "relay/trainer/trainer.h"

namespace relay::trainer {

// Maps every field of config.trainer onto TrainerOptions. The scoring
// temperature is config.rollout.temperature: the behavior log-probs were taken
// at the sampling temperature, and the trainer must score at the same one.
// pad_token_id is left at its default (it belongs to the tokenizer).
// Errors: InvalidArgument naming the YAML path for an unknown enum name, e.g.
// "trainer.advantage.estimator: advantage estimator: unknown 'x'; known: ...".
// Value ranges are checked by relay::validate() (load_config runs it) and
// again by Trainer::create().
StatusOr<TrainerOptions> trainer_options(const ExperimentConfig& config);

}  // namespace relay::trainer
