#pragma once

// The options of the critic's loss (PPO with a value model). Split from
// options.h so that value_loss.h does not pull in every trainer option.

#include "relay/trainer/loss_options.h"

namespace relay::trainer {

// verl's critic loss settings (critic.cliprange_value, critic.loss_agg_mode).
struct ValueLossOptions {
  // The new value is kept within old value +- clip_range in the clipped
  // term; > 0 (verl's default 0.5).
  double clip_range = 0.5;
  LossAggMode agg_mode = LossAggMode::kTokenMean;
};

}  // namespace relay::trainer
