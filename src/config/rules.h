#pragma once

// Every rule on a whole experiment config, with full YAML paths.

#include "relay/common/problems.h"
#include "relay/config/config.h"

namespace relay::config {

// The process sections' rules (src/config/rules.cc) and each component's
// check() under its section's key.
void check(const ExperimentConfig& config, Problems problems);

}  // namespace relay::config
