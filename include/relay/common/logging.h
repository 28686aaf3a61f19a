#pragma once

// Process-wide logging set-up. Modules log through spdlog inside src/ only;
// public headers expose just this.

#include <string>
#include <string_view>

#include "relay/common/name_table.h"
#include "relay/common/status.h"

namespace relay {

enum class LogLevel { kTrace, kDebug, kInfo, kWarn, kError, kOff };
inline const NameTable<LogLevel> kLogLevelNames{"log level",
                                                {{"trace", LogLevel::kTrace},
                                                 {"debug", LogLevel::kDebug},
                                                 {"info", LogLevel::kInfo},
                                                 {"warn", LogLevel::kWarn},
                                                 {"error", LogLevel::kError},
                                                 {"off", LogLevel::kOff}}};

// Sets the level of the default logger. Log lines go to stderr so that
// stdout stays machine-readable (`relay score --json` and friends print only
// their result there). `role` ("trainer", "rollout local0", ...) and the
// process id go into every line, so the interleaved logs of `relay run` say
// who wrote what.
void init_logging(LogLevel level, const std::string& role = "");

// The same for a --log-level flag's text; InvalidArgument naming the known
// levels for anything else.
Status init_logging(std::string_view level, const std::string& role = "");

}  // namespace relay
