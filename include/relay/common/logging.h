#pragma once

// Process-wide logging set-up. Modules log through spdlog inside src/ only;
// public headers expose just this.

#include <string>

#include "relay/common/status.h"

namespace relay {

// Sets the level of the default logger ("trace", "debug", "info", "warn",
// "error", "off"). Log lines go to stderr so that stdout stays machine-readable
// (`relay score --json` and friends print only their result there).
// `role` ("trainer", "rollout local0", ...) and the process id go into every
// line, so the interleaved logs of `relay run` say who wrote what.
Status init_logging(const std::string& level, const std::string& role = "");

}  // namespace relay
