#include "relay/common/status.h"

#include <cstdio>

namespace relay::internal {

void check_failed(const char* file, int line, const char* expr, const char* msg) {
  std::fprintf(stderr, "relay: check failed at %s:%d: %s: %s\n", file, line, expr, msg);
  std::fflush(stderr);
  std::abort();
}

}  // namespace relay::internal
