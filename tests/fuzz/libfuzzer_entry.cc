// libFuzzer entry point for one fuzz target (fuzz_targets.h), chosen by the
// environment variable RELAY_FUZZ_TARGET (default tokenizer). Built only
// with clang and -DRELAY_LIBFUZZER=ON; scripts/fuzz.sh --libfuzzer does both
// and passes the seeds of tests/fuzz/corpus/<target>/.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fuzz/fuzz_targets.h"

namespace {

const relay::fuzz::FuzzTarget& target() {
  static const relay::fuzz::FuzzTarget* t = [] {
    const char* name = std::getenv("RELAY_FUZZ_TARGET");
    const relay::fuzz::FuzzTarget* found =
        relay::fuzz::find_fuzz_target(name != nullptr ? name : "tokenizer");
    if (found == nullptr) {
      std::fprintf(stderr, "RELAY_FUZZ_TARGET: no target '%s'\n", name);
      std::exit(2);
    }
    return found;
  }();
  return *t;
}

const std::string& scratch() {
  static const std::string dir = [] {
    char path[] = "/tmp/relay-libfuzzer-XXXXXX";
    if (mkdtemp(path) == nullptr) std::abort();
    return std::string(path);
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)target().run(std::string_view(reinterpret_cast<const char*>(data), size), scratch());
  return 0;
}
