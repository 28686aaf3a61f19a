#include "relay/common/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace relay {

Status init_logging(const std::string& level, const std::string& role) {
  spdlog::level::level_enum lvl = spdlog::level::from_str(level);
  // from_str maps unknown names to "off"; only accept "off" when asked for.
  if (lvl == spdlog::level::off && level != "off") {
    return InvalidArgumentError(absl::StrCat(
        "log level: must be one of trace, debug, info, warn, error, off; got '", level, "'"));
  }
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
  spdlog::set_level(lvl);
  return OkStatus();
}

}  // namespace relay
