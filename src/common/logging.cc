#include "relay/common/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace relay {

namespace {

spdlog::level::level_enum spdlog_level(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace:
      return spdlog::level::trace;
    case LogLevel::kDebug:
      return spdlog::level::debug;
    case LogLevel::kInfo:
      return spdlog::level::info;
    case LogLevel::kWarn:
      return spdlog::level::warn;
    case LogLevel::kError:
      return spdlog::level::err;
    case LogLevel::kOff:
      return spdlog::level::off;
  }
  return spdlog::level::info;
}

}  // namespace

Status init_logging(std::string_view level, const std::string& role) {
  RELAY_ASSIGN_OR_RETURN(LogLevel parsed, kLogLevelNames.parse(level));
  init_logging(parsed, role);
  return OkStatus();
}

void init_logging(LogLevel level, const std::string& role) {
  static bool installed = false;
  if (!installed) {
    spdlog::set_default_logger(spdlog::stderr_color_mt("relay"));
    installed = true;
  }
  // "%P" is the process id; the role is fixed text in the pattern (with
  // spdlog's flag character escaped).
  std::string tag;
  for (char c : role) {
    tag += c;
    if (c == '%') tag += '%';
  }
  spdlog::set_pattern(role.empty() ? "%Y-%m-%d %H:%M:%S.%e %^%L%$ %v"
                                   : absl::StrCat("%Y-%m-%d %H:%M:%S.%e %^%L%$ [", tag, " %P] %v"));
  spdlog::set_level(spdlog_level(level));
}

}  // namespace relay
