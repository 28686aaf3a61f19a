#include "relay/common/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace relay {

Status init_logging(const std::string& level) {
  spdlog::level::level_enum lvl = spdlog::level::from_str(level);
  // from_str maps unknown names to "off"; only accept "off" when asked for.
  if (lvl == spdlog::level::off && level != "off") {
    return InvalidArgumentError(absl::StrCat(
        "log level: must be one of trace, debug, info, warn, error, off; got '", level, "'"));
  }
  static bool installed = false;
  if (!installed) {
    spdlog::set_default_logger(spdlog::stderr_color_mt("relay"));
    spdlog::set_pattern("%Y-%m-%d %H:%M:%S.%e %^%L%$ %v");
    installed = true;
  }
  spdlog::set_level(lvl);
  return OkStatus();
}

}  // namespace relay
